"""Lost partitions stage: reset, detection, and the map decisions that follow (SPEC 4 "Lost partitions").

Call order inside one exchange (the map after each step feeds the next)::

    map_df = apply_reset(map_df, reset_groups_df)                    # before counters
    conflicts_df = counters.find_counter_conflicts(map_df)
    map_df = counters.apply_counter_resets(map_df)
    lost_df = find_lost(map_df, prev_owned_df, prev_lost_df, groups_df, reset_groups_df, new_groups_df)
    map_df = apply_loss_decisions(map_df, lost_df, ideal_df, new_groups_df, reset_groups_df)

Rules:

* A partition is LOST when it had an OWNING copy in the previous committed version and has no OWNING copy now
  (alive nodes only, after counter resets), or when it was LOST in the previous version and its group is not
  reset in this exchange (LOST is sticky). Partitions of groups new in this exchange are never lost.
* ``RESET_LOST_PARTITIONS`` turns every LOST copy of the group into OWNING *before* the counter rule, so the copy
  with the highest counter wins and the others become MOVING. Partitions of a reset group that still have no owner
  afterwards (no copy left) are recreated empty on their ideal nodes.
* READ_WRITE_SAFE and READ_ONLY_SAFE: every copy of a lost partition on an alive node is marked LOST (a MOVING
  copy also gets ``update_counter`` 0, as Ignite resets the counter of a partition lost while rebalancing: its data
  is incomplete), and every ideal node holding no copy gets a placeholder LOST row (counter, size, bytes 0), as
  Ignite creates the partition on its affinity nodes and marks it lost. A reset turns placeholders OWNING: that is
  how "recreated empty on the ideal nodes" happens when no real copy is left.
* IGNORE: while the partition has no OWNING copy, its ideal nodes get empty OWNING copies (counter, size, bytes 0,
  replacing whatever those nodes held); it stays listed in ``lost_partitions`` (read and write allowed) until reset.
* READ_ONLY_SAFE forbids writes to the whole group, not only to lost partitions. ``lost_partitions`` has no
  group-level row, so the rule is: a group is write-blocked at a version iff it has a lost partition with
  ``loss_policy = 'READ_ONLY_SAFE'``; :func:`write_blocked_groups` computes exactly that set.
* New groups: a partition no alive node owns starts as empty OWNING copies on its ideal nodes, not lost.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from rebalancer.exchange.fullmap import (
    COPY_KEY,
    LOST,
    MAP_SCHEMA,
    MOVING,
    OWNING,
    PARTITION_KEY,
    conform,
    require_columns,
    stage_schema,
)

__all__ = [
    "IGNORE",
    "LOST_SCHEMA",
    "READ_ONLY_SAFE",
    "READ_WRITE_SAFE",
    "apply_loss_decisions",
    "apply_reset",
    "find_lost",
    "loss_policy",
    "write_blocked_groups",
]

READ_WRITE_SAFE, READ_ONLY_SAFE, IGNORE = "READ_WRITE_SAFE", "READ_ONLY_SAFE", "IGNORE"
LOST_SCHEMA = stage_schema("lost_partitions")


def loss_policy(col: Column) -> Column:
    """``cache_groups.loss_policy`` with null read as ``READ_WRITE_SAFE``."""
    return F.coalesce(col, F.lit(READ_WRITE_SAFE))


def _owned(map_df: DataFrame) -> DataFrame:
    return map_df.where(F.col("state") == OWNING).select(*PARTITION_KEY).distinct()


def apply_reset(map_df: DataFrame, reset_groups_df: DataFrame) -> DataFrame:
    """``RESET_LOST_PARTITIONS``: every LOST copy of a reset group becomes OWNING (counter, size, bytes kept).

    Run it before :func:`rebalancer.exchange.counters.find_counter_conflicts`, so the counter rule then decides
    which of the former LOST copies keep owning.

    Args:
        map_df: the base map (``MAP_SCHEMA``).
        reset_groups_df: ``group_name`` of the groups reset in this exchange (may be empty).

    Returns:
        ``MAP_SCHEMA`` rows, same copies as ``map_df``.
    """
    require_columns(reset_groups_df, ["group_name"], stage="apply_reset", argument="reset_groups_df")
    reset_df = reset_groups_df.select("group_name").distinct().withColumn("_reset", F.lit(True))
    out_df = map_df.join(reset_df, "group_name", "left").withColumn(
        "state",
        F.when(F.col("_reset") & (F.col("state") == LOST), F.lit(OWNING)).otherwise(F.col("state")),
    )
    return conform(out_df, MAP_SCHEMA)


def find_lost(
    map_df: DataFrame,
    prev_owned_df: DataFrame,
    prev_lost_df: DataFrame,
    groups_df: DataFrame,
    reset_groups_df: DataFrame,
    new_groups_df: DataFrame,
) -> DataFrame:
    """The lost partitions of this version.

    Args:
        map_df: the map after :func:`apply_reset` and the counter resets.
        prev_owned_df: distinct ``(group_name, partition_id)`` with an OWNING copy in the previous committed map.
        prev_lost_df: the previous version's ``lost_partitions`` (only ``group_name, partition_id`` are used).
        groups_df: running groups (``group_name``, ``partitions``, ``loss_policy``); partitions of other groups
            or out of range are dropped.
        reset_groups_df: ``group_name`` of groups reset in this exchange: their previous lost partitions clear.
        new_groups_df: ``group_name`` of groups new in this exchange: never lost.

    Returns:
        ``LOST_SCHEMA`` rows (``group_name, partition_id, loss_policy, read_allowed, write_allowed``).
    """
    require_columns(groups_df, ["group_name", "partitions", "loss_policy"], stage="find_lost", argument="groups_df")
    part = list(PARTITION_KEY)
    newly_lost_df = prev_owned_df.select(*part).join(_owned(map_df), part, "left_anti")
    policy = loss_policy(F.col("loss_policy"))
    # An IGNORE loss is listed only in the version of the loss: a real Ignite node keeps no lost state under IGNORE.
    sticky_df = (
        prev_lost_df.select(*part)
        .join(reset_groups_df.select("group_name"), "group_name", "left_anti")
        .join(groups_df.where(policy != IGNORE).select("group_name"), "group_name", "left_semi")
    )
    lost_df = (
        newly_lost_df.unionByName(sticky_df)
        .distinct()
        .join(new_groups_df.select("group_name"), "group_name", "left_anti")
        .join(groups_df.select("group_name", "partitions", "loss_policy"), "group_name")
        .where((F.col("partition_id") >= 0) & (F.col("partition_id") < F.col("partitions")))
        .select(
            *part,
            policy.alias("loss_policy"),
            (policy == IGNORE).alias("read_allowed"),
            (policy == IGNORE).alias("write_allowed"),
        )
    )
    return conform(lost_df, LOST_SCHEMA)


def apply_loss_decisions(
    map_df: DataFrame,
    lost_df: DataFrame,
    ideal_df: DataFrame,
    new_groups_df: DataFrame,
    reset_groups_df: DataFrame,
    groups_df: DataFrame,
    prev_copies_df: DataFrame,
) -> DataFrame:
    """The map after the loss decisions: LOST marks and placeholders, recreated empty OWNING copies.

    Args:
        map_df: the map :func:`find_lost` saw.
        lost_df: :func:`find_lost`'s result.
        ideal_df: ideal assignment (``group_name, partition_id, replica_index, node_id``) of every running group.
        new_groups_df: ``group_name`` of groups new in this exchange.
        reset_groups_df: ``group_name`` of groups reset in this exchange.

    Returns:
        ``MAP_SCHEMA`` rows:

        * copies of lost READ_WRITE_SAFE / READ_ONLY_SAFE partitions become LOST (MOVING ones with counter 0),
          and their ideal nodes holding no copy get LOST rows with counter, size and bytes 0;
        * partitions without an OWNING copy that are IGNORE-lost, of a new group, or of a reset group (and not
          lost) get OWNING copies with counter, size and bytes 0 on their ideal nodes, replacing those nodes'
          copies;
        * every other copy is unchanged.
    """
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="apply_loss_decisions", argument="map_df")
    require_columns(lost_df, [*PARTITION_KEY, "loss_policy"], stage="apply_loss_decisions", argument="lost_df")
    require_columns(ideal_df, [*COPY_KEY, "replica_index"], stage="apply_loss_decisions", argument="ideal_df")
    part, key = list(PARTITION_KEY), list(COPY_KEY)
    # One row per copy or ideal slot (map_df referenced once), with the partition's facts beside it.
    slots_df = (
        map_df.withColumn("_copy", F.lit(True))
        .join(ideal_df.select(*key).distinct().withColumn("_ideal", F.lit(True)), key, "full")
        .join(lost_df.select(*part, F.col("loss_policy").alias("_policy")), part, "left")
        .join(new_groups_df.select("group_name").distinct().withColumn("_new", F.lit(True)), "group_name", "left")
        .join(reset_groups_df.select("group_name").distinct().withColumn("_rst", F.lit(True)), "group_name", "left")
        .join(groups_df.select("group_name", loss_policy(F.col("loss_policy")).alias("_group_policy")),
              "group_name", "left")
        .join(prev_copies_df.select(*part).distinct().withColumn("_had", F.lit(True)), part, "left")
        .withColumn(
            "_owned",
            F.max(F.coalesce(F.col("state") == OWNING, F.lit(False))).over(Window.partitionBy(*part)),
        )
    )
    is_copy = F.coalesce(F.col("_copy"), F.lit(False))
    is_ideal = F.coalesce(F.col("_ideal"), F.lit(False))
    policy = F.col("_policy")
    safe_lost = policy.isNotNull() & (policy != IGNORE)
    recreate = ~F.col("_owned") & ~F.coalesce(safe_lost, F.lit(False)) & (
        (F.col("_group_policy") == IGNORE)
        | F.coalesce(F.col("_new"), F.lit(False))
        | F.coalesce(F.col("_rst"), F.lit(False))
        | F.col("_had").isNull()
    )
    empty = (is_ideal & recreate) | (~is_copy & safe_lost)
    zero = F.lit(0).cast("long")
    out_df = slots_df.where(is_copy | (is_ideal & (safe_lost | recreate))).select(
        *key,
        F.when(is_ideal & recreate, F.lit(OWNING))
        .when(safe_lost, F.lit(LOST))
        .otherwise(F.col("state"))
        .alias("state"),
        F.when(empty | (safe_lost & (F.col("state") == MOVING)), zero)
        .otherwise(F.col("update_counter"))
        .alias("update_counter"),
        F.when(empty, zero).otherwise(F.col("size")).alias("size"),
        F.when(empty, zero).otherwise(F.col("bytes")).alias("bytes"),
    )
    return conform(out_df, MAP_SCHEMA)


def write_blocked_groups(lost_df: DataFrame) -> DataFrame:
    """Groups where no write is allowed anywhere: those with a lost ``READ_ONLY_SAFE`` partition.

    Args:
        lost_df: a version's ``lost_partitions`` (with or without version columns).

    Returns:
        One column ``group_name``, distinct.
    """
    require_columns(lost_df, ["group_name", "loss_policy"], stage="write_blocked_groups", argument="lost_df")
    return lost_df.where(F.col("loss_policy") == READ_ONLY_SAFE).select("group_name").distinct()
