"""Small read-only summaries for people: how a cluster's data spreads over its nodes.

Pure DataFrame functions; the CLI collects their (small, per-node) results only to print them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

__all__ = ["NODE_LOAD", "node_load"]

NODE_LOAD = StructType(
    [
        StructField("node_id", StringType()),
        StructField("replicas", LongType()),
        StructField("primaries", LongType()),
        StructField("bytes", LongType()),
    ]
)


def node_load(reports_df: DataFrame, assignment_df: DataFrame) -> DataFrame:
    """Replicas, primaries and bytes held per node.

    Args:
        reports_df: ``partition_reports`` rows (latest per copy); only OWNING and MOVING copies count.
        assignment_df: ``(group_name, partition_id, replica_index, node_id)``; ``replica_index`` 0 is the primary.

    Returns:
        One row per node with a copy, schema :data:`NODE_LOAD`.
    """
    held = reports_df.where(F.col("state").isin("OWNING", "MOVING"))
    primaries = (
        assignment_df.where(F.col("replica_index") == 0)
        .groupBy("node_id")
        .agg(F.count(F.lit(1)).alias("primaries"))
    )
    return (
        held.groupBy("node_id")
        .agg(F.count(F.lit(1)).alias("replicas"), F.sum("bytes").alias("bytes"))
        .join(primaries, "node_id", "left")
        .select(
            "node_id",
            F.col("replicas").cast("long"),
            F.coalesce(F.col("primaries"), F.lit(0)).cast("long").alias("primaries"),
            F.col("bytes").cast("long"),
        )
    )
