"""Client routing (Ignite IEP-23 "partition awareness"): the late assignment folded into shared client mappings.

Three steps, two of them Spark (no I/O, no Python per row):

1. :func:`routing_digests` (one aggregate): per group of the LATE assignment (who really serves traffic; replica
   0 is the primary, temporary or not; rows with a null key are ignored), its row count and three independent
   64-bit multiset hashes of its ``(partition, replica, node)`` rows;
2. :func:`fold` (pure Python, one row per group): groups with equal partition count, resolved partitioner and
   digests share a mapping;
3. :func:`client_affinity`: each mapping's rows from its lead group's assignment (the only rows aggregated).

- A group's *mapping* is (``partitions``, resolved ``partitioner``, the ordered node list of every partition).
  The partitioner resolves per SPEC (:attr:`rebalancer.groups.GroupSettings.partitioner`): null means ``ignite``
  for the ``ignite`` affinity, else ``murmur3``.
- Groups with identical mappings share one ``mapping_id``; ``group_names`` is sorted ascending.
- ``mapping_id`` is dense and deterministic: 0 for the mapping holding the alphabetically smallest group name,
  1 for the next, ... ordered by each mapping's smallest group name. The same input always gives the same ids.
- Output: one row per (mapping, partition present in the assignment) with schema :data:`CLIENT_AFFINITY_STAGE`
  (the ``client_affinity`` table without the version columns, which the exchange job adds).

Folding by digest (docs/ROUTING.md): two groups with different rows fold only if their row counts and all three
64-bit multiset hashes collide at once. (The row-by-row check of every class that earlier versions ran cost a
shuffle of the whole assignment per exchange; three independent 64-bit sums make a false fold astronomically
unlikely instead.)

Export (:func:`export_rows_to_json`, pure Python): the committed ``client_affinity`` rows of one version plus the
``cache_groups`` rows become the ``rebalancer-routing-v1`` JSON document (docs/ROUTING.md) that
:class:`rebalancer.client.routing.RoutingMap` and clients in other languages read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from rebalancer.affinity.partitioners import PARTITIONERS
from rebalancer.client.routing import ROUTING_FORMAT
from rebalancer.groups import GroupSettings, resolve_partitioner
from rebalancer.tables import CLIENT_AFFINITY, VERSION_COLUMNS

__all__ = [
    "CLIENT_AFFINITY_STAGE",
    "client_affinity_arrow",
    "DIGEST_LANES",
    "ClientMapping",
    "fold",
    "routing_digests",
    "ROUTING_FORMAT",
    "RoutingExportError",
    "client_affinity",
    "export_rows_to_json",
    "resolve_partitioner",
    "resolved_partitioner_col",
]


#: ``client_affinity`` without ``topology_major`` / ``topology_minor``:
#: ``mapping_id int, group_names array<string>, partition_id int, primary_node string, backup_nodes array<string>``.
CLIENT_AFFINITY_STAGE = StructType([f for f in CLIENT_AFFINITY.fields if f.name not in VERSION_COLUMNS])


class RoutingExportError(ValueError):
    """The ``client_affinity`` / ``cache_groups`` rows cannot form a consistent routing document."""


def resolved_partitioner_col(partitioner: str = "partitioner", affinity: str = "affinity") -> Column:
    """``Column`` form of :func:`rebalancer.groups.resolve_partitioner` over columns ``partitioner`` and
    ``affinity``."""
    return F.coalesce(
        F.lower(F.trim(F.col(partitioner))),
        F.when(F.lower(F.trim(F.col(affinity))) == "ignite", F.lit("ignite")).otherwise(F.lit("murmur3")),
    )


#: Per group: its rows and three independent 64-bit multiset hashes of them (sums of per-row hashes, each split
#: into 32-bit halves so the sums cannot overflow).
DIGEST_LANES = ("rows", "xx_lo", "xx_hi", "xr_lo", "xr_hi", "mm_lo", "mm_hi")


def routing_digests(assignment_df: DataFrame) -> DataFrame:
    """Per group of the late assignment: row count and multiset hashes of its ``(partition, replica, node)`` rows.

    One aggregate (partial aggregation: no row is shuffled). Groups with equal digests, partition counts and
    partitioners route identically unless three independent 64-bit hash sums all collide (docs/ROUTING.md).

    Args:
        assignment_df: ``group_name, partition_id, replica_index, node_id`` rows (extra columns ignored).

    Returns:
        ``group_name`` and the :data:`DIGEST_LANES` columns, one row per group.
    """
    cols = ("partition_id", "replica_index", "node_id")
    lanes = {
        "xx": F.xxhash64(*cols),
        "xr": F.xxhash64(*reversed(cols)),
        "mm": F.hash(*cols).cast("long") * F.lit(2654435761) + F.hash(*reversed(cols)).cast("long"),
    }
    sums = [F.count(F.lit(1)).alias("rows")]
    for name, h in lanes.items():
        sums += [F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias(f"{name}_lo"),
                 F.sum(F.shiftrightunsigned(h, 32)).alias(f"{name}_hi")]
    return _clean(assignment_df).groupBy("group_name").agg(*sums)


@dataclass(frozen=True)
class ClientMapping:
    """One client mapping: the groups that route identically, named by the smallest (the lead)."""

    mapping_id: int
    group_names: tuple[str, ...]

    @property
    def lead(self) -> str:
        return self.group_names[0]


def fold(digests: Iterable[dict[str, Any]], groups: Iterable[GroupSettings]) -> list[ClientMapping]:
    """Groups with identical routing folded into mappings (pure Python over one row per group).

    Args:
        digests: :func:`routing_digests` rows.
        groups: the groups' settings (``name``, ``partitions``, ``partitioner`` are read); only groups present in
            both are routed.

    Returns:
        The mappings, ``mapping_id`` 0, 1, ... ordered by each mapping's smallest group name; ``group_names``
        sorted.
    """
    return _fold(((d["group_name"], tuple(int(d[lane]) for lane in DIGEST_LANES)) for d in digests), groups)


def _fold(digests: Iterable[tuple[str, tuple[Any, ...]]], groups: Iterable[GroupSettings]) -> list[ClientMapping]:
    """:func:`fold` over ``(group_name, digest)`` pairs, whatever the digest (a tuple compared for equality)."""
    settings = {g.name: (g.partitions, g.partitioner) for g in groups}
    classes: dict[tuple[Any, ...], list[str]] = {}
    for name, digest in digests:
        if name in settings:
            classes.setdefault((*settings[name], *digest), []).append(name)
    members = sorted(tuple(sorted(names)) for names in classes.values())
    return [ClientMapping(i, names) for i, names in enumerate(members)]


def client_affinity(assignment_df: DataFrame, mappings: Sequence[ClientMapping]) -> DataFrame:
    """The client mappings' rows: each mapping's partitions from its lead group's late assignment.

    Args:
        assignment_df: the late assignment (``group_name, partition_id, replica_index, node_id``), replica 0 the
            node that really serves as primary; ``(group_name, partition_id, replica_index)`` unique.
        mappings: :func:`fold`'s result.

    Returns:
        :data:`CLIENT_AFFINITY_STAGE` rows, one per mapping and assigned partition: ``primary_node`` replica 0,
        ``backup_nodes`` the other replicas in ``replica_index`` order (ties by node id).
    """
    leads = {m.lead: m for m in mappings}
    if not leads:
        return assignment_df.sparkSession.createDataFrame([], CLIENT_AFFINITY_STAGE)
    ids = F.create_map(*[x for m in mappings for x in (F.lit(m.lead), F.lit(m.mapping_id))])
    names = F.create_map(*[x for m in mappings for x in (F.lit(m.lead), F.array(*[F.lit(n) for n in m.group_names]))])
    return (
        _clean(assignment_df)
        .where(F.col("group_name").isin(sorted(leads)))
        .groupBy("group_name", "partition_id")
        .agg(F.sort_array(F.collect_list(F.struct("replica_index", "node_id"))).alias("replicas"))
        .select(
            F.element_at(ids, F.col("group_name")).cast("int").alias("mapping_id"),
            F.element_at(names, F.col("group_name")).alias("group_names"),
            "partition_id",
            F.col("replicas")[0]["node_id"].alias("primary_node"),
            F.slice(F.col("replicas.node_id"), 2, F.greatest(F.size("replicas") - 1, F.lit(0))).alias("backup_nodes"),
        )
        .to(CLIENT_AFFINITY_STAGE)
    )


def client_affinity_arrow(assignment: pa.Table, groups: Iterable[GroupSettings]) -> pa.Table:
    """:func:`fold` and :func:`client_affinity` over an Arrow assignment, on the driver (small exchanges).

    The same mappings and rows as the Spark path. Groups fold when their rows are equal, compared exactly (each
    group's rows sorted, node ids numbered over the whole assignment, the three columns hashed with BLAKE2b, 256
    bits) rather than by the Spark path's multiset sums; both fold exactly the groups with equal rows unless hashes
    collide.

    Args:
        assignment: the late assignment (``group_name, partition_id, replica_index, node_id``; extra columns
            ignored), ``(group_name, partition_id, replica_index)`` unique.
        groups: the groups' settings, as for :func:`fold`.

    Returns:
        :data:`CLIENT_AFFINITY_STAGE` rows as Arrow, ordered by mapping and partition.
    """
    schema = _arrow_stage_schema()
    complete = pc.and_(
        pc.and_(pc.is_valid(assignment.column("group_name")), pc.is_valid(assignment.column("partition_id"))),
        pc.and_(pc.is_valid(assignment.column("replica_index")), pc.is_valid(assignment.column("node_id"))),
    )
    rows = pa.table({
        "group_name": assignment.column("group_name"),
        "partition_id": assignment.column("partition_id").cast(pa.int32()),
        "replica_index": assignment.column("replica_index").cast(pa.int32()),
        "node_id": assignment.column("node_id"),
    }).filter(complete).sort_by([("group_name", "ascending"), ("partition_id", "ascending"),
                                 ("replica_index", "ascending"), ("node_id", "ascending")])
    group_names = rows.column("group_name").to_numpy(zero_copy_only=False).astype(object)
    nodes = np.asarray(pc.index_in(rows.column("node_id"), pc.unique(rows.column("node_id")).sort()),
                       dtype=np.int32)
    partition = np.asarray(rows.column("partition_id"), dtype=np.int32)
    replica = np.asarray(rows.column("replica_index"), dtype=np.int32)
    starts = np.flatnonzero(np.r_[True, group_names[1:] != group_names[:-1]]) if len(group_names) else np.array([], int)
    bounds = np.r_[starts, len(group_names)]
    digests = []
    for k, first in enumerate(starts):
        part = slice(first, bounds[k + 1])
        h = hashlib.blake2b(digest_size=32)
        for column in (partition[part], replica[part], nodes[part]):
            h.update(np.ascontiguousarray(column).tobytes())
        digests.append((str(group_names[first]), (int(bounds[k + 1] - first), h.digest())))
    mappings = _fold(digests, groups)
    if not mappings:
        return schema.empty_table()
    lead = {m.lead: m for m in mappings}
    ordered = sorted(lead)
    chosen = rows.filter(pc.is_in(rows.column("group_name"), pa.array(ordered, pa.string())))
    g = chosen.column("group_name").to_numpy(zero_copy_only=False).astype(object)
    p = np.asarray(chosen.column("partition_id"), dtype=np.int32)
    first = np.r_[True, (g[1:] != g[:-1]) | (p[1:] != p[:-1])] if len(g) else np.zeros(0, bool)
    heads = np.flatnonzero(first)
    node_ids = chosen.column("node_id").combine_chunks()
    backups = node_ids.filter(pa.array(~first))
    offsets = np.r_[heads - np.arange(len(heads)), len(backups)].astype(np.int32)
    which = pc.index_in(pa.array(g[heads], pa.string()), pa.array(ordered, pa.string()))
    ids = pa.array([lead[name].mapping_id for name in ordered], pa.int32())
    names = pa.array([list(lead[name].group_names) for name in ordered], pa.list_(pa.string()))
    out = pa.table({
        "mapping_id": pc.take(ids, which),
        "group_names": pc.take(names, which),
        "partition_id": pa.array(p[heads], pa.int32()),
        "primary_node": node_ids.take(pa.array(heads)),
        "backup_nodes": pa.ListArray.from_arrays(pa.array(offsets), backups),
    }).cast(schema)
    return out.sort_by([("mapping_id", "ascending"), ("partition_id", "ascending")])


def _arrow_stage_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(CLIENT_AFFINITY_STAGE, timezone="UTC")


def _clean(assignment_df: DataFrame) -> DataFrame:
    """The assignment's routing columns, without rows missing any of them."""
    return assignment_df.where(
        F.col("group_name").isNotNull()
        & F.col("partition_id").isNotNull()
        & F.col("replica_index").isNotNull()
        & F.col("node_id").isNotNull()
    ).select(
        "group_name",
        F.col("partition_id").cast("int").alias("partition_id"),
        F.col("replica_index").cast("int").alias("replica_index"),
        "node_id",
    )


def _field(row: Any, name: str) -> Any:
    """``row[name]`` for a pyspark ``Row``, a mapping or any object with the attribute."""
    if isinstance(row, Mapping):
        return row.get(name)
    try:
        return row[name]
    except (KeyError, TypeError, ValueError, IndexError):
        return getattr(row, name, None)


def export_rows_to_json(rows: Iterable[Any], groups: Iterable[Any], version: tuple[int, int]) -> dict[str, Any]:
    """Build the ``rebalancer-routing-v1`` document from one version's ``client_affinity`` rows.

    Pure function of plain rows (pyspark ``Row`` objects or dicts), so the CLI's ``export-affinity`` collects
    the two small inputs at the end of its job and calls this.

    Args:
        rows: ``client_affinity`` rows of ONE committed version (``mapping_id``, ``group_names``,
            ``partition_id``, ``primary_node``, ``backup_nodes``; version columns, if present, are ignored).
        groups: ``cache_groups`` rows as stored (``group_name``, ``partitions``, ``affinity``, ``partitioner``;
            pyspark ``Row`` objects or dicts, other columns not needed); groups that no row mentions are ignored.
        version: ``(topology_major, topology_minor)`` of the rows.

    Returns:
        ``{"format": "rebalancer-routing-v1", "topology_major", "topology_minor", "mappings": [...]}`` with
        mappings sorted by ``mapping_id``; each has ``mapping_id``, sorted ``group_names``, ``partitions``,
        ``partitioner`` and ``nodes`` (one ``[primary, backup...]`` list per partition id ``0..partitions-1``;
        a partition without a row gets ``[]``, i.e. no node serves it).

    Raises:
        RoutingExportError: a mapped group has no ``cache_groups`` row; the groups of one mapping disagree on
            partitions or partitioner; a partition id is out of range or repeated; a mapping id has
            inconsistent group lists; a group appears in two mappings; a partitioner is unknown.
    """
    settings: dict[str, tuple[int, str]] = {}
    for g in groups:
        name = _field(g, "group_name")
        if name is None:
            continue
        settings[str(name)] = (
            int(_field(g, "partitions")),
            resolve_partitioner(_field(g, "partitioner"), _field(g, "affinity")),
        )

    by_id: dict[int, tuple[tuple[str, ...], dict[int, list[str]]]] = {}
    for r in rows:
        mapping_id = int(_field(r, "mapping_id"))
        names = tuple(sorted(str(n) for n in (_field(r, "group_names") or [])))
        if not names:
            raise RoutingExportError(f"mapping {mapping_id}: a row has no group_names")
        known_names, parts = by_id.setdefault(mapping_id, (names, {}))
        if known_names != names:
            raise RoutingExportError(
                f"mapping {mapping_id}: rows disagree on group_names: {list(known_names)} vs {list(names)}"
            )
        partition_id = int(_field(r, "partition_id"))
        if partition_id in parts:
            raise RoutingExportError(f"mapping {mapping_id}: partition {partition_id} appears twice")
        primary = _field(r, "primary_node")
        backups = [str(n) for n in (_field(r, "backup_nodes") or []) if n is not None]
        parts[partition_id] = ([str(primary)] if primary is not None else []) + backups

    owner: dict[str, int] = {}
    mappings: list[dict[str, Any]] = []
    for mapping_id in sorted(by_id):
        names, parts = by_id[mapping_id]
        missing = [n for n in names if n not in settings]
        if missing:
            raise RoutingExportError(
                f"mapping {mapping_id}: groups {missing} have no cache_groups row; known groups: {sorted(settings)}"
            )
        resolved = {settings[n] for n in names}
        if len(resolved) != 1:
            detail = ", ".join(f"{n}: partitions={settings[n][0]} partitioner={settings[n][1]}" for n in names)
            raise RoutingExportError(f"mapping {mapping_id}: groups disagree on partitions/partitioner ({detail})")
        partitions, partitioner = resolved.pop()
        if partitioner not in PARTITIONERS or partitions < 1:
            raise RoutingExportError(
                f"mapping {mapping_id} ({list(names)}): partitions={partitions} partitioner={partitioner!r}; "
                f"expected partitions >= 1 and a partitioner in {list(PARTITIONERS)}"
            )
        bad = sorted(p for p in parts if not 0 <= p < partitions)
        if bad:
            raise RoutingExportError(
                f"mapping {mapping_id} ({list(names)}): partition ids {bad[:10]} outside 0..{partitions - 1}"
            )
        for n in names:
            if n in owner:
                raise RoutingExportError(f"group {n!r} is in mappings {owner[n]} and {mapping_id}")
            owner[n] = mapping_id
        mappings.append(
            {
                "mapping_id": mapping_id,
                "group_names": list(names),
                "partitions": partitions,
                "partitioner": partitioner,
                "nodes": [parts.get(p, []) for p in range(partitions)],
            }
        )
    major, minor = version
    return {
        "format": ROUTING_FORMAT,
        "topology_major": int(major),
        "topology_minor": int(minor),
        "mappings": mappings,
    }
