"""The delta-spark engine: Delta tables through the Delta jars in the Spark JVM (Databricks, clusters, spark-submit).

Used when ``io.delta.tables.DeltaTable`` is loadable (see :mod:`rebalancer.storage.engine`). Tables live under a
warehouse directory or URI (``delta.`<dir>/<name>```), or, with ``storage.catalog_prefix = "catalog.schema"``, are
catalog tables ``catalog.schema.<name>`` (Unity Catalog).

Every write is one Delta commit. Rows Spark computes are committed by Delta itself: ``append``; ``replace_where``
as an overwrite with the ``replaceWhere`` option (atomic, and Delta checks that every new row satisfies the
predicate), or, on a warehouse in a local directory whose log shows no row of the ``where`` yet, as a guarded append
(two Spark jobs instead of four; see ``_commit_guarded``); ``merge`` as SQL ``MERGE INTO`` (when matched update
all, when not matched insert all).
On a local directory the driver reader (:class:`~rebalancer.storage.driver_reader.DriverReader`, delta-rs) reads
the log on the driver: table versions, file lists for reads, small tables; and the driver writer (the delta-rs
engine's own writes) commits the rows built on the driver, as ``append_arrow``, ``replace_where_arrow`` and
``insert_absent_arrow`` give them: one Parquet file written by pyarrow and one commit, no Spark job
(``storage.driver_writer``; see ``_driver_writer``).
Delta raises its ``ConcurrentModificationException`` family when a commit loses a race; the write is then re-run
from the start, up to ``storage.commit_retries`` times. Tables are created at protocol 1/2 and without deletion
vectors (by delta-rs on the driver in a local directory, else by ``CREATE TABLE ... USING DELTA``), so the same
directory stays readable by the delta-rs engine. An exchange's independent commits run up to
``storage.concurrent_commits`` at once (``Warehouse.replace_where_many``). Delta's commands are SQL text, never
delta-spark's Python ``DeltaTable``, so the engine runs the same on classic sessions and on Spark Connect.

Tested on local Spark with the Delta jars fetched at install: the storage contract, exchange scenarios, crash
points and concurrency tests run on this engine too (``make storage-slow``; docs/STORAGE.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import posixpath
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from rebalancer import tables
from rebalancer.config import DELTA_SPARK
from rebalancer.storage.base import COMMIT_COLUMN, TABLE_PROPERTIES, TableChanges, Warehouse
from rebalancer.storage.commits import retry_on_conflict, transaction_app
from rebalancer.storage.delta_log import files_added_by_commit, local_directory
from rebalancer.storage.errors import (
    DuplicateKeyError,
    TableNotFoundError,
    UnsupportedTableError,
    VersionNotFoundError,
    WhereMismatchError,
)
from rebalancer.storage.keys import (
    absent_rows,
    check_contract_name,
    check_merge_keys,
    check_table_name,
    check_unique_keys,
)
from rebalancer.storage.schemas import conform, optional_columns, project_declared
from rebalancer.storage.sql import (
    WHERE_MARKER,
    WhereValue,
    guard_where,
    merge_condition,
    quote_identifier,
    sql_literal,
    where_predicate,
    where_sql,
)

if TYPE_CHECKING:  # imported when first used: deltalake loads only for a warehouse in a local directory
    from rebalancer.storage.delta_rs import DeltaRsWarehouse
    from rebalancer.storage.driver_reader import DriverReader

T = TypeVar("T")

_log = logging.getLogger(__name__)

__all__ = ["DeltaSparkWarehouse", "is_delta_conflict", "table_reference", "view_sql", "warehouse_uri"]

# Delta's commit-conflict exceptions, by class name (classic and Connect) and by error condition (Delta 3+).
_CONFLICT_MARKERS = (
    "ConcurrentModificationException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_APPEND",
    "DELTA_CONCURRENT_DELETE_READ",
    "DELTA_CONCURRENT_DELETE_DELETE",
    "DELTA_CONCURRENT_TRANSACTION",
    "DELTA_CONCURRENT_WRITE",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


_FILE = "__rebalancer_file"  # a row's data file, joined to the commit that added it
# VACUUM's session settings: retention below Delta's 168 hours is the caller's choice (`--retain-hours`), and Delta
# lists a table's directories with Spark's parallelism for partition discovery (10,000 tasks by default); a table of
# ours is one directory (no partition columns), and those tasks took 25 s of each table's 27 s on 2 cores.
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_VACUUM_SETTINGS = {_RETENTION_CHECK: "false", "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
# Per session (by id), while vacuums run in it: how many, and the session's own values of _VACUUM_SETTINGS. Counted
# per session, not per warehouse: the settings are the session's, and two warehouses may share one.
_VACUUMS: dict[int, tuple[int, dict[str, str | None]]] = {}
_VACUUMS_LOCK = threading.Lock()
# The small session's settings (DeltaSparkWarehouse._small_session); measured in docs/BENCHMARKS.md. Internal to
# Spark (not documented for users): a Spark that drops it ignores it, and the small work runs compiled, as before.
_SMALL_SESSION_SETTINGS = {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}
#: Driver rows up to this many are committed from the small session; more (the large tables of an exchange decided
#: on the driver) from the caller's, whose compiled write is faster for them (docs/STORAGE.md).
SMALL_SESSION_ROWS = 10_000


def is_delta_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta's "a concurrent commit won" error (worth re-running the write).

    Args:
        exc: any exception raised by a Delta read-modify-write.

    Returns:
        True for the ``DeltaConcurrentModificationException`` family, recognised by Python class (delta-spark
        converts them on classic sessions) or by name / error condition in the message (Connect, wrapped errors).
    """
    try:
        from delta.exceptions.base import (
            ConcurrentAppendException,
            ConcurrentDeleteDeleteException,
            ConcurrentDeleteReadException,
            ConcurrentTransactionException,
            ConcurrentWriteException,
            DeltaConcurrentModificationException,
            MetadataChangedException,
            ProtocolChangedException,
        )

        if isinstance(
            exc,
            (
                DeltaConcurrentModificationException,
                ConcurrentWriteException,
                MetadataChangedException,
                ProtocolChangedException,
                ConcurrentAppendException,
                ConcurrentDeleteReadException,
                ConcurrentDeleteDeleteException,
                ConcurrentTransactionException,
            ),
        ):
            return True
    except ImportError:  # delta-spark's Python package is optional for the delta-rs engine
        pass
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def warehouse_uri(warehouse: str | Path) -> str:
    """The warehouse location as Spark should see it: URIs unchanged, local paths made absolute.

    Args:
        warehouse: ``s3://bucket/wh``, ``dbfs:/wh``, ``file:///tmp/wh`` or a local directory.

    Returns:
        The location without a trailing slash.
    """
    text = str(warehouse)
    scheme = urlparse(text).scheme
    if scheme and len(scheme) > 1:  # a real scheme, not a Windows drive letter
        return text.rstrip("/") or text
    return str(Path(text).expanduser().resolve())


def _same_location(a: str, b: str) -> bool:
    """Whether two table locations name one directory (``file:`` URIs and plain paths alike)."""

    def norm(x: str) -> str:
        parsed = urlparse(x)
        path = parsed.path if parsed.scheme in ("file", "") else x
        return posixpath.normpath(path.rstrip("/"))

    return norm(a) == norm(b)


def table_reference(name: str, location: str | None, catalog_prefix: str = "") -> str:
    """The SQL reference of a table: ``delta.`<location>``` or ```catalog`.`schema`.`name```.

    Args:
        name: the table name.
        location: the table's directory (ignored with a catalog prefix).
        catalog_prefix: ``"catalog.schema"`` or ``""``.

    Returns:
        Text usable after ``FROM`` in Spark SQL.
    """
    if catalog_prefix:
        return ".".join(quote_identifier(part) for part in [*catalog_prefix.split("."), name])
    assert location is not None, "a path-based table needs its location"
    return f"delta.{quote_identifier(location)}"


def view_sql(name: str, reference: str, declared: StructType | None) -> str:
    """``CREATE OR REPLACE TEMP VIEW`` over a table, exposing a contract table's declared columns and types.

    The view is SQL text, re-resolved by every query, so it always shows the table's latest version.

    Args:
        name: the view name (the table name).
        reference: from :func:`table_reference`.
        declared: the contract schema, or ``None`` to expose every stored column.

    Returns:
        One SQL statement.
    """
    if declared is None:
        columns = "*"
    else:
        columns = ", ".join(
            f"CAST({quote_identifier(f.name)} AS {f.dataType.simpleString()}) AS {quote_identifier(f.name)}"
            for f in declared.fields
        )
    return f"CREATE OR REPLACE TEMP VIEW {quote_identifier(name)} AS SELECT {columns} FROM {reference}"


class DeltaSparkWarehouse(Warehouse):
    """Warehouse written by Delta Lake inside Spark; see the module docstring.

    Args:
        spark: a session with the Delta jars and the Delta SQL extension.
        warehouse: the warehouse directory or URI (unused with a catalog prefix).
        catalog_prefix: ``"catalog.schema"`` for catalog tables, or ``""`` for path-based tables.
        commit_retries: retries of a write whose commit lost a race with another writer.
        concurrent_commits: how many independent commits run at once.
        driver_reader: on a warehouse in a local directory, read small tables and the log on the driver through
            delta-rs (False: everything through Delta, as for catalog tables and remote storage).
        driver_writer: with the driver reader, commit rows built on the driver through delta-rs (False: every
            commit made by Delta).
    """

    engine = DELTA_SPARK

    def __init__(
        self,
        spark: SparkSession,
        warehouse: str | Path | None,
        *,
        catalog_prefix: str = "",
        commit_retries: int = 5,
        concurrent_commits: int = 1,
        driver_reader: bool = True,
        driver_writer: bool = True,
        driver_replicas: int | str = "auto",
    ) -> None:
        super().__init__(spark, commit_retries=commit_retries, concurrent_commits=concurrent_commits,
                         driver_replicas=driver_replicas)
        self.catalog_prefix = catalog_prefix
        self.use_driver_reader = driver_reader
        self.use_driver_writer = driver_writer
        # Tables named to commits_ahead whose state is not being computed yet (nor their commit started).
        self._ahead: set[str] = set()
        self._ahead_lock = threading.Lock()
        self.root: str | None = None if catalog_prefix else warehouse_uri(warehouse or "warehouse")
        # Importing delta.exceptions installs delta-spark's conversion of its Java conflict errors into Python
        # classes; it is a convenience only (is_delta_conflict also reads the message), so failures are ignored.
        with contextlib.suppress(Exception):
            import delta.exceptions  # noqa: F401

    @property
    def location(self) -> str:
        return self.catalog_prefix or str(self.root)

    @property
    def reads_on_driver(self) -> bool:
        return self._driver_reader is not None  # a local directory: delta-rs reads the files Delta wrote

    # ---- tables ----
    def path_of(self, name: str) -> str:
        check_table_name(name)
        if self.catalog_prefix:
            return f"{self.catalog_prefix}.{name}"
        assert self.root is not None
        scheme = urlparse(self.root).scheme
        if scheme and len(scheme) > 1:  # s3://, abfss://, dbfs:/ ...: join as a URI, not as an OS path
            return posixpath.join(self.root, name)
        return str(Path(self.root) / name)

    def _reference(self, name: str) -> str:
        return table_reference(name, None if self.catalog_prefix else self.path_of(name), self.catalog_prefix)

    # Delta's commands run as SQL, not through delta-spark's Python DeltaTable: the same text works on a classic
    # session and on Spark Connect (where DeltaTable needs Delta's own Connect plugin on the server).
    def exists(self, name: str) -> bool:
        on_driver = self._on_driver(lambda d: d.exists(name))
        if on_driver is not None:
            return on_driver
        if self.catalog_prefix:
            return bool(self.spark.catalog.tableExists(self.path_of(name)))
        try:
            _ = self.spark.read.format("delta").load(self.path_of(name)).schema  # resolves the log, runs no job
        except Exception as exc:
            text = str(exc)
            if "DELTA_MISSING_DELTA_TABLE" in text or "PATH_NOT_FOUND" in text or "is not a Delta table" in text:
                return False
            raise
        return True

    def create_tables(self, names: Iterable[str] | None = None) -> list[str]:
        if self._driver_reader is not None:
            # A warehouse in a local directory: delta-rs writes the same first commit (schema, reader 1 / writer 2,
            # deletion vectors off) on the driver; Delta's CREATE TABLE runs a Spark job or two per table.
            return self._driver_reader.create_tables(names)
        chosen = list(tables.SCHEMAS) if names is None else [check_contract_name(n) for n in names]
        created: list[str] = []
        properties = ", ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in TABLE_PROPERTIES.items())
        for name in chosen:
            if self.exists(name):
                continue
            columns = ", ".join(
                f"{quote_identifier(f.name)} {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                for f in tables.SCHEMAS[name].fields
            )
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self._reference(name)} ({columns}) USING DELTA "
                           f"TBLPROPERTIES ({properties})")
            created.append(name)
        return created

    @functools.cached_property
    def _driver_reader(self) -> DriverReader | None:
        """A warehouse in a local directory: small reads on the driver by delta-rs, from the same files and log
        (no Spark job; Delta would run a few per read: its snapshot, its file filter, a history scan). Writes stay
        with Delta. None for catalog tables and remote storage, which Delta reads, and when switched off
        (``storage.driver_reader = false``)."""
        directory = self._local_directory()
        if directory is None:
            return None
        from rebalancer.storage.driver_reader import DriverReader

        return DriverReader(self.spark, directory)

    @functools.cached_property
    def _small_session(self) -> SparkSession:
        """The session for small work: Delta's state of a table before a commit (``commits_ahead``), commits of
        rows born on the driver and, without a driver reader, small reads and a table's version. A sibling of the
        caller's session with its settings, but Spark's projections interpreted instead of compiled
        (:data:`_SMALL_SESSION_SETTINGS`).

        For every task Spark builds the Java source of its projections (over Delta's wide log schema too) and
        strips it of comments before it asks its cache of compiled classes; for the few rows of a table's log or
        of a driver table, that is most of a job's CPU (docs/BENCHMARKS.md, "Where a small delta-spark commit's
        time goes"). Interpreted everywhere, the large tables' writes were slower (M: 20,000 rows per table), so
        only this session interprets. Delta runs a command's jobs in the session of the DataFrame or SQL text it
        was given and keeps a table's computed state with its snapshot, which sessions share. Settings the caller
        changes later do not reach it. On Spark Connect (no ``newSession``) it is the caller's session."""
        try:
            session = self.spark.newSession()
            for key, value in self.spark.conf.getAll.items():
                if key.startswith("spark.sql."):  # the session's own; Spark's and static ones are shared already
                    with contextlib.suppress(Exception):
                        session.conf.set(key, value)
            for key, value in _SMALL_SESSION_SETTINGS.items():
                session.conf.set(key, value)
            # A one-part catalog_prefix ("schema") names a schema of the caller's current catalog: the same here.
            session.catalog.setCurrentCatalog(self.spark.catalog.currentCatalog())
            session.catalog.setCurrentDatabase(self.spark.catalog.currentDatabase())
        except Exception as exc:  # noqa: BLE001 - Spark Connect, or a session that cannot have siblings
            _log.debug("small work runs in the caller's session: %s", exc)
            return self.spark
        return session

    @functools.cached_property
    def _driver_writer(self) -> DeltaRsWarehouse | None:
        """A warehouse in a local directory, with the driver reader: rows already on the driver are committed by
        delta-rs, exactly as the delta-rs engine commits them (one Parquet file written by pyarrow, one commit;
        rewrites carry the application transaction ``rebalancer:<name>`` that Delta's guarded commits here carry,
        so the two writers' rewrites of one table conflict as two of either would). Handing such rows to Spark
        costs a conversion into the JVM, Spark's Parquet encoder and Delta's statistics: 393,216 rows of
        ``partition_map`` took 3.8-6.5 s there against 0.2 s (docs/STORAGE.md). Rows Spark computes stay with
        Delta. None without a driver reader, or with ``storage.driver_writer = false``."""
        if not self.use_driver_writer or self._driver_reader is None:
            return None
        from rebalancer.storage.delta_rs import DeltaRsWarehouse

        return DeltaRsWarehouse(self.spark, self._driver_reader.root, commit_retries=self.commit_retries)

    def _write_on_driver(self, write: Callable[[DeltaRsWarehouse], None]) -> bool:
        """``write`` through the driver writer. False without one, or when delta-rs cannot write the table (a
        table feature it cannot honour: it refuses before it writes a file), which Delta then writes."""
        writer = self._driver_writer
        if writer is None:
            return False
        try:
            write(writer)
        except UnsupportedTableError:
            return False
        return True

    def _driver_rows_session(self, rows: int) -> SparkSession:
        """The small session for up to :data:`SMALL_SESSION_ROWS` rows (their commit runs interpreted:
        ``_small_session``), else the caller's, which compiles the write of a large table."""
        return self._small_session if rows <= SMALL_SESSION_ROWS else self.spark

    def _local_directory(self) -> str | None:
        """The warehouse's local directory when its log may be read on the driver, else None."""
        if self.catalog_prefix or self.root is None or not self.use_driver_reader:
            return None
        return local_directory(self.root)

    def _on_driver(self, call: Callable[[DriverReader], T]) -> T | None:
        """``call`` on the driver reader; None without one, or when delta-rs cannot read the table (deletion
        vectors, column mapping), which Delta then reads."""
        if self._driver_reader is None:
            return None
        try:
            return call(self._driver_reader)
        except UnsupportedTableError:
            return None

    def table_version(self, name: str) -> int:
        version = self._on_driver(lambda d: d.table_version(name))
        if version is not None:
            return version
        self._require(name)
        history = self._small_session.sql(f"DESCRIBE HISTORY {self._reference(name)} LIMIT 1")
        [newest] = history.select("version").collect()
        return int(newest[0])

    def stored_columns(self, name: str) -> list[str]:
        columns = self._on_driver(lambda d: d.stored_columns(name))
        return columns if columns is not None else super().stored_columns(name)

    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        times = self._on_driver(lambda d: d.commit_times(name))
        if times is not None:
            return times
        self._require(name)
        history = self._small_session.sql(f"DESCRIBE HISTORY {self._reference(name)}").select("version", "timestamp")
        return {int(r["version"]): r["timestamp"].replace(tzinfo=dt.UTC) for r in history.collect()}

    # ---- reads ----
    def _load(self, name: str, version: int | None, session: SparkSession | None = None) -> DataFrame:
        self._require(name)
        reader = (session or self.spark).read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", int(version))
        try:
            rows = reader.table(self.path_of(name)) if self.catalog_prefix else reader.load(self.path_of(name))
            if version is not None:
                _ = rows.schema  # Spark Connect resolves lazily: a missing version fails here, not at first use
            return rows
        except Exception as exc:
            text = str(exc)
            if version is not None and ("VersionNotFound" in text or "DELTA_VERSION_NOT_FOUND" in text):
                raise VersionNotFoundError(
                    f"table {name} has no version {version}; its latest version is {self.table_version(name)}."
                ) from exc
            raise

    def read(
        self, name: str, version: int | None = None, where: Mapping[str, WhereValue] | None = None
    ) -> DataFrame:
        on_driver = self._on_driver(lambda d: d.read(name, version, where))
        if on_driver is not None:  # the same files, listed from the log by delta-rs: no Delta planning job
            return on_driver
        return self._read_with(self.spark, name, version, where)

    def _read_with(
        self, session: SparkSession, name: str, version: int | None, where: Mapping[str, WhereValue] | None
    ) -> DataFrame:
        raw = self._load(name, version, session)
        if where:  # Delta skips files by their statistics itself
            raw = raw.where(where_predicate(where, raw.schema, name))
        if name not in tables.SCHEMAS:
            return raw
        # a version from before `rebalancer upgrade` added a column reads it as null, as read_arrow does
        return project_declared(raw, tables.SCHEMAS[name], name, missing_as_null=version is not None)

    def read_raw(self, name: str) -> DataFrame:
        on_driver = self._on_driver(lambda d: d.read_raw(name))
        return on_driver if on_driver is not None else self._load(name, None)

    def read_arrow(
        self, name: str, where: Mapping[str, WhereValue] | None = None, version: int | None = None
    ) -> pa.Table:
        on_driver = self._on_driver(lambda d: d.read_arrow(name, where=where, version=version))
        if on_driver is not None:
            return on_driver
        return self._read_with(self._small_session, name, version, where).toArrow()  # small: interpreted

    def changes_arrow(
        self, name: str, since: int | None, max_rows: int | None = None
    ) -> tuple[pa.Table | None, int]:
        # None also when the log cannot tell (a table rewritten since): the base class compares contents
        on_driver = self._on_driver(lambda d: d.changes_arrow(name, since, max_rows))
        return on_driver if on_driver is not None else super().changes_arrow(name, since, max_rows)

    def changes(self, name: str, since: int | None) -> TableChanges:
        """As on delta-rs: each new row of an append-only table carries the version of the commit that added it (a
        local path table's log names the files each commit added; Spark tells each row's file). Tables rewritten
        in the window, catalog tables and remote warehouses get the content comparison of the base class."""
        directory = None if self._local_directory() is None else local_directory(self.path_of(name))
        now = self.table_version(name)
        added = None
        if directory is not None and (since is None or since < now):
            added = files_added_by_commit(directory, since, now)
        if added is None:
            return super().changes(name, since)
        commit_of = [(posixpath.basename(path), version) for version, paths in added.items() for path in paths]
        if not commit_of:
            return TableChanges(self.read_raw(name).limit(0).withColumn(COMMIT_COLUMN, F.lit(now).cast("bigint")),
                                now, known_empty=True)
        files = self.spark.createDataFrame(commit_of, f"`{_FILE}` string, `{COMMIT_COLUMN}` bigint")
        rows = (self.read_raw(name).withColumn(_FILE, F.col("_metadata.file_name"))
                .join(F.broadcast(files), _FILE).drop(_FILE))
        return TableChanges(rows, now)

    # ---- writes ----
    def _add_columns(self, name: str, fields: Sequence[StructField]) -> None:
        self._committing(name)
        columns = ", ".join(f"{quote_identifier(f.name)} {f.dataType.simpleString()}" for f in fields)
        self.spark.sql(f"ALTER TABLE {self._reference(name)} ADD COLUMNS ({columns})")

    def _stored(self, name: str) -> tuple[StructType, set[str]]:
        stored = self.read_raw(name).schema
        return stored, optional_columns(name, stored)

    def _committing(self, name: str) -> None:
        """A commit to ``name`` starts: too late to prepare it (commits_ahead); it computes the state, or waits for
        the thread computing it."""
        with self._ahead_lock:
            self._ahead.discard(name)

    def _save(self, rows: DataFrame, name: str, mode: str, options: Mapping[str, str] | None = None) -> None:
        self._committing(name)
        writer = rows.write.format("delta").mode(mode)
        for key, value in (options or {}).items():
            writer = writer.option(key, value)
        if self.catalog_prefix:
            writer.saveAsTable(self.path_of(name))
        else:
            writer.save(self.path_of(name))

    def append(self, name: str, df: DataFrame) -> None:
        stored, optional = self._stored(name)
        rows = conform(df, stored, name, optional=optional)
        retry_on_conflict(
            lambda: self._save(rows, name, "append"),
            table=name,
            retries=self.commit_retries,
            is_conflict=is_delta_conflict,
        )

    def append_arrow(self, name: str, rows: pa.Table) -> None:
        if not self._write_on_driver(lambda writer: writer.append_arrow(name, rows)):
            super().append_arrow(name, rows)

    def replace_where_arrow(self, name: str, rows: pa.Table, where: Mapping[str, WhereValue]) -> None:
        """The driver writer's, when there is one. Else: no rows for a ``where`` no data file may hold (the log's
        statistics, read on the driver) leave the table as it is: no commit (Delta's would be two Spark jobs that
        add and remove nothing; an exchange's tables of conflicts and losses are mostly empty). A rival that
        commits rows there before our ``exchanges`` row is no different from one that rewrites the table after our
        commit: the last writer's rows stand."""
        if self._write_on_driver(lambda writer: writer.replace_where_arrow(name, rows, where)):
            return
        if rows.num_rows == 0 and where:
            where_predicate(where, self._stored(name)[0], name)  # a where naming no column fails, rows or not
            target = self._on_driver(lambda d: d.rewrite_target(name, where))
            if target is not None and not target[1]:
                return
        super().replace_where_arrow(name, rows, where)

    def replace_where(self, name: str, df: DataFrame, where: Mapping[str, WhereValue]) -> None:
        stored, optional = self._stored(name)
        predicate = where_predicate(where, stored, name)  # validates the mapping against the table
        rows = conform(df, stored, name, optional=optional)
        # An empty where replaces everything: a plain overwrite (the table's schema is kept: no overwriteSchema).
        replace = {"replaceWhere": where_sql(where)} if where else {}

        def attempt() -> None:
            try:
                target = self._on_driver(lambda d: d.rewrite_target(name, where))
                if target is None:
                    self._save(rows, name, "overwrite", replace)
                else:
                    self._guarded_rewrite(name, rows, where, predicate, *target)
            except Exception as exc:
                text = str(exc)
                if WHERE_MARKER in text or "DELTA_REPLACE_WHERE_MISMATCH" in text or (
                    "does not conform to partial table overwrite" in text
                ):
                    raise WhereMismatchError(
                        f"replace_where on {name} was given rows outside {where_sql(where)}; filter the DataFrame "
                        f"to those rows or widen the where."
                    ) from None
                raise

        retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_lost_race)

    def _guarded_rewrite(
        self, name: str, rows: DataFrame, where: Mapping[str, WhereValue], predicate: Column, version: int,
        occupied: bool,
    ) -> None:
        """One attempt of a ``replace_where`` planned from table ``version`` (read by delta-rs on the driver).

        Delta's replaceWhere costs three Spark jobs before it writes (the table's state, its file filter, a scan
        for the files to rewrite). When no data file may hold a row of ``where`` (a new topology version, always,
        unless a crashed run left some), the same commit is an append: add files, remove none; the rows are
        checked against ``where`` while they are written. An empty ``where`` (replace everything) is an append to
        a table without data files (a table just created, as ``generate`` fills it), else a guarded overwrite.
        """
        if occupied:
            self._commit_guarded(name, rows, version, "overwrite", {"replaceWhere": where_sql(where)} if where else {})
        else:
            self._commit_guarded(name, guard_where(rows, where, predicate, name) if where else rows, version, "append")

    def _commit_guarded(
        self, name: str, rows: DataFrame, version: int, mode: str, options: Mapping[str, str] | None = None
    ) -> None:
        """Write ``rows`` in one Delta commit planned from table ``version``, as a rewrite: with the application
        transaction ``rebalancer:<name>`` at ``version + 1``, as delta-rs's rewrites carry it. Delta then makes two
        rewrites of one table conflict (a commit after this one started) or skips this one (a commit between our
        look at ``version`` and Delta's own snapshot). A skipped write commits nothing and says nothing: the commit
        carries a token in its ``userMetadata``, and a write that cannot find its token raises a conflict, so the
        caller re-plans. Costs Delta one job before the write (its state, for the transaction ids)."""
        token = f"rebalancer {uuid.uuid4().hex}"
        guard = {"txnAppId": transaction_app(name), "txnVersion": str(version + 1), "userMetadata": token}
        self._save(rows, name, mode, {**(options or {}), **guard})
        reader = self._driver_reader
        assert reader is not None
        if token not in reader.user_metadata_since(name, version):
            raise _Overtaken(f"another writer rewrote {name} after version {version}; this write was skipped")

    @contextlib.contextmanager
    def commits_ahead(self, names: Sequence[str]) -> Iterator[None]:
        """Delta computes a table's state (a Spark job over its log) before each guarded commit, for the transaction
        ids (Delta 4.4 takes them from that state, not from the checksum file), and keeps the state with the table's
        snapshot. ``DESCRIBE DETAIL`` computes the same state of the current snapshot, so a background thread runs
        it for ``names``, in order, while the caller computes the rows: those jobs overlap the caller's, and a commit
        made from that snapshot finds its state ready (one whose table changed meanwhile computes its own, as
        without). A commit that starts while its table's state is being computed waits for it (Delta computes it
        once per snapshot). The jobs run in the caller's job group, so they are counted with its work.

        Nothing to prepare with a driver writer: the rows of an exchange decided on the driver are committed by
        delta-rs, and the Spark path's (more than ``driver_replicas`` replicas) compute the
        state at their commit, a small share of such an exchange."""
        if self._driver_writer is not None:
            yield
            return
        from pyspark import inheritable_thread_target  # the thread gets the caller's job group and description

        stop = threading.Event()
        with self._ahead_lock:
            self._ahead.update(names)

        def prepare() -> None:
            _describe_jobs_as(self.spark, "preparing commits")
            for name in names:
                if stop.is_set():
                    return
                with self._ahead_lock:
                    if name not in self._ahead:  # its commit came first: that snapshot is gone
                        continue
                    self._ahead.discard(name)
                try:
                    self._small_session.sql(f"DESCRIBE DETAIL {self._reference(name)}").collect()
                except Exception as exc:  # a hint only: the commit computes the state itself
                    _log.debug("preparing the commit to %s: %s", name, exc)

        # One thread: on 2 cores, four (one per concurrent commit) slowed the kernel's job more than they saved.
        thread = threading.Thread(target=inheritable_thread_target(self.spark)(prepare), daemon=True,
                                  name="rebalancer-commits-ahead")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with self._ahead_lock:
                self._ahead.difference_update(names)

    def insert_absent_arrow(self, name: str, rows: pa.Table, keys: Sequence[str]) -> None:
        """As on delta-rs: the keys already stored are read on the driver and the rest appended as a guarded rewrite
        (two Spark jobs; Delta's insert-only MERGE, used without a driver reader, runs five); by the driver
        writer when there is one (no Spark job)."""
        if self._write_on_driver(lambda writer: writer.insert_absent_arrow(name, rows, keys)):
            return
        reader = self._driver_reader
        if reader is None:
            super().insert_absent_arrow(name, rows, keys)
            return
        key_list = check_merge_keys(keys, self._stored(name)[0], name)

        def attempt() -> None:
            version = self.table_version(name)
            fresh = absent_rows(rows, key_list, self.read_arrow(name, version=version).select(key_list), name)
            if fresh.num_rows:
                self._commit_guarded(name, self._frame(fresh, name), version, "append")

        retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=_lost_race)

    def delete_where(self, name: str, condition: str) -> None:
        def attempt() -> None:
            self.spark.sql(f"DELETE FROM {self._reference(name)} WHERE {condition}")

        retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=is_delta_conflict)

    def vacuum(self, name: str, retain_hours: int) -> int:
        root = Path(self.path_of(name))
        listed = root.is_dir()  # a path table: count its data files (Delta's Python vacuum returns no count)
        files_before = _data_files(root) if listed else set()
        with self._vacuum_settings():
            self.spark.sql(f"VACUUM {self._reference(name)} RETAIN {int(retain_hours)} HOURS").collect()
        return len(files_before - _data_files(root)) if listed else 0

    @contextlib.contextmanager
    def _vacuum_settings(self) -> Iterator[None]:
        """The session's settings for VACUUM (:data:`_VACUUM_SETTINGS`) while any vacuum runs in it (they may run at
        once, from one warehouse or several: the session's own values come back when the last one ends)."""
        session = id(self.spark)
        with _VACUUMS_LOCK:
            running, before = _VACUUMS.get(session, (0, {}))
            if running == 0:
                for key, value in _VACUUM_SETTINGS.items():
                    own = self.spark.conf.get(key, None)
                    try:
                        self.spark.conf.set(key, value)
                    except Exception:  # noqa: BLE001 - a session that refuses it (a serverless one, say) runs as is
                        if key != _RETENTION_CHECK:
                            continue
                        raise
                    before[key] = own
            _VACUUMS[session] = (running + 1, before)
        try:
            yield
        finally:
            with _VACUUMS_LOCK:
                running, before = _VACUUMS.pop(session)
                if running > 1:
                    _VACUUMS[session] = (running - 1, before)
                else:
                    for key, own in before.items():
                        if own is None:
                            self.spark.conf.unset(key)
                        else:
                            self.spark.conf.set(key, own)

    def merge(self, name: str, df: DataFrame, keys: Sequence[str], *, insert_only: bool = False) -> None:
        stored, optional = self._stored(name)
        key_list = check_merge_keys(keys, stored, name)
        rows = conform(df, stored, name, optional=optional)
        check_unique_keys(rows, key_list, name)

        source = f"rebalancer_merge_{uuid.uuid4().hex}"  # a view of the rows, for MERGE's SQL text
        matched = "" if insert_only else " WHEN MATCHED THEN UPDATE SET *"
        statement = (
            f"MERGE INTO {self._reference(name)} AS t USING {source} AS s ON {merge_condition(key_list, 't', 's')}"
            f"{matched} WHEN NOT MATCHED THEN INSERT *"
        )

        session = rows.sparkSession  # the view below is the rows' session's (driver rows: the small session's)

        def attempt() -> None:
            self._committing(name)
            try:
                session.sql(statement).collect()
            except Exception as exc:
                if "MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW" in str(exc):
                    raise DuplicateKeyError(
                        f"the rows merged into {name} hold more than one row for one key; deduplicate the source."
                    ) from None
                raise

        rows.createOrReplaceTempView(source)
        try:
            retry_on_conflict(attempt, table=name, retries=self.commit_retries, is_conflict=is_delta_conflict)
        finally:
            session.catalog.dropTempView(source)

    # ---- views ----
    def _register_view(self, name: str) -> None:
        """A path warehouse's table becomes a catalog table of the session (an external Delta table over its
        path), so ``VERSION AS OF``, ``DESCRIBE HISTORY`` and ``RESTORE`` work by name; a name the session's
        catalog already gives to another table keeps a temporary view instead (the user's table is not touched).
        Catalog warehouses (``catalog_prefix``) get a view by the short name; their tables have their own names."""
        self._require(name)
        if not self.catalog_prefix and self._as_catalog_table(name):
            return
        self.spark.sql(view_sql(name, self._reference(name), tables.SCHEMAS.get(name)))

    def _as_catalog_table(self, name: str) -> bool:
        """Register ``name`` as an external Delta table at its path; False when the name is another table's."""
        location = self.path_of(name)
        self.spark.catalog.dropTempView(name)  # a view of the same name would hide the table
        if self.spark.catalog.tableExists(name):
            detail = self.spark.sql(f"DESCRIBE DETAIL {quote_identifier(name)}").collect()
            return bool(detail and _same_location(str(detail[0]["location"]), location))
        self.spark.sql(f"CREATE TABLE {quote_identifier(name)} USING DELTA LOCATION {sql_literal(location)}")
        return True

    def _refresh_view(self, name: str) -> None:
        """A catalog table reads the newest snapshot by itself; only a view needs re-pointing."""
        if name in self._views and not self.spark.catalog.tableExists(name):
            self._register_view(name)

    def _require(self, name: str) -> None:
        if not self.exists(name):
            raise TableNotFoundError(
                f"table {name} does not exist at {self.path_of(name)}; create it first (rebalancer init, or "
                f"Warehouse.create_tables)."
            )


def _describe_jobs_as(spark: SparkSession, what: str) -> None:
    """This thread's Spark jobs described as ``what`` of the work it inherited (``rebalancer exchange: <stage>``
    becomes ``rebalancer exchange: <what>``); nothing on Spark Connect, which has tags, not descriptions."""
    try:
        sc = spark.sparkContext
    except Exception:
        return
    work = (sc.getLocalProperty("spark.job.description") or "rebalancer").split(": ")[0]
    sc.setJobDescription(f"{work}: {what}")


class _Overtaken(RuntimeError):
    """Delta skipped a rewrite because another one, planned from the same version, committed first."""


def _lost_race(exc: BaseException) -> bool:
    return isinstance(exc, _Overtaken) or is_delta_conflict(exc)


def _data_files(root: Path) -> set[Path]:
    return {f for f in root.rglob("*.parquet") if "_delta_log" not in f.parts}
