"""Tiny DataFrame helpers shared by the job and the operations (no I/O)."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.tables import VERSION_COLUMNS

__all__ = ["at_version", "parallelism", "scalar"]


def scalar(df: DataFrame) -> Any:
    """The first column of the first row of ``df`` (a one-row aggregate), or None when ``df`` is empty."""
    row = df.first()
    return None if row is None else row[0]


def at_version(df: DataFrame, version: tuple[int, int], keep_version: bool = False) -> DataFrame:
    """The rows of an output table at one topology version, without the version columns unless ``keep_version``."""
    major, minor = version
    rows_df = df.where((F.col("topology_major") == major) & (F.col("topology_minor") == minor))
    return rows_df if keep_version else rows_df.drop(*VERSION_COLUMNS)


def parallelism(spark: SparkSession) -> int:
    """Tasks the session runs at once (the machine's cores where the session has no SparkContext: Connect)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect sessions have no sparkContext
        return os.cpu_count() or 1
