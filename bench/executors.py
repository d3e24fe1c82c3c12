"""Benchmark: one failure's exchange with every stage on its Spark path, on 1 and 2 executors (docs/SCALING.md).

Above the driver-path sizes (``rebalancer/stages/paths.py``: 5,000,000 replicas) an exchange runs its kernel, its
scope and its selections as Spark jobs. This measures that path on a real multi-process Spark here: the same
warehouse (the suite's L cluster by default: 100 nodes x 64 groups x 1,024 partitions, 2 backups; generated and
first exchanged by the CLI on the driver path, untimed), then ``--runs`` times: restore it, a node fails, and
``run_exchange`` with every driver-path threshold at 0 (as tests/cluster_story.py does), timed with its stage
seconds and Spark jobs. Each master runs in a process of its own (a fresh JVM, its session warmed by one untimed
run): ``local[2]`` for reference, then ``local-cluster[E,1,2048]`` for each ``--executors`` E (a standalone master
and E executor JVMs of one core each). delta-rs.

Writes ``--out`` (default ``bench/results/executors.json``) and prints a Markdown table. From the repository root::

    .venv/bin/python bench/executors.py                    # L, 1 and 2 executors, 3 runs each
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.repo import git  # noqa: E402

REBALANCER = str(Path(sys.executable).with_name("rebalancer"))
CONF = REPO / "bench" / "conf" / "delta-rs.toml"
SPARK_PATHS = ("DRIVER_RANKINGS", "KEYS_AS_LITERALS")  # and storage.driver_replicas = 0


def worker(master: str, pristine: Path, runs: int, out: Path, node: str) -> None:
    """In a fresh process: one untimed run to warm the session, then ``runs`` timed failure exchanges."""
    from rebalancer.config import Settings, SparkSettings
    from rebalancer.pipeline import run_exchange
    from rebalancer.producers import append_event
    from rebalancer.session import get_spark
    from rebalancer.stages import paths
    from rebalancer.storage import open_warehouse

    for name in SPARK_PATHS:
        setattr(paths, name, 0)
    spark = get_spark(SparkSettings(master=master, app_name="bench-executors"))
    results = []
    try:
        for i in range(runs + 1):
            warehouse = pristine.parent / f"run-{i}"
            shutil.rmtree(warehouse, ignore_errors=True)
            shutil.copytree(pristine, warehouse)
            settings = Settings().with_overrides(storage={"warehouse": str(warehouse), "engine": "delta-rs",
                                                          "driver_replicas": 0})
            wh = open_warehouse(spark, settings.storage)
            append_event(spark, wh, "NODE_FAILED", node_id=node)
            t0 = time.perf_counter()
            [summary] = run_exchange(spark, wh, settings)
            seconds = time.perf_counter() - t0
            if i > 0:  # the first run warms the session
                results.append({"seconds": round(seconds, 2), "spark_jobs": summary.spark_jobs,
                                "stages": {k: round(v, 2) for k, v in summary.stage_seconds.items()},
                                "migrations": summary.migrations})
            shutil.rmtree(warehouse)
    finally:
        spark.stop()
    out.write_text(json.dumps({"master": master, "runs": results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=1024, help="per group")
    parser.add_argument("--backups", type=int, default=2)
    parser.add_argument("--node", default=None, help="the node that fails (default: node<nodes/2>)")
    parser.add_argument("--executors", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "executors.json")
    parser.add_argument("--worker", nargs=3, metavar=("MASTER", "PRISTINE", "OUT"), default=None)
    args = parser.parse_args()
    node = args.node or f"node{args.nodes // 2}"
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]), args.runs, Path(args.worker[2]), node)
        return
    masters = ["local[2]", *(f"local-cluster[{int(e)},1,2048]" for e in args.executors.split(","))]
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "commit": git("rev-parse", "--short", "HEAD"),
        "cluster": f"{args.nodes} nodes x {args.groups} groups x {args.partitions} partitions, {args.backups} backups",
        "cores": os.cpu_count(), "masters": [],
    }
    with tempfile.TemporaryDirectory(prefix="rebalancer-executors-") as tmp:
        pristine = Path(tmp) / "pristine"
        base = [REBALANCER, "--conf", str(CONF), "--warehouse", str(pristine)]
        subprocess.run([*base, "generate", "--nodes", str(args.nodes), "--groups", str(args.groups), "--partitions",
                        str(args.partitions), "--backups", str(args.backups), "--seed", "20261121"], check=True,
                       capture_output=True)
        subprocess.run([*base, "exchange"], check=True, capture_output=True)
        for master in masters:
            out = Path(tmp) / "out.json"
            print(f"{master} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--node", node, "--worker", master,
                            str(pristine), str(out)], check=True, cwd=REPO)
            results["masters"].append(json.loads(out.read_text()))
    args.out.write_text(json.dumps(results, indent=1))
    stages = list(results["masters"][0]["runs"][0]["stages"])
    print(f"{results['cluster']}, {node} fails, every stage on its Spark path; {results['date']} at "
          f"`{results['commit']}`, {results['cores']} cores. Median of {args.runs} runs, seconds.\n")
    print("| master | exchange | " + " | ".join(stages) + " | Spark jobs |")
    print("|---" * (len(stages) + 3) + "|")
    for m in results["masters"]:
        med = statistics.median(r["seconds"] for r in m["runs"])
        per_stage = [statistics.median(r["stages"].get(s, 0.0) for r in m["runs"]) for s in stages]
        print(f"| `{m['master']}` | {med:.1f} | " + " | ".join(f"{v:.1f}" for v in per_stage)
              + f" | {m['runs'][0]['spark_jobs']} |")


if __name__ == "__main__":
    main()
