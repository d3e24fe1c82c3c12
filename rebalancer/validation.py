"""Input validation: every input table checked against SPEC section 2 before any stage reads it.

Contract:

* :func:`conform` selects the SPEC columns of one raw table (extra columns are ignored) and casts them to the SPEC
  types with ``try_cast``. A table that lacks a column, or has a column whose type can never be cast (a string where
  a map belongs), raises :class:`InputSchemaError`. A *value* that does not cast (``'abc'`` in an int column, ``1.5``
  in an int column) rejects its row, not the table.
* :func:`validate_inputs` applies the rule catalogue (``docs/VALIDATION.md``) to all four input tables: types,
  enums, ranges, nulls in key columns, uniqueness, and references between tables. Every input row ends up in
  exactly one place: ``Validated.valid[table]`` (unchanged, SPEC schema) or ``Validated.rejected`` (SPEC
  ``rejected_rows`` schema: the original row as JSON and every reason it failed, joined by ``"; "``).
  Nothing is dropped silently, and no rule picks one of several conflicting rows.
* Rows that refer to a rejected row (a report of a node whose ``nodes`` row was rejected) are rejected too, with a
  reason that says so.
* ``strict=True`` raises :class:`InvalidInputError` instead of returning rejected rows. That is the only case that
  runs a Spark action here; otherwise everything is lazy DataFrame code (built-ins only, no UDF, no collect).
* Each rule is a condition (evaluated for every row: cheap boolean work on the valid path) and a sentence (built only
  for rejected rows, like the original row's JSON). ``partition_reports`` is shuffled once, by copy; the small
  ``nodes`` and ``cache_groups`` facts reach the other tables through broadcast joins.

Null means a default in some columns (``mode``, ``capacity``, ...). Validation keeps those nulls as they are, so
valid rows are the input rows unchanged; :func:`with_defaults` resolves them for the stages.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    CharType,
    DataType,
    DateType,
    DoubleType,
    FractionalType,
    IntegralType,
    LongType,
    MapType,
    NullType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from rebalancer.storage.base import COMMIT_COLUMN
from rebalancer.tables import INPUT_TABLES, REJECTED_ROWS
from rebalancer.validation_local import References
from rebalancer.vocabulary import (
    AFFINITIES,
    EVENT_TYPES,
    GROUP_EVENTS,
    LOSS_POLICIES,
    MAX_PARTITIONS,
    MODES,
    NODE_EVENTS,
    OWNING,
    PARTITIONERS,
    READ_WRITE_SAFE,
    STATES,
)

__all__ = [
    "ROW_COLUMN",
    "InputSchemaError",
    "InvalidInputError",
    "Consumer",
    "References",
    "Validated",
    "conform",
    "validate_inputs",
    "with_defaults",
]


_UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_STRICT_EXAMPLES = 3

# Working columns carried next to the SPEC columns while a table is checked (never in an output).
_RAW = "__rebalancer_raw"
_CAST_FAILED = "__rebalancer_cast_failed"
_CONTENT = "__rebalancer_content"
_COPY_RANK = "__rebalancer_copy_rank"
_DISTINCT = "__rebalancer_distinct"
_BAD = "__rebalancer_bad"
_SEGMENT = "__rebalancer_owning_segment"
_EARLIER_OWNING = "__rebalancer_earlier_owning"
_REGRESSION = "__rebalancer_counter_regression"
_NODE_REF = "__rebalancer_node"
_GROUP_REF = "__rebalancer_group"
_NODE_OK = f"{_NODE_REF}.ok"
_NODE_CLIENT = f"{_NODE_REF}.client"
_GROUP_OK = f"{_GROUP_REF}.ok"
_GROUP_PARTITIONS = f"{_GROUP_REF}.partitions"
_GROUP_PERSISTENT = f"{_GROUP_REF}.persistent"
#: A caller's row number, carried through validation into ``Validated.rejected`` (when the raw table has it), so
#: that a caller holding the rows can drop the rejected ones without collecting the valid ones.
ROW_COLUMN = "__rebalancer_row"
# Rows consumed by an earlier exchange, given for the rules that look across rows (never judged again).
_STORED = "__rebalancer_stored"
_STALE = "__rebalancer_stale"


class InputSchemaError(ValueError):
    """An input table is missing, misses SPEC columns, or has a column whose type cannot be cast to the SPEC type.

    The message lists, per table, what was expected and what was found.
    """


class InvalidInputError(ValueError):
    """Strict mode found bad input rows; the message gives the count per table and the first reasons.

    Attributes:
        counts: rejected rows per input table (tables without rejected rows are absent).
    """

    def __init__(self, message: str, counts: Mapping[str, int]) -> None:
        super().__init__(message)
        self.counts: dict[str, int] = dict(counts)

    @classmethod
    def of(cls, counts: Mapping[str, int], reasons: Mapping[str, Sequence[str]]) -> InvalidInputError:
        """The strict-mode error for ``counts`` rejected rows per table, quoting up to three ``reasons`` per table.

        The first line is one sentence naming the total and the first problem (the CLI prints only that line);
        the next lines list, per table in SPEC order, its first reasons alphabetically.

        Args:
            counts: rejected rows per table (tables with none may be absent or 0).
            reasons: some of each table's reasons (more than three are allowed; three are shown).
        """
        order = {name: i for i, name in enumerate(INPUT_TABLES)}
        tables = sorted((t for t, n in counts.items() if n), key=lambda t: (order.get(t, len(order)), t))
        shown = {t: int(counts[t]) for t in tables}
        examples = {t: sorted(reasons.get(t, ()))[:_STRICT_EXAMPLES] for t in tables}
        first = next((f"; first: {t}: {examples[t][0]}" for t in tables if examples[t]), "")
        lines = [
            f"strict validation: {sum(shown.values())} input row(s) rejected "
            f"({', '.join(f'{t}: {n}' for t, n in shown.items())}){first}"
        ]
        lines += [f"  {t}: {reason}" for t in tables for reason in examples[t]]
        lines.append("Fix these rows, or run with validation.strict = false to keep them in rejected_rows and go on.")
        return cls("\n".join(lines), shown)


@dataclass(frozen=True)
class Validated:
    """The outcome of :func:`validate_inputs`.

    Attributes:
        valid: per input table, the rows that passed every rule, unchanged and with exactly the SPEC schema.
        rejected: every other row, with the ``rejected_rows`` schema of SPEC section 3.
        numbered: the same rows plus :data:`ROW_COLUMN` (the caller's row number, where the raw table had one).
        checked: the cached checked tables (``persist=True``), for :meth:`release`.
    """

    valid: dict[str, DataFrame]
    numbered: DataFrame
    checked: tuple[DataFrame, ...] = ()

    @property
    def rejected(self) -> DataFrame:
        """Every rejected row, ``rejected_rows`` schema."""
        return self.numbered.select(*REJECTED_ROWS.fieldNames())

    def release(self) -> None:
        """Unpersist the checked tables a ``persist=True`` validation cached."""
        for df in self.checked:
            df.unpersist()


@dataclass(frozen=True)
class _Rule:
    """One rule of the catalogue, applied to one row.

    Attributes:
        broken: true where the row breaks the rule (null counts as false). Evaluated for every row.
        reason: the sentence that says how, naming the column, the value and what is allowed. Evaluated only for
            rejected rows, so it may only use columns of the checked frame (no window functions of its own).
    """

    broken: Column
    reason: Column


@dataclass(frozen=True)
class _Checked:
    """A checked table: its frame with the ``_BAD`` flag, the rules that set it, and the original row as JSON."""

    df: DataFrame
    rules: list[_Rule]
    row_json: Column


# =====================================================================================================================
# Schema: which raw types may be cast to which SPEC types
# =====================================================================================================================


def _is_text(dtype: DataType) -> bool:
    return isinstance(dtype, StringType | CharType | VarcharType)


def _castable(source: DataType, target: DataType) -> bool:
    """Whether a raw column of type ``source`` can feed the SPEC type ``target`` (value by value, via try_cast).

    Deliberately narrower than Spark's cast rules: only conversions a writer plausibly meant (numbers written as
    text, ints written as bigint, ids written as numbers). A boolean partition count or a map written as text is a
    schema error, not a per-row problem.
    """
    if source == target or isinstance(source, NullType):
        return True
    if isinstance(target, StringType):
        return _is_text(source) or isinstance(source, IntegralType)
    if isinstance(target, IntegralType | DoubleType):
        return _is_text(source) or isinstance(source, NumericType)
    if isinstance(target, BooleanType):
        return _is_text(source) or isinstance(source, BooleanType)
    if isinstance(target, TimestampType):
        return _is_text(source) or isinstance(source, TimestampType | TimestampNTZType | DateType)
    if isinstance(target, ArrayType):
        return isinstance(source, ArrayType) and _castable(source.elementType, target.elementType)
    if isinstance(target, MapType):
        return (
            isinstance(source, MapType)
            and _castable(source.keyType, target.keyType)
            and _castable(source.valueType, target.valueType)
        )
    return False


def _schema_problems(name: str, raw_df: DataFrame) -> list[str]:
    """Human-readable problems with the columns of ``raw_df`` as table ``name``; empty when it conforms."""
    spec = INPUT_TABLES[name]
    found = {field.name: field.dataType for field in raw_df.schema.fields}
    missing = [f"{f.name} {f.dataType.simpleString()}" for f in spec.fields if f.name not in found]
    wrong = [
        f"{f.name} is {found[f.name].simpleString()} (expected {f.dataType.simpleString()})"
        for f in spec.fields
        if f.name in found and not _castable(found[f.name], f.dataType)
    ]
    problems = []
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    if wrong:
        problems.append(f"column type(s) that cannot be cast: {', '.join(wrong)}")
    if problems:
        expected = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in spec.fields)
        arrived = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in raw_df.schema.fields) or "no columns"
        return [f"{name}: {'; '.join(problems)}. Expected: {expected}. Found: {arrived}."]
    return []


# =====================================================================================================================
# Small Column helpers
# =====================================================================================================================


def _col(name: str) -> Column:
    """A column by its exact name, even if the name contains dots or backticks."""
    return F.col("`" + name.replace("`", "``") + "`")


def _text(*parts: str | Column) -> Column:
    """Concatenate literal text and column values (cast to string) into a message."""
    return F.concat(*[F.lit(p) if isinstance(p, str) else p.cast("string") for p in parts])


def _quoted(column: str) -> Column:
    """``'value'`` of a column, for messages."""
    return _text("'", F.col(column), "'")


def _named(column: str) -> Column:
    """``column 'value'``, for messages."""
    return _text(f"{column} ", _quoted(column))


def _rule(broken: Column, reason: Column | str) -> _Rule:
    """A rule from its condition and its sentence."""
    return _Rule(F.coalesce(broken, F.lit(False)), F.lit(reason) if isinstance(reason, str) else reason)


def _article(dtype: DataType) -> str:
    name = dtype.simpleString()
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _cast_failed(column: str) -> Column:
    return F.array_contains(F.col(_CAST_FAILED), column)


def _clean() -> Column:
    """The row breaks no rule applied so far (only valid once ``_BAD`` exists)."""
    return ~F.col(_BAD)


# =====================================================================================================================
# Conforming: select + try_cast, remembering the original row
# =====================================================================================================================


def _conformed_frame(name: str, raw_df: DataFrame) -> tuple[DataFrame, list[_Rule], Column]:
    """SPEC columns cast to SPEC types, the cast-failure rules, and what it takes to rebuild the original row.

    Returns:
        The frame; one rule per column whose values may fail to cast; and a Column (valid on any frame derived from
        the first that keeps its columns) giving the original row as JSON. Values that the cast left unchanged are
        read back from the SPEC column, the others (extra columns, values before a cast) from one hidden struct, so
        the JSON is built only where it is used (rejected rows).

    Raises:
        InputSchemaError: see :func:`conform`.
    """
    if name not in INPUT_TABLES:
        raise InputSchemaError(f"{name!r} is not an input table; input tables: {', '.join(INPUT_TABLES)}")
    problems = _schema_problems(name, raw_df)
    if problems:
        raise InputSchemaError(problems[0])
    spec = INPUT_TABLES[name]
    found = {field.name: field.dataType for field in raw_df.schema.fields}
    carried = [c for c in (COMMIT_COLUMN, _STORED, ROW_COLUMN) if c in raw_df.columns]  # bookkeeping, not the row
    columns = [c for c in raw_df.columns if c not in carried]
    unchanged = [c for c in columns if c in spec.names and found[c] == spec[c].dataType]
    kept = {c: f"c{i}" for i, c in enumerate(columns) if c not in unchanged}  # raw value -> field of _RAW
    original = [_col(c) if c in unchanged else F.col(f"{_RAW}.{kept[c]}").alias(c) for c in columns]
    row_json = F.to_json(F.struct(*original), {"ignoreNullFields": "false"})

    casts: list[Column] = []
    cast_rules: list[_Rule] = []
    failed_names: list[Column] = []
    for field in spec.fields:
        raw, source, target = _col(field.name), found[field.name], field.dataType
        cast = raw if source == target else raw.try_cast(target)
        casts.append(cast.alias(field.name))
        if source == target or isinstance(source, NullType) or isinstance(target, ArrayType | MapType | StringType):
            continue  # these conversions cannot fail value by value
        failed = raw.isNotNull() & cast.isNull()
        if isinstance(source, FractionalType) and isinstance(target, IntegralType):
            failed = failed | (cast.cast(source) != raw)  # 1.5 -> 1 would silently change the value
        failed_names.append(F.when(failed, F.lit(field.name)))
        # On the conformed frame the value before the cast is in _RAW and the cast value in the SPEC column.
        before = F.col(f"{_RAW}.{kept[field.name]}")
        cast_rules.append(
            _rule(_cast_failed(field.name), _text(f"{field.name}: '", before, f"' is not {_article(target)}"))
        )
    frame_df = raw_df.select(
        *casts,
        *([F.struct(*[_col(c).alias(f) for c, f in kept.items()]).alias(_RAW)] if kept else []),
        F.array_compact(F.array(*failed_names, F.lit(None).cast("string"))).alias(_CAST_FAILED),
        *[_col(c) for c in carried],
    )
    return frame_df, cast_rules, row_json


def _spec_columns(name: str) -> list[str]:
    return INPUT_TABLES[name].fieldNames()


def _with_schema(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` (columns already in ``schema`` order and types) reported with exactly ``schema``, nullability included.

    Literals and casts of non-null input are non-nullable; a union with an empty all-null projection of ``df``
    makes every column nullable, as SPEC declares, and the optimizer removes the empty side.
    """
    empty_df = df.where(F.lit(False)).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])
    return empty_df.union(df)


def _rejected_rows(name: str, checked: _Checked, exchange_id: Column) -> DataFrame:
    """The rows of a checked table that break a rule, as ``rejected_rows`` (sentences built only here)."""
    row = F.col(ROW_COLUMN) if ROW_COLUMN in checked.df.columns else F.lit(None)
    rejected_df = checked.df.where(F.col(_BAD) & _is_new(checked.df)).select(
        F.lit(name).alias("table_name"),
        checked.row_json.alias("row_json"),
        F.concat_ws("; ", *[F.when(rule.broken, rule.reason) for rule in checked.rules]).alias("reason"),
        exchange_id.cast("bigint").alias("exchange_id"),
        row.cast("bigint").alias(ROW_COLUMN),
    )
    return _with_schema(rejected_df, StructType([*REJECTED_ROWS.fields, StructField(ROW_COLUMN, LongType())]))


def _valid_rows(name: str, checked: _Checked) -> DataFrame:
    valid_df = checked.df.where(~F.col(_BAD) & _is_new(checked.df)).select(*_spec_columns(name))
    return _with_schema(valid_df, INPUT_TABLES[name])


def _is_new_col() -> Column:
    """:func:`_is_new` for a frame known to carry ``_STORED`` (the partition_reports check adds it)."""
    return ~F.coalesce(F.col(_STORED), F.lit(False))


def _is_new(df: DataFrame) -> Column:
    """Rows to judge: all of them, except the stored rows given only as context (see :func:`validate_inputs`)."""
    return ~F.col(_STORED) if _STORED in df.columns else F.lit(True)


def _with_rules(df: DataFrame, rules: Sequence[_Rule]) -> DataFrame:
    """Set ``_BAD`` where a row breaks any of ``rules`` (or, if ``_BAD`` exists, any rule applied before)."""
    broken = [F.col(_BAD)] if _BAD in df.columns else []
    broken += [rule.broken for rule in rules]
    return df.withColumn(_BAD, functools.reduce(lambda a, b: a | b, broken, F.lit(False)))


def conform(name: str, raw_df: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Select and cast the SPEC columns of input table ``name``; reject rows whose values do not cast.

    Args:
        name: an input table of SPEC section 2 (``cache_groups``, ``nodes``, ``topology_events``,
            ``partition_reports``).
        raw_df: the table as it arrived; extra columns are ignored.

    Returns:
        ``(conformed_df, rejected_df)``: the rows whose every non-null value casts, with exactly the SPEC schema, and
        the others in the ``rejected_rows`` schema (``exchange_id`` null) with a reason per failed column, e.g.
        ``"partition_id: 'abc' is not an int"``.

    Raises:
        InputSchemaError: ``name`` is not an input table, a SPEC column is missing, or a column has a type that can
            never be cast to its SPEC type; the message lists the expected and the found columns.
    """
    frame_df, cast_rules, row_json = _conformed_frame(name, raw_df)
    checked = _Checked(_with_rules(frame_df, cast_rules), cast_rules, row_json)
    return _valid_rows(name, checked), _rejected_rows(name, checked, F.lit(None)).select(*REJECTED_ROWS.fieldNames())


# =====================================================================================================================
# The rule catalogue: each helper is one rule (where it is broken, and the sentence that says so)
# =====================================================================================================================


def _required(column: str, allowed: str) -> _Rule:
    """A column that must not be null (a value that failed to cast already has its own reason)."""
    return _rule(F.col(column).isNull() & ~_cast_failed(column), f"{column} is null; it must be {allowed}")


def _blank(column: str) -> _Rule:
    """A name column that holds only whitespace."""
    return _rule(F.trim(F.col(column)) == "", _text(f"{column} ", _quoted(column), " is blank; it must be a name"))


def _not_one_of(column: str, allowed: Sequence[str], null_means: str | None = None) -> _Rule:
    """An enum column with a value outside SPEC's list (null is left to other rules)."""
    default = f" (null means {null_means})" if null_means else ""
    message = _text(f"{column} ", _quoted(column), f" is not one of {', '.join(allowed)}{default}")
    return _rule(~F.col(column).isin(*allowed), message)


def _negative(column: str) -> _Rule:
    """A count below zero (counters, sizes, ``backups``, ``partition_id``)."""
    return _rule(F.col(column) < 0, _text(f"{column} ", F.col(column), " is negative; it must be >= 0"))


def _outside(column: str, low: int, high: int) -> _Rule:
    """A number outside ``low..high`` inclusive."""
    return _rule(~F.col(column).between(low, high), _text(f"{column} ", F.col(column), f" is not in {low}..{high}"))


def _null_in_list(column: str) -> _Rule:
    """An array column with a null element."""
    return _rule(
        F.exists(F.col(column), lambda x: x.isNull()),
        _text(f"{column} ", F.col(column), " contains a null; list attribute names only"),
    )


def _bad_capacity() -> _Rule:
    """``capacity`` must be a finite number > 0 (NaN compares greater than everything in Spark, so test it)."""
    capacity = F.col("capacity")
    bad = (capacity <= 0) | F.isnan(capacity) | (capacity == F.lit(float("inf")))
    return _rule(bad, _text("capacity ", capacity, " is not a finite number > 0 (null means 1.0)"))


def _not_a_uuid(column: str) -> _Rule:
    """A runtime UUID that ``UUID.compareTo`` could not order (only the canonical 8-4-4-4-12 text is accepted)."""
    return _rule(
        ~F.col(column).rlike(_UUID_PATTERN),
        _text(f"{column} ", _quoted(column), " is not a UUID (8-4-4-4-12 hex digits)"),
    )


def _key_column(kind: str, keys: Sequence[str]) -> str:
    return f"{_DISTINCT}_{kind}_{'_'.join(keys)}"


def _conflicting(keys: Sequence[str], table: str, subject: Column, rule: str) -> _Rule:
    """Rows of one commit that share a key which must be unique but differ in content: all of them are rejected.

    Exact copies of one row do not conflict (they are the ``_extra_copy`` rule's business). Rows of different
    commits are judged by :func:`_taken`: the row committed first stands.
    """
    distinct = F.col(_key_column("commit", keys))
    present = functools.reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in keys])
    message = _text(
        subject, " appears in ", distinct, f" different {table} rows committed together; {rule}, so all of them are "
        "rejected",
    )  # fmt: skip
    return _rule(present & (distinct > 1), message)


def _taken(keys: Sequence[str], table: str, subject: Column, rule: str) -> _Rule:
    """A row whose key a row committed earlier already holds, with other content: the earlier row stands."""
    present = functools.reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in keys])
    later = F.col(COMMIT_COLUMN) > F.col(_key_column("decided", keys))
    other = F.col(_CONTENT) != F.col(_key_column("standing", keys))
    message = _text(subject, f" is already held by a {table} row committed earlier, which stands ({rule})")
    return _rule(present & later & other, message)


def _extra_copy(key: Sequence[str], table: str) -> _Rule:
    """Rows identical in every SPEC column (a retried append): one is checked as usual, the others rejected."""
    message = f"exact duplicate of another {table} row (one copy is used, the others are rejected)"
    decided = F.col(_key_column("decided", key))
    same_commit = (F.col(COMMIT_COLUMN) == decided) & (F.col(_key_column("commit", key)) == 1) & (
        F.col(_COPY_RANK) > 1
    )
    later_copy = (F.col(COMMIT_COLUMN) > decided) & (F.col(_CONTENT) == F.col(_key_column("standing", key)))
    return _rule(same_commit | later_copy, message)


def _unknown_reference(column: str, table: str, ok: str) -> _Rule:
    """A reference to a row that does not exist in ``table``."""
    return _rule(
        F.col(column).isNotNull() & F.col(ok).isNull(), _text(f"{column} ", _quoted(column), f" is not in {table}")
    )


def _rejected_reference(column: str, table: str, ok: str) -> _Rule:
    """A reference to a row of ``table`` that was itself rejected."""
    message = _text(f"{column} ", _quoted(column), f" refers to a {table} row that was rejected (see its reason)")
    return _rule(F.col(column).isNotNull() & ~F.col(ok), message)


def _needs(column: str, event_types: Sequence[str]) -> _Rule:
    """An event type that needs ``column`` arrived without it."""
    return _rule(
        F.col("event_type").isin(*event_types) & F.col(column).isNull(),
        _text(F.col("event_type"), f" event has no {column}; {', '.join(event_types)} events need one"),
    )


def _client_report() -> _Rule:
    """A partition report from a client node: clients hold no data."""
    return _rule(
        F.col(_NODE_CLIENT),
        _text("node_id ", _quoted("node_id"), " is a client node (is_client = true); clients hold no partitions"),
    )


def _partition_beyond_group() -> _Rule:
    """``partition_id`` at or beyond its group's partition count."""
    count = F.col(_GROUP_PARTITIONS)
    message = _text(
        "partition_id ", F.col("partition_id"), " is out of range for group ", _quoted("group_name"),
        ", which has ", count, " partitions (0..", count - 1, ")",
    )  # fmt: skip
    return _rule(F.col(_GROUP_OK) & (F.col("partition_id") >= count), message)


def _history_beyond_counter() -> _Rule:
    """``wal_history_counter`` above ``update_counter``: a node cannot replay history it has not written."""
    message = _text(
        "wal_history_counter ", F.col("wal_history_counter"), " is greater than update_counter ",
        F.col("update_counter"), "; a node's WAL history cannot start after its current counter",
    )  # fmt: skip
    return _rule(F.col("wal_history_counter") > F.col("update_counter"), message)


def _not_alive(alive: Sequence[str], at: str) -> _Rule:
    """A report of a node that is not an alive server at the version consuming it: it cannot apply."""
    message = _text(
        "node_id ", _quoted("node_id"), f" is not alive at version {at}, which consumes this report; a report",
        " applies only while its node is alive (a node that joins again reports its partitions again)",
    )  # fmt: skip
    known = F.coalesce(F.col(_NODE_OK), F.lit(False)) & ~F.coalesce(F.col(_NODE_CLIENT), F.lit(False))
    return _rule(_is_new_col() & known & ~F.col("node_id").isin(list(alive)), message)


def _not_running(running: Sequence[str], at: str) -> _Rule:
    """A report of a group that is not running at the version consuming it."""
    message = _text(
        "group_name ", _quoted("group_name"), f" is not running at version {at}, which consumes this report",
        " (stopped, or not started yet); append the report again once the group runs",
    )  # fmt: skip
    known = F.coalesce(F.col(_GROUP_OK), F.lit(False))
    return _rule(_is_new_col() & known & ~F.col("group_name").isin(list(running)), message)


def _stale() -> _Rule:
    """A report not newer than a report of the same copy that an earlier exchange consumed: it can never apply."""
    message = _text(
        "report_seq ", F.col("report_seq"), " of node ", _quoted("node_id"), ", group ", _quoted("group_name"),
        ", partition ", F.col("partition_id"), " is not newer than report_seq ", F.col(_STALE), " of this copy, which",
        " an earlier exchange consumed; a copy's reports apply in report_seq order, so append it again with a",
        " report_seq above ", F.col(_STALE),
    )  # fmt: skip
    return _rule(_is_new_col() & (F.col("report_seq") <= F.col(_STALE)), message)


def _counter_regression(previous_max: Column, previous_seq: Column) -> _Rule:
    """An OWNING report of a persistent copy whose counter is below an earlier OWNING report of the same copy with
    no MOVING, RENTING, EVICTED or LOST report in between (see docs/VALIDATION.md for why only this case)."""
    message = _text(
        "update_counter ", F.col("update_counter"), " is lower than ", previous_max,
        " in the earlier OWNING report of this copy (report_seq ", previous_seq,
        ") with no MOVING, RENTING, EVICTED or LOST report in between; the counter of a persistent OWNING copy"
        " never decreases",
    )  # fmt: skip
    applies = _clean() & (F.col("state") == OWNING) & F.coalesce(F.col(_GROUP_PERSISTENT), F.lit(False))
    return _rule(applies & (F.col("update_counter") < previous_max), message)


# =====================================================================================================================
# Per-table checks
# =====================================================================================================================


def _with_copies(df: DataFrame, name: str, unique_keys: Sequence[Sequence[str]]) -> DataFrame:
    """Add what the uniqueness rules read, for each key that must be unique (the only windows of per-row rules).

    Keys are unique as under a database constraint, commit by commit (SPEC section 2): among the rows of one key,
    the first commit holding exactly one content *decides*: its row stands (one copy is used, exact copies are
    rejected) and rows of later commits are rejected, as duplicates or as conflicts. Rows of a commit holding
    several contents for the key are all rejected. A frame without :data:`COMMIT_COLUMN` is one commit. Stored
    rows (already consumed) take no part: they were judged when they were new.

    Columns per key: how many distinct contents the row's commit holds for the key, the deciding commit, the
    standing content; and each row's rank among the copies of its commit for the first (main) key. Content means
    every SPEC column; a map takes part as its JSON text (maps cannot be compared in Spark).
    """
    content = F.struct(
        *[
            F.to_json(f.name).alias(f.name) if isinstance(f.dataType, MapType) else F.col(f.name)
            for f in INPUT_TABLES[name].fields
        ]
    )
    if COMMIT_COLUMN not in df.columns:
        df = df.withColumn(COMMIT_COLUMN, F.lit(0).cast("bigint"))
    new = _is_new(df)
    df = df.withColumn(_CONTENT, content)
    added = {}
    for i, keys in enumerate(unique_keys):
        in_commit = Window.partitionBy(*keys, COMMIT_COLUMN)
        distinct = _key_column("commit", keys)
        df = df.withColumn(distinct, F.size(F.collect_set(F.when(new, F.col(_CONTENT))).over(in_commit)))
        if i == 0:
            df = df.withColumn(_COPY_RANK, F.row_number().over(in_commit.orderBy(*keys)))
        whole = Window.partitionBy(*keys)
        decided = F.min(F.when(new & (F.col(distinct) == 1), F.col(COMMIT_COLUMN))).over(whole)
        df = df.withColumn(_key_column("decided", keys), decided)
        standing = F.max(F.when(new & (F.col(COMMIT_COLUMN) == F.col(_key_column("decided", keys))),
                                F.col(_CONTENT))).over(whole)
        added[_key_column("standing", keys)] = standing
    return df.withColumns(added)


def _check_cache_groups(raw_df: DataFrame) -> _Checked:
    frame_df, cast_rules, row_json = _conformed_frame("cache_groups", raw_df)
    frame_df = _with_copies(frame_df, "cache_groups", [["group_name"]])
    rules = [
        *cast_rules,
        _required("group_name", "a unique name"),
        _blank("group_name"),
        _required("partitions", f"an int in 1..{MAX_PARTITIONS}"),
        _outside("partitions", 1, MAX_PARTITIONS),
        _required("backups", "an int >= 0"),
        _negative("backups"),
        _not_one_of("mode", MODES, "PARTITIONED"),
        _not_one_of("affinity", AFFINITIES, "rendezvous"),
        _null_in_list("backup_filter"),
        _not_one_of("loss_policy", LOSS_POLICIES, "READ_WRITE_SAFE"),
        _not_one_of("partitioner", PARTITIONERS, "ignite for the ignite affinity, else murmur3"),
        _conflicting(["group_name"], "cache_groups", _named("group_name"), "names must be unique"),
        _taken(["group_name"], "cache_groups", _named("group_name"), "names must be unique"),
        _extra_copy(["group_name"], "cache_groups"),
    ]
    return _Checked(_with_rules(frame_df, rules), rules, row_json)


def _check_nodes(raw_df: DataFrame) -> _Checked:
    frame_df, cast_rules, row_json = _conformed_frame("nodes", raw_df)
    frame_df = _with_copies(frame_df, "nodes", [["node_id"], ["node_uuid"], ["node_order"]])
    rules = [
        *cast_rules,
        _required("node_id", "a unique consistent id"),
        _blank("node_id"),
        _not_a_uuid("node_uuid"),
        _required("node_order", "a unique bigint join order"),
        _bad_capacity(),
        _conflicting(["node_id"], "nodes", _named("node_id"), "node ids must be unique"),
        _taken(["node_id"], "nodes", _named("node_id"), "node ids must be unique"),
        _conflicting(["node_uuid"], "nodes", _named("node_uuid"), "runtime UUIDs must be unique"),
        _taken(["node_uuid"], "nodes", _named("node_uuid"), "runtime UUIDs must be unique"),
        _conflicting(["node_order"], "nodes", _text("node_order ", F.col("node_order")), "join orders must be unique"),
        _taken(["node_order"], "nodes", _text("node_order ", F.col("node_order")), "join orders must be unique"),
        _extra_copy(["node_id"], "nodes"),
    ]
    return _Checked(_with_rules(frame_df, rules), rules, row_json)


def _node_references(nodes_checked_df: DataFrame) -> DataFrame:
    """One row per node_id: whether a valid row has it, and whether that node is a client (null = server).

    The facts travel as one struct so that every consumer reads the same columns and Spark computes (and
    broadcasts) the reference table once per query instead of once per consumer.
    """
    facts = F.struct(_clean().alias("ok"), (_clean() & F.coalesce(F.col("is_client"), F.lit(False))).alias("client"))
    return (
        nodes_checked_df.where(F.col("node_id").isNotNull())
        .groupBy("node_id")
        .agg(F.max(facts).alias(_NODE_REF))  # (true, ...) wins: at most one row per node_id is valid
    )


def _group_references(groups_checked_df: DataFrame) -> DataFrame:
    """One row per group_name: whether a valid row has it, its partition count and persistence (null = true)."""
    facts = F.struct(
        _clean().alias("ok"),
        F.col("partitions").alias("partitions"),
        F.coalesce(F.col("persistent"), F.lit(True)).alias("persistent"),
    )
    return (
        groups_checked_df.where(F.col("group_name").isNotNull())
        .groupBy("group_name")
        .agg(F.max(facts).alias(_GROUP_REF))  # (true, ...) wins: at most one row per group_name is valid
    )


def _with_references(
    df: DataFrame, node_refs_df: DataFrame | None, group_refs_df: DataFrame | None,
    references: References | None = None, *, broadcast: bool = True,
) -> DataFrame:
    """The reference facts of the node and group each row names: literal maps when the caller gave them (no join),
    else left joins with the facts computed from the checked tables (broadcast for large tables; a shuffle join
    for small ones, which keeps the whole validation one Spark job)."""
    if references is not None:
        node_facts = F.create_map(*[x for n, (ok, client) in references.nodes.items() for x in (
            F.lit(n), F.struct(F.lit(ok).alias("ok"), F.lit(client).alias("client")))])
        group_facts = F.create_map(*[x for g, (ok, parts, persistent) in references.groups.items() for x in (
            F.lit(g), F.struct(F.lit(ok).alias("ok"), F.lit(parts).cast("int").alias("partitions"),
                               F.lit(persistent).alias("persistent")))])
        node_type = "struct<ok:boolean,client:boolean>"
        group_type = "struct<ok:boolean,partitions:int,persistent:boolean>"
        node = F.try_element_at(node_facts, F.col("node_id")) if references.nodes else F.lit(None)
        group = F.try_element_at(group_facts, F.col("group_name")) if references.groups else F.lit(None)
        return df.withColumns({_NODE_REF: node.cast(node_type), _GROUP_REF: group.cast(group_type)})
    assert node_refs_df is not None and group_refs_df is not None
    if broadcast:
        return df.join(F.broadcast(node_refs_df), "node_id", "left").join(
            F.broadcast(group_refs_df), "group_name", "left")
    return df.join(node_refs_df.hint("shuffle_hash"), "node_id", "left").join(
        group_refs_df.hint("shuffle_hash"), "group_name", "left")


def _check_topology_events(
    raw_df: DataFrame, node_refs_df: DataFrame, group_refs_df: DataFrame, broadcast: bool = True
) -> _Checked:
    frame_df, cast_rules, row_json = _conformed_frame("topology_events", raw_df)
    frame_df = _with_references(frame_df, node_refs_df, group_refs_df, broadcast=broadcast)
    frame_df = _with_copies(frame_df, "topology_events", [["event_seq"]])
    rules = [
        *cast_rules,
        _required("event_seq", "a unique bigint"),
        _required("event_type", f"one of {', '.join(EVENT_TYPES)}"),
        _not_one_of("event_type", EVENT_TYPES),
        _needs("node_id", NODE_EVENTS),
        _needs("group_name", GROUP_EVENTS),
        _unknown_reference("node_id", "nodes", _NODE_OK),
        _rejected_reference("node_id", "nodes", _NODE_OK),
        _unknown_reference("group_name", "cache_groups", _GROUP_OK),
        _rejected_reference("group_name", "cache_groups", _GROUP_OK),
        _conflicting(["event_seq"], "topology_events", _text("event_seq ", F.col("event_seq")), "it must be unique"),
        _taken(["event_seq"], "topology_events", _text("event_seq ", F.col("event_seq")), "it must be unique"),
        _extra_copy(["event_seq"], "topology_events"),
    ]
    return _Checked(_with_rules(frame_df, rules), rules, row_json)


_COPY = ["node_id", "group_name", "partition_id"]
_REPORT_KEY = [*_COPY, "report_seq"]


@dataclass(frozen=True)
class Consumer:
    """The version that consumes new reports: reports apply only to its alive servers and running groups."""

    version: str
    alive: tuple[str, ...]
    running: tuple[str, ...]


def _check_partition_reports(
    raw_df: DataFrame, node_refs_df: DataFrame, group_refs_df: DataFrame, consumer: Consumer | None = None,
    references: References | None = None, broadcast: bool = True,
) -> _Checked:
    # One shuffle by copy serves every window below (each partitions by a superset of the copy key), and every
    # window is ordered by (copy, report_seq), so one sort serves them all.
    frame_df, cast_rules, row_json = _conformed_frame("partition_reports", raw_df)
    frame_df = _with_references(frame_df.repartition(*_COPY), node_refs_df, group_refs_df, references,
                                broadcast=broadcast)
    if _STORED not in frame_df.columns:
        frame_df = frame_df.withColumn(_STORED, F.lit(False))
    newest_stored = F.max(F.when(F.col(_STORED), F.col("report_seq")))
    frame_df = frame_df.withColumn(_STALE, newest_stored.over(Window.partitionBy(*_COPY)))
    frame_df = _with_copies(frame_df, "partition_reports", [_REPORT_KEY])
    copy_and_seq = _text(
        "report_seq ", F.col("report_seq"), " of node ", _quoted("node_id"), ", group ", _quoted("group_name"),
        ", partition ", F.col("partition_id"),
    )  # fmt: skip
    rules = [
        *cast_rules,
        _required("node_id", "the id of the reporting node"),
        _required("group_name", "the name of the reported cache group"),
        _required("partition_id", "an int >= 0"),
        _required("report_seq", "a bigint (the latest report per node, group and partition wins)"),
        _required("state", f"one of {', '.join(STATES)}"),
        _not_one_of("state", STATES),
        _required("update_counter", "a bigint >= 0"),
        _negative("update_counter"),
        _required("size", "a bigint >= 0 (entries)"),
        _negative("size"),
        _required("bytes", "a bigint >= 0"),
        _negative("bytes"),
        _negative("wal_history_counter"),
        _history_beyond_counter(),
        _negative("partition_id"),
        _unknown_reference("node_id", "nodes", _NODE_OK),
        _rejected_reference("node_id", "nodes", _NODE_OK),
        _client_report(),
        _unknown_reference("group_name", "cache_groups", _GROUP_OK),
        _rejected_reference("group_name", "cache_groups", _GROUP_OK),
        _partition_beyond_group(),
        _conflicting(_REPORT_KEY, "partition_reports", copy_and_seq, "it must be unique per copy"),
        _taken(_REPORT_KEY, "partition_reports", copy_and_seq, "it must be unique per copy"),
        _extra_copy(_REPORT_KEY, "partition_reports"),
        _stale(),
        *([_not_alive(consumer.alive, consumer.version), _not_running(consumer.running, consumer.version)]
          if consumer is not None else []),
    ]
    frame_df = _with_rules(frame_df, rules)
    # Counter regressions, judged among the reports that broke no rule above: a run of consecutive OWNING reports
    # of one copy ("segment") ends at any other state; inside a run the counter must not decrease.
    by_seq = Window.partitionBy(*_COPY).orderBy("report_seq")
    owning = _clean() & (F.col("state") == OWNING)
    resets = F.sum(F.when(_clean() & (F.col("state") != OWNING), 1).otherwise(0))
    frame_df = frame_df.withColumn(
        _SEGMENT, resets.over(by_seq.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    )
    # The greatest (segment, counter, report_seq) among earlier clean OWNING reports: its segment is the latest one.
    earlier = F.struct(F.col(_SEGMENT).alias("segment"), F.col("update_counter").alias("counter"),
                       F.col("report_seq").alias("seq"))  # fmt: skip
    frame_df = frame_df.withColumn(
        _EARLIER_OWNING, F.max(F.when(owning, earlier)).over(by_seq.rowsBetween(Window.unboundedPreceding, -1))
    )
    same_run = F.col(f"{_EARLIER_OWNING}.segment") == F.col(_SEGMENT)
    regression = _counter_regression(
        F.when(same_run, F.col(f"{_EARLIER_OWNING}.counter")), F.col(f"{_EARLIER_OWNING}.seq")
    )
    # Materialised: its condition reads _BAD as it was before this rule, which the rejected branch cannot see.
    frame_df = frame_df.withColumn(_REGRESSION, regression.broken)
    regression = _Rule(F.col(_REGRESSION), regression.reason)
    return _Checked(_with_rules(frame_df, [regression]), [*rules, regression], row_json)


# =====================================================================================================================
# Public entry points
# =====================================================================================================================


def validate_inputs(
    raw: Mapping[str, DataFrame],
    exchange_id: int | None = None,
    strict: bool = False,
    *,
    persist: bool = False,
    stored_reports: DataFrame | None = None,
    consumer: Consumer | None = None,
    references: References | None = None,
    small: bool = False,
) -> Validated:
    """Check the four input tables against SPEC section 2 and split every table into valid and rejected rows.

    Args:
        raw: the input tables by name, as read (extra columns are ignored; keys other than the four input tables are
            not validated). ``topology_events`` and ``partition_reports`` may be empty DataFrames.
        exchange_id: the exchange this validation belongs to, copied into every rejected row (may be None).
        strict: raise :class:`InvalidInputError` when any row is rejected, instead of returning it. This runs one
            Spark action (an aggregate over the rejected rows).
        persist: keep every checked table in Spark's cache (memory, spilling to disk), so that the valid and the
            rejected rows, both read from the checked rows, do not run the checks again; the caller unpersists
            ``Validated.checked`` when done. (Not ``localCheckpoint``: its blocks are lost with their executor.)
        stored_reports: reports an earlier exchange consumed, of the copies ``raw["partition_reports"]`` reports
            on: the rules that look across a copy's reports (report_seq order, counter regressions) see them; they
            are not judged again and appear in neither output.
        consumer: the version consuming the new reports (None: their applicability is not checked). A report of
            a node that is not alive there, or of a group that is not running there, is rejected with a reason.
        references: what the caller already knows of every node and group (then the reports are checked against
            these facts, with no join; the ``nodes`` and ``cache_groups`` tables given are still checked).
        small: the tables are small (local relations): join the reference facts without broadcasting them, so
            that the whole validation is one Spark job.

    Returns:
        :class:`Validated`: ``valid`` holds every input table (SPEC schema, rows unchanged) and ``rejected`` every
        rejected row of all tables (``rejected_rows`` schema). Each input row is in exactly one of them. Lazy unless
        ``persist``: nothing is computed until the caller runs an action.

    Raises:
        InputSchemaError: a table is missing from ``raw``, misses SPEC columns, or has a column of a type that cannot
            be cast; one message lists every such problem.
        InvalidInputError: ``strict`` is true and at least one row was rejected.
    """
    missing = [name for name in INPUT_TABLES if name not in raw]
    problems = [
        f"missing input table(s): {', '.join(missing)} (all of {', '.join(INPUT_TABLES)} are needed; "
        "`rebalancer init` creates the missing ones empty)"
    ]
    problems = problems if missing else []
    problems += [p for name in INPUT_TABLES if name in raw for p in _schema_problems(name, raw[name])]
    if problems:
        raise InputSchemaError("\n".join(problems))

    groups = _check_cache_groups(raw["cache_groups"])
    nodes = _check_nodes(raw["nodes"])
    node_refs_df, group_refs_df = _node_references(nodes.df), _group_references(groups.df)
    reports_raw = raw["partition_reports"]
    if stored_reports is not None:
        context_df = stored_reports.select(*_spec_columns("partition_reports")).withColumns(
            {_STORED: F.lit(True), COMMIT_COLUMN: F.lit(-1).cast("bigint")}
        )
        reports_raw = reports_raw.withColumn(_STORED, F.lit(False)).unionByName(context_df, allowMissingColumns=True)
    checked = {
        "cache_groups": groups,
        "nodes": nodes,
        "topology_events": _check_topology_events(raw["topology_events"], node_refs_df, group_refs_df, not small),
        "partition_reports": _check_partition_reports(
            reports_raw, node_refs_df, group_refs_df, consumer, references, not small
        ),
    }
    if persist:
        checked = {name: _Checked(t.df.persist(), t.rules, t.row_json) for name, t in checked.items()}
    exchange = F.lit(exchange_id).cast("bigint")
    rejected_df = functools.reduce(
        DataFrame.unionByName, [_rejected_rows(name, table, exchange) for name, table in checked.items()]
    )
    validated = Validated(
        valid={name: _valid_rows(name, t) for name, t in checked.items()},
        numbered=rejected_df,
        checked=tuple(t.df for t in checked.values()) if persist else (),
    )
    if strict:
        _raise_if_rejected(validated.rejected)
    return validated


def _raise_if_rejected(rejected_df: DataFrame) -> None:
    """Strict mode: one aggregate over the rejected rows; raise when there is any.

    Raises:
        InvalidInputError: with the count per table and the first reasons (alphabetically) of each.
    """
    summary = (
        rejected_df.groupBy("table_name")
        .agg(F.count("*").alias("n"), F.min_by("reason", "reason", _STRICT_EXAMPLES).alias("examples"))
        .collect()
    )
    if summary:
        raise InvalidInputError.of(
            {r["table_name"]: int(r["n"]) for r in summary}, {r["table_name"]: r["examples"] for r in summary}
        )


def with_defaults(name: str, valid_df: DataFrame) -> DataFrame:
    """Replace the nulls that SPEC section 2 gives a meaning by that meaning (for stages; validation keeps nulls).

    ``cache_groups``: mode PARTITIONED, affinity rendezvous, loss_policy READ_WRITE_SAFE, persistent true,
    partitioner ``ignite`` for the ignite affinity else ``murmur3``, exclude_neighbors false (our decision).
    ``nodes``: capacity 1.0, is_client false (our decision: an unmarked node is a server). Other tables unchanged.

    Args:
        name: an input table name.
        valid_df: rows of that table with the SPEC schema (normally ``Validated.valid[name]``).

    Returns:
        The same rows and columns with those defaults applied.

    Raises:
        InputSchemaError: ``name`` is not an input table.
    """
    if name not in INPUT_TABLES:
        raise InputSchemaError(f"{name!r} is not an input table; input tables: {', '.join(INPUT_TABLES)}")
    if name == "cache_groups":
        affinity = F.coalesce(F.col("affinity"), F.lit("rendezvous"))
        defaults: dict[str, Column] = {
            "mode": F.coalesce(F.col("mode"), F.lit("PARTITIONED")),
            "affinity": affinity,
            "exclude_neighbors": F.coalesce(F.col("exclude_neighbors"), F.lit(False)),
            "loss_policy": F.coalesce(F.col("loss_policy"), F.lit(READ_WRITE_SAFE)),
            "persistent": F.coalesce(F.col("persistent"), F.lit(True)),
            "partitioner": F.coalesce(
                F.col("partitioner"), F.when(affinity == "ignite", "ignite").otherwise("murmur3")
            ),
        }
    elif name == "nodes":
        defaults = {
            "capacity": F.coalesce(F.col("capacity"), F.lit(1.0)),
            "is_client": F.coalesce(F.col("is_client"), F.lit(False)),
        }
    else:
        return valid_df
    return valid_df.withColumns(defaults)
