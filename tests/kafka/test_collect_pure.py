"""The Kafka collector's mapping, without Kafka or Spark: a cluster snapshot and the stored rows in, rows out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.kafka.admin import Broker, ClusterSnapshot, PartitionState
from rebalancer.kafka.collect import Collected, CollectError, Stored, desired_rows, stored_of

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def _part(topic: str, p: int, replicas: tuple[int, ...], isr: tuple[int, ...] | None = None, leader: int | None = None,
          adding: tuple[int, ...] = (), removing: tuple[int, ...] = (), high: int | None = 10,
          start: int = 2) -> PartitionState:
    isr = replicas if isr is None else isr
    leader = (isr[0] if isr else -1) if leader is None else leader
    return PartitionState(topic, p, replicas, isr, leader, adding, removing, high if leader >= 0 else None,
                          start if leader >= 0 else None)


def _snapshot(brokers: dict[int, str | None], topics: dict[str, tuple[PartitionState, ...]],
              sizes: dict[tuple[str, int, int], int] | None = None, fenced: frozenset[int] = frozenset()
              ) -> ClusterSnapshot:
    return ClusterSnapshot("c1", tuple(Broker(b, "127.0.0.1", 9000 + b, r) for b, r in sorted(brokers.items())),
                           topics, frozenset(), sizes or {}, fenced)


def _fold(stored: Stored, rows: Collected, history: dict[str, list[dict[str, Any]]]) -> Stored:
    """The stored state after appending ``rows`` (what the next collect reads back)."""
    for name in ("nodes", "cache_groups", "topology_events", "partition_reports"):
        history.setdefault(name, []).extend(getattr(rows, name))
    latest_nodes = {r["node_id"]: r for r in history["nodes"]}
    latest_groups = {r["group_name"]: r for r in history["cache_groups"]}
    return stored_of(list(latest_nodes.values()), list(latest_groups.values()), history["topology_events"],
                     history["partition_reports"])


def test_a_steady_topic_a_move_in_flight_and_a_lost_partition_map_to_the_contract_rows() -> None:
    snapshot = _snapshot(
        {1: "a", 2: "b", 3: "c"},
        {"orders": (
            _part("orders", 0, (1, 2), high=10, start=2),                                    # steady
            _part("orders", 1, (2, 3, 1), isr=(2, 1), adding=(3,), removing=(1,), high=7, start=0),  # moving 1 -> 3
            _part("orders", 2, (4, 5), isr=(), leader=-1),                                   # both replicas gone
        )},
        sizes={("orders", 0, 1): 100, ("orders", 0, 2): 100, ("orders", 1, 2): 70, ("orders", 1, 3): 5,
               ("orders", 1, 1): 70},
    )
    rows = desired_rows(snapshot, Stored(), NOW)
    assert rows.nodes == [
        {"node_id": str(b), "node_uuid": None, "node_order": b, "host": f"127.0.0.1:{9000 + b}",
         "attributes": {"zone": z}, "capacity": 1.0, "is_client": False} for b, z in ((1, "a"), (2, "b"), (3, "c"))]
    assert rows.cache_groups == [{
        "group_name": "orders", "partitions": 3, "backups": 1, "mode": "PARTITIONED", "affinity": "balanced",
        "exclude_neighbors": False, "backup_filter": ["zone"], "loss_policy": "READ_WRITE_SAFE", "persistent": True,
        "partitioner": None}]
    assert [(e["event_seq"], e["event_type"], e["node_id"]) for e in rows.topology_events] == [
        (1, "NODE_JOINED", "1"), (2, "NODE_JOINED", "2"), (3, "NODE_JOINED", "3")]
    reports = {(r["group_name"], r["partition_id"], r["node_id"]): r for r in rows.partition_reports}
    key = ("state", "update_counter", "size", "bytes", "wal_history_counter", "replica_index", "report_seq")
    assert {k: tuple(r[c] for c in key) for k, r in reports.items()} == {
        ("orders", 0, "1"): ("OWNING", 10, 8, 100, 2, 0, 1),
        ("orders", 0, "2"): ("OWNING", 10, 8, 100, 2, 1, 1),
        ("orders", 1, "2"): ("OWNING", 7, 7, 70, 0, 0, 1),
        ("orders", 1, "3"): ("MOVING", 7, 7, 5, 0, 1, 1),     # adding, not yet in the ISR
        ("orders", 1, "1"): ("RENTING", 7, 7, 70, 0, None, 1),  # being removed
    }, "partition 2 has no replica on a live broker: no report, so the exchange finds no owner and marks it lost"


def test_an_unchanged_cluster_collected_twice_appends_nothing() -> None:
    snapshot = _snapshot({1: None, 2: None}, {"t": (_part("t", 0, (1, 2)), _part("t", 1, (2, 1)))})
    history: dict[str, list[dict[str, Any]]] = {}
    stored = _fold(Stored(), desired_rows(snapshot, Stored(), NOW), history)
    assert desired_rows(snapshot, stored, NOW).empty


def test_departures_are_failures_unless_draining_then_leaves_and_new_topics_start() -> None:
    first = _snapshot({1: None, 2: None, 3: None}, {"t": (_part("t", 0, (1, 2)),)})
    history: dict[str, list[dict[str, Any]]] = {}
    stored = _fold(Stored(), desired_rows(first, Stored(), NOW), history)
    history["topology_events"].append({"event_seq": 4, "event_type": "NODE_DRAINING", "node_id": "3",
                                       "group_name": None, "event_time": NOW})
    stored = _fold(stored, Collected([], [], [], []), history)
    later = _snapshot({1: None, 4: None}, {"t": (_part("t", 0, (1, 4)),), "u": (_part("u", 0, (4,)),)},
                      fenced=frozenset({2, 3}))
    rows = desired_rows(later, stored, NOW)
    assert [(e["event_seq"], e["event_type"], e["node_id"], e["group_name"]) for e in rows.topology_events] == [
        (5, "NODE_JOINED", "4", None), (6, "NODE_FAILED", "2", None), (7, "NODE_LEFT", "3", None),
        (8, "CACHE_STARTED", None, "u")], "2 is fenced: failed; 3 was draining: left"
    unregistered = desired_rows(_snapshot({1: None}, {"t": (_part("t", 0, (1,)),)}), stored, NOW)
    assert [(e["event_type"], e["node_id"]) for e in unregistered.topology_events] == [
        ("NODE_LEFT", "2"), ("NODE_LEFT", "3")], "no longer registered: its operator decommissioned it"
    assert [r["node_order"] for r in rows.nodes] == [4], "a new broker joins after the known ones"
    assert [r["group_name"] for r in rows.cache_groups] == ["u"]
    evicted = [(r["node_id"], r["state"]) for r in rows.partition_reports if r["state"] == "EVICTED"]
    assert evicted == [], "copies on departed brokers are not reported: the exchange drops departed nodes"


def test_a_replica_removed_from_a_live_broker_is_reported_evicted() -> None:
    history: dict[str, list[dict[str, Any]]] = {}
    before = _snapshot({1: None, 2: None, 3: None}, {"t": (_part("t", 0, (1, 2)),)})
    stored = _fold(Stored(), desired_rows(before, Stored(), NOW), history)
    after = _snapshot({1: None, 2: None, 3: None}, {"t": (_part("t", 0, (3, 2)),)})
    rows = desired_rows(after, stored, NOW)
    assert sorted((r["node_id"], r["state"], r["replica_index"]) for r in rows.partition_reports) == [
        ("1", "EVICTED", None), ("3", "OWNING", 0)], "broker 2's copy did not change: not reported again"
    assert {r["report_seq"] for r in rows.partition_reports} == {2}


def test_a_broker_without_a_rack_among_racked_brokers_is_one_sentence() -> None:
    snapshot = _snapshot({1: "a", 2: None, 3: "c"}, {})
    with pytest.raises(CollectError) as raised:
        desired_rows(snapshot, Stored(), NOW)
    assert str(raised.value) == ("broker 2 has no rack (broker.rack) while brokers 1, 3 have one: set a rack on every "
                                 "broker or on none, so that replicas can be kept in different racks; nothing was "
                                 "collected")


@st.composite
def _histories(draw: st.DrawFn) -> list[ClusterSnapshot]:
    snapshots = []
    for _ in range(draw(st.integers(1, 5))):
        brokers = draw(st.sets(st.integers(1, 6), min_size=1, max_size=5))
        topics = {}
        for t in range(draw(st.integers(0, 3))):
            parts = []
            for p in range(draw(st.integers(1, 4))):
                replicas = tuple(draw(st.permutations(sorted(brokers | {7})))[: draw(st.integers(1, 3))])
                isr = tuple(b for b in replicas if b in brokers and draw(st.booleans()))
                parts.append(_part(f"t{t}", p, replicas, isr=isr, high=draw(st.integers(0, 50))))
            topics[f"t{t}"] = tuple(parts)
        snapshots.append(_snapshot(dict.fromkeys(brokers), topics))
    return snapshots


@settings(max_examples=200, deadline=None)
@given(_histories())
def test_after_any_history_of_collects_the_tables_say_what_the_last_cluster_is(history_of: list[ClusterSnapshot]
                                                                               ) -> None:
    history: dict[str, list[dict[str, Any]]] = {}
    stored = Stored()
    for snapshot in history_of:
        stored = _fold(stored, desired_rows(snapshot, stored, NOW), history)
        assert desired_rows(snapshot, stored, NOW).empty, "a second collect of the same cluster appends nothing"
        assert stored.alive == {str(b.broker_id) for b in snapshot.brokers}
        assert stored.running == set(snapshot.topics)
        live = {(str(b), t, p.partition) for t, ps in snapshot.topics.items() for p in ps for b in p.replicas
                if str(b) in stored.alive}
        reported = {k for k, r in stored.reports.items() if r["state"] != "EVICTED" and k[0] in stored.alive
                    and k[1] in snapshot.topics}
        assert reported == {(n, t, p) for n, t, p in live}
    seqs = [e["event_seq"] for e in history.get("topology_events", [])]
    assert seqs == list(range(1, len(seqs) + 1)), "event_seq increases by one, never reused"
    orders = [r["node_order"] for r in {r["node_id"]: r for r in history.get("nodes", [])}.values()]
    assert len(orders) == len(set(orders)), "node_order is unique"


def test_a_broker_that_rejoins_reports_every_copy_it_holds_even_unchanged() -> None:
    history: dict[str, list[dict[str, Any]]] = {}
    both = _snapshot({1: None, 2: None}, {"t": (_part("t", 0, (1, 2)), _part("t", 1, (2, 1)))})
    stored = _fold(Stored(), desired_rows(both, Stored(), NOW), history)
    stored = _fold(stored, desired_rows(_snapshot({1: None}, {"t": (_part("t", 0, (1, 2), isr=(1,)),
                                                                    _part("t", 1, (2, 1), isr=(1,)))}),
                                        stored, NOW), history)
    back = desired_rows(both, stored, NOW)
    assert [(e["event_type"], e["node_id"]) for e in back.topology_events] == [("NODE_JOINED", "2")]
    assert sorted((r["node_id"], r["partition_id"], r["state"]) for r in back.partition_reports) == [
        ("2", 0, "OWNING"), ("2", 1, "OWNING")], "unchanged since it left, reported again: the map dropped them"
