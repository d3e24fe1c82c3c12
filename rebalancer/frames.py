"""Tiny DataFrame helpers shared by the job and the operations (no I/O)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

__all__ = ["scalar"]


def scalar(df: DataFrame) -> Any:
    """The first column of the first row of ``df`` (a one-row aggregate), or None when ``df`` is empty."""
    row = df.first()
    return None if row is None else row[0]
