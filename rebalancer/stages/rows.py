"""The rows of one exchange as frames of one kind: Arrow tables on the driver, or Spark DataFrames.

An exchange assembles the kernel's input, decides it and builds every versioned table from the decided and the
carried rows in one way (:func:`kernel_input`, :func:`decide_scope_rows`, :func:`version_tables`); how a frame is
read, filtered, tagged, decided and written is the job of :class:`Rows`, which two implementations satisfy:

- :class:`ArrowRows` on the driver: the previous version's tables read as Arrow, the kernel run over one buffer
  ordered by partition, the routing maps folded on the driver. Small clusters: no Spark job at all.
- :class:`SparkRows`: one shuffle of the tagged rows by partition into ``mapInArrow`` (the kernel's tasks spread
  over the executors), the large tables written from Spark.

:func:`rows_for` chooses once per exchange (:mod:`rebalancer.stages.paths`). Both give the same rows: a
differential test runs random histories both ways.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type, to_arrow_schema

from rebalancer.exchange import routing
from rebalancer.exchange.batches import (
    KINDS,
    OUTPUT_SCHEMA,
    SUMMARY,
    SUMMARY_COLUMNS,
    decide_stream,
    decided_chunks,
    total_counts,
)
from rebalancer.exchange.kernel import (
    ASSIGNMENT,
    DECISION_SCHEMAS,
    INPUT_SCHEMA,
    LOST_ROW,
    MAP,
    PARTITION,
    REPORT,
    VERSION,
    KernelContext,
)
from rebalancer.frames import parallelism
from rebalancer.groups import GroupSettings
from rebalancer.inputs import Reports
from rebalancer.stages import paths
from rebalancer.stages.previous import Previous
from rebalancer.stages.scope import Scope
from rebalancer.storage import Warehouse
from rebalancer.storage.sql import sql_literal
from rebalancer.tables import OUTPUT_TABLES, VERSION_COLUMNS, version_where
from rebalancer.vocabulary import MAX_PARTITIONS, PARTITION_KEY

__all__ = [
    "LARGE_TABLES", "SMALL_KINDS", "ArrowRows", "Decided", "KernelRows", "Rows", "SparkRows",
    "arrow_schema", "kernel_input", "key_codes", "rows_for", "tagged", "tagged_arrow", "version_tables",
]

#: Versioned tables with one row per partition or copy (with ``client_affinity``, built from one of them).
LARGE_TABLES = ("ideal_assignment", "affinity_assignment", "partition_map", "partition_versions")
#: The kernel's small outputs, collected to the driver.
SMALL_KINDS = ("counter_conflicts", "lost_partitions", "steps")
#: The previous version's tables the kernel reads, with the kind they are tagged with.
KERNEL_TABLES = (("partition_map", MAP), ("affinity_assignment", ASSIGNMENT), ("partition_versions", VERSION))
KEY_SCHEMA = pa.schema([("group_name", pa.string()), ("partition_id", pa.int32())])

Frame = TypeVar("Frame", pa.Table, DataFrame)


def arrow_schema(schema: Any) -> pa.Schema:
    """A declared Spark schema as Arrow (timestamps in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


@dataclass
class Decided(Generic[Frame]):
    """What the kernel decided: the rows of each large table (:data:`LARGE_TABLES`, in the table's columns
    without the version columns), the small tables and the summary counts on the driver, and what the writes need
    kept until :meth:`Rows.release` (Spark's cached long output)."""

    large: dict[str, Frame]
    small: dict[str, pa.Table]
    counts: dict[str, int]
    kept: DataFrame | None = None


class KernelRows(ABC, Generic[Frame]):
    """What the kernel's input is assembled from (:func:`kernel_input`): the previous version's rows of the
    recomputed partitions, tagged; an exchange's :class:`Rows`, or what-if's scenarios."""

    previous: Previous

    @abstractmethod
    def table(self, rows: pa.Table) -> Frame:
        """Driver rows as a frame."""

    @abstractmethod
    def read(self, name: str) -> Frame:
        """The previous version's rows of versioned table ``name``."""

    @abstractmethod
    def markers(self) -> Frame:
        """One ``group_name``, ``partition_id`` row per recomputed partition."""

    @abstractmethod
    def unsettled(self, frame: Frame) -> Frame:
        """The rows of the recomputed partitions (of running groups, in range)."""

    @abstractmethod
    def tagged(self, frame: Frame, kind: int) -> Frame:
        """``frame`` as kernel input rows of ``kind`` (:data:`INPUT_SCHEMA`)."""

    def reports(self, reports: Reports) -> Frame:
        """The valid new reports."""
        raise NotImplementedError


class Rows(KernelRows[Frame]):
    """Frames of one exchange, over the previous version ``previous``, for the partitions of ``scope``.

    ``sizes``: the partition count of every running group (a row of another group, or past its count, is in
    neither the unsettled nor the settled rows)."""

    def __init__(self, previous: Previous, scope: Scope, sizes: Mapping[str, int]) -> None:
        self.previous, self.scope, self.sizes = previous, scope, sizes

    @abstractmethod
    def settled(self, frame: Frame) -> Frame:
        """The rows of the settled partitions of carried groups (running before and now, not recomputed whole)."""

    @abstractmethod
    def decide(self, parts: Sequence[Frame], ctx: KernelContext) -> Decided[Frame]:
        """The kernel over the tagged rows, partition by partition."""

    @abstractmethod
    def union(self, parts: Sequence[Frame], name: str) -> Frame:
        """Rows of versioned table ``name`` (columns as in ``Decided.large``), concatenated; none: no rows."""

    @abstractmethod
    def versioned(self, frame: Frame, name: str, version: tuple[int, int]) -> Frame:
        """``frame`` as the rows of versioned table ``name`` at ``version``."""

    @abstractmethod
    def client_affinity(self, assignment: Frame, groups: Sequence[GroupSettings]) -> Frame:
        """The client routing maps of the versioned late assignment ``assignment`` of ``groups``."""

    @abstractmethod
    def written(self, frame: Frame, name: str, version: tuple[int, int], columns: Sequence[str],
                groups: Sequence[str]) -> pa.Table:
        """The rows of ``groups`` of ``frame``, just written to versioned table ``name`` at ``version``,
        ``columns`` only, on the driver."""

    def release(self, decided: Decided[Frame] | None) -> None:
        """Free what :meth:`decide` kept for the writes."""

    def marker_keys(self) -> pa.Table:
        """The recomputed partitions' keys not of a whole recomputed group."""
        return key_table(self.scope.single_keys())


def rows_for(spark: SparkSession, warehouse: Warehouse, previous: Previous, scope: Scope, sizes: Mapping[str, int],
             replicas: int, reports: Reports | None) -> Rows[Any]:
    """Arrow on the driver for clusters up to ``warehouse.driver_replicas`` replicas when the warehouse reads on
    the driver and the reports were judged there; Spark otherwise."""
    if warehouse.reads_on_driver and replicas <= warehouse.driver_replicas and (reports is None
                                                                           or reports.arrow is not None):
        return ArrowRows(previous, scope, sizes)
    return SparkRows(spark, previous, scope, sizes)


def kernel_input(rows: KernelRows[Frame], reports: Reports | None) -> list[Frame]:
    """The kernel's tagged input: a marker row per recomputed partition, and the previous version's copies,
    assignment, versions and lost marks and the new reports of those partitions."""
    parts = [rows.tagged(rows.markers(), PARTITION)]
    if rows.previous.committed is not None:
        for name, kind in KERNEL_TABLES:
            parts.append(rows.tagged(rows.unsettled(rows.read(name)), kind))
        lost = rows.previous.arrow("lost_partitions").select(list(PARTITION_KEY))
        if lost.num_rows:
            parts.append(rows.tagged(rows.unsettled(rows.table(lost)), LOST_ROW))
    if reports is not None:
        parts.append(rows.tagged(rows.unsettled(rows.reports(reports)), REPORT))
    return parts


def version_tables(rows: Rows[Frame], decided: Decided[Frame] | None, version: tuple[int, int]) -> dict[str, Frame]:
    """The large versioned tables at ``version``: each the decided rows and the settled rows carried over."""
    carried = rows.previous.committed is not None and bool(set(rows.sizes) - set(rows.scope.whole_groups(
        list(rows.sizes))))
    out = {}
    for name in LARGE_TABLES:
        parts = [decided.large[name]] if decided is not None else []
        if carried:
            parts.append(rows.settled(rows.read(name)))
        out[name] = rows.versioned(rows.union(parts, name), name, version)
    return out


def key_table(keys: Sequence[tuple[str, int]]) -> pa.Table:
    return pa.table({"group_name": [g for g, _ in keys], "partition_id": [p for _, p in keys]}, schema=KEY_SCHEMA)


def split_small(collected: pa.Table) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """The collected long rows split into the small decision tables, and the summary counts summed."""
    kinds = collected.column("kind")
    tables = {}
    for name in SMALL_KINDS:
        schema = DECISION_SCHEMAS[name]
        tables[name] = collected.filter(pc.equal(kinds, KINDS[name])).select(schema.names).cast(schema)
    summaries = collected.filter(pc.equal(kinds, SUMMARY)).select(list(SUMMARY_COLUMNS))
    return tables, total_counts(summaries.to_pylist())


# =====================================================================================================================
# On the driver
# =====================================================================================================================


class ArrowRows(Rows[pa.Table]):
    """Frames as Arrow tables on the driver."""

    def table(self, rows: pa.Table) -> pa.Table:
        return rows

    def read(self, name: str) -> pa.Table:
        return self.previous.arrow(name)

    def reports(self, reports: Reports) -> pa.Table:
        assert reports.arrow is not None
        return reports.arrow

    def markers(self) -> pa.Table:
        groups = self.scope.whole_groups(list(self.sizes))
        counts = [self.sizes[g] for g in groups]
        whole = pa.table({
            "group_name": pa.array(np.repeat(np.array(groups, dtype=object), counts), pa.string()),
            "partition_id": pa.array(np.concatenate([np.arange(n, dtype=np.int32) for n in counts])
                                     if counts else np.empty(0, np.int32), pa.int32()),
        }, schema=KEY_SCHEMA)
        return pa.concat_tables([whole, self.marker_keys()])

    def unsettled(self, frame: pa.Table) -> pa.Table:
        return frame.filter(unsettled_mask(frame, self.scope, self.sizes))

    def settled(self, frame: pa.Table) -> pa.Table:
        return frame.filter(settled_mask(frame, self.scope, self.sizes))

    def tagged(self, frame: pa.Table, kind: int) -> pa.Table:
        return tagged_arrow(frame, kind)

    def decide(self, parts: Sequence[pa.Table], ctx: KernelContext) -> Decided[pa.Table]:
        # The same kernel and buffers as Spark's tasks, without the long table that carries Spark's output: at XL
        # its null columns alone were 0.8 s of memory to fill.
        rows = pa.concat_tables(parts).sort_by([("group_name", "ascending"), ("partition_id", "ascending")])
        chunks = list(decided_chunks(rows.to_batches(), ctx))

        def table(name: str) -> pa.Table:
            schema = DECISION_SCHEMAS[name]
            return pa.concat_tables([schema.empty_table(), *(getattr(d, name).cast(schema) for d, _ in chunks)])

        large = {name: table(name).select(_columns(name)) for name in LARGE_TABLES}
        small = {name: table(name) for name in SMALL_KINDS}
        return Decided(large, small, total_counts(summary for _, summary in chunks))

    def union(self, parts: Sequence[pa.Table], name: str) -> pa.Table:
        schema = _unversioned_schema(name)
        return pa.concat_tables([schema.empty_table(), *(p.select(schema.names).cast(schema) for p in parts)])

    def versioned(self, frame: pa.Table, name: str, version: tuple[int, int]) -> pa.Table:
        return versioned_arrow(frame, name, version)

    def client_affinity(self, assignment: pa.Table, groups: Sequence[GroupSettings]) -> pa.Table:
        return routing.client_affinity_arrow(assignment, groups)

    def written(self, frame: pa.Table, name: str, version: tuple[int, int], columns: Sequence[str],
                groups: Sequence[str]) -> pa.Table:
        return frame.filter(pc.is_in(frame.column("group_name"), pa.array(sorted(groups), pa.string()))) \
            .select(list(columns))


def versioned_arrow(rows: pa.Table, name: str, version: tuple[int, int]) -> pa.Table:
    """``rows`` as the versioned table ``name``'s rows at ``version`` (its columns in order, missing ones null)."""
    schema = arrow_schema(OUTPUT_TABLES[name])
    n = rows.num_rows
    data = {"topology_major": pa.array(np.full(n, version[0], np.int64)),
            "topology_minor": pa.array(np.full(n, version[1], np.int32))}
    for f in schema:
        if f.name not in VERSION_COLUMNS:
            data[f.name] = rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type)
    return pa.table(data).cast(schema)


def _columns(name: str) -> list[str]:
    return [f for f in OUTPUT_TABLES[name].fieldNames() if f not in VERSION_COLUMNS]


def _unversioned_schema(name: str) -> pa.Schema:
    schema = arrow_schema(OUTPUT_TABLES[name])
    return pa.schema([f for f in schema if f.name not in VERSION_COLUMNS])


def key_codes(t: pa.Table, sizes: Mapping[str, int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Each row's partition as one integer (its group's rank among ``sizes``' groups x MAX_PARTITIONS + its
    partition id) and whether it is in range (a running group, a partition id below the group's count)."""
    names = sorted(sizes)
    rank = np.asarray(pc.fill_null(pc.index_in(t.column("group_name"), pa.array(names, pa.string())), -1),
                      dtype=np.int64)
    pid = np.asarray(pc.fill_null(t.column("partition_id").cast(pa.int64()), -1), dtype=np.int64)
    limit = np.asarray([sizes[g] for g in names] + [0], dtype=np.int64)[rank]
    return rank * MAX_PARTITIONS + pid, (rank >= 0) & (pid >= 0) & (pid < limit)


def _keys_of(keys: Sequence[tuple[str, int]] | frozenset[tuple[str, int]],
             sizes: Mapping[str, int]) -> npt.NDArray[np.int64]:
    rank = {g: i for i, g in enumerate(sorted(sizes))}
    return np.array([rank[g] * MAX_PARTITIONS + p for g, p in keys if g in rank], dtype=np.int64)


def _in_groups(t: pa.Table, names: frozenset[str] | set[str]) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(pc.is_in(t.column("group_name"), pa.array(sorted(names), pa.string())), False),
                      dtype=bool)


def unsettled_mask(t: pa.Table, scope: Scope, sizes: Mapping[str, int]) -> pa.Array:
    """Which rows of an Arrow table are of the recomputed partitions."""
    code, in_range = key_codes(t, sizes)
    if scope.everything:
        return pa.array(in_range)
    return pa.array(in_range & (_in_groups(t, scope.groups) | np.isin(code, _keys_of(scope.keys, sizes))))


def settled_mask(t: pa.Table, scope: Scope, sizes: Mapping[str, int]) -> pa.Array:
    """Which rows of an Arrow table are of the carried groups' settled partitions."""
    code, in_range = key_codes(t, sizes)
    carried = _in_groups(t, set(sizes) - set(scope.groups))
    return pa.array(in_range & carried & ~np.isin(code, _keys_of(scope.keys, sizes)))


# =====================================================================================================================
# In Spark
# =====================================================================================================================


class SparkRows(Rows[DataFrame]):
    """Frames as Spark DataFrames.

    The recomputed partitions' groups are chosen by SQL text (one py4j call: a Column built with ``isin`` makes one
    call per literal, 6.6 s for an M scale-down's 3,896 keys). Single partitions too, up to
    ``paths.KEYS_AS_LITERALS`` of them; beyond, by a join with a broadcast table of their keys: thousands of
    literals in a plan make every later analysis of it slow (1.6 s to build an M scale-down's writes), while a broadcast
    costs a Spark job per query (4 to 10).
    """

    def __init__(self, spark: SparkSession, previous: Previous, scope: Scope, sizes: Mapping[str, int]) -> None:
        super().__init__(previous, scope, sizes)
        self.spark = spark
        keys = sorted(k for k in scope.keys if k[0] in sizes and k[0] not in scope.groups)
        self._literal: str | None = None
        self._keys: DataFrame | None = None
        if keys and len(keys) <= paths.KEYS_AS_LITERALS:
            codes = {g: i for i, g in enumerate(sorted(sizes))}
            key_sql = (f"CAST(element_at({_sql_map(codes.items())}, group_name) AS BIGINT) * {MAX_PARTITIONS}"
                       " + partition_id")
            self._literal = f"{key_sql} IN ({_sql_list(codes[g] * MAX_PARTITIONS + p for g, p in keys)})"
        elif keys:
            self._keys = F.broadcast(spark.createDataFrame(key_table(keys)))

    def table(self, rows: pa.Table) -> DataFrame:
        return self.spark.createDataFrame(rows)

    def read(self, name: str) -> DataFrame:
        return self.previous.frame(name)

    def reports(self, reports: Reports) -> DataFrame:
        return reports.valid

    def markers(self) -> DataFrame:
        groups = self.scope.whole_groups(list(self.sizes))
        parts = []
        if groups:
            counts = pa.table({"group_name": groups, "partitions": [self.sizes[g] for g in groups]},
                              schema=pa.schema([("group_name", pa.string()), ("partitions", pa.int32())]))
            parts.append(self.spark.createDataFrame(counts).select(
                "group_name", F.explode(F.sequence(F.lit(0), F.col("partitions") - 1)).alias("partition_id")))
        keys = self.marker_keys()
        if keys.num_rows or not parts:
            parts.append(self.spark.createDataFrame(keys))
        return functools.reduce(DataFrame.unionByName, parts)

    def unsettled(self, frame: DataFrame) -> DataFrame:
        in_range = _in_range_sql(self.sizes, self.sizes)
        if self.scope.everything:
            return frame.where(F.expr(in_range))
        whole = _in_range_sql(self.scope.groups, self.sizes)
        if self._literal is not None:
            return frame.where(F.expr(f"{whole} OR ({in_range} AND {self._literal})"))
        if self._keys is not None:
            return frame.where(F.expr(whole)).unionByName(
                frame.where(F.expr(in_range)).join(self._keys, list(PARTITION_KEY), "left_semi"))
        return frame.where(F.expr(whole))

    def settled(self, frame: DataFrame) -> DataFrame:
        carried = _in_range_sql(set(self.sizes) - set(self.scope.groups), self.sizes)
        if self._literal is not None:
            return frame.where(F.expr(f"{carried} AND NOT ({self._literal})"))
        if self._keys is not None:
            return frame.where(F.expr(carried)).join(self._keys, list(PARTITION_KEY), "left_anti")
        return frame.where(F.expr(carried))

    def tagged(self, frame: DataFrame, kind: int) -> DataFrame:
        return tagged(frame, kind)

    def decide(self, parts: Sequence[DataFrame], ctx: KernelContext) -> Decided[DataFrame]:
        rows = functools.reduce(DataFrame.unionByName, parts)
        tasks = max(1, min(parallelism(self.spark) * 2, math.ceil(self.scope.count(self.sizes) / 50_000)))

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return decide_stream(batches, ctx)

        out = (rows.repartition(tasks, "group_name", "partition_id")
               .sortWithinPartitions("group_name", "partition_id")
               .mapInArrow(run, from_arrow_schema(OUTPUT_SCHEMA))
               .persist())
        collected = out.where(F.col("kind").isin([KINDS[k] for k in SMALL_KINDS] + [SUMMARY])).toArrow()
        large = {name: out.where(F.col("kind") == KINDS[name]).select(*_columns(name)) for name in LARGE_TABLES}
        return Decided(large, *split_small(collected), kept=out)

    def union(self, parts: Sequence[DataFrame], name: str) -> DataFrame:
        if not parts:  # no running group
            return self.previous.warehouse.read(name).limit(0).select(*_columns(name))
        return functools.reduce(DataFrame.unionByName, [p.select(*_columns(name)) for p in parts])

    def versioned(self, frame: DataFrame, name: str, version: tuple[int, int]) -> DataFrame:
        return frame.select(
            F.lit(version[0]).cast("long").alias("topology_major"),
            F.lit(version[1]).cast("int").alias("topology_minor"),
            *[c for c in frame.columns if c not in VERSION_COLUMNS],
        )

    def client_affinity(self, assignment: DataFrame, groups: Sequence[GroupSettings]) -> DataFrame:
        digests = routing.routing_digests(assignment).toArrow().to_pylist()
        return routing.client_affinity(assignment, routing.fold(digests, groups))

    def written(self, frame: DataFrame, name: str, version: tuple[int, int], columns: Sequence[str],
                groups: Sequence[str]) -> pa.Table:
        # Where the warehouse reads on the driver, the rows just committed are read there: no Spark job, where
        # collecting ``frame`` would be one (it unions the kernel's output with the carried rows).
        warehouse = self.previous.warehouse
        if warehouse.reads_on_driver:
            rows = warehouse.read_arrow(name, where=version_where(version))
            return rows.filter(pc.is_in(rows.column("group_name"), pa.array(sorted(groups), pa.string()))) \
                .select(list(columns))
        return frame.where(F.expr(f"group_name IN ({_sql_list(sorted(groups))})")).select(*columns).toArrow()

    def release(self, decided: Decided[DataFrame] | None) -> None:
        if decided is not None and decided.kept is not None:
            decided.kept.unpersist()


def tagged_arrow(frame: pa.Table, kind: int, keep: Sequence[str] = ()) -> pa.Table:
    """:func:`tagged` on the driver."""
    n = frame.num_rows
    columns, fields = [frame.column(c) for c in keep], [frame.schema.field(c) for c in keep]
    for f in INPUT_SCHEMA:
        if f.name == "kind":
            columns.append(pa.array(np.full(n, kind, np.int8)))
        elif f.name in frame.column_names:
            columns.append(frame.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=pa.schema([*fields, *INPUT_SCHEMA]))


def tagged(df: DataFrame, kind: int, keep: Sequence[str] = ()) -> DataFrame:
    """``df`` as kernel input rows of ``kind``: every :data:`INPUT_SCHEMA` column, in order (missing ones null),
    after the columns named in ``keep``."""
    columns = [F.col(c) for c in keep]
    for f in INPUT_SCHEMA:
        if f.name == "kind":
            columns.append(F.lit(kind).cast("byte").alias("kind"))
        elif f.name in df.columns:
            columns.append(F.col(f.name).cast(from_arrow_type(f.type)).alias(f.name))
        else:
            columns.append(F.lit(None).cast(from_arrow_type(f.type)).alias(f.name))
    return df.select(*columns)


def _sql_list(values: Any) -> str:
    return ", ".join(sql_literal(v) for v in values)


def _sql_map(pairs: Any) -> str:
    return "map(" + ", ".join(f"{sql_literal(k)}, {sql_literal(v)}" for k, v in pairs) + ")"


def _in_range_sql(groups: Any, sizes: Mapping[str, int]) -> str:
    """Rows of ``groups`` whose partition_id is below the group's partition count."""
    names = sorted(groups)
    if not names:
        return "FALSE"
    return (f"(group_name IN ({_sql_list(names)}) AND "
            f"partition_id < element_at({_sql_map((g, sizes[g]) for g in sorted(sizes))}, group_name))")
