"""How rows are addressed in SQL text and Spark predicates: identifiers, literals, ``where`` maps, merge conditions."""

from __future__ import annotations

import datetime as dt
import functools
import math
import operator
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rebalancer.storage.errors import InvalidArgumentError

__all__ = [
    "WHERE_MARKER",
    "WhereValue",
    "guard_where",
    "merge_condition",
    "quote_identifier",
    "sql_literal",
    "where_predicate",
    "where_sql",
]

#: A value a ``where`` mapping may hold: each has a SQL literal (:func:`sql_literal`).
WhereValue = bool | int | float | str | dt.datetime | dt.date | None

#: Marks the error a row outside a ``replace_where``'s ``where`` raises while it is written (:func:`guard_where`).
WHERE_MARKER = "rebalancer-where-mismatch"

# The Python value types a where may hold, and the column types each may be compared with.
_WHERE_TYPES: dict[type, tuple[type[T.DataType], ...]] = {
    bool: (T.BooleanType,),
    int: (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType),
    float: (T.FloatType, T.DoubleType, T.DecimalType),
    str: (T.StringType, T.CharType, T.VarcharType),
    dt.datetime: (T.TimestampType, T.TimestampNTZType),
    dt.date: (T.DateType,),
}


def _check_where(where: Mapping[str, WhereValue], schema: T.StructType, table: str) -> None:
    names = set(schema.names)
    unknown = [k for k in where if k not in names]
    if unknown:
        raise InvalidArgumentError(
            f"replace_where on {table} names columns the table does not have: {', '.join(unknown)}."
        )
    for key, value in where.items():
        if value is None:
            continue
        column_type = schema[key].dataType
        accepted = _WHERE_TYPES.get(type(value))
        if accepted is None:
            raise InvalidArgumentError(
                f"replace_where on {table}: the value for {key} is a {type(value).__name__}; use a bool, int, "
                f"float, str, date, datetime or None."
            )
        if not isinstance(column_type, accepted):
            # Comparing e.g. a string column with an int would make Spark cast every stored value.
            raise InvalidArgumentError(
                f"replace_where on {table}: {key} is {column_type.simpleString()} but the value {value!r} is a "
                f"{type(value).__name__}; pass a value of the column's type."
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgumentError(f"replace_where on {table}: the value for {key} must be finite, not {value}.")
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            raise InvalidArgumentError(
                f"replace_where on {table}: the datetime for {key} has no time zone; pass an aware (UTC) datetime."
            )


def where_predicate(where: Mapping[str, WhereValue], schema: T.StructType, table: str) -> Column:
    """The Spark predicate "every key equals its value" (``None`` matches nulls), never null itself.

    Args:
        where: column name to value; an empty mapping matches every row.
        schema: the table schema (keys are checked against it).
        table: the table name, for messages.

    Returns:
        A boolean Column, true exactly for the rows ``replace_where`` replaces.

    Raises:
        InvalidArgumentError: ``where`` names unknown columns or holds unsupported values.
    """
    _check_where(where, schema, table)
    # <=> (null-safe equality) so that the predicate is true or false, never null: NOT(predicate) then keeps
    # exactly the rows that are not replaced, including rows whose key is null.
    terms = [F.col(quote_identifier(key)).eqNullSafe(F.lit(value)) for key, value in where.items()]
    return functools.reduce(operator.and_, terms) if terms else F.lit(True)


def guard_where(rows: DataFrame, where: Mapping[str, WhereValue], predicate: Column, name: str) -> DataFrame:
    """Make the write itself fail on a row outside ``where`` (no extra Spark job: the check runs while writing)."""
    key = next(iter(where))
    message = f"{WHERE_MARKER}: a row written to {name} does not satisfy {where_sql(where)}"
    checked = F.when(predicate, F.col(quote_identifier(key))).otherwise(F.raise_error(F.lit(message)))
    return rows.withColumn(key, checked)


def quote_identifier(name: str) -> str:
    """A Spark SQL identifier in backquotes (embedded backquotes doubled).

    Args:
        name: a column or table name.

    Returns:
        The quoted identifier, e.g. ``\\`topology_major\\```.
    """
    return "`" + name.replace("`", "``") + "`"


def sql_literal(value: WhereValue) -> str:
    """A Spark SQL literal for ``value``.

    Args:
        value: a bool, int, float, str, aware datetime, date or None.

    Returns:
        SQL text, e.g. ``42``, ``'it\\'s'``, ``TIMESTAMP '2026-01-01T00:00:00+00:00'``, ``NULL``.

    Raises:
        InvalidArgumentError: the value has another type, is not finite, or is a naive datetime.
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"{value}L" if not -(2**31) <= value < 2**31 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{value} has no SQL literal; use a finite number.")
        return f"{value!r}D"
    if isinstance(value, str):
        # Spark parses backslash escapes in string literals by default, so escape the backslash first.
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise InvalidArgumentError(f"datetime {value} has no time zone; pass an aware (UTC) datetime.")
        return f"TIMESTAMP '{value.astimezone(dt.UTC).isoformat()}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    raise InvalidArgumentError(f"{value!r} ({type(value).__name__}) has no SQL literal here.")


def where_sql(where: Mapping[str, WhereValue]) -> str:
    """The SQL text of a ``where`` mapping, for Delta's ``replaceWhere`` option and for commit messages.

    Args:
        where: column name to value; ``None`` means "is null".

    Returns:
        e.g. ```topology_major` = 5L AND `topology_minor` = 0`` (an empty mapping gives ``TRUE``).
    """
    terms = [
        f"{quote_identifier(k)} IS NULL" if v is None else f"{quote_identifier(k)} = {sql_literal(v)}"
        for k, v in where.items()
    ]
    return " AND ".join(terms) if terms else "TRUE"


def merge_condition(keys: Sequence[str], target: str = "t", source: str = "s") -> str:
    """The ON clause of an upsert on ``keys`` (plain equality: null keys never match, as in Delta MERGE).

    Args:
        keys: key column names.
        target: alias of the target table.
        source: alias of the source DataFrame.

    Returns:
        e.g. ``t.`group_name` = s.`group_name` AND t.`partition_id` = s.`partition_id```.
    """
    return " AND ".join(f"{target}.{quote_identifier(k)} = {source}.{quote_identifier(k)}" for k in keys)
