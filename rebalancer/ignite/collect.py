"""Collect a live Apache Ignite 2.x cluster into the input tables, as the contract's rows (SPEC 6, docs/IGNITE.md).

Contract:
    - :func:`desired_rows` is pure: an :class:`~rebalancer.ignite.read.IgniteSnapshot`, what the warehouse already
      holds (:class:`~rebalancer.collecting.Stored`) and the :class:`Mapping` choices in; the rows to write out
      (:class:`Collected`, nothing for what did not change) and the groups skipped, each with its reason.
      - a server or client node is a node: ``node_id`` its consistent id, ``node_uuid`` its runtime id (the
        ``ignite`` affinity's tie-break), ``node_order`` the order Ignite admitted it in, ``host`` its MAC
        addresses (``org.apache.ignite.macs``: Ignite's neighbours share them), ``attributes`` the ones a backup
        filter names (:attr:`Mapping.attributes`).
      - a cache group is a cache group with the ``ignite`` affinity (Ignite's RendezvousAffinityFunction, bit for
        bit): partitions, backups, mode, exclude-neighbours, loss policy and persistence as its view shows them.
        A group the engine does not model is skipped, named in :attr:`Desired.skipped` with a sentence: another
        affinity function, a node filter, a legacy ``backupFilter``, an ``affinityBackupFilter`` other than
        ``ClusterNodeAttributeAffinityBackupFilter``, or that filter without its attributes configured (the views
        show only its class: ``[ignite.backup_filters]`` names them), a LOCAL cache, an unknown loss policy.
        Ignite's own system groups (``ignite-sys-cache``, data structures) are not collected.
      - each copy on a live server node of a collected group is a report: its state, update counter and size as
        Ignite reports them, ``is_primary`` (:data:`rebalancer.tables.IS_PRIMARY`), ``bytes`` = size x
        :attr:`Mapping.entry_bytes` (no view shows a partition's bytes), no WAL history. A copy is reported when
        it changed, and every copy of a node that (re)joined. A copy gone from a live node is EVICTED.
      - events, in the cluster's own order: nodes gone since the last collect (NODE_LEFT: Ignite's affinity treats
        a crash and a departure alike, and its views show neither), in the order they had joined; then nodes new
        since, in Ignite's node order (NODE_JOINED); groups started and stopped (CACHE_STARTED / CACHE_STOPPED,
        not on the first collect: a fresh cluster starts every group); a group whose LOST copies are all gone
        while it runs (RESET_LOST_PARTITIONS: its operator reset it, which no view shows otherwise); activation
        and deactivation (CLUSTER_ACTIVATED on the first collect of an active cluster: activating sets the
        baseline, as Ignite's does); a baseline that changed while some collected group is persistent
        (BASELINE_CHANGED: the alive servers become the baseline, what ``control.sh --baseline version`` and
        auto-adjust do).
    - :func:`counter_conflicts`: the partitions whose OWNING copies report different counters now (Ignite's
      ``idle_verify`` conflicts), which every collect reports.
    - :func:`record` writes them through :func:`rebalancer.collecting.write` and records each skipped group once
      in ``rejected_rows``. A collect of an unchanged cluster writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer.collecting import Collected, Stored, differs, read_stored, record_rejections, write
from rebalancer.config import IgniteSettings
from rebalancer.ignite.read import MACS, IgniteGroup, IgniteSnapshot, parse_affinity, read_cluster
from rebalancer.storage import Warehouse
from rebalancer.tables import IN_BASELINE, IS_PRIMARY, REJECTED_ROWS, REPLICA_INDEX
from rebalancer.vocabulary import (
    BASELINE_CHANGED,
    CACHE_STARTED,
    CACHE_STOPPED,
    CLUSTER_ACTIVATED,
    CLUSTER_DEACTIVATED,
    EVICTED,
    IGNITE_AFFINITY,
    LOSS_POLICIES,
    LOST,
    MODES,
    NODE_JOINED,
    NODE_LEFT,
    OWNING,
    REPLICATED,
    RESET_LOST_PARTITIONS,
)

__all__ = ["CollectResult", "CounterConflict", "Desired", "Mapping", "collect", "counter_conflicts", "desired_rows",
           "mapping_of", "record", "snapshot_of", "system_group"]

_REPORT_FIELDS = ("state", "update_counter", "size", "bytes", IS_PRIMARY)
_ALL_NODES = ("IgniteAllNodesPredicate", "CacheConfiguration$IgniteAllNodesPredicate")
_ATTRIBUTE_FILTER = "ClusterNodeAttributeAffinityBackupFilter"


@dataclass(frozen=True)
class Mapping:
    """The choices the views cannot make: ``[ignite]`` settings."""

    backup_filters: dict[str, list[str]] = field(default_factory=dict)  # group -> its filter's attribute names
    attributes: tuple[str, ...] = ()  # node attributes to collect besides those
    entry_bytes: int = 1024
    include_system: bool = False

    @property
    def kept_attributes(self) -> frozenset[str]:
        return frozenset(self.attributes) | {a for names in self.backup_filters.values() for a in names}


@dataclass(frozen=True)
class Desired:
    rows: Collected
    skipped: dict[str, str]  # group -> why it was not collected
    group_rows: dict[str, dict[str, Any]]  # the skipped groups' view rows, for rejected_rows
    collected: dict[str, int]  # the groups collected -> their partitions


@dataclass(frozen=True)
class CounterConflict:
    """A partition whose OWNING copies report different update counters right now (what Ignite's ``idle_verify``
    calls an update counter conflict): each copy's counter, by consistent id."""

    group: str
    partition: int
    counters: dict[str, int]


@dataclass(frozen=True)
class CollectResult:
    cluster_id: str  # the version and the answering address, as Ignite has no cluster name in its views
    servers: int
    clients: int
    groups: int
    partitions: int
    skipped: dict[str, str]
    appended: dict[str, int]
    conflicts: tuple[CounterConflict, ...] = ()

    @property
    def changed(self) -> bool:
        return any(self.appended.values())


def system_group(name: str) -> bool:
    """Ignite's own groups: the utility cache and the data structures' groups."""
    return name.startswith("ignite-sys") or name in ("default-ds-group", "default-volatile-ds-group") or \
        name.startswith("datastructures_")


def group_row(group: IgniteGroup, mapping: Mapping) -> tuple[dict[str, Any] | None, str | None]:
    """A group's ``cache_groups`` row, or why it cannot be collected (one sentence)."""
    affinity = parse_affinity(group.affinity)
    name = group.name
    if group.mode not in MODES:
        return None, f"cache group {name!r} is {group.mode}; only PARTITIONED and REPLICATED groups are modelled"
    if affinity.function != "RendezvousAffinityFunction":
        return None, (f"cache group {name!r} uses {affinity.function}; the engine models Ignite's "
                      f"RendezvousAffinityFunction only")
    if group.node_filter not in (None, "", "null") and group.node_filter.split("@", 1)[0].rsplit(".", 1)[-1] \
            not in _ALL_NODES:
        return None, (f"cache group {name!r} has the node filter {group.node_filter}; the engine places groups "
                      f"on every server node")
    if affinity.backup_filter is not None:
        return None, (f"cache group {name!r} has the backupFilter {affinity.backup_filter}; the engine models "
                      f"{_ATTRIBUTE_FILTER} as an affinityBackupFilter only")
    backup_filter = None
    if affinity.affinity_backup_filter is not None:
        if affinity.affinity_backup_filter != _ATTRIBUTE_FILTER:
            return None, (f"cache group {name!r} has the affinityBackupFilter {affinity.affinity_backup_filter}; "
                          f"the engine models {_ATTRIBUTE_FILTER} only")
        backup_filter = mapping.backup_filters.get(name)
        if not backup_filter:
            return None, (f"cache group {name!r} has a {_ATTRIBUTE_FILTER} whose attributes Ignite's views do not "
                          f"show; name them in [ignite.backup_filters] ({name} = [\"...\"]) to collect it")
    if group.loss_policy not in LOSS_POLICIES:
        return None, f"cache group {name!r} has the loss policy {group.loss_policy}, which the engine does not model"
    replicated = group.mode == REPLICATED
    return {"group_name": name, "partitions": affinity.partitions or group.partitions,
            "backups": 0 if replicated else group.backups, "mode": group.mode, "affinity": IGNITE_AFFINITY,
            "exclude_neighbors": affinity.exclude_neighbors, "backup_filter": backup_filter,
            # persistence unknown (no metrics view): in memory, the default of a data region
            "loss_policy": group.loss_policy, "persistent": bool(group.persistent),
            "partitioner": IGNITE_AFFINITY}, None


def counter_conflicts(snapshot: IgniteSnapshot, groups: Iterable[str] | None = None) -> tuple[CounterConflict, ...]:
    """The partitions (of ``groups``, default all) whose OWNING copies disagree on the update counter, in group
    and partition order. Ignite's own exchange raises the lower counters to the highest when it next runs (measured:
    docs/IGNITE.md), so a conflict is visible only between a divergence and the cluster's next topology change."""
    wanted = None if groups is None else set(groups)
    by_partition: dict[tuple[str, int], dict[str, int]] = {}
    names = {n.node_uuid: n.consistent_id for n in snapshot.nodes}
    for c in snapshot.copies:
        if c.state == OWNING and (wanted is None or c.group_name in wanted) and c.node_uuid in names:
            by_partition.setdefault((c.group_name, c.partition), {})[names[c.node_uuid]] = c.update_counter
    return tuple(CounterConflict(g, p, dict(sorted(counters.items())))
                 for (g, p), counters in sorted(by_partition.items()) if len(set(counters.values())) > 1)


def desired_rows(snapshot: IgniteSnapshot, stored: Stored, mapping: Mapping, now: datetime) -> Desired:
    """The rows that bring the input tables to ``snapshot``: only what differs from ``stored``."""
    groups: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    views: dict[str, dict[str, Any]] = {}
    for group in snapshot.groups:
        if system_group(group.name) and not mapping.include_system:
            continue
        row, why = group_row(group, mapping)
        if row is None:
            skipped[group.name] = str(why)
            views[group.name] = asdict(group)
        else:
            groups[group.name] = row
    group_rows = [row for name, row in groups.items() if differs(stored.groups.get(name), row)]
    event_rows = [{"event_seq": stored.max_event_seq + i + 1, "event_type": kind, "node_id": node,
                   "group_name": group, "event_time": now}
                  for i, (kind, node, group) in enumerate(_events(snapshot, stored, groups))]
    rows = Collected(_node_rows(snapshot, stored, mapping), group_rows, event_rows,
                     _report_rows(snapshot, stored, groups, mapping))
    return Desired(rows, skipped, views, {g: int(r["partitions"]) for g, r in groups.items()})


def _node_rows(snapshot: IgniteSnapshot, stored: Stored, mapping: Mapping) -> list[dict[str, Any]]:
    kept, baseline = mapping.kept_attributes, set(snapshot.baseline or ())
    rows = []
    for node in sorted(snapshot.nodes, key=lambda n: n.order):
        row = {"node_id": node.consistent_id, "node_uuid": node.node_uuid, "node_order": node.order,
               "host": node.attributes.get(MACS) or None,
               "attributes": {k: v for k, v in sorted(node.attributes.items()) if k in kept},
               "capacity": 1.0, "is_client": node.is_client, IN_BASELINE: node.consistent_id in baseline}
        if differs(stored.nodes.get(node.consistent_id), row):
            rows.append(row)
    return rows


def _events(snapshot: IgniteSnapshot, stored: Stored,
            groups: dict[str, dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    order = {n.consistent_id: n.order for n in snapshot.nodes}
    servers = {n.consistent_id for n in snapshot.nodes if not n.is_client}
    first = not stored.has_events
    events: list[tuple[str, str | None, str | None]] = []
    gone = sorted(stored.alive - set(order), key=lambda n: (int(stored.nodes.get(n, {}).get("node_order") or 0), n))
    events += [(NODE_LEFT, n, None) for n in gone]
    events += [(NODE_JOINED, n, None) for n in sorted(set(order) - stored.alive, key=order.__getitem__)]
    if not first:
        events += [(CACHE_STARTED, None, g) for g in sorted(set(groups) - stored.running)]
    events += [(CACHE_STOPPED, None, g) for g in sorted(stored.running - set(groups))]
    # a group whose LOST copies are gone while it still runs was reset by its operator (resetLostPartitions,
    # control.sh --cache reset_lost_partitions): Ignite shows no reset otherwise
    was_lost = {g for (n, g, _p), r in stored.reports.items() if r["state"] == LOST and g in groups and n in order}
    lost_now = {c.group_name for c in snapshot.copies if c.state == LOST}
    if snapshot.active:
        events += [(RESET_LOST_PARTITIONS, None, g) for g in sorted(was_lost - lost_now)]
    if snapshot.active and (stored.active is False or (first and servers)):
        events.append((CLUSTER_ACTIVATED, None, None))
    elif not snapshot.active and stored.has_events and stored.active is not False:
        events.append((CLUSTER_DEACTIVATED, None, None))
    elif not first and _baseline_changed(snapshot, stored, groups):
        events.append((BASELINE_CHANGED, None, None))
    return events


def _baseline_changed(snapshot: IgniteSnapshot, stored: Stored, groups: dict[str, dict[str, Any]]) -> bool:
    """The baseline differs from the last collect's, and it matters: some collected group is persistent."""
    if snapshot.baseline is None or not any(g["persistent"] for g in groups.values()):
        return False
    return set(snapshot.baseline) != {n for n, r in stored.nodes.items() if r.get(IN_BASELINE)}


def _report_rows(snapshot: IgniteSnapshot, stored: Stored, groups: dict[str, dict[str, Any]],
                 mapping: Mapping) -> list[dict[str, Any]]:
    by_uuid = {n.node_uuid: n for n in snapshot.nodes if not n.is_client}
    seq = stored.max_report_seq + 1
    rows = []
    seen: set[tuple[str, str, int]] = set()
    for copy in snapshot.copies:
        node = by_uuid.get(copy.node_uuid)
        if node is None or copy.group_name not in groups:
            continue
        key = (node.consistent_id, copy.group_name, copy.partition)
        seen.add(key)
        row = {"node_id": key[0], "group_name": key[1], "partition_id": key[2], "state": copy.state,
               "update_counter": copy.update_counter, "size": copy.size, "bytes": copy.size * mapping.entry_bytes,
               "wal_history_counter": None, REPLICA_INDEX: None, IS_PRIMARY: copy.primary}
        # a node that (re)joined describes every copy it holds: its copies left the map when it left
        if key[0] not in stored.alive or differs(stored.reports.get(key), row, _REPORT_FIELDS):
            rows.append(row | {"report_seq": seq})
    if not snapshot.active:  # an inactive cluster shows no partitions; its copies are not gone
        return rows
    servers = {n.consistent_id for n in by_uuid.values()}
    for key, last in sorted(stored.reports.items()):
        node_id, group, pid = key
        if key in seen or node_id not in servers or group not in groups or last["state"] == EVICTED:
            continue
        rows.append({"node_id": node_id, "group_name": group, "partition_id": pid, "state": EVICTED,
                     "update_counter": last["update_counter"], "size": 0, "bytes": 0, "wal_history_counter": None,
                     REPLICA_INDEX: None, IS_PRIMARY: False, "report_seq": seq})
    return rows


def record(warehouse: Warehouse, snapshot: IgniteSnapshot, mapping: Mapping, where: str,
           now: datetime | None = None) -> CollectResult:
    """Write what ``snapshot`` changes (nodes and groups, then events, then reports) and each skipped group once
    in ``rejected_rows``."""
    desired = desired_rows(snapshot, read_stored(warehouse), mapping, now or datetime.now(UTC))
    appended = write(warehouse, desired.rows)
    rejected = [{"table_name": "cache_groups", "row_json": json.dumps(desired.group_rows[g], sort_keys=True),
                 "reason": why, "exchange_id": None} for g, why in sorted(desired.skipped.items())]
    if rejected:
        warehouse.create_tables(["rejected_rows"])
        appended["rejected_rows"] = record_rejections(
            warehouse, pa.Table.from_pylist(rejected, schema=to_arrow_schema(REJECTED_ROWS)))
    servers = [n for n in snapshot.nodes if not n.is_client]
    return CollectResult(f"Ignite {snapshot.version.split('#', 1)[0]} at {where}", len(servers),
                         len(snapshot.nodes) - len(servers), len(desired.collected), sum(desired.collected.values()),
                         desired.skipped, appended, counter_conflicts(snapshot, desired.collected))


def mapping_of(settings: IgniteSettings) -> Mapping:
    """The ``[ignite]`` settings' choices."""
    return Mapping({g: list(a) for g, a in settings.backup_filters.items()}, tuple(settings.attributes),
                   settings.entry_bytes, settings.include_system)


def snapshot_of(settings: IgniteSettings, host: str | None = None, port: int | None = None) -> IgniteSnapshot:
    """The cluster at ``host:port`` (default ``[ignite] host``, ``port``) as it is now; no warehouse needed (the CLI
    reads the cluster before it starts Spark: an unreachable cluster fails in seconds)."""
    return read_cluster(host or settings.host, port or settings.port, control=settings.control,
                        timeout_s=settings.client_timeout_s, attributes=mapping_of(settings).kept_attributes)


def collect(warehouse: Warehouse, settings: IgniteSettings, host: str | None = None, port: int | None = None,
            snapshot: IgniteSnapshot | None = None, now: datetime | None = None) -> CollectResult:
    """Read the cluster (or take ``snapshot``, already read) and write what changed since the last collect.

    Raises:
        IgniteUnreachableError: the cluster did not answer (one sentence).
        IgniteVersionError: not an Ignite 2.x cluster with SQL views (one sentence).
    """
    where = f"{host or settings.host}:{port or settings.port}"
    return record(warehouse, snapshot or snapshot_of(settings, host, port), mapping_of(settings), where, now)
