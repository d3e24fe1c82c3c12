"""Optimal schedules by constraint programming (OR-Tools CP-SAT): the scheduler's exact pass and the tests' oracle.

:mod:`rebalancer.planning.schedule` decodes a plan into a :class:`Problem` and calls :func:`solve`; this module is
only the model and the solver call (the rules are that module's docstring, "Cost model"). Pure: no Spark, no storage;
ortools is imported when a plan is solved.

Model
    Time is counted in integer units of ``unit_s`` (1 microsecond). Every step is an interval of fixed length
    ``ceil(solo / unit_s)`` (``solo``: its duration alone, ``overhead_s + bytes / min(stream, bw)``); a partition's
    steps follow each other (an end before the next start); a COPY's supplier is one of its pool's nodes, as one
    optional interval per pool member of which exactly one is present; every node has ``max_parallel_per_node``
    slots (a cumulative of the steps that touch it: a COPY its target and its chosen supplier, a PROMOTE both
    primaries, a DROP its node; a no-overlap at cap 1); the makespan, the latest end, is minimised.

    Bandwidth. A transfer moves at ``min(stream, bw / max(n_out(source), n_in(target)))``: fixed lengths describe
    it only while no node direction has more than ``K = floor(bw / stream)`` transfers at once (the most that slow
    none below its stream rate; 6 entry transfers at the defaults). So each direction of each node gets a
    cumulative of the transfer phases (from ``floor(overhead_s / unit_s)`` after the start to the end) of capacity
    ``K`` (the least over the streams that may use it), wherever ``K`` is below the cap. Where
    ``cap * stream <= bw`` for every stream of the plan no such constraint is needed and the model *is* the cost
    model (:attr:`Solution.exact`): with no direction able to slow a transfer, every step takes its solo time,
    whatever runs beside it. Elsewhere the model keeps only the schedules whose transfers all run at their stream
    rate: a legal schedule of the cost model, but its optimum may be longer than the cost model's (which may run
    more transfers at once, each slower, to fill a link).

Rounding
    Lengths are rounded up, so a solution's intervals contain the steps' real ones: its start times with the real
    durations are a legal schedule of the cost model (the caller's :func:`to_seconds`), no longer than the solver's
    makespan. And the model loses at most ``(n + 1) * unit_s`` against the true optimum: from any schedule with
    starts ``s_i`` (numbered 0..n-1 by start), ``ceil(s_i / unit) + i`` is a solution of the rounded model (a step
    that started after another ended still does, so no two steps newly overlap), ending at most ``n + 1`` units
    later. So with ``exact``, ``bound_s - (n + 1) * unit_s`` is a proven lower bound of the cost model's optimum
    (:attr:`Solution.proven_bound_s`).

Determinism
    One worker, a fixed seed and a deterministic time limit (``max_deterministic_time``, CP-SAT's count of work,
    not seconds): the same plan gives the same solution on every machine with the same ortools. The solver starts
    from a hint (the greedy schedule), so its first solution is at worst the hint repaired.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rebalancer.planning import packing
from rebalancer.planning.event_loop import A_COPY, A_PROMOTE

__all__ = ["UNIT_S", "Problem", "Solution", "solve"]

UNIT_S = 1e-6  # the model's time unit: rounding costs at most (steps + 1) microseconds


@dataclass(frozen=True)
class Problem:
    """A decoded plan under a cost model, as arrays indexed by row (:mod:`rebalancer.planning.schedule`'s ``_Plan``).

    ``pool_node[pool_start[i]:pool_start[i + 1]]`` are the nodes COPY ``i`` may read from (never its target);
    ``solo`` each step's duration alone; ``stream`` a COPY's stream rate (0 otherwise).
    """

    action: np.ndarray
    src: np.ndarray
    tgt: np.ndarray
    nxt: np.ndarray
    pool_node: np.ndarray
    pool_start: np.ndarray
    nbytes: np.ndarray
    stream: np.ndarray
    solo: np.ndarray
    nn: int
    cap: int
    bw: float
    overhead: float

    @property
    def n(self) -> int:
        return len(self.action)

    @property
    def exact(self) -> bool:
        """No direction can slow a transfer below its stream rate (``cap * stream <= bw`` for every stream)."""
        moving = (self.action == A_COPY) & (self.nbytes > 0)
        return not moving.any() or bool(self.cap * float(self.stream[moving].max()) <= self.bw)


@dataclass(frozen=True)
class Solution:
    """What the solver found.

    Attributes:
        start: per row, the start in units of ``unit_s`` (None when no solution was found).
        chosen: per row, the node a COPY reads from (``src`` for the others).
        makespan_s: the solution's makespan in the rounded model (``inf`` without a solution).
        bound_s: the solver's proven lower bound of the rounded model's makespan.
        optimal: the solver proved its solution optimal (in the rounded model).
        exact: the model is the cost model (:attr:`Problem.exact`).
        status: CP-SAT's status name.
        wall_s: wall seconds in the solver (model building included).
        deterministic_time: CP-SAT's deterministic time spent.
        unit_s: the time unit.
        steps: the plan's steps.
    """

    start: np.ndarray | None
    chosen: np.ndarray | None
    makespan_s: float
    bound_s: float
    optimal: bool
    exact: bool
    status: str
    wall_s: float
    deterministic_time: float
    unit_s: float
    steps: int

    @property
    def proven_bound_s(self) -> float:
        """A lower bound of the cost model's optimum (module docstring, "Rounding"); 0.0 unless :attr:`exact`."""
        return max(self.bound_s - (self.steps + 1) * self.unit_s, 0.0) if self.exact else 0.0


def solve(
    problem: Problem,
    *,
    hint_start_s: np.ndarray | None = None,
    hint_chosen: np.ndarray | None = None,
    max_deterministic_time: float = 1.0,
    seed: int = 0,
    lower_bound_s: float = 0.0,
    unit_s: float = UNIT_S,
    linearization_level: int = 1,
) -> Solution:
    """Minimise the makespan of ``problem`` (module docstring).

    Args:
        problem: the plan and the cost model.
        hint_start_s / hint_chosen: a schedule to start from (seconds, nodes), e.g. the greedy one; it is made a
            solution of the rounded model when it is one of the cost model with no transfer slowed.
        max_deterministic_time: CP-SAT's deterministic time limit.
        seed: CP-SAT's random seed.
        lower_bound_s: a known lower bound of the makespan (the engine's), to stop as soon as it is met.
        unit_s: the time unit.
        linearization_level: CP-SAT's (0: no linear relaxation; the scheduler's exact pass found its improvements
            sooner that way, docs/PLANNING.md).

    Returns:
        The :class:`Solution`; ``start`` is None when the limit passed before any solution.
    """
    from ortools.sat.python import cp_model

    began = time.perf_counter()
    p = problem
    n = p.n
    exact = p.exact
    if n == 0:
        return Solution(np.zeros(0, np.int64), np.zeros(0, np.int64), 0.0, 0.0, True, exact, "OPTIMAL", 0.0, 0.0,
                        unit_s, 0)
    length = np.ceil(p.solo / unit_s - 1e-6).astype(np.int64)
    lead = int(math.floor(p.overhead / unit_s + 1e-9))  # a transfer phase starts no later than this after its step
    horizon = int(length.sum())
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon - int(length[i]), f"s{i}") for i in range(n)]
    floor = int(math.floor(lower_bound_s / unit_s * (1 - 1e-9)))  # (a bound's last bits never change the model)
    span = m.new_int_var(max(floor, int(length.max())), horizon, "makespan")
    slots: list[list[Any]] = [[] for _ in range(p.nn)]  # CP-SAT's interval variables
    inbound: list[list[Any]] = [[] for _ in range(p.nn)]
    outbound: list[list[Any]] = [[] for _ in range(p.nn)]
    choice: list[list[tuple[int, Any]]] = [[] for _ in range(n)]  # per row, (node, its literal or None)
    for i in range(n):
        size = int(length[i])
        whole = m.new_fixed_size_interval_var(start[i], size, f"x{i}")
        a = int(p.action[i])
        moving = a == A_COPY and p.nbytes[i] > 0
        if a == A_COPY:
            t = int(p.tgt[i])
            slots[t].append(whole)
            pool = p.pool_node[p.pool_start[i] : p.pool_start[i + 1]].tolist()
            if moving:
                inbound[t].append(m.new_fixed_size_interval_var(start[i] + lead, size - lead, f"in{i}"))
            if len(pool) == 1:
                c = int(pool[0])
                slots[c].append(whole)
                choice[i].append((c, None))
                if moving:
                    outbound[c].append(m.new_fixed_size_interval_var(start[i] + lead, size - lead, f"out{i}"))
            else:
                literals = []
                for c in pool:
                    c = int(c)
                    use = m.new_bool_var(f"u{i}_{c}")
                    literals.append(use)
                    choice[i].append((c, use))
                    slots[c].append(m.new_optional_fixed_size_interval_var(start[i], size, use, f"x{i}_{c}"))
                    if moving:
                        outbound[c].append(m.new_optional_fixed_size_interval_var(
                            start[i] + lead, size - lead, use, f"out{i}_{c}"))
                m.add_exactly_one(literals)
        else:
            u = int(p.src[i])
            slots[u].append(whole)
            w = int(p.tgt[i]) if a == A_PROMOTE else u
            if w != u and w >= 0:
                slots[w].append(whole)
        if p.nxt[i] >= 0:
            m.add(start[int(p.nxt[i])] >= start[i] + size)
        else:
            m.add(span >= start[i] + size)
    in_limit, out_limit = _direction_limits(p)
    for v in range(p.nn):
        if len(slots[v]) > p.cap:
            if p.cap == 1:
                m.add_no_overlap(slots[v])
            else:
                m.add_cumulative(slots[v], [1] * len(slots[v]), p.cap)
        for phases, limit in ((inbound[v], int(in_limit[v])), (outbound[v], int(out_limit[v]))):
            if limit < p.cap and len(phases) > limit:
                if limit == 1:
                    m.add_no_overlap(phases)
                else:
                    m.add_cumulative(phases, [1] * len(phases), limit)
    m.minimize(span)
    if hint_start_s is not None and hint_chosen is not None:
        hinted = _feasible_hint(p, length, lead, in_limit, out_limit, np.asarray(hint_start_s, dtype=np.float64),
                                np.asarray(hint_chosen, dtype=np.int64), unit_s)
        for i, value in enumerate(hinted.tolist()):
            m.add_hint(start[i], min(value, horizon - int(length[i])))
        for i in range(n):
            for c, use in choice[i]:
                if use is not None:
                    m.add_hint(use, c == int(hint_chosen[i]))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = max_deterministic_time
    solver.parameters.linearization_level = linearization_level
    status = solver.solve(m)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    starts = chosen = None
    if found:
        starts = np.array([solver.value(s) for s in start], dtype=np.int64)
        chosen = np.asarray(p.src, dtype=np.int64).copy()
        for i in range(n):
            for c, use in choice[i]:
                if use is None or solver.boolean_value(use):
                    chosen[i] = c
    return Solution(
        start=starts, chosen=chosen, makespan_s=solver.objective_value * unit_s if found else math.inf,
        bound_s=solver.best_objective_bound * unit_s, optimal=status == cp_model.OPTIMAL, exact=exact,
        status=solver.status_name(status), wall_s=time.perf_counter() - began,
        deterministic_time=solver.deterministic_time, unit_s=unit_s, steps=n,
    )


def _direction_limits(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the most transfers its inbound / outbound direction may run at once without slowing any
    (:func:`rebalancer.planning.packing.lanes_without_slowing`)."""
    moving = (p.action == A_COPY) & (p.nbytes > 0)
    lanes = packing.lanes_without_slowing(p.tgt, p.pool_node, p.pool_start, moving, p.stream, p.nn, p.cap, p.bw)
    return lanes[: p.nn], lanes[p.nn :]


def _feasible_hint(
    p: Problem, length: np.ndarray, lead: int, in_limit: np.ndarray, out_limit: np.ndarray, start_s: np.ndarray,
    chosen: np.ndarray, unit_s: float,
) -> np.ndarray:
    """A solution of the rounded model close to a schedule given in seconds: its steps, in the order they start
    there, each placed at the earliest unit no earlier than its start rounded up where its partition's previous step
    has ended and its nodes have a free slot (and its transfer a free place in both directions) for its whole
    rounded length (:func:`rebalancer.planning.packing.serial_schedule` over whole units: every instant it returns
    is a sum of them). Rounding delays each step by less than a unit per step before it on its node, so the solver
    starts from a schedule as long as the given one plus about that."""
    node, other = packing.slot_nodes(p.action, p.src, p.tgt, chosen)
    steps = packing.Steps(node=node, other=other, moving=(p.action == A_COPY) & (p.nbytes > 0),
                          length=length.astype(np.float64), nxt=p.nxt, lanes=np.concatenate([in_limit, out_limit]),
                          nn=p.nn, cap=p.cap, overhead=float(lead))
    position = np.empty(p.n)
    position[_in_start_order(p, start_s)] = np.arange(p.n)
    placed = packing.serial_schedule(steps, position, not_before=np.ceil(start_s / unit_s - 1e-6))
    return np.rint(placed).astype(np.int64)


def compact(p: Problem, start_units: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Start times in seconds for a solution of the rounded model, its grid's idle gaps closed: its steps, in the
    order they start there (a step after the one before it in its partition), each at the earliest instant no
    earlier than its partition's previous step's end where every node it touches has a free slot, and its transfer
    a free place in both directions (``_direction_limits``), for its real duration (the serial schedule generation
    scheme in continuous time, :func:`rebalancer.planning.packing.serial_schedule`). Each step starts no later than
    its grid start: every step placed before it started no later and lasts no longer than its rounded length, so its
    grid start is one of the instants tried. So the schedule is as legal as the solution and no longer.
    """
    in_limit, out_limit = _direction_limits(p)
    node, other = packing.slot_nodes(p.action, p.src, p.tgt, np.asarray(chosen, dtype=np.int64))
    steps = packing.Steps(node=node, other=other, moving=(p.action == A_COPY) & (p.nbytes > 0),
                          length=np.asarray(p.solo, dtype=np.float64), nxt=p.nxt,
                          lanes=np.concatenate([in_limit, out_limit]), nn=p.nn, cap=p.cap, overhead=p.overhead)
    position = np.empty(p.n)
    position[_in_start_order(p, start_units)] = np.arange(p.n)
    return packing.serial_schedule(steps, position)


def _in_start_order(p: Problem, start: np.ndarray) -> list[int]:
    """The rows by ``start``, a step after its partition's previous one where they start at the same instant."""
    depth = np.zeros(p.n, dtype=np.int64)
    for i in np.argsort(start, kind="stable").tolist():
        if p.nxt[i] >= 0:
            depth[p.nxt[i]] = max(depth[p.nxt[i]], depth[i] + 1)
    return list(np.lexsort((depth, start)).tolist())
