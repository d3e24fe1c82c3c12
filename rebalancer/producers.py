"""Writing input rows as a cluster's collector would: one topology event, and the node it introduces.

The CLI's ``event`` command and the twin (which fails nodes mid-plan) append events through here, so that both
number them the same way. Only input tables are written; the next exchange decides what the events mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer.frames import scalar
from rebalancer.storage import Warehouse
from rebalancer.tables import INPUT_TABLES, NODES, TOPOLOGY_EVENTS
from rebalancer.vocabulary import EVENT_TYPES, GROUP_EVENTS, NODE_EVENTS, NODE_JOINED

__all__ = ["AppendedEvent", "EventError", "append_event", "check_event"]


class EventError(ValueError):
    """An event given on the command line is incomplete or of an unknown type."""


def check_event(event_type: str, node_id: str | None, group_name: str | None) -> str:
    """The event type in upper case, once it is known to be complete.

    Raises:
        EventError: unknown type, or a node event without ``node_id`` / a cache event without ``group_name``.
    """
    event_type = event_type.upper()
    if event_type not in EVENT_TYPES:
        raise EventError(f"unknown event type {event_type!r}; use one of {', '.join(EVENT_TYPES)}")
    if event_type in NODE_EVENTS and not node_id:
        raise EventError(f"{event_type} needs --node ID")
    if event_type in GROUP_EVENTS and not group_name:
        raise EventError(f"{event_type} needs --group NAME")
    return event_type


@dataclass(frozen=True)
class AppendedEvent:
    event_seq: int
    event_type: str
    node_id: str | None
    group_name: str | None
    node_added: bool


def append_event(
    spark: SparkSession,
    warehouse: Warehouse,
    event_type: str,
    node_id: str | None = None,
    group_name: str | None = None,
    host: str | None = None,
    zone: str | None = None,
    is_client: bool = False,
    now: datetime | None = None,
) -> AppendedEvent:
    """Append one topology event with the next ``event_seq``.

    A ``NODE_JOINED`` for a node that ``nodes`` does not know yet also adds the node (next ``node_order``,
    ``host`` defaulting to ``host-<node>``, the given zone, capacity 1.0), as a node describes itself when it joins.

    Raises:
        EventError: unknown type, or a node event without ``node_id`` / a cache event without ``group_name``.
    """
    event_type = check_event(event_type, node_id, group_name)
    warehouse.create_tables(list(INPUT_TABLES))
    node_added = False
    if event_type == NODE_JOINED:
        nodes = _rows(warehouse, "nodes")
        if not _knows_node(nodes, str(node_id)):
            attributes = {"zone": zone} if zone else {}
            node_row = (node_id, None, _next(nodes, "node_order"), host or f"host-{node_id}", attributes, 1.0,
                        is_client)
            warehouse.append_arrow("nodes", _arrow_row(node_row, NODES))
            node_added = True
    next_seq = _next(_rows(warehouse, "topology_events"), "event_seq")
    row = (next_seq, event_type, node_id, group_name, now or datetime.now(UTC))
    warehouse.append_arrow("topology_events", _arrow_row(row, TOPOLOGY_EVENTS))
    return AppendedEvent(next_seq, event_type, node_id, group_name, node_added)


def _rows(warehouse: Warehouse, name: str) -> pa.Table | DataFrame:
    """Table ``name`` as Arrow where the warehouse reads on the driver (no Spark job: an event from the CLI took
    0.5 s of jobs), else as a frame: through Delta (catalog tables) it may be large, and Spark aggregates it."""
    return warehouse.read_arrow(name) if warehouse.reads_on_driver else warehouse.read(name)


def _knows_node(nodes: pa.Table | DataFrame, node_id: str) -> bool:
    if isinstance(nodes, pa.Table):
        return node_id in set(nodes.column("node_id").to_pylist())
    return nodes.where(F.col("node_id") == F.lit(node_id)).limit(1).count() > 0


def _next(rows: pa.Table | DataFrame, column: str) -> int:
    """One more than the largest ``column`` of ``rows`` (1 when there are none)."""
    if isinstance(rows, pa.Table):
        return int(pc.max(rows.column(column)).as_py() or 0) + 1
    return int(scalar(rows.agg(F.coalesce(F.max(column), F.lit(0))))) + 1


def _arrow_row(row: tuple[Any, ...], schema: StructType) -> pa.Table:
    arrow = to_arrow_schema(schema, timezone="UTC")
    return pa.Table.from_pylist([dict(zip(arrow.names, row, strict=True))], schema=arrow)
