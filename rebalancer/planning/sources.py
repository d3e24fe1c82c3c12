"""Suppliers balanced by a linear program: the COPY sources that spread every node's work best, and the bound it gives.

:mod:`rebalancer.planning.schedule` calls :func:`balance` with a decoded plan; this module is only the linear program
(OR-Tools GLOP, imported when a plan is balanced). Pure: no Spark, no storage.

The program
    COPYs with the same pool (the nodes that may supply them) are interchangeable as far as their sources go, so
    the program splits each pool's COPYs over its members: ``x[P, c]`` is the share of pool P's COPYs (of their solo
    time and of their bytes alike) that member c sends. A node's *slot time* is the solo time of the steps that must
    touch it (COPYs into it, PROMOTEs and DROPs on it, COPYs whose pool is it alone) plus its shares; its *send time*
    its forced bytes plus its shares of bytes, over ``bw``. It minimises the makespan T subject to, for every node v,

    * slot time(v) <= cap * (T - h(v) - t(v)),
    * send time(v) <= T - h'(v) - overhead_s - t'(v),

    where h and t are the least head and tail (solo time before and after, in the partition) over the steps that
    may touch v (h' and t' over the COPYs with bytes that v may send).

Why it is a lower bound
    Take any schedule of makespan T reading every COPY from its pool. Its sources give shares ``x[P, c]`` (the
    fraction of P's COPYs c sends; splitting a pool's solo time and bytes in one proportion is the program's
    relaxation, and the program may also split its work any way). Every step holds its slots for at least its solo
    time, between its head and T minus its tail; so a node's steps fit in ``cap`` slots over that window. A node
    sends at most ``bw`` bytes per second, from the end of the first overhead on. So the schedule's T satisfies the
    constraints, and the program's optimum is at most T. The windows use the least head and tail over every step
    that *may* touch the node, which is at most the least over those that do.

The sources
    The optimal shares, rounded COPY by COPY: each pool's COPYs, in dispatch order, go to the member whose share is
    furthest ahead of what it was given so far (``(k + 1) * x[P, c] - given[c]``, ties to the lower node index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rebalancer.planning.event_loop import A_COPY, A_PROMOTE

__all__ = ["MAX_POOLS", "Balance", "balance"]

MAX_POOLS = 20_000
"""Plans whose COPYs have more distinct pools than this are not balanced (a program that large takes seconds; the
benchmark's synthetic plan of a million steps has about 600,000 pools, every suite plan a few hundred at most)."""


@dataclass(frozen=True)
class Balance:
    """The program's optimum.

    Attributes:
        bound_s: its optimal T, a lower bound of any schedule's makespan (module docstring).
        pool_node / pool_start: per row, the one node the rounding gave a flexible COPY (other rows keep their pool).
    """

    bound_s: float
    pool_node: np.ndarray
    pool_start: np.ndarray


def balance(
    *,
    action: np.ndarray,
    src: np.ndarray,
    tgt: np.ndarray,
    pool_node: np.ndarray,
    pool_start: np.ndarray,
    nbytes: np.ndarray,
    solo: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    order: np.ndarray,
    nn: int,
    cap: int,
    bw: float,
    overhead: float,
    max_pools: int = MAX_POOLS,
) -> Balance | None:
    """Solve the program for a plan given as arrays indexed by row (``schedule``'s ``_Plan``).

    Args:
        action / src / tgt / pool_node / pool_start / nbytes: the plan (``pool_node`` sorted within each row).
        solo: each row's duration alone.
        head / tail: per row, the solo time of its partition's steps before and after it.
        order: every row in dispatch order (the order the rounding gives COPYs their sources in).
        nn / cap / bw / overhead: node count and the cost model.
        max_pools: give up (None) above this many distinct pools of flexible COPYs.

    Returns:
        The :class:`Balance`, or None when there are too many pools or the solver fails.
    """
    n = len(action)
    sizes = np.diff(pool_start)
    is_copy = action == A_COPY
    flexible = np.flatnonzero(is_copy & (sizes > 1))
    if len(flexible) > max_pools and _distinct_pools(pool_node, pool_start, flexible) > max_pools:
        return None
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    flexible = flexible[np.argsort(rank[flexible], kind="stable")]  # the program in a canonical order
    pools: dict[tuple[int, ...], list[int]] = {}
    for i in flexible.tolist():
        pools.setdefault(tuple(pool_node[pool_start[i] : pool_start[i + 1]].tolist()), []).append(i)
    from ortools.linear_solver import pywraplp

    forced = is_copy & (sizes == 1)
    only = np.full(n, -1, dtype=np.int64)
    only[forced] = pool_node[pool_start[:-1][forced]]
    # Slot incidences that do not depend on the sources, and the window of every node.
    two = (action == A_PROMOTE) & (tgt != src)
    rows = np.concatenate([np.flatnonzero(is_copy), np.flatnonzero(~is_copy), np.flatnonzero(two),
                           np.flatnonzero(forced)])
    nodes = np.concatenate([tgt[is_copy], src[~is_copy], tgt[two], only[forced]])
    pinned = np.bincount(nodes, weights=solo[rows], minlength=nn)
    member_rows = np.repeat(np.arange(n), sizes)
    all_rows = np.concatenate([rows, member_rows[is_copy[member_rows]]])
    all_nodes = np.concatenate([nodes, pool_node[is_copy[member_rows]]])
    window = np.full(nn, np.inf)
    np.minimum.at(window, all_nodes, head[all_rows])
    last = np.full(nn, np.inf)
    np.minimum.at(last, all_nodes, tail[all_rows])
    moving = is_copy[all_rows] & (nbytes[all_rows] > 0) & (all_nodes != tgt[all_rows])
    send_first = np.full(nn, np.inf)
    np.minimum.at(send_first, all_nodes[moving], head[all_rows[moving]])
    send_last = np.full(nn, np.inf)
    np.minimum.at(send_last, all_nodes[moving], tail[all_rows[moving]])
    forced_bytes = np.bincount(only[forced], weights=nbytes[forced], minlength=nn) / bw

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return None
    big = float(solo.sum()) + 1.0
    makespan = solver.NumVar(0.0, big, "T")
    slot_terms: list[list[tuple[Any, float]]] = [[] for _ in range(nn)]
    send_terms: list[list[tuple[Any, float]]] = [[] for _ in range(nn)]
    shares: dict[tuple[int, ...], list[Any]] = {}  # GLOP's variables
    for pool, members in pools.items():
        work = float(solo[members].sum())
        volume = float(nbytes[members].sum()) / bw
        xs = [solver.NumVar(0.0, 1.0, f"x{len(shares)}_{c}") for c in pool]
        solver.Add(solver.Sum(xs) == 1.0)
        shares[pool] = xs
        for c, x in zip(pool, xs, strict=True):
            slot_terms[c].append((x, work))
            if volume > 0:
                send_terms[c].append((x, volume))
    for v in range(nn):
        if slot_terms[v] or pinned[v] > 0:
            slack = (window[v] if np.isfinite(window[v]) else 0.0) + (last[v] if np.isfinite(last[v]) else 0.0)
            solver.Add(solver.Sum([x * w for x, w in slot_terms[v]] + [float(pinned[v])]) / cap
                       <= makespan - slack)
        if send_terms[v] or forced_bytes[v] > 0:
            slack = send_first[v] + overhead + send_last[v] if np.isfinite(send_first[v]) else 0.0
            solver.Add(solver.Sum([x * w for x, w in send_terms[v]] + [float(forced_bytes[v])]) <= makespan - slack)
    solver.Minimize(makespan)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    bound = float(makespan.solution_value())

    keep = np.ones(len(pool_node), dtype=bool)
    for pool, members in pools.items():
        target = np.array([x.solution_value() for x in shares[pool]])
        given = np.zeros(len(pool))
        for k, i in enumerate(members):
            pick = int(np.argmax((k + 1) * target - given))
            given[pick] += 1
            keep[pool_start[i] : pool_start[i + 1]] = pool_node[pool_start[i] : pool_start[i + 1]] == pool[pick]
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(member_rows[keep], minlength=n), out=starts[1:])
    return Balance(bound_s=bound, pool_node=pool_node[keep], pool_start=starts)


def _distinct_pools(pool_node: np.ndarray, pool_start: np.ndarray, rows: np.ndarray) -> int:
    """How many distinct pools ``rows`` have, counted by a hash of each pool (vectorised: a plan of a million steps
    is told apart in milliseconds; two pools sharing a hash only make the count smaller)."""
    if len(rows) <= 1:
        return len(rows)
    sizes = np.diff(pool_start)[rows]
    entries = np.repeat(pool_start[rows], sizes) + (np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes,
                                                                                           sizes))
    position = entries - np.repeat(pool_start[rows], sizes)
    with np.errstate(over="ignore"):
        weights = np.uint64(0x9E3779B97F4A7C15) ** position.astype(np.uint64) | np.uint64(1)
        terms = (pool_node[entries].astype(np.uint64) + np.uint64(1)) * weights
        keys = np.add.reduceat(terms, np.cumsum(sizes) - sizes)
    return len(np.unique(keys))
