"""The optimum as an oracle: CP-SAT's proven optimum against the scheduler and its lower bound (pure: no Spark).

``rebalancer.planning.schedule.optimum`` solves a plan with OR-Tools CP-SAT under the rules of docs/PLANNING.md (a
step holds a slot on every node it touches, per-node caps, a partition's steps in order, each COPY's supplier one
of its candidates). Where no transfer can be slowed (``cap * stream <= bw``: here entries at 400 MB/s, caps 1-5,
20 Gbps) that model *is* the cost model, so its proven optimum is the plan's optimum. The plans are the suite's
kind on small clusters (3-7 nodes, a failure, a join, a drain or a graceful leave, 1-2 groups, 1-2 backups) and
``bench.plans.random_plan``'s adversarial shapes (promotes and drops in any order), with bytes rounded to whole
10-millisecond transfers, so that the solver's time unit loses nothing. Checked:

- the model itself, against brute force on tiny plans (every order of the steps and every choice of suppliers,
  each laid out by the serial schedule generation scheme, which reaches an optimal schedule for some order);
- the lower bound <= the proven optimum <= ``portfolio``'s makespan, and ``portfolio`` within 3% of the optimum
  wherever the optimum is proven and the partitions are in one priority class (across classes ``portfolio`` puts
  under-replicated partitions first, as SPEC 4 requires, which the optimum does not);
- the solver's schedule is legal and its times are the cost model's: a fluid simulation of its starts and
  sources written here from the rules (not the scheduler's event loop) gives the same ends.

Examples: ``OPTIMUM_EXAMPLES`` (default 200; the soak profile, ``HYPOTHESIS_PROFILE=soak`` as ``make soak`` sets it,
3,000) for the properties against the optimum, a quarter of them for the brute force.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from bench.plans import DRAINING, FAILED, JOINED, LEFT, Change, random_plan, scenario_plan
from rebalancer.planning.schedule import (
    PLAN_INPUT_SCHEMA,
    CostModel,
    lower_bound,
    makespan,
    optimum,
    schedule,
    schedule_with_stats,
)

pytest.importorskip("ortools")

SOAK = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "soak"
EXAMPLES = int(os.environ.get("OPTIMUM_EXAMPLES", "3000" if SOAK else "200"))
ORACLE_TIME = 5.0 if SOAK else 1.0  # CP-SAT's deterministic time for the oracle (an optimum not proven is skipped)
UNIT_S = 0.01  # the solver's unit here: every test plan's durations are whole multiples of it
QUANTUM = 4_000_000  # bytes an entry transfer moves in UNIT_S at 400 MB/s
EPS = 1e-6


def quantized(plan: pa.Table) -> pa.Table:
    """``plan`` with every COPY by entries and its bytes rounded to whole ``QUANTUM``s (durations in ``UNIT_S``)."""
    nbytes = plan.column("bytes").to_numpy(zero_copy_only=False)
    rounded = (np.round(nbytes / QUANTUM) * QUANTUM).astype(np.int64)
    plan = plan.set_column(plan.schema.get_field_index("bytes"), "bytes", pa.array(rounded, pa.int64()))
    entries = pc.if_else(pc.equal(plan.column("action"), "COPY"), "entries", pa.scalar(None, pa.string()))
    return plan.set_column(plan.schema.get_field_index("transfer"), "transfer", entries)


@st.composite
def cluster_plans(draw: st.DrawFn, max_nodes: int = 7, max_partitions: int = 8) -> pa.Table:
    """The plan of one event on a small generated cluster (module docstring)."""
    nodes = draw(st.integers(3, max_nodes))
    event = draw(st.sampled_from([FAILED, JOINED, DRAINING, LEFT]))
    node = f"node{nodes - 1}" if event == JOINED else f"node{draw(st.integers(0, nodes - 1))}"
    change = Change("small", event.lower(), nodes, draw(st.integers(1, 2)), draw(st.integers(2, max_partitions)),
                    draw(st.integers(1, 2)), event, node)
    return quantized(scenario_plan(change, seed=draw(st.integers(0, 2**31 - 1))))


@st.composite
def shaped_plans(draw: st.DrawFn, max_partitions: int = 6) -> pa.Table:
    """``bench.plans.random_plan``'s shapes: any step order, promotes, drops, 2-5 nodes."""
    return quantized(random_plan(draw(st.integers(0, 2**32 - 1)), draw(st.integers(2, 5)),
                                 draw(st.integers(1, max_partitions)), skew=draw(st.sampled_from([0.0, 0.5, 1.0])),
                                 planner_order=draw(st.booleans()), one_class=draw(st.booleans())))


def exact_model(cap: int) -> CostModel:
    model = CostModel(max_parallel_per_node=cap)
    assert cap * model.entry_stream_bytes_per_s <= model.node_bandwidth_bytes_per_s  # no transfer can be slowed
    return model


def one_class(plan: pa.Table) -> bool:
    owners = plan.column("owners").to_numpy()
    replicas = plan.column("replicas").to_numpy()
    urgent = (owners < replicas) | (owners <= 1)
    return bool(urgent.all() or not urgent.any())


# --- an independent reading of the rules --------------------------------------------------------------------------


def touched(row: dict[str, Any], source: str) -> tuple[str, ...]:
    if row["action"] == "COPY":
        return (row["target_node"], source)
    if row["action"] == "PROMOTE" and row["target_node"] != row["source_node"]:
        return (row["source_node"], row["target_node"])
    return (row["source_node"],)


def stream(row: dict[str, Any], model: CostModel) -> float:
    return model.file_stream_bytes_per_s if row["transfer"] == "files" else model.entry_stream_bytes_per_s


def solo(row: dict[str, Any], model: CostModel) -> float:
    if row["action"] != "COPY":
        return model.overhead_s
    return model.overhead_s + row["bytes"] / min(stream(row, model), model.node_bandwidth_bytes_per_s)


def brute_force(plan: pa.Table, model: CostModel) -> float:
    """The optimal makespan of a tiny plan whose transfers cannot be slowed: the serial schedule generation scheme
    (each step in list order at the earliest instant its partition's previous step has ended and every node it
    touches has a free slot for its whole duration) over every list that keeps each partition's order and every
    choice of suppliers. Some list lays out an optimal schedule (Kolisch 1996: the active schedules contain an
    optimal one, and the scheme generates every active schedule), so the least makespan is the optimum."""
    rows = plan.to_pylist()
    cap = model.max_parallel_per_node
    length = [solo(r, model) for r in rows]
    pools = [sorted(set(r["candidates"]) - {r["target_node"]}) if r["action"] == "COPY" else [r["source_node"]]
             for r in rows]
    key = [(r["group_name"], r["partition_id"]) for r in rows]
    before = {i: j for i in range(len(rows)) for j in range(len(rows))
              if key[i] == key[j] and rows[j]["step"] == rows[i]["step"] - 1}
    best = math.inf
    for sources in itertools.product(*pools):
        nodes = [touched(r, s) for r, s in zip(rows, sources, strict=True)]
        for order in itertools.permutations(range(len(rows))):
            placed: dict[int, tuple[float, float]] = {}
            for i in order:
                if i in before and before[i] not in placed:
                    break
                earliest = placed[before[i]][1] if i in before else 0.0
                for t in sorted({earliest, *(e for _, e in placed.values() if e > earliest)}):
                    end = t + length[i]
                    points = {t, *(s for s, _ in placed.values() if t < s < end)}
                    if all(sum(1 for j, (s, e) in placed.items() if v in nodes[j] and s <= x < e) < cap
                           for v in nodes[i] for x in points):
                        placed[i] = (t, end)
                        break
            else:
                best = min(best, max(e for _, e in placed.values()))
    return best


def fluid_ends(rows: list[dict[str, Any]], model: CostModel) -> list[float]:
    """Each step's end under the cost model, given its start and source: rates re-shared at every start and end of
    a transfer, ``min(stream, bw / n_out(source), bw / n_in(target))``."""
    bw, overhead = model.node_bandwidth_bytes_per_s, model.overhead_s
    ends = [r["est_start_s"] + overhead for r in rows]
    left = {i: float(r["bytes"]) for i, r in enumerate(rows) if r["action"] == "COPY" and r["bytes"] > 0}
    begins = sorted((rows[i]["est_start_s"] + overhead, i) for i in left)
    active: set[int] = set()
    t, k = 0.0, 0
    while k < len(begins) or active:
        n_out: dict[str, int] = defaultdict(int)
        n_in: dict[str, int] = defaultdict(int)
        for j in active:
            n_out[rows[j]["source_node"]] += 1
            n_in[rows[j]["target_node"]] += 1
        rate = {j: min(stream(rows[j], model), bw / max(n_out[rows[j]["source_node"]], n_in[rows[j]["target_node"]]))
                for j in active}
        upcoming = begins[k][0] if k < len(begins) else math.inf
        finish = min((t + left[j] / rate[j] for j in active), default=math.inf)
        nxt = min(upcoming, finish)
        for j in active:
            left[j] -= rate[j] * (nxt - t)
        t = nxt
        for j in [j for j in active if left[j] <= 1e-3]:
            active.discard(j)
            ends[j] = t
        while k < len(begins) and begins[k][0] <= t + 1e-12:
            active.add(begins[k][1])
            k += 1
    return ends


def assert_legal(plan: pa.Table, out: pa.Table, model: CostModel) -> None:
    """Caps at every instant, each partition's steps in order, every COPY from one of its candidates, and the
    times the cost model gives for these starts and sources."""
    rows = out.to_pylist()
    given_rows = plan.to_pylist()
    for r, g in zip(rows, given_rows, strict=True):
        if r["action"] == "COPY":
            assert r["source_node"] in g["candidates"] and r["source_node"] != r["target_node"], r
        else:
            assert r["source_node"] == g["source_node"], r
    for i, end in enumerate(fluid_ends(rows, model)):
        assert rows[i]["est_end_s"] == pytest.approx(end, abs=1e-6), (rows[i], end)
    for t in {r["est_start_s"] for r in rows}:
        load: dict[str, int] = defaultdict(int)
        for r in rows:
            if r["est_start_s"] <= t < r["est_end_s"] - 1e-9:
                for v in touched(r, r["source_node"]):
                    load[v] += 1
        assert max(load.values(), default=0) <= model.max_parallel_per_node, (t, dict(load))
    steps: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        steps[(r["group_name"], r["partition_id"])].append(r)
    for chain in steps.values():
        chain.sort(key=lambda r: r["step"])
        for a, b in itertools.pairwise(chain):
            assert a["est_end_s"] <= b["est_start_s"] + 1e-9, (a, b)


# --- the model against brute force -------------------------------------------------------------------------------


@st.composite
def tiny_plans(draw: st.DrawFn) -> pa.Table:
    plan = draw(st.one_of(cluster_plans(max_nodes=4, max_partitions=3), shaped_plans(max_partitions=3)))
    return plan.slice(0, 0) if plan.num_rows > 5 else plan


@given(tiny_plans(), st.integers(1, 3))
@settings(max_examples=max(EXAMPLES // 4, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                      HealthCheck.filter_too_much])
def test_the_model_finds_what_brute_force_finds_on_tiny_plans(plan: pa.Table, cap: int) -> None:
    if plan.num_rows == 0:
        return
    model = exact_model(cap)
    found = optimum(plan, model, unit_s=UNIT_S, max_deterministic_time=5.0, hint=None)
    note(f"{plan.to_pylist()}, cap {cap}: {found}")
    assert found.optimal and found.exact
    assert found.makespan_s == pytest.approx(brute_force(plan, model), abs=EPS)
    assert found.scheduled is not None
    assert_legal(plan, found.scheduled, model)


def test_brute_force_sees_what_one_slot_forbids() -> None:
    """Two COPYs out of node a (0.1 s + 0.02 s each) at cap 1 run one after the other; a DROP on b beside them."""
    rows = [
        {"migration_id": 1, "group_name": "g", "partition_id": 0, "step": 1, "action": "COPY", "source_node": "a",
         "target_node": "b", "candidates": ["a"], "primary_node": "a", "transfer": "entries", "bytes": 2 * QUANTUM,
         "owners": 1, "replicas": 2},
        {"migration_id": 2, "group_name": "g", "partition_id": 1, "step": 1, "action": "COPY", "source_node": "a",
         "target_node": "c", "candidates": ["a"], "primary_node": "a", "transfer": "entries", "bytes": 2 * QUANTUM,
         "owners": 1, "replicas": 2},
        {"migration_id": 3, "group_name": "g", "partition_id": 2, "step": 1, "action": "DROP", "source_node": "d",
         "target_node": None, "candidates": None, "primary_node": None, "transfer": None, "bytes": 0,
         "owners": 1, "replicas": 2},
    ]
    plan = pa.Table.from_pylist(rows, schema=PLAN_INPUT_SCHEMA)
    assert brute_force(plan, exact_model(1)) == pytest.approx(0.24)
    assert brute_force(plan, exact_model(2)) == pytest.approx(0.12)
    assert optimum(plan, exact_model(1), unit_s=UNIT_S).makespan_s == pytest.approx(0.24)


# --- the scheduler against the optimum ----------------------------------------------------------------------------


@given(st.one_of(cluster_plans(), shaped_plans()), st.integers(1, 5))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bound_optimum_and_portfolio_in_order_and_portfolio_within_three_percent(plan: pa.Table, cap: int) -> None:
    if plan.num_rows == 0:
        return
    model = exact_model(cap)
    ours = schedule(plan, model, "portfolio")
    found = optimum(plan, model, unit_s=UNIT_S, max_deterministic_time=ORACLE_TIME)
    span, bound = makespan(ours), lower_bound(ours, model)
    note(f"cap {cap}: bound {bound}, optimum {found}, portfolio {span}")
    assert found.exact
    assert found.scheduled is not None
    assert_legal(plan, found.scheduled, model)
    assert bound <= found.makespan_s + EPS
    assert found.proven_bound_s <= span + EPS
    if found.optimal:  # the plan's optimum (its durations are whole units: no rounding)
        assert bound <= found.makespan_s + EPS <= span + 2 * EPS
        if one_class(plan):
            assert span <= 1.03 * found.makespan_s + EPS


# --- the exact pass where transfers can be slowed -----------------------------------------------------------------


@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(1, 12), st.integers(1, 4),
       st.sampled_from([2e8, 1e9, 2.5e9]), st.sampled_from([0.0, 0.01, 0.1]))
@settings(max_examples=max(EXAMPLES // 2, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_exact_and_packed_passes_keep_to_the_cost_model_where_links_are_shared(
    seed: int, nodes: int, partitions: int, cap: int, bw: float, overhead: float
) -> None:
    """Where ``cap * stream > bw`` the solver keeps to schedules whose transfers all run at their stream rate (at most
    ``floor(bw / stream)`` per node and direction), and the packed pass plans each transfer at the slowest rate its
    lanes allow: either schedule, when ``portfolio`` keeps it, must be legal and the cost model's for its starts
    and sources, entries and files alike, and no longer than the greedy one."""
    plan = random_plan(seed, nodes, partitions, one_class=True)
    model = CostModel(max_parallel_per_node=cap, node_bandwidth_bytes_per_s=bw, overhead_s=overhead)
    out, stats = schedule_with_stats(plan, model)
    note(f"{model}: {stats}")
    assert stats.makespan_s <= stats.greedy_makespan_s
    assert makespan(out) == pytest.approx(stats.makespan_s)
    if stats.chosen == "solver":
        assert stats.makespan_s < stats.greedy_makespan_s
    if stats.chosen in ("solver", "packed"):
        assert_legal(plan, out, model)
    assert lower_bound(out, model) <= stats.makespan_s + EPS


@pytest.mark.parametrize("event", [FAILED, DRAINING])
def test_a_packed_schedule_is_legal_and_the_cost_models(event: str) -> None:
    """Plans where the packed pass wins (6 nodes, 4 groups of 32 partitions, 2 backups: a failure of 68 COPYs and a
    drain of 136 steps, COPYs, PROMOTEs and DROPs in chains): the replayed schedule is legal and its times are the
    fluid model's for its starts and sources."""
    plan = scenario_plan(Change("small", event.lower(), 6, 4, 32, 2, event, "node1"))
    model = CostModel()
    out, stats = schedule_with_stats(plan, model)
    assert stats.chosen == "packed"
    assert_legal(plan, out, model)
    assert lower_bound(out, model) <= stats.makespan_s + EPS


def test_the_exact_pass_hint_starts_a_held_back_transfer_as_its_lane_frees() -> None:
    """Seven COPYs into one node (six lanes: 6 x 400 MB/s fill 20 Gbps), all given at 0: the hint the solver starts
    from keeps six at 0 and starts the seventh one overhead before the shortest transfer ends, so that its own
    transfer takes the lane as it frees (not a whole overhead later)."""
    from rebalancer.planning import optimum as model_module

    sizes = np.array([400, 800, 1200, 1600, 2000, 2400, 400]) * 1e6
    n, unit, lead = len(sizes), 1e-3, 100
    problem = model_module.Problem(
        action=np.zeros(n, dtype=np.int64), src=np.arange(1, n + 1), tgt=np.zeros(n, dtype=np.int64),
        nxt=np.full(n, -1), pool_node=np.arange(1, n + 1), pool_start=np.arange(n + 1), nbytes=sizes,
        stream=np.full(n, 4e8), solo=0.1 + sizes / 4e8, nn=n + 1, cap=10, bw=2.5e9, overhead=0.1)
    inbound, outbound = model_module._direction_limits(problem)
    assert inbound[0] == 6
    length = np.ceil(problem.solo / unit - 1e-6).astype(np.int64)
    hint = model_module._feasible_hint(problem, length, lead, inbound, outbound, np.zeros(n), np.arange(1, n + 1),
                                       unit)
    assert hint.tolist() == [0, 0, 0, 0, 0, 0, 1100 - lead]
