"""One small story run on a chosen storage engine, its committed tables dumped as sorted rows (JSON): the
delta-spark engine runs it in a process of its own (its session needs the Delta jars from the start), the suite's
session runs it on delta-rs, and tests/test_delta_spark.py compares the two.

Run: ``python -m tests.engine_scenario ENGINE WAREHOUSE OUT.json [vacuum]`` (``vacuum``: the story, then
:func:`run_vacuum` on a copy, and nothing else).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rebalancer.config import Settings
from rebalancer.operations import generate_into, vacuum_warehouse
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange
from rebalancer.producers import append_event
from rebalancer.storage import open_warehouse

# The tables an exchange commits whose rows do not depend on the clock or on the engine's file layout.
COMPARED = {
    "ideal_assignment": None,
    "affinity_assignment": None,
    "partition_map": None,
    "lost_partitions": None,
    "migration_plan": ["topology_major", "topology_minor", "migration_id", "group_name", "partition_id", "step",
                       "action", "source_node", "target_node", "rebalance_mode", "bytes", "wave"],
    "exchanges": ["exchange_id", "topology_major", "topology_minor", "exchange_type", "lost_partitions",
                  "migrations", "makespan_s"],
}


def run_story(spark: SparkSession, engine: str, warehouse: Path, catalog_prefix: str = "") -> dict[str, Any]:
    """Generate 4 nodes x 1 group x 16 partitions, exchange, fail node1, exchange; the committed rows.
    ``catalog_prefix``: the tables are catalog tables ``<prefix>.<name>`` (delta-spark) instead of paths."""
    wh = run_steps(spark, warehouse, [(engine, None), (engine, "NODE_FAILED")], catalog_prefix)
    return {"engine": wh.engine, **committed_rows(wh)}


def run_across(spark: SparkSession, engines: list[str], warehouse: Path) -> dict[str, Any]:
    """The story and one more exchange (node1 joins again), exchange ``i`` on ``engines[i]`` (generate on the
    first): the committed rows of one warehouse that crossed engines."""
    events = [None, "NODE_FAILED", "NODE_JOINED"]
    return committed_rows(run_steps(spark, warehouse, list(zip(engines, events, strict=True))))


def run_steps(
    spark: SparkSession, warehouse: Path, steps: list[tuple[str, str | None]], catalog_prefix: str = ""
) -> Any:
    """Generate 4 nodes x 1 group x 16 partitions with the first step's engine, then per step (engine, event):
    node1's event if any, and an exchange on that engine. Returns the warehouse as the last step opened it."""
    wh: Any = None
    for i, (engine, event) in enumerate(steps):
        if wh is None or wh.engine != engine:
            settings = Settings().with_overrides(storage={"warehouse": str(warehouse), "engine": engine,
                                                          "catalog_prefix": catalog_prefix})
            wh = open_warehouse(spark, settings.storage)
            assert wh.engine == engine
        if i == 0:
            generate_into(spark, wh, settings, nodes=4, groups=1, partitions=16, backups=1, seed=3)
        if event:
            append_event(spark, wh, event, node_id="node1")
        run_exchange(spark, wh, settings)
    return wh


def committed_rows(wh: Any) -> dict[str, Any]:
    """The rows of :data:`COMPARED`, sorted, as JSON values."""
    out: dict[str, Any] = {}
    for name, columns in COMPARED.items():
        df = wh.read(name)
        rows = df.select(*(columns or df.columns)).collect()
        out[name] = sorted((json.loads(json.dumps([v for v in r], default=str)) for r in rows), key=repr)
    return out


def run_vacuum(spark: SparkSession, engine: str, warehouse: Path) -> dict[str, Any]:
    """On a copy of the story's warehouse: ``vacuum --keep-versions 1 --retain-hours 0``, what is left, and the rows
    the next exchange (node1 joins again) commits."""
    copy = warehouse.parent / f"{warehouse.name}-vacuumed"
    shutil.copytree(warehouse, copy)
    settings = Settings().with_overrides(storage={"warehouse": str(copy), "engine": engine})
    wh = open_warehouse(spark, settings.storage)
    result = vacuum_warehouse(wh, keep_versions=1, retain_hours=0)
    left = sorted({(r[0], r[1]) for name in VERSIONED_TABLES
                   for r in wh.read(name).select("topology_major", "topology_minor").distinct().collect()})
    append_event(spark, wh, "NODE_JOINED", node_id="node1")
    [summary] = run_exchange(spark, wh, settings)
    where = f"topology_major = {summary.topology_major} AND topology_minor = {summary.topology_minor}"
    nxt = {}
    for name, columns in COMPARED.items():
        if name == "exchanges":
            continue
        df = wh.read(name).where(where)
        rows = df.select(*(columns or df.columns)).collect()
        nxt[name] = sorted((json.loads(json.dumps([v for v in r], default=str)) for r in rows), key=repr)
    return {"kept": [list(v) for v in result.kept], "versions_left": [list(v) for v in left],
            "files_deleted": result.files_deleted, "next": nxt}


REPO = Path(__file__).resolve().parent.parent
DELTA_SPARK_ONLY = "-- delta-spark only"
DOC_TIMESTAMP = "'2026-01-01 12:00:00'"  # the placeholder of docs/QUERIES.md's TIMESTAMP AS OF block


def delta_spark_blocks() -> list[str]:
    """The ``-- delta-spark only`` SQL blocks of docs/QUERIES.md, in order."""
    text = (REPO / "docs" / "QUERIES.md").read_text()
    return [b.strip() for b in re.findall(r"```sql\n(.*?)```", text, flags=re.S) if b.startswith(DELTA_SPARK_ONLY)]


def run_queries(spark: SparkSession, engine: str, warehouse: Path) -> dict[str, Any]:
    """Every delta-spark-only block of docs/QUERIES.md on the story's warehouse, by table name as a session opened
    by the library sees it (the timestamp placeholder replaced by migration_plan's newest commit time)."""
    copy = warehouse.parent / f"{warehouse.name}-queries"  # RESTORE writes: keep the story's warehouse as it is
    shutil.copytree(warehouse, copy)
    settings = Settings().with_overrides(storage={"warehouse": str(copy), "engine": engine})
    wh = open_warehouse(spark, settings.storage)
    wh.register_views()
    newest = spark.sql("DESCRIBE HISTORY migration_plan").agg({"timestamp": "max"}).collect()[0][0]
    plan_at_0 = spark.sql("SELECT count(*) FROM migration_plan VERSION AS OF 0").collect()[0][0]
    plan_before = spark.sql("SELECT count(*) FROM migration_plan").collect()[0][0]
    results = []
    for block in delta_spark_blocks():
        sql = block.replace(DOC_TIMESTAMP, f"'{newest:%Y-%m-%d %H:%M:%S.%f}'")
        rows = spark.sql(sql).collect()
        results.append({"sql": sql, "rows": json.loads(json.dumps([list(r) for r in rows], default=str))})
    return {"results": results, "plan_at_0": plan_at_0, "plan_before": plan_before,
            "plan_after_restore": spark.sql("SELECT count(*) FROM migration_plan").collect()[0][0],
            "plan_read_after_restore": wh.read("migration_plan").count(),
            "reports_now": spark.sql("SELECT count(*) FROM partition_reports").collect()[0][0],
            "reports_at_1": spark.sql("SELECT count(*) FROM partition_reports VERSION AS OF 1").collect()[0][0]}


def run_race(spark: SparkSession, engine: str, warehouse: Path) -> dict[str, Any]:
    """Two exchanges of one pending event race on a copy of the story's warehouse, both holding their computed
    version until the other has too: what each ended with, and the committed exchanges."""
    import threading

    copy = warehouse.parent / f"{warehouse.name}-race"
    shutil.copytree(warehouse, copy)
    settings = Settings().with_overrides(storage={"warehouse": str(copy), "engine": engine})
    append_event(spark, open_warehouse(spark, settings.storage), "NODE_JOINED", node_id="node1")
    both_computed = threading.Barrier(2, timeout=600)

    def hold(point: str) -> None:
        if point == "after:client_affinity":  # the last output: both runs hold the same version, uncommitted
            both_computed.wait()

    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            summaries = run_exchange(spark, open_warehouse(spark, settings.storage), settings, fault_hook=hold)
            outcomes[name] = {"committed": [[s.topology_major, s.topology_minor] for s in summaries]}
        except Exception as exc:  # noqa: BLE001 - the test inspects what each run ended with
            outcomes[name] = {"error": type(exc).__name__, "message": str(exc)}

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exchanges = open_warehouse(spark, settings.storage).read("exchanges").collect()
    return {"outcomes": sorted(outcomes.values(), key=lambda o: "error" in o),
            "exchanges": sorted([r.exchange_id, r.topology_major, r.topology_minor] for r in exchanges)}


CATALOG_PREFIX = "spark_catalog.rebalancer"  # a schema of the session catalog, as catalog.schema under Unity Catalog


def run_catalog_story(spark: SparkSession) -> dict[str, Any]:
    """The story with ``storage.catalog_prefix``: tables created, written and read by name in a schema of the
    session catalog; then read and time travelled by their full names."""
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {CATALOG_PREFIX}")
    out = run_story(spark, "delta-spark", Path("unused"), CATALOG_PREFIX)
    names = {r.tableName for r in spark.sql(f"SHOW TABLES IN {CATALOG_PREFIX}").collect()}
    out["tables"] = sorted(names)
    out["history"] = spark.sql(f"DESCRIBE HISTORY {CATALOG_PREFIX}.exchanges").count()
    count = "SELECT count(*) FROM {}.exchanges {}"
    out["exchanges_at_1"] = spark.sql(count.format(CATALOG_PREFIX, "VERSION AS OF 1")).collect()[0][0]
    out["exchanges_now"] = spark.sql(count.format(CATALOG_PREFIX, "")).collect()[0][0]
    return out


def main() -> None:
    engine, warehouse, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    from rebalancer.config import SparkSettings
    from rebalancer.session import get_spark

    spark = get_spark(SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g",
                                    app_name=f"engine-scenario-{engine}"),
                      {"spark.sql.warehouse.dir": str(warehouse.parent / "catalog")}, delta=engine == "delta-spark")
    out = run_story(spark, engine, warehouse)
    if sys.argv[4:] == ["vacuum"]:  # the slow vacuum story (tests/test_delta_spark.py, `make storage-slow`)
        out["vacuum"] = run_vacuum(spark, engine, warehouse)
    elif engine == "delta-spark":
        out["queries"] = run_queries(spark, engine, warehouse)
        out["race"] = run_race(spark, engine, warehouse)
        out["catalog"] = run_catalog_story(spark)
    target.write_text(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main()
