"""The engine's operations on a warehouse, shared by the CLI and the spark-submit jobs.

Each operation takes a SparkSession, an open :class:`~rebalancer.storage.Warehouse` and explicit arguments, and
returns plain data the caller may print. Printing, argument parsing and session creation live in the callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.config import Settings
from rebalancer.frames import scalar
from rebalancer.generate import GeneratedCluster, generate_cluster
from rebalancer.storage import Warehouse
from rebalancer.tables import INPUT_TABLES, NODES, OUTPUT_TABLES, SCHEMAS, TOPOLOGY_EVENTS
from rebalancer.validation import EVENT_TYPES, GROUP_EVENTS, NODE_EVENTS, validate_inputs

__all__ = [
    "EventError",
    "append_event",
    "check_event",
    "export_affinity",
    "latest_committed_version",
    "generate_into",
    "load_generated_cluster",
    "validate_warehouse",
]

class EventError(ValueError):
    """An event given on the command line is incomplete or of an unknown type."""


def load_generated_cluster(spark: SparkSession, warehouse: Warehouse, cluster: GeneratedCluster) -> dict[str, int]:
    """Replace the warehouse's contents with a generated cluster.

    Input tables are overwritten with the cluster; output tables are emptied (a new cluster has no exchange
    history). Delta keeps the previous contents as older table versions.

    Returns:
        Rows written per input table.
    """
    created = set(warehouse.create_tables())
    for name, schema in OUTPUT_TABLES.items():
        if name not in created:  # a table created just now is already empty: spare a commit
            warehouse.replace_where(name, spark.createDataFrame([], schema), {})
    counts: dict[str, int] = {}
    for name, df in cluster.as_tables().items():
        warehouse.replace_where(name, df, {})
        counts[name] = warehouse.read(name).count()
    return counts


def generate_into(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    nodes: int,
    groups: int,
    partitions: int,
    backups: int,
    seed: int,
) -> dict[str, int]:
    """Generate a steady cluster (see :mod:`rebalancer.generate`) and load it into ``warehouse``."""
    cluster = generate_cluster(
        spark, nodes, groups, partitions, backups, seed, settings.generate, settings.affinity
    )
    return load_generated_cluster(spark, warehouse, cluster)


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
    if event_type == "NODE_JOINED":
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


def validate_warehouse(warehouse: Warehouse, exchange_id: int | None = None, strict: bool = False) -> DataFrame:
    """Validate the input tables; append bad rows to ``rejected_rows``.

    Returns:
        The rejected rows of this validation (schema of ``rejected_rows``).
    """
    raw = {name: warehouse.read_raw(name) for name in INPUT_TABLES}
    validated = validate_inputs(raw, exchange_id=exchange_id, strict=strict)
    rejected = validated.rejected.select(*[f.name for f in SCHEMAS["rejected_rows"].fields]).cache()
    if rejected.limit(1).count() > 0:
        warehouse.append("rejected_rows", rejected)
    return rejected


def latest_committed_version(warehouse: Warehouse) -> tuple[int, int] | None:
    """The newest committed topology version (the one whose ``exchanges`` row exists), or None."""
    row = (
        warehouse.read("exchanges")
        .orderBy(F.col("topology_major").desc(), F.col("topology_minor").desc())
        .select("topology_major", "topology_minor")
        .limit(1)
        .collect()
    )
    return (int(row[0][0]), int(row[0][1])) if row else None


def export_affinity(warehouse: Warehouse, version: tuple[int, int] | None = None) -> dict[str, object]:
    """The ``rebalancer-routing-v1`` routing document of a committed version (default: the latest).

    Raises:
        LookupError: no exchange has been committed yet, or the version given was never committed.
    """
    from rebalancer.exchange.routing import export_rows_to_json

    latest = latest_committed_version(warehouse)
    if latest is None:
        raise LookupError("no exchange has been committed yet; run `rebalancer exchange` first")
    major, minor = version or latest
    committed = warehouse.read("exchanges").where(
        (F.col("topology_major") == major) & (F.col("topology_minor") == minor)
    )
    if committed.limit(1).count() == 0:
        raise LookupError(f"version {major}.{minor} was never committed; the latest is {latest[0]}.{latest[1]}")
    rows = (
        warehouse.read("client_affinity")
        .where((F.col("topology_major") == major) & (F.col("topology_minor") == minor))
        .collect()
    )
    groups = warehouse.read("cache_groups").select("group_name", "partitions", "affinity", "partitioner").collect()
    return export_rows_to_json(rows, groups, (major, minor))
