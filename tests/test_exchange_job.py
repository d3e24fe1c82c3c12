"""Exchange job scenarios on real warehouses, with exact expected tables.

Placements below come from rendezvous-mmh3-v1 (pinned by the affinity golden tests):
3 partitions, 1 backup: {n1,n2,n3}: p0 [n2,n1], p1 [n2,n1], p2 [n3,n2];  {n1..n4}: p0 [n2,n4], p1 [n2,n4], p2 [n3,n2];
{n1,n3}: p0 [n1,n3], p1 [n1,n3], p2 [n3,n1];  {n1}: [n1] everywhere.
4 partitions: p3 is [n2,n1] on {n1,n2,n3} and [n4,n2] on {n1..n4}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rebalancer.config import StorageSettings
from rebalancer.pipeline import VERSIONED_TABLES
from rebalancer.storage import open_warehouse
from tests.conftest import TEST_API_MODE, TEST_ENGINE
from tests.exchange_scenarios import Cluster, assert_table, built_once, force_spark_paths, run_together

ASSIGNMENT = ["group_name", "partition_id", "replica_index", "node_id", "is_temporary"]
MAP = ["group_name", "partition_id", "node_id", "state", "update_counter", "size"]
IDEAL_3 = {0: ["n2", "n1"], 1: ["n2", "n1"], 2: ["n3", "n2"]}


@built_once
def steady_three_nodes(spark: Any, path: Path, partitions: int = 3, groups: dict[str, str | None] | None = None,
                       **overrides: Any) -> Cluster:
    """n1, n2, n3 joined, every group's ideal copies OWNING at counter 10, size 5; exchange 1 committed (3.0)."""
    c = Cluster.create(spark, path, **overrides)
    placement = {0: ["n2", "n1"], 1: ["n2", "n1"], 2: ["n3", "n2"], 3: ["n2", "n1"]}
    groups = groups or {"g": None}
    for name, policy in groups.items():
        c.group(name, partitions, 1, loss_policy=policy)
    c.join("n1", "n2", "n3")
    c.report([(n, g, p, "OWNING", 10, 5, None) for g in groups for p in range(partitions) for n in placement[p]])
    [first] = c.exchange()
    assert (first.topology_major, first.topology_minor, first.exchange_type) == (3, 0, "ALL")
    return c


@built_once
def lagging_replicas(spark: Any, path: Path) -> Cluster:
    """n1..n3 joined, not exchanged yet: n1 lags 50 updates behind n2 on g/0 (n2's WAL covers it) and on g/1 (it
    does not); g/2 is small, below the history threshold."""
    c = Cluster.create(spark, path)
    c.group("g", 3, 1)
    c.join("n1", "n2", "n3")
    c.report([
        ("n2", "g", 0, "OWNING", 1000, 1000, 900), ("n1", "g", 0, "OWNING", 950, 1000, None),  # history covers 950
        ("n2", "g", 1, "OWNING", 1000, 1000, 990), ("n1", "g", 1, "OWNING", 950, 1000, None),  # history from 990
        ("n3", "g", 2, "OWNING", 10, 5, 0), ("n2", "g", 2, "OWNING", 10, 5, 0),  # small: below the threshold
    ])
    return c


@built_once
def equal_counters_different_sizes(spark: Any, path: Path) -> Cluster:
    """n1..n3 joined, not exchanged yet: g/0's two copies are at counter 10 with sizes 5 and 6."""
    c = Cluster.create(spark, path)
    c.group("g", 3, 1)
    c.join("n1", "n2", "n3")
    c.report([("n2", "g", 0, "OWNING", 10, 5, None), ("n1", "g", 0, "OWNING", 10, 6, None),
              ("n2", "g", 1, "OWNING", 10, 5, None), ("n1", "g", 1, "OWNING", 10, 5, None),
              ("n3", "g", 2, "OWNING", 10, 5, None), ("n2", "g", 2, "OWNING", 10, 5, None)])
    return c


@pytest.fixture(params=["driver", "spark"])
def unsettled_finder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which partitions a join or a failure touches is found on the driver for small clusters and by a Spark job
    for large ones, they are selected by literals when few, by a broadcast join when many, and small exchanges are
    decided on the driver, large ones in Spark: run the scenario both ways (thresholds 0 force the Spark jobs and
    the join)."""
    if request.param == "spark":
        force_spark_paths(monkeypatch)
    return str(request.param)


def test_ignite_example_node_joins_moving_backup_then_switch(spark: Any, tmp_path: Path, unsettled_finder: str) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    assert_table(c, "affinity_assignment", (3, 0), ASSIGNMENT,
                 [("g", p, i, n, False) for p, nodes in IDEAL_3.items() for i, n in enumerate(nodes)])
    c.join("n4")
    [s] = c.exchange()
    assert (s.topology_major, s.topology_minor, s.exchange_type, s.merged_event_seqs) == (4, 0, "ALL", (4,))
    # n4 becomes a MOVING backup of p0 and p1; the old owners keep their copies and keep serving.
    assert_table(c, "partition_map", (4, 0), MAP, [
        ("g", 0, "n2", "OWNING", 10, 5), ("g", 0, "n1", "OWNING", 10, 5), ("g", 0, "n4", "MOVING", 0, 0),
        ("g", 1, "n2", "OWNING", 10, 5), ("g", 1, "n1", "OWNING", 10, 5), ("g", 1, "n4", "MOVING", 0, 0),
        ("g", 2, "n3", "OWNING", 10, 5), ("g", 2, "n2", "OWNING", 10, 5),
    ])
    plan = c.rows("migration_plan", (4, 0), "partition_id", "action", "target_node", "rebalance_mode",
                  "from_counter", "to_counter", "bytes")
    # copy to n4 first, then drop the old backup on n1 (the primary n2 stays: no PROMOTE)
    assert plan == {(0, "COPY", "n4", "FULL", 0, 10, 50), (1, "COPY", "n4", "FULL", 0, 10, 50),
                    (0, "DROP", None, None, None, None, 0), (1, "DROP", None, None, None, None, 0)}
    # both copies read from n2: n1 also has the two drops to do, and the scheduler balances each node's work
    assert c.rows("migration_plan", (4, 0), "action", "step", "source_node") == {
        ("COPY", 1, "n2"), ("DROP", 2, "n1")}
    assert s.moving_copies == 2 and s.migrations == 4 and s.bytes_to_move == 100
    # two copies in parallel (0.1 s overhead + 50 bytes each), then the drops: 0.2 s, the bound of each chain
    assert s.makespan_s == pytest.approx(0.2, abs=1e-6) and s.makespan_lower_bound_s == pytest.approx(0.2, abs=1e-6)

    assert c.exchange() == []  # nothing owned yet: no switch
    c.report([("n4", "g", 0, "OWNING", 10, 5, None), ("n4", "g", 1, "OWNING", 10, 5, None)])
    [switch] = c.exchange()
    assert (switch.topology_major, switch.topology_minor, switch.exchange_type) == (4, 1, "LATE_AFFINITY_SWITCH")
    assert_table(c, "affinity_assignment", (4, 1), ASSIGNMENT, [
        ("g", 0, 0, "n2", False), ("g", 0, 1, "n4", False), ("g", 1, 0, "n2", False), ("g", 1, 1, "n4", False),
        ("g", 2, 0, "n3", False), ("g", 2, 1, "n2", False),
    ])
    # the surplus copies on n1 are evicted after the switch
    assert c.rows("partition_map", (4, 1), "partition_id", "node_id", "state") >= {(0, "n1", "RENTING"),
                                                                                  (1, "n1", "RENTING")}
    assert c.rows("migration_plan", (4, 1), "partition_id", "step", "action", "source_node") == {
        (0, 1, "DROP", "n1"), (1, 1, "DROP", "n1")}
    assert c.exchange() == []


def test_new_ideal_primary_loads_while_the_old_primary_serves_temporarily(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    [s] = c.exchange()
    # p3: ideal [n4, n2], n4 owns nothing yet: n2 (the current primary) serves, is_temporary
    assert_table(c, "affinity_assignment", (4, 0), ASSIGNMENT, [
        ("g", 0, 0, "n2", False), ("g", 0, 1, "n4", False), ("g", 1, 0, "n2", False), ("g", 1, 1, "n4", False),
        ("g", 2, 0, "n3", False), ("g", 2, 1, "n2", False),
        ("g", 3, 0, "n2", True), ("g", 3, 1, "n4", True),
    ])
    assert s.temporary_primaries == 1
    client = c.rows("client_affinity", (4, 0), "partition_id", "primary_node")
    assert (3, "n2") in client
    c.report([("n4", "g", p, "OWNING", 10, 5, None) for p in (0, 1, 3)])
    [switch] = c.exchange()
    assert switch.exchange_type == "LATE_AFFINITY_SWITCH" and switch.temporary_primaries == 0
    assert ("g", 3, 0, "n4", False) in c.rows("affinity_assignment", (4, 1), *ASSIGNMENT)
    assert (3, "n4") in c.rows("client_affinity", (4, 1), "partition_id", "primary_node")


def test_primary_failure_promotes_the_backup(spark: Any, tmp_path: Path, unsettled_finder: str) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_FAILED", node="n2")
    [s] = c.exchange()
    assert (s.topology_major, s.exchange_type, s.coordinator, s.alive_servers) == (4, "ALL", "n1", 2)
    assert_table(c, "affinity_assignment", (4, 0), ASSIGNMENT, [
        ("g", 0, 0, "n1", False), ("g", 0, 1, "n3", False), ("g", 1, 0, "n1", False), ("g", 1, 1, "n3", False),
        ("g", 2, 0, "n3", False), ("g", 2, 1, "n1", False),
    ])
    assert c.rows("migration_plan", (4, 0), "partition_id", "source_node", "target_node", "rebalance_mode") == {
        (0, "n1", "n3", "FULL"), (1, "n1", "n3", "FULL"), (2, "n3", "n1", "FULL")
    }
    assert c.rows("lost_partitions", (4, 0)) == set()
    assert c.rows("topology", (4, 0), "node_id") == {("n1",), ("n3",)}


def test_two_failures_lose_a_partition_under_each_policy_then_reset(spark: Any, tmp_path: Path) -> None:
    groups = {"rw": "READ_WRITE_SAFE", "ro": "READ_ONLY_SAFE", "ig": "IGNORE"}
    c = steady_three_nodes(spark, tmp_path / "w", groups=groups)
    c.event("NODE_FAILED", node="n2")
    c.event("NODE_FAILED", node="n3")
    [s] = c.exchange()
    assert (s.topology_major, s.merged_event_seqs, s.lost_partitions) == (5, (4, 5), 3)
    assert_table(c, "lost_partitions", (5, 0), ["group_name", "partition_id", "loss_policy", "read_allowed",
                                                "write_allowed"], [
        ("rw", 2, "READ_WRITE_SAFE", False, False),
        ("ro", 2, "READ_ONLY_SAFE", False, False),
        ("ig", 2, "IGNORE", True, True),
    ])
    lost_copies = c.rows("partition_map", (5, 0), "group_name", "partition_id", "node_id", "state", "update_counter")
    assert ("rw", 2, "n1", "LOST", 0) in lost_copies and ("ro", 2, "n1", "LOST", 0) in lost_copies
    assert ("ig", 2, "n1", "OWNING", 0) in lost_copies  # IGNORE: recreated empty, serving
    assert c.rows("migration_plan", (5, 0), "partition_id") <= {(0,), (1,)}

    c.event("RESET_LOST_PARTITIONS", group="rw")
    [reset] = c.exchange()
    assert (reset.topology_major, reset.topology_minor, reset.exchange_type) == (5, 1, "RESET_LOST")
    # rw is recreated empty and OWNING; ro stays lost until its own reset (sticky); an IGNORE loss is listed only
    # in the version of the loss (a real Ignite node keeps no lost state under IGNORE)
    assert c.rows("lost_partitions", (5, 1), "group_name", "partition_id") == {("ro", 2)}
    assert ("rw", 2, "n1", "OWNING", 0) in c.rows(
        "partition_map", (5, 1), "group_name", "partition_id", "node_id", "state", "update_counter")


def test_lagging_replica_is_rebalanced_historical_when_history_covers_it_else_full(
    spark: Any, tmp_path: Path
) -> None:
    c = lagging_replicas(spark, tmp_path / "w")
    c.exchange()
    assert_table(c, "counter_conflicts", (3, 0), ["partition_id", "node_id", "update_counter",
                                                  "max_update_counter", "size", "action"], [
        (0, "n1", 950, 1000, 1000, "RESET_TO_MOVING"), (1, "n1", 950, 1000, 1000, "RESET_TO_MOVING"),
    ])
    assert c.rows("migration_plan", (3, 0), "partition_id", "source_node", "target_node", "rebalance_mode",
                  "from_counter", "to_counter", "bytes") == {
        (0, "n2", "n1", "HISTORICAL", 950, 1000, 500),
        (1, "n2", "n1", "FULL", 0, 1000, 10000),
    }
    # the demoted copies keep serving nothing: n2 stays primary, n1 is MOVING
    assert (0, "n1", "MOVING") in c.rows("partition_map", (3, 0), "partition_id", "node_id", "state")


def test_equal_counters_with_different_sizes_are_a_warning_only(spark: Any, tmp_path: Path) -> None:
    c = equal_counters_different_sizes(spark, tmp_path / "w")
    [s] = c.exchange()
    assert c.rows("counter_conflicts", (3, 0), "partition_id", "node_id", "action") == {
        (0, "n2", "SIZE_MISMATCH"), (0, "n1", "SIZE_MISMATCH")
    }
    assert s.counter_conflicts == 2 and s.moving_copies == 0
    assert c.rows("partition_map", (3, 0), "state") == {("OWNING",)}


def test_three_joins_merge_into_one_exchange(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.join("n4", "n5", "n6")
    [s] = c.exchange()
    assert (s.topology_major, s.topology_minor, s.merged_event_seqs) == (6, 0, (4, 5, 6))
    assert len(c.rows("topology", (6, 0))) == 6


def test_client_join_gives_a_none_exchange_with_the_same_placement(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.join("c1", client=True)
    [s] = c.exchange()
    assert (s.topology_major, s.exchange_type, s.alive_clients) == (4, "NONE", 1)
    assert c.rows("affinity_assignment", (4, 0)) == c.rows("affinity_assignment", (3, 0))
    assert c.rows("partition_map", (4, 0)) == c.rows("partition_map", (3, 0))
    assert ("c1", 4, True) in c.rows("topology", (4, 0), "node_id", "node_order", "is_client")


class Crash(RuntimeError):
    pass


_DEFAULT_CRASH_POINTS = ("after:topology", "after:partition_map", "after:client_affinity")
# Every write of an exchange; the default run covers the first, a middle and the last output, `make test-all` all.
CRASH_POINTS = [
    pytest.param(f"after:{name}", marks=() if f"after:{name}" in _DEFAULT_CRASH_POINTS else pytest.mark.slow)
    for name in VERSIONED_TABLES
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_rerun_after_a_crash_between_writes_commits_the_version_once(
    spark: Any, tmp_path: Path, point: str
) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_FAILED", node="n2")

    def crash_at(reached: str) -> None:
        if reached == point:
            raise Crash(point)

    with pytest.raises(Crash):
        c.exchange(fault_hook=crash_at)
    # readers see no version 4 yet: the exchanges row is written last
    assert c.rows("exchanges", (4, 0)) == set()
    [s] = c.exchange()
    assert (s.exchange_id, s.topology_major) == (2, 4)
    assert len(c.rows("exchanges", (4, 0), "exchange_id")) == 1
    assert len(c.table("affinity_assignment", (4, 0)).collect()) == 6  # no duplicated rows
    assert len(c.table("topology", (4, 0)).collect()) == 2
    assert c.exchange() == []


@pytest.mark.slow
def test_a_crash_after_the_exchanges_row_leaves_the_version_committed_once(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_FAILED", node="n2")

    def crash_at(reached: str) -> None:
        if reached == "after:exchanges":
            raise Crash(reached)

    with pytest.raises(Crash):
        c.exchange(fault_hook=crash_at)
    assert len(c.rows("exchanges", (4, 0), "exchange_id")) == 1  # committed before the crash: readers see it
    assert c.exchange() == []  # the re-run finds nothing pending: the version is not repeated
    assert len(c.table("affinity_assignment", (4, 0)).collect()) == 6


def test_two_concurrent_runs_commit_one_version_and_one_clear_error(spark: Any, tmp_path: Path) -> None:
    import threading

    from rebalancer.pipeline import ExchangeConflictError

    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_FAILED", node="n2")
    both_computed = threading.Barrier(2, timeout=300)

    def hold_before_commit(point: str) -> None:
        if point == "after:client_affinity":  # the last output: both runs now hold version 4.0, uncommitted
            both_computed.wait()

    results = run_together({name: lambda: c.exchange(fault_hook=hold_before_commit) for name in ("a", "b")})
    outcomes = sorted(results.values(), key=lambda r: isinstance(r, Exception))
    assert isinstance(outcomes[0], list) and [s.topology_major for s in outcomes[0]] == [4], results
    assert isinstance(outcomes[1], ExchangeConflictError), results
    assert "committed by another run" in str(outcomes[1])
    assert len(c.rows("exchanges", (4, 0), "exchange_id")) == 1
    assert len(c.table("affinity_assignment", (4, 0)).collect()) == 6


def test_stopping_the_only_group_commits_a_version_with_no_partition(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("CACHE_STOPPED", group="g")
    [stopped] = c.exchange()
    version = (stopped.topology_major, stopped.topology_minor)
    assert (stopped.exchange_type, stopped.partitions) == ("CACHE_CHANGE", 0)
    for name in ("ideal_assignment", "affinity_assignment", "partition_map", "client_affinity", "partition_stamps"):
        assert c.rows(name, version) == set(), name
    assert c.rows("topology", version, "node_id") == {("n1",), ("n2",), ("n3",)}


def test_the_scenarios_run_on_the_engine_and_spark_api_this_run_asked_for(spark: Any, tmp_path: Path) -> None:
    """`make test` runs these scenarios on delta-rs and classic Spark, `make storage-slow` on delta-spark,
    `make connect-slow` under Spark Connect: each run really is on what it says."""
    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    assert connect == (TEST_API_MODE == "connect")
    assert open_warehouse(spark, StorageSettings(), tmp_path / "w").engine == TEST_ENGINE


def test_every_exchange_prepares_the_commits_it_makes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each exchange names the tables it will commit to before computing its rows (an engine prepares those commits
    meanwhile: delta-spark computes Delta's state of each table ahead, docs/STORAGE.md); each named table gets its
    new version, so none is prepared for nothing in a plain exchange."""
    from contextlib import AbstractContextManager

    from rebalancer.pipeline import PREPARED_TABLES

    c = steady_three_nodes(spark, tmp_path / "w")
    real = c.warehouse.commits_ahead
    named: list[tuple[str, ...]] = []

    def spy(names: Any) -> AbstractContextManager[None]:
        named.append(tuple(names))
        return real(names)

    monkeypatch.setattr(c.warehouse, "commits_ahead", spy)
    before = {name: c.warehouse.table_version(name) for name in PREPARED_TABLES}
    c.event("NODE_FAILED", node="n2")
    [_] = c.exchange()
    c.join("n4")
    [_] = c.exchange()
    assert named == [PREPARED_TABLES] * 2
    after = {name: c.warehouse.table_version(name) for name in PREPARED_TABLES}
    assert all(after[name] >= before[name] + 2 for name in PREPARED_TABLES), (before, after)
