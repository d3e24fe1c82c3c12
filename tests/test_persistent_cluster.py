"""Persistent clusters as Ignite runs them (docs/EXCHANGE.md "Baseline, activation, drain"), on real warehouses:
a baseline node's restart moves no data, BASELINE_CHANGED plans exactly what the new placement lacks, a draining
node's data moves while it serves and its NODE_LEFT plans nothing, a deactivated cluster plans no movement.

Placements (rendezvous-mmh3-v1, 3 partitions, 1 backup): {n1,n2,n3}: p0 [n2,n1], p1 [n2,n1], p2 [n3,n2];
{n1,n3}: p0 [n1,n3], p1 [n1,n3], p2 [n3,n1].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.test_exchange_job import ASSIGNMENT, IDEAL_3, MAP, steady_three_nodes

PERSISTENT = {"auto_adjust": False}


def test_a_baseline_node_that_restarts_moves_no_data(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w", baseline=PERSISTENT)
    # an in-memory group beside it is placed over the alive servers, as before
    c.group("mem", 3, 1, persistent=False)
    c.event("CACHE_STARTED", group="mem")
    c.exchange()
    c.report([(n, "mem", p, "OWNING", 10, 5, None) for p, nodes in IDEAL_3.items() for n in nodes])
    c.event("NODE_FAILED", node="n2")
    [s] = c.exchange()
    assert (s.topology_major, s.exchange_type, s.lost_partitions) == (4, "ALL", 0)
    # n2 keeps its place in the baseline placement of g: nothing is copied to replace it, the survivors serve;
    # mem re-places over n1 and n3 and copies what it lacks
    assert c.rows("migration_plan", (4, 0), "group_name", "partition_id", "action", "target_node") == {
        ("mem", 0, "COPY", "n3"), ("mem", 1, "COPY", "n3"), ("mem", 2, "COPY", "n1")}
    assert {r for r in c.rows("affinity_assignment", (4, 0), *ASSIGNMENT) if r[0] == "g"} == {
        ("g", 0, 0, "n1", False), ("g", 1, 0, "n1", False), ("g", 2, 0, "n3", False)}
    assert c.rows("topology", (4, 0), "node_id") == {("n1",), ("n3",)}
    # the ideal lists still name n2 (offline, in the baseline); the serving lists are their alive part
    assert {r[1:] for r in c.rows("ideal_assignment", (4, 0), "group_name", "partition_id", "replica_index",
                                  "node_id") if r[0] == "g"} == {
        (0, 0, "n2"), (0, 1, "n1"), (1, 0, "n2"), (1, 1, "n1"), (2, 0, "n3"), (2, 1, "n2")}
    # n1 took 2 writes for p0 while n2 was away (its WAL goes back to counter 5); n2 comes back at counter 10
    c.report([("n1", "g", 0, "OWNING", 12, 1000, 5)])
    c.event("NODE_JOINED", node="n2")
    c.report([("n2", "g", p, "OWNING", 10, 1000 if p == 0 else 5, None) for p in range(3)])
    [back] = c.exchange()
    assert back.topology_major == 5
    # only the copy that is behind is rebalanced, HISTORICAL from n1's WAL (counters 10 to 12), then n2 takes its
    # primary back; the others are current
    assert {r[1:] for r in c.rows("migration_plan", (5, 0), "group_name", "partition_id", "action", "source_node",
                                  "target_node", "rebalance_mode", "from_counter", "to_counter") if r[0] == "g"} == {
        (0, "COPY", "n1", "n2", "HISTORICAL", 10, 12), (0, "PROMOTE", "n1", "n2", None, None, None)}
    assert ("g", 0, "n2", "MOVING", 10, 1000) in c.rows("partition_map", (5, 0), *MAP)
    assert {r for r in c.rows("affinity_assignment", (5, 0), *ASSIGNMENT) if r[0] == "g"} == {
        ("g", 0, 0, "n1", True), ("g", 0, 1, "n2", True), ("g", 1, 0, "n2", False), ("g", 1, 1, "n1", False),
        ("g", 2, 0, "n3", False), ("g", 2, 1, "n2", False)}


def test_baseline_changed_plans_exactly_the_copies_the_new_placement_lacks(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w", baseline=PERSISTENT)
    c.event("NODE_FAILED", node="n2")
    c.exchange()
    c.event("BASELINE_CHANGED")
    [s] = c.exchange()
    assert (s.topology_major, s.topology_minor, s.exchange_type) == (4, 1, "ALL")
    assert c.rows("migration_plan", (4, 1), "partition_id", "action", "source_node", "target_node") == {
        (0, "COPY", "n1", "n3"), (1, "COPY", "n1", "n3"), (2, "COPY", "n3", "n1")}
    assert c.rows("ideal_assignment", (4, 1), "partition_id", "replica_index", "node_id") == {
        (0, 0, "n1"), (0, 1, "n3"), (1, 0, "n1"), (1, 1, "n3"), (2, 0, "n3"), (2, 1, "n1")}


def test_a_draining_node_serves_until_its_data_moved_and_its_leave_plans_nothing(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_DRAINING", node="n2")
    [s] = c.exchange()
    assert (s.topology_major, s.exchange_type, s.alive_servers) == (4, "ALL", 3)
    assert c.rows("topology", (4, 0), "node_id") == {("n1",), ("n2",), ("n3",)}  # still alive
    assert c.rows("ideal_assignment", (4, 0), "partition_id", "replica_index", "node_id") == {
        (0, 0, "n1"), (0, 1, "n3"), (1, 0, "n1"), (1, 1, "n3"), (2, 0, "n3"), (2, 1, "n1")}
    plan = c.rows("migration_plan", (4, 0), "partition_id", "action", "source_node", "target_node")
    assert {(p, t) for p, a, _, t in plan if a == "COPY"} == {(0, "n3"), (1, "n3"), (2, "n1")}
    assert {(p, src) for p, a, src, _ in plan if a == "DROP"} == {(0, "n2"), (1, "n2"), (2, "n2")}
    # n2's copies stay OWNING (it serves and supplies) until the plan drops them
    assert {(p, st) for _, p, n, st, _, _ in c.rows("partition_map", (4, 0), *MAP) if n == "n2"} == {
        (0, "OWNING"), (1, "OWNING"), (2, "OWNING")}
    # the plan runs: the new copies own, n2 evicts its own
    c.report([("n3", "g", 0, "OWNING", 10, 5, None), ("n3", "g", 1, "OWNING", 10, 5, None),
              ("n1", "g", 2, "OWNING", 10, 5, None)] + [("n2", "g", p, "EVICTED", 10, 5, None) for p in range(3)])
    c.exchange()
    c.event("NODE_LEFT", node="n2")
    [left] = c.exchange()
    assert (left.topology_major, left.migrations, left.lost_partitions, left.moving_copies) == (5, 0, 0, 0)


def test_a_deactivated_cluster_plans_no_data_movement_until_activated(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("CLUSTER_DEACTIVATED")
    [off] = c.exchange()
    assert (off.topology_major, off.topology_minor, off.exchange_type, off.migrations) == (3, 1, "ALL", 0)
    c.event("NODE_FAILED", node="n2")
    [failed] = c.exchange()
    assert (failed.topology_major, failed.migrations) == (4, 0)
    assert c.rows("migration_plan", (4, 0)) == set()
    assert c.exchange() == []  # no late affinity switch while inactive
    c.event("CLUSTER_ACTIVATED")
    [on] = c.exchange()
    assert (on.topology_major, on.topology_minor) == (4, 1)
    assert c.rows("migration_plan", (4, 1), "partition_id", "source_node", "target_node") == {
        (0, "n1", "n3"), (1, "n1", "n3"), (2, "n3", "n1")}


def test_the_twin_converges_after_a_drain_and_after_a_baseline_node_failure(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "drain")
    c.event("NODE_DRAINING", node="n2")
    c.exchange()
    result = c.twin(until_stable=True)
    assert result.stability is not None and result.stability.stable, result.stability
    # n2 holds nothing any more: its leave plans nothing and loses nothing
    latest = result.stability.version
    assert {n for _, _, n, _, _, _ in c.rows("partition_map", latest, *MAP)} == {"n1", "n3"}
    c.event("NODE_LEFT", node="n2")
    [left] = c.exchange()
    assert (left.migrations, left.lost_partitions) == (0, 0)

    p = steady_three_nodes(spark, tmp_path / "persistent", baseline=PERSISTENT)
    p.event("NODE_FAILED", node="n2")
    p.exchange()
    result = p.twin(until_stable=True)
    assert result.stability is not None and result.stability.stable, result.stability
    assert [r.copies for r in result.rounds] in ([], [0])  # stable at once: nothing to copy
