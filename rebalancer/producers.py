"""Writing input rows as a cluster's collector would: one topology event, and the node it introduces.

The CLI's ``event`` command and the twin (which fails nodes mid-plan) append events through here, so that both
number them the same way. Only input tables are written; the next exchange decides what the events mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

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
        nodes_df = warehouse.read("nodes")
        known = nodes_df.where(F.col("node_id") == F.lit(node_id)).limit(1).count() > 0
        if not known:
            next_order = scalar(nodes_df.agg(F.coalesce(F.max("node_order"), F.lit(0)))) + 1
            attributes = {"zone": zone} if zone else {}
            node_row = (node_id, None, next_order, host or f"host-{node_id}", attributes, 1.0, is_client)
            warehouse.append("nodes", spark.createDataFrame([node_row], NODES))
            node_added = True
    events_df = warehouse.read("topology_events")
    next_seq = scalar(events_df.agg(F.coalesce(F.max("event_seq"), F.lit(0)))) + 1
    event_time = now or datetime.now(UTC)
    row = (next_seq, event_type, node_id, group_name, event_time)
    warehouse.append("topology_events", spark.createDataFrame([row], TOPOLOGY_EVENTS))
    return AppendedEvent(next_seq, event_type, node_id, group_name, node_added)
