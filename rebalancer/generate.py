"""Synthetic steady clusters: the input tables of a cluster where every ideal replica is OWNING.

``generate_cluster`` is a pure function of its arguments and seed: the same call gives the same rows, byte for
byte. Nodes, groups and events are small (built on the driver, also as Arrow: ``GeneratedCluster.dimensions``);
the partition reports, up to millions of rows, are built by Spark from the ideal assignment stage.
``rebalancer.operations.load_generated_cluster`` collects them once to write from the driver where the warehouse
reads there and the cluster is within the warehouse's ``driver_replicas``; beyond, Spark writes them.

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

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from rebalancer.affinity.ideal import IDEAL_ASSIGNMENT_STAGE, ideal_assignment_arrow, ideal_assignment_of
from rebalancer.config import AffinitySettings, GenerateSettings
from rebalancer.tables import CACHE_GROUPS, NODES, PARTITION_REPORTS, TOPOLOGY_EVENTS
from rebalancer.vocabulary import AFFINITIES

__all__ = ["GeneratedCluster", "generate_cluster"]

# Events of a generated cluster start here (a fixed instant keeps the output deterministic).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class GeneratedCluster:
    """The four input tables of a steady cluster, with SPEC section 2 schemas."""

    nodes: DataFrame
    cache_groups: DataFrame
    topology_events: DataFrame
    partition_reports: DataFrame
    #: ``nodes``, ``cache_groups`` and ``topology_events`` as built on the driver: the same rows, as Arrow.
    dimensions: dict[str, pa.Table]

    def as_tables(self) -> dict[str, DataFrame]:
        return {
            "nodes": self.nodes,
            "cache_groups": self.cache_groups,
            "topology_events": self.topology_events,
            "partition_reports": self.partition_reports,
        }


def _unit_interval(seed: int, salt: str) -> Column:
    """A deterministic uniform value in [0, 1) per (group, partition), independent for each ``salt``."""
    h = F.xxhash64(F.lit(seed), F.lit(salt), F.col("group_name"), F.col("partition_id"))
    return F.pmod(h, F.lit(1_000_003)).cast("double") / F.lit(1_000_003.0)


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
    rank_on_driver: bool = False,
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
        rank_on_driver: rank the partitions on the driver (the same rows; no Python workers for Spark to start,
            which cost a small cluster more than its ranking), else in a ``mapInArrow`` pass.

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
    nodes_df, groups_df, events_df = (spark.createDataFrame(rows, schema) for rows, schema in (
        (node_rows, NODES), (group_rows, CACHE_GROUPS), (event_rows, TOPOLOGY_EVENTS)))

    mean_entries = settings.avg_partition_bytes // settings.avg_entry_bytes
    size = F.floor(F.lit(mean_entries) * (F.lit(0.5) + _unit_interval(seed, "size"))).cast("long")
    counter = (F.col("size") + F.floor(F.col("size") * F.lit(0.25) * _unit_interval(seed, "counter"))).cast("long")
    node_list, group_list = dimensions["nodes"].to_pylist(), dimensions["cache_groups"].to_pylist()
    # ranked over the rows built here: no Spark job to collect them back
    ranked = spark.createDataFrame(ideal_assignment_arrow(node_list, group_list, affinity), IDEAL_ASSIGNMENT_STAGE) \
        if rank_on_driver else ideal_assignment_of(spark, node_list, group_list, affinity)
    reports_df = (
        ranked
        .withColumn("state", F.lit("OWNING"))
        .withColumn("size", size)
        .withColumn("update_counter", counter)
        .withColumn("bytes", F.col("size") * F.lit(settings.avg_entry_bytes))
        .withColumn("wal_history_counter", F.floor(F.col("update_counter") * F.lit(0.8)).cast("long"))
        .withColumn("report_seq", F.lit(1).cast("long"))
        .select(*[F.col(f.name).cast(f.dataType) for f in PARTITION_REPORTS.fields])
    )
    return GeneratedCluster(nodes_df, groups_df, events_df, reports_df, dimensions)


def _arrow(rows: list[tuple[Any, ...]], schema: StructType) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.fieldNames(), row, strict=True)) for row in rows],
                                schema=to_arrow_schema(schema, timezone="UTC"))
