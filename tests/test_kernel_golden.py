"""Golden scenarios of the exchange kernel, without Spark: the stage scenarios of ``test_exchange_stages.py``, kept.

Every scenario of the old stage tests (fullmap, counters, lost, late_affinity, demands) runs here through the one
kernel, :func:`rebalancer.exchange.kernel.decide`, and :func:`rebalancer.planning.plan.finish_plan`, with the same
inputs and the same exact expected rows. Tiny hand-built inputs: ``MAP`` rows are the previous ``partition_map``,
``REPORT`` rows the reports the exchange consumes, ``ASSIGNMENT``/``LOST_ROW``/``VERSION`` rows the previous
``affinity_assignment``/``lost_partitions``/``partition_versions``; a ``PARTITION`` marker for every partition.

Two kinds of adaptation, each marked where it happens:

- **Ideal lists.** The stage tests wrote the ideal lists by hand; the kernel ranks the alive nodes itself with the
  rendezvous affinity. (a) Most scenarios keep their lists and expectations by choosing node ids that rendezvous
  ranks as the scenario needs (``n4hy`` is "node 4": ids keep the order n1 < n2 < n3 < n4, and ``node_order`` is
  the number in the name, as in the stage tests); every scenario asserts its ideal lists first. (b) Where a stage
  test called one stage alone, the kernel decides the whole partition, so the rows that later decisions add or
  change are re-derived by hand, keeping the scenario's intent; each such row is marked ``(b)``.
- **SPEC clarifications** (SPEC section 4, "Lost partitions" and "Full map"): (1) an IGNORE loss is listed in
  ``lost_partitions`` only in the version of the loss, never sticky; (2) a partition with no owner that is IGNORE,
  of a group started or reset now, or that had no copy at all in the previous map, is created empty (OWNING,
  counter 0) on its ideal nodes; (3) reports apply per copy: a report consumed by the previous version is not in
  the kernel's input at all.

The old ``demands`` frames held only the COPY rows; the kernel's plan also has the PROMOTE and DROP steps the
planner used to add, so the plans below hold them too and ``migration_id`` numbers every step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import MigrationSettings
from rebalancer.exchange.batches import summarise
from rebalancer.exchange.kernel import (
    ASSIGNMENT,
    INPUT_SCHEMA,
    LOST_ROW,
    MAP,
    PARTITION,
    REPORT,
    VERSION,
    Decisions,
    KernelContext,
    KernelInputError,
    KernelInvariantError,
    check_invariants,
    decide,
)
from rebalancer.groups import GroupSettings
from rebalancer.planning.plan import finish_plan

OW, MV, RT, EV, LS = "OWNING", "MOVING", "RENTING", "EVICTED", "LOST"
RWS, ROS, IGN = "READ_WRITE_SAFE", "READ_ONLY_SAFE", "IGNORE"
COPY, PROMOTE, DROP, FULL, HIST = "COPY", "PROMOTE", "DROP", "FULL", "HISTORICAL"

Row = tuple[Any, ...]
Part = tuple[str, int]
Rows = list[dict[str, Any]]

MAP_COLUMNS = ["group_name", "partition_id", "node_id", "state", "update_counter", "size", "bytes"]
REPORT_COLUMNS = ["node_id", "group_name", "partition_id", "state", "update_counter", "size", "bytes",
                  "wal_history_counter", "report_seq"]
CONFLICT_COLUMNS = ["group_name", "partition_id", "node_id", "update_counter", "max_update_counter", "size", "action"]
LOST_COLUMNS = ["group_name", "partition_id", "loss_policy", "read_allowed", "write_allowed"]
ASSIGNMENT_COLUMNS = ["group_name", "partition_id", "replica_index", "node_id", "is_temporary"]
PLAN_COLUMNS = ["migration_id", "group_name", "partition_id", "step", "action", "source_node", "target_node",
                "rebalance_mode", "from_counter", "to_counter", "bytes"]


# ---------------------------------------------------------------- input rows


def order_of(node_id: str) -> int:
    """``node_order`` as the stage tests gave it: the number in the name (``n4hy`` -> 4); other names 100."""
    match = re.match(r"n(\d+)", node_id)
    return int(match.group(1)) if match else 100


def owning(group: str, partition: int, nodes: Sequence[str], counter: int, size: int, nbytes: int) -> list[Row]:
    return [(group, partition, n, OW, counter, size, nbytes) for n in nodes]


def map_rows(rows: Iterable[Row]) -> Rows:
    """Previous ``partition_map`` rows from ``(group, partition, node, state, counter, size, bytes)``."""
    return [{"kind": MAP, **dict(zip(MAP_COLUMNS, r, strict=True))} for r in rows]


def report_rows(rows: Iterable[Row]) -> Rows:
    """Consumed reports from ``(node, group, partition, state, counter, size, bytes, wal, seq)`` (old REPORT_SCHEMA)."""
    return [{"kind": REPORT, **dict(zip(REPORT_COLUMNS, r, strict=True))} for r in rows]


def assignment_rows(lists: Mapping[Part, tuple[Sequence[str], bool]]) -> Rows:
    return [
        {"kind": ASSIGNMENT, "group_name": g, "partition_id": p, "replica_index": i, "node_id": n, "is_temporary": t}
        for (g, p), (nodes, t) in lists.items()
        for i, n in enumerate(nodes)
    ]


def lost_rows(parts: Iterable[Part]) -> Rows:
    return [{"kind": LOST_ROW, "group_name": g, "partition_id": p} for g, p in parts]


def version_rows(versions: Mapping[Part, int]) -> Rows:
    return [{"kind": VERSION, "group_name": g, "partition_id": p, "partition_version": v}
            for (g, p), v in versions.items()]


# ---------------------------------------------------------------- expected rows


def rows_of(table: pa.Table, columns: Sequence[str]) -> list[Row]:
    return sorted((tuple(r[c] for c in columns) for r in table.to_pylist()), key=repr)


def expected(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=repr)


def assignment_of(lists: Mapping[Part, tuple[Sequence[str], bool]]) -> list[Row]:
    return expected((g, p, i, n, t) for (g, p), (nodes, t) in lists.items() for i, n in enumerate(nodes))


def copy(mid: int, g: str, p: int, step: int, src: str, dst: str, mode: str, frm: int, to: int, nbytes: int) -> Row:
    return (mid, g, p, step, COPY, src, dst, mode, frm, to, nbytes)


def promote(mid: int, g: str, p: int, step: int, src: str, dst: str) -> Row:
    return (mid, g, p, step, PROMOTE, src, dst, None, None, None, 0)


def drop(mid: int, g: str, p: int, step: int, src: str) -> Row:
    return (mid, g, p, step, DROP, src, None, None, None, None, 0)


# ---------------------------------------------------------------- one exchange


@dataclass(frozen=True)
class Exchange:
    """One kernel run: its input, its decisions and the finished plan, read back as sorted row tuples."""

    consumed: pa.Table
    decisions: Decisions
    plan: pa.Table

    def ideal(self) -> dict[Part, list[str]]:
        lists: dict[Part, list[str]] = {}
        for r in sorted(self.decisions.ideal_assignment.to_pylist(), key=lambda r: r["replica_index"]):
            lists.setdefault((r["group_name"], r["partition_id"]), []).append(r["node_id"])
        return lists

    def map(self, groups: Sequence[str] = (), partition: int | None = None) -> list[Row]:
        rows = rows_of(self.decisions.partition_map, MAP_COLUMNS)
        return [r for r in rows if (not groups or r[0] in groups) and (partition is None or r[1] == partition)]

    def conflicts(self) -> list[Row]:
        return rows_of(self.decisions.counter_conflicts, CONFLICT_COLUMNS)

    def lost(self) -> list[Row]:
        return rows_of(self.decisions.lost_partitions, LOST_COLUMNS)

    def assignment(self, group: str | None = None, partition: int | None = None) -> list[Row]:
        rows = rows_of(self.decisions.affinity_assignment, ASSIGNMENT_COLUMNS)
        return [r for r in rows if (group is None or r[0] == group) and (partition is None or r[1] == partition)]

    def versions(self) -> dict[Part, int]:
        return {(r["group_name"], r["partition_id"]): r["partition_version"]
                for r in self.decisions.partition_versions.to_pylist()}

    def steps(self) -> list[Row]:
        return sorted(tuple(r[c] for c in PLAN_COLUMNS) for r in self.plan.to_pylist())

    def switch(self) -> tuple[bool, int]:
        """``(due, waiting_partitions)`` as the old ``switch_due`` returned it, from the pipeline's own summary."""
        s = summarise(self.decisions, self.consumed)
        unready = s["switch_unready_partitions"]
        return s["switch_waiting_partitions"] > 0 and unready == 0, unready

    def flags(self) -> list[Row]:
        return rows_of(self.decisions.partitions, ["group_name", "partition_id", "switch_waiting", "switch_ready"])

    def committed(self) -> Rows:
        """This version's tables as the next exchange's previous rows (MAP, ASSIGNMENT, LOST_ROW, VERSION)."""
        d = self.decisions
        return (
            [{"kind": MAP, **r} for r in d.partition_map.to_pylist()]
            + [{"kind": ASSIGNMENT, **r} for r in d.affinity_assignment.to_pylist()]
            + lost_rows((r["group_name"], r["partition_id"]) for r in d.lost_partitions.to_pylist())
            + [{"kind": VERSION, **r} for r in d.partition_versions.to_pylist()]
        )


def context(groups: Sequence[GroupSettings], nodes: Sequence[str], history_threshold: int = 500,
            clients: Sequence[str] = (), started: Iterable[str] = (), reset: Iterable[str] = ()) -> KernelContext:
    """Alive servers ``nodes`` (the NodeSet), their join orders (clients' too, as the topology has them); the groups
    ``started`` and ``reset`` in this exchange."""
    return KernelContext(
        nodes=NodeSet.of(list(nodes)),
        node_orders={n: order_of(n) for n in [*nodes, *clients]},
        groups={g.name: g for g in groups},
        started=frozenset(started),
        reset=frozenset(reset),
        history_threshold=history_threshold,
    )


def kernel_input(groups: Sequence[GroupSettings], rows: Rows) -> pa.Table:
    marks = [{"kind": PARTITION, "group_name": g.name, "partition_id": p} for g in groups for p in range(g.partitions)]
    return pa.Table.from_pylist(marks + rows, schema=INPUT_SCHEMA)


def run(groups: Sequence[GroupSettings], nodes: Sequence[str], *rows: Rows, history_threshold: int = 500,
        clients: Sequence[str] = (), started: Iterable[str] = (), reset: Iterable[str] = ()) -> Exchange:
    """Decide every partition of ``groups`` over the alive servers ``nodes``; finish the plan (default settings)."""
    table = kernel_input(groups, [r for part in rows for r in part])
    d = decide(table, context(groups, nodes, history_threshold, clients, started, reset))
    return Exchange(table, d, finish_plan(d.steps, MigrationSettings()))


# ---------------------------------------------------------------- Ignite's late affinity example


def test_node_joins_old_owner_serves_as_temporary_primary_until_switch() -> None:
    """3 nodes, 3 partitions, 1 backup; node 4 joins as p0's new primary and p1's new backup."""
    n1, n2, n3, n4 = "n1", "n2l", "n3", "n4hy"  # (a) rendezvous ids for the scenario's ideal lists (asserted below)
    groups, nodes = [GroupSettings("g", 3, 1)], [n1, n2, n3, n4]
    prev_map = (
        owning("g", 0, [n1, n2], 10, 100, 1000)
        + owning("g", 1, [n2, n3], 10, 100, 1000)
        + owning("g", 2, [n3, n1], 10, 100, 1000)
    )
    prev = (
        map_rows(prev_map)
        + assignment_rows({("g", 0): ([n1, n2], False), ("g", 1): ([n2, n3], False), ("g", 2): ([n3, n1], False)})
        + version_rows({("g", 0): 1, ("g", 1): 1, ("g", 2): 1})
    )
    # The stage test also passed n1's p0 report of seq 6, "consumed by the previous version: ignored". Clarification
    # (3): such a report is not in the kernel's input at all.

    joined = run(groups, nodes, prev)

    assert joined.ideal() == {("g", 0): [n4, n1], ("g", 1): [n2, n4], ("g", 2): [n3, n1]}
    assert joined.assignment() == assignment_of(
        {("g", 0): ([n1, n4], True), ("g", 1): ([n2, n4], False), ("g", 2): ([n3, n1], False)}
    )
    assert joined.map() == expected(prev_map + [("g", 0, n4, MV, 0, 0, 0), ("g", 1, n4, MV, 0, 0, 0)])
    # p0's pool is [n1, n2] (p0 offset 0 -> n1), p1's is [n2, n3] (offset 1 -> n3): not always the primary.
    assert joined.steps() == [
        copy(1, "g", 0, 1, n1, n4, FULL, 0, 10, 1000),
        promote(2, "g", 0, 2, n1, n4),
        drop(3, "g", 0, 3, n2),
        copy(4, "g", 1, 1, n3, n4, FULL, 0, 10, 1000),
        drop(5, "g", 1, 2, n3),
    ]
    assert joined.versions() == {("g", 0): 2, ("g", 1): 2, ("g", 2): 1}  # p0 and p1 changed their replica set

    # Given the committed map and no new report, p0 (temporary) and p1 (a loading MOVING ideal copy) wait: not due.
    # (The stage test's switch_due without the committed map counted only the temporary p0; the kernel always has it.)
    committed = joined.committed()
    waiting = run(groups, nodes, committed)
    assert (waiting.map(), waiting.assignment(), waiting.versions()) == (
        joined.map(), joined.assignment(), joined.versions()
    )  # no news, no change
    assert waiting.flags() == [("g", 0, True, False), ("g", 1, True, False), ("g", 2, False, True)]
    assert waiting.switch() == (False, 2)

    # Node 4 reports both partitions OWNING: the switch is due; the switch exchange installs the ideal assignment
    # and the copies outside it (n2's p0, n3's p1) start renting.
    reports = report_rows([(n4, "g", 0, OW, 10, 100, 1000, 0, 7), (n4, "g", 1, OW, 10, 100, 1000, 0, 8)])
    switched = run(groups, nodes, committed, reports)
    assert switched.flags() == [("g", 0, True, True), ("g", 1, True, True), ("g", 2, False, True)]
    assert switched.switch() == (True, 0)
    assert switched.assignment() == assignment_of(
        {("g", 0): ([n4, n1], False), ("g", 1): ([n2, n4], False), ("g", 2): ([n3, n1], False)}
    )
    assert switched.map() == expected(
        owning("g", 0, [n1, n4], 10, 100, 1000)
        + [("g", 0, n2, RT, 10, 100, 1000)]
        + owning("g", 1, [n2, n4], 10, 100, 1000)
        + [("g", 1, n3, RT, 10, 100, 1000)]
        + owning("g", 2, [n3, n1], 10, 100, 1000)
    )
    # No COPY is left ("demands" were empty); the plan only drops the renting copies.
    assert switched.steps() == [drop(1, "g", 0, 1, n2), drop(2, "g", 1, 1, n3)]
    assert switched.versions() == {("g", 0): 3, ("g", 1): 2, ("g", 2): 1}  # p0's primary changed


def test_primary_failure_promotes_owning_backup_else_oldest_owner() -> None:
    """n1 (primary of every partition) fails; the ideal primaries hold no data for p0 and p1."""
    n1, n2, n3, n4 = "n1", "n2d", "n3", "n4ad"  # (a) rendezvous ids for the scenario's ideal lists (asserted below)
    groups = [GroupSettings("g", 3, 1)]
    prev = (
        map_rows(
            owning("g", 0, [n1, n2], 10, 100, 1000)
            + owning("g", 1, [n1, n2, n4], 10, 100, 1000)
            + [("g", 1, n3, MV, 4, 40, 400)]
            + owning("g", 2, [n1, n4], 10, 100, 1000)
        )
        + assignment_rows({("g", 0): ([n1, n2], False), ("g", 1): ([n1, n3], False), ("g", 2): ([n1, n4], False)})
        + version_rows({("g", 0): 1, ("g", 1): 1, ("g", 2): 1})
    )

    out = run(groups, [n2, n3, n4], prev)

    assert out.ideal() == {("g", 0): [n3, n2], ("g", 1): [n3, n4], ("g", 2): [n4, n2]}
    assert out.assignment() == assignment_of(
        {
            ("g", 0): ([n2, n3], True),  # C's backup n2 owns: T = n2
            ("g", 1): ([n2, n3, n4], True),  # C's backup n3 is MOVING: lowest node_order owner n2
            ("g", 2): ([n4, n2], False),  # the ideal primary owns
        }
    )
    # (b) Not in the stage test (it stopped at the assignment): the map and plan that follow, derived by hand.
    assert out.map() == expected(
        owning("g", 0, [n2], 10, 100, 1000)
        + [("g", 0, n3, MV, 0, 0, 0)]
        + owning("g", 1, [n2, n4], 10, 100, 1000)
        + [("g", 1, n3, MV, 4, 40, 400)]  # a MOVING copy on an ideal node keeps its counter
        + owning("g", 2, [n4], 10, 100, 1000)
        + [("g", 2, n2, MV, 0, 0, 0)]
    )
    assert out.steps() == [
        copy(1, "g", 0, 1, n2, n3, FULL, 0, 10, 1000),
        promote(2, "g", 0, 2, n2, n3),
        copy(3, "g", 1, 1, n4, n3, FULL, 0, 10, 1000),  # pool [n2, n4] starting at p0 = 1: n4
        promote(4, "g", 1, 2, n2, n3),
        drop(5, "g", 1, 3, n2),
        copy(6, "g", 2, 1, n4, n2, FULL, 0, 10, 1000),
    ]
    assert out.versions() == {("g", 0): 2, ("g", 1): 2, ("g", 2): 2}


# ---------------------------------------------------------------- lost partitions


def test_two_failures_lose_a_partition_under_each_policy_then_reset() -> None:
    """p0 lives on n1 and n2, which both fail; p1 survives on n3. Then n1 returns with data and two groups reset."""
    # (a) Rendezvous ids: over {n3, n4} and over {n1, n3, n4} alike, p0 -> [n4, n3] and p1 -> [n3, n4] (asserted below).
    n1, n2, n3, n4 = "n1", "n2", "n3e", "n4i"
    names = ["g_rws", "g_ros", "g_ign"]
    policies = {"g_rws": RWS, "g_ros": ROS, "g_ign": IGN}
    groups = [GroupSettings(g, 2, 1, loss_policy=policies[g]) for g in names]
    prev = (
        map_rows(
            [row for g in names for row in owning(g, 0, [n1, n2], 5, 50, 500) + owning(g, 1, [n3, n1], 7, 70, 700)]
            + [("g_rws", 0, n3, MV, 3, 30, 300)]
        )
        + assignment_rows({(g, p): (ns, False) for g in names for p, ns in ((0, [n1, n2]), (1, [n3, n1]))})
    )
    ideal = {(g, p): ns for g in names for p, ns in ((0, [n4, n3]), (1, [n3, n4]))}

    # Exchange A: n1 and n2 fail.
    a = run(groups, [n3, n4], prev)
    assert a.ideal() == ideal
    assert a.lost() == expected(
        [("g_rws", 0, RWS, False, False), ("g_ros", 0, ROS, False, False), ("g_ign", 0, IGN, True, True)]
    )
    survivors = [row for g in names for row in owning(g, 1, [n3], 7, 70, 700) + [(g, 1, n4, MV, 0, 0, 0)]]
    assert a.map() == expected(
        survivors
        + [
            ("g_rws", 0, n3, LS, 0, 30, 300),  # a MOVING copy marked LOST loses its counter
            ("g_rws", 0, n4, LS, 0, 0, 0),  # placeholder on an ideal node holding nothing
            ("g_ros", 0, n3, LS, 0, 0, 0),
            ("g_ros", 0, n4, LS, 0, 0, 0),
            ("g_ign", 0, n3, OW, 0, 0, 0),  # IGNORE: recreated empty on the ideal nodes
            ("g_ign", 0, n4, OW, 0, 0, 0),
        ]
    )
    # lost.write_blocked_groups (the groups with a READ_ONLY_SAFE loss) has no kernel counterpart: the row above
    # with READ_ONLY_SAFE is what blocks g_ros's writes.
    # The lost partitions have no owner, hence no step; the recreated IGNORE p0 is complete.
    assert a.steps() == [
        copy(i + 1, g, 1, 1, n3, n4, FULL, 0, 7, 700) for i, g in enumerate(["g_ign", "g_ros", "g_rws"])
    ]

    # Exchange B: n1 returns with its p0 copies OWNING, and g_rws and g_ign are reset (RESET_LOST_PARTITIONS).
    # g_ros is not reset: LOST is sticky, n1's copy is marked LOST (counter kept for a later reset). In g_rws the
    # LOST copies become OWNING, n1's has the highest counter and keeps owning, the others reset to MOVING.
    returning = report_rows([(n1, "g_rws", 0, OW, 5, 50, 500, 0, 101), (n1, "g_ros", 0, OW, 5, 50, 500, 0, 102)])
    b = run(groups, [n1, n3, n4], a.committed(), returning, reset=("g_rws", "g_ign"))
    assert b.ideal() == ideal
    assert b.conflicts() == expected(
        [("g_rws", 0, n3, 0, 5, 30, "RESET_TO_MOVING"), ("g_rws", 0, n4, 0, 5, 0, "RESET_TO_MOVING")]
    )
    assert b.lost() == [("g_ros", 0, ROS, False, False)]
    assert b.map(groups=["g_rws", "g_ros"], partition=0) == expected(
        [
            ("g_rws", 0, n1, OW, 5, 50, 500),
            ("g_rws", 0, n3, MV, 0, 30, 300),
            ("g_rws", 0, n4, MV, 0, 0, 0),
            ("g_ros", 0, n1, LS, 5, 50, 500),
            ("g_ros", 0, n3, LS, 0, 0, 0),
            ("g_ros", 0, n4, LS, 0, 0, 0),
        ]
    )
    # Not pinned by the stage test: g_ign's recreated p0 stays as A made it.
    assert b.map(groups=["g_ign"], partition=0) == expected(owning("g_ign", 0, [n3, n4], 0, 0, 0))
    assert b.assignment("g_rws", 0) == assignment_of(
        {("g_rws", 0): ([n1, n4, n3], True)}  # no C node owns: oldest owner n1
    )
    # The stage test's five demands are the COPY rows below (ids 1, 2, 3, 4, 7 here).
    assert b.steps() == [
        copy(1, "g_ign", 1, 1, n3, n4, FULL, 0, 7, 700),
        copy(2, "g_ros", 1, 1, n3, n4, FULL, 0, 7, 700),
        copy(3, "g_rws", 0, 1, n1, n4, FULL, 0, 5, 500),
        copy(4, "g_rws", 0, 2, n1, n3, FULL, 0, 5, 500),
        promote(5, "g_rws", 0, 3, n1, n4),
        drop(6, "g_rws", 0, 4, n1),
        copy(7, "g_rws", 1, 1, n3, n4, FULL, 0, 7, 700),
    ]

    # Not in the stage test: the same exchange B with only g_rws reset. Clarification (1): g_ign's p0, lost with
    # IGNORE in A and owned again since, is not listed (the stages kept every loss sticky until a reset).
    b2 = run(groups, [n1, n3, n4], a.committed(), returning, reset=("g_rws",))
    assert b2.lost() == [("g_ros", 0, ROS, False, False)]
    assert b2.map(groups=["g_ign"], partition=0) == expected(owning("g_ign", 0, [n3, n4], 0, 0, 0))


def test_new_group_starts_empty_owning_and_reset_recreates_partition_without_copies() -> None:
    """gn is created in this exchange; gr is reset while its p0 has no copy left anywhere."""
    n1, n2 = "n1", "n2b"  # (a) rendezvous ids: p0 -> [n1, n2], p1 -> [n2, n1] (asserted below)
    groups = [GroupSettings("gn", 2, 1), GroupSettings("gr", 2, 1)]
    reports = report_rows(
        [
            (n2, "gn", 0, MV, 3, 3, 30, None, 1),  # nobody owns gn p0: recreated, this copy replaced
            (n1, "gn", 1, OW, 3, 3, 30, None, 2),  # gn p1 is owned: kept
        ]
    )
    prev = map_rows([("gr", 1, n1, LS, 4, 4, 40)]) + lost_rows([("gr", 0), ("gr", 1)])

    out = run(groups, [n1, n2], prev, reports, started=("gn",), reset=("gr",))

    assert out.ideal() == {(g, p): [n1, n2] if p == 0 else [n2, n1] for g in ("gn", "gr") for p in (0, 1)}
    assert out.lost() == []
    assert out.map() == expected(
        [
            ("gn", 0, n1, OW, 0, 0, 0),
            ("gn", 0, n2, OW, 0, 0, 0),
            ("gn", 1, n1, OW, 3, 3, 30),
            ("gn", 1, n2, MV, 0, 0, 0),
            ("gr", 0, n1, OW, 0, 0, 0),
            ("gr", 0, n2, OW, 0, 0, 0),
            ("gr", 1, n1, OW, 4, 4, 40),
            ("gr", 1, n2, MV, 0, 0, 0),
        ]
    )
    # First exchange (no previous assignment): n1 owns gn p1 but the ideal primary n2 does not.
    assert [r for r in out.assignment() if r[1] == 1] == assignment_of(
        {("gn", 1): ([n1, n2], True), ("gr", 1): ([n1, n2], True)}
    )


# ---------------------------------------------------------------- counters and rebalance mode


def test_size_mismatch_is_a_warning_and_lagging_owner_resets_to_moving() -> None:
    # (b) The stage test called the counter stage alone. Here the kernel decides the whole partition: with
    # 3 backups every one of the 4 nodes is ideal (no id choice needed), so no copy turns RENTING, and p1's ideal
    # nodes without a copy (n3, n4) get MOVING targets, which the stage test's map could not show.
    groups = [GroupSettings("g", 2, 3)]
    prev = map_rows(
        [
            ("g", 0, "n1", OW, 10, 100, 1000),
            ("g", 0, "n2", OW, 10, 101, 1010),
            ("g", 0, "n3", OW, 8, 90, 900),
            ("g", 0, "n4", MV, 2, 20, 200),
            ("g", 1, "n1", OW, 10, 100, 1000),
            ("g", 1, "n2", OW, 10, 100, 1000),
        ]
    )

    out = run(groups, ["n1", "n2", "n3", "n4"], prev)

    assert out.conflicts() == expected(
        [
            ("g", 0, "n3", 8, 10, 90, "RESET_TO_MOVING"),
            ("g", 0, "n1", 10, 10, 100, "SIZE_MISMATCH"),
            ("g", 0, "n2", 10, 10, 101, "SIZE_MISMATCH"),
        ]
    )
    assert [r for r in out.map() if r[3] != OW] == expected(
        [("g", 0, "n3", MV, 8, 90, 900), ("g", 0, "n4", MV, 2, 20, 200)]
        + [("g", 1, "n3", MV, 0, 0, 0), ("g", 1, "n4", MV, 0, 0, 0)]  # (b) p1's MOVING targets
    )


def test_lagging_replica_historical_when_history_covers_it_else_full() -> None:
    """n2 (n3 for p5) restarts behind; which owner can replay its WAL decides HISTORICAL or FULL (threshold 500)."""
    n1, n2, n3 = "n1cd", "n2uu", "n3"  # (a) rendezvous ids: p0..p4 -> [n1, n2], p5 -> [n3, n1] (asserted below)
    groups = [GroupSettings("g", 6, 1)]
    lagging = [(n2, "g", p, OW, 900, 1990, 19900, 0, 10 + p) for p in range(4)]
    reports = report_rows(
        lagging
        + [
            (n1, "g", 0, OW, 1000, 2000, 20000, 100, 1),  # history from 100 covers c = 900
            (n1, "g", 1, OW, 1000, 2000, 20000, 100, 1),
            (n1, "g", 1, OW, 1000, 2000, 20000, 950, 2),  # latest report: history starts after 900
            (n1, "g", 2, OW, 1000, 2000, 20000, None, 3),  # no history
            (n1, "g", 3, OW, 1000, 400, 4000, 0, 4),  # 400 entries <= threshold
            (n1, "g", 4, OW, 5000, 2000, 20000, 0, 5),  # 4900 updates behind >= 2000 entries
            (n2, "g", 4, OW, 100, 1990, 19900, 0, 14),
            (n1, "g", 5, OW, 1000, 2000, 20000, 100, 6),  # eligible
            (n2, "g", 5, OW, 1000, 2000, 20000, 950, 7),  # max counter, not eligible
            (n3, "g", 5, OW, 900, 1990, 19900, 0, 8),
        ]
    )

    out = run(groups, [n1, n2, n3], reports, history_threshold=500)

    assert out.ideal() == {**{("g", p): [n1, n2] for p in range(5)}, ("g", 5): [n3, n1]}
    assert out.conflicts() == expected(
        [("g", p, n2, 900, 1000, 1990, "RESET_TO_MOVING") for p in range(4)]
        + [("g", 4, n2, 100, 5000, 1990, "RESET_TO_MOVING"), ("g", 5, n3, 900, 1000, 1990, "RESET_TO_MOVING")]
    )
    assert out.steps() == [
        copy(1, "g", 0, 1, n1, n2, HIST, 900, 1000, 1000),  # 20000 bytes * 100 / 2000 entries
        copy(2, "g", 1, 1, n1, n2, FULL, 0, 1000, 20000),
        copy(3, "g", 2, 1, n1, n2, FULL, 0, 1000, 20000),
        copy(4, "g", 3, 1, n1, n2, FULL, 0, 1000, 4000),
        copy(5, "g", 4, 1, n1, n2, FULL, 0, 5000, 20000),
        copy(6, "g", 5, 1, n1, n3, HIST, 900, 1000, 1000),  # only n1 is eligible
        # p5's ideal primary n3 is behind: n1 (lowest node_order owner) serves until the switch; n2 is surplus.
        # (PROMOTE and DROP: the planner's steps, which the stage test's demands did not hold.)
        promote(7, "g", 5, 2, n1, n3),
        drop(8, "g", 5, 3, n2),
    ]


def test_suppliers_round_robin_over_candidates() -> None:
    """Six partitions owned by n1, n2, n3 at the same counter, all needed on n4: each owner supplies two."""
    n1, n2, n3, n4 = "n1", "n2r", "n3x", "n4"  # (a) rendezvous ids: every partition -> [n4] (asserted below)
    groups = [GroupSettings("g", 6, 0)]
    prev = map_rows([row for p in range(6) for row in owning("g", p, [n1, n2, n3], 10, 10, 100)])

    out = run(groups, [n1, n2, n3, n4], prev)

    assert out.ideal() == {("g", p): [n4] for p in range(6)}
    sources = [(r[2], r[5]) for r in out.steps() if r[4] == COPY]
    assert sources == [(0, n1), (1, n2), (2, n3), (3, n1), (4, n2), (5, n3)]


# ---------------------------------------------------------------- full map


def test_evicted_leaves_the_map_and_stale_reports_are_ignored() -> None:
    # (b) Rendezvous ids give g's p0 -> [n1] and p1 -> [n3] with no backup (asserted below); the stage test checked
    # the base map alone, the kernel's map is after every decision, so the expected rows are re-derived (marked).
    n1, n2, n3 = "n1", "n2b", "n3i"
    groups = [GroupSettings("g", 2, 0)]
    prev = map_rows(
        [
            ("g", 0, n1, OW, 10, 100, 1000),
            ("g", 0, n2, RT, 10, 100, 1000),
            ("g", 1, n3, OW, 20, 200, 2000),
            ("g", 1, "n9", OW, 20, 200, 2000),  # n9 is gone
        ]
    )
    # The stage test's previous map also held ("gx", 0, n1) of a stopped group and g's p5 beyond its partitions:
    # the kernel only gets the partitions it decides, and rejects such rows (test_rows_outside_the_batch_are_refused).
    reports = report_rows(
        [
            (n2, "g", 0, EV, 10, 0, 0, None, 11),  # eviction finished: leaves the map
            (n3, "g", 1, OW, 21, 210, 2100, None, 12),
            (n3, "g", 1, OW, 22, 220, 2200, None, 13),  # latest per copy wins
            ("c1", "g", 0, OW, 99, 1, 1, None, 14),  # clients hold no data
            ("n9", "g", 0, OW, 99, 1, 1, None, 15),  # dead node
            (n2, "g", 1, MV, 0, 0, 0, None, 16),  # a new copy
        ]
    )
    stale = report_rows([(n1, "g", 0, MV, 3, 3, 30, None, 5)])  # <= the previous version's max_report_seq 10
    alive = [n1, n2, n3]

    # Clarification (3): the stale report, consumed by the previous version, is not in the kernel's input.
    out = run(groups, alive, prev, reports, clients=["c1"])
    assert out.ideal() == {("g", 0): [n1], ("g", 1): [n3]}
    assert out.map() == expected(
        [
            ("g", 0, n1, OW, 10, 100, 1000),
            ("g", 1, n3, OW, 22, 220, 2200),
            ("g", 1, n2, RT, 0, 0, 0),  # (b) the new MOVING copy, outside the complete ideal list: surplus, RENTING
        ]
    )
    assert out.steps() == [drop(1, "g", 1, 1, n2)]  # (b)

    # Without a previous max every report counts: the seq-5 report is then n1's latest.
    out = run(groups, alive, prev, reports, stale, clients=["c1"])
    # (b) n1's p0 copy is then MOVING and p0 has no owner left: lost (READ_WRITE_SAFE), its MOVING copy LOST with
    # counter 0.
    assert out.map() == expected(
        [("g", 0, n1, LS, 0, 3, 30), ("g", 1, n3, OW, 22, 220, 2200), ("g", 1, n2, RT, 0, 0, 0)]
    )
    assert out.lost() == [("g", 0, RWS, False, False)]


def test_rows_outside_the_batch_are_refused() -> None:
    """The stage test's rows of a stopped group and of a partition beyond the group's count: input errors now."""
    groups = [GroupSettings("g", 2, 0)]
    ctx = context(groups, ["n1"])
    stopped = map_rows([("gx", 0, "n1", OW, 1, 1, 10)])
    beyond = [{"kind": PARTITION, "group_name": "g", "partition_id": 5}, *map_rows([("g", 5, "n1", OW, 1, 1, 10)])]
    unmarked = map_rows([("g", 1, "n1", OW, 1, 1, 10)])
    with pytest.raises(KernelInputError, match="'gx'"):
        decide(kernel_input(groups, stopped), ctx)
    with pytest.raises(KernelInputError, match="partition 5 of group 'g' is outside 0..1"):
        decide(kernel_input(groups, beyond), ctx)
    with pytest.raises(KernelInputError, match="partition 1 has no PARTITION marker"):
        decide(pa.Table.from_pylist([{"kind": PARTITION, "group_name": "g", "partition_id": 0}, *unmarked],
                                    schema=INPUT_SCHEMA), ctx)


@pytest.mark.parametrize("present", [["group_name"], ["kind", "group_name", "partition_id"]])
def test_missing_columns_are_named(present: list[str]) -> None:
    """The stage test's contract: input lacking columns is refused with a named error listing what is missing."""
    groups = [GroupSettings("g", 1, 0)]
    table = kernel_input(groups, []).select(present)
    missing = [c for c in INPUT_SCHEMA.names if c not in present]
    with pytest.raises(KernelInputError, match=".*".join(missing)):
        decide(table, context(groups, ["n1"]))


# ---------------------------------------------------------------- the invariant check


def test_invariant_check_refuses_a_drop_before_the_copy_it_needs() -> None:
    """p1 of the node-join scenario: COPY to n4 then DROP n3. Dropping first leaves one owner of a target of two."""
    n1, n2, n3, n4 = "n1", "n2l", "n3", "n4hy"
    prev = map_rows(owning("g", 0, [n1, n2], 10, 100, 1000) + owning("g", 1, [n2, n3], 10, 100, 1000)
                    + owning("g", 2, [n3, n1], 10, 100, 1000))
    d = run([GroupSettings("g", 3, 1)], [n1, n2, n3, n4], prev).decisions
    check_invariants(d)  # the kernel's own decisions pass
    steps = d.steps.to_pylist()
    p1 = [r for r in steps if r["partition_id"] == 1]
    assert [(r["step"], r["action"]) for r in p1] == [(1, COPY), (2, DROP)]
    # Insert the DROP before the COPY: step numbers and row order swapped.
    copy_row, drop_row = p1
    swapped = [r for r in steps if r["partition_id"] != 1] + [{**drop_row, "step": 1}, {**copy_row, "step": 2}]
    tampered = replace(d, steps=pa.Table.from_pylist(swapped, schema=d.steps.schema))

    with pytest.raises(KernelInvariantError) as raised:
        check_invariants(tampered)

    message = str(raised.value)
    assert "group 'g' partition 1" in message
    assert (f"before (decided map): node_id={n2} state=OWNING update_counter=10; "
            f"node_id={n3} state=OWNING update_counter=10; node_id={n4} state=MOVING update_counter=0") in message
    assert (f"plan: step=1 action=DROP source_node={n3} target_node=None; "
            f"step=2 action=COPY source_node=None target_node={n4}") in message
    assert f"after (ideal nodes, all OWNING): replica_index=0 node_id={n2}; replica_index=1 node_id={n4}" in message


def test_invariant_check_refuses_two_primaries_for_an_owned_partition() -> None:
    n1, n2, n3, n4 = "n1", "n2l", "n3", "n4hy"
    prev = map_rows(owning("g", 0, [n1, n2], 10, 100, 1000) + owning("g", 1, [n2, n3], 10, 100, 1000)
                    + owning("g", 2, [n3, n1], 10, 100, 1000))
    d = run([GroupSettings("g", 3, 1)], [n1, n2, n3, n4], prev).decisions
    extra = {"group_name": "g", "partition_id": 2, "replica_index": 0, "node_id": n1, "is_temporary": False}
    a = pa.concat_tables([d.affinity_assignment, pa.Table.from_pylist([extra], schema=d.affinity_assignment.schema)])
    tampered = replace(d, affinity_assignment=a)

    with pytest.raises(KernelInvariantError) as raised:
        check_invariants(tampered)

    message = str(raised.value)
    assert "group 'g' partition 2" in message
    assert (f"before (decided map): node_id={n1} state=OWNING update_counter=10; "
            f"node_id={n3} state=OWNING update_counter=10") in message
    assert "plan: none" in message
    assert f"after (ideal nodes, all OWNING): replica_index=0 node_id={n3}; replica_index=1 node_id={n1}" in message
    assert (f"serving: replica_index=0 node_id={n3} is_temporary=False; replica_index=1 node_id={n1} "
            f"is_temporary=False; replica_index=0 node_id={n1} is_temporary=False") in message


# ---------------------------------------------------------------- properties

NODE_IDS = ["n1", "n2", "n3", "n4", "n5"]
STATES = [None, OW, OW, MV, RT, LS]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Several small groups over up to 5 nodes: previous map, reports, previous assignment, alive set, losses.

    As in the stage test, except that the kernel computes the ideal lists (rendezvous over the alive nodes), so a
    group draws its backups instead of hand-made lists.
    """
    alive = draw(st.lists(st.sampled_from(NODE_IDS), min_size=1, max_size=5, unique=True))
    groups, prev_map, reports, prev_assign, prev_lost = [], [], [], [], []
    seq = 100
    for gi in range(draw(st.integers(2, 8))):
        g = f"g{gi}"
        partitions = draw(st.integers(1, 3))
        policy = draw(st.sampled_from([RWS, ROS, IGN]))
        groups.append(GroupSettings(g, partitions, draw(st.integers(0, 2)), loss_policy=policy))
        for p in range(partitions):
            for n in NODE_IDS:
                state = draw(st.sampled_from(STATES))
                if state:
                    prev_map.append((g, p, n, state, draw(st.integers(0, 3)), 5, 50))
                if draw(st.integers(0, 3)) == 0:
                    seq += 1
                    state = draw(st.sampled_from([OW, MV, RT, EV, LS]))
                    reports.append((n, g, p, state, draw(st.integers(0, 3)), 5, 50, None, seq))
            current = draw(st.lists(st.sampled_from(NODE_IDS), min_size=1, max_size=3, unique=True))
            prev_assign.append(((g, p), (current, False)))
            if draw(st.booleans()) and draw(st.booleans()):
                prev_lost.append((g, p))
    return {"alive": alive, "groups": groups, "prev_map": prev_map, "reports": reports,
            "prev_assign": dict(prev_assign), "prev_lost": prev_lost}


def _expected_owned(s: dict[str, Any]) -> set[Part]:
    """Partitions with an alive OWNING copy after the full map (the counter rule keeps the max-counter owners)."""
    copies = {(g, p, n): st_ for g, p, n, st_, *_ in s["prev_map"] if n in s["alive"]}
    for n, g, p, state, *_rest in sorted(s["reports"], key=lambda r: r[-1]):
        if n in s["alive"]:
            copies[(g, p, n)] = state
    return {(g, p) for (g, p, _n), state in copies.items() if state == OW}


@settings(max_examples=4 * settings().max_examples, deadline=None)  # the profile's x4: ci runs 100 (about 4 s)
@given(s=scenarios())
def test_property_owned_partitions_get_owning_primary_and_lost_iff_no_owner(s: dict[str, Any]) -> None:
    out = run(
        s["groups"], s["alive"], map_rows(s["prev_map"]), report_rows(s["reports"]),
        assignment_rows(s["prev_assign"]), lost_rows(s["prev_lost"]),
    )
    final_map = {(g, p, n): state for g, p, n, state, *_ in out.map()}
    assignment = out.assignment()
    lost = {(g, p): policy for g, p, policy, *_ in out.lost()}
    ideal = out.ideal()

    # Every partition with an OWNING copy is served by an OWNING primary; every partition is assigned.
    primaries = {(g, p): n for g, p, i, n, _t in assignment if i == 0}
    owned_final = {(g, p) for (g, p, _n), state in final_map.items() if state == OW}
    for part in owned_final:
        assert final_map.get((*part, primaries.get(part))) == OW, (part, primaries.get(part), final_map)
    existing = {(g.name, p) for g in s["groups"] for p in range(g.partitions)}
    assert set(primaries) == existing
    indices: dict[Part, list[int]] = {}
    for g, p, i, _n, _t in assignment:
        indices.setdefault((g, p), []).append(i)
    assert all(sorted(v) == list(range(len(v))) for v in indices.values()), indices

    # Lost iff owned before and no alive owner now, or lost before (no reset here) under a READ_*_SAFE policy:
    # clarification (1), an IGNORE partition lost before is not listed again.
    policies = {g.name: g.loss_policy for g in s["groups"]}
    prev_owned = {(g, p) for g, p, _n, state, *_ in s["prev_map"] if state == OW}
    sticky = {(g, p) for g, p in s["prev_lost"] if policies[g] != IGN}
    assert set(lost) == ((prev_owned - _expected_owned(s)) | sticky) & existing
    # Non-IGNORE lost partitions have no owner; IGNORE ones are owned on every ideal node.
    for (g, p), policy in lost.items():
        if policy == IGN:
            assert (g, p) not in _expected_owned(s) or (g, p) in owned_final
            if (g, p) not in _expected_owned(s):
                assert all(final_map[(g, p, n)] == OW for n in ideal[(g, p)])
        else:
            assert (g, p) not in owned_final
            assert all(final_map[(g, p, n)] == LS for n in ideal[(g, p)])



def test_a_placement_given_outside_the_kernel_replaces_the_affinity_function() -> None:
    """``KernelContext.placements``: the ideal lists are the given matrix (another system's layout), and the plan
    moves toward it like toward any ideal: p0 gains n3 as primary (copy, promote, drop n2); p1 already matches."""
    n1, n2, n3 = "n1", "n2", "n3"
    groups, nodes = [GroupSettings("g", 2, 1)], [n1, n2, n3]
    prev_map = owning("g", 0, [n1, n2], 10, 100, 1000) + owning("g", 1, [n2, n3], 10, 100, 1000)
    prev = (map_rows(prev_map) + assignment_rows({("g", 0): ([n1, n2], False), ("g", 1): ([n2, n3], False)})
            + version_rows({("g", 0): 1, ("g", 1): 1}))
    ctx = context(groups, nodes)
    index = {n: i for i, n in enumerate(ctx.nodes.node_ids)}
    target = np.array([[index[n3], index[n1]], [index[n2], index[n3]]], dtype=np.int32)
    table = kernel_input(groups, prev)
    d = decide(table, replace(ctx, placements={"g": target}))
    out = Exchange(table, d, finish_plan(d.steps, MigrationSettings()))

    assert out.ideal() == {("g", 0): [n3, n1], ("g", 1): [n2, n3]}
    assert out.assignment() == assignment_of({("g", 0): ([n1, n3], True), ("g", 1): ([n2, n3], False)})
    assert out.steps() == [
        copy(1, "g", 0, 1, n1, n3, FULL, 0, 10, 1000),
        promote(2, "g", 0, 2, n1, n3),
        drop(3, "g", 0, 3, n2),
    ]
    # without the placement the same input is placed by rendezvous, which differs here
    assert run(groups, nodes, prev).ideal() != out.ideal()
