"""Benchmark: the ideal assignment stage (Spark, mapInArrow + NumPy) beside the same kernel on one core.

Cases (partitions x nodes, 2 backups, every node on its own host, no constraints): 1,024 x 16, 65,536 x 100 and
262,144 x 1,000 (four groups of 65,536: a group has at most 65,536 partitions). For each case and affinity:
one warm-up run, then the median of 3 timed runs of

- ``spark``: ``ideal_assignment(...)`` plus a ``noop`` write that materialises every output row, in one warm
  ``local[*]`` session (includes collecting the two dimension tables, as the stage does);
- ``kernel``: the NumPy kernel for the same partitions in this process, single-threaded, no Spark.

Prints a Markdown table and writes ``bench/results/affinity.json``. Run from the repository root:
``.venv/bin/python bench/affinity.py`` (add ``--quick`` for the two small cases only, ``--tiny`` for the smallest,
one timed run each: a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
try:  # running from a checkout without `pip install -e .`: make the package importable here and in the workers
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import numpy as np  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402

from rebalancer.affinity.assign import assign_indexes  # noqa: E402
from rebalancer.affinity.ideal import ideal_assignment  # noqa: E402
from rebalancer.affinity.nodeset import NodeSet  # noqa: E402
from rebalancer.config import AffinitySettings, SparkSettings  # noqa: E402
from rebalancer.groups import GroupSettings  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402
from rebalancer.tables import CACHE_GROUPS, NODES  # noqa: E402

CASES = [(1_024, 16), (65_536, 100), (262_144, 1_000)]
BACKUPS = 2
RUNS = 3
MAX_GROUP = 65_536


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    """Wall-clock seconds of ``runs`` calls after one untimed warm-up call."""
    fn()
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def group_sizes(partitions: int) -> list[int]:
    return [min(MAX_GROUP, partitions - start) for start in range(0, partitions, MAX_GROUP)]


def run_spark(nodes_df: DataFrame, groups_df: DataFrame, settings: AffinitySettings) -> None:
    """The stage, fully materialised (every output row is produced and converted), nothing written."""
    ideal_assignment(nodes_df, groups_df, settings).write.format("noop").mode("overwrite").save()


def run_kernel(node_set: NodeSet, sizes: list[int], affinity: str) -> None:
    """The same kernel call the stage makes, for every group, in this process."""
    for size in sizes:
        assign_indexes(np.arange(size), node_set, GroupSettings(f"g{size}", size, BACKUPS, affinity=affinity))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the two small cases")
    parser.add_argument("--tiny", action="store_true", help="only the smallest case, one timed run (a smoke test)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "affinity.json")
    args = parser.parse_args()
    cases = CASES[:1] if args.tiny else CASES[:2] if args.quick else CASES
    runs = 1 if args.tiny else RUNS

    spark = get_spark(SparkSettings(master="local[*]", app_name="rebalancer-bench-affinity"))
    settings = AffinitySettings()
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    for partitions, n in cases:
        node_rows = [(f"node{i}", f"00000000-0000-0000-0000-{i:012x}", i, f"host{i}", None, None, False)
                     for i in range(n)]
        nodes_df = spark.createDataFrame(node_rows, NODES)
        node_set = NodeSet.from_rows([dict(zip(NODES.fieldNames(), r, strict=True)) for r in node_rows])
        for affinity in ("rendezvous", "ignite"):
            sizes = group_sizes(partitions)
            groups_df = spark.createDataFrame(
                [(f"g{i}", size, BACKUPS, None, affinity, None, None, None, None, None)
                 for i, size in enumerate(sizes)],
                CACHE_GROUPS,
            )

            spark_runs = timed(partial(run_spark, nodes_df, groups_df, settings), runs)
            kernel_runs = timed(partial(run_kernel, node_set, sizes, affinity), runs)
            results.append({
                "partitions": partitions,
                "nodes": n,
                "backups": BACKUPS,
                "affinity": affinity,
                "output_rows": partitions * (BACKUPS + 1),
                "spark_median_s": round(statistics.median(spark_runs), 3),
                "spark_runs_s": [round(t, 3) for t in spark_runs],
                "kernel_one_core_median_s": round(statistics.median(kernel_runs), 4),
                "kernel_runs_s": [round(t, 4) for t in kernel_runs],
            })
            print(f"done {partitions} x {n} {affinity}", file=sys.stderr, flush=True)
    report = {
        "command": " ".join([".venv/bin/python bench/affinity.py", *(["--tiny"] if args.tiny else []),
                             *(["--quick"] if args.quick else [])]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "numpy": np.__version__,
            "spark_master": spark.sparkContext.master,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"| partitions x nodes | affinity | Spark stage, local[*] (median of {runs}) "
          "| NumPy kernel, 1 core, no Spark |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['partitions']:,} x {r['nodes']:,} | {r['affinity']} | {r['spark_median_s']:.2f} s "
              f"| {r['kernel_one_core_median_s']:.4f} s |")
    print(f"load average before/after: {report['machine']['load_average_before']} / "
          f"{report['machine']['load_average_after']}; written to {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
