"""The engine-neutral part of storage: the :class:`Warehouse` interface and the pure helpers both engines share.

The helpers here hold the rules that must not differ between engines:

* which implicit conversions a write accepts (:func:`can_store`: lossless widening only, so a double never becomes
  a truncated int and a string never becomes a number behind the caller's back);
* how a DataFrame is fitted to a table (:func:`conform`) and how a stored table is fitted to its declared contract
  on read (:func:`project_declared`);
* how a ``where`` mapping becomes a Spark predicate or SQL text (:func:`where_predicate`, :func:`where_sql`);
* how commits that lose a race are retried (:func:`retry_on_conflict`).
"""

from __future__ import annotations

import abc
import collections
import datetime as dt
import functools
import json
import logging
import math
import operator
import os
import random
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from rebalancer import tables
from rebalancer.storage.errors import (
    ConcurrentWriteError,
    DuplicateKeyError,
    InvalidArgumentError,
    SchemaMismatchError,
    UnknownTableError,
)

__all__ = [
    "COMMIT_COLUMN",
    "ENGINES",
    "TableChanges",
    "TABLE_PROPERTIES",
    "WHERE_MARKER",
    "Warehouse",
    "WhereValue",
    "absent_rows",
    "can_store",
    "check_table_name",
    "check_unique_keys",
    "commit_each",
    "conform",
    "guard_where",
    "merge_condition",
    "project_declared",
    "quote_identifier",
    "retry_on_conflict",
    "sql_literal",
    "transaction_app",
    "where_predicate",
    "where_sql",
]

log = logging.getLogger("rebalancer.storage")

ENGINES = ("delta-rs", "delta-spark")

# Properties every table the engine creates carries: the lowest protocol every Delta reader understands, and no
# deletion vectors (a delta-rs warehouse is read by Spark as plain parquet files, which would resurrect rows that a
# deletion vector hides). delta-rs keeps 1/2 by default; delta-spark needs the explicit properties.
TABLE_PROPERTIES: dict[str, str] = {
    "delta.minReaderVersion": "1",
    "delta.minWriterVersion": "2",
    "delta.enableDeletionVectors": "false",
}

WhereValue = bool | int | float | str | dt.datetime | dt.date | None

#: The column :meth:`Warehouse.changes` adds to every new row: the Delta version of the commit that added it.
COMMIT_COLUMN = "__rebalancer_commit"


class TableChanges:
    """The rows a table gained after a Delta version (:meth:`Warehouse.changes`).

    Attributes:
        rows: the new rows, every stored column plus :data:`COMMIT_COLUMN` (bigint): the version of the commit that
            added each row (rows of one commit share it; a table rewritten in place is one commit, its latest).
        version: the table's latest Delta version, the one the rows were read at.
        known_empty: the engine knows without a Spark job that there are no new rows.
    """

    def __init__(self, rows: DataFrame, version: int, known_empty: bool = False) -> None:
        self.rows = rows
        self.version = version
        self.known_empty = known_empty

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Integral widening order: a type may be stored in any type to its right.
_INTEGRAL: tuple[type[DataType], ...] = (ByteType, ShortType, IntegerType, LongType)
# Decimal digits needed to hold every value of an integral type.
_INTEGRAL_DIGITS: dict[type[DataType], int] = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 20}


def local_directory(location: str | Path) -> str | None:
    """The absolute local directory of a path (relative to the working directory, or absolute) or a ``file:`` URI;
    None for a remote URI (s3://, abfss://, dbfs:/ ...). The directory need not exist."""
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        text = unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:  # one letter is a Windows drive, not a scheme
        return None
    return str(Path(text).expanduser().resolve())


def files_added_by_commit(table_dir: str, since: int | None, now: int) -> dict[int, list[str]] | None:
    """Data files added by each commit after ``since`` (all commits when None), from the JSON commit files of a
    table in a local directory (both engines: Delta keeps the commit that added a row only in its log).

    Returns None when the window holds a ``remove`` of a file (the table was rewritten, not only appended to) or
    a commit file is missing (cleaned up after a checkpoint): the caller then compares contents instead.
    """
    added: dict[int, list[str]] = {}
    for version in range((since + 1) if since is not None else 0, now + 1):
        path = os.path.join(table_dir, "_delta_log", f"{version:020d}.json")
        try:
            with open(path, encoding="utf-8") as log:
                actions = [json.loads(line) for line in log if line.strip()]
        except FileNotFoundError:
            return None
        for action in actions:
            if "remove" in action and since is not None:
                return None
            if "add" in action:
                added.setdefault(version, []).append(unquote(action["add"]["path"]))
    return added


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


def can_store(source: DataType, target: DataType) -> bool:
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
    if isinstance(source, NullType):
        return True
    if isinstance(source, (CharType, VarcharType)):
        return isinstance(target, StringType)
    if type(source) is type(target) and not isinstance(source, (ArrayType, MapType, StructType, DecimalType)):
        return source == target  # same atomic type (equality also compares string collations)
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return can_store(source.elementType, target.elementType)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return can_store(source.keyType, target.keyType) and can_store(source.valueType, target.valueType)
    if isinstance(source, StructType) and isinstance(target, StructType):
        return len(source.fields) == len(target.fields) and all(
            s.name == t.name and can_store(s.dataType, t.dataType)
            for s, t in zip(source.fields, target.fields, strict=True)
        )
    if type(source) in _INTEGRAL and type(target) in _INTEGRAL:
        return _INTEGRAL.index(type(source)) <= _INTEGRAL.index(type(target))
    if isinstance(target, DoubleType):
        # Every int and float is exactly representable as a double; a bigint is not (above 2^53).
        return isinstance(source, (ByteType, ShortType, IntegerType, FloatType))
    if isinstance(target, DecimalType):
        if isinstance(source, DecimalType):
            return source.scale <= target.scale and (source.precision - source.scale) <= (
                target.precision - target.scale
            )
        if type(source) in _INTEGRAL_DIGITS:
            return target.precision - target.scale >= _INTEGRAL_DIGITS[type(source)]
        return False
    return isinstance(source, DateType) and isinstance(target, TimestampType)


def _same_type(a: DataType, b: DataType) -> bool:
    """Equal types, ignoring the nullability flags inside containers (they never need a cast)."""
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return _same_type(a.keyType, b.keyType) and _same_type(a.valueType, b.valueType)
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and _same_type(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields, strict=True)
        )
    return a == b


_NULL_MARKER = "rebalancer-null-violation"


def conform(df: DataFrame, target: StructType, table: str, *, optional: Collection[str] = ()) -> DataFrame:
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
            message = f"{_NULL_MARKER}: column {field.name} of {table} is NOT NULL but a null was written"
            column = F.when(column.isNull(), F.raise_error(F.lit(message))).otherwise(column)
        columns.append(column.alias(field.name))
    if problems:
        raise SchemaMismatchError(
            f"cannot write to {table}: {'; '.join(problems)} (cast explicitly where you accept a narrowing "
            f"or reinterpreting conversion)."
        )
    return df.select(*columns)


def project_declared(df: DataFrame, declared: StructType, table: str, *, missing_as_null: bool = False) -> DataFrame:
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


# The Python value types a where may hold, and the column types each may be compared with.
_WHERE_TYPES: dict[type, tuple[type[DataType], ...]] = {
    bool: (BooleanType,),
    int: (ByteType, ShortType, IntegerType, LongType, DecimalType),
    float: (FloatType, DoubleType, DecimalType),
    str: (StringType, CharType, VarcharType),
    dt.datetime: (TimestampType, TimestampNTZType),
    dt.date: (DateType,),
}


def _check_where(where: Mapping[str, WhereValue], schema: StructType, table: str) -> None:
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


def where_predicate(where: Mapping[str, WhereValue], schema: StructType, table: str) -> Column:
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
    not_null = F.lit(True)
    for key in keys:
        not_null = not_null & F.col(quote_identifier(key)).isNotNull()
    duplicate = df.filter(not_null).groupBy(*keys).count().filter(F.col("count") > 1).limit(1).collect()
    if duplicate:
        row = duplicate[0]
        shown = ", ".join(f"{k}={row[k]!r}" for k in keys)
        raise DuplicateKeyError(
            f"the rows merged into {table} hold {row['count']} rows for key ({shown}); deduplicate the source first."
        )


def backoff_seconds(attempt: int) -> float:
    """Randomised exponential backoff before retry ``attempt`` (0-based): about 50 ms, 100 ms, ... capped at 2 s.

    The jitter keeps two writers that collided from colliding again in lockstep.
    """
    return min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())


#: Marks the error a row outside a ``replace_where``'s ``where`` raises while it is written (:func:`guard_where`).
WHERE_MARKER = "rebalancer-where-mismatch"


def guard_where(rows: DataFrame, where: Mapping[str, WhereValue], predicate: Column, name: str) -> DataFrame:
    """Make the write itself fail on a row outside ``where`` (no extra Spark job: the check runs while writing)."""
    key = next(iter(where))
    message = f"{WHERE_MARKER}: a row written to {name} does not satisfy {where_sql(where)}"
    checked = F.when(predicate, F.col(quote_identifier(key))).otherwise(F.raise_error(F.lit(message)))
    return rows.withColumn(key, checked)


def transaction_app(name: str) -> str:
    """The Delta application transaction id (``txn`` action) that every rewrite of table ``name`` records, with
    the table version it planned from plus one: two rewrites planned from one version conflict (both engines)."""
    return f"rebalancer:{name}"


def retry_on_conflict(
    action: Callable[[], T],
    *,
    table: str,
    retries: int,
    is_conflict: Callable[[BaseException], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``action`` and re-run it when its commit lost a race with another writer.

    ``action`` must re-plan from the table's latest version on every call (a conflict means its snapshot is stale).

    Args:
        action: one attempt: plan, write files, commit.
        table: the table name, for messages.
        retries: how many times a conflicting attempt is retried (``storage.commit_retries``).
        is_conflict: tells a lost commit race from any other error (which propagates at once).
        sleep: waits between attempts (replaceable in tests).

    Returns:
        What the successful attempt returned.

    Raises:
        ConcurrentWriteError: every one of the ``retries + 1`` attempts conflicted.
    """
    last: BaseException | None = None
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as exc:
            if not is_conflict(exc):
                raise
            last = exc
            log.warning(
                "commit to %s conflicted with another writer (attempt %d of %d)", table, attempt + 1, retries + 1
            )
            if attempt < retries:
                sleep(backoff_seconds(attempt))
    raise ConcurrentWriteError(
        f"writing {table} lost the commit race to other writers {retries + 1} times "
        f"(storage.commit_retries = {retries}); run it again once the other writer has finished, or raise "
        f"storage.commit_retries."
    ) from last


def commit_each(
    spark: SparkSession,
    commits: Mapping[str, Callable[[], None]],
    workers: int,
    committed: Callable[[str], None] | None = None,
) -> None:
    """Run independent ``commits``, up to ``workers`` at once, calling ``committed(name)`` on this thread as each
    one ends (in the order they end; with one worker, in ``commits`` order).

    Every commit runs with this thread's Spark job group and description (or Connect tags), so its jobs are
    counted and named with the caller's. On the first error (of a commit or of ``committed``) the commits not
    started are cancelled, the running ones finish, and that error is raised.
    """
    if workers <= 1 or len(commits) <= 1:
        for name, commit in commits.items():
            commit()
            if committed is not None:
                committed(name)
        return
    from pyspark import inheritable_thread_target  # each wrapper holds its own copy of the job properties

    pool = ThreadPoolExecutor(max_workers=min(workers, len(commits)), thread_name_prefix="rebalancer-commit")
    try:
        futures = {pool.submit(inheritable_thread_target(spark)(commit)): name for name, commit in commits.items()}
        for future in as_completed(futures):
            future.result()
            if committed is not None:
                committed(futures[future])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Warehouse(abc.ABC):
    """One Delta table per name of ``tables.SCHEMAS``, in a directory or a Unity Catalog schema.

    This is the only interface through which rebalancer touches Delta. Writes are one Delta commit each (so a
    reader of any table version sees a write completely or not at all), are fitted to the table schema first
    (:func:`conform`), and are retried on commit conflicts up to ``storage.commit_retries`` times.

    Attributes:
        engine: ``"delta-rs"`` or ``"delta-spark"``.
        spark: the session used for reading and for writing data files.
        commit_retries: retries of a write whose commit lost a race with another writer.
        concurrent_commits: how many independent commits :meth:`replace_where_many` may make at once.
    """

    engine: str

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the warehouse is, for messages: its absolute directory or URI, or its catalog prefix."""

    @property
    def reads_on_driver(self) -> bool:
        """Whether :meth:`read_arrow` reads on the driver, without a Spark job (the pipeline then decides small
        exchanges there: ``pipeline.DRIVER_KERNEL_REPLICAS``)."""
        return False

    def __init__(self, spark: SparkSession, *, commit_retries: int = 5, concurrent_commits: int = 1) -> None:
        self.spark = spark
        self.commit_retries = commit_retries
        self.concurrent_commits = concurrent_commits
        self._views: set[str] = set()

    # ---- tables ----
    @abc.abstractmethod
    def create_tables(self, names: Iterable[str] | None = None) -> list[str]:
        """Create the missing tables, empty, with their declared schemas; idempotent.

        Args:
            names: tables to create; ``None`` creates every table of ``tables.SCHEMAS``.

        Returns:
            The names of the tables this call created (existing tables are left alone).

        Raises:
            UnknownTableError: a name is not a table of the contract.
        """

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """Whether table ``name`` exists.

        Args:
            name: a table name.

        Returns:
            True when a Delta table is there.

        Raises:
            UnknownTableError: the name is not a valid identifier.
        """

    @abc.abstractmethod
    def path_of(self, name: str) -> str:
        """Where table ``name`` lives: its directory, or with a catalog prefix its full name ``catalog.schema.name``.

        Args:
            name: a table name.

        Returns:
            An absolute path, a URI, or a catalog table name.

        Raises:
            UnknownTableError: the name is not a valid identifier.
        """

    @abc.abstractmethod
    def table_version(self, name: str) -> int:
        """The latest Delta version of table ``name`` (0 right after creation).

        Args:
            name: a table name.

        Returns:
            The version number.

        Raises:
            TableNotFoundError: the table does not exist.
        """

    @abc.abstractmethod
    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        """When each Delta version of table ``name`` was committed (the commit's timestamp, UTC).

        Raises:
            TableNotFoundError: the table does not exist.
        """

    # ---- reads ----
    @abc.abstractmethod
    def read(
        self, name: str, version: int | None = None, where: Mapping[str, WhereValue] | None = None
    ) -> DataFrame:
        """Table ``name`` at ``version`` (time travel) or at its latest version, optionally only rows of ``where``.

        Contract tables come back with exactly their declared columns and types (extra stored columns dropped,
        losslessly narrower stored types widened); other tables as stored. An empty table gives an empty DataFrame
        with the schema.

        Args:
            name: a table name.
            version: a Delta version; ``None`` for the latest.
            where: column name to value (``None`` matches nulls): only matching rows; engines skip the data files
                whose statistics rule them out (one topology version of a versioned table is a few files).

        Returns:
            A lazy DataFrame.

        Raises:
            TableNotFoundError: the table does not exist.
            VersionNotFoundError: the version does not exist.
            SchemaMismatchError: a contract table's stored schema cannot be read as declared.
            UnsupportedTableError: the table uses a feature this engine cannot read correctly.
        """

    @abc.abstractmethod
    def read_raw(self, name: str) -> DataFrame:
        """Table ``name`` as stored: every column with its stored type (for input validation).

        Args:
            name: a table name.

        Returns:
            A lazy DataFrame of the latest version.

        Raises:
            TableNotFoundError: the table does not exist.
            UnsupportedTableError: the table uses a feature this engine cannot read correctly.
        """

    def stored_columns(self, name: str) -> list[str]:
        """The names of the columns table ``name`` stores, read from its Delta log (no data read, no Spark job on
        the driver-side readers).

        Raises:
            TableNotFoundError: the table does not exist.
        """
        return list(self.read_raw(name).schema.names)

    def add_columns(self, name: str, fields: Sequence[StructField]) -> list[str]:
        """Add nullable columns to table ``name`` that it does not store yet: a metadata-only Delta commit (no data
        file is rewritten, the protocol stays reader 1 / writer 2); existing rows read them as null. Input tables
        may carry such extra columns (SPEC section 2); collectors add the ones they write (docs/KAFKA.md).

        Args:
            name: a table name.
            fields: the columns; those already stored are left alone.

        Returns:
            The names of the columns this call added.

        Raises:
            TableNotFoundError: the table does not exist.
        """
        stored = set(self.stored_columns(name))
        missing = [f for f in fields if f.name not in stored]
        if missing:
            self._add_columns(name, missing)
        return [f.name for f in missing]

    def latest_reports(self, groups: Sequence[str] | None = None) -> pa.Table:
        """The latest ``partition_reports`` row of every copy (highest ``report_seq``; SPEC: the latest per copy
        wins), with every stored column (the collectors' extra ones too), optionally of some groups only: one Spark
        job, whatever the length of the table's history.

        Raises:
            TableNotFoundError: the table does not exist.
        """
        raw = self.read_raw("partition_reports")
        if groups is not None:
            raw = raw.where(F.col("group_name").isin(list(groups)))
        latest = raw.groupBy("node_id", "group_name", "partition_id").agg(
            F.max_by(F.struct(*raw.columns), "report_seq").alias("latest"))
        return latest.select("latest.*").toArrow()

    @abc.abstractmethod
    def _add_columns(self, name: str, fields: Sequence[StructField]) -> None:
        """Add ``fields`` (not stored yet) to table ``name`` in one metadata-only commit."""

    def read_arrow(
        self, name: str, where: Mapping[str, WhereValue] | None = None, version: int | None = None
    ) -> pa.Table:
        """A small table (or the ``where`` rows of one) on the driver, as Arrow: for per-node and per-group data.

        Same columns and types as :meth:`read`. The delta-rs engine reads the files directly (no Spark job).

        Raises:
            TableNotFoundError: the table does not exist.
        """
        return self.read(name, version=version, where=where).toArrow()

    def read_stored_arrow(self, name: str) -> pa.Table:
        """A small table on the driver as stored: every column, the extra ones collectors add too
        (:data:`rebalancer.tables.COLLECTED_COLUMNS`), with their stored types. The delta-rs engine reads the files
        directly (no Spark job).

        Raises:
            TableNotFoundError: the table does not exist.
        """
        return self.read_raw(name).toArrow()

    def changes(self, name: str, since: int | None) -> TableChanges:
        """The rows committed to ``name`` after Delta version ``since`` (every row when ``since`` is None).

        For append-only tables (inputs written by collectors) this reads only the files added since; a table
        rewritten in place instead gives the rows now present that were not present at ``since`` (by content, as a
        multiset), all marked with the latest version. Tables with map columns support only ``since`` None.

        Raises:
            TableNotFoundError: the table does not exist.
        """
        now = self.table_version(name)
        current = self.read_raw(name)
        if since is None:
            rows = current
        elif since >= now:
            return TableChanges(current.limit(0).withColumn(COMMIT_COLUMN, F.lit(now).cast("bigint")), now, True)
        else:
            declared = tables.SCHEMAS.get(name)
            before = self.read(name, version=since)
            rows = (current.select(*declared.names) if declared else current).exceptAll(before)
        return TableChanges(rows.withColumn(COMMIT_COLUMN, F.lit(now).cast("bigint")), now)

    def changes_arrow(
        self, name: str, since: int | None, max_rows: int | None = None
    ) -> tuple[pa.Table | None, int]:
        """:meth:`changes` of a small table, on the driver: the new rows as stored (every stored column, stored
        types) plus :data:`COMMIT_COLUMN`, and the table's latest version. The delta-rs engine needs no Spark job.

        Args:
            name: a table name.
            since: as for :meth:`changes`.
            max_rows: give up (return None for the rows) when there are more new rows than this.
        """
        found = self.changes(name, since)
        if max_rows is not None and found.rows.limit(max_rows + 1).count() > max_rows:
            return None, found.version
        return found.rows.toArrow(), found.version

    def replace_where_many(
        self,
        frames: Mapping[str, DataFrame | pa.Table],
        where: Mapping[str, WhereValue],
        committed: Callable[[str], None] | None = None,
        rows_hint: int | None = None,
    ) -> None:
        """:meth:`replace_where` of several tables with one ``where``: one commit per table (a table given as Arrow
        rows is written as by :meth:`replace_where_arrow`).

        The commits are independent: an engine may make up to ``concurrent_commits`` of them at once, in any
        order (delta-spark does: each of its commits runs Spark jobs whose fixed cost overlaps). ``committed`` is
        called on the calling thread with each table's name once its commit is in, in the order they come in. If
        a commit or ``committed`` raises, the commits not started are not made, those running finish, and the
        first error is raised. Engines may also compute every table's data files in one Spark job before the
        first commit (delta-rs does for small writes). ``rows_hint``: about how many rows the frames hold in all
        (None: unknown), for engines that choose their write path by size.
        """
        commits = {name: functools.partial(self._replace_one, name, rows, where) for name, rows in frames.items()}
        commit_each(self.spark, commits, self.concurrent_commits, committed)

    @contextmanager
    def commits_ahead(self, names: Sequence[str]) -> Iterator[None]:
        """Within this block the caller will commit to the tables ``names`` (an exchange says so before it computes
        its rows): an engine may prepare those commits meanwhile, and has stopped preparing when the block ends.
        A hint only: a commit is the same, prepared or not. delta-rs has nothing to prepare."""
        yield

    def _replace_one(self, name: str, rows: DataFrame | pa.Table, where: Mapping[str, WhereValue]) -> None:
        if isinstance(rows, pa.Table):
            self.replace_where_arrow(name, rows, where)
        else:
            self.replace_where(name, rows, where)

    # ---- writes from the driver (small tables: per node, per group, one exchange) ----
    def append_arrow(self, name: str, rows: pa.Table) -> None:
        """:meth:`append` for rows already on the driver (the delta-rs engine writes them without a Spark job)."""
        if rows.num_rows:
            self.append(name, self.spark.createDataFrame(rows))

    def replace_where_arrow(self, name: str, rows: pa.Table, where: Mapping[str, WhereValue]) -> None:
        """:meth:`replace_where` for rows already on the driver."""
        self.replace_where(name, self._frame(rows, name), where)

    def insert_absent_arrow(self, name: str, rows: pa.Table, keys: Sequence[str]) -> None:
        """Insert the rows whose ``keys`` are not in the table yet, in one commit (an insert-only :meth:`merge`).

        Two concurrent calls inserting the same key insert it once: the loser's commit conflicts, and its retry
        finds the key present.
        """
        self.merge(name, self._frame(rows, name), keys, insert_only=True)

    def merge_arrow(self, name: str, rows: pa.Table, keys: Sequence[str]) -> None:
        """:meth:`merge` (an upsert on ``keys``) for rows already on the driver: what a collector does to keep the
        ``nodes`` and ``cache_groups`` rows of a live cluster current (an appended second row for a key would be
        rejected: the row committed first stands)."""
        self.merge(name, self._frame(rows, name), keys)

    def _frame(self, rows: pa.Table, name: str) -> DataFrame:
        """Driver rows as a DataFrame of the table's declared schema. An empty Arrow table may hold no chunk at all
        (delta-rs reads give such tables), which pyspark's Arrow conversion refuses: it gets an empty frame. The
        extra columns a collector writes (:data:`rebalancer.tables.COLLECTED_COLUMNS`) come along when present."""
        session = self._driver_rows_session(rows.num_rows)
        extra = [f for f in tables.COLLECTED_COLUMNS.get(name, ()) if f.name in rows.column_names]
        schema = StructType([*tables.SCHEMAS[name].fields, *extra]) if extra else tables.SCHEMAS[name]
        if rows.num_rows == 0:
            return session.createDataFrame([], schema)
        return session.createDataFrame(rows.select(schema.names), schema=schema)

    def _driver_rows_session(self, rows: int) -> SparkSession:
        """The session ``rows`` driver rows become a DataFrame in (and are committed from): the caller's."""
        return self.spark

    # ---- writes ----
    @abc.abstractmethod
    def append(self, name: str, df: DataFrame) -> None:
        """Add the rows of ``df`` to table ``name`` in one commit (nothing is committed for an empty ``df``).

        Args:
            name: a table name.
            df: rows; cast losslessly to the table schema, extra columns dropped.

        Raises:
            TableNotFoundError: the table does not exist.
            SchemaMismatchError: ``df`` lacks a column or has a type that would be narrowed.
            ConcurrentWriteError: the commit kept conflicting with other writers.
        """

    @abc.abstractmethod
    def replace_where(self, name: str, df: DataFrame, where: Mapping[str, WhereValue]) -> None:
        """Replace the rows whose columns equal ``where`` with the rows of ``df``, in one atomic commit.

        Running it again with the same arguments leaves the same rows (no duplicates). Every row of ``df`` must
        itself satisfy ``where``. An empty ``where`` matches every row: the table's contents are replaced.

        Args:
            name: a table name.
            df: the new rows.
            where: column name to value (``None`` matches nulls), e.g. ``{"topology_major": 5, "topology_minor": 0}``.

        Raises:
            TableNotFoundError: the table does not exist.
            InvalidArgumentError: ``where`` names unknown columns or holds unsupported values.
            SchemaMismatchError: ``df`` does not fit the table.
            WhereMismatchError: a row of ``df`` does not satisfy ``where``.
            ConcurrentWriteError: the commit kept conflicting with other writers.
        """

    @abc.abstractmethod
    def merge(self, name: str, df: DataFrame, keys: Sequence[str], *, insert_only: bool = False) -> None:
        """Upsert ``df`` into table ``name`` on ``keys``, in one atomic commit.

        A target row whose key occurs in ``df`` is replaced by that row (kept as it is with ``insert_only``); other
        rows of ``df`` are inserted. Null keys never match (as in Delta MERGE). Two concurrent merges into one table
        conflict and the loser re-runs against the winner's result, so an ``insert_only`` merge repeated
        concurrently still inserts a key once.

        Args:
            name: a table name.
            df: the new rows, at most one per key.
            keys: key column names.
            insert_only: insert the rows whose key is absent and leave existing keys untouched.

        Raises:
            TableNotFoundError: the table does not exist.
            InvalidArgumentError: ``keys`` is empty or names unknown columns.
            SchemaMismatchError: ``df`` does not fit the table.
            DuplicateKeyError: ``df`` holds two rows for one key.
            ConcurrentWriteError: the commit kept conflicting with other writers.
        """

    # ---- retention ----
    @abc.abstractmethod
    def delete_where(self, name: str, condition: str) -> None:
        """Delete the rows matching the SQL ``condition`` in one commit (the files holding them are rewritten; no
        deletion vectors, so the table stays plain Delta).

        Raises:
            TableNotFoundError: the table does not exist.
            ConcurrentWriteError: the commit kept conflicting with other writers.
        """

    @abc.abstractmethod
    def vacuum(self, name: str, retain_hours: int) -> int:
        """Delta VACUUM: delete the data files that no table version of the last ``retain_hours`` hours
        references (time travel to older versions stops working). Returns how many files were deleted."""

    def apply_retention(self, names: Sequence[str], condition: str | None, retain_hours: int) -> int:
        """Per table: :meth:`delete_where` of ``condition`` (None: no delete), then :meth:`vacuum`. The tables are
        independent, so up to ``concurrent_commits`` of them are done at once (as :meth:`replace_where_many`: each
        of delta-spark's commands runs Spark jobs whose fixed cost overlaps). Returns the files deleted in all."""
        deleted: dict[str, int] = {}

        def one(name: str) -> None:
            if condition is not None:
                self.delete_where(name, condition)
            deleted[name] = self.vacuum(name, retain_hours)

        commit_each(self.spark, {name: functools.partial(one, name) for name in names}, self.concurrent_commits)
        return sum(deleted.values())

    # ---- SQL ----
    def register_views(self, names: Iterable[str] | None = None) -> None:
        """Make tables queryable as ``spark.sql("SELECT ... FROM <name>")`` (session temporary views).

        Args:
            names: tables to expose; ``None`` exposes every existing table of the contract (missing ones are
                skipped).

        Raises:
            TableNotFoundError: a table named explicitly does not exist.
            UnknownTableError: a name is not a valid identifier.
        """
        if names is None:
            chosen = [n for n in tables.SCHEMAS if self.exists(n)]
        else:
            chosen = [check_table_name(n) for n in names]
        for name in chosen:
            self._register_view(name)
            self._views.add(name)

    @abc.abstractmethod
    def _register_view(self, name: str) -> None:
        """Create or replace the temporary view ``name`` over the table."""

    def _refresh_view(self, name: str) -> None:
        """After this warehouse wrote ``name``: re-point its view, if registered, at the new version."""
        if name in self._views:
            self._register_view(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(engine={self.engine!r})"
