"""Install-time warm-up: record the JVM classes a rebalancer session loads, so that later sessions start faster.

``make install`` runs ``python -m rebalancer.warmup`` once. It starts a local session whose JVM writes a
class-data-sharing archive when it exits (``-XX:ArchiveClassesAtExit``, :data:`rebalancer.session.CLASS_ARCHIVE`),
and runs what a user runs first: generate a small cluster, two exchanges (its first version and a failure), a SQL
query, on delta-rs and, when the install fetched Delta's jars, on delta-spark. Every later session rebalancer builds
maps that archive instead of loading and verifying the classes again (docs/PERFORMANCE.md has the measurements).
Nothing here changes results; without the archive sessions just start slower. (The scheduler's loop for plans of
20,000 steps or more is compiled by ``make compiled``, which the benchmarks run first: minutes once, then cached by
numba; without it the first large plan compiles it.)
"""

from __future__ import annotations

import sys
import tempfile
import time

from rebalancer import delta_jars
from rebalancer.config import DELTA_RS, DELTA_SPARK, Settings, SparkSettings
from rebalancer.operations import generate_into
from rebalancer.pipeline import run_exchange
from rebalancer.producers import append_event
from rebalancer.session import CLASS_ARCHIVE, get_spark, java_options
from rebalancer.storage import open_warehouse

__all__ = ["main"]


def main() -> None:
    """Build :data:`~rebalancer.session.CLASS_ARCHIVE` (replacing an older one)."""
    started = time.perf_counter()
    CLASS_ARCHIVE.unlink(missing_ok=True)
    # With the Delta jars when the install fetched them: they are added to Spark's own class loader, not to the
    # JVM's class path, so the archive serves sessions with and without them; Delta's classes are not archived,
    # the Spark classes its commits and reads use are.
    spark = get_spark(
        SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g", app_name="rebalancer-warmup"),
        extra_conf={"spark.driver.extraJavaOptions": java_options("make")},
        delta=True,
    )
    engines = [DELTA_RS, *([DELTA_SPARK] if delta_jars.jars() else [])]
    for engine in engines:
        with tempfile.TemporaryDirectory(prefix="rebalancer-warmup-") as directory:
            settings = Settings().with_overrides(storage={"warehouse": directory, "engine": engine})
            warehouse = open_warehouse(spark, settings.storage)
            generate_into(spark, warehouse, settings, nodes=4, groups=1, partitions=16, backups=1, seed=0)
            run_exchange(spark, warehouse, settings)
            append_event(spark, warehouse, "NODE_FAILED", node_id="node1")
            run_exchange(spark, warehouse, settings)
            warehouse.register_views()
            spark.sql("SELECT count(*) FROM partition_map").collect()
    spark.stop()
    print(f"rebalancer: session warm-up ({', '.join(engines)}) done in {time.perf_counter() - started:.0f} s; the JVM "
          f"records its classes "
          f"in {CLASS_ARCHIVE} as it exits", file=sys.stderr)  # (after this process ends)


if __name__ == "__main__":
    main()
