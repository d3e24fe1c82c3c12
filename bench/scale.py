"""Benchmark: the scale issue's targets, whole processes on both storage engines, each beside a ``SELECT 1``.

Every figure is a whole ``rebalancer`` process as a user runs it, timed from outside (wall seconds, and the peak
resident set of the command's process tree as ``/usr/bin/time -f %M`` reports it for the Python process and
``ps`` for the JVM it started: ``peak_mb`` is the larger of the two). Each timed command is followed by a
``rebalancer sql "SELECT 1"`` process on the same warehouse and engine, so every figure can be read as a ratio
to that floor (this machine's speed varies by 2x from day to day; the ratios much less).

Scenarios (the benchmark suite's clusters, bench/suite.py; seed 20261121):

- ``exchange``: generate (timed once), the first exchange (timed once), then ``--runs`` rounds of: restore the
  post-first-exchange warehouse, append the change's event (untimed), time ``rebalancer exchange``, time a
  ``SELECT 1``. S join, M crash, L failure, XL failure, XXL failure; on delta-rs and delta-spark.
- ``demo``: ``rebalancer demo`` in an empty directory, ``--runs`` times per engine, each beside a ``SELECT 1`` on
  the warehouse it made; the demo's own step lines give generate's and validation's seconds (the only printed
  text read here: they are steps inside one process).
- ``xxxl``: 5,000 nodes x 50 groups x 65,536 partitions x 2 backups (9,830,400 replicas): generate, the first
  exchange and one failure, once, delta-rs.

Writes ``--out`` (default ``bench/results/scale.json``) and ``bench/results/scale-section.md`` (a section of
docs/BENCHMARKS.md; ``bench/suite.py --from-results`` puts it on the page). From the repository root::

    .venv/bin/python bench/scale.py                       # everything (about 30 minutes here)
    .venv/bin/python bench/scale.py --only S,M --runs 1   # a smoke test
    .venv/bin/python bench/scale.py --only XXXL --runs 1 --merge   # XXXL again, the other rows kept

``--merge`` replaces only the rows it measured in ``--out``; each row keeps the commit and date it was measured
on, and the page names every row measured apart from the header's run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.repo import git  # noqa: E402

RESULTS = REPO / "bench" / "results"
SECTION = RESULTS / "scale-section.md"
REBALANCER = str(Path(sys.executable).with_name("rebalancer"))
ENGINES = {"delta-rs": REPO / "bench" / "conf" / "delta-rs.toml", "delta-spark": REPO / "bench" / "conf" /
           "delta-spark.toml"}
M_ENGINES = {"delta-rs": REPO / "bench" / "conf" / "hazelcast.toml",
             "delta-spark": REPO / "bench" / "conf" / "delta-spark-hazelcast.toml"}
SEED = 20_261_121


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    groups: int
    partitions: int  # per group
    backups: int
    event: str
    node: str

    @property
    def replicas(self) -> int:
        return self.groups * self.partitions * (self.backups + 1)


SCENARIOS = {
    "S": Scenario("S join", 3, 1, 3, 1, "NODE_JOINED", "node3"),
    "M": Scenario("M crash", 10, 1, 20_000, 1, "NODE_FAILED", "node9"),
    "L": Scenario("L failure", 100, 64, 1_024, 2, "NODE_FAILED", "node50"),
    "XL": Scenario("XL failure", 1_000, 256, 1_024, 2, "NODE_FAILED", "node500"),
    "XXL": Scenario("XXL failure", 1_000, 912, 1_024, 2, "NODE_FAILED", "node500"),
    "XXXL": Scenario("XXXL failure", 5_000, 50, 65_536, 2, "NODE_FAILED", "node2500"),
}


def timed(argv: list[str], cwd: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``argv``; its wall seconds and peak resident set (the Python process's, or its JVM's if larger).
    A command still running after ``timeout_s`` is killed (RuntimeError)."""
    jvm_peak = [0]
    done = threading.Event()

    def watch(pid: int) -> None:  # the JVM is a child of the Python process: poll its VmHWM
        while not done.wait(0.5):
            for child in _children(pid):
                try:
                    text = Path(f"/proc/{child}/status").read_text()
                except OSError:
                    continue
                found = re.search(r"VmHWM:\s+(\d+) kB", text)
                if found:
                    jvm_peak[0] = max(jvm_peak[0], int(found.group(1)))

    t0 = time.perf_counter()
    proc = subprocess.Popen(["/usr/bin/time", "-f", "maxrss_kb=%M", *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=watch, args=(proc.pid,), daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for child in _children(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(child, 9)
        proc.kill()
        out, err = proc.communicate()
        done.set()
        raise RuntimeError(f"{' '.join(argv)} still ran after {timeout_s:.0f} s: killed") from None
    seconds = time.perf_counter() - t0
    done.set()
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-3000:]}")
    python_kb = int(re.findall(r"maxrss_kb=(\d+)", err)[-1])
    return {"seconds": round(seconds, 2), "peak_mb": round(max(python_kb, jvm_peak[0]) / 1024), "out": out,
            "err": err}


def _children(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            found.append(kid)
            pending.append(kid)
    return found


def cli(conf: Path, warehouse: Path, *args: str) -> list[str]:
    return [REBALANCER, "--conf", str(conf), "--warehouse", str(warehouse), *args]


def select1(conf: Path, warehouse: Path, cwd: Path) -> float:
    return float(timed(cli(conf, warehouse, "sql", "SELECT 1"), cwd)["seconds"])


def exchange_scenario(key: str, engine: str, runs: int, work: Path, timeout_s: float | None = None
                      ) -> dict[str, Any]:
    s = SCENARIOS[key]
    conf = (M_ENGINES if key == "M" else ENGINES)[engine]
    folder = work / f"{key}-{engine}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    warehouse, pristine = folder / "warehouse", folder / "pristine"
    generated = timed(cli(conf, warehouse, "generate", "--nodes", str(s.nodes - (1 if s.event == "NODE_JOINED" else 0)),
                          "--groups", str(s.groups), "--partitions", str(s.partitions), "--backups", str(s.backups),
                          "--seed", str(SEED)), folder, timeout_s)
    first = timed(cli(conf, warehouse, "exchange"), folder, timeout_s)
    first_floor = select1(conf, warehouse, folder)
    shutil.copytree(warehouse, pristine)
    rounds = []
    for _ in range(runs):
        shutil.rmtree(warehouse)
        shutil.copytree(pristine, warehouse)
        timed(cli(conf, warehouse, "event", s.event, "--node", s.node), folder)
        change = timed(cli(conf, warehouse, "exchange"), folder, timeout_s)
        rounds.append({"seconds": change["seconds"], "peak_mb": change["peak_mb"],
                       "select1_s": select1(conf, warehouse, folder)})
    shutil.rmtree(folder)
    return {
        "scenario": s.name, "key": key, "engine": engine, "replicas": s.replicas,
        "generate_s": generated["seconds"], "generate_peak_mb": generated["peak_mb"],
        "first_s": first["seconds"], "first_peak_mb": first["peak_mb"], "first_select1_s": first_floor,
        "runs": rounds,
    }


_STEP = re.compile(r"^(generating a steady cluster|validating inputs)[^\n]*: ([0-9.]+) s$", re.MULTILINE)


def demo(engine: str, runs: int, work: Path) -> dict[str, Any]:
    conf = ENGINES[engine]
    rounds = []
    for i in range(runs):
        folder = work / f"demo-{engine}-{i}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        ran = timed([REBALANCER, "--conf", str(conf), "demo"], folder)
        steps = {m.group(1): float(m.group(2)) for m in _STEP.finditer(ran["out"] + ran["err"])}
        rounds.append({"seconds": ran["seconds"], "peak_mb": ran["peak_mb"],
                       "generate_s": steps.get("generating a steady cluster"),
                       "validate_s": steps.get("validating inputs"),
                       "select1_s": select1(conf, folder / "warehouse", folder)})
        shutil.rmtree(folder)
    return {"engine": engine, "runs": rounds}


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def section(results: dict[str, Any]) -> str:
    """The Markdown section: every row of the scale issue's targets, measured and judged."""
    rows: dict[tuple[str, str], dict[str, Any]] = {(r["key"], r["engine"]): r for r in results["exchanges"]}
    demos = {d["engine"]: d for d in results["demos"]}
    lines = [
        "## Scale targets, whole processes (`bench/scale.py`)",
        "",
        f"Measured on {results['date']} at `{results['commit']}`{' (uncommitted changes)' if results['dirty'] else ''}"
        f" with `.venv/bin/python bench/scale.py --runs {results['runs']}`: {results['machine']}. Every figure is a"
        " whole `rebalancer` process, the median of the runs; `SELECT 1` is a `rebalancer sql \"SELECT 1\"` process"
        " on the same warehouse and engine, run after each timed command, and *x SELECT 1* divides by the median of"
        " those. Peak memory: the largest resident set of the command's Python process or its JVM.",
        *(f"- {r['scenario']}, {r['engine']}: measured apart, on {r['date']} at `{r['commit']}` with"
          f" `bench/scale.py --only {r['key']} --engines {r['engine']} --runs {len(r['runs'])} --merge`"
          f" ({r['machine']})." for r in results["exchanges"]
          if r.get("commit", results["commit"]) != results["commit"]),
        "",
        "| scenario | engine | replicas | generate | first exchange | change (median) | runs | SELECT 1 | change x"
        " SELECT 1 | peak MB (change) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (_key, engine), r in rows.items():
        changes = [x["seconds"] for x in r["runs"]]
        floor = median([x["select1_s"] for x in r["runs"]])
        lines.append(
            f"| {r['scenario']} | {engine} | {r['replicas']:,} | {r['generate_s']:.1f} s | {r['first_s']:.1f} s |"
            f" {median(changes):.1f} s | {' / '.join(f'{c:.1f}' for c in changes)} | {floor:.1f} s |"
            f" {median(changes) / floor:.2f} | {max(x['peak_mb'] for x in r['runs']):,} |")
    lines += ["", "| target (the scale issue) | measured | met |", "|---|---|---|"]

    def change(key: str, engine: str) -> float | None:
        r = rows.get((key, engine))
        return median([x["seconds"] for x in r["runs"]]) if r else None

    def judge(label: str, value: str, ok: bool | None) -> None:
        lines.append(f"| {label} | {value} | {'yes' if ok else 'no' if ok is not None else 'not measured'} |")

    xl, xxl = change("XL", "delta-rs"), change("XXL", "delta-rs")
    judge("XL failure, delta-rs <= 15 s", f"{xl} s" if xl else "-", xl is not None and xl <= 15)
    if xxl is not None:
        peak = max(x["peak_mb"] for x in rows[("XXL", "delta-rs")]["runs"])
        judge("XXL failure, delta-rs <= 45 s, <= 6 GiB", f"{xxl} s, {peak:,} MB", xxl <= 45 and peak <= 6 * 1024)
    if ("XL", "delta-rs") in rows and xl:
        first = rows[("XL", "delta-rs")]["first_s"]
        judge("XL first exchange after generate <= 1.5x XL failure", f"{first} s = {first / xl:.2f}x",
              first <= 1.5 * xl)
        gen = rows[("XL", "delta-rs")]["generate_s"]
        judge("generate XL <= 20 s", f"{gen} s", gen <= 20)
    for key in ("S", "M", "L", "XL", "XXL"):
        rs, ds = change(key, "delta-rs"), change(key, "delta-spark")
        if rs and ds:
            judge(f"{SCENARIOS[key].name} on delta-spark <= 1.5x delta-rs", f"{ds} s / {rs} s = {ds / rs:.2f}x",
                  ds <= 1.5 * rs)
    if demos:
        for engine, d in demos.items():
            floor = median([x["select1_s"] for x in d["runs"]])
            gen = median([x["generate_s"] for x in d["runs"] if x["generate_s"] is not None])
            val = median([x["validate_s"] for x in d["runs"] if x["validate_s"] is not None])
            judge(f"demo's generate of 3,072 copies <= 0.5x SELECT 1 ({engine})", f"{gen} s = {gen / floor:.2f}x",
                  gen <= 0.5 * floor)
            judge(f"demo's validation <= 0.5x SELECT 1 ({engine})", f"{val} s = {val / floor:.2f}x",
                  val <= 0.5 * floor)
        if {"delta-rs", "delta-spark"} <= demos.keys():
            rs_demo = median([x["seconds"] for x in demos["delta-rs"]["runs"]])
            ds_demo = median([x["seconds"] for x in demos["delta-spark"]["runs"]])
            rs_floor = median([x["select1_s"] for x in demos["delta-rs"]["runs"]])
            ds_floor = median([x["select1_s"] for x in demos["delta-spark"]["runs"]])
            judge("`rebalancer demo`, delta-spark <= 1.2x delta-rs", f"{ds_demo} s / {rs_demo} s = "
                  f"{ds_demo / rs_demo:.2f}x", ds_demo <= 1.2 * rs_demo)
            judge("`rebalancer demo` on delta-rs <= 4x SELECT 1", f"{rs_demo / rs_floor:.2f}x",
                  rs_demo <= 4 * rs_floor)
            judge("`SELECT 1`, delta-spark <= 1.2x delta-rs", f"{ds_floor} s / {rs_floor} s = "
                  f"{ds_floor / rs_floor:.2f}x", ds_floor <= 1.2 * rs_floor)
    big = rows.get(("XXXL", "delta-rs"))
    if big:
        peak = max([big["generate_peak_mb"], big["first_peak_mb"], *(x["peak_mb"] for x in big["runs"])])
        worst = max(big["generate_s"], big["first_s"], *(x["seconds"] for x in big["runs"]))
        judge("XXXL (9,830,400 replicas) runs, <= 5 min and <= 16 GiB per command",
              f"generate {big['generate_s']:.0f} s, first {big['first_s']:.0f} s, failure "
              f"{median([x['seconds'] for x in big['runs']]):.0f} s; peak {peak:,} MB", worst <= 300 and
              peak <= 16 * 1024)
    if results.get("xxxl_failed"):
        judge("XXXL (9,830,400 replicas) runs, <= 5 min and <= 16 GiB per command",
              results["xxxl_failed"].splitlines()[0].replace(REBALANCER, "rebalancer")[-300:], False)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="S,M,L,XL,XXL,demo,XXXL",
                        help="comma-separated: S, M, L, XL, XXL, XXXL, demo (default: all)")
    parser.add_argument("--engines", default="delta-rs,delta-spark")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--from-results", type=Path, default=None, help="only write the section from this file")
    parser.add_argument("--merge", action="store_true",
                        help="replace only the rows measured now in --out, keep its others (and its header)")
    args = parser.parse_args()
    if args.from_results:
        SECTION.write_text(section(json.loads(args.from_results.read_text())))
        print(SECTION.read_text())
        return
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    engines = [x.strip() for x in args.engines.split(",") if x.strip()]
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "runs": args.runs,
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start",
        "exchanges": [], "demos": [],
    }
    measured = {"date": results["date"], "commit": results["commit"], "machine": results["machine"]}
    if args.merge:
        kept = json.loads(args.out.read_text())
        if "XXXL" in only:
            kept.pop("xxxl_failed", None)
        results = {
            **kept,
            "exchanges": [r for r in kept["exchanges"] if not (r["key"] in only and r["engine"] in engines)],
            "demos": [d for d in kept["demos"] if not ("demo" in only and d["engine"] in engines)],
        }
    with tempfile.TemporaryDirectory(prefix="rebalancer-scale-") as tmp:
        work = Path(tmp)
        for key in [k for k in SCENARIOS if k in only and k != "XXXL"]:
            for engine in engines:
                print(f"{key} on {engine} ...", flush=True)
                results["exchanges"].append({**exchange_scenario(key, engine, args.runs, work), **measured})
                args.out.write_text(json.dumps(results, indent=1))
        if "demo" in only:
            for engine in engines:
                print(f"demo on {engine} ...", flush=True)
                results["demos"].append({**demo(engine, args.runs, work), **measured})
                args.out.write_text(json.dumps(results, indent=1))
        if "XXXL" in only:  # once, delta-rs; each command given three times the target before it is stopped
            print("XXXL on delta-rs ...", flush=True)
            try:
                results["exchanges"].append({**exchange_scenario("XXXL", "delta-rs", 1, work, timeout_s=900),
                                             **measured})
            except RuntimeError as exc:
                print(f"  failed: {exc}", flush=True)
                results["xxxl_failed"] = str(exc)[-2000:]
            args.out.write_text(json.dumps(results, indent=1))
    SECTION.write_text(section(results))
    print(SECTION.read_text())


if __name__ == "__main__":
    main()
