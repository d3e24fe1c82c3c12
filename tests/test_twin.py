"""The twin executes plans by writing reports, runs the exchanges they make due, and converges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from rebalancer.twin.simulate import TwinError, simulate, stability
from tests.exchange_scenarios import Cluster, run_together
from tests.test_exchange_job import steady_three_nodes


def lost_anywhere(c: Cluster) -> int:
    return c.warehouse.read("lost_partitions").count()


def test_join_converges_copy_switch_then_drop(spark: Any, tmp_path: Path) -> None:
    """The Ignite example: n4 joins; the twin copies, the switch installs the ideal, the old copies go."""
    c = steady_three_nodes(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    result = simulate(spark, c.warehouse, c.settings, until_stable=True, clock=c.clock)
    first, second = result.rounds[:2]
    # round 1: the join's exchange (4.0), then p0, p1, p3 copied to n4 and the old backups of p0 and p1 on n1
    # dropped; p3's PROMOTE (n2 -> n4) and the drop after it wait for the switch (4.1)
    assert (first.version, first.copies, first.drops, first.waiting_promotions) == ((4, 0), 3, 2, 1)
    assert [(s.topology_major, s.topology_minor, s.exchange_type) for s in first.exchanges] == [
        (4, 0, "ALL"), (4, 1, "LATE_AFFINITY_SWITCH")]
    # round 2 executes the switch version's plan: the drop of p3's RENTING copy on n1
    assert (second.version, second.copies, second.drops, second.waiting_promotions) == ((4, 1), 0, 1, 0)
    assert result.stability is not None and result.stability.stable, result.stability
    assert c.rows("affinity_assignment", (4, 1), "partition_id", "replica_index", "node_id") == {
        (0, 0, "n2"), (0, 1, "n4"), (1, 0, "n2"), (1, 1, "n4"), (2, 0, "n3"), (2, 1, "n2"), (3, 0, "n4"),
        (3, 1, "n2")}
    # the copies reported by the twin carry the supplier's counter and size
    reports = c.warehouse.read("partition_reports").where(F.col("node_id") == "n4").collect()
    assert {(r.partition_id, r.state, r.update_counter, r.size) for r in reports} == {
        (0, "OWNING", 10, 5), (1, "OWNING", 10, 5), (3, "OWNING", 10, 5)}
    evicted = c.warehouse.read("partition_reports").where(F.col("state") == "EVICTED").collect()
    assert {(r.node_id, r.partition_id) for r in evicted} == {("n1", 0), ("n1", 1), ("n1", 3)}
    assert lost_anywhere(c) == 0


@pytest.mark.slow  # the join test above checks the same rounds with --until-stable
def test_one_round_stops_before_the_drops_that_wait_for_the_switch(spark: Any, tmp_path: Path) -> None:
    c = steady_three_nodes(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    result = simulate(spark, c.warehouse, c.settings, clock=c.clock)
    assert len(result.rounds) == 1
    assert result.stability is not None and not result.stability.stable
    # the switch is committed; only p3's old copy on n1 (now RENTING) is left to drop
    assert result.stability.version == (4, 1)
    assert (result.stability.surplus_copies, result.stability.ideal_not_owning,
            result.stability.assignment_differences) == (1, 0, 0)


def test_failure_mid_plan_replans_and_converges_without_losing_data(spark: Any, tmp_path: Path) -> None:
    """Two nodes join a 3-node cluster of 16 partitions; n1 fails after the first wave of copies."""
    c = steady_three_nodes(spark, tmp_path / "w", partitions=4)
    c.join("n4", "n5")
    result = simulate(spark, c.warehouse, c.settings, until_stable=True, fail_node="n1", at_wave=2, clock=c.clock)
    first = result.rounds[0]
    assert first.failed_node == "n1"
    assert any(s.merged_event_seqs and s.alive_servers == 4 for s in first.exchanges)
    assert result.stability is not None and result.stability.stable, result.stability
    assert lost_anywhere(c) == 0  # every partition kept an owner: one failure, one backup, copies kept
    final = result.stability.version
    assert {r.node_id for r in c.table("topology", final).collect()} == {"n2", "n3", "n4", "n5"}


def test_twin_errors_are_one_clear_sentence(spark: Any, tmp_path: Path) -> None:
    c = Cluster.create(spark, tmp_path / "empty")
    with pytest.raises(TwinError, match="run `rebalancer exchange` first"):
        simulate(spark, c.warehouse, c.settings)
    assert stability(c.warehouse) is None
    c = steady_three_nodes(spark, tmp_path / "w")
    with pytest.raises(TwinError, match="go together"):
        simulate(spark, c.warehouse, c.settings, fail_node="n1")
    with pytest.raises(TwinError, match="no alive server node 'n9'"):
        simulate(spark, c.warehouse, c.settings, fail_node="n9", at_wave=1)


class Crash(RuntimeError):
    pass


# after:event also crashes after the reports were written; after:reports alone runs with `make test-all`
@pytest.mark.parametrize("point", [pytest.param("after:reports", marks=pytest.mark.slow), "after:event"])
def test_rerun_after_a_twin_crash_reports_nothing_twice_and_converges(
    spark: Any, tmp_path: Path, point: str
) -> None:
    c = steady_three_nodes(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    c.exchange()
    seq_before = c.warehouse.read("partition_reports").agg(F.max("report_seq")).first()[0]

    def crash_at(reached: str) -> None:
        if reached == point:
            raise Crash(point)

    with pytest.raises(Crash):
        simulate(spark, c.warehouse, c.settings, fail_node="n1", at_wave=2, clock=c.clock, fault_hook=crash_at)
    result = simulate(spark, c.warehouse, c.settings, until_stable=True, clock=c.clock)
    assert result.stability is not None and result.stability.stable, result.stability
    twin_reports = [(r.node_id, r.group_name, r.partition_id, r.state, r.update_counter)
                    for r in c.warehouse.read("partition_reports").where(F.col("report_seq") > seq_before).collect()]
    assert len(twin_reports) == len(set(twin_reports)), f"a step was reported twice: {sorted(twin_reports)}"
    exchanges = [(r.topology_major, r.topology_minor) for r in c.warehouse.read("exchanges").collect()]
    assert len(exchanges) == len(set(exchanges))
    if point == "after:event":  # the failure was written before the crash: the re-run processed it
        assert "n1" not in {r.node_id for r in c.table("topology", result.stability.version).collect()}


def test_exchange_and_simulate_started_together_commit_one_version_and_one_clear_error(
    spark: Any, tmp_path: Path
) -> None:
    import threading

    from rebalancer.pipeline import ExchangeConflictError

    c = steady_three_nodes(spark, tmp_path / "w")
    c.event("NODE_FAILED", node="n2")
    both_computed = threading.Barrier(2, timeout=300)
    held: set[int] = set()

    def hold_once_before_commit(point: str) -> None:
        # each run's first exchange waits for the other: both hold version 4.0 computed, uncommitted
        if point == "after:client_affinity" and threading.get_ident() not in held:
            held.add(threading.get_ident())
            both_computed.wait()

    results = run_together({
        "exchange": lambda: c.exchange(fault_hook=hold_once_before_commit),
        "simulate": lambda: simulate(spark, c.warehouse, c.settings, clock=c.clock, fault_hook=hold_once_before_commit),
    })
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], ExchangeConflictError), results
    assert "committed by another run" in str(errors[0])
    assert len(c.rows("exchanges", (4, 0), "exchange_id")) == 1
    assert len(c.table("affinity_assignment", (4, 0)).collect()) == 6
    versions = [(r.topology_major, r.topology_minor) for r in c.warehouse.read("exchanges").collect()]
    assert len(versions) == len(set(versions)), versions
