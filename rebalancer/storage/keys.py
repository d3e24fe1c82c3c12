"""Checks of what identifies tables and rows: table names, merge keys, and duplicate or absent keys among rows."""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from rebalancer import tables
from rebalancer.storage.errors import DuplicateKeyError, InvalidArgumentError, UnknownTableError
from rebalancer.storage.sql import quote_identifier

__all__ = [
    "absent_rows", "check_contract_name", "check_merge_keys", "check_table_name", "check_unique_keys", "keys_not_null",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_table_name(name: str) -> str:
    """Check that ``name`` is usable as a directory name and a SQL identifier.

    Args:
        name: a table name such as ``"partition_map"``.

    Returns:
        ``name`` unchanged.

    Raises:
        UnknownTableError: the name is empty or has characters other than letters, digits and ``_``.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnknownTableError(
            f"{name!r} is not a valid table name; use letters, digits and underscores, for example 'partition_map'."
        )
    return name


def check_contract_name(name: str) -> str:
    """Check that ``name`` is a table of the contract (``tables.SCHEMAS``).

    Args:
        name: a table name.

    Returns:
        ``name`` unchanged.

    Raises:
        UnknownTableError: the name is not one of ``tables.SCHEMAS`` (the message lists them).
    """
    check_table_name(name)
    if name not in tables.SCHEMAS:
        raise UnknownTableError(
            f"{name!r} is not a rebalancer table; known tables: {', '.join(sorted(tables.SCHEMAS))}."
        )
    return name


def check_merge_keys(keys: Sequence[str], schema: StructType, table: str) -> list[str]:
    """Validate merge keys against the table schema.

    Args:
        keys: key column names.
        schema: the table schema.
        table: the table name, for messages.

    Returns:
        The keys as a list.

    Raises:
        InvalidArgumentError: no keys, repeated keys, or keys the table does not have.
    """
    key_list = [keys] if isinstance(keys, str) else list(keys)
    if not key_list:
        raise InvalidArgumentError(f"merge into {table} needs at least one key column.")
    if len(set(key_list)) != len(key_list):
        raise InvalidArgumentError(f"merge into {table} lists a key column twice: {', '.join(key_list)}.")
    unknown = [k for k in key_list if k not in schema.names]
    if unknown:
        raise InvalidArgumentError(f"merge into {table} uses keys the table does not have: {', '.join(unknown)}.")
    return key_list


def absent_rows(rows: pa.Table, keys: Sequence[str], stored: pa.Table, table: str) -> pa.Table:
    """The rows of ``rows`` whose key is not in ``stored`` (an insert-only merge, decided on the driver).

    As in Delta MERGE, a row with a null key matches nothing and is kept.

    Args:
        rows: the rows to insert.
        keys: key column names.
        stored: the table's stored keys (at least the ``keys`` columns).
        table: the table name, for messages.

    Raises:
        DuplicateKeyError: two of ``rows`` share a non-null key.
    """
    wanted = list(zip(*(rows.column(k).to_pylist() for k in keys), strict=True))
    counts = collections.Counter(k for k in wanted if None not in k)
    duplicate = next((k for k, n in counts.items() if n > 1), None)
    if duplicate is not None:
        shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, duplicate, strict=True))
        raise DuplicateKeyError(
            f"the rows inserted into {table} hold {counts[duplicate]} rows for key ({shown}); deduplicate them first."
        )
    present = set(zip(*(stored.column(k).to_pylist() for k in keys), strict=True))
    return rows.filter(pa.array([None in k or k not in present for k in wanted], pa.bool_()))


def check_unique_keys(df: DataFrame, keys: Sequence[str], table: str) -> None:
    """Fail when the merge source has two rows for one (non-null) key: the upsert would be ambiguous.

    Rows with a null key never match a target row (as in Delta MERGE) and are inserted as they are, so they are
    not checked.

    Args:
        df: the merge source.
        keys: key column names.
        table: the table name, for messages.

    Raises:
        DuplicateKeyError: some key occurs more than once.
    """
    duplicate = df.filter(keys_not_null(keys)).groupBy(*keys).count().filter(F.col("count") > 1).limit(1).collect()
    if duplicate:
        row = duplicate[0]
        shown = ", ".join(f"{k}={row[k]!r}" for k in keys)
        raise DuplicateKeyError(
            f"the rows merged into {table} hold {row['count']} rows for key ({shown}); deduplicate the source first."
        )


def keys_not_null(keys: Sequence[str]) -> Column:
    """The predicate "no key column is null": the rows a merge on ``keys`` can match (null keys never match)."""
    not_null = F.lit(True)
    for key in keys:
        not_null = not_null & F.col(quote_identifier(key)).isNotNull()
    return not_null
