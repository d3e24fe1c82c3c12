"""The table contract of SPEC.md sections 2 and 3: every table's schema, declared once.

Input tables may carry extra columns (ignored); output tables are written only by the engine with exactly these
columns. Storage creates tables from these constants, validation checks input against them, and each stage
declares its output as one of them.
"""

from __future__ import annotations

import re

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "COLLECTED_COLUMNS",
    "INPUT_TABLES",
    "IN_BASELINE",
    "IS_PRIMARY",
    "METADATA_TABLES",
    "OUTPUT_TABLES",
    "REPLICA_INDEX",
    "SCHEMAS",
    "VERSION_COLUMNS",
    "WAREHOUSE_FORMAT",
    "named_in",
    "schema_of",
    "version_where",
]


def _schema(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, dtype, nullable=True) for name, dtype in fields])


S, INT, L, D, B, T = StringType(), IntegerType(), LongType(), DoubleType(), BooleanType(), TimestampType()
VERSION_COLUMNS = ("topology_major", "topology_minor")


def version_where(version: tuple[int, int]) -> dict[str, int]:
    """The ``where`` of one topology version's rows in a versioned table (``Warehouse.read(..., where=)``)."""
    return dict(zip(VERSION_COLUMNS, version, strict=True))

_VERSION = (("topology_major", L), ("topology_minor", INT))

# ---- input tables (SPEC section 2) ----
CACHE_GROUPS = _schema(
    ("group_name", S),
    ("partitions", INT),
    ("backups", INT),
    ("mode", S),
    ("affinity", S),
    ("exclude_neighbors", B),
    ("backup_filter", ArrayType(S)),
    ("loss_policy", S),
    ("persistent", B),
    ("partitioner", S),
)
NODES = _schema(
    ("node_id", S),
    ("node_uuid", S),
    ("node_order", L),
    ("host", S),
    ("attributes", MapType(S, S)),
    ("capacity", D),
    ("is_client", B),
)
TOPOLOGY_EVENTS = _schema(
    ("event_seq", L),
    ("event_type", S),
    ("node_id", S),
    ("group_name", S),
    ("event_time", T),
)
PARTITION_REPORTS = _schema(
    ("node_id", S),
    ("group_name", S),
    ("partition_id", INT),
    ("state", S),
    ("update_counter", L),
    ("size", L),
    ("bytes", L),
    ("wal_history_counter", L),
    ("report_seq", L),
)

# ---- output tables (SPEC section 3) ----
EXCHANGES = _schema(
    ("exchange_id", L),
    *_VERSION,
    ("exchange_type", S),
    ("merged_event_seqs", ArrayType(L)),
    ("coordinator", S),
    ("max_report_seq", L),
    ("started_at", T),
    ("finished_at", T),
    # the team's design (docs/DESIGN.md): the running groups, which the next exchange starts from, and a summary
    ("running_groups", ArrayType(S)),
    ("alive_servers", INT),
    ("alive_clients", INT),
    ("partitions", L),
    ("lost_partitions", L),
    ("moving_copies", L),
    ("temporary_primaries", L),
    ("counter_conflicts", L),
    ("migrations", L),
    ("bytes_to_move", L),
    ("makespan_s", D),
    ("makespan_lower_bound_s", D),
    # per input table, the Delta version this exchange consumed: the next one reads only what came after it
    ("input_versions", MapType(S, L)),
    # how the exchange ran: wall seconds per stage, the Spark jobs it started and those per stage (null on Spark
    # Connect); the commit stage writes this row, so it is missing from both maps
    ("stage_seconds", MapType(S, D)),
    ("spark_jobs", INT),
    ("stage_jobs", MapType(S, INT)),
    # the cluster state the next exchange starts from (docs/EXCHANGE.md "Baseline, activation, drain"): the
    # baseline nodes (null before it is set), whether the cluster is active (null: no activation event yet, active),
    # the draining servers, and the time of
    # the newest node event with whether the baseline still has to follow it (auto-adjust timeout)
    ("baseline_nodes", ArrayType(S)),
    ("cluster_active", B),
    ("draining_nodes", ArrayType(S)),
    ("last_node_event_at", T),
    ("baseline_adjust_due", B),
)
TOPOLOGY = _schema(*_VERSION, ("node_id", S), ("node_order", L), ("is_client", B))
IDEAL_ASSIGNMENT = _schema(
    *_VERSION, ("group_name", S), ("partition_id", INT), ("replica_index", INT), ("node_id", S)
)
AFFINITY_ASSIGNMENT = _schema(
    *_VERSION,
    ("group_name", S),
    ("partition_id", INT),
    ("replica_index", INT),
    ("node_id", S),
    ("is_temporary", B),
)
PARTITION_MAP = _schema(
    *_VERSION,
    ("group_name", S),
    ("partition_id", INT),
    ("node_id", S),
    ("state", S),
    ("update_counter", L),
    ("size", L),
    ("bytes", L),
    # beyond SPEC: the WAL history of the report the copy was last updated from (the supplier's HISTORICAL test)
    ("wal_history_counter", L),
)
COUNTER_CONFLICTS = _schema(
    *_VERSION,
    ("group_name", S),
    ("partition_id", INT),
    ("node_id", S),
    ("update_counter", L),
    ("max_update_counter", L),
    ("size", L),
    ("action", S),
)
LOST_PARTITIONS = _schema(
    *_VERSION,
    ("group_name", S),
    ("partition_id", INT),
    ("loss_policy", S),
    ("read_allowed", B),
    ("write_allowed", B),
)
MIGRATION_PLAN = _schema(
    *_VERSION,
    ("migration_id", L),
    ("group_name", S),
    ("partition_id", INT),
    ("step", INT),
    ("action", S),
    ("source_node", S),
    ("target_node", S),
    ("rebalance_mode", S),
    ("from_counter", L),
    ("to_counter", L),
    ("bytes", L),
    ("wave", INT),
    ("est_start_s", D),
    ("est_end_s", D),
    # beyond SPEC: how a COPY moves its data (entries | files) and, for files, how many page-aligned chunks
    ("transfer", S),
    ("chunks", INT),
    # beyond SPEC, what the scheduler decided from: every owner that could supply a COPY, the serving primary,
    # the partition's OWNING copies when planned and its ideal copy count (a committed plan can be re-scheduled)
    ("candidates", ArrayType(S)),
    ("primary_node", S),
    ("owners", INT),
    ("replicas", INT),
)
PARTITION_VERSIONS = _schema(
    *_VERSION, ("group_name", S), ("partition_id", INT), ("partition_version", L)
)
PARTITION_STAMPS = _schema(*_VERSION, ("group_name", S), ("stamp", L))
CLIENT_AFFINITY = _schema(
    *_VERSION,
    ("mapping_id", INT),
    ("group_names", ArrayType(S)),
    ("partition_id", INT),
    ("primary_node", S),
    ("backup_nodes", ArrayType(S)),
)
REJECTED_ROWS = _schema(("table_name", S), ("row_json", S), ("reason", S), ("exchange_id", L))
WHAT_IF = _schema(
    ("run_id", S),
    ("base_major", L),
    ("base_minor", INT),
    ("scenario", S),
    ("lost_partitions", L),
    ("partitions_without_backup", L),
    ("copies", L),
    ("bytes_to_move", L),
    ("makespan_s", D),
    ("makespan_lower_bound_s", D),
    ("max_replicas_per_node", L),
    ("mean_replicas_per_node", D),
    # beyond SPEC: which sweep made the scenario ("node node3", "host host1", "zone a", "custom"), the lost
    # partitions by loss policy, how many partitions it recomputed, and when the run started
    ("label", S),
    ("lost_by_policy", MapType(S, L)),
    ("recomputed_partitions", L),
    ("created_at", T),
)

# Extra columns of input tables that collectors of live clusters write (SPEC section 2 allows extra columns;
# docs/KAFKA.md): a partition_reports copy's place in its cluster's own replica list, 0 = the preferred primary (as
# ideal_assignment's replica_index). The first exchange of a collected cluster adopts the placement they give.
REPLICA_INDEX = "replica_index"
# ... and whether the copy serves as its partition's primary there and then (the Ignite collector: the primary its
# partition states show), so that a collected map can be read beside the engine's serving assignment.
IS_PRIMARY = "is_primary"
# ... and whether a node is in its cluster's baseline (Ignite: SYS.BASELINE_NODES), so that the next collect sees a
# baseline change.
IN_BASELINE = "in_baseline"
COLLECTED_COLUMNS: dict[str, tuple[StructField, ...]] = {
    "nodes": (StructField(IN_BASELINE, B),),
    "partition_reports": (StructField(REPLICA_INDEX, INT), StructField(IS_PRIMARY, B)),
}

INPUT_TABLES: dict[str, StructType] = {
    "cache_groups": CACHE_GROUPS,
    "nodes": NODES,
    "topology_events": TOPOLOGY_EVENTS,
    "partition_reports": PARTITION_REPORTS,
}
OUTPUT_TABLES: dict[str, StructType] = {
    "exchanges": EXCHANGES,
    "topology": TOPOLOGY,
    "ideal_assignment": IDEAL_ASSIGNMENT,
    "affinity_assignment": AFFINITY_ASSIGNMENT,
    "partition_map": PARTITION_MAP,
    "counter_conflicts": COUNTER_CONFLICTS,
    "lost_partitions": LOST_PARTITIONS,
    "migration_plan": MIGRATION_PLAN,
    "partition_versions": PARTITION_VERSIONS,
    "partition_stamps": PARTITION_STAMPS,
    "client_affinity": CLIENT_AFFINITY,
    "rejected_rows": REJECTED_ROWS,
    "what_if": WHAT_IF,
}
# The warehouse's own record (docs/STORAGE.md "Formats"): one row per creation or upgrade, the newest format wins.
# Neither input nor output: `generate` and retention leave it alone.
WAREHOUSE_FORMAT = _schema(("format", INT), ("release", S), ("written_at", T), ("note", S))
METADATA_TABLES: dict[str, StructType] = {"warehouse_format": WAREHOUSE_FORMAT}
SCHEMAS: dict[str, StructType] = {**INPUT_TABLES, **OUTPUT_TABLES, **METADATA_TABLES}


def schema_of(name: str) -> StructType:
    """The declared schema of table ``name``.

    Raises:
        KeyError: ``name`` is not a table of the contract (the message lists the known tables).
    """
    try:
        return SCHEMAS[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known tables: {', '.join(sorted(SCHEMAS))}") from None


def named_in(query: str) -> list[str] | None:
    """The tables of the contract a SQL text names, as whole words in any case (a name inside a string literal or
    a comment counts too: a view too many costs little, a view too few fails the query). None for a ``SHOW``
    statement (``SHOW TABLES`` lists every view): all of them."""
    if re.match(r"\s*show\b", query, re.IGNORECASE):
        return None
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", query)}
    return [name for name in SCHEMAS if name in words]
