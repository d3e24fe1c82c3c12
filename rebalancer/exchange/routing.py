"""Client routing (Ignite IEP-23 "partition awareness"): the late assignment folded into shared client mappings.

Stage contract (:func:`client_affinity`, pure DataFrame -> DataFrame, no I/O, no collect):

- Input ``assignment_df``: the LATE assignment of one version, i.e. who really serves traffic
  (``group_name, partition_id, replica_index, node_id, is_temporary``; extra columns such as the version are
  ignored). Replica 0 is the primary, temporary or not; a partition's node list is its rows ordered by
  ``replica_index`` (ties by ``node_id``). Rows with a null in any of those key columns are ignored.
- Input ``groups_df``: ``cache_groups`` rows (SPEC section 2); only ``group_name``, ``partitions``, ``affinity``
  and ``partitioner`` are read. Only groups present in both inputs are routed.
- A group's *mapping* is (``partitions``, resolved ``partitioner``, the ordered node list of every partition).
  The partitioner resolves per SPEC: null means ``ignite`` for the ``ignite`` affinity, else ``murmur3``.
- Groups with identical mappings share one ``mapping_id``; ``group_names`` is sorted ascending.
- ``mapping_id`` is dense and deterministic: 0 for the mapping holding the alphabetically smallest group name,
  1 for the next, ... ordered by each mapping's smallest group name. The same input always gives the same ids.
- Output: one row per (mapping, partition present in the assignment) with schema :data:`CLIENT_AFFINITY_STAGE`
  (the ``client_affinity`` table without the version columns, which the exchange job adds).

Folding is exact and needs no ``collect()`` (details and measurements: docs/ROUTING.md): a per-group fingerprint from
declarative aggregates (row count + a 64-bit multiset hash of the rows) proposes classes of equal groups; every
class with more than one member is then checked row by row (each ``(partition, replica, node)`` must occur in all
members), and a class that fails the check (a hash collision) is split into one mapping per group, so a collision
can cost folding but never a wrong route. Node lists are aggregated only from each mapping's lead group.

Export (:func:`export_rows_to_json`, pure Python): the committed ``client_affinity`` rows of one version plus the
``cache_groups`` rows become the ``rebalancer-routing-v1`` JSON document (docs/ROUTING.md) that
:class:`rebalancer.client.routing.RoutingMap` and clients in other languages read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from rebalancer.affinity.partitioners import PARTITIONERS
from rebalancer.client.routing import ROUTING_FORMAT
from rebalancer.tables import CLIENT_AFFINITY, VERSION_COLUMNS

__all__ = [
    "CLIENT_AFFINITY_STAGE",
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


def resolve_partitioner(partitioner: str | None, affinity: str | None) -> str:
    """A group's key partitioner with the SPEC default applied (pure-Python twin of :func:`resolved_partitioner_col`).

    Args:
        partitioner: ``cache_groups.partitioner`` (``murmur3`` | ``ignite`` | ``hazelcast`` | None, any case).
        affinity: ``cache_groups.affinity`` (``rendezvous`` | ``ignite`` | None, any case).

    Returns:
        The lower-case partitioner name: ``partitioner`` when set, else ``ignite`` for the ``ignite`` affinity,
        else ``murmur3``.
    """
    if partitioner is not None:
        return partitioner.strip().lower()
    if affinity is not None and affinity.strip().lower() == "ignite":
        return "ignite"
    return "murmur3"


def resolved_partitioner_col(partitioner: str = "partitioner", affinity: str = "affinity") -> Column:
    """``Column`` form of :func:`resolve_partitioner` over columns ``partitioner`` and ``affinity``."""
    return F.coalesce(
        F.lower(F.trim(F.col(partitioner))),
        F.when(F.lower(F.trim(F.col(affinity))) == "ignite", F.lit("ignite")).otherwise(F.lit("murmur3")),
    )


def client_affinity(assignment_df: DataFrame, groups_df: DataFrame) -> DataFrame:
    """Fold the late assignment into client mappings shared by groups with identical routing.

    Reads ``assignment_df`` three times (fingerprint, verification, output rows): pass a materialised frame
    (a persisted DataFrame or the written ``affinity_assignment`` version), not an expensive lazy plan.

    Args:
        assignment_df: the late assignment (``group_name, partition_id, replica_index, node_id, is_temporary``),
            replica 0 = the node that really serves as primary; ``(group_name, partition_id, replica_index)``
            is unique, as the late-affinity stage produces it.
        groups_df: ``cache_groups`` rows (``group_name``, ``partitions``, ``affinity``, ``partitioner`` are read).

    Returns:
        A DataFrame with schema :data:`CLIENT_AFFINITY_STAGE`, one row per routed mapping and partition:
        ``primary_node`` = replica 0, ``backup_nodes`` = the other replicas in ``replica_index`` order.
    """
    rows_df = assignment_df.where(
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
    settings_df = groups_df.select(
        "group_name",
        F.col("partitions").cast("int").alias("partitions"),
        resolved_partitioner_col().alias("partitioner"),
    )

    # 1. fingerprint per group (declarative aggregates only): row count + a 64-bit multiset hash of its rows,
    #    summed as two 32-bit halves so the sums cannot overflow.
    row_hash = F.xxhash64("partition_id", "replica_index", "node_id")
    fingerprint_df = (
        rows_df.groupBy("group_name")
        .agg(
            F.count(F.lit(1)).alias("fp_rows"),
            F.sum(row_hash.bitwiseAND(F.lit(0xFFFFFFFF))).alias("fp_lo"),
            F.sum(F.shiftrightunsigned(row_hash, 32)).alias("fp_hi"),
        )
        .join(F.broadcast(settings_df), "group_name", "inner")
    )
    # 2. candidate classes: equal settings and fingerprint; the class is named by its smallest group ("lead")
    class_keys = ["partitions", "partitioner", "fp_rows", "fp_lo", "fp_hi"]
    candidate_df = fingerprint_df.join(
        F.broadcast(
            fingerprint_df.groupBy(*class_keys).agg(
                F.min("group_name").alias("lead"), F.count(F.lit(1)).alias("members")
            )
        ),
        class_keys,
    ).select("group_name", "lead", "members")
    # 3. exact check of every class with more than one group: with (partition, replica) unique per group, the
    #    groups are identical iff every (partition, replica, node) of the class occurs in all its members.
    shared_df = candidate_df.where(F.col("members") > 1)
    mismatched_df = (
        rows_df.join(F.broadcast(shared_df), "group_name")
        .groupBy("lead", "partition_id", "replica_index", "node_id")
        .agg(F.count(F.lit(1)).alias("occurrences"), F.first("members").alias("members"))
        .where(F.col("occurrences") != F.col("members"))
        .select("lead")
        .distinct()
        .withColumn("mismatch", F.lit(True))
    )
    # a class that fails the check (a hash collision) is split into one mapping per group: never a wrong route
    member_df = candidate_df.join(F.broadcast(mismatched_df), "lead", "left").select(
        "group_name",
        F.when(F.col("mismatch"), F.col("group_name")).otherwise(F.col("lead")).alias("lead"),
    )
    # 4. one mapping per class; dense ids ordered by the smallest group name
    mapping_df = (
        member_df.groupBy("lead")
        .agg(F.sort_array(F.collect_list("group_name")).alias("group_names"))
        .withColumn("mapping_id", (F.row_number().over(Window.partitionBy(F.lit(0)).orderBy("lead")) - 1).cast("int"))
        .withColumnRenamed("lead", "group_name")
    )
    # 5. rows of each mapping's lead group only: node lists ordered by replica_index (ties by node_id)
    return (
        rows_df.join(F.broadcast(mapping_df), "group_name")
        .groupBy("mapping_id", "partition_id")
        .agg(
            F.first("group_names").alias("group_names"),
            F.sort_array(F.collect_list(F.struct("replica_index", "node_id"))).alias("replicas"),
        )
        .select(
            "mapping_id",
            "group_names",
            "partition_id",
            F.col("replicas")[0]["node_id"].alias("primary_node"),
            F.slice(F.col("replicas.node_id"), 2, F.greatest(F.size("replicas") - 1, F.lit(0))).alias("backup_nodes"),
        )
        .to(CLIENT_AFFINITY_STAGE)
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
        groups: ``cache_groups`` rows (``group_name``, ``partitions``, ``affinity``, ``partitioner``);
            groups that no row mentions are ignored.
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
