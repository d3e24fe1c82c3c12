"""Ideal assignment stage: which nodes should hold each partition of each cache group, per the group's affinity.

Contract:
- Input ``nodes_df``: the alive rows of the ``nodes`` table (SPEC section 2 columns; extra columns ignored). Rows
  with ``is_client`` true are dropped here (clients hold no data). Input ``groups_df``: rows of ``cache_groups``,
  each read by :meth:`rebalancer.groups.GroupSettings.from_row` (SPEC's null defaults).
- Output :data:`IDEAL_ASSIGNMENT_STAGE`: one row per (group, partition, replica) with ``replica_index`` 0 the
  primary; the exchange adds the version columns. A partition has min(backups + 1, nodes) rows (all nodes when
  REPLICATED), fewer only where a ``backup_filter`` cannot be satisfied. No nodes (or no groups) gives an empty
  result.
- Exact and deterministic: every partition's list is computed by the kernels of ``rebalancer.affinity.rendezvous``
  / ``.ignite`` through ``rebalancer.affinity.assign.assign_indexes``, the same call the pure client makes; Spark
  partitioning and batch sizes never change a value. ``balanced`` groups are placed together on the driver by
  ``rebalancer.affinity.balanced.assign_balanced`` (``settings.balanced_spread``), as the pure client does.

How it runs: ``nodes`` and ``cache_groups`` are small dimension tables (thousands of rows at most), so they are
collected to the driver once and shipped to the Python workers inside the ``mapInArrow`` closure. The work - one
row per partition and node - is generated on the executors: ``spark.range`` yields one row per chunk of
``settings.arrow_batch_rows`` consecutive (group, partition) positions, and each worker expands its chunks and
ranks them with NumPy, emitting Arrow batches. No row-at-a-time Python, no shuffle, no per-partition data on the
driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from rebalancer.affinity.assign import RankingMemo
from rebalancer.affinity.balanced import PreviousPlacement, assign_balanced
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import AffinitySettings
from rebalancer.groups import GroupSettings, InvalidGroupSettingsError
from rebalancer.vocabulary import BALANCED

__all__ = ["IDEAL_ASSIGNMENT_STAGE", "ideal_assignment", "ideal_assignment_arrow", "ideal_assignment_of",
           "previous_placement"]

IDEAL_ASSIGNMENT_STAGE = StructType(
    [
        StructField("group_name", StringType(), nullable=False),
        StructField("partition_id", IntegerType(), nullable=False),
        StructField("replica_index", IntegerType(), nullable=False),
        StructField("node_id", StringType(), nullable=False),
    ]
)
_ARROW_SCHEMA = pa.schema(
    [
        pa.field("group_name", pa.string(), nullable=False),
        pa.field("partition_id", pa.int32(), nullable=False),
        pa.field("replica_index", pa.int32(), nullable=False),
        pa.field("node_id", pa.string(), nullable=False),
    ]
)


def _collect_inputs(nodes_df: DataFrame, groups_df: DataFrame) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The two small dimension tables' rows, on the driver (the only collect of this stage)."""
    node_cols = ["node_id", "node_uuid", "node_order", "host", "attributes", "capacity"]
    server_rows = (
        nodes_df.where(~F.coalesce(F.col("is_client"), F.lit(False))).select(*node_cols).collect()
    )
    group_cols = ["group_name", "partitions", "backups", "mode", "affinity", "exclude_neighbors", "backup_filter"]
    return [r.asDict() for r in server_rows], [r.asDict() for r in groups_df.select(*group_cols).collect()]


def _dimensions(
    node_rows: Iterable[Mapping[str, Any]], group_rows: Iterable[Mapping[str, Any]]
) -> tuple[NodeSet, list[GroupSettings]]:
    """The servers and the groups (sorted by name, each once) of ``nodes`` and ``cache_groups`` rows."""
    nodes = NodeSet.from_rows(node_rows)
    groups = sorted((GroupSettings.from_row(r) for r in group_rows), key=lambda g: g.name)
    for first, second in zip(groups, groups[1:], strict=False):
        if first.name == second.name:
            raise InvalidGroupSettingsError(f"cache group {first.name!r} appears more than once")
    return nodes, groups


def _ranked_and_balanced(
    node_rows: Iterable[Mapping[str, Any]], group_rows: Iterable[Mapping[str, Any]]
) -> tuple[NodeSet, list[GroupSettings], list[GroupSettings]]:
    """The servers, the groups ranked one partition at a time, and the ``balanced`` groups (placed together)."""
    nodes, groups = _dimensions(node_rows, group_rows)
    return nodes, [g for g in groups if g.affinity != BALANCED], [g for g in groups if g.affinity == BALANCED]


def _rank_chunks(
    nodes: NodeSet, groups: list[GroupSettings], chunk_rows: int, ids_as_strings: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: chunk ids in, assignment rows out. Closes over the shipped dimension data."""
    offsets = np.cumsum([0] + [g.partitions for g in groups], dtype=np.int64)
    total = int(offsets[-1])
    node_ids = pa.array(nodes.node_ids, type=pa.string())
    group_names = pa.array([g.name for g in groups], type=pa.string())

    def rank(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ranking = RankingMemo(nodes, ids_as_strings)
        for batch in batches:
            for chunk in batch.column(0).to_numpy():
                lo, hi = int(chunk) * chunk_rows, min(total, (int(chunk) + 1) * chunk_rows)
                g = int(np.searchsorted(offsets, lo, side="right")) - 1
                while g < len(groups) and offsets[g] < hi:
                    group = groups[g]
                    first = max(lo, int(offsets[g])) - int(offsets[g])
                    last = min(hi, int(offsets[g + 1])) - int(offsets[g])
                    matrix = ranking(np.arange(first, last), group)
                    # Row-major nonzero keeps (partition, replica) order; -1 slots (unsatisfiable filter) drop out.
                    rows, replica = np.nonzero(matrix >= 0)
                    if rows.size:
                        yield pa.RecordBatch.from_arrays(
                            [
                                group_names.take(pa.array(np.full(rows.size, g, dtype=np.int32))),
                                pa.array((rows + first).astype(np.int32)),
                                pa.array(replica.astype(np.int32)),
                                node_ids.take(pa.array(matrix[rows, replica])),
                            ],
                            schema=_ARROW_SCHEMA,
                        )
                    g += 1

    return rank


def ideal_assignment(nodes_df: DataFrame, groups_df: DataFrame, settings: AffinitySettings) -> DataFrame:
    """The ideal assignment of every partition of every cache group.

    Collects the two small dimension tables to the driver once (nodes and cache groups: at most thousands of rows)
    and ships them to the workers; the partitions x nodes ranking itself runs on the executors as NumPy over Arrow
    batches (``mapInArrow``).

    Args:
        nodes_df: alive nodes (``nodes`` columns); client rows are ignored.
        groups_df: cache groups (``cache_groups`` columns).
        settings: ``arrow_batch_rows`` (partitions per Arrow batch) and ``ignite_ids_as_strings``.

    Returns:
        DataFrame with schema :data:`IDEAL_ASSIGNMENT_STAGE`.

    Raises:
        InvalidGroupSettingsError: a group's settings are outside the contract (names the group).
        rebalancer.affinity.nodeset.InvalidNodeSetError: duplicate node ids, invalid capacities or node UUIDs.
    """
    return ideal_assignment_of(nodes_df.sparkSession, *_collect_inputs(nodes_df, groups_df), settings)


def ideal_assignment_of(
    spark: SparkSession, node_rows: Iterable[Mapping[str, Any]], group_rows: Iterable[Mapping[str, Any]],
    settings: AffinitySettings,
) -> DataFrame:
    """:func:`ideal_assignment` of ``nodes`` and ``cache_groups`` rows already on the driver (same errors)."""
    nodes, groups, balanced = _ranked_and_balanced(node_rows, group_rows)
    total = sum(g.partitions for g in groups)
    parts = []
    if len(nodes) and balanced:
        parts.append(spark.createDataFrame(_balanced_rows(nodes, balanced, settings.balanced_spread),
                                           IDEAL_ASSIGNMENT_STAGE))
    if len(nodes) and total:
        chunk_rows = settings.arrow_batch_rows
        chunks = -(-total // chunk_rows)
        # spark.range's default slicing follows the session's default parallelism (one task per core locally).
        parts.append(spark.range(chunks).mapInArrow(
            _rank_chunks(nodes, groups, chunk_rows, settings.ignite_ids_as_strings), IDEAL_ASSIGNMENT_STAGE
        ))
    if not parts:
        return spark.createDataFrame([], IDEAL_ASSIGNMENT_STAGE)
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def ideal_assignment_arrow(
    node_rows: Iterable[Mapping[str, Any]], group_rows: Iterable[Mapping[str, Any]], settings: AffinitySettings,
) -> pa.Table:
    """:func:`ideal_assignment_of` on the driver, as Arrow: the same rows from the same functions, no Spark job (a
    small cluster's placement for people to read)."""
    nodes, groups, balanced = _ranked_and_balanced(node_rows, group_rows)
    total = sum(g.partitions for g in groups)
    tables = [_ARROW_SCHEMA.empty_table()]
    if len(nodes) and balanced:
        tables.append(_balanced_rows(nodes, balanced, settings.balanced_spread))
    if len(nodes) and total:
        chunk_rows = settings.arrow_batch_rows
        chunk_ids = pa.record_batch([pa.array(range(-(-total // chunk_rows)), pa.int64())], names=["id"])
        rank = _rank_chunks(nodes, groups, chunk_rows, settings.ignite_ids_as_strings)
        tables.append(pa.Table.from_batches(list(rank(iter([chunk_ids]))), schema=_ARROW_SCHEMA))
    return pa.concat_tables(tables)


def _balanced_rows(nodes: NodeSet, groups: list[GroupSettings], spread: bool) -> pa.Table:
    """The ``balanced`` groups' rows, placed together on the driver (a function of every balanced group)."""
    matrices = assign_balanced(groups, nodes, spread=spread)
    node_ids = pa.array(nodes.node_ids, type=pa.string())
    tables = []
    for name, matrix in sorted(matrices.items()):
        rows, replica = np.nonzero(matrix >= 0)
        tables.append(pa.table([pa.array(np.full(rows.size, name, dtype=object), pa.string()),
                                pa.array(rows.astype(np.int32)), pa.array(replica.astype(np.int32)),
                                node_ids.take(pa.array(matrix[rows, replica]))], schema=_ARROW_SCHEMA))
    return pa.concat_tables(tables) if tables else _ARROW_SCHEMA.empty_table()


def previous_placement(rows: pa.Table) -> PreviousPlacement:
    """Ideal-assignment rows (``group_name``, ``partition_id``, ``replica_index``, ``node_id``; any other columns
    ignored) as the placement the ``balanced`` affinity continues from."""
    if rows.num_rows == 0:
        return PreviousPlacement((), {})
    nodes = rows.column("node_id").combine_chunks().dictionary_encode()
    node_codes = nodes.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    groups = rows.column("group_name").combine_chunks().dictionary_encode()
    group_codes = groups.indices.to_numpy(zero_copy_only=False)
    pids = rows.column("partition_id").to_numpy()
    replicas = rows.column("replica_index").to_numpy()
    matrices = {}
    for code, name in enumerate(groups.dictionary.to_pylist()):
        mine = group_codes == code
        p, r = pids[mine], replicas[mine]
        matrix = np.full((int(p.max()) + 1, int(r.max()) + 1), -1, dtype=np.int32)
        matrix[p, r] = node_codes[mine]
        matrices[name] = matrix
    return PreviousPlacement(tuple(nodes.dictionary.to_pylist()), matrices)
