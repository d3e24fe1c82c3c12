"""Collect a live Kafka cluster into the input tables, as the contract's rows (SPEC section 6, docs/KAFKA.md).

Contract:
    - :func:`desired_rows` is pure: a :class:`~rebalancer.kafka.admin.ClusterSnapshot` and what the warehouse already
      holds (:class:`Stored`) in, the rows to append out (:class:`Collected`), nothing for what did not change.
      - a broker is a node: ``node_id`` its id, ``host`` its listener ``host:port``, its rack the ``zone``
        attribute; ``node_order`` continues the stored one, new brokers in id order.
      - a topic is a cache group: ``partitions``, ``backups`` = replication factor - 1, ``balanced`` affinity
        (a placement that continues from the previous one; the first is the cluster's own, through the reports'
        ``replica_index``), READ_WRITE_SAFE (Kafka without unclean election serves nothing of a partition that
        lost every in-sync replica), the ``zone`` backup filter when the brokers have racks.
      - each replica on a live broker is a report: in a reassignment's removing set RENTING, in the ISR OWNING,
        otherwise MOVING (catching up); ``update_counter`` the partition's high watermark (an in-sync replica
        holds every record up to it; a replica catching up is MOVING, whose counter the exchange does not compare;
        Kafka's admin API gives no follower's log end offset); ``size`` the records between the log start and the
        counter; ``bytes`` its size on disk; ``wal_history_counter`` the log start offset (a follower can
        catch up from there); ``replica_index`` (:data:`rebalancer.tables.COLLECTED_COLUMNS`) its place in the
        assignment. A copy is reported when it changed, and every copy of a broker that (re)joined since the last
        collect. A replica no longer on a live broker that reported one is EVICTED. A partition with no live
        in-sync replica has no OWNING copy: the exchange marks it lost.
      - brokers that registered since the last collect are NODE_JOINED; a broker gone is NODE_LEFT when it was
        draining or its operator unregistered it (decommissioned: ``kafka-cluster unregister``), else NODE_FAILED
        (registered but fenced: a crash and a controlled shutdown look the same through the admin API); new topics
        are CACHE_STARTED (not on the first collect: a fresh cluster starts every group), deleted topics
        CACHE_STOPPED.
    - :func:`collect` reads the cluster and the warehouse and writes what changed through
      :func:`rebalancer.collecting.write` (nodes and groups upserted, then events, then reports); a collect killed
      between two commits is finished by the next one. A collect of an unchanged cluster writes nothing.
    - A broker without a rack in a cluster whose other brokers have one is refused with one sentence, before
      anything is written (Kafka refuses rack-aware placement there too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rebalancer.collecting import Collected, Stored, differs, read_stored, stored_of, write
from rebalancer.kafka.admin import ClusterSnapshot, PartitionState, read_cluster
from rebalancer.storage import Warehouse
from rebalancer.tables import REPLICA_INDEX
from rebalancer.vocabulary import (
    BALANCED,
    CACHE_STARTED,
    CACHE_STOPPED,
    EVICTED,
    MOVING,
    NODE_FAILED,
    NODE_JOINED,
    NODE_LEFT,
    OWNING,
    RENTING,
)

__all__ = ["CollectError", "CollectResult", "Collected", "Stored", "collect", "desired_rows", "read_stored", "record",
           "stored_of"]

ZONE = "zone"
_REPORT_FIELDS = ("state", "update_counter", "size", "bytes", "wal_history_counter", REPLICA_INDEX)


class CollectError(ValueError):
    """The cluster cannot be collected as it is; the message is one sentence and nothing was written."""


@dataclass(frozen=True)
class CollectResult:
    cluster_id: str
    brokers: int
    topics: int
    partitions: int
    appended: dict[str, int]  # table -> rows appended by this collect

    @property
    def changed(self) -> bool:
        return any(self.appended.values())


def desired_rows(snapshot: ClusterSnapshot, stored: Stored, now: datetime) -> Collected:
    """The rows that bring the input tables to ``snapshot``: only what differs from ``stored``.

    Raises:
        CollectError: some brokers have a rack and others do not.
    """
    racks = {b.broker_id: b.rack for b in snapshot.brokers}
    without = sorted(b for b, r in racks.items() if r is None)
    if without and len(without) < len(racks):
        raise CollectError(
            f"broker {without[0]} has no rack (broker.rack) while brokers "
            f"{', '.join(str(b) for b, r in sorted(racks.items()) if r is not None)} have one: set a rack on every "
            f"broker or on none, so that replicas can be kept in different racks; nothing was collected")
    node_rows = _node_rows(snapshot, stored)
    alive = frozenset(str(b.broker_id) for b in snapshot.brokers)
    first = not stored.has_events
    group_rows = [row for row in _group_rows(snapshot, bool(racks) and not without)
                  if differs(stored.groups.get(row["group_name"]), row)]
    events: list[tuple[str, str | None, str | None]] = []
    for node in sorted(alive - stored.alive, key=lambda n: (len(n), n)):
        events.append((NODE_JOINED, node, None))
    registered = {str(b) for b in snapshot.fenced}
    for node in sorted(stored.alive - alive, key=lambda n: (len(n), n)):
        left = node in stored.draining or node not in registered  # drained, or unregistered by its operator
        events.append((NODE_LEFT if left else NODE_FAILED, node, None))
    if not first:
        for topic in sorted(set(snapshot.topics) - stored.running):
            events.append((CACHE_STARTED, None, topic))
    for topic in sorted(stored.running - set(snapshot.topics)):
        events.append((CACHE_STOPPED, None, topic))
    event_rows = [{"event_seq": stored.max_event_seq + i + 1, "event_type": kind, "node_id": node,
                   "group_name": group, "event_time": now} for i, (kind, node, group) in enumerate(events)]
    report_rows = _report_rows(snapshot, stored, alive)
    return Collected(node_rows, group_rows, event_rows, report_rows)


def _node_rows(snapshot: ClusterSnapshot, stored: Stored) -> list[dict[str, Any]]:
    next_order = max((int(r["node_order"]) for r in stored.nodes.values()), default=0) + 1
    rows = []
    for broker in snapshot.brokers:
        node_id = str(broker.broker_id)
        known = stored.nodes.get(node_id)
        row = {"node_id": node_id, "node_uuid": None,
               "node_order": int(known["node_order"]) if known else next_order,
               "host": f"{broker.host}:{broker.port}",
               "attributes": {ZONE: broker.rack} if broker.rack else {},
               "capacity": 1.0, "is_client": False}
        if known is None:
            next_order += 1
        if differs(known, row):
            rows.append(row)
    return rows


def _group_rows(snapshot: ClusterSnapshot, racks: bool) -> list[dict[str, Any]]:
    rows = []
    for topic, parts in snapshot.topics.items():
        factor = max((len(p.target) for p in parts), default=1)
        rows.append({"group_name": topic, "partitions": len(parts), "backups": max(factor - 1, 0),
                     "mode": "PARTITIONED", "affinity": BALANCED, "exclude_neighbors": False,
                     "backup_filter": [ZONE] if racks else None, "loss_policy": "READ_WRITE_SAFE",
                     "persistent": True, "partitioner": None})
    return rows


def _copy_state(p: PartitionState, broker: int) -> str:
    if broker in p.removing:
        return RENTING
    return OWNING if broker in p.isr else MOVING


def _report_rows(snapshot: ClusterSnapshot, stored: Stored, alive: frozenset[str]) -> list[dict[str, Any]]:
    seq = stored.max_report_seq + 1
    rows = []
    seen: set[tuple[str, str, int]] = set()
    for topic, parts in snapshot.topics.items():
        for p in parts:
            target = p.target
            for broker in p.replicas:
                node = str(broker)
                if node not in alive:
                    continue
                seen.add((node, topic, p.partition))
                state = _copy_state(p, broker)
                counter = p.high_watermark or 0
                start = p.log_start or 0
                row = {"node_id": node, "group_name": topic, "partition_id": p.partition, "state": state,
                       "update_counter": counter, "size": max(counter - start, 0),
                       "bytes": snapshot.replica_bytes.get((topic, p.partition, broker), 0),
                       "wal_history_counter": start,
                       REPLICA_INDEX: target.index(broker) if broker in target else None}
                # a broker that (re)joined describes every copy it holds, changed or not: its copies left the map
                # when it left, and the exchange knows of them only from a report newer than that
                if node not in stored.alive or differs(stored.reports.get((node, topic, p.partition)), row,
                                                        _REPORT_FIELDS):
                    rows.append(row | {"report_seq": seq})
    for (node, topic, pid), last in sorted(stored.reports.items()):
        if (node, topic, pid) in seen or node not in alive or topic not in snapshot.topics or last["state"] == EVICTED:
            continue
        rows.append({"node_id": node, "group_name": topic, "partition_id": pid, "state": EVICTED,
                     "update_counter": last["update_counter"], "size": 0, "bytes": 0, "wal_history_counter": None,
                     REPLICA_INDEX: None, "report_seq": seq})
    return rows


def collect(warehouse: Warehouse, bootstrap: str, *, timeout_s: float = 15.0, include_internal: bool = True,
            now: datetime | None = None) -> CollectResult:
    """Read the cluster at ``bootstrap`` and append to the input tables what changed since the last collect.

    Raises:
        KafkaUnreachableError: no broker answered (one sentence).
        CollectError: the cluster cannot be collected as it is (one sentence); nothing was written.
    """
    snapshot = read_cluster(bootstrap, timeout_s=timeout_s, include_internal=include_internal)
    return record(warehouse, snapshot, now)


def record(warehouse: Warehouse, snapshot: ClusterSnapshot, now: datetime | None = None) -> CollectResult:
    """Append to the input tables what ``snapshot`` changes, nodes and groups before events before reports.

    Raises:
        CollectError: the cluster cannot be collected as it is (one sentence); nothing was written.
    """
    appended = write(warehouse, desired_rows(snapshot, read_stored(warehouse), now or datetime.now(UTC)))
    return CollectResult(snapshot.cluster_id, len(snapshot.brokers), len(snapshot.topics),
                         sum(len(p) for p in snapshot.topics.values()), appended)
