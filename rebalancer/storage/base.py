"""The :class:`Warehouse` interface: what every storage engine offers, one Delta commit per write."""

from __future__ import annotations

import abc
import datetime as dt
import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from rebalancer import tables
from rebalancer.storage.commits import commit_each
from rebalancer.storage.keys import check_table_name
from rebalancer.storage.sql import WhereValue

__all__ = [
    "CLUSTER_DRIVER_REPLICAS", "COMMIT_COLUMN", "DRIVER_BYTES_PER_REPLICA", "TABLE_PROPERTIES", "TableChanges",
    "Warehouse", "machine_memory_bytes", "replicas_on_driver",
]

# Properties every table the engine creates carries: the lowest protocol every Delta reader understands, and no
# deletion vectors (a delta-rs warehouse is read by Spark as plain parquet files, which would resurrect rows that a
# deletion vector hides). delta-rs keeps 1/2 by default; delta-spark needs the explicit properties.
TABLE_PROPERTIES: dict[str, str] = {
    "delta.minReaderVersion": "1",
    "delta.minWriterVersion": "2",
    "delta.enableDeletionVectors": "false",
}

#: The column :meth:`Warehouse.changes` adds to every new row: the Delta version of the commit that added it.
COMMIT_COLUMN = "__rebalancer_commit"


#: ``storage.driver_replicas = "auto"`` on a master that is not local (a cluster's driver, sized by its user; the
#: executors take larger clusters): at XXL (2,801,664 replicas) the driver paths took 4.5 GB at most.
CLUSTER_DRIVER_REPLICAS = 5_000_000
#: The driver process's resident bytes per replica at its peak, the most measured on the driver paths: XXL's first
#: exchange 4.5 GB for 2,801,664 replicas (1.6 KB); XXXL's 11.9 GB for 9,830,400 (1.2 KB; docs/SCALING.md).
DRIVER_BYTES_PER_REPLICA = 1_600
#: What ``storage.driver_replicas = "auto"`` leaves on a local machine to the system and other processes, besides
#: the JVM's heap.
_RESERVED_BYTES = 1 << 30
_LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")
_JVM_SIZE = re.compile(r"([0-9]+)([kmgt]?)b?", re.IGNORECASE)


def replicas_on_driver(master: str, driver_memory: str, machine_bytes: int) -> int:
    """How many replicas ``storage.driver_replicas = "auto"`` decides on the driver.

    On a local master (``local``, ``local[N]``, ``local[*]``; not ``local-cluster``, whose executors are JVMs of
    their own) the Spark paths run on the same cores, so the driver is faster at every size measured; it is then
    limited by memory: ``machine_bytes`` less the JVM's ``driver_memory`` (``4g``, Spark's notation) and 1 GiB, at
    :data:`DRIVER_BYTES_PER_REPLICA`. On any other master :data:`CLUSTER_DRIVER_REPLICAS`.
    """
    if _LOCAL_MASTER.fullmatch(master.strip()) is None:
        return CLUSTER_DRIVER_REPLICAS
    size = _JVM_SIZE.fullmatch(driver_memory.strip())
    heap = int(size.group(1)) << (10 * " kmgt".index(size.group(2).lower() or " ")) if size else 1 << 30
    return max(0, (machine_bytes - heap - _RESERVED_BYTES) // DRIVER_BYTES_PER_REPLICA)


def machine_memory_bytes() -> int:
    """This machine's physical memory, or the memory limit of this process's container (cgroup v2 or v1) if lower."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            memory = min(memory, int(limit.read_text().strip()))
        except (OSError, ValueError):  # absent, or "max": no limit
            continue
    return memory


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


class Warehouse(abc.ABC):
    """One Delta table per name of ``tables.SCHEMAS``, in a directory or a Unity Catalog schema.

    This is the only interface through which rebalancer touches Delta. Writes are one Delta commit each (so a
    reader of any table version sees a write completely or not at all), are fitted to the table schema first
    (:func:`~rebalancer.storage.schemas.conform`), and are retried on commit conflicts up to
    ``storage.commit_retries`` times (:func:`~rebalancer.storage.commits.retry_on_conflict`).

    Attributes:
        engine: the engine's name, a key of :data:`rebalancer.storage.ENGINES` (``"delta-rs"``, ``"delta-spark"``).
        spark: the session used for reading and for writing data files.
        commit_retries: retries of a write whose commit lost a race with another writer.
        concurrent_commits: how many independent commits :meth:`replace_where_many` may make at once.
        driver_replicas: ``storage.driver_replicas`` resolved (:func:`replicas_on_driver`) when first read: the
            largest cluster (replicas) whose work runs on the driver when the warehouse :attr:`reads_on_driver`.
    """

    engine: str

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the warehouse is, for messages: its absolute directory or URI, or its catalog prefix."""

    @property
    def reads_on_driver(self) -> bool:
        """Whether :meth:`read_arrow` reads on the driver, without a Spark job (the pipeline then decides exchanges
        of up to :attr:`driver_replicas` replicas there)."""
        return False

    def __init__(self, spark: SparkSession, *, commit_retries: int = 5, concurrent_commits: int = 1,
                 driver_replicas: int | str = "auto") -> None:
        self.spark = spark
        self.commit_retries = commit_retries
        self.concurrent_commits = concurrent_commits
        self._driver_replicas_setting = driver_replicas
        self._views: set[str] = set()

    @functools.cached_property
    def driver_replicas(self) -> int:
        if isinstance(self._driver_replicas_setting, int):
            return self._driver_replicas_setting
        try:
            master, memory = self.spark.conf.get("spark.master", ""), self.spark.conf.get("spark.driver.memory", "1g")
        except Exception:  # a session that does not show its configuration (Databricks serverless): not local
            master, memory = "", "1g"
        return replicas_on_driver(master or "", memory or "1g", machine_memory_bytes())

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
        """Whether a Delta table ``name`` is there.

        Raises:
            UnknownTableError: the name is not a valid identifier.
        """

    @abc.abstractmethod
    def path_of(self, name: str) -> str:
        """Where table ``name`` lives: its directory (an absolute path or a URI), or with a catalog prefix its full
        name ``catalog.schema.name``.

        Raises:
            UnknownTableError: the name is not a valid identifier.
        """

    @abc.abstractmethod
    def table_version(self, name: str) -> int:
        """The latest Delta version of table ``name`` (0 right after creation).

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
        self, frames: Mapping[str, DataFrame | pa.Table], where: Mapping[str, WhereValue],
        committed: Callable[[str], None] | None = None, rows_hint: int | None = None,
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
