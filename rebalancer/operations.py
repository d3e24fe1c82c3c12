"""The engine's operations on a warehouse, shared by the CLI and the spark-submit jobs.

Each operation takes a SparkSession, an open :class:`~rebalancer.storage.Warehouse` and explicit arguments, and
returns plain data the caller may print. Printing, argument parsing and session creation live in the callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer.config import Settings
from rebalancer.generate import GeneratedCluster, generate_cluster
from rebalancer.inputs import latest_version as latest_committed_version
from rebalancer.inputs import local_verdict
from rebalancer.pipeline import VERSIONED_TABLES
from rebalancer.producers import AppendedEvent, EventError, append_event, check_event
from rebalancer.stages.meter import Meter
from rebalancer.storage import Warehouse
from rebalancer.tables import INPUT_TABLES, OUTPUT_TABLES, SCHEMAS
from rebalancer.validation import validate_inputs
from rebalancer.validation_local import bad_reports, spec_typed

__all__ = [
    "AppendedEvent",
    "EventError",
    "append_event",
    "check_event",
    "export_affinity",
    "latest_committed_version",
    "generate_into",
    "load_generated_cluster",
    "validate_warehouse",
    "VacuumResult",
    "vacuum_warehouse",
]

def load_generated_cluster(
    spark: SparkSession, warehouse: Warehouse, cluster: GeneratedCluster, rows_hint: int | None = None
) -> dict[str, int]:
    """Replace the warehouse's contents with a generated cluster.

    Input tables are overwritten with the cluster; output tables are emptied (a new cluster has no exchange
    history). Delta keeps the previous contents as older table versions. The tables are written by one
    :meth:`~rebalancer.storage.Warehouse.replace_where_many` (commits that may run at once): from the driver when
    the cluster was built there (its reports are Arrow), else by Spark and counted by one Spark job. ``rows_hint``:
    about how many rows the cluster holds (the engine picks its write path by size).

    Returns:
        Rows written per input table.
    """
    created = set(warehouse.create_tables())
    # A table created just now is already empty: spare it a commit.
    emptied_names = [name for name in OUTPUT_TABLES if name not in created]
    if isinstance(cluster.partition_reports, pa.Table):  # built on the driver: written from there, no Spark job
        arrow = {**cluster.dimensions, "partition_reports": cluster.partition_reports}
        emptied_arrow = {name: to_arrow_schema(OUTPUT_TABLES[name], timezone="UTC").empty_table()
                         for name in emptied_names}
        warehouse.replace_where_many({**emptied_arrow, **arrow}, {}, rows_hint=rows_hint)
        return {name: table.num_rows for name, table in arrow.items()}
    emptied = {name: spark.createDataFrame([], OUTPUT_TABLES[name]) for name in emptied_names}
    inputs = cluster.as_tables(spark)
    warehouse.replace_where_many({**emptied, **inputs}, {}, rows_hint=rows_hint)
    return _row_counts(warehouse, list(inputs))


def _writes_on_driver(warehouse: Warehouse, rows: int) -> bool:
    """Whether a generated cluster of about ``rows`` rows is built and written on the driver."""
    return warehouse.reads_on_driver and rows <= warehouse.driver_replicas


def _row_counts(warehouse: Warehouse, names: list[str]) -> dict[str, int]:
    """Rows per table, all counted in one Spark job."""
    labelled = [warehouse.read(name).select(F.lit(name).alias("table")) for name in names]
    rows = reduce(DataFrame.unionByName, labelled).groupBy("table").count().collect()
    counted = {r["table"]: r["count"] for r in rows}
    return {name: int(counted.get(name, 0)) for name in names}


def generate_into(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    nodes: int,
    groups: int,
    partitions: int,
    backups: int,
    seed: int,
    affinity_function: str = "rendezvous",
) -> dict[str, int]:
    """Generate a steady cluster (see :mod:`rebalancer.generate`) and load it into ``warehouse`` (its Spark jobs
    are labelled ``rebalancer generate: cluster`` and ``rebalancer generate: load``)."""
    meter = Meter(spark, "generate")
    rows = groups * partitions * (backups + 1) + nodes  # one partition report per replica, and the nodes
    try:
        with meter.stage("cluster"):
            cluster = generate_cluster(
                spark, nodes, groups, partitions, backups, seed, settings.generate, settings.affinity,
                affinity_function=affinity_function, on_driver=_writes_on_driver(warehouse, rows),
            )
        with meter.stage("load"):
            return load_generated_cluster(spark, warehouse, cluster, rows_hint=rows)
    finally:
        meter.close()


def validate_warehouse(warehouse: Warehouse, exchange_id: int | None = None, strict: bool = False) -> int:
    """Validate the input tables; append bad rows to ``rejected_rows``.

    Where the warehouse reads on the driver and the driver's verdicts (:mod:`rebalancer.validation_local`) find no
    bad row, nothing is judged in Spark (the demo's 3,072 copies: 17 s of Spark's validator on delta-spark); any bad
    row sends every table to Spark's validator, which writes the reasons.

    Returns:
        How many rows this validation rejected (each appended to ``rejected_rows`` with its reason).
    """
    if warehouse.reads_on_driver and _valid_on_driver(warehouse):
        return 0  # no Spark job: a first one costs a new process about a second
    raw = {name: warehouse.read_raw(name) for name in INPUT_TABLES}
    validated = validate_inputs(raw, exchange_id=exchange_id, strict=strict)
    rejected = validated.rejected.select(*[f.name for f in SCHEMAS["rejected_rows"].fields]).cache()
    count = rejected.count()
    if count:
        warehouse.append("rejected_rows", rejected)
    rejected.unpersist()
    return int(count)


def _valid_on_driver(warehouse: Warehouse) -> bool:
    """Whether every row of the input tables is valid by the driver's verdicts (tables of the SPEC types only)."""
    reports = warehouse.read_arrow("partition_reports")
    references = local_verdict({name: warehouse.read_arrow(name) for name in ("cache_groups", "nodes",
                                                                              "topology_events")})
    return references is not None and spec_typed("partition_reports", reports) and not bad_reports(
        reports, None, references).any()


def export_affinity(warehouse: Warehouse, version: tuple[int, int] | None = None) -> dict[str, object]:
    """The ``rebalancer-routing-v1`` routing document of a committed version (default: the latest).

    Raises:
        LookupError: no exchange has been committed yet, or the version given was never committed.
    """
    from rebalancer.exchange.routing import export_rows_to_json

    latest = latest_committed_version(warehouse)
    if latest is None:
        raise LookupError("no exchange has been committed yet; run `rebalancer exchange` first")
    major, minor = version or latest
    committed = warehouse.read("exchanges").where(
        (F.col("topology_major") == major) & (F.col("topology_minor") == minor)
    )
    if committed.limit(1).count() == 0:
        raise LookupError(f"version {major}.{minor} was never committed; the latest is {latest[0]}.{latest[1]}")
    rows = (
        warehouse.read("client_affinity")
        .where((F.col("topology_major") == major) & (F.col("topology_minor") == minor))
        .collect()
    )
    groups = warehouse.read("cache_groups").select("group_name", "partitions", "affinity", "partitioner").collect()
    return export_rows_to_json(rows, groups, (major, minor))


@dataclass(frozen=True)
class VacuumResult:
    """What ``rebalancer vacuum`` did.

    Attributes:
        kept: the committed versions whose rows stay, oldest first.
        removed: how many older committed versions lost their rows.
        files_deleted: data files Delta VACUUM deleted.
        bytes_before / bytes_after: data bytes of the versioned tables on disk (None for catalog tables).
    """

    kept: list[tuple[int, int]]
    removed: int
    files_deleted: int
    bytes_before: int | None
    bytes_after: int | None


def vacuum_warehouse(warehouse: Warehouse, keep_versions: int, retain_hours: int = 168) -> VacuumResult:
    """Keep the rows of the newest ``keep_versions`` committed versions in the versioned tables, delete the older
    ones, and run Delta VACUUM on those tables (docs/STORAGE.md "Retention").

    What the next exchange reads is never touched: it starts from the newest version (always kept), and it reads
    the input tables at the Delta versions the newest exchange recorded, so the input tables are not vacuumed.
    ``exchanges`` keeps every row (the history). Rows of a version newer than the newest committed one (a crashed
    run's partial writes, which its re-run replaces) are kept.

    Args:
        warehouse: the warehouse.
        keep_versions: committed versions to keep, at least 1.
        retain_hours: Delta VACUUM's retention: files a table version of the last ``retain_hours`` hours still
            references stay (readers of those versions, time travel). 0 reclaims the space at once; only safe
            when nothing else reads or writes the warehouse meanwhile.

    Raises:
        ValueError: ``keep_versions`` below 1, or ``retain_hours`` negative.
    """
    if keep_versions < 1:
        raise ValueError(f"--keep-versions must be at least 1 (the newest version is what the next exchange starts "
                         f"from), got {keep_versions}")
    if retain_hours < 0:
        raise ValueError(f"--retain-hours must be 0 or more, got {retain_hours}")
    rows = warehouse.read_arrow("exchanges").to_pylist() if warehouse.exists("exchanges") else []
    versions = [(int(r["topology_major"]), int(r["topology_minor"]))
                for r in sorted(rows, key=lambda r: r["exchange_id"])]
    names = [n for n in VERSIONED_TABLES if warehouse.exists(n)]
    before = _data_bytes(warehouse, names)
    kept = versions[-keep_versions:]
    removed = len(versions) - len(kept)
    older = None
    if removed:
        major, minor = kept[0]
        older = f"topology_major < {major} OR (topology_major = {major} AND topology_minor < {minor})"
    files = warehouse.apply_retention(names, older, retain_hours)  # up to storage.concurrent_commits at once
    return VacuumResult(kept, removed, files, before, _data_bytes(warehouse, names))


def _data_bytes(warehouse: Warehouse, names: list[str]) -> int | None:
    """Bytes of the data files under the tables' directories (None when a table is not a local directory)."""
    total = 0
    for name in names:
        root = Path(warehouse.path_of(name))
        if not root.is_dir():
            return None
        total += sum(f.stat().st_size for f in root.rglob("*.parquet") if "_delta_log" not in f.parts)
    return total
