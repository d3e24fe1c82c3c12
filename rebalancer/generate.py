"""Synthetic steady clusters: the input tables of a cluster where every ideal replica is OWNING.

``generate_cluster`` is a pure function of its arguments and seed: the same call gives the same rows, byte for
byte. Nodes, groups and events are small (built on the driver as Arrow: ``GeneratedCluster.dimensions``). The
partition reports, up to millions of rows, are built on the driver too where the warehouse reads there and the
cluster is within its ``driver_replicas`` (``rebalancer.operations.generate_into`` decides), and written from there;
beyond, Spark builds them from the ideal assignment stage and writes them. Both ways give the same rows.

Shape of a generated cluster (the defaults in ``conf/default.toml`` ``[generate]``):
- nodes ``node0 .. node{N-1}``, join order 1..N, ``nodes_per_host`` servers per host ``host{k}``, attributes
  ``zone`` (round robin over ``zones``) and ``rack``, capacity 1.0, a deterministic ``node_uuid``;
- groups ``group0 .. group{G-1}``: PARTITIONED, rendezvous affinity (or the one asked for), READ_WRITE_SAFE, persistent;
- one NODE_JOINED event per node, in join order;
- one OWNING report per ideal replica. A partition's copies agree on ``update_counter``, ``size`` and ``bytes``
  (they are consistent replicas); sizes vary per partition uniformly within +-50% of the mean; the counter is the
  size plus up to 25% overwrites; the WAL keeps the last 20% of the counter's history. ``report_seq`` is 1.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer.affinity.ideal import ideal_assignment_arrow, ideal_assignment_of
from rebalancer.config import AffinitySettings, GenerateSettings
from rebalancer.hashing import spark_xxhash64, spark_xxhash64_ints
from rebalancer.tables import CACHE_GROUPS, INPUT_TABLES, NODES, PARTITION_REPORTS, TOPOLOGY_EVENTS
from rebalancer.vocabulary import AFFINITIES

__all__ = ["GeneratedCluster", "generate_cluster"]

# Events of a generated cluster start here (a fixed instant keeps the output deterministic).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class GeneratedCluster:
    """The four input tables of a steady cluster, with SPEC section 2 schemas."""

    #: ``nodes``, ``cache_groups`` and ``topology_events``, built on the driver as Arrow.
    dimensions: dict[str, pa.Table]
    #: Arrow when built on the driver (``on_driver``), else Spark's frame: the same rows.
    partition_reports: pa.Table | DataFrame

    def as_tables(self, spark: SparkSession) -> dict[str, DataFrame]:
        """The four tables as DataFrames of their declared schemas."""
        reports = self.partition_reports
        return {
            **{name: spark.createDataFrame(table, INPUT_TABLES[name]) for name, table in self.dimensions.items()},
            "partition_reports": spark.createDataFrame(reports, PARTITION_REPORTS) if isinstance(reports, pa.Table)
            else reports,
        }


#: :func:`_unit_interval`'s values are multiples of 1 / this.
_UNIT_STEPS = 1_000_003


def _unit_interval(seed: int, salt: str) -> Column:
    """A deterministic uniform value in [0, 1) per (group, partition), independent for each ``salt``."""
    h = F.xxhash64(F.lit(seed), F.lit(salt), F.col("group_name"), F.col("partition_id"))
    return F.pmod(h, F.lit(_UNIT_STEPS)).cast("double") / F.lit(float(_UNIT_STEPS))


def generate_cluster(
    spark: SparkSession,
    nodes: int,
    groups: int,
    partitions: int,
    backups: int,
    seed: int,
    settings: GenerateSettings | None = None,
    affinity: AffinitySettings | None = None,
    *,
    affinity_function: str = "rendezvous",
    on_driver: bool = False,
) -> GeneratedCluster:
    """Build a steady cluster.

    Args:
        spark: the session that builds the DataFrames.
        nodes: server nodes (>= 1).
        groups: cache groups (>= 1).
        partitions: partitions per group (1..65536).
        backups: backups per partition (>= 0; replicas are min(backups + 1, nodes)).
        seed: everything random derives from it.
        settings: sizes, zones and hosts; defaults as in ``conf/default.toml``.
        affinity: settings of the ideal assignment stage.
        affinity_function: every group's ``cache_groups.affinity`` (``rendezvous``, ``ignite`` or ``balanced``).
        on_driver: build the reports on the driver, with NumPy (the same rows: the ranking's functions, Spark's
            xxhash64 reimplemented in :mod:`rebalancer.hashing`), else in Spark (a ``mapInArrow`` ranking pass and
            SQL expressions).

    Returns:
        The input tables. Nothing is written; see ``rebalancer.storage`` for that.

    Raises:
        ValueError: a count is out of range (the message names it).
    """
    settings = settings or GenerateSettings()
    affinity = affinity or AffinitySettings()
    if nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {nodes}")
    if groups < 1:
        raise ValueError(f"--groups must be at least 1, got {groups}")
    if not 1 <= partitions <= 65536:
        raise ValueError(f"--partitions must be between 1 and 65536, got {partitions}")
    if backups < 0:
        raise ValueError(f"--backups must be 0 or more, got {backups}")
    if affinity_function not in AFFINITIES:
        raise ValueError(f"--affinity must be one of {', '.join(AFFINITIES)}, got {affinity_function!r}")

    rng = random.Random(seed)
    node_rows = [
        (
            f"node{i}",
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            i + 1,
            f"host{i // settings.nodes_per_host}",
            {"zone": f"zone{i % settings.zones}", "rack": f"rack{(i // settings.zones) % 8}"},
            1.0,
            False,
        )
        for i in range(nodes)
    ]
    group_rows = [
        (f"group{g}", partitions, backups, "PARTITIONED", affinity_function, False, None, "READ_WRITE_SAFE", True,
         None)
        for g in range(groups)
    ]
    event_rows = [
        (i + 1, "NODE_JOINED", f"node{i}", None, EPOCH + timedelta(seconds=i)) for i in range(nodes)
    ]
    dimensions = {name: _arrow(rows, schema) for name, rows, schema in (
        ("nodes", node_rows, NODES), ("cache_groups", group_rows, CACHE_GROUPS),
        ("topology_events", event_rows, TOPOLOGY_EVENTS))}
    node_list, group_list = dimensions["nodes"].to_pylist(), dimensions["cache_groups"].to_pylist()
    mean_entries = settings.avg_partition_bytes // settings.avg_entry_bytes
    if on_driver:
        ranked = ideal_assignment_arrow(node_list, group_list, affinity)
        return GeneratedCluster(dimensions, _reports_arrow(ranked, seed, mean_entries, settings.avg_entry_bytes))
    # The same arithmetic as _reports_arrow, in Spark SQL.
    size = F.floor(F.lit(mean_entries) * (F.lit(0.5) + _unit_interval(seed, "size"))).cast("long")
    counter = (F.col("size") + F.floor(F.col("size") * F.lit(0.25) * _unit_interval(seed, "counter"))).cast("long")
    reports_df = (
        # ranked over the rows built here: no Spark job to collect them back
        ideal_assignment_of(spark, node_list, group_list, affinity)
        .withColumn("state", F.lit("OWNING"))
        .withColumn("size", size)
        .withColumn("update_counter", counter)
        .withColumn("bytes", F.col("size") * F.lit(settings.avg_entry_bytes))
        .withColumn("wal_history_counter", F.floor(F.col("update_counter") * F.lit(0.8)).cast("long"))
        .withColumn("report_seq", F.lit(1).cast("long"))
        .select(*[F.col(f.name).cast(f.dataType) for f in PARTITION_REPORTS.fields])
    )
    return GeneratedCluster(dimensions, reports_df)


def _unit_interval_arrow(seed: int, salt: str, groups: pa.DictionaryArray, pids: npt.NDArray[np.int64]
                         ) -> npt.NDArray[np.float64]:
    """:func:`_unit_interval` on the driver: Spark's xxhash64 of the literals and the group once per group name,
    of each partition id in NumPy."""
    per_group = np.array([spark_xxhash64([seed, salt, g]) for g in groups.dictionary.to_pylist()], dtype=np.int64)
    h = spark_xxhash64_ints(pids, per_group[np.asarray(groups.indices, dtype=np.int64)])
    return np.mod(h, _UNIT_STEPS).astype(np.float64) / float(_UNIT_STEPS)


def _reports_arrow(ranked: pa.Table, seed: int, mean_entries: int, entry_bytes: int) -> pa.Table:
    """The OWNING report of every ranked replica, built on the driver: the rows the Spark path builds."""
    groups = ranked.column("group_name")
    coded = groups.combine_chunks().dictionary_encode()
    pids = np.asarray(ranked.column("partition_id"), dtype=np.int64)
    size = np.floor(mean_entries * (0.5 + _unit_interval_arrow(seed, "size", coded, pids))).astype(np.int64)
    counter = size + np.floor(size * 0.25 * _unit_interval_arrow(seed, "counter", coded, pids)).astype(np.int64)
    n = ranked.num_rows
    return pa.table({
        "node_id": ranked.column("node_id"),
        "group_name": groups,
        "partition_id": ranked.column("partition_id"),
        "state": pa.array(np.full(n, "OWNING", dtype=object), pa.string()),
        "update_counter": counter,
        "size": size,
        "bytes": size * entry_bytes,
        "wal_history_counter": np.floor(counter * 0.8).astype(np.int64),
        "report_seq": np.ones(n, np.int64),
    }).select(PARTITION_REPORTS.fieldNames()).cast(to_arrow_schema(PARTITION_REPORTS, timezone="UTC"))


def _arrow(rows: list[tuple[Any, ...]], schema: StructType) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.fieldNames(), row, strict=True)) for row in rows],
                                schema=to_arrow_schema(schema, timezone="UTC"))
