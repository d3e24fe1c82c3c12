"""Late affinity stage: the assignment that serves traffic while data moves (SPEC 4 "Late affinity", exact).

Per partition, with I the ideal list, C the previous committed assignment (``C[0]`` is the current primary; C is
empty for the first exchange) and O the current owners (alive, OWNING, after counter resets and loss decisions):

* O empty, or ``I[0]`` in O: the assignment is I (``is_temporary`` false).
* Otherwise the temporary primary T is ``C[0]`` if it owns, else the first backup of C by ``replica_index`` that
  owns, else the owner with the lowest ``node_order`` (ties, and owners missing from ``nodes_df``, by ``node_id``).
  The assignment is T followed by I without T, ``replica_index`` renumbered 0, 1, ...; every row of the
  partition has ``is_temporary`` true (the partition as a whole waits for the switch, as Ignite's
  ``waitRebalanceInfo`` tracks partitions, not nodes).

A ``LATE_AFFINITY_SWITCH`` is due when the partitions the committed version left rebalancing (temporary ones, and
ones whose ideal backups were still MOVING) now have every ideal node owning (:func:`switch_due`). Copies on nodes
outside the ideal list of a partition whose assignment equals the ideal and whose ideal nodes all own are surplus
and become RENTING (:func:`surplus_to_renting`, Ignite's ``checkEvictions``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from rebalancer.exchange.fullmap import (
    COPY_KEY,
    MAP_SCHEMA,
    MOVING,
    OWNING,
    PARTITION_KEY,
    RENTING,
    conform,
    require_columns,
    stage_schema,
)

__all__ = ["AFFINITY_SCHEMA", "SWITCH_SCHEMA", "late_affinity", "surplus_to_renting", "switch_due"]

AFFINITY_SCHEMA = stage_schema("affinity_assignment")
SWITCH_SCHEMA = StructType([StructField("due", BooleanType()), StructField("waiting_partitions", LongType())])

_IDEAL_COLUMNS = ["group_name", "partition_id", "replica_index", "node_id"]


def _owners(map_df: DataFrame) -> DataFrame:
    return map_df.where(F.col("state") == OWNING).select(*COPY_KEY).distinct()


def late_affinity(
    ideal_df: DataFrame, prev_assignment_df: DataFrame, map_df: DataFrame, nodes_df: DataFrame
) -> DataFrame:
    """The late (serving) assignment of every partition of ``ideal_df``.

    Args:
        ideal_df: ideal assignment (``group_name, partition_id, replica_index, node_id``).
        prev_assignment_df: the previous committed ``affinity_assignment`` (same columns; ``is_temporary`` and
            version columns ignored); empty for the first exchange.
        map_df: the map after counter resets and loss decisions (alive nodes only).
        nodes_df: alive nodes with ``node_id, node_order``.

    Returns:
        ``AFFINITY_SCHEMA`` rows (``group_name, partition_id, replica_index, node_id, is_temporary``).
    """
    require_columns(ideal_df, _IDEAL_COLUMNS, stage="late_affinity", argument="ideal_df")
    require_columns(prev_assignment_df, _IDEAL_COLUMNS, stage="late_affinity", argument="prev_assignment_df")
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="late_affinity", argument="map_df")
    require_columns(nodes_df, ["node_id", "node_order"], stage="late_affinity", argument="nodes_df")
    part = list(PARTITION_KEY)
    part_w = Window.partitionBy(*part)
    primary_df = ideal_df.where(F.col("replica_index") == 0).select(*part, F.col("node_id").alias("_ideal_primary"))
    current_df = prev_assignment_df.select(*part, "node_id", F.col("replica_index").alias("_current_index"))
    t_rank = Window.partitionBy(*part).orderBy(
        F.col("_current_index").asc_nulls_last(), F.col("node_order").asc_nulls_last(), F.col("node_id")
    )
    # Owners of partitions whose ideal primary does not own, ranked: C's primary, C's backups, then node_order.
    temp_primary_df = (
        _owners(map_df)
        .join(primary_df, part)
        .withColumn("_primary_owns", F.max(F.col("node_id") == F.col("_ideal_primary")).over(part_w))
        .where(~F.col("_primary_owns"))
        .join(current_df, [*part, "node_id"], "left")
        .join(nodes_df.select("node_id", "node_order"), "node_id", "left")
        .withColumn("_rank", F.row_number().over(t_rank))
        .where(F.col("_rank") == 1)
        .select(*part, F.col("node_id").alias("_temp_primary"))
    )
    temporary = F.col("_temp_primary").isNotNull()
    # T's index in I (null when T is not ideal): ideal nodes before it shift by one, those after keep their index.
    t_index = F.max(F.when(F.col("node_id") == F.col("_temp_primary"), F.col("replica_index"))).over(part_w)
    new_index = F.when(
        temporary & (F.col("_t_index").isNull() | (F.col("replica_index") < F.col("_t_index"))),
        F.col("replica_index") + 1,
    ).otherwise(F.col("replica_index"))
    shifted = F.struct(new_index.alias("replica_index"), F.col("node_id").alias("node_id"))
    head = F.struct(F.lit(0).alias("replica_index"), F.col("_temp_primary").alias("node_id"))
    # I[0] never owns in a temporary partition, so it is never T: its row also emits T's head row (one pass).
    rows = F.when(temporary & (F.col("replica_index") == 0), F.array(shifted, head)).otherwise(F.array(shifted))
    out_df = (
        ideal_df.select(*_IDEAL_COLUMNS)
        .join(temp_primary_df, part, "left")
        .withColumn("_t_index", t_index)
        .where(~temporary | (F.col("node_id") != F.col("_temp_primary")))
        .select(*part, F.explode(rows).alias("_row"), temporary.alias("is_temporary"))
        .select(*part, "_row.replica_index", "_row.node_id", "is_temporary")
    )
    return conform(out_df, AFFINITY_SCHEMA)


def _with_ideal_all_own(map_df: DataFrame, ideal_df: DataFrame) -> DataFrame:
    """Every copy and every ideal slot (full outer join on the copy key, ``map_df`` referenced once), with
    ``_copy``/``_ideal`` flags and ``_all_own``: every ideal node of the partition has an OWNING copy (false when the
    partition has no ideal node)."""
    owns = F.coalesce(F.col("state") == OWNING, F.lit(False))
    return (
        map_df.withColumn("_copy", F.lit(True))
        .join(ideal_df.select(*COPY_KEY).distinct().withColumn("_ideal", F.lit(True)), list(COPY_KEY), "full")
        .withColumn("_copy", F.coalesce(F.col("_copy"), F.lit(False)))
        .withColumn("_ideal", F.coalesce(F.col("_ideal"), F.lit(False)))
        .withColumn(
            "_all_own",
            F.coalesce(F.min(F.when(F.col("_ideal"), owns)).over(Window.partitionBy(*PARTITION_KEY)), F.lit(False)),
        )
    )


def switch_due(
    ideal_df: DataFrame, assignment_df: DataFrame, map_df: DataFrame, prev_map_df: DataFrame | None = None
) -> DataFrame:
    """Whether the ``LATE_AFFINITY_SWITCH`` is due.

    The partitions waiting for the switch are those the committed version left rebalancing: every temporary
    partition of ``assignment_df``, and every partition with a MOVING copy on one of its ideal nodes in
    ``prev_map_df`` (a new backup loading while the primary already owns: the assignment is ideal but the old
    copies must be kept until it owns, as in Ignite's node-join example); a partition with no OWNING copy in
    ``map_df`` (lost) waits for nothing, since no supplier can fill it. The switch is due when there are waiting
    partitions and every ideal node of each of them now owns.

    Args:
        ideal_df: the current ideal assignment.
        assignment_df: the current (committed) late assignment.
        map_df: the current map (the committed map overridden by newer reports, see ``fullmap.base_map``).
        prev_map_df: the committed map (``None``: only temporary partitions wait).

    Returns:
        Exactly one ``SWITCH_SCHEMA`` row: ``due`` is true when some partitions wait and every ideal node of each
        of them owns; ``waiting_partitions`` counts the waiting partitions whose ideal nodes do not all own yet.
    """
    require_columns(assignment_df, [*_IDEAL_COLUMNS, "is_temporary"], stage="switch_due", argument="assignment_df")
    part = list(PARTITION_KEY)
    waiting_df = assignment_df.where(F.col("is_temporary")).select(*part)
    if prev_map_df is not None:
        loading_df = prev_map_df.where(F.col("state") == MOVING).join(
            ideal_df.select(*COPY_KEY), list(COPY_KEY)
        )
        waiting_df = waiting_df.unionByName(loading_df.select(*part))
    owns = F.coalesce(F.col("state") == OWNING, F.lit(False))
    all_own_df = (
        _with_ideal_all_own(map_df, ideal_df)
        .groupBy(*part)
        .agg(F.min("_all_own").alias("_all_own"), F.max(owns).alias("_has_owner"))
    )
    # A partition without any owner (lost) cannot finish loading until a reset; it must not hold back the others.
    status_df = waiting_df.distinct().join(all_own_df, part, "left").where(
        F.coalesce(F.col("_has_owner"), F.lit(False))
    )
    waiting = F.sum(F.when(F.coalesce(F.col("_all_own"), F.lit(False)), 0).otherwise(1))
    result_df = status_df.agg(F.count(F.lit(1)).alias("_temporary"), F.coalesce(waiting, F.lit(0)).alias("_waiting"))
    return conform(
        result_df.select(
            ((F.col("_temporary") > 0) & (F.col("_waiting") == 0)).alias("due"),
            F.col("_waiting").alias("waiting_partitions"),
        ),
        SWITCH_SCHEMA,
    )


def surplus_to_renting(map_df: DataFrame, assignment_df: DataFrame, ideal_df: DataFrame) -> DataFrame:
    """``map_df`` with surplus copies turned RENTING.

    A copy is surplus when its node is outside the partition's ideal list, the partition's assignment equals its
    ideal list (same nodes at the same ``replica_index``) and every ideal node owns. Only OWNING and MOVING copies
    change; RENTING and LOST copies stay as they are.

    Args:
        map_df: the map (after loss decisions).
        assignment_df: this version's late assignment.
        ideal_df: this version's ideal assignment.

    Returns:
        ``MAP_SCHEMA`` rows, same copies as ``map_df``.
    """
    require_columns(assignment_df, _IDEAL_COLUMNS, stage="surplus_to_renting", argument="assignment_df")
    part = list(PARTITION_KEY)

    def replica_list(df: DataFrame, name: str) -> DataFrame:
        return df.groupBy(*part).agg(
            F.sort_array(F.collect_list(F.struct("replica_index", "node_id"))).alias(name)
        )

    settled_df = (
        replica_list(assignment_df, "_assigned")
        .join(replica_list(ideal_df, "_ideal_list"), part)
        .where(F.col("_assigned") == F.col("_ideal_list"))
        .select(*part, F.lit(True).alias("_settled"))
    )
    surplus = (
        F.coalesce(F.col("_settled"), F.lit(False))
        & F.col("_all_own")
        & ~F.col("_ideal")
        & F.col("state").isin(OWNING, MOVING)
    )
    out_df = (
        _with_ideal_all_own(map_df, ideal_df)
        .where(F.col("_copy"))
        .join(settled_df, part, "left")
        .withColumn("state", F.when(surplus, F.lit(RENTING)).otherwise(F.col("state")))
    )
    return conform(out_df, MAP_SCHEMA)
