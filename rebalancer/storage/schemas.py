"""Fitting rows to a table's schema, by lossless widening only: Spark or Arrow rows on write, stored tables on read."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer import tables
from rebalancer.storage.errors import SchemaMismatchError

__all__ = ["NULL_MARKER", "can_store", "conform", "fit_arrow", "optional_columns", "project_declared"]

# Integral widening order: a type may be stored in any type to its right.
_INTEGRAL: tuple[type[T.DataType], ...] = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
# Decimal digits needed to hold every value of an integral type.
_INTEGRAL_DIGITS: dict[type[T.DataType], int] = {T.ByteType: 3, T.ShortType: 5, T.IntegerType: 10, T.LongType: 20}


def can_store(source: T.DataType, target: T.DataType) -> bool:
    """Whether a value of type ``source`` can be written into a column of type ``target`` without loss.

    Only widening is implicit: byte < short < int < bigint, integral or float to double, decimal to a decimal with
    at least as many integral and fractional digits, date to timestamp, char/varchar to string, and untyped nulls to
    anything; containers widen element-wise. Narrowing (bigint to int), fractional to integral and anything to or
    from string must be cast by the caller, where the decision is visible.

    Args:
        source: the type a DataFrame column has.
        target: the type the table declares.

    Returns:
        True when the conversion is lossless for every value.
    """
    if isinstance(source, T.NullType):
        return True
    if isinstance(source, (T.CharType, T.VarcharType)):
        return isinstance(target, T.StringType)
    if type(source) is type(target) and not isinstance(source, (T.ArrayType, T.MapType, T.StructType, T.DecimalType)):
        return source == target  # same atomic type (equality also compares string collations)
    elementwise = _elementwise(source, target, can_store)
    if elementwise is not None:
        return elementwise
    if type(source) in _INTEGRAL and type(target) in _INTEGRAL:
        return _INTEGRAL.index(type(source)) <= _INTEGRAL.index(type(target))
    if isinstance(target, T.DoubleType):
        # Every int and float is exactly representable as a double; a bigint is not (above 2^53).
        return isinstance(source, (T.ByteType, T.ShortType, T.IntegerType, T.FloatType))
    if isinstance(target, T.DecimalType):
        if isinstance(source, T.DecimalType):
            return source.scale <= target.scale and (source.precision - source.scale) <= (
                target.precision - target.scale
            )
        if type(source) in _INTEGRAL_DIGITS:
            return target.precision - target.scale >= _INTEGRAL_DIGITS[type(source)]
        return False
    return isinstance(source, T.DateType) and isinstance(target, T.TimestampType)


def _same_type(a: T.DataType, b: T.DataType) -> bool:
    """Equal types, ignoring the nullability flags inside containers (they never need a cast)."""
    elementwise = _elementwise(a, b, _same_type)
    return a == b if elementwise is None else elementwise


def _elementwise(a: T.DataType, b: T.DataType, holds: Callable[[T.DataType, T.DataType], bool]) -> bool | None:
    """For two arrays, two maps or two structs: whether ``holds`` for each pair of element, key, value or field types
    (struct fields also pair by name, in order). None when ``a`` and ``b`` are not two containers of one kind."""
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return holds(a.elementType, b.elementType)
    if isinstance(a, T.MapType) and isinstance(b, T.MapType):
        return holds(a.keyType, b.keyType) and holds(a.valueType, b.valueType)
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and holds(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields, strict=True)
        )
    return None


#: Marks the error a null written to a NOT NULL column raises while it is written (:func:`conform`).
NULL_MARKER = "rebalancer-null-violation"


def conform(df: DataFrame, target: T.StructType, table: str, *, optional: Collection[str] = ()) -> DataFrame:
    """Fit ``df`` to a table schema before writing: the table's columns, in its order, with its types.

    Columns of ``df`` the table does not have are dropped (a table cannot hold them). Types are converted only
    when :func:`can_store` allows it, so nothing is truncated or reinterpreted; everything else is refused before
    any data is read. Columns the table declares NOT NULL fail the write (at run time) if a null arrives.

    Args:
        df: the rows to write.
        target: the table's stored schema.
        table: the table name, for messages.
        optional: target columns ``df`` may lack; they are written as nulls (extra columns of input tables).

    Returns:
        A DataFrame whose schema equals ``target`` up to nullability.

    Raises:
        SchemaMismatchError: a required column is missing or a column's type cannot be stored losslessly.
    """
    fields = {f.name: f for f in df.schema.fields}
    problems: list[str] = []
    columns: list[Column] = []
    for field in target.fields:
        source = fields.get(field.name)
        if source is None:
            if field.name in optional:
                columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            else:
                problems.append(f"column {field.name} ({field.dataType.simpleString()}) is missing")
            continue
        if not can_store(source.dataType, field.dataType):
            problems.append(
                f"column {field.name} is {source.dataType.simpleString()} but the table stores "
                f"{field.dataType.simpleString()}"
            )
            continue
        column = df[field.name]
        if not _same_type(source.dataType, field.dataType):
            column = column.cast(field.dataType)
        if not field.nullable:
            message = f"{NULL_MARKER}: column {field.name} of {table} is NOT NULL but a null was written"
            column = F.when(column.isNull(), F.raise_error(F.lit(message))).otherwise(column)
        columns.append(column.alias(field.name))
    if problems:
        raise SchemaMismatchError(
            f"cannot write to {table}: {'; '.join(problems)} (cast explicitly where you accept a narrowing "
            f"or reinterpreting conversion)."
        )
    return df.select(*columns)


def project_declared(df: DataFrame, declared: T.StructType, table: str, *, missing_as_null: bool = False) -> DataFrame:
    """Fit a table as stored to its declared contract on read: declared columns only, in order, declared types.

    Args:
        df: the table as stored (every stored column, stored types).
        declared: the contract schema from :mod:`rebalancer.tables`.
        table: the table name, for messages.
        missing_as_null: a declared column the table does not store reads as null instead of failing: for a Delta
            version from before the column was added (time travel across ``rebalancer upgrade``).

    Returns:
        A DataFrame with exactly the declared columns and types.

    Raises:
        SchemaMismatchError: a declared column is missing or stored with a type that does not widen losslessly
            into the declared one (validate such tables through ``read_raw``).
    """
    stored = {f.name: f for f in df.schema.fields}
    problems: list[str] = []
    columns: list[Column] = []
    for field in declared.fields:
        source = stored.get(field.name)
        if source is None and missing_as_null:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
        elif source is None:
            problems.append(f"column {field.name} is missing")
        elif not can_store(source.dataType, field.dataType):
            problems.append(
                f"column {field.name} is stored as {source.dataType.simpleString()}, not "
                f"{field.dataType.simpleString()}"
            )
        elif _same_type(source.dataType, field.dataType):
            columns.append(df[field.name])
        else:
            columns.append(df[field.name].cast(field.dataType).alias(field.name))
    if problems:
        raise SchemaMismatchError(
            f"table {table} does not match its contract: {'; '.join(problems)} (read it with read_raw and "
            f"validate it, or rewrite it with the declared types)."
        )
    return df.select(*columns)

def fit_arrow(rows: pa.Table, stored: T.StructType, name: str, optional: set[str]) -> pa.Table:
    """``rows`` (on the driver) with exactly the stored columns, in order, cast to their Arrow types (safe casts only).

    Args:
        rows: the rows to write.
        stored: the table's stored schema.
        name: the table name, for messages.
        optional: stored columns ``rows`` may lack; they are written as nulls (:func:`optional_columns`).

    Raises:
        SchemaMismatchError: a required column is missing or a column does not cast safely.
    """
    schema = to_arrow_schema(stored, timezone="UTC")
    columns = []
    for field_ in schema:
        if field_.name in rows.column_names:
            column = rows.column(field_.name)
            try:
                columns.append(column.cast(field_.type, safe=True) if column.type != field_.type else column)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatchError(
                    f"cannot write to {name}: column {field_.name} is {column.type}, not {field_.type} ({exc})"
                ) from None
        elif field_.name in optional:
            columns.append(pa.nulls(rows.num_rows, field_.type))
        else:
            raise SchemaMismatchError(f"cannot write to {name}: column {field_.name} ({field_.type}) is missing")
    return pa.Table.from_arrays(columns, schema=schema)


def optional_columns(name: str, stored: T.StructType) -> set[str]:
    """Stored columns a write may omit: the extra columns of a contract table (written as nulls)."""
    declared = tables.SCHEMAS.get(name)
    if declared is None:
        return set()
    return set(stored.names) - set(declared.names)
