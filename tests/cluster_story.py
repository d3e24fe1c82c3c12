"""A story run on a chosen Spark master and storage engine with every stage on its Spark path, its committed
tables and its what-if rows dumped as sorted rows (JSON): tests/test_spark_cluster.py runs it on a real multi-process
Spark (``local-cluster``: a standalone master and executor JVMs) and on ``local[2]``, and compares the two.

Run: ``python -m tests.cluster_story MASTER ENGINE WAREHOUSE OUT.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rebalancer.config import Settings, SparkSettings
from rebalancer.operations import generate_into
from rebalancer.pipeline import run_exchange
from rebalancer.producers import append_event
from rebalancer.session import get_spark
from rebalancer.stages import paths
from rebalancer.storage import open_warehouse
from rebalancer.what_if import what_if
from tests.engine_scenario import committed_rows

# Every limit at 0 (storage.driver_replicas and stages/paths.py): generate, the validation, the kernel, the scope
# and the selections run as Spark jobs, so on a cluster their work runs in the executors, as it does above the
# driver-path sizes.
SPARK_PATHS = ("DRIVER_RANKINGS", "KEYS_AS_LITERALS")
# what_if columns that depend on the run, not on the cluster.
WHAT_IF_PER_RUN = ("run_id", "created_at")


def run(spark: Any, engine: str, warehouse: Path) -> dict[str, Any]:
    """Generate 6 nodes x 2 groups x 64 partitions (1 backup), exchange; node1 fails, exchange; node6 joins,
    exchange; then what-if over every single node failure. The committed rows and the what-if rows."""
    for name in SPARK_PATHS:
        setattr(paths, name, 0)
    settings = Settings().with_overrides(storage={"warehouse": str(warehouse), "engine": engine,
                                                  "driver_replicas": 0})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=6, groups=2, partitions=64, backups=1, seed=5)
    summaries = [*run_exchange(spark, wh, settings)]
    append_event(spark, wh, "NODE_FAILED", node_id="node1")
    summaries += run_exchange(spark, wh, settings)
    append_event(spark, wh, "NODE_JOINED", node_id="node6", host="host-node6", zone="zone0")
    summaries += run_exchange(spark, wh, settings)
    sweep = what_if(spark, wh, settings, sweeps=["nodes"])
    rows = sweep.rows.drop_columns(list(WHAT_IF_PER_RUN)).to_pylist()
    return {
        "engine": wh.engine,
        "summaries": [[s.exchange_type, s.migrations, s.lost_partitions] for s in summaries],
        **committed_rows(wh),
        "what_if": sorted(json.loads(json.dumps(rows, default=str)), key=repr),
    }


def main() -> None:
    master, engine, warehouse, target = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    spark = get_spark(SparkSettings(master=master, shuffle_partitions=2, driver_memory="1g",
                                    app_name=f"cluster-story-{engine}"), delta=engine == "delta-spark")
    try:
        target.write_text(json.dumps(run(spark, engine, warehouse)))
    finally:
        spark.stop()  # on a cluster: executors stopped before the application exits, no error at shutdown


if __name__ == "__main__":
    main()
