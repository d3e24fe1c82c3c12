"""One way to collect, two systems: what a collector's rows are compared with, and how they are written (SPEC 6).

A collector (:mod:`rebalancer.kafka.collect`, :mod:`rebalancer.ignite.collect`) turns a snapshot of a live cluster
into the rows of the input tables that differ from what the warehouse already says. This module holds the part
that does not depend on the system:

Contract:
    - :func:`stored_of` / :func:`read_stored`: what the input tables say about the cluster (:class:`Stored`): its
      nodes and groups, the alive and draining nodes and the running groups their events leave, whether the
      cluster was last activated or deactivated, and the latest report per copy.
    - :func:`differs`: whether a stored row and a desired row differ on some columns (maps and arrays compared
      as values, whichever way Arrow returned them).
    - :func:`write`: appends a :class:`Collected` in the order a reader needs (nodes and groups, then events, then
      reports): nodes and groups are upserted on their key (one row per node and group, kept current), events and
      reports appended, the extra columns of :data:`rebalancer.tables.COLLECTED_COLUMNS` added first. A collect
      killed between two commits is finished by the next one, which sees what was written.
    - :func:`record_rejections`: appends rejected rows not recorded yet (a bad row is recorded once), for the
      exchange and for a collector that skips what it cannot model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer.storage import Warehouse
from rebalancer.tables import COLLECTED_COLUMNS, INPUT_TABLES
from rebalancer.vocabulary import (
    CACHE_STARTED,
    CACHE_STOPPED,
    CLUSTER_ACTIVATED,
    CLUSTER_DEACTIVATED,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_JOINED,
    NODE_LEFT,
)

__all__ = ["Collected", "Stored", "differs", "read_stored", "record_rejections", "stored_of", "write"]

# Tables whose row for a node or group is replaced when it changes, on their key; events and reports are appended.
UPSERTED = {"nodes": "node_id", "cache_groups": "group_name"}
WRITE_ORDER = ("nodes", "cache_groups", "topology_events", "partition_reports")


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
    active: bool | None = None  # the last CLUSTER_ACTIVATED / CLUSTER_DEACTIVATED, None without either


@dataclass(frozen=True)
class Collected:
    """Rows to write, per input table, each a list of dicts with that table's columns."""

    nodes: list[dict[str, Any]]
    cache_groups: list[dict[str, Any]]
    topology_events: list[dict[str, Any]]
    partition_reports: list[dict[str, Any]]

    @property
    def empty(self) -> bool:
        return not (self.nodes or self.cache_groups or self.topology_events or self.partition_reports)


def differs(known: Mapping[str, Any] | None, row: Mapping[str, Any], keys: Sequence[str] | None = None) -> bool:
    """True when ``known`` is None or differs from ``row`` on ``keys`` (default: every key of ``row``)."""
    if known is None:
        return True
    return any(_norm(known.get(k)) != _norm(row.get(k)) for k in (keys or row))


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list):  # a map read back from Arrow is a list of pairs; an array a list of values
        return tuple(sorted(value)) if value and isinstance(value[0], tuple) else tuple(value)
    return value


def stored_of(nodes: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]],
              events: Sequence[Mapping[str, Any]], reports: Sequence[Mapping[str, Any]]) -> Stored:
    """What rows of the four input tables say about the cluster: its nodes and groups, the alive and draining
    nodes, the running groups and the activation their events leave (in ``event_seq`` order), and the latest
    report per copy."""
    alive: set[str] = set()
    draining: set[str] = set()
    started: set[str] = set()
    stopped: set[str] = set()
    active: bool | None = None
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
        elif kind in (CLUSTER_ACTIVATED, CLUSTER_DEACTIVATED):
            active = kind == CLUSTER_ACTIVATED
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
        reports=latest, max_report_seq=max((r["report_seq"] or 0 for r in reports), default=0), active=active)


def read_stored(warehouse: Warehouse) -> Stored:
    """:func:`stored_of` the warehouse's input tables as they are now (creating the missing ones). The reports are
    reduced to the latest per copy in Spark (one job): the table keeps every collect's changes. Nodes and reports
    come with the collectors' extra columns (:data:`rebalancer.tables.COLLECTED_COLUMNS`)."""
    warehouse.create_tables(list(INPUT_TABLES))
    return stored_of(warehouse.read_stored_arrow("nodes").to_pylist(),
                     warehouse.read_arrow("cache_groups").to_pylist(),
                     warehouse.read_arrow("topology_events").to_pylist(), warehouse.latest_reports().to_pylist())


def write(warehouse: Warehouse, rows: Collected) -> dict[str, int]:
    """Write ``rows``, nodes and groups (upserted) before events before reports (appended).

    Returns:
        The rows written per table.
    """
    written = {}
    for name in WRITE_ORDER:
        batch = getattr(rows, name)
        written[name] = len(batch)
        if not batch:
            continue
        extra = COLLECTED_COLUMNS.get(name, ())
        if extra:
            warehouse.add_columns(name, extra)
        schema = to_arrow_schema(StructType([*INPUT_TABLES[name].fields, *extra]), timezone="UTC")
        table = pa.Table.from_pylist(batch, schema=schema)
        if name in UPSERTED:
            warehouse.merge_arrow(name, table, [UPSERTED[name]])
        else:
            warehouse.append_arrow(name, table)
    return written


def record_rejections(warehouse: Warehouse, rejected: pa.Table) -> int:
    """Append the rejected rows not recorded yet (a bad row is recorded once, by the first run that saw it).

    Returns:
        How many rows were appended.
    """
    if rejected.num_rows == 0:
        return 0
    existing = warehouse.read_arrow("rejected_rows").select(["table_name", "row_json", "reason"]).to_pylist()
    seen = {(r["table_name"], r["row_json"], r["reason"]) for r in existing}
    fresh = []
    for r in rejected.to_pylist():
        key = (r["table_name"], r["row_json"], r["reason"])
        if key not in seen:
            seen.add(key)
            fresh.append(r)
    if fresh:
        warehouse.append_arrow("rejected_rows", pa.Table.from_pylist(fresh, schema=rejected.schema))
    return len(fresh)
