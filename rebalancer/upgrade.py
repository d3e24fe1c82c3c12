"""``rebalancer upgrade``: bring a warehouse written in an earlier format to this release's, losing nothing.

The changes (docs/STORAGE.md "Formats"), in this order, each one Delta commit on one table (but the format-3 fill,
two commits redone together):

1. *create table*: the tables the warehouse has not got yet, empty.
2. *add columns*: the columns a table has not got yet, by schema evolution: a metadata-only commit, no data file
   rewritten. Rows written before keep null there, which means "not recorded by the release that wrote them".
3. *fill*: where that null would change what the next exchange decides, the newest committed version (the one the
   next exchange continues from) gets the value this release would have written, derived from what the warehouse
   holds; older versions are history and keep their rows. Only rows of the newest version are rewritten:
   - ``partition_versions`` and ``partition_stamps`` (written empty before format 2): each partition's version
     counted over the serving assignments of every committed version, and the groups' stamps from them;
   - ``partition_map.wal_history_counter`` (format 3): each copy's from its latest consumed report; then
     ``exchanges.input_versions`` (format 3): the Delta version of each input table committed last before the
     exchange started, so the next exchange reads only what came after (without them it would read every report
     again);
   - the cluster state of ``exchanges`` (format 6: baseline, activation, drain, the newest node event): the merged
     events of every committed exchange replayed through this release's event planner.
4. *record format*: the ``warehouse_format`` table and its row. Until that table exists every other command
   refuses the warehouse (:func:`rebalancer.formats.stored_format` finds an earlier format), so an upgrade killed
   at any point is never half-seen by rebalancer; run again, it redoes only what is missing (each step first looks
   at what is there), and a finished one does nothing.

No format so far renamed or retyped a column; a stored type that cannot be read as declared is refused as before
(``SchemaMismatchError``), not rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer.config import Settings
from rebalancer.exchange.events import ClusterState, Event, NodeInfo, TopologyState, plan_exchanges
from rebalancer.exchange.stamps import stamps_of
from rebalancer.formats import (
    CURRENT_FORMAT,
    FORMATS,
    WarehouseMissingError,
    record_format,
    recorded_format,
    require_current,
    stored_format,
)
from rebalancer.inputs import cluster_columns
from rebalancer.storage import Warehouse
from rebalancer.tables import EXCHANGES, INPUT_TABLES, SCHEMAS, version_where
from rebalancer.vocabulary import COPY_KEY

__all__ = [
    "Change", "UpgradeResult", "consumed_versions", "describe", "planned_changes", "replayed_cluster", "upgrade",
]


@dataclass(frozen=True)
class Change:
    """One commit an upgrade makes: ``kind`` is create table | add columns | fill | record format."""

    table: str
    kind: str
    detail: str
    fill: _Fill | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.table}: {self.kind} {self.detail}".rstrip()


@dataclass(frozen=True)
class UpgradeResult:
    """What an upgrade found and did.

    Attributes:
        from_format: the format the warehouse was in.
        to_format: this release's.
        changes: the changes made (or, on a dry run, to be made), in order; empty when it was current.
        dry_run: nothing was written.
    """

    from_format: int
    to_format: int
    changes: tuple[Change, ...]
    dry_run: bool


def consumed_versions(commit_times: Mapping[str, Mapping[int, datetime]], started_at: datetime) -> dict[str, int]:
    """Per input table, the Delta version an exchange that started at ``started_at`` read: the newest one committed
    before it started (releases before format 3 read each input table's latest version when they started)."""
    out = {}
    for name, times in commit_times.items():
        before = [v for v, at in times.items() if at <= started_at]
        if before:
            out[name] = max(before)
    return out


def replayed_cluster(
    rows: Sequence[Mapping[str, Any]],
    events: Sequence[Event],
    alive_at: Callable[[tuple[int, int]], Mapping[str, NodeInfo]],
    catalog: Mapping[str, NodeInfo],
    groups: Sequence[str],
    settings: Settings,
) -> ClusterState:
    """The cluster state this release's event planner gives the newest of ``rows`` (``exchanges`` rows, any order):
    each row's merged events planned from the state before it, as the exchange that wrote it had planned them.

    Args:
        rows: every committed ``exchanges`` row.
        events: the topology events (those no row merged are ignored).
        alive_at: a version's alive nodes (its ``topology`` rows).
        catalog: the ``nodes`` table's nodes.
        groups: the ``cache_groups`` table's groups.
        settings: ``[baseline]`` is read.
    """
    by_seq = {e.event_seq: e for e in events}
    cluster = ClusterState()
    before = TopologyState()
    for row in sorted(rows, key=lambda r: r["exchange_id"]):
        merged = [by_seq[s] for s in sorted(row["merged_event_seqs"] or []) if s in by_seq]
        if merged:
            steps, _ = plan_exchanges(before, merged, catalog, groups, settings.baseline)
            if steps:
                cluster = steps[-1].cluster
        version = (row["topology_major"], row["topology_minor"])
        before = TopologyState(*version, alive_at(version), frozenset(row["running_groups"] or []), cluster)
    return cluster


@dataclass(frozen=True)
class Newest:
    """The newest committed version, which the next exchange continues from: every ``exchanges`` row as stored
    (before the upgrade adds its columns, a missing column reads as a missing key) and the newest of them."""

    exchanges: list[dict[str, Any]]
    row: dict[str, Any]

    @property
    def version(self) -> tuple[int, int]:
        return (self.row["topology_major"], self.row["topology_minor"])

    def rows(self, warehouse: Warehouse, name: str) -> pa.Table:
        """The version's rows of a versioned table."""
        return warehouse.read_arrow(name, where=version_where(self.version))

    def replace(self, warehouse: Warehouse, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
        """Write ``rows`` (without the version columns) as the version's rows of ``name``, in one commit."""
        stamped = [{"topology_major": self.version[0], "topology_minor": self.version[1], **r} for r in rows]
        warehouse.replace_where_arrow(name, pa.Table.from_pylist(stamped, schema=schema), version_where(self.version))


def _newest(warehouse: Warehouse) -> Newest | None:
    if not warehouse.exists("exchanges"):
        return None
    # As stored: Delta refuses to read an older table with the declared schema (delta-rs reads missing columns as null)
    exchanges = warehouse.read_stored_arrow("exchanges").to_pylist()
    if not exchanges:
        return None
    return Newest(exchanges, max(exchanges, key=lambda r: r["exchange_id"]))


@dataclass(frozen=True)
class _Fill:
    """One fill (module docstring, step 3): whether the newest version still lacks it, and how it is made."""

    table: str
    what: str
    needed: Callable[[Warehouse, Newest], bool]
    make: Callable[[Warehouse, Newest, Settings], None]


def _fills(warehouse: Warehouse) -> list[Change]:
    """The fills still to make, each judged from what the newest version holds, so that a re-run after a crash
    finds only what the interrupted run left."""
    newest = _newest(warehouse)
    if newest is None:
        return []
    shown = ".".join(map(str, newest.version))
    return [Change(f.table, "fill", f.what.format(version=shown, exchange=newest.row["exchange_id"]), f)
            for f in FILLS if f.needed(warehouse, newest)]


def planned_changes(warehouse: Warehouse) -> tuple[int, list[Change]]:
    """The warehouse's format and the changes :func:`upgrade` would make, in order (no write).

    Raises:
        WarehouseMissingError: no warehouse at the location.
        WarehouseTooNewError: written by a later release.
    """
    recorded = recorded_format(warehouse)
    if recorded is not None and recorded[0] > CURRENT_FORMAT:
        require_current(warehouse)  # raises WarehouseTooNewError with the release needed
    number = recorded[0] if recorded is not None else stored_format(warehouse)
    if number is None:
        raise WarehouseMissingError(
            f"there is no warehouse at {warehouse.location} to upgrade: create one with `rebalancer init`.")
    changes: list[Change] = []
    for name, schema in SCHEMAS.items():
        if name == "warehouse_format":
            continue  # created by the last change: while it is missing no reader takes the warehouse for current
        if not warehouse.exists(name):
            changes.append(Change(name, "create table", ""))
            continue
        stored = set(warehouse.stored_columns(name))
        missing = [f.name for f in schema.fields if f.name not in stored]
        if missing:
            changes.append(Change(name, "add columns", ", ".join(missing)))
    changes += _fills(warehouse)
    if recorded is None or recorded[0] < CURRENT_FORMAT:
        changes.append(Change("warehouse_format", "record format", str(CURRENT_FORMAT)))
    return (recorded[0] if recorded else number), changes


def upgrade(
    warehouse: Warehouse, settings: Settings, *, dry_run: bool = False,
    fault_hook: Callable[[Change], None] | None = None,
) -> UpgradeResult:
    """Bring ``warehouse`` to this release's format (module docstring); idempotent, safe to re-run after a crash.

    Args:
        warehouse: any warehouse written by this project, in any format.
        settings: ``[baseline]`` is read when the cluster state is filled.
        dry_run: only list the changes.
        fault_hook: called before each change is written (tests stop an upgrade there).

    Raises:
        WarehouseMissingError: no warehouse at the location.
        WarehouseTooNewError: written by a later release (nothing is written).
    """
    number, changes = planned_changes(warehouse)
    result = UpgradeResult(number, CURRENT_FORMAT, tuple(changes), dry_run)
    if dry_run:
        return result
    hook = fault_hook or (lambda _change: None)
    for change in changes:
        hook(change)
        if change.kind == "create table":
            warehouse.create_tables([change.table])
        elif change.kind == "add columns":
            names = set(change.detail.split(", "))
            warehouse.add_columns(change.table, [f for f in SCHEMAS[change.table].fields if f.name in names])
        elif change.fill is not None:
            newest = _newest(warehouse)  # as the previous fills left it
            assert newest is not None
            change.fill.make(warehouse, newest, settings)
        else:
            warehouse.create_tables(["warehouse_format"])
            record_format(warehouse, f"upgraded from format {number}")
    return result


def versions_from_history(serving: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """Each partition's version at the newest of the versions in ``serving`` (``affinity_assignment`` rows of
    every committed version), as the kernel counts it (docs/EXCHANGE.md, SPEC 4 "Versions and stamps"): 1 when
    assigned anew, +1 whenever its set of serving nodes or its primary changes; a partition the newest version
    does not assign has none."""
    by_version: dict[tuple[int, int], dict[tuple[str, int], tuple[frozenset[str], str | None]]] = {}
    for r in serving:
        parts = by_version.setdefault((r["topology_major"], r["topology_minor"]), {})
        nodes, primary = parts.get((r["group_name"], r["partition_id"]), (frozenset(), None))
        parts[(r["group_name"], r["partition_id"])] = (
            nodes | {r["node_id"]}, r["node_id"] if r["replica_index"] == 0 else primary)
    counted: dict[tuple[str, int], int] = {}
    before: dict[tuple[str, int], tuple[frozenset[str], str | None]] = {}
    for version in sorted(by_version):
        now = by_version[version]
        counted = {key: counted.get(key, 0) + (before.get(key) != serving_now) for key, serving_now in now.items()}
        before = now
    return counted


def _partition_versions(warehouse: Warehouse, newest: Newest, _settings: Settings) -> None:
    counted = versions_from_history(warehouse.read_arrow("affinity_assignment").to_pylist())
    rows = [{"group_name": g, "partition_id": p, "partition_version": v} for (g, p), v in sorted(counted.items())]
    newest.replace(warehouse, "partition_versions", rows, newest.rows(warehouse, "partition_versions").schema)


def _stamps(warehouse: Warehouse, newest: Newest, _settings: Settings) -> None:
    running = set(newest.row["running_groups"] or [])
    sizes = {g["group_name"]: int(g["partitions"]) for g in warehouse.read_arrow("cache_groups").to_pylist()
             if g["group_name"] in running and g["partitions"] is not None}
    stamps = stamps_of(newest.rows(warehouse, "partition_versions"), sizes)
    newest.replace(warehouse, "partition_stamps", stamps.to_pylist(), newest.rows(warehouse, "partition_stamps").schema)


def _wal_history(warehouse: Warehouse, newest: Newest, _settings: Settings) -> None:
    """Each copy gets the WAL history of its latest consumed report, where the map has none."""
    limit = newest.row["max_report_seq"]
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in warehouse.read_arrow("partition_reports").to_pylist():
        if limit is None or r["report_seq"] is None or r["report_seq"] > limit:
            continue
        key = tuple(r[k] for k in COPY_KEY)
        if key not in latest or r["report_seq"] > latest[key]["report_seq"]:
            latest[key] = r
    copies = newest.rows(warehouse, "partition_map")
    rows = [{k: v for k, v in c.items() if k not in ("topology_major", "topology_minor")} for c in copies.to_pylist()]
    for c in rows:
        report = latest.get(tuple(c[k] for k in COPY_KEY))
        if c["wal_history_counter"] is None and report is not None:
            c["wal_history_counter"] = report["wal_history_counter"]
    newest.replace(warehouse, "partition_map", rows, copies.schema)


def _consumed(warehouse: Warehouse, newest: Newest, settings: Settings) -> None:
    """What a version written before format 3 consumed: its copies' WAL history, then its input versions."""
    _wal_history(warehouse, newest, settings)
    times = {name: warehouse.commit_times(name) for name in INPUT_TABLES if warehouse.exists(name)}
    _merge_row(warehouse, newest, {"input_versions": list(consumed_versions(times, newest.row["started_at"]).items())})


def _cluster_state(warehouse: Warehouse, newest: Newest, settings: Settings) -> None:
    events = [Event(e["event_seq"], e["event_type"], e["node_id"], e["group_name"], e["event_time"])
              for e in warehouse.read_arrow("topology_events").to_pylist()]
    catalog = {n["node_id"]: NodeInfo(int(n["node_order"]), bool(n["is_client"]))
               for n in warehouse.read_arrow("nodes").to_pylist()
               if n["node_id"] is not None and n["node_order"] is not None}
    groups = [g for g in warehouse.read_arrow("cache_groups").column("group_name").to_pylist() if g]
    topology = warehouse.read_arrow("topology").to_pylist()

    def alive_at(version: tuple[int, int]) -> dict[str, NodeInfo]:
        return {t["node_id"]: NodeInfo(int(t["node_order"]), bool(t["is_client"])) for t in topology
                if (t["topology_major"], t["topology_minor"]) == version}

    cluster = replayed_cluster(newest.exchanges, events, alive_at, catalog, groups, settings)
    _merge_row(warehouse, newest, cluster_columns(cluster))


def _merge_row(warehouse: Warehouse, newest: Newest, columns: Mapping[str, Any]) -> None:
    row = {**newest.row, **columns}
    schema = to_arrow_schema(EXCHANGES, timezone="UTC")
    warehouse.merge_arrow("exchanges", pa.Table.from_pylist([row], schema=schema), ["exchange_id"])


def _has_serving_rows(warehouse: Warehouse, newest: Newest) -> bool:
    return newest.rows(warehouse, "affinity_assignment").num_rows > 0


# In the order they are made (the versions before the stamps computed from them). Each is judged on its own mark,
# so a run stopped after any of them resumes with the next.
FILLS = (
    _Fill("partition_versions", "of version {version} from the serving assignments' history",
          lambda wh, n: _has_serving_rows(wh, n) and n.rows(wh, "partition_versions").num_rows == 0,
          _partition_versions),
    _Fill("partition_stamps", "of version {version} from its partition versions",
          lambda wh, n: _has_serving_rows(wh, n) and n.rows(wh, "partition_stamps").num_rows == 0, _stamps),
    # two commits, made again together after a crash between them: the null input_versions marks both undone
    _Fill("partition_map", "wal_history_counter of version {version} from the reports, then exchanges: "
          "input_versions of exchange {exchange} from the input tables' commit times",
          lambda _wh, n: n.row.get("input_versions") is None, _consumed),
    # a newest row written since format 6 always lists its draining nodes, if only as []
    _Fill("exchanges", "the cluster state of exchange {exchange} from its events",
          lambda _wh, n: n.row.get("draining_nodes") is None, _cluster_state),
)


def describe(result: UpgradeResult) -> list[str]:
    """The lines ``rebalancer upgrade`` prints."""
    if not result.changes:
        return [f"the warehouse is already in format {result.to_format}: nothing to do"]
    verb = "would make" if result.dry_run else "made"
    added = "; ".join(f.summary for f in FORMATS[result.from_format:])
    head = f"format {result.from_format} -> {result.to_format} ({added}): {verb} {len(result.changes)} changes"
    return [head, *(f"  {c}" for c in result.changes)]
