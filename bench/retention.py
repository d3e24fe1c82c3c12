"""Benchmark: bytes each topology version adds to the warehouse, and what ``rebalancer vacuum`` frees.

Setup: ``generate`` (default 10 nodes, 4 groups x 1,024 partitions, 2 backups: 12,288 replicas) and the first
exchange, then ``--changes`` exchanges alternating a failure and the same node's return (``node{N-1}``), each
followed by nothing else (the plan is not carried out: every version is a complete copy of the versioned tables).
Measured after each exchange: bytes of the data files of the versioned tables (``pipeline.VERSIONED_TABLES``) on
disk, per table. Then ``vacuum --keep-versions 1 --retain-hours 0``: its seconds and the bytes before and after.

Writes ``--out`` (default ``bench/results/retention.json``) and the section ``bench/results/retention-section.md``
that ``bench/suite.py`` puts on docs/BENCHMARKS.md. From the repository root: ``.venv/bin/python bench/retention.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the bench package (bench/repo.py), and rebalancer from a checkout not installed
from bench.repo import git  # noqa: E402
from rebalancer.config import Settings  # noqa: E402
from rebalancer.operations import generate_into, vacuum_warehouse  # noqa: E402
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange  # noqa: E402
from rebalancer.producers import append_event  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402
from rebalancer.storage import open_warehouse  # noqa: E402


def table_bytes(root: Path) -> dict[str, int]:
    return {name: sum(f.stat().st_size for f in (root / name).rglob("*.parquet") if "_delta_log" not in f.parts)
            for name in VERSIONED_TABLES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=1_024)
    parser.add_argument("--backups", type=int, default=2)
    parser.add_argument("--changes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "retention.json")
    parser.add_argument("--section", type=Path, default=REPO / "bench" / "results" / "retention-section.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    try:
        root = work / "w"
        settings = Settings().with_overrides(storage={"warehouse": str(root), "engine": "delta-rs"})
        spark = get_spark(settings.spark)
        wh = open_warehouse(spark, settings.storage)
        generate_into(spark, wh, settings, args.nodes, args.groups, args.partitions, args.backups, seed=11)
        versions = []
        [first] = run_exchange(spark, wh, settings)
        versions.append({"version": [first.topology_major, first.topology_minor], "bytes": table_bytes(root)})
        node = f"node{args.nodes - 1}"
        for i in range(args.changes):
            append_event(spark, wh, "NODE_FAILED" if i % 2 == 0 else "NODE_JOINED", node_id=node)
            [s] = run_exchange(spark, wh, settings)
            versions.append({"version": [s.topology_major, s.topology_minor], "bytes": table_bytes(root)})
        t0 = time.perf_counter()
        result = vacuum_warehouse(wh, keep_versions=1, retain_hours=0)
        seconds = time.perf_counter() - t0
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    replicas = args.groups * args.partitions * (args.backups + 1)
    totals = [sum(v["bytes"].values()) for v in versions]
    added = [b - a for a, b in zip(totals, totals[1:], strict=False)]
    out = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "cluster": {"nodes": args.nodes, "groups": args.groups, "partitions_per_group": args.partitions,
                    "backups": args.backups, "replicas": replicas},
        "versions": versions, "bytes_added_per_version": added,
        "vacuum": {"seconds": round(seconds, 2), "bytes_before": result.bytes_before,
                   "bytes_after": result.bytes_after, "files_deleted": result.files_deleted,
                   "removed_versions": result.removed},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    args.section.write_text(section(out))
    print(section(out))


def section(r: dict[str, Any]) -> str:
    c, v = r["cluster"], r["vacuum"]
    per_version = sorted(r["bytes_added_per_version"])
    median = per_version[len(per_version) // 2] if per_version else 0
    last = r["versions"][-1]["bytes"]
    rows = "\n".join(f"| {name} | {last[name] / 2**20:,.2f} |" for name in sorted(last, key=lambda n: -last[n]))
    return "\n".join([
        "## Retention: bytes per version (`bench/retention.py`)",
        "",
        f"Measured by `.venv/bin/python bench/retention.py` at {r['measured_at']}, commit `{r['commit']}`"
        f"{' with uncommitted changes' if r['dirty'] else ''}, delta-rs engine: {c['nodes']} nodes, {c['groups']} x "
        f"{c['partitions_per_group']:,} partitions, {c['backups']} backups ({c['replicas']:,} replicas), the first "
        f"exchange and {len(per_version)} more (a failure and the node's return, alternating).",
        "",
        f"Every committed version is a complete copy of the versioned tables: **{median / 2**20:,.2f} MiB per "
        f"version** (median of {len(per_version)}; {median / c['replicas']:,.0f} bytes per replica). After "
        f"{len(r['versions'])} versions the data files hold {sum(last.values()) / 2**20:,.2f} MiB; `vacuum "
        f"--keep-versions 1 --retain-hours 0` removed the rows of {v['removed_versions']} versions and "
        f"{v['files_deleted']} files in {v['seconds']} s, leaving {v['bytes_after'] / 2**20:,.2f} MiB. Size "
        "retention as versions kept x bytes per replica x replicas (plus the input tables, which are not vacuumed).",
        "",
        "| table (after all versions) | MiB |",
        "|---|---|",
        rows,
    ]) + "\n"


if __name__ == "__main__":
    main()
