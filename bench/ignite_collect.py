"""What one `rebalancer ignite collect` costs a cluster and the collector (docs/IGNITE.md, "Cost on a cluster").

    .venv/bin/python bench/ignite_collect.py [--partitions 1024 4096 16384] [--runs 5] [--out FILE]

Starts 3 Ignite 2.17.0 server nodes (tests/ignite/cluster.py: one JVM, loopback), one group of P partitions with one
backup and 10 keys per partition, and for each P measures, ``--runs`` times each:
- ``read``: :func:`rebalancer.ignite.read.read_cluster` alone (the SQL queries and the control utility's process):
  wall seconds, the thin-client queries it sent, and the bytes the control utility printed;
- ``collect``: a whole first collect into a new delta-rs warehouse, then a collect of the unchanged cluster.
Beside them, one ``rebalancer sql "SELECT 1"`` process on an empty warehouse times the machine (read the ratios).
Writes bench/results/ignite_collect.json (commit, load, parameters, every run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.repo import select_one_seconds  # noqa: E402
from rebalancer.config import Settings  # noqa: E402
from rebalancer.ignite import read as ignite_read  # noqa: E402
from rebalancer.ignite.collect import collect  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402
from rebalancer.storage import open_warehouse  # noqa: E402
from tests.ignite.cluster import IgniteCluster  # noqa: E402
from tests.ignite.live import control_prefix  # noqa: E402


class _Counted:
    """Counts the thin-client queries and the control utility's output bytes of one read."""

    def __init__(self) -> None:
        self.queries = 0
        self.control_bytes = 0
        self._query, self._control = ignite_read._query, ignite_read.run_control

    def __enter__(self) -> _Counted:
        def query(client: Any, sql: str) -> list[dict[str, Any]]:
            self.queries += 1
            return self._query(client, sql)

        def control(*args: Any, **kwargs: Any) -> str:
            out = self._control(*args, **kwargs)
            self.control_bytes += len(out.encode())
            return out

        ignite_read._query, ignite_read.run_control = query, control  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        ignite_read._query, ignite_read.run_control = self._query, self._control  # type: ignore[assignment]


def one_size(partitions: int, runs: int, spark: Any, work: Path) -> dict[str, Any]:
    with IgniteCluster(work / "ignite") as cluster:
        for n in ("n1", "n2", "n3"):
            cluster.step({"op": "start", "node": n})
        cluster.step({"op": "start_cache", "name": "orders", "partitions": partitions, "backups": 1})
        cluster.step({"op": "put", "cache": "orders", "keys": partitions * 10}, timeout_s=600)
        host, port = cluster.host_port()
        control = control_prefix(cluster)
        reads = []
        for _ in range(runs):
            with _Counted() as counted:
                started = time.monotonic()
                snapshot = ignite_read.read_cluster(host, port, control=control, timeout_s=60)
                reads.append({"seconds": round(time.monotonic() - started, 2), "queries": counted.queries,
                              "control_bytes": counted.control_bytes, "copies": len(snapshot.copies)})
        collects = []
        for k in range(runs):
            settings = Settings().with_overrides(storage={"warehouse": str(work / f"w{k}"), "engine": "delta-rs"},
                                                 ignite={"host": host, "port": port, "control": control})
            warehouse = open_warehouse(spark, settings.storage)
            started = time.monotonic()
            first = collect(warehouse, settings.ignite)
            middle = time.monotonic()
            again = collect(warehouse, settings.ignite)
            collects.append({"first_s": round(middle - started, 2), "unchanged_s": round(time.monotonic() - middle, 2),
                             "rows": first.appended, "unchanged_rows": again.appended})
    return {"partitions": partitions, "copies": partitions * 2, "read": reads, "collect": collects}


def median(rows: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ignite_collect.json")
    args = parser.parse_args()
    started, load_start = time.time(), os.getloadavg()
    select_one = select_one_seconds()
    from rebalancer.config import SparkSettings

    spark = get_spark(SparkSettings(master="local[2]"))
    sizes = []
    try:
        for p in args.partitions:
            with tempfile.TemporaryDirectory(prefix=f"ignite-collect-{p}-") as tmp:
                print(f"{p} partitions ...", flush=True)
                sizes.append(one_size(p, args.runs, spark, Path(tmp)))
    finally:
        spark.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "commit": commit.stdout.strip(),
              "command": " ".join([".venv/bin/python", "bench/ignite_collect.py", *sys.argv[1:]]),
              "cpus": os.cpu_count(), "load_at_start": [round(x, 2) for x in load_start],
              "load_at_end": [round(x, 2) for x in os.getloadavg()], "select_1_s": select_one, "sizes": sizes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| partitions (copies) | queries | control utility output | read, median s "
          "| first collect, median s | unchanged collect, median s |")
    print("|---|---|---|---|---|---|")
    for s in sizes:
        read_s = median(s["read"], "seconds")
        print(f"| {s['partitions']:,} ({s['copies']:,}) | {s['read'][0]['queries']} | "
              f"{s['read'][0]['control_bytes'] / 1e6:.2f} MB | {read_s} | "
              f"{median(s['collect'], 'first_s')} | {median(s['collect'], 'unchanged_s')} |")
    print(f"commit {result['commit']}, load {result['load_at_start']} -> {result['load_at_end']}, "
          f"`rebalancer sql \"SELECT 1\"` {select_one} s; written to {args.out}")


if __name__ == "__main__":
    main()
