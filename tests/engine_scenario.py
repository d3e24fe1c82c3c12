"""One small story run on a chosen storage engine, its committed tables dumped as sorted rows (JSON): the
delta-spark engine runs it in a process of its own (its session needs the Delta jars from the start), the suite's
session runs it on delta-rs, and tests/test_delta_spark.py compares the two.

Run: ``python -m tests.engine_scenario ENGINE WAREHOUSE OUT.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rebalancer.config import Settings
from rebalancer.operations import generate_into
from rebalancer.pipeline import run_exchange
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


def run_story(spark: SparkSession, engine: str, warehouse: Path) -> dict[str, Any]:
    """Generate 4 nodes x 1 group x 16 partitions, exchange, fail node1, exchange; the committed rows."""
    settings = Settings().with_overrides(storage={"warehouse": str(warehouse), "engine": engine})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=4, groups=1, partitions=16, backups=1, seed=3)
    run_exchange(spark, wh, settings)
    append_event(spark, wh, "NODE_FAILED", node_id="node1")
    run_exchange(spark, wh, settings)
    out: dict[str, Any] = {"engine": wh.engine}
    for name, columns in COMPARED.items():
        df = wh.read(name)
        rows = df.select(*(columns or df.columns)).collect()
        out[name] = sorted((json.loads(json.dumps([v for v in r], default=str)) for r in rows), key=repr)
    return out


def main() -> None:
    engine, warehouse, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    from rebalancer.config import SparkSettings
    from rebalancer.session import get_spark

    spark = get_spark(SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g",
                                    app_name=f"engine-scenario-{engine}"), delta=engine == "delta-spark")
    target.write_text(json.dumps(run_story(spark, engine, warehouse)))
    spark.stop()


if __name__ == "__main__":
    main()
