"""Full map stage: the previous version's map on alive servers, overridden by the reports newer than it.

Contract (SPEC 4 "Full map"): a copy is one ``(group_name, partition_id, node_id)``. The base map of an exchange is
the previous committed map restricted to alive server nodes, with every copy that has a report newer than the
previous version's ``max_report_seq`` replaced by its latest such report (only reports of alive servers count).
EVICTED copies leave the map, and only partitions of running groups (``0 <= partition_id < partitions``) stay.
The exchange's own decisions (resets, LOST marks, recreated and MOVING copies) are applied by the later stages.

This module also holds what every exchange stage shares: state names, the stage schemas (a SPEC table's columns
without the version columns), input checks and the final column conformance.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from rebalancer.tables import VERSION_COLUMNS, schema_of

__all__ = [
    "EVICTED",
    "LOST",
    "MAP_SCHEMA",
    "MOVING",
    "OWNING",
    "PARTITION_KEY",
    "COPY_KEY",
    "RENTING",
    "REPORT_SCHEMA",
    "StageInputError",
    "alive_servers",
    "base_map",
    "conform",
    "latest_reports",
    "require_columns",
    "stage_schema",
]

OWNING, MOVING, RENTING, EVICTED, LOST = "OWNING", "MOVING", "RENTING", "EVICTED", "LOST"
PARTITION_KEY = ("group_name", "partition_id")
COPY_KEY = ("group_name", "partition_id", "node_id")


class StageInputError(ValueError):
    """A stage received a DataFrame without the columns it needs; the message lists expected and received."""


def stage_schema(table_name: str) -> StructType:
    """The schema of SPEC output table ``table_name`` without ``topology_major``/``topology_minor``."""
    return StructType([f for f in schema_of(table_name).fields if f.name not in VERSION_COLUMNS])


MAP_SCHEMA = StructType([f for f in stage_schema("partition_map").fields if f.name != "wal_history_counter"])
REPORT_SCHEMA = schema_of("partition_reports")


def require_columns(df: DataFrame, columns: Iterable[str], *, stage: str, argument: str) -> None:
    """Check that ``df`` has ``columns`` (schema only, no Spark job).

    Raises:
        StageInputError: some columns are missing; the message names the stage, the argument, what was expected
            and what arrived.
    """
    wanted = list(columns)
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise StageInputError(
            f"{stage}: {argument} lacks columns {missing}; expected at least {wanted}, got {df.columns}"
        )


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select exactly ``schema``'s columns, in order, cast to its types."""
    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def alive_servers(alive_nodes_df: DataFrame) -> DataFrame:
    """Distinct ``node_id`` of alive server nodes (``is_client`` null counts as a server).

    Args:
        alive_nodes_df: the alive nodes of the version (``node_id``, ``is_client``).

    Returns:
        One column ``node_id``.
    """
    require_columns(alive_nodes_df, ["node_id", "is_client"], stage="alive_servers", argument="alive_nodes_df")
    return alive_nodes_df.where(~F.coalesce(F.col("is_client"), F.lit(False))).select("node_id").distinct()


def _latest_first() -> list[Column]:
    # report_seq decides; the rest only makes duplicate seqs (rejected by validation) deterministic.
    return [
        F.col("report_seq").desc_nulls_last(),
        F.col("update_counter").desc_nulls_last(),
        F.col("size").desc_nulls_last(),
        F.col("bytes").desc_nulls_last(),
        F.col("state").asc_nulls_last(),
    ]


def latest_reports(reports_df: DataFrame) -> DataFrame:
    """The latest report of every copy, all report columns (including ``wal_history_counter``).

    The latest is the highest ``report_seq``; equal seqs for one copy are broken by the higher ``update_counter``,
    then larger ``size``, larger ``bytes``, then state name.

    Args:
        reports_df: ``partition_reports`` rows (extra columns are dropped).

    Returns:
        ``REPORT_SCHEMA`` rows, one per ``(group_name, partition_id, node_id)``.
    """
    require_columns(reports_df, REPORT_SCHEMA.fieldNames(), stage="latest_reports", argument="reports_df")
    w = Window.partitionBy(*COPY_KEY).orderBy(*_latest_first())
    latest = reports_df.withColumn("_rn", F.row_number().over(w)).where(F.col("_rn") == 1)
    return conform(latest, REPORT_SCHEMA)


def base_map(
    prev_map_df: DataFrame,
    reports_df: DataFrame,
    alive_nodes_df: DataFrame,
    groups_df: DataFrame,
    prev_max_report_seq: int | None,
) -> DataFrame:
    """The map an exchange starts from: previous map on alive servers, overridden by newer reports.

    Args:
        prev_map_df: the previous committed ``partition_map`` without version columns (empty for the first
            exchange).
        reports_df: all ``partition_reports`` rows.
        alive_nodes_df: the alive nodes of this version (``node_id``, ``is_client``).
        groups_df: the running groups (``group_name``, ``partitions``); stopped groups' copies are dropped, and so
            are copies with ``partition_id`` outside ``0 .. partitions-1``.
        prev_max_report_seq: the previous version's ``max_report_seq``; only reports with a greater
            ``report_seq`` are applied. ``None`` applies every report.

    Returns:
        ``MAP_SCHEMA`` rows, one per copy, without EVICTED copies.
    """
    require_columns(prev_map_df, MAP_SCHEMA.fieldNames(), stage="base_map", argument="prev_map_df")
    require_columns(groups_df, ["group_name", "partitions"], stage="base_map", argument="groups_df")
    servers_df = alive_servers(alive_nodes_df)
    new_reports_df = reports_df
    if prev_max_report_seq is not None:
        new_reports_df = reports_df.where(F.col("report_seq") > F.lit(prev_max_report_seq))
    # Previous copies and new reports in one union, then one window: the newest report of a copy wins, a copy
    # without a new report keeps its previous row (each input is referenced once).
    reported_df = new_reports_df.join(servers_df, "node_id", "left_semi").select(
        *MAP_SCHEMA.fieldNames(), "report_seq", F.lit(0).alias("_source")
    )
    kept_df = (
        conform(prev_map_df, MAP_SCHEMA)
        .join(servers_df, "node_id", "left_semi")
        .select(*MAP_SCHEMA.fieldNames(), F.lit(None).cast("long").alias("report_seq"), F.lit(1).alias("_source"))
    )
    newest = Window.partitionBy(*COPY_KEY).orderBy(F.col("_source"), *_latest_first())
    running_df = groups_df.select("group_name", "partitions")
    merged_df = (
        reported_df.unionByName(kept_df)
        .withColumn("_rn", F.row_number().over(newest))
        .where((F.col("_rn") == 1) & (F.col("state") != EVICTED))
        .join(running_df, "group_name")
        .where((F.col("partition_id") >= 0) & (F.col("partition_id") < F.col("partitions")))
    )
    return conform(merged_df, MAP_SCHEMA)
