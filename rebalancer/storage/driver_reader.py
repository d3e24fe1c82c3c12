"""Reading the Delta tables of a local directory on the driver, from their logs (``deltalake``), for both engines."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.exceptions import TableNotFoundError as DeltaTableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer import tables
from rebalancer.storage.base import COMMIT_COLUMN, TABLE_PROPERTIES, TableChanges
from rebalancer.storage.delta_log import files_added_by_commit
from rebalancer.storage.errors import StorageError, TableNotFoundError, UnsupportedTableError, VersionNotFoundError
from rebalancer.storage.keys import check_contract_name, check_table_name
from rebalancer.storage.schemas import project_declared
from rebalancer.storage.sql import WhereValue, where_predicate

__all__ = [
    "DataFile",
    "DriverReader",
    "check_readable",
    "file_may_match",
    "spark_path_to_local",
    "stored_schema",
]


def file_may_match(add: Mapping[str, Any], where: Mapping[str, WhereValue]) -> bool:
    """Whether a data file may hold a row matching ``where``, judged from its statistics alone.

    Only integer bounds and null counts are trusted (the delta-rs engine writes no others:
    :func:`rebalancer.storage.delta_rs.file_stats`); anything unknown means "may match".

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


def spark_path_to_local(file_path: str) -> str:
    """``_metadata.file_path`` (``file:/a/b%20c``) as a normalised local path (``/a/b c``)."""
    parsed = urlparse(file_path)
    return os.path.normpath(unquote(parsed.path if parsed.scheme else file_path))


def stored_schema(snapshot: DeltaTable) -> StructType:
    """The table schema as Spark types (Delta's schema JSON is Spark's StructType JSON)."""
    return StructType.fromJson(json.loads(snapshot.schema().to_json()))


def check_readable(snapshot: DeltaTable, name: str) -> None:
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


@dataclass
class DataFile:
    """One data file of a snapshot."""

    path: str  # as in the Delta log (relative to the table)
    local: str  # absolute local path
    size: int
    row: dict[str, Any]  # the add-action row with statistics


class DriverReader:
    """The Delta tables under one local directory, read from their logs on the driver: the delta-rs engine's reads,
    and delta-spark's *driver reader* (``storage.driver_reader``) for versions, history, small tables and a new
    table's first commit.

    Only the log is read on the driver. A DataFrame read is Spark's parquet reader over exactly the data files of
    the version (``spark.read.parquet(table)`` would also read removed files) with the stored schema, so types stay
    exact; an Arrow read is ``pyarrow.dataset`` over the same files (deltalake's own Arrow readers abort the process
    at exit, delta-io/delta-rs#2184). That is correct only without deletion vectors and column mapping, so tables
    using them are refused (:func:`check_readable`). Methods named as :class:`~rebalancer.storage.base.Warehouse`'s
    behave as those (same results, same errors).

    Args:
        spark: the session that reads the data files into DataFrames.
        root: the absolute local directory holding one table per sub-directory.
    """

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root

    # ---- tables ----
    def path_of(self, name: str) -> str:
        return os.path.join(self.root, check_table_name(name))

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.path_of(name))

    def create_tables(self, names: Iterable[str] | None = None) -> list[str]:
        """Each missing table's first commit, written by delta-rs: its declared schema, reader 1 / writer 2,
        deletion vectors off (:data:`~rebalancer.storage.base.TABLE_PROPERTIES`). Returns the tables created."""
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

    def open(self, name: str, version: int | None = None) -> DeltaTable:
        """The table's latest snapshot, or the snapshot at ``version``.

        Raises:
            TableNotFoundError: the table does not exist.
            VersionNotFoundError: the version does not exist.
        """
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

    def files(self, snapshot: DeltaTable) -> list[DataFile]:
        """Every data file of a snapshot with its add-action statistics (read from the log, not the files)."""
        # get_add_actions reads only the Delta log; pa.table() converts the arro3 table through the C data interface.
        actions = pa.table(snapshot.get_add_actions(flatten=True)).to_pylist()
        table_dir = snapshot.table_uri
        root = spark_path_to_local(table_dir)
        return [
            DataFile(
                path=row["path"],
                local=os.path.normpath(os.path.join(root, unquote(row["path"]))),
                size=int(row["size_bytes"]),
                row=row,
            )
            for row in actions
        ]

    def table_version(self, name: str) -> int:
        return self.open(name).version()

    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        return {int(h["version"]): dt.datetime.fromtimestamp(h["timestamp"] / 1000, dt.UTC)
                for h in self.open(name).history()}

    def stored_columns(self, name: str) -> list[str]:
        return [f.name for f in self.open(name).schema().fields]

    def rewrite_target(self, name: str, where: Mapping[str, WhereValue]) -> tuple[int, bool]:
        """For a rewrite another engine commits: the table's latest version, and whether any of its data files may
        hold a row matching ``where`` (judged from the log's statistics; no data file is read)."""
        snapshot = self.open(name)
        return snapshot.version(), any(file_may_match(f.row, where) for f in self.files(snapshot))

    def user_metadata_since(self, name: str, version: int) -> list[str]:
        """The ``userMetadata`` of every commit of ``name`` after ``version`` (how a writer finds its own commit)."""
        snapshot = self.open(name)
        newer = snapshot.version() - version
        history = snapshot.history(newer) if newer > 0 else []
        return [str(h["userMetadata"]) for h in history if h.get("userMetadata") is not None]

    # ---- reads ----
    def read(
        self, name: str, version: int | None = None, where: Mapping[str, WhereValue] | None = None
    ) -> DataFrame:
        snapshot = self.open(name, version)
        if not where:
            raw = self.read_snapshot(snapshot)
        else:
            check_readable(snapshot, name)
            stored = stored_schema(snapshot)
            files = [f.local for f in self.files(snapshot) if file_may_match(f.row, where)]
            raw = self.read_files(stored, files, base=snapshot.table_uri).where(where_predicate(where, stored, name))
        if name not in tables.SCHEMAS:
            return raw
        # a version from before `rebalancer upgrade` added a column reads it as null, as read_arrow does
        return project_declared(raw, tables.SCHEMAS[name], name, missing_as_null=version is not None)

    def read_raw(self, name: str) -> DataFrame:
        return self.read_snapshot(self.open(name))

    def read_arrow(
        self, name: str, where: Mapping[str, WhereValue] | None = None, version: int | None = None
    ) -> pa.Table:
        snapshot = self.open(name, version)
        declared = tables.SCHEMAS.get(name)
        return self._arrow_of(snapshot, name, declared if declared is not None else stored_schema(snapshot), where)

    def read_stored_arrow(self, name: str) -> pa.Table:
        snapshot = self.open(name)
        return self._arrow_of(snapshot, name, stored_schema(snapshot), None)

    def _arrow_of(self, snapshot: DeltaTable, name: str, columns: StructType,
                  where: Mapping[str, WhereValue] | None) -> pa.Table:
        """The snapshot's rows (those ``where`` may match) with ``columns``, read on the driver."""
        check_readable(snapshot, name)
        files = [f.local for f in self.files(snapshot) if not where or file_may_match(f.row, where)]
        schema = to_arrow_schema(columns, timezone="UTC")
        # pyarrow.dataset over the file list (FIELD-NOTES: deltalake's own Arrow readers may abort the process).
        dataset = ds.dataset(files, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem())
        return dataset.to_table(filter=_arrow_where(where) if where else None)

    def changes(self, name: str, since: int | None) -> TableChanges | None:
        """:meth:`Warehouse.changes` read from the files each commit added; None when the log cannot tell (the
        table was rewritten in the window, or its log was cleaned up): the caller then compares contents."""
        found = self._added_since(name, since)
        if found is None:
            return None
        snapshot, now, added = found
        present = {f.path: f.local for f in self.files(snapshot)}
        stored = stored_schema(snapshot)
        parts = [
            self.read_files(stored, [present[p] for p in paths if p in present], base=snapshot.table_uri)
            .withColumn(COMMIT_COLUMN, F.lit(version).cast("bigint"))
            for version, paths in sorted(added.items())
            if any(p in present for p in paths)
        ]
        if not parts:
            empty = self.read_files(stored, [])
            return TableChanges(empty.withColumn(COMMIT_COLUMN, F.lit(now).cast("bigint")), now, known_empty=True)
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part)
        return TableChanges(rows, now)

    def changes_arrow(
        self, name: str, since: int | None, max_rows: int | None = None
    ) -> tuple[pa.Table | None, int] | None:
        """:meth:`Warehouse.changes_arrow` read on the driver; None when the log cannot tell (as :meth:`changes`)."""
        found = self._added_since(name, since)
        if found is None:
            return None
        snapshot, now, added = found
        by_path = {f.path: f for f in self.files(snapshot)}
        present = {path: f.local for path, f in by_path.items()}
        if max_rows is not None:
            rows = sum(int(by_path[p].row.get("num_records") or 0) for paths in added.values() for p in paths
                       if p in by_path)
            if rows > max_rows:
                return None, now
        schema = to_arrow_schema(stored_schema(snapshot), timezone="UTC")
        parts = []
        for version, paths in sorted(added.items()):
            files = [present[p] for p in paths if p in present]
            if files:
                rows = ds.dataset(files, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()).to_table()
                parts.append(rows.append_column(COMMIT_COLUMN, pa.array([version] * rows.num_rows, pa.int64())))
        if not parts:
            return schema.empty_table().append_column(COMMIT_COLUMN, pa.array([], pa.int64())), now
        return pa.concat_tables(parts), now

    def _added_since(self, name: str, since: int | None) -> tuple[DeltaTable, int, dict[int, list[str]]] | None:
        """The latest snapshot, its version and the data files each commit after ``since`` added
        (:func:`~rebalancer.storage.delta_log.files_added_by_commit`); None when the log cannot tell."""
        snapshot = self.open(name)
        check_readable(snapshot, name)
        now = snapshot.version()
        added = files_added_by_commit(self.path_of(name), since, now)
        return None if added is None else (snapshot, now, added)

    # ---- data files into DataFrames ----
    def read_snapshot(self, snapshot: DeltaTable) -> DataFrame:
        """Every row of a snapshot, every stored column with its stored type."""
        check_readable(snapshot, _table_name(snapshot))
        return self.read_files(stored_schema(snapshot), snapshot.file_uris(), base=snapshot.table_uri)

    def read_files(self, schema: StructType, paths: Sequence[str], base: str | None = None) -> DataFrame:
        """Exactly these parquet files, with an explicit schema (an empty list gives an empty DataFrame)."""
        if not paths:
            # A plan with no rows built in the JVM: createDataFrame([]) would start Python workers for nothing.
            return self.spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])
        reader = self.spark.read.schema(schema)
        if base is not None:
            # basePath keeps partition columns of partitioned tables written by other tools.
            reader = reader.option("basePath", spark_path_to_local(base))
        return reader.parquet(*paths)


def _table_name(snapshot: DeltaTable) -> str:
    return os.path.basename(os.path.normpath(spark_path_to_local(snapshot.table_uri)))


def _arrow_where(where: Mapping[str, WhereValue]) -> ds.Expression:
    expression: ds.Expression | None = None
    for key, value in where.items():
        term = ds.field(key).is_null() if value is None else (ds.field(key) == value)
        expression = term if expression is None else (expression & term)
    assert expression is not None
    return expression
