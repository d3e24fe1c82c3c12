"""Inputs read incrementally (SPEC 4 "Full map", SPEC 2 unique keys): what each exchange consumes and applies.

- Reports apply per copy, by ``report_seq``, with no global watermark: a collector that writes late, with seqs
  below what another collector already had consumed, still updates its copies; a report not newer than one
  already consumed for the same copy can never apply and is rejected with a reason.
- A key that must be unique (``event_seq``; ``report_seq`` per copy): the row committed first stands; a later
  row with the same key is rejected (a conflict, or an exact duplicate); rows of one commit that collide are all
  rejected.
- Each version records the Delta version of every input table it consumed; the next one reads what came after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rebalancer.pipeline import run_exchange
from tests.conftest import TEST_ENGINE
from tests.exchange_scenarios import Cluster, built_once


@built_once
def steady(spark: Any, path: Path) -> Cluster:
    """Three nodes, one group of 3 partitions with 1 backup, every ideal copy OWNING at counter 10."""
    from rebalancer.affinity.assign import assign

    c = Cluster.create(spark, path)
    c.group("g", 3, 1)
    c.join("n1", "n2", "n3")
    c.report([(n, "g", p, "OWNING", 10, 5, None) for p, nodes in enumerate(assign(["n1", "n2", "n3"], 3, 1))
              for n in nodes])
    [first] = c.exchange()
    assert first.topology_major == 3
    return c


def rejected(c: Cluster, table: str) -> list[dict[str, Any]]:
    rows = c.warehouse.read("rejected_rows").where(f"table_name = '{table}'").collect()
    return [{**json.loads(r.row_json), "reason": r.reason} for r in rows]


def test_a_collector_writing_late_below_the_consumed_seqs_still_updates_its_copies(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w")
    copies = sorted((r.node_id, r.partition_id) for r in c.table("partition_map", (3, 0)).collect())
    (a_node, a_part), (b_node, b_part) = copies[0], copies[-1]
    # Collector A is fast: seq 100 for one copy. Collector B is slow: seq 50 for another copy, written after the
    # exchange that consumed A's report (so below its max_report_seq, the old global watermark).
    c.report_at([(a_node, "g", a_part, "OWNING", 11, 5, None)], seq=100)
    c.node("n4")
    c.event("NODE_JOINED", node="n4")
    [joined] = c.exchange()
    assert joined.topology_major == 4
    row = c.warehouse.read("exchanges").where(f"exchange_id = {joined.exchange_id}").first()
    assert row.max_report_seq == 100
    c.report_at([(b_node, "g", b_part, "OWNING", 12, 7, None)], seq=50)
    c.node("n5")
    c.event("NODE_JOINED", node="n5")
    [late] = c.exchange()
    counters = {(r.node_id, r.partition_id): r.update_counter for r in c.table("partition_map",
                                                                                (late.topology_major, 0)).collect()}
    assert counters[(b_node, b_part)] == 12, "the late collector's report was not applied"
    assert counters[(a_node, a_part)] == 11
    assert not rejected(c, "partition_reports")


def test_a_report_not_newer_than_one_consumed_for_its_copy_is_rejected_with_a_reason(
    spark: Any, tmp_path: Path
) -> None:
    c = steady(spark, tmp_path / "w")
    node, part = sorted((r.node_id, r.partition_id) for r in c.table("partition_map", (3, 0)).collect())[0]
    newest = max(r.report_seq for r in c.warehouse.read("partition_reports").collect()
                 if (r.node_id, r.partition_id) == (node, part))
    c.report_at([(node, "g", part, "OWNING", 30, 5, None)], seq=newest - 0)
    c.node("n4")
    c.event("NODE_JOINED", node="n4")
    [joined] = c.exchange()
    counters = {(r.node_id, r.partition_id): r.update_counter for r in c.table("partition_map", (4, 0)).collect()}
    assert counters[(node, part)] == 10
    [bad] = rejected(c, "partition_reports")
    assert bad["report_seq"] == newest
    assert f"is not newer than report_seq {newest} of this copy, which an earlier exchange consumed" in bad["reason"]


def test_the_event_committed_first_stands_and_a_later_one_with_its_seq_is_rejected(
    spark: Any, tmp_path: Path
) -> None:
    c = steady(spark, tmp_path / "w")
    c.node("n4")
    seq = c.event("NODE_JOINED", node="n4")
    c.event_at(seq, "NODE_FAILED", node="n2")  # a retried append with other content, in a later commit
    c.event_at(seq, "NODE_JOINED", node="n4")  # an exact copy of the first, in a later commit
    [s] = c.exchange()
    assert s.merged_event_seqs == (seq,)
    assert {r.node_id for r in c.table("topology", (s.topology_major, s.topology_minor)).collect()} == {
        "n1", "n2", "n3", "n4"}
    reasons = sorted(r["reason"] for r in rejected(c, "topology_events"))
    assert reasons == [
        f"event_seq {seq} is already held by a topology_events row committed earlier, which stands (it must be "
        "unique)",
        "exact duplicate of another topology_events row (one copy is used, the others are rejected)",
    ]


def test_events_of_one_commit_sharing_a_seq_are_all_rejected(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w")
    c.node("n4")
    c.events_at([(10, "NODE_JOINED", "n4"), (10, "NODE_FAILED", "n1")])
    assert c.exchange() == []
    reasons = {r["reason"] for r in rejected(c, "topology_events")}
    assert reasons == {"event_seq 10 appears in 2 different topology_events rows committed together; it must be "
                       "unique, so all of them are rejected"}


def test_each_version_records_what_it_consumed_and_the_next_reads_only_what_came_after(
    spark: Any, tmp_path: Path
) -> None:
    c = steady(spark, tmp_path / "w")
    first = c.warehouse.read("exchanges").first().input_versions
    assert first == {name: c.warehouse.table_version(name) for name in first}
    changes = c.warehouse.changes("partition_reports", first["partition_reports"])
    assert changes.known_empty or changes.rows.count() == 0
    c.node("n4")
    c.event("NODE_JOINED", node="n4")
    [s] = run_exchange(c.spark, c.warehouse, c.settings, clock=c.clock)
    second = c.warehouse.read("exchanges").where(f"exchange_id = {s.exchange_id}").first().input_versions
    assert second["topology_events"] > first["topology_events"]
    assert second["partition_reports"] == first["partition_reports"]
    # A cluster this small is decided on the driver (storage.driver_replicas): on delta-rs, which reads and
    # writes there too, not one Spark job; delta-spark runs two of Delta's jobs per table it commits (its state, the
    # write: 11 tables; docs/STORAGE.md)
    if TEST_ENGINE == "delta-rs":
        assert s.spark_jobs == 0
    else:
        assert s.spark_jobs is not None and s.spark_jobs <= 24
