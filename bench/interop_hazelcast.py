"""Benchmark: real Hazelcast 5.x runs its parallel-migrations benchmark's membership changes at 20,000 partitions.

Ten members in one JVM on loopback (tests/interop/harness.py), 1 backup: 10 -> 9 graceful shutdown, 9 -> 10 join,
a crash. Hazelcast's migrations are counted by kind and by whether they move data; rebalancer's exchange kernel
plans the same change from Hazelcast's layout before it (to Hazelcast's layout after it, and to rendezvous), and
both plans are scheduled under rebalancer's cost model (tests/interop/hazelcast_compare.py). Writes
``bench/results/interop_hazelcast.json`` and prints the docs/INTEROP.md table.

Run from the repository root: ``.venv/bin/python bench/interop_hazelcast.py [--partitions N]`` (needs java, mvn).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

from tests.interop import harness  # noqa: E402
from tests.interop.hazelcast_compare import benchmark_script, compare, markdown  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=20_000)
    parser.add_argument("--heap", default="3g", help="the Hazelcast JVM's -Xmx")
    args = parser.parse_args()
    reason = harness.missing_tools()
    if reason:
        sys.exit(reason)
    script = benchmark_script(args.partitions)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = harness.run_hazelcast(script, Path(tmp), heap=args.heap, timeout_s=3600)
    hazelcast_s = time.perf_counter() - t0
    run["backups"] = script["backups"]
    t1 = time.perf_counter()
    rows = compare(run)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit.strip() or None,
              "load_average_1m_at_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
              "hazelcast_version": run["hazelcast_version"], "partitions": args.partitions,
              "hazelcast_run_s": round(hazelcast_s, 1), "planning_s": round(time.perf_counter() - t1, 1),
              "rows": rows}
    out = REPO / "bench" / "results" / "interop_hazelcast.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(rows))
    print(f"Hazelcast {run['hazelcast_version']}: JVM run {hazelcast_s:.0f} s, our planning {result['planning_s']} s")


if __name__ == "__main__":
    main()
