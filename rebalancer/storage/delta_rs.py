"""The delta-rs engine: Delta tables in a local directory, data moved by Spark, commits made by ``deltalake``.

Why this shape (measured facts in FIELD-NOTES.md):

* **Reads** go through Spark: ``spark.read.schema(stored).option("basePath", table).parquet(*DeltaTable.file_uris())``.
  Only the files of the requested version are read (``spark.read.parquet(table)`` would also read removed files),
  the explicit schema keeps types exact, and deltalake's own Arrow readers are never used (they abort the process
  at exit, delta-io/delta-rs#2184). This is correct only without deletion vectors and column mapping, so tables
  using them are refused. The reads are :class:`~rebalancer.storage.delta_log.DriverReader`'s, which delta-spark
  uses too.
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
  first fitted to the table with :func:`~rebalancer.storage.schemas.conform` (lossless widening only) and written
  by Spark with exact types.
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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
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

from rebalancer.config import DELTA_RS
from rebalancer.frames import parallelism
from rebalancer.storage.base import TableChanges, Warehouse
from rebalancer.storage.commits import retry_on_conflict, transaction_app
from rebalancer.storage.delta_log import local_directory
from rebalancer.storage.driver_reader import (
    DataFile,
    DriverReader,
    check_readable,
    file_may_match,
    spark_path_to_local,
    stored_schema,
)
from rebalancer.storage.errors import SchemaMismatchError, UnsupportedTableError, WhereMismatchError
from rebalancer.storage.keys import absent_rows, check_merge_keys, check_unique_keys, keys_not_null
from rebalancer.storage.schemas import NULL_MARKER, conform, fit_arrow, optional_columns
from rebalancer.storage.sql import WHERE_MARKER, WhereValue, guard_where, quote_identifier, where_predicate, where_sql

__all__ = ["DeltaRsWarehouse", "file_stats", "local_root"]

_WRITTEN = pa.schema([("table", pa.int32()), ("path", pa.string()), ("rows", pa.int64())])
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


@dataclass
class _Staged:
    """Parquet files Spark wrote into one fresh directory of a table, not yet committed."""

    directory: str
    adds: list[AddAction] = field(default_factory=list)

    def discard(self) -> None:
        """Delete the directory: its files were never committed, so no table version references them."""
        shutil.rmtree(self.directory, ignore_errors=True)


class DeltaRsWarehouse(Warehouse):
    """Warehouse on local disk, committed with delta-rs (the ``deltalake`` package); see the module docstring.

    Args:
        spark: the session that reads tables and writes data files.
        warehouse: the warehouse directory (created on first use).
        commit_retries: retries of a write whose commit lost a race with another writer.

    Raises:
        UnsupportedTableError: ``warehouse`` is not a local directory.
    """

    engine = DELTA_RS

    def __init__(
        self, spark: SparkSession, warehouse: str | Path, *, commit_retries: int = 5, concurrent_commits: int = 1,
        driver_replicas: int | str = "auto",
    ) -> None:
        super().__init__(spark, commit_retries=commit_retries, concurrent_commits=concurrent_commits,
                         driver_replicas=driver_replicas)
        self.root = local_root(warehouse)
        self.reader = DriverReader(spark, self.root)

    @property
    def location(self) -> str:
        return self.root

    @property
    def reads_on_driver(self) -> bool:
        return True

    # ---- tables ----
    def path_of(self, name: str) -> str:
        return self.reader.path_of(name)

    def exists(self, name: str) -> bool:
        return self.reader.exists(name)

    def create_tables(self, names: Iterable[str] | None = None) -> list[str]:
        return self.reader.create_tables(names)

    def table_version(self, name: str) -> int:
        return self.reader.table_version(name)

    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        return self.reader.commit_times(name)

    def _add_columns(self, name: str, fields: Sequence[StructField]) -> None:
        snapshot = self._open_for_write(name)
        # Delta's schema JSON is Spark's StructType JSON: the fields go over as they are declared.
        as_delta = DeltaSchema.from_json(StructType(list(fields)).json()).fields
        snapshot.alter.add_columns(as_delta)

    # ---- reads: the driver reader's ----
    def read(
        self, name: str, version: int | None = None, where: Mapping[str, WhereValue] | None = None
    ) -> DataFrame:
        return self.reader.read(name, version, where)

    def read_arrow(
        self, name: str, where: Mapping[str, WhereValue] | None = None, version: int | None = None
    ) -> pa.Table:
        return self.reader.read_arrow(name, where, version)

    def read_stored_arrow(self, name: str) -> pa.Table:
        return self.reader.read_stored_arrow(name)

    def changes(self, name: str, since: int | None) -> TableChanges:
        found = self.reader.changes(name, since)
        # None: rewritten in place, or its log was cleaned up: compare contents
        return found if found is not None else super().changes(name, since)

    def changes_arrow(self, name: str, since: int | None, max_rows: int | None = None) -> tuple[pa.Table | None, int]:
        found = self.reader.changes_arrow(name, since, max_rows)
        return found if found is not None else super().changes_arrow(name, since, max_rows)

    def read_raw(self, name: str) -> DataFrame:
        return self.reader.read_raw(name)

    def stored_columns(self, name: str) -> list[str]:
        return self.reader.stored_columns(name)

    # ---- writes ----
    def append(self, name: str, df: DataFrame) -> None:
        stored = stored_schema(self._open_for_write(name))
        rows = conform(df, stored, name, optional=optional_columns(name, stored))
        staged = self._stage(name, rows)
        if not staged.adds:
            staged.discard()
            return
        self._commit_append(name, staged)

    def replace_where(self, name: str, df: DataFrame, where: Mapping[str, WhereValue]) -> None:
        snapshot = self._open_for_write(name)
        stored = stored_schema(snapshot)
        predicate = where_predicate(where, stored, name)
        rows = conform(df, stored, name, optional=optional_columns(name, stored))
        if where:
            rows = guard_where(rows, where, predicate, name)
        staged = self._stage(name, rows, where=where)
        operation = f"replace_where {where_sql(where)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            files = self.reader.files(latest)
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
        stored = stored_schema(snapshot)
        key_list = check_merge_keys(keys, stored, name)
        staged = self._stage(name, conform(df, stored, name, optional=optional_columns(name, stored)))
        # The source was computed once, into the staged files; every later step reads those files instead of
        # re-running the caller's plan.
        source = self.reader.read_files(stored, [os.path.join(self.path_of(name), a.path) for a in staged.adds])
        try:
            check_unique_keys(source, key_list, name)
        except BaseException:
            staged.discard()
            raise
        source_keys = source.select(*key_list).filter(keys_not_null(key_list))
        operation = f"merge{' (insert only)' if insert_only else ''} on {', '.join(key_list)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            files = self.reader.files(latest) if staged.adds else []
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
            existing = self.reader.read_files(stored, [f.local for f in affected], base=latest.table_uri)
            existing = existing.select(*key_list)
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

    def replace_where_many(
        self, frames: Mapping[str, DataFrame | pa.Table], where: Mapping[str, WhereValue],
        committed: Callable[[str], None] | None = None, rows_hint: int | None = None,
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
            stored = stored_schema(snapshot)
            rows = conform(frames[name], stored, name, optional=optional_columns(name, stored))
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
            relative_path = f"{relative}/{os.path.basename(row['path'])}"
            staged[name].adds.append(_add_action(relative_path, row["path"], metadata, schemas[name][0]))
        return staged

    def _replace_staged(self, name: str, staged: _Staged, where: Mapping[str, WhereValue]) -> None:
        """Commit staged files as ``replace_where(name, ..., where)`` (the rows they hold replace ``where``'s)."""
        operation = f"replace_where {where_sql(where)}"

        def attempt() -> bool:
            latest = self._open_for_write(name)
            stored = stored_schema(latest)
            predicate = where_predicate(where, stored, name)
            files = self.reader.files(latest)
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
        self._commit_append(name, self._stage_arrow(name, rows, self._open_for_write(name)))

    def replace_where_arrow(self, name: str, rows: pa.Table, where: Mapping[str, WhereValue]) -> None:
        snapshot = self._open_for_write(name)
        where_predicate(where, stored_schema(snapshot), name)  # checks the where against the schema
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
            files = self.reader.files(latest)
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
            return self._commit_replacing(name, latest, removed, staged.adds, extra, operation)

        self._run_rewrite(name, staged, attempt)

    def insert_absent_arrow(self, name: str, rows: pa.Table, keys: Sequence[str]) -> None:
        snapshot = self._open_for_write(name)
        key_list = check_merge_keys(keys, stored_schema(snapshot), name)

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
    def _open_for_write(self, name: str) -> DeltaTable:
        """The latest snapshot, refused when committing Spark's plain parquet files would bypass a table feature."""
        snapshot = self.reader.open(name)
        check_readable(snapshot, name)
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

    def _files_matching(self, snapshot: DeltaTable, files: list[DataFile], predicate: Column) -> list[DataFile]:
        """The files holding at least one row that satisfies ``predicate`` (one Spark job over those files)."""
        if not files:
            return []
        scan = self.reader.read_files(stored_schema(snapshot), [f.local for f in files], base=snapshot.table_uri)
        hits = {
            spark_path_to_local(row[0])
            for row in scan.select(F.col("_metadata.file_path").alias("_rb_file"), "*")
            .filter(predicate)
            .select("_rb_file")
            .distinct()
            .collect()
        }
        return [f for f in files if f.local in hits]

    def _files_joining(
        self, snapshot: DeltaTable, files: list[DataFile], source_keys: DataFrame, keys: list[str]
    ) -> list[DataFile]:
        """The files holding at least one row whose key occurs in ``source_keys``."""
        if not files:
            return []
        scan = self.reader.read_files(stored_schema(snapshot), [f.local for f in files], base=snapshot.table_uri)
        hits = {
            spark_path_to_local(row[0])
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
            if NULL_MARKER in text:
                raise SchemaMismatchError(
                    f"a null was written to a NOT NULL column of {name} ({_marker_detail(text, NULL_MARKER)}); "
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
            staged.adds.append(_add_action(f"{relative}/{entry.name}", entry.path, metadata, schema))
        return staged

    def _stage_arrow(self, name: str, rows: pa.Table, snapshot: DeltaTable) -> _Staged:
        """Write ``rows`` (fitted to the stored schema) as one parquet file into a fresh directory of the table."""
        relative = f"rb-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        staged = _Staged(directory=os.path.join(self.path_of(name), relative))
        if rows.num_rows == 0:
            return staged
        stored = stored_schema(snapshot)
        table = fit_arrow(rows, stored, name, optional_columns(name, stored))
        os.makedirs(staged.directory)
        file_name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        local = os.path.join(staged.directory, file_name)
        try:
            pq.write_table(table, local, compression="snappy")
            metadata = pq.read_metadata(local)
        except BaseException:
            staged.discard()
            raise
        staged.adds.append(_add_action(f"{relative}/{file_name}", local, metadata, stored))
        return staged

    def _arrow_file(self, f: DataFile, snapshot: DeltaTable) -> pa.Table:
        schema = to_arrow_schema(stored_schema(snapshot), timezone="UTC")
        return ds.dataset([f.local], schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()).to_table()

    def _commit_rewrite(
        self,
        name: str,
        snapshot: DeltaTable,
        *,
        removed: list[DataFile],
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
            stored = stored_schema(snapshot)
            old_rows = self.reader.read_files(stored, [f.local for f in removed], base=snapshot.table_uri)
            kept = self._stage(name, _in_order(survivors(old_rows), stored))
        return self._commit_replacing(name, snapshot, removed, added, kept, operation)

    def _commit_replacing(
        self, name: str, snapshot: DeltaTable, removed: list[DataFile], added: list[AddAction], kept: _Staged | None,
        operation: str,
    ) -> bool:
        """Commit against ``snapshot``, as a rewrite: remove ``removed``, add ``added`` and ``kept`` (the surviving
        rows of the removed files, staged); ``kept``'s files are deleted unless the commit took them. Returns
        whether a commit was made (False when there was nothing to remove or add)."""
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

    def _commit_append(self, name: str, staged: _Staged) -> None:
        """Commit ``staged`` as an append, with conflict retries; delete its files if no commit took them."""

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


def _add_action(path: str, local: str, metadata: pq.FileMetaData, schema: StructType) -> AddAction:
    """The add action that commits the parquet file at ``local`` as ``path`` (relative to its table directory), with
    its size and time from the file system and its statistics from its footer (:func:`file_stats`)."""
    info = os.stat(local)
    return AddAction(
        path=path,
        size=info.st_size,
        partition_values={},
        modification_time=int(info.st_mtime * 1000),
        data_change=True,
        stats=json.dumps(file_stats(metadata, schema), separators=(",", ":")),
    )


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, CommitFailedError)


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
