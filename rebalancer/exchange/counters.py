"""Counter validation stage: owners behind the partition's maximum update counter are reset to MOVING.

Contract (SPEC 4 "Counters"): among the OWNING copies of a partition, with M the maximum ``update_counter``:

* every OWNING copy with ``update_counter < M`` gets a ``RESET_TO_MOVING`` row and becomes MOVING, keeping its
  counter (it is the demander's from-counter for historical rebalance);
* when the copies with counter M do not all have the same ``size``, *every* copy with counter M gets a
  ``SIZE_MISMATCH`` row (a warning only; states do not change). No copy is singled out as the wrong one: like
  Ignite's partition-size validator, the warning lists all nodes of the partition with the maximum counter.

Copies in other states (MOVING, RENTING, LOST) take no part.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from rebalancer.exchange.fullmap import (
    MAP_SCHEMA,
    MOVING,
    OWNING,
    PARTITION_KEY,
    conform,
    require_columns,
    stage_schema,
)

__all__ = ["CONFLICTS_SCHEMA", "RESET_TO_MOVING", "SIZE_MISMATCH", "apply_counter_resets", "find_counter_conflicts"]

RESET_TO_MOVING, SIZE_MISMATCH = "RESET_TO_MOVING", "SIZE_MISMATCH"
CONFLICTS_SCHEMA = stage_schema("counter_conflicts")


def _with_checks(map_df: DataFrame) -> DataFrame:
    """``map_df`` plus ``max_update_counter`` (over OWNING copies) and ``action`` (null when the copy is fine).

    One pass of window functions over ``(group_name, partition_id)``: the input is referenced once, so chaining
    stages keeps the query plan linear.
    """
    part_w = Window.partitionBy(*PARTITION_KEY)
    owning = F.col("state") == OWNING
    counter = F.col("update_counter")
    with_max_df = map_df.withColumn("max_update_counter", F.max(F.when(owning, counter)).over(part_w))
    at_max = owning & (counter == F.col("max_update_counter"))
    return (
        with_max_df.withColumn("_min_size", F.min(F.when(at_max, F.col("size"))).over(part_w))
        .withColumn("_max_size", F.max(F.when(at_max, F.col("size"))).over(part_w))
        .withColumn(
            "action",
            F.when(owning & (counter < F.col("max_update_counter")), F.lit(RESET_TO_MOVING)).when(
                at_max & (F.col("_min_size") != F.col("_max_size")), F.lit(SIZE_MISMATCH)
            ),
        )
    )


def find_counter_conflicts(map_df: DataFrame) -> DataFrame:
    """The counter conflicts of a map.

    Args:
        map_df: ``MAP_SCHEMA`` rows (after :func:`rebalancer.exchange.lost.apply_reset`).

    Returns:
        ``CONFLICTS_SCHEMA`` rows (``group_name, partition_id, node_id, update_counter, max_update_counter, size,
        action``): one ``RESET_TO_MOVING`` row per OWNING copy below the maximum counter, one ``SIZE_MISMATCH``
        row per maximum-counter copy of a partition whose maximum-counter copies differ in size.
    """
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="find_counter_conflicts", argument="map_df")
    return conform(_with_checks(map_df).where(F.col("action").isNotNull()), CONFLICTS_SCHEMA)


def apply_counter_resets(map_df: DataFrame) -> DataFrame:
    """``map_df`` with every OWNING copy below its partition's maximum counter turned MOVING.

    Counter, size and bytes are kept. The rows changed are exactly the ``RESET_TO_MOVING`` rows of
    :func:`find_counter_conflicts` on the same map; the rule is recomputed instead of joining the conflicts back,
    so the result references ``map_df`` once.

    Args:
        map_df: the map :func:`find_counter_conflicts` was computed from.

    Returns:
        ``MAP_SCHEMA`` rows, same copies as ``map_df``.
    """
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="apply_counter_resets", argument="map_df")
    out_df = _with_checks(map_df).withColumn(
        "state", F.when(F.col("action") == RESET_TO_MOVING, F.lit(MOVING)).otherwise(F.col("state"))
    )
    return conform(out_df, MAP_SCHEMA)
