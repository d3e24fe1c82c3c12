"""Benchmark: ``rebalancer what-if`` sweeping every single server failure (and optionally every zone).

Setup (untimed): ``rebalancer generate`` and the first ``rebalancer exchange`` in subprocesses, as a user would
(default: the XL scenario of docs/BENCHMARKS.md, 1,000 nodes, 256 x 1,024 partitions, 2 backups: 786,432 replicas),
or ``--pristine DIR`` to reuse such a warehouse (it is copied, never written).

Timed: ``--runs`` runs of ``rebalancer.what_if.what_if`` in this process, in a Spark session started before the
first one (``sweeps=--sweep``, default ``nodes``), each on a fresh copy of the warehouse; the whole process
``rebalancer what-if`` once (``--cli-runs``), whose wall time includes starting Spark. Reported: wall seconds per
stage (``scenarios``: deciding every scenario's exchange on the driver; ``evaluate``: every scenario's figures, on
the driver or in one Spark pass; ``write``: the what_if commit), the Spark jobs, scenarios, recomputed partitions,
the worst scenario, and the load average while it ran.

Writes ``--out`` (default ``bench/results/what_if.json``), prints Markdown and writes it as the section
``bench/results/what-if-section.md`` that ``bench/suite.py`` puts on docs/BENCHMARKS.md (``--section``).
From the repository root::

    .venv/bin/python bench/what_if.py                                   # XL, about 10 minutes with the setup
    .venv/bin/python bench/what_if.py --nodes 20 --groups 4 --partitions 256 --backups 1   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
try:  # running from a checkout without `pip install -e .`
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

sys.path.insert(0, str(REPO))  # the bench package (bench/repo.py)
from bench.repo import git  # noqa: E402
from rebalancer.config import Settings  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402
from rebalancer.storage import open_warehouse  # noqa: E402
from rebalancer.what_if import what_if  # noqa: E402

CLI = [sys.executable, "-m", "rebalancer.entry"]


def cli(warehouse: Path, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([*CLI, "--warehouse", str(warehouse), *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=1_024, help="per group")
    parser.add_argument("--backups", type=int, default=2)
    parser.add_argument("--sweep", action="append", default=None)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cli-runs", type=int, default=1)
    parser.add_argument("--pristine", type=Path, help="a warehouse after its first exchange, to copy")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "what_if.json")
    parser.add_argument("--section", type=Path, default=REPO / "bench" / "results" / "what-if-section.md")
    parser.add_argument("--from-results", type=Path, help="only write the section from a results file")
    args = parser.parse_args()
    if args.from_results:
        args.section.write_text(section(json.loads(args.from_results.read_text())))
        return
    sweeps = args.sweep or ["nodes"]
    work = Path(tempfile.mkdtemp(prefix="bench-what-if-"))
    setup: dict[str, float] = {}
    try:
        pristine = args.pristine
        if pristine is None:
            pristine = work / "pristine"
            setup["generate_s"] = cli(pristine, "generate", "--nodes", str(args.nodes), "--groups", str(args.groups),
                                      "--partitions", str(args.partitions), "--backups", str(args.backups))
            setup["first_exchange_s"] = cli(pristine, "exchange")
        settings = Settings()
        t0 = time.perf_counter()
        spark = get_spark(settings.spark)
        setup["spark_start_s"] = time.perf_counter() - t0
        runs = []
        for i in range(args.runs):
            copy = work / f"run-{i}"
            shutil.copytree(pristine, copy)
            wh = open_warehouse(spark, settings.with_overrides(storage={"warehouse": str(copy)}).storage)
            load0 = os.getloadavg()[0]
            run = what_if(spark, wh, settings, sweeps=sweeps)
            worst = run.rows.slice(0, 1).to_pylist()[0]
            runs.append({
                "seconds": round(run.seconds, 2), "stage_seconds": {k: round(v, 2) for k, v in
                                                                    run.stage_seconds.items()},
                "spark_jobs": run.spark_jobs, "scenarios": run.rows.num_rows,
                "recomputed_partitions": sum(run.rows.column("recomputed_partitions").to_pylist()),
                "worst": {k: worst[k] for k in ("scenario", "lost_partitions", "partitions_without_backup", "copies",
                                                "bytes_to_move", "makespan_s")},
                "load_average_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
            })
            print(f"run {i + 1}: {run.seconds:.1f} s, {run.rows.num_rows} scenarios", file=sys.stderr)
        spark.stop()
        processes = []
        for i in range(args.cli_runs):
            copy = work / f"cli-{i}"
            shutil.copytree(pristine, copy)
            sweep_args = [a for s in sweeps for a in ("--sweep", s)]
            processes.append(round(cli(copy, "what-if", *sweep_args), 2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "cluster": {"nodes": args.nodes, "groups": args.groups, "partitions_per_group": args.partitions,
                    "backups": args.backups, "replicas": args.groups * args.partitions * (args.backups + 1)},
        "sweeps": sweeps, "setup": {k: round(v, 2) for k, v in setup.items()}, "runs": runs,
        "whole_process_s": processes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.section.write_text(section(result))
    print(markdown(result))


TARGET_S = 300  # the section's target: every single failure of XL answered in at most 5 minutes on this machine


def section(r: dict[str, Any]) -> str:
    """The page's section: how it was measured, the table, and the target."""
    runs = r["runs"]
    best = min((run["seconds"] for run in runs), default=None)
    whole = min(r["whole_process_s"], default=None)
    worst = runs[0]["worst"] if runs else None
    met = best is not None and best <= TARGET_S and (whole is None or whole <= TARGET_S)
    lines = [
        "## What if (`bench/what_if.py`)",
        "",
        f"Measured by `.venv/bin/python bench/what_if.py` (sweep {', '.join(r['sweeps'])}) at {r['measured_at']}, "
        f"commit `{r['commit']}`{' with uncommitted changes' if r['dirty'] else ''}, {r['machine']['cpus']} cores, "
        "local[*], nothing else running. Setup (untimed): `rebalancer generate` and the first `exchange`. Each "
        "scenario is one server failing; the figures of every scenario come from one pass over their rows (the "
        "*evaluate* stage: on the driver where the rows fit there, as here on a local master, else one Spark pass; "
        "docs/OPERATIONS.md).",
        "",
        markdown(r),
        "",
        f"Target: every single-node failure of XL (1,000 scenarios over 786,432 replicas) in <= {TARGET_S} s: "
        + ("**met**" if met else "**not met**") + (f" ({best:.0f} s in process" if best is not None else "")
        + (f", {whole:.0f} s as a whole process" if whole is not None else "") + (")" if best is not None else "")
        + ".",
    ]
    if worst:
        lines += ["", f"Worst scenario: `{worst['scenario']}` ({worst['lost_partitions']} lost, "
                      f"{worst['copies']:,} copies, {worst['bytes_to_move'] / 2**30:,.0f} GiB, makespan "
                      f"{worst['makespan_s']:.1f} s). The generated XL cluster places all 256 groups alike (the "
                      "same partition ids, no salt), so a node holds 0 or a multiple of 256 replicas, and the "
                      "failure of a node holding none recomputes nothing."]
    return "\n".join(lines) + "\n"


def markdown(r: dict[str, Any]) -> str:
    c = r["cluster"]
    lines = [
        f"what-if sweep {', '.join(r['sweeps'])}: {c['nodes']:,} nodes, {c['groups']} x {c['partitions_per_group']:,} "
        f"partitions, {c['backups']} backups ({c['replicas']:,} replicas); commit `{r['commit']}`"
        f"{' (dirty)' if r['dirty'] else ''}, {r['measured_at']}",
        "",
        "| run | scenarios | recomputed partitions | seconds | scenarios stage | evaluate | write | Spark jobs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(r["runs"], start=1):
        s = run["stage_seconds"]
        lines.append(f"| in process {i} | {run['scenarios']:,} | {run['recomputed_partitions']:,} | {run['seconds']} "
                     f"| {s.get('scenarios')} | {s.get('evaluate')} | {s.get('write')} | {run['spark_jobs']} |")
    for i, seconds in enumerate(r["whole_process_s"], start=1):
        lines.append(f"| whole process {i} (`rebalancer what-if`) | | | {seconds} | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
