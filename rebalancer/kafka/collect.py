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
    - :func:`collect` reads the cluster and the warehouse and writes what changed, nodes and groups (one row per
      broker and topic, replaced when it changes) before events before reports (appended); a collect killed between
      two commits is finished by the next one. A collect of an unchanged cluster writes nothing.
    - A broker without a rack in a cluster whose other brokers have one is refused with one sentence, before
      anything is written (Kafka refuses rack-aware placement there too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer.kafka.admin import ClusterSnapshot, PartitionState, read_cluster
from rebalancer.storage import Warehouse
from rebalancer.tables import COLLECTED_COLUMNS, INPUT_TABLES, REPLICA_INDEX
from rebalancer.vocabulary import (
    BALANCED,
    CACHE_STARTED,
    CACHE_STOPPED,
    EVICTED,
    MOVING,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_JOINED,
    NODE_LEFT,
    OWNING,
    RENTING,
)

__all__ = ["CollectError", "CollectResult", "Collected", "Stored", "collect", "desired_rows", "read_stored", "record",
           "stored_of"]

ZONE = "zone"
# Tables whose row for a broker or topic is replaced when it changes (a broker's listener or rack, a topic's
# partitions or replication factor), on their key; events and reports are appended.
_UPSERTED = {"nodes": "node_id", "cache_groups": "group_name"}
_REPORT_FIELDS = ("state", "update_counter", "size", "bytes", "wal_history_counter", REPLICA_INDEX)


class CollectError(ValueError):
    """The cluster cannot be collected as it is; the message is one sentence and nothing was written."""


@dataclass(frozen=True)
class Stored:
    """What the warehouse already says about the cluster."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    alive: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()
    running: frozenset[str] = frozenset()
    has_events: bool = False
    max_event_seq: int = 0
    reports: dict[tuple[str, str, int], dict[str, Any]] = field(default_factory=dict)  # latest per copy
    max_report_seq: int = 0


@dataclass(frozen=True)
class Collected:
    """Rows to append, per input table, each a list of dicts with that table's columns."""

    nodes: list[dict[str, Any]]
    cache_groups: list[dict[str, Any]]
    topology_events: list[dict[str, Any]]
    partition_reports: list[dict[str, Any]]

    @property
    def empty(self) -> bool:
        return not (self.nodes or self.cache_groups or self.topology_events or self.partition_reports)


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
                  if _differs(stored.groups.get(row["group_name"]), row)]
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
        if _differs(known, row):
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
                if node not in stored.alive or _differs(stored.reports.get((node, topic, p.partition)), row,
                                                        _REPORT_FIELDS):
                    rows.append(row | {"report_seq": seq})
    for (node, topic, pid), last in sorted(stored.reports.items()):
        if (node, topic, pid) in seen or node not in alive or topic not in snapshot.topics or last["state"] == EVICTED:
            continue
        rows.append({"node_id": node, "group_name": topic, "partition_id": pid, "state": EVICTED,
                     "update_counter": last["update_counter"], "size": 0, "bytes": 0, "wal_history_counter": None,
                     REPLICA_INDEX: None, "report_seq": seq})
    return rows


def _differs(known: Mapping[str, Any] | None, row: Mapping[str, Any], keys: Sequence[str] | None = None) -> bool:
    if known is None:
        return True
    return any(_norm(known.get(k)) != _norm(row.get(k)) for k in (keys or row))


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list):  # a map read back from Arrow is a list of pairs; an array a list of values
        return tuple(sorted(value)) if value and isinstance(value[0], tuple) else tuple(value)
    return value


# ---- the warehouse side ----
def stored_of(nodes: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]],
              events: Sequence[Mapping[str, Any]], reports: Sequence[Mapping[str, Any]]) -> Stored:
    """What rows of the four input tables say about the cluster: its nodes and groups, the alive and draining
    nodes and the running groups their events leave (in ``event_seq`` order), and the latest report per copy."""
    alive: set[str] = set()
    draining: set[str] = set()
    started: set[str] = set()
    stopped: set[str] = set()
    ordered = sorted(events, key=lambda r: r["event_seq"] or 0)
    for e in ordered:
        kind, node, group = e["event_type"], e["node_id"], e["group_name"]
        if kind == NODE_JOINED:
            alive.add(node)
            draining.discard(node)
        elif kind in (NODE_LEFT, NODE_FAILED):
            alive.discard(node)
            draining.discard(node)
        elif kind == NODE_DRAINING:
            draining.add(node)
        elif kind == CACHE_STARTED:
            started.add(group)
            stopped.discard(group)
        elif kind == CACHE_STOPPED:
            stopped.add(group)
            started.discard(group)
    by_group = {r["group_name"]: dict(r) for r in groups}
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in reports:
        key = (r["node_id"], r["group_name"], r["partition_id"])
        if key not in latest or (r["report_seq"] or 0) >= (latest[key]["report_seq"] or 0):
            latest[key] = dict(r)
    return Stored(
        nodes={r["node_id"]: dict(r) for r in nodes}, groups=by_group, alive=frozenset(alive),
        draining=frozenset(draining), running=frozenset((set(by_group) | started) - stopped),
        has_events=bool(ordered), max_event_seq=max((e["event_seq"] or 0 for e in ordered), default=0),
        reports=latest, max_report_seq=max((r["report_seq"] or 0 for r in reports), default=0))


def read_stored(warehouse: Warehouse) -> Stored:
    """:func:`stored_of` the warehouse's input tables as they are now (creating the missing ones). The reports are
    reduced to the latest per copy in Spark (one job): the table keeps every collect's changes."""
    warehouse.create_tables(list(INPUT_TABLES))
    return stored_of(warehouse.read_arrow("nodes").to_pylist(), warehouse.read_arrow("cache_groups").to_pylist(),
                     warehouse.read_arrow("topology_events").to_pylist(), warehouse.latest_reports().to_pylist())


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
    rows = desired_rows(snapshot, read_stored(warehouse), now or datetime.now(UTC))
    appended = {}
    for name in ("nodes", "cache_groups", "topology_events", "partition_reports"):
        batch = getattr(rows, name)
        appended[name] = len(batch)
        if not batch:
            continue
        extra = COLLECTED_COLUMNS.get(name, ())
        if extra:
            warehouse.add_columns(name, extra)
        schema = to_arrow_schema(StructType([*INPUT_TABLES[name].fields, *extra]), timezone="UTC")
        table = pa.Table.from_pylist(batch, schema=schema)
        if name in _UPSERTED:  # one row per broker or topic, kept current
            warehouse.merge_arrow(name, table, [_UPSERTED[name]])
        else:
            warehouse.append_arrow(name, table)
    return CollectResult(snapshot.cluster_id, len(snapshot.brokers), len(snapshot.topics),
                         sum(len(p) for p in snapshot.topics.values()), appended)
