"""Rebalance demands stage: which ideal nodes need data, from whom, and how (SPEC 4 "Rebalance mode").

:func:`add_moving_targets` completes the map: every ideal node without a copy gets a MOVING row (counter, size,
bytes 0), and a RENTING copy on an ideal node is taken back as an empty MOVING copy (its eviction may have
removed part of its data, so it is refilled in full; Ignite likewise cancels the renting and moves it back to
MOVING).

:func:`rebalance_demands` turns the map into ``COPY`` rows of ``migration_plan``:

* A *demand* is an ideal node without an OWNING copy of a partition that has at least one OWNING copy (a lost
  partition without owners has no demand). Its counter c is its MOVING copy's ``update_counter``, else 0.
* The *candidates* are the owners with the partition's maximum counter M. A candidate is *eligible* for historical
  rebalance when ``0 < c < M``, its latest report's ``wal_history_counter`` is not null and ``<= c``, its ``size``
  exceeds ``history_threshold`` and ``M - c < size``. With an eligible candidate the demand is ``HISTORICAL``
  (from_counter c) and the supplier is chosen among the eligible ones; otherwise it is ``FULL`` (from_counter 0)
  and chosen among all candidates. to_counter is M.
* Supplier choice (deterministic, spread): the pool is sorted by ``node_id``; demands sharing the same pool are
  numbered 1, 2, ... in ``(group_name, partition_id, target_node)`` order, and demand number n takes pool member
  ``(n - 1 + p0) mod k`` (0-based), where k is the pool size and p0 the smallest ``partition_id`` among those
  demands. Demands with one pool are thus spread round-robin, each member supplying ``floor`` or ``ceil`` of
  ``count / k`` of them; the p0 offset rotates the start so that small pools do not all start at the lowest
  ``node_id``. Balance across different pools (a node in many pools) is not optimised.
* bytes: ``FULL`` moves the supplier's ``bytes``; ``HISTORICAL`` replays ``M - c`` updates of about
  ``bytes / size`` each: ``max(1, ceil(bytes * (M - c) / size))`` (size > threshold >= 0, so size >= 1).
* step: 1-based inside the partition, by the target's ideal ``replica_index``. migration_id: 1..n over the whole
  result in ``(group_name, partition_id, step)`` order, computed from per-partition counts (no single-task window
  over all rows). wave, est_start_s, est_end_s are null (the planner fills them).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from rebalancer.exchange.fullmap import (
    COPY_KEY,
    MAP_SCHEMA,
    MOVING,
    OWNING,
    PARTITION_KEY,
    RENTING,
    REPORT_SCHEMA,
    conform,
    latest_reports,
    require_columns,
    stage_schema,
)

__all__ = ["COPY", "DEMANDS_SCHEMA", "FULL", "HISTORICAL", "add_moving_targets", "copy_steps", "partition_offsets",
           "rebalance_demands"]

COPY, HISTORICAL, FULL = "COPY", "HISTORICAL", "FULL"
DEMANDS_SCHEMA = stage_schema("migration_plan")

_IDEAL_COLUMNS = ["group_name", "partition_id", "replica_index", "node_id"]


def add_moving_targets(map_df: DataFrame, ideal_df: DataFrame) -> DataFrame:
    """``map_df`` plus a MOVING row for every ideal node without a copy; RENTING copies on ideal nodes restart.

    Args:
        map_df: the map after loss decisions and :func:`rebalancer.exchange.late_affinity.surplus_to_renting`.
        ideal_df: this version's ideal assignment.

    Returns:
        ``MAP_SCHEMA`` rows: ``map_df``'s copies (a RENTING copy on an ideal node becomes MOVING with counter, size
        and bytes 0) and a MOVING row with counter, size and bytes 0 for each ideal node that had no copy.
    """
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="add_moving_targets", argument="map_df")
    require_columns(ideal_df, _IDEAL_COLUMNS, stage="add_moving_targets", argument="ideal_df")
    key = list(COPY_KEY)
    zero = F.lit(0).cast("long")
    # One full outer join (map_df referenced once): copies, ideal slots, or both.
    slots_df = map_df.withColumn("_copy", F.lit(True)).join(
        ideal_df.select(*key).distinct().withColumn("_ideal", F.lit(True)), key, "full"
    )
    is_copy = F.coalesce(F.col("_copy"), F.lit(False))
    refill = F.coalesce(F.col("_ideal"), F.lit(False)) & (~is_copy | (F.col("state") == RENTING))
    out_df = slots_df.select(
        *key,
        F.when(refill, F.lit(MOVING)).otherwise(F.col("state")).alias("state"),
        *[F.when(refill, zero).otherwise(F.col(c)).alias(c) for c in ("update_counter", "size", "bytes")],
    )
    return conform(out_df, MAP_SCHEMA)


def rebalance_demands(
    ideal_df: DataFrame, map_df: DataFrame, reports_df: DataFrame, history_threshold: int
) -> DataFrame:
    """The COPY rows every ideal node without an OWNING copy needs, with ``migration_id`` (module docstring).

    Same arguments as :func:`copy_steps`.

    Returns:
        ``DEMANDS_SCHEMA`` rows (``migration_plan`` without version columns), ``action`` ``COPY``.
    """
    rows_df = copy_steps(ideal_df, map_df, reports_df, history_threshold)
    out_df = rows_df.join(partition_offsets(rows_df), list(PARTITION_KEY)).withColumn(
        "migration_id", F.col("_offset") + F.col("step")
    )
    for name in ("wave", "est_start_s", "est_end_s", "transfer", "chunks"):
        out_df = out_df.withColumn(name, F.lit(None))
    return conform(out_df, DEMANDS_SCHEMA)


def copy_steps(
    ideal_df: DataFrame, map_df: DataFrame, reports_df: DataFrame, history_threshold: int
) -> DataFrame:
    """The COPY steps every ideal node without an OWNING copy needs, with every usable supplier.

    Args:
        ideal_df: this version's ideal assignment (``group_name, partition_id, replica_index, node_id``).
        map_df: this version's final map (after :func:`add_moving_targets`; any map after the loss decisions works).
        reports_df: ``partition_reports`` rows, all of them or only each copy's latest (``fullmap.latest_reports``):
            suppliers' ``wal_history_counter`` comes from their copy's latest report.
        history_threshold: ``rebalance.history_threshold``: a supplier copy must hold more entries than this for
            historical rebalance.

    Returns:
        ``group_name, partition_id, step, action, source_node, target_node, rebalance_mode, from_counter,
        to_counter, bytes`` and ``candidates array<string>``: the supplier pool the source was chosen from (every
        owner eligible for the step's mode, by ``node_id``), so a scheduler may pick another member.
    """
    require_columns(ideal_df, _IDEAL_COLUMNS, stage="rebalance_demands", argument="ideal_df")
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="rebalance_demands", argument="map_df")
    require_columns(reports_df, REPORT_SCHEMA.fieldNames(), stage="rebalance_demands", argument="reports_df")
    part, key = list(PARTITION_KEY), list(COPY_KEY)
    owning = F.coalesce(F.col("state") == OWNING, F.lit(False))
    part_w = Window.partitionBy(*part)
    # Every copy and ideal slot (map_df referenced once) with M = the partition's maximum OWNING counter, kept only
    # for partitions with a demand (an ideal slot without an OWNING copy) and an owner to copy from: the supplier
    # pools below (a sort per partition, a join with the reports) are then built for those few partitions, not
    # for every partition of the map.
    slots_df = (
        map_df.join(ideal_df.select(*key, "replica_index").withColumn("_ideal", F.lit(True)), key, "full")
        .withColumn("_ideal", F.coalesce(F.col("_ideal"), F.lit(False)))
        .withColumn("_to", F.max(F.when(owning, F.col("update_counter"))).over(part_w))
        .withColumn("_demand", F.max(F.col("_ideal") & ~owning).over(part_w))
        .where(F.col("_demand") & F.col("_to").isNotNull())
    )
    # The suppliers' latest reports, taken for demand partitions only (latest_reports' window over every report
    # of a large cluster cost more than the rest of the plan).
    supplier_reports_df = latest_reports(
        reports_df.join(F.broadcast(slots_df.select(*part).distinct()), part, "left_semi")
    ).select(*key, "wal_history_counter")
    # One row per demand partition: its candidates sorted by node_id (the first struct field).
    pools_df = (
        slots_df.where(owning & (F.col("update_counter") == F.col("_to")))
        .join(supplier_reports_df, key, "left")
        .groupBy(*part)
        .agg(F.sort_array(F.collect_list(F.struct("node_id", "size", "bytes", "wal_history_counter"))).alias("_all"))
    )
    c, m = F.col("_c"), F.col("_to")

    def eligible(x: Column) -> Column:
        return (
            (c > 0)
            & (c < m)
            & x["wal_history_counter"].isNotNull()
            & (x["wal_history_counter"] <= c)
            & (x["size"] > F.lit(history_threshold))
            & ((m - c) < x["size"])
        )

    demands_df = (
        slots_df.where(F.col("_ideal") & m.isNotNull() & ~owning)
        .withColumn(
            "_c",
            F.when(F.col("state") == MOVING, F.col("update_counter")).otherwise(F.lit(0).cast("long")),
        )
        .join(pools_df, part)
        .withColumn("_eligible", F.filter("_all", eligible))
        .withColumn("_historical", F.size("_eligible") > 0)
        .withColumn("_pool", F.when(F.col("_historical"), F.col("_eligible")).otherwise(F.col("_all")))
        .withColumn("_class", F.transform("_pool", lambda x: x["node_id"]))
    )
    by_class = Window.partitionBy("_class")
    supplier = F.element_at(
        "_pool",
        (F.pmod(F.col("_ordinal") - 1 + F.col("_p0"), F.size("_pool")) + 1).cast("int"),
    )
    chosen_df = (
        demands_df.withColumn("_ordinal", F.row_number().over(by_class.orderBy(*part, "node_id")))
        .withColumn("_p0", F.min("partition_id").over(by_class))
        .withColumn("_supplier", supplier)
        .withColumn("step", F.row_number().over(Window.partitionBy(*part).orderBy("replica_index", "node_id")))
    )
    historical = F.col("_historical")
    sup = F.col("_supplier")
    replay_bytes = F.greatest(
        F.lit(1).cast("long"),
        F.ceil(sup["bytes"].cast("double") * (m - c).cast("double") / sup["size"].cast("double")).cast("long"),
    )
    rows_df = chosen_df.select(
        *part,
        "step",
        F.lit(COPY).alias("action"),
        sup["node_id"].alias("source_node"),
        F.col("node_id").alias("target_node"),
        F.when(historical, F.lit(HISTORICAL)).otherwise(F.lit(FULL)).alias("rebalance_mode"),
        F.when(historical, c).otherwise(F.lit(0).cast("long")).alias("from_counter"),
        m.alias("to_counter"),
        F.when(historical, replay_bytes).otherwise(sup["bytes"]).alias("bytes"),
        F.col("_class").alias("candidates"),
    )
    return rows_df


def partition_offsets(rows_df: DataFrame) -> DataFrame:
    """Per partition, how many rows come before it in ``(group_name, partition_id)`` order (``_offset``).

    The rows are first counted per partition; only those narrow count rows (one per partition with demands) go
    through the global running-sum window.
    """
    before = Window.orderBy(*PARTITION_KEY).rowsBetween(Window.unboundedPreceding, -1)
    return (
        rows_df.groupBy(*PARTITION_KEY)
        .agg(F.count(F.lit(1)).alias("_n"))
        .select(*PARTITION_KEY, F.coalesce(F.sum("_n").over(before), F.lit(0)).cast("long").alias("_offset"))
    )
