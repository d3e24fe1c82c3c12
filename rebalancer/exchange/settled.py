"""Settled partitions: the ones an exchange can carry over from the previous version instead of recomputing.

A large cluster's exchange changes a few partitions (those of a failed or joining node) and leaves the rest as
they were. Recomputing every stage over every copy made the exchange cost grow with the cluster; the job instead
runs the stages only on the *unsettled* partitions and copies the previous version's rows of the others.

A partition ``p`` of group ``g`` is **settled** when all of these hold:

(a) ``g`` ran at the previous version and runs now, and is neither reset nor started in this exchange;
(b) no report of ``p`` is newer than the previous version's ``max_report_seq``;
(c) every copy of ``p`` in the previous ``partition_map`` is OWNING and sits on a node of ``p``'s ideal list now,
    and every ideal node now holds such a copy (so every copy is on an alive server: ideal nodes are alive);
(d) the previous ``affinity_assignment`` of ``p`` is exactly its ideal list now (same node at every
    ``replica_index``) and not temporary;
(e) ``p`` is neither in the previous ``lost_partitions`` nor in the previous ``counter_conflicts``;

and ``0 <= partition_id < partitions`` of its group.

Why the stages then give the previous rows, stage by stage (docs/EXCHANGE.md "Settled partitions"): the base map is
the previous map unchanged (b, c); no reset applies (a); every copy is OWNING and the previous counter check on the
same owners found nothing (e), so no copy is reset and no conflict is raised; the partition is owned and was not
lost, so it is not lost now and no loss decision touches it; the ideal primary owns, so the late assignment is the
ideal list, not temporary, which is the previous assignment (d); no copy is surplus and no ideal node lacks one, so
nothing turns RENTING or MOVING and the plan has no step for it; the assignment did not change, so the partition
version is the previous one. Every other partition is *unsettled* and recomputed; in particular every partition of
the first exchange, of a new, restarted or reset group, and every partition touched by a failed, left or joined
node, a new report, a loss or a conflict.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rebalancer.exchange.fullmap import COPY_KEY, OWNING, PARTITION_KEY, require_columns

__all__ = ["carried", "unsettled_partitions"]

_IDEAL_COLUMNS = ["group_name", "partition_id", "replica_index", "node_id"]


def unsettled_partitions(
    ideal_df: DataFrame,
    prev_map_df: DataFrame,
    prev_assignment_df: DataFrame,
    prev_lost_df: DataFrame,
    prev_conflicts_df: DataFrame,
    new_reports_df: DataFrame,
    carried_groups_df: DataFrame,
) -> DataFrame:
    """The partitions that are not settled (module docstring), to be recomputed.

    Args:
        ideal_df: this exchange's ideal assignment (running groups, alive servers).
        prev_map_df: the previous committed ``partition_map`` (without version columns).
        prev_assignment_df: the previous committed ``affinity_assignment``, with ``is_temporary``.
        prev_lost_df: the previous ``lost_partitions``.
        prev_conflicts_df: the previous ``counter_conflicts``.
        new_reports_df: the valid reports newer than the previous ``max_report_seq`` (only their partition keys
            are used).
        carried_groups_df: ``group_name`` of the groups that may carry partitions over: running before and now,
            not reset, not started in this exchange.

    Returns:
        Distinct ``group_name, partition_id``: every partition of ``ideal_df`` that is not settled, and every
        partition of the previous tables that has no ideal node now.
    """
    require_columns(ideal_df, _IDEAL_COLUMNS, stage="unsettled_partitions", argument="ideal_df")
    require_columns(prev_assignment_df, [*_IDEAL_COLUMNS, "is_temporary"], stage="unsettled_partitions",
                    argument="prev_assignment_df")
    part, key = list(PARTITION_KEY), list(COPY_KEY)
    one, zero = F.lit(1), F.lit(0)
    # Both comparisons are aggregations of a union (hash aggregates: no sort, unlike the equivalent full outer joins).
    # (c): per copy key, exactly one previous copy, OWNING, and exactly one ideal slot.
    copies_df = (
        prev_map_df.select(*key, one.alias("_copy"), (F.col("state") == OWNING).cast("int").alias("_owning"),
                           zero.alias("_ideal"))
        .unionByName(ideal_df.select(*key, zero.alias("_copy"), zero.alias("_owning"), one.alias("_ideal")))
        .groupBy(*key)
        .agg(F.sum("_copy").alias("_copy"), F.sum("_owning").alias("_owning"), F.sum("_ideal").alias("_ideal"))
        .where((F.col("_copy") != 1) | (F.col("_owning") != 1) | (F.col("_ideal") != 1))
        .select(*part)
    )
    # (d): per replica slot, exactly one previous assignment row, not temporary, naming the one ideal node.
    none = F.lit(None).cast("string")
    slots_df = (
        prev_assignment_df.select(*part, "replica_index", F.col("node_id").alias("_served"),
                                  none.alias("_ideal_node"), F.col("is_temporary").alias("_temporary"))
        .unionByName(ideal_df.select(*part, "replica_index", none.alias("_served"),
                                     F.col("node_id").alias("_ideal_node"), F.lit(False).alias("_temporary")))
        .groupBy(*part, "replica_index")
        .agg(
            F.count("_served").alias("_served_rows"),
            F.count("_ideal_node").alias("_ideal_rows"),
            F.max("_served").alias("_served"),
            F.max("_ideal_node").alias("_ideal_node"),
            F.max(F.coalesce(F.col("_temporary"), F.lit(False))).alias("_temporary"),
        )
        .where(
            (F.col("_served_rows") != 1) | (F.col("_ideal_rows") != 1)
            | (F.col("_served") != F.col("_ideal_node")) | F.col("_temporary")
        )
        .select(*part)
    )
    ideal_parts_df = ideal_df.select(*part).distinct()
    # (a): every partition of a group that cannot carry over.
    group_df = ideal_parts_df.join(carried_groups_df.select("group_name"), "group_name", "left_anti")
    touched_df = (
        copies_df.unionByName(slots_df)
        .unionByName(new_reports_df.select(*part))
        .unionByName(prev_lost_df.select(*part))
        .unionByName(prev_conflicts_df.select(*part))
        .unionByName(group_df)
    )
    # Not restricted to the ideal partitions: a previous copy or slot of a partition without ideal nodes now (no
    # alive server) is unsettled too, so it is never carried.
    return touched_df.distinct()


def carried(
    prev_df: DataFrame, unsettled_df: DataFrame, groups_df: DataFrame, carried_groups_df: DataFrame
) -> DataFrame:
    """The previous version's rows of the settled partitions (``prev_df``'s columns).

    Args:
        prev_df: a previous committed table keyed by partition (without version columns).
        unsettled_df: :func:`unsettled_partitions`.
        groups_df: the running groups (``group_name, partitions``).
        carried_groups_df: as for :func:`unsettled_partitions`.

    Returns:
        Rows of ``prev_df`` whose partition is settled: in a carried group, in range, and not unsettled.
    """
    part = list(PARTITION_KEY)
    in_range_df = groups_df.select("group_name", "partitions").join(
        carried_groups_df.select("group_name"), "group_name", "left_semi"
    )
    return (
        prev_df.join(F.broadcast(in_range_df), "group_name")
        .where((F.col("partition_id") >= 0) & (F.col("partition_id") < F.col("partitions")))
        .drop("partitions")
        .join(unsettled_df, part, "left_anti")
    )
