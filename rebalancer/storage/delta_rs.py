"""The delta-rs engine: Delta tables in a local directory, data moved by Spark, commits made by ``deltalake``.

Why this shape (measured facts in FIELD-NOTES.md):

* **Reads** go through Spark: ``spark.read.schema(stored).option("basePath", table).parquet(*DeltaTable.file_uris())``.
  Only the files of the requested version are read (``spark.read.parquet(table)`` would also read removed files),
  the explicit schema keeps types exact, and deltalake's own Arrow readers are never used (they abort the process
  at exit, delta-io/delta-rs#2184). This is correct only without deletion vectors and column mapping, so tables
  using them are refused.
* **Writes** never pass through the driver: Spark writes parquet files into a fresh sub-directory of the table
  (``rb-<utc time>-<uuid>/``), the driver reads each file's footer (size, row count, integer min/max, null counts),
  and delta-rs commits all of them in ONE transaction with ``create_write_transaction``. A write that fails before
  its commit leaves only an unreferenced directory, which readers never see (``vacuum`` removes it).
* **replace_where and merge are atomic copy-on-write**: the same commit that adds the new files removes every file
  holding a replaced row, after Spark re-wrote that file's surviving rows. Files whose statistics show they cannot
  hold a replaced row are not even scanned. No reader ever sees the old and the new rows together, or neither.
* **Conflicts**: each attempt plans from the latest snapshot and commits against it, so delta-rs detects a
  concurrent writer that removed a file this attempt rewrote. Rewrites also carry an application transaction
  ``rebalancer:<table>``; two rewrites of one table from snapshots of the same version therefore conflict even when
  neither found a file to remove, which is what keeps two concurrent re-runs of one exchange from both inserting
  their rows. A ``CommitFailedError`` re-plans the attempt, up to ``storage.commit_retries`` times.
* **Lax enforcement is bypassed**: delta-rs would cast ``"7"`` or ``7.9`` into an int column; every DataFrame is
  first fitted to the table with :func:`conform` (lossless widening only) and written by Spark with exact types.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.exceptions import TableNotFoundError as DeltaTableNotFoundError
from deltalake.schema import Schema as DeltaSchema
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

from rebalancer import tables
from rebalancer.frames import parallelism
from rebalancer.storage.base import (
    COMMIT_COLUMN,
    TABLE_PROPERTIES,
    WHERE_MARKER,
    TableChanges,
    Warehouse,
    WhereValue,
    absent_rows,
    check_contract_name,
    check_merge_keys,
    check_table_name,
    check_unique_keys,
    conform,
    files_added_by_commit,
    guard_where,
    local_directory,
    project_declared,
    quote_identifier,
    retry_on_conflict,
    transaction_app,
    where_predicate,
    where_sql,
)
from rebalancer.storage.errors import (
    SchemaMismatchError,
    StorageError,
    TableNotFoundError,
    UnsupportedTableError,
    VersionNotFoundError,
    WhereMismatchError,
)

__all__ = ["DeltaRsWarehouse", "file_stats", "file_may_match", "local_root"]

_WRITTEN = pa.schema([("table", pa.int32()), ("path", pa.string()), ("rows", pa.int64())])
_NULL_MARKER = "rebalancer-null-violation"
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)

# Writer features whose only effect on plain data files is handled here or by delta-rs itself (appendOnly makes
# delta-rs refuse removes; timestampNtz only changes a type). Anything else (CHECK constraints, generated or identity
# columns, column mapping, deletion vectors, change data feed...) would be bypassed by committing Spark's files.
_SAFE_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz"})


def local_root(warehouse: str | Path) -> str:
    """The absolute local directory of a warehouse given as a path or a ``file:`` URI.

    Args:
        warehouse: a directory, relative to the working directory or absolute, or ``file:///...``.

    Returns:
        The absolute directory path (it need not exist yet).

    Raises:
        UnsupportedTableError: the warehouse is a remote URI (s3://, abfss://, dbfs:/ ...).
    """
    directory = local_directory(warehouse)
    if directory is None:
        raise UnsupportedTableError(
            f"the delta-rs engine keeps its warehouse in a local directory, not {warehouse}; use storage.engine = "
            f"'delta-spark' for object stores and Unity Catalog."
        )
    return directory


def file_stats(metadata: pq.FileMetaData, schema: StructType) -> dict[str, Any]:
    """Delta file statistics from a parquet footer: ``numRecords``, and per top-level column the null count and,
    for integral columns, min and max.

    Only integral min/max are emitted: they are exact, cheap, and they are what ``replace_where`` prunes on (the
    version columns). String statistics may be truncated by some writers and timestamp statistics have their own
    precision rules, so they are left out rather than risk a wrong bound.

    Args:
        metadata: the footer, from ``pyarrow.parquet.read_metadata``.
        schema: the table schema the file was written with.

    Returns:
        The statistics object to JSON-encode into the add action.
    """
    stats: dict[str, Any] = {"numRecords": metadata.num_rows}
    if metadata.num_row_groups == 0:
        return stats
    top_level = {f.name: f for f in schema.fields}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    first = metadata.row_group(0)
    for index in range(first.num_columns):
        name = first.column(index).path_in_schema
        if name not in top_level:  # a nested leaf such as attributes.key_value.key
            continue
        integral = isinstance(top_level[name].dataType, _INTEGRAL)
        low: Any = None
        high: Any = None
        null_count: int | None = 0
        min_max_ok = integral
        for group in range(metadata.num_row_groups):
            statistics = metadata.row_group(group).column(index).statistics
            if statistics is None:
                null_count, min_max_ok = None, False
                break
            if null_count is not None:
                null_count = null_count + statistics.null_count if statistics.has_null_count else None
            if min_max_ok and statistics.has_min_max:
                low = statistics.min if low is None else min(low, statistics.min)
                high = statistics.max if high is None else max(high, statistics.max)
            elif min_max_ok and metadata.row_group(group).num_rows > statistics.null_count:
                min_max_ok = False  # values present but no bounds: claim nothing
        if null_count is not None:
            nulls[name] = null_count
        if min_max_ok and low is not None:
            mins[name], maxs[name] = int(low), int(high)
    if mins:
        stats["minValues"], stats["maxValues"] = mins, maxs
    if nulls:
        stats["nullCount"] = nulls
    return stats


def file_may_match(add: Mapping[str, Any], where: Mapping[str, WhereValue]) -> bool:
    """Whether a data file may hold a row matching ``where``, judged from its statistics alone.

    Only integer bounds and null counts are trusted (see :func:`file_stats`); anything unknown means "may match".

    Args:
        add: one row of ``DeltaTable.get_add_actions(flatten=True)`` as a dict (``min.<col>``, ``max.<col>``,
            ``null_count.<col>``, ``num_records``).
        where: column name to value.

    Returns:
        False only when the statistics prove that no row matches.
    """
    for key, value in where.items():
        if value is None:
            if add.get(f"null_count.{key}") == 0:
                return False
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        low, high = add.get(f"min.{key}"), add.get(f"max.{key}")
        if isinstance(low, int) and not isinstance(low, bool) and value < low:
            return False
        if isinstance(high, int) and not isinstance(high, bool) and value > high:
            return False
    return True


def _spark_path_to_local(file_path: str) -> str:
    """``_metadata.file_path`` (``file:/a/b%20c``) as a normalised local path (``/a/b c``)."""
    parsed = urlparse(file_path)
    return os.path.normpath(unquote(parsed.path if parsed.scheme else file_path))


@dataclass
class _Staged:
    """Parquet files Spark wrote into one fresh directory of a table, not yet committed."""

    directory: str
    adds: list[AddAction] = field(default_factory=list)

    def discard(self) -> None:
        """Delete the directory: its files were never committed, so no table version references them."""
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class _File:
    """One data file of a snapshot."""

    path: str  # as in the Delta log (relative to the table)
    local: str  # absolute local path
    size: int
    row: dict[str, Any]  # the add-action row with statistics


class DeltaRsWarehouse(Warehouse):
    """Warehouse on local disk, committed with delta-rs (the ``deltalake`` package); see the module docstring.

    Args:
        spark: the session that reads tables and writes data files.
        warehouse: the warehouse directory (created on first use).
        commit_retries: retries of a write whose commit lost a race with another writer.

    Raises:
        UnsupportedTableError: ``warehouse`` is not a local directory.
    """

    engine = "delta-rs"

    def __init__(
        self, spark: SparkSession, warehouse: str | Path, *, commit_retries: int = 5, concurrent_commits: int = 1
    ) -> None:
        super().__init__(spark, commit_retries=commit_retries, concurrent_commits=concurrent_commits)
        self.root = local_root(warehouse)

    @property
    def location(self) -> str:
        return self.root

    @property
    def reads_on_driver(self) -> bool:
        return True

    # ---- tables ----
    def path_of(self, name: str) -> str:
        return os.path.join(self.root, check_table_name(name))

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.path_of(name))

    def create_tables(self, names: Iterable[str] | None = None) -> list[str]:
        chosen = list(tables.SCHEMAS) if names is None else [check_contract_name(n) for n in names]
        os.makedirs(self.root, exist_ok=True)
        created: list[str] = []
        for name in chosen:
            if self.exists(name):
                continue
            # UTC timestamps keep the protocol at reader 1 / writer 2 (a naive timestamp would need timestampNtz).
            schema = to_arrow_schema(tables.SCHEMAS[name], timezone="UTC")
            try:
                DeltaTable.create(
                    self.path_of(name),
                    schema=schema,
                    mode="error",
                    configuration={"delta.enableDeletionVectors": TABLE_PROPERTIES["delta.enableDeletionVectors"]},
                )
            except DeltaError as exc:
                if "already exists" in str(exc):  # another process created it between our check and our create
                    continue
                raise StorageError(f"could not create table {name} at {self.path_of(name)}: {exc}") from exc
            created.append(name)
        return created

    def table_version(self, name: str) -> int:
        return self._open(name).version()

    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        return {int(h["version"]): dt.datetime.fromtimestamp(h["timestamp"] / 1000, dt.UTC)
                for h in self._open(name).history()}

    def _add_columns(self, name: str, fields: Sequence[StructField]) -> None:
        snapshot = self._open_for_write(name)
        # Delta's schema JSON is Spark's StructType JSON: the fields go over as they are declared.
        as_delta = DeltaSchema.from_json(StructType(list(fields)).json()).fields
        snapshot.alter.add_columns(as_delta)

    # ---- reads ----
    def read(
        self, name: str, version: int | None = None, where: Mapping[str, WhereValue] | None = None
    ) -> DataFrame:
        snapshot = self._open(name, version)
        if not where:
            raw = self._read_snapshot(snapshot)
        else:
            _check_readable(snapshot, name)
            stored = _stored_schema(snapshot)
            files = [f.local for f in self._files(snapshot) if file_may_match(f.row, where)]
            raw = self._read_files(stored, files, base=snapshot.table_uri).where(where_predicate(where, stored, name))
        if name not in tables.SCHEMAS:
            return raw
        # a version from before `rebalancer upgrade` added a column reads it as null, as read_arrow does
        return project_declared(raw, tables.SCHEMAS[name], name, missing_as_null=version is not None)

    def read_arrow(
        self, name: str, where: Mapping[str, WhereValue] | None = None, version: int | None = None
    ) -> pa.Table:
        snapshot = self._open(name, version)
        declared = tables.SCHEMAS.get(name)
        return self._arrow_of(snapshot, name, declared if declared is not None else _stored_schema(snapshot), where)

    def read_stored_arrow(self, name: str) -> pa.Table:
        snapshot = self._open(name)
        return self._arrow_of(snapshot, name, _stored_schema(snapshot), None)

    def _arrow_of(self, snapshot: DeltaTable, name: str, columns: StructType,
                  where: Mapping[str, WhereValue] | None) -> pa.Table:
        """The snapshot's rows (those ``where`` may match) with ``columns``, read on the driver."""
        _check_readable(snapshot, name)
        files = [f.local for f in self._files(snapshot) if not where or file_may_match(f.row, where)]
        schema = to_arrow_schema(columns, timezone="UTC")
        # pyarrow.dataset over the file list (FIELD-NOTES: deltalake's own Arrow readers may abort the process).
        dataset = ds.dataset(files, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem())
        return dataset.to_table(filter=_arrow_where(where) if where else None)

    def changes(self, name: str, since: int | None) -> TableChanges:
        snapshot = self._open(name)
        _check_readable(snapshot, name)
        now = snapshot.version()
        added = files_added_by_commit(self.path_of(name), since, now)
        if added is None:  # rewritten in place, or its log was cleaned up: compare contents
            return super().changes(name, since)
        present = {f.path: f.local for f in self._files(snapshot)}
        stored = _stored_schema(snapshot)
        parts = [
            self._read_files(stored, [present[p] for p in paths if p in present], base=snapshot.table_uri)
            .withColumn(COMMIT_COLUMN, F.lit(version).cast("bigint"))
            for version, paths in sorted(added.items())
            if any(p in present for p in paths)
        ]
        if not parts:
            empty = self._read_files(stored, [])
            return TableChanges(empty.withColumn(COMMIT_COLUMN, F.lit(now).cast("bigint")), now, known_empty=True)
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part)
        return TableChanges(rows, now)

    def read_raw(self, name: str) -> DataFrame:
        return self._read_snapshot(self._open(name))

    def stored_columns(self, name: str) -> list[str]:
        return [f.name for f in self._open(name).schema().fields]

    # ---- writes ----
    def append(self, name: str, df: DataFrame) -> None:
        snapshot = self._open_for_write(name)
        rows = conform(df, _stored_schema(snapshot), name, optional=_optional_columns(name, snapshot))
        staged = self._stage(name, rows)
        if not staged.adds:
            staged.discard()
            return

        def attempt() -> None:
            # Appends never need re-planning: delta-rs rebases them over concurrent commits by itself, and a
            # CommitFailedError (for example a concurrent metadata change) leaves these files uncommitted.
            latest = self._open_for_write(name)
            self._commit(name, latest, list(staged.adds), guard=False, operation="append")

        try:
            retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_is_conflict)
        except BaseException:
            staged.discard()
            raise
        self._refresh_view(name)

    def replace_where(self, name: str, df: DataFrame, where: Mapping[str, WhereValue]) -> None:
        snapshot = self._open_for_write(name)
        stored = _stored_schema(snapshot)
        predicate = where_predicate(where, stored, name)
        rows = conform(df, stored, name, optional=_optional_columns(name, snapshot))
        if where:
            rows = guard_where(rows, where, predicate, name)
        staged = self._stage(name, rows, where=where)
        operation = f"replace_where {where_sql(where)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            files = self._files(latest)
            if not where:  # everything is replaced: every file goes, nothing survives, nothing to scan
                return self._commit_rewrite(name, latest, removed=files, added=staged.adds, operation=operation)
            candidates = [f for f in files if file_may_match(f.row, where)]
            return self._commit_rewrite(
                name,
                latest,
                removed=self._files_matching(latest, candidates, predicate),
                added=staged.adds,
                survivors=lambda old: old.filter(~predicate),
                operation=operation,
            )

        self._run_rewrite(name, staged, attempt)

    def rewrite_target(self, name: str, where: Mapping[str, WhereValue]) -> tuple[int, bool]:
        """For a rewrite another engine commits: the table's latest version, and whether any of its data files may
        hold a row matching ``where`` (judged from the log's statistics; no data file is read)."""
        snapshot = self._open(name)
        return snapshot.version(), any(file_may_match(f.row, where) for f in self._files(snapshot))

    def user_metadata_since(self, name: str, version: int) -> list[str]:
        """The ``userMetadata`` of every commit of ``name`` after ``version`` (how a writer finds its own commit)."""
        snapshot = self._open(name)
        newer = snapshot.version() - version
        history = snapshot.history(newer) if newer > 0 else []
        return [str(h["userMetadata"]) for h in history if h.get("userMetadata") is not None]

    def delete_where(self, name: str, condition: str) -> None:
        def attempt() -> None:
            self._open_for_write(name).delete(condition)

        retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_is_conflict)
        self._refresh_view(name)

    def vacuum(self, name: str, retain_hours: int) -> int:
        deleted = self._open_for_write(name).vacuum(retention_hours=retain_hours, dry_run=False,
                                                    enforce_retention_duration=False)
        self._refresh_view(name)  # a view over the files of an older snapshot would name deleted files
        return len(deleted)

    def merge(self, name: str, df: DataFrame, keys: Sequence[str], *, insert_only: bool = False) -> None:
        snapshot = self._open_for_write(name)
        stored = _stored_schema(snapshot)
        key_list = check_merge_keys(keys, stored, name)
        staged = self._stage(name, conform(df, stored, name, optional=_optional_columns(name, snapshot)))
        # The source was computed once, into the staged files; every later step reads those files instead of
        # re-running the caller's plan.
        source = self._read_files(stored, [os.path.join(self.path_of(name), a.path) for a in staged.adds])
        try:
            check_unique_keys(source, key_list, name)
        except BaseException:
            staged.discard()
            raise
        not_null = F.lit(True)
        for key in key_list:
            not_null = not_null & F.col(quote_identifier(key)).isNotNull()
        source_keys = source.select(*key_list).filter(not_null)
        operation = f"merge{' (insert only)' if insert_only else ''} on {', '.join(key_list)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            files = self._files(latest) if staged.adds else []
            affected = self._files_joining(latest, files, source_keys, key_list)
            if not insert_only:
                return self._commit_rewrite(
                    name,
                    latest,
                    removed=affected,
                    added=staged.adds,
                    survivors=lambda old: old.join(source_keys, on=key_list, how="left_anti"),
                    operation=operation,
                )
            if not affected:  # no key exists yet: the staged source is exactly what to insert
                return self._commit_rewrite(name, latest, removed=[], added=staged.adds, operation=operation)
            # Some keys exist: insert only the source rows whose key is absent; existing rows stay untouched.
            existing = self._read_files(stored, [f.local for f in affected], base=latest.table_uri).select(*key_list)
            fresh = self._stage(name, _in_order(source.join(existing, on=key_list, how="left_anti"), stored))
            try:
                self._commit_rewrite(name, latest, removed=[], added=fresh.adds, operation=operation)
            except BaseException:
                fresh.discard()
                raise
            if not fresh.adds:
                fresh.discard()
            return False  # the staged source itself was not committed

        self._run_rewrite(name, staged, attempt)

    def changes_arrow(
        self, name: str, since: int | None, max_rows: int | None = None
    ) -> tuple[pa.Table | None, int]:
        snapshot = self._open(name)
        _check_readable(snapshot, name)
        now = snapshot.version()
        added = files_added_by_commit(self.path_of(name), since, now)
        if added is None:
            return super().changes_arrow(name, since, max_rows)
        by_path = {f.path: f for f in self._files(snapshot)}
        present = {path: f.local for path, f in by_path.items()}
        if max_rows is not None:
            rows = sum(int(by_path[p].row.get("num_records") or 0) for paths in added.values() for p in paths
                       if p in by_path)
            if rows > max_rows:
                return None, now
        schema = to_arrow_schema(_stored_schema(snapshot), timezone="UTC")
        parts = []
        for version, paths in sorted(added.items()):
            files = [present[p] for p in paths if p in present]
            if files:
                rows = ds.dataset(files, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()).to_table()
                parts.append(rows.append_column(COMMIT_COLUMN, pa.array([version] * rows.num_rows, pa.int64())))
        if not parts:
            return schema.empty_table().append_column(COMMIT_COLUMN, pa.array([], pa.int64())), now
        return pa.concat_tables(parts), now

    def replace_where_many(
        self,
        frames: Mapping[str, DataFrame | pa.Table],
        where: Mapping[str, WhereValue],
        committed: Callable[[str], None] | None = None,
        rows_hint: int | None = None,
    ) -> None:
        if rows_hint is not None and rows_hint >= SPARK_WRITES_FROM_ROWS:
            # Large: Spark's own Parquet writer, one job per table, beats the shared job's Arrow hop into Python
            # workers (an XL exchange: 2.6 million rows).
            super().replace_where_many(frames, where, committed)
            return
        # Arrow rows are committed from the driver; the frames' files are staged first, in one Spark job.
        staged = self._stage_many({n: r for n, r in frames.items() if isinstance(r, DataFrame)}, where)
        try:
            for name, rows in frames.items():
                if isinstance(rows, pa.Table):
                    self.replace_where_arrow(name, rows, where)
                else:
                    self._replace_staged(name, staged.pop(name), where)
                if committed is not None:
                    committed(name)
        finally:
            for rest in staged.values():
                rest.discard()

    def _stage_many(self, frames: Mapping[str, DataFrame], where: Mapping[str, WhereValue]) -> dict[str, _Staged]:
        """Every frame's rows as parquet files in a fresh directory of its table: one Spark job for the tables of
        flat columns, one more for each table with array, map or struct columns.

        Why not one job for all: the tables share the job as one union in which each row fills only its own
        table's columns, and Spark's Arrow writer fills a null array column slowly (measured on an M exchange:
        staging the four flat tables took 1.3 s, adding client_affinity's two array columns to the same job
        11 s; alone it takes 0.2 s).
        """
        flat = [n for n in frames if not _nested(frames[n].schema)]
        jobs = ([flat] if flat else []) + [[n] for n in frames if n not in flat]
        staged: dict[str, _Staged] = {}
        try:
            for names in jobs:
                staged.update(self._stage_job({n: frames[n] for n in names}, where))
        except BaseException:
            for s_ in staged.values():
                s_.discard()
            raise
        return staged

    def _stage_job(self, frames: Mapping[str, DataFrame], where: Mapping[str, WhereValue]) -> dict[str, _Staged]:
        """The frames' rows as parquet files in a fresh directory of each table, written in ONE Spark job.

        The frames are tagged and unioned; each Python worker writes, per table, one file of the rows it holds
        (``pyarrow.parquet``, the table's stored schema) and returns the file names; the driver reads the footers.
        """
        names = list(frames)
        relative = f"rb-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        directories, schemas, tagged = {}, {}, []
        for i, name in enumerate(names):
            snapshot = self._open_for_write(name)
            stored = _stored_schema(snapshot)
            rows = conform(frames[name], stored, name, optional=_optional_columns(name, snapshot))
            if where:
                rows = guard_where(rows, where, where_predicate(where, stored, name), name)
            directories[name] = os.path.join(self.path_of(name), relative)
            schemas[name] = (stored, to_arrow_schema(stored, timezone="UTC"))
            tagged.append(rows.select(F.lit(i).cast("int").alias("__table"), F.struct(*rows.columns).alias(f"t{i}")))
        union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
        arrow_schemas = {i: schemas[name][1] for i, name in enumerate(names)}
        dirs = {i: directories[name] for i, name in enumerate(names)}

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            open_files: dict[int, tuple[pq.ParquetWriter, str, int]] = {}
            for batch in batches:
                table_ids = batch.column("__table")
                for i, schema in arrow_schemas.items():
                    part = batch.filter(pc.equal(table_ids, i))
                    if part.num_rows == 0:
                        continue
                    rows = pa.Table.from_struct_array(part.column(f"t{i}")).cast(schema)
                    if i not in open_files:
                        os.makedirs(dirs[i], exist_ok=True)
                        path = os.path.join(dirs[i], f"part-{uuid.uuid4()}.c000.snappy.parquet")
                        open_files[i] = (pq.ParquetWriter(path, schema, compression="snappy"), path, 0)
                    writer, path, count = open_files[i]
                    writer.write_table(rows)
                    open_files[i] = (writer, path, count + rows.num_rows)
            for i, (writer, path, count) in open_files.items():
                writer.close()
                yield pa.RecordBatch.from_pylist([{"table": i, "path": path, "rows": count}], schema=_WRITTEN)

        staged = {name: _Staged(directory=directories[name]) for name in names}
        try:
            # As many tasks (and files per table) as the session runs at once, not one per input partition: an M
            # exchange's union has 8, which cost a task and a small file each.
            tasks = parallelism(self.spark)
            written = (union.coalesce(tasks).mapInArrow(write, "table int, path string, rows long")
                       .toArrow().to_pylist())
        except Exception as exc:
            for s_ in staged.values():
                s_.discard()
            text = str(exc)
            if WHERE_MARKER in text:
                raise WhereMismatchError(
                    f"replace_where was given rows outside {where_sql(where)}; filter the DataFrames to those rows."
                ) from None
            raise
        for row in written:
            name = names[row["table"]]
            metadata = pq.read_metadata(row["path"])
            info = os.stat(row["path"])
            staged[name].adds.append(
                AddAction(
                    path=f"{relative}/{os.path.basename(row['path'])}",
                    size=info.st_size,
                    partition_values={},
                    modification_time=int(info.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps(file_stats(metadata, schemas[name][0]), separators=(",", ":")),
                )
            )
        return staged

    def _replace_staged(self, name: str, staged: _Staged, where: Mapping[str, WhereValue]) -> None:
        """Commit staged files as ``replace_where(name, ..., where)`` (the rows they hold replace ``where``'s)."""
        operation = f"replace_where {where_sql(where)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            stored = _stored_schema(latest)
            predicate = where_predicate(where, stored, name)
            files = self._files(latest)
            candidates = [f for f in files if file_may_match(f.row, where)] if where else files
            return self._commit_rewrite(
                name,
                latest,
                removed=self._files_matching(latest, candidates, predicate) if where else candidates,
                added=staged.adds,
                survivors=(lambda old: old.filter(~predicate)) if where else None,
                operation=operation,
            )

        self._run_rewrite(name, staged, attempt)

    # ---- writes from the driver ----
    def append_arrow(self, name: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        snapshot = self._open_for_write(name)
        staged = self._stage_arrow(name, rows, snapshot)

        def attempt() -> None:
            self._commit(name, self._open_for_write(name), list(staged.adds), guard=False, operation="append")

        try:
            retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_is_conflict)
        except BaseException:
            staged.discard()
            raise
        self._refresh_view(name)

    def replace_where_arrow(self, name: str, rows: pa.Table, where: Mapping[str, WhereValue]) -> None:
        snapshot = self._open_for_write(name)
        where_predicate(where, _stored_schema(snapshot), name)  # checks the where against the schema
        if where and rows.num_rows:
            inside = pc.all(_matches(rows, where)).as_py()
            if not inside:
                raise WhereMismatchError(
                    f"replace_where on {name} was given rows outside {where_sql(where)}; filter the rows to it or "
                    "widen the where."
                )
        staged = self._stage_arrow(name, rows, snapshot)
        operation = f"replace_where {where_sql(where)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            files = self._files(latest)
            removed = [f for f in files if not where or file_may_match(f.row, where)]
            kept: list[pa.Table] = []
            if where:
                hit = []
                for f in removed:
                    old = self._arrow_file(f, latest)
                    matching = _matches(old, where)
                    if pc.any(matching).as_py():
                        hit.append(f)
                        kept.append(old.filter(pc.invert(matching)))
                removed = hit
            survivors = pa.concat_tables(kept) if kept else None
            extra = self._stage_arrow(name, survivors, latest) if survivors is not None else None
            adds = list(staged.adds) + (extra.adds if extra else [])
            if not removed and not adds:
                return False
            now = int(time.time() * 1000)
            removes = [RemoveAction(f.path, True, now, size=f.size) for f in removed]
            try:
                self._commit(name, latest, [*removes, *adds], guard=True, operation=operation)
            except BaseException:
                if extra:
                    extra.discard()
                raise
            return True

        self._run_rewrite(name, staged, attempt)

    def insert_absent_arrow(self, name: str, rows: pa.Table, keys: Sequence[str]) -> None:
        snapshot = self._open_for_write(name)
        key_list = check_merge_keys(keys, _stored_schema(snapshot), name)

        def attempt() -> bool:
            latest = self._open_for_write(name)
            fresh = absent_rows(rows, key_list, self.read_arrow(name).select(key_list), name)
            if fresh.num_rows == 0:
                return False
            staged = self._stage_arrow(name, fresh, latest)
            try:
                self._commit(name, latest, list(staged.adds), guard=True, operation=f"insert absent on {key_list}")
            except BaseException:
                staged.discard()
                raise
            return True

        retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_is_conflict)
        self._refresh_view(name)

    # ---- views ----
    def _register_view(self, name: str) -> None:
        self.read(name).createOrReplaceTempView(name)

    # ---- internals: snapshots ----
    def _open(self, name: str, version: int | None = None) -> DeltaTable:
        """The table's latest snapshot, or the snapshot at ``version``."""
        path = self.path_of(name)
        if not DeltaTable.is_deltatable(path):
            raise TableNotFoundError(
                f"table {name} does not exist at {path}; create it first (rebalancer init, or Warehouse.create_tables)."
            )
        try:
            return DeltaTable(path, version=version)
        except DeltaTableNotFoundError as exc:
            raise TableNotFoundError(f"table {name} does not exist at {path}; create it first.") from exc
        except DeltaError as exc:
            if version is None:
                raise StorageError(f"could not open table {name} at {path}: {exc}") from exc
            latest = DeltaTable(path).version()
            raise VersionNotFoundError(
                f"table {name} has no version {version}; its latest version is {latest}."
            ) from exc

    def _open_for_write(self, name: str) -> DeltaTable:
        """The latest snapshot, refused when committing Spark's plain parquet files would bypass a table feature."""
        snapshot = self._open(name)
        _check_readable(snapshot, name)
        protocol = snapshot.protocol()
        features = set(protocol.writer_features or [])
        if protocol.min_writer_version > 2 and not (
            protocol.min_writer_version == 7 and features <= _SAFE_WRITER_FEATURES
        ):
            raise UnsupportedTableError(
                f"table {name} needs Delta writer version {protocol.min_writer_version} "
                f"(features: {', '.join(sorted(features)) or 'none'}), which the delta-rs engine cannot honour; "
                f"write it with storage.engine = 'delta-spark' or recreate it with the engine."
            )
        if snapshot.metadata().partition_columns:
            raise UnsupportedTableError(
                f"table {name} is partitioned by {', '.join(snapshot.metadata().partition_columns)}, and the "
                f"delta-rs engine writes only unpartitioned tables; recreate it with Warehouse.create_tables."
            )
        return snapshot

    def _files(self, snapshot: DeltaTable) -> list[_File]:
        """Every data file of a snapshot with its add-action statistics (read from the log, not the files)."""
        # get_add_actions reads only the Delta log; pa.table() converts the arro3 table through the C data interface.
        actions = pa.table(snapshot.get_add_actions(flatten=True)).to_pylist()
        table_dir = snapshot.table_uri
        root = _spark_path_to_local(table_dir)
        return [
            _File(
                path=row["path"],
                local=os.path.normpath(os.path.join(root, unquote(row["path"]))),
                size=int(row["size_bytes"]),
                row=row,
            )
            for row in actions
        ]

    # ---- internals: reading ----
    def _read_snapshot(self, snapshot: DeltaTable) -> DataFrame:
        _check_readable(snapshot, _table_name(snapshot))
        return self._read_files(_stored_schema(snapshot), snapshot.file_uris(), base=snapshot.table_uri)

    def _read_files(self, schema: StructType, paths: Sequence[str], base: str | None = None) -> DataFrame:
        """Exactly these parquet files, with an explicit schema (an empty list gives an empty DataFrame)."""
        if not paths:
            # A plan with no rows built in the JVM: createDataFrame([]) would start Python workers for nothing.
            return self.spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])
        reader = self.spark.read.schema(schema)
        if base is not None:
            # basePath keeps partition columns of partitioned tables written by other tools.
            reader = reader.option("basePath", _spark_path_to_local(base))
        return reader.parquet(*paths)

    def _files_matching(self, snapshot: DeltaTable, files: list[_File], predicate: Column) -> list[_File]:
        """The files holding at least one row that satisfies ``predicate`` (one Spark job over those files)."""
        if not files:
            return []
        scan = self._read_files(_stored_schema(snapshot), [f.local for f in files], base=snapshot.table_uri)
        hits = {
            _spark_path_to_local(row[0])
            for row in scan.select(F.col("_metadata.file_path").alias("_rb_file"), "*")
            .filter(predicate)
            .select("_rb_file")
            .distinct()
            .collect()
        }
        return [f for f in files if f.local in hits]

    def _files_joining(
        self, snapshot: DeltaTable, files: list[_File], source_keys: DataFrame, keys: list[str]
    ) -> list[_File]:
        """The files holding at least one row whose key occurs in ``source_keys``."""
        if not files:
            return []
        scan = self._read_files(_stored_schema(snapshot), [f.local for f in files], base=snapshot.table_uri)
        hits = {
            _spark_path_to_local(row[0])
            for row in scan.select(F.col("_metadata.file_path").alias("_rb_file"), *keys)
            .join(source_keys, on=keys, how="left_semi")
            .select("_rb_file")
            .distinct()
            .collect()
        }
        return [f for f in files if f.local in hits]

    # ---- internals: writing ----
    def _stage(self, name: str, df: DataFrame, where: Mapping[str, WhereValue] | None = None) -> _Staged:
        """Let Spark write ``df`` as parquet into a fresh directory of the table; describe the files for a commit."""
        table_dir = self.path_of(name)
        relative = f"rb-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        staged = _Staged(directory=os.path.join(table_dir, relative))
        try:
            (
                df.write.mode("error")  # "errorifexists" in classic only; Connect knows "error"
                # Per-write options, so the session's own settings stay untouched: Delta readers expect int64
                # microsecond timestamps (Spark's default is INT96) and the standard nested-list layout.
                .option("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
                .option("spark.sql.parquet.writeLegacyFormat", "false")
                .parquet(staged.directory)
            )
        except Exception as exc:
            staged.discard()
            text = str(exc)
            if WHERE_MARKER in text:
                raise WhereMismatchError(
                    f"replace_where on {name} was given rows outside {where_sql(where or {})}; filter the "
                    f"DataFrame to those rows or widen the where."
                ) from None
            if _NULL_MARKER in text:
                raise SchemaMismatchError(
                    f"a null was written to a NOT NULL column of {name} ({_marker_detail(text, _NULL_MARKER)}); "
                    f"fill or filter those rows first."
                ) from None
            raise
        schema = df.schema
        for entry in sorted(os.scandir(staged.directory), key=lambda e: e.name):
            if not entry.name.endswith(".parquet") or entry.name.startswith((".", "_")):
                os.remove(entry.path)  # _SUCCESS and .crc files: not data, and nothing references them
                continue
            metadata = pq.read_metadata(entry.path)
            if metadata.num_rows == 0:
                os.remove(entry.path)  # Spark writes one empty file for an empty DataFrame; Delta needs none
                continue
            info = entry.stat()
            staged.adds.append(
                AddAction(
                    path=f"{relative}/{entry.name}",
                    size=info.st_size,
                    partition_values={},
                    modification_time=int(info.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps(file_stats(metadata, schema), separators=(",", ":")),
                )
            )
        return staged

    def _stage_arrow(self, name: str, rows: pa.Table, snapshot: DeltaTable) -> _Staged:
        """Write ``rows`` (fitted to the stored schema) as one parquet file into a fresh directory of the table."""
        relative = f"rb-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        staged = _Staged(directory=os.path.join(self.path_of(name), relative))
        if rows.num_rows == 0:
            return staged
        stored = _stored_schema(snapshot)
        table = _fit_arrow(rows, stored, name, _optional_columns(name, snapshot))
        os.makedirs(staged.directory)
        file_name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        local = os.path.join(staged.directory, file_name)
        try:
            pq.write_table(table, local, compression="snappy")
            metadata = pq.read_metadata(local)
        except BaseException:
            staged.discard()
            raise
        info = os.stat(local)
        staged.adds.append(
            AddAction(
                path=f"{relative}/{file_name}",
                size=info.st_size,
                partition_values={},
                modification_time=int(info.st_mtime * 1000),
                data_change=True,
                stats=json.dumps(file_stats(metadata, stored), separators=(",", ":")),
            )
        )
        return staged

    def _arrow_file(self, f: _File, snapshot: DeltaTable) -> pa.Table:
        schema = to_arrow_schema(_stored_schema(snapshot), timezone="UTC")
        return ds.dataset([f.local], schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()).to_table()

    def _commit_rewrite(
        self,
        name: str,
        snapshot: DeltaTable,
        *,
        removed: list[_File],
        added: list[AddAction],
        survivors: Callable[[DataFrame], DataFrame] | None = None,
        operation: str,
    ) -> bool:
        """One attempt's commit: remove ``removed``, add ``added`` and the rows of ``removed`` that ``survivors``
        keeps (re-written by Spark first), all in one transaction against ``snapshot``.

        Args:
            name: the table name.
            snapshot: the snapshot the attempt planned from.
            removed: data files to remove.
            added: already staged files to add.
            survivors: the rows of the removed files to keep, as a transformation of those files' rows.
            operation: a description kept in the commit.

        Returns:
            True when a commit was made (False when there was nothing to remove or add).

        Raises:
            CommitFailedError: a concurrent commit conflicts with this one (the caller retries).
        """
        kept: _Staged | None = None
        if removed and survivors is not None:
            stored = _stored_schema(snapshot)
            old_rows = self._read_files(stored, [f.local for f in removed], base=snapshot.table_uri)
            kept = self._stage(name, _in_order(survivors(old_rows), stored))
        now = int(time.time() * 1000)
        removes = [RemoveAction(f.path, True, now, size=f.size) for f in removed]
        adds = list(added) + (kept.adds if kept else [])
        if not removes and not adds:
            if kept:
                kept.discard()
            return False
        try:
            self._commit(name, snapshot, [*removes, *adds], guard=True, operation=operation)
        except BaseException:
            if kept:
                kept.discard()
            raise
        if kept and not kept.adds:
            kept.discard()
        return True

    def _run_rewrite(self, name: str, staged: _Staged, attempt: Callable[[], bool]) -> None:
        """Run ``attempt`` with conflict retries; delete the staged files unless a commit took them.

        Args:
            name: the table name.
            staged: the files staged for this write before the first attempt.
            attempt: plans from the latest snapshot and commits; True when its commit added ``staged``.
        """
        try:
            committed = retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_is_conflict)
        except BaseException:
            staged.discard()
            raise
        if not committed or not staged.adds:
            staged.discard()
        self._refresh_view(name)

    def _commit(
        self,
        name: str,
        snapshot: DeltaTable,
        actions: list[AddAction | RemoveAction],
        *,
        guard: bool,
        operation: str,
    ) -> None:
        """Commit ``actions`` as one transaction against ``snapshot`` (delta-rs checks what changed since it).

        Args:
            name: the table name.
            snapshot: the snapshot the actions were planned from.
            actions: files to add and remove.
            guard: record the application transaction ``rebalancer:<name>`` so that concurrent rewrites of this
                table conflict even when they remove no common file.
            operation: a description kept in the commit (``rebalancerOperation`` in the history).

        Raises:
            CommitFailedError: a concurrent commit conflicts with this one (the caller retries).
        """
        app = [Transaction(transaction_app(name), snapshot.version() + 1)] if guard else None
        properties = CommitProperties(custom_metadata={"rebalancerOperation": operation}, app_transactions=app)
        # The table's own schema: a different one would make delta-rs commit a metadata change.
        snapshot.create_write_transaction(
            actions, mode="append", schema=snapshot.schema(), commit_properties=properties
        )


def _matches(rows: pa.Table, where: Mapping[str, WhereValue]) -> pa.ChunkedArray | pa.Array:
    """Per row of ``rows``: whether it satisfies ``where`` (null-safe equality on every key)."""
    result: pa.ChunkedArray | pa.Array = pa.array([True] * rows.num_rows, pa.bool_())
    for key, value in where.items():
        column = rows.column(key)
        term = pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)
        result = pc.and_(result, term)
    return result


def _arrow_where(where: Mapping[str, WhereValue]) -> ds.Expression:
    expression: ds.Expression | None = None
    for key, value in where.items():
        term = ds.field(key).is_null() if value is None else (ds.field(key) == value)
        expression = term if expression is None else (expression & term)
    assert expression is not None
    return expression


def _fit_arrow(rows: pa.Table, stored: StructType, name: str, optional: set[str]) -> pa.Table:
    """``rows`` with exactly the stored columns, in order, cast to their Arrow types (safe casts only)."""
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


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, CommitFailedError)


def _stored_schema(snapshot: DeltaTable) -> StructType:
    """The table schema as Spark types (Delta's schema JSON is Spark's StructType JSON)."""
    return StructType.fromJson(json.loads(snapshot.schema().to_json()))


def _table_name(snapshot: DeltaTable) -> str:
    return os.path.basename(os.path.normpath(_spark_path_to_local(snapshot.table_uri)))


def _optional_columns(name: str, snapshot: DeltaTable) -> set[str]:
    """Stored columns a write may omit: the extra columns of a contract table (written as nulls)."""
    declared = tables.SCHEMAS.get(name)
    if declared is None:
        return set()
    return set(_stored_schema(snapshot).names) - set(declared.names)


def _check_readable(snapshot: DeltaTable, name: str) -> None:
    """Refuse tables whose rows are not exactly the rows of their parquet files."""
    protocol = snapshot.protocol()
    features = set(protocol.reader_features or [])
    mapping = snapshot.metadata().configuration.get("delta.columnMapping.mode", "none")
    if "deletionVectors" in features:
        raise UnsupportedTableError(
            f"table {name} has deletion vectors enabled, which the delta-rs engine would read as deleted rows "
            f"still present; read it with storage.engine = 'delta-spark', or rewrite it without deletion vectors."
        )
    if "columnMapping" in features or mapping not in ("none", None):
        raise UnsupportedTableError(
            f"table {name} uses column mapping, whose parquet column names the delta-rs engine does not translate; "
            f"use storage.engine = 'delta-spark', or rewrite it without column mapping."
        )


# replace_where_many stages tables in one shared Spark job below this many rows, with one job per table above.
SPARK_WRITES_FROM_ROWS = 500_000


def _nested(schema: StructType) -> bool:
    """Whether a column holds arrays, maps or structs."""
    return any(isinstance(f.dataType, (ArrayType, MapType, StructType)) for f in schema.fields)


def _in_order(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` with the table's column order (a USING join moves its key columns first)."""
    return df.select(*[F.col(quote_identifier(n)) for n in schema.names])


def _marker_detail(text: str, marker: str) -> str:
    start = text.find(marker)
    line = text[start:].splitlines()[0] if start >= 0 else marker
    return line.split(": ", 1)[-1].split(" SQLSTATE")[0]
