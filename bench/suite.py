"""Benchmark suite: every scenario of docs/BENCHMARKS.md, one results file, one generated page, two plots.

What runs (``make bench``):

- Every *scenario change* below as its own ``bench/exchange.py`` subprocess, so that each has a fresh JVM and its
  own memory figures. exchange.py generates the cluster with the ``rebalancer generate`` CLI (fixed seed), runs the
  first exchange, then times ``--runs`` whole-process ``rebalancer exchange`` runs and as many ``run_exchange`` runs
  in its warm session, each after restoring the post-first-exchange warehouse and appending the change's event;
  then it counts migrations against their minimum and schedules the plan by three policies (its docstring has the
  details). Changes of one scenario that start from the same cluster share it: the first one keeps its
  post-first-exchange warehouse, the next ones start from a copy (``--save-pristine`` / ``--pristine``).

  ====  =====================================================================  =========================================
  name  cluster                                                                changes
  ====  =====================================================================  =========================================
  S     Ignite's example: 3 nodes, 1 group x 3 partitions, 1 backup            node3 joins
  M     Hazelcast's benchmark: 10 nodes, 1 x 20,000, 1 backup, 205 MB each     scale-down (node9 leaves), scale-up (9
        (``bench/conf/hazelcast.toml``; ~4.1 TB of primary data)               nodes, node9 joins), crash (node9 fails)
  L     100 nodes, 64 groups x 1,024 partitions, 2 backups                     node50 fails; node100 joins
  XL    1,000 nodes, 256 x 1,024, 2 backups (786,432 replicas)                 node500 fails
  XXL   1,000 nodes, 912 x 1,024, 2 backups (2,801,664 replicas)               node500 fails
  ====  =====================================================================  =========================================

  For M, the rebuilt plan is also scheduled at per-node caps 1, 2, 5, 10 and 20.
- ``bench/migrations.py`` (Hazelcast's graceful scale-down in our cost model) and ``bench/affinity.py`` (the
  ideal-assignment stage), each in its own subprocess.

Everything lands in ``bench/results/latest.json``; the page ``docs/BENCHMARKS.md`` and the plots
``docs/images/bench-*.png`` are generated from it (``--from-results`` regenerates them from a results file without
measuring anything).

``--quick`` (``make bench-quick``, under 5 minutes) runs the M crash, with the M cap sweep, writes
``bench/results/quick.json`` and prints the tables; it leaves latest.json, the page and the plots alone. It times one
warm and one whole-process run per change (``--runs``/``--cli-runs`` change that): each change already pays a fixed
cost (the CLI generation, a JVM start, the first exchange in a cold session, the migration analysis) that is most
of its time at the engine's current speed on 2 cores. It is a smoke test of the numbers, not a measurement of
their spread.

Options: ``--only S,M`` (scenario names, ``M/crash`` for one change, ``migrations``, ``affinity``), ``--runs``,
``--cli-runs``, ``--profile`` (exchange.py's instrumented run), ``--tiny`` (for trying the suite out: M, L, XL and XXL
shrunk to a few hundred partitions; the results and the page say so), ``--migrations-from FILE`` /
``--affinity-from FILE`` (take that benchmark's results from an earlier run instead of running it).

Run from the repository root: ``.venv/bin/python bench/suite.py [--quick]``. This script itself imports neither
Spark nor the package: it only starts the benchmarks and formats their results (matplotlib for the plots).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "BENCHMARKS.md"
IMAGES = REPO / "docs" / "images"
TIME_PLOT = "bench-time-vs-replicas.png"
CAP_PLOT = "bench-makespan-vs-cap.png"
HAZELCAST_CONF = "bench/conf/hazelcast.toml"
SEED = 20_261_121
CAPS = (1, 2, 5, 10, 20)
SCENARIO_ORDER = ("S", "M", "L", "XL", "XXL")
NICE_SECONDS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800, 3600, 7200)
OTHER_BENCHMARKS = ("migrations", "affinity")
GIB = 2**30


# ---------------------------------------------------------------------------------------------------------------
# The scenarios
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """One scenario change: a generated cluster and the one event that the measured exchange processes."""

    scenario: str
    change: str
    label: str
    nodes: int  # nodes generated (the scale-up generates one fewer and the event adds it)
    groups: int
    partitions_total: int
    backups: int
    event: str
    node: str
    conf: str | None = None
    caps: tuple[int, ...] = ()
    seed: int = SEED

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.change}"

    @property
    def replicas(self) -> int:
        return self.partitions_total * (self.backups + 1)

    @property
    def base(self) -> tuple[Any, ...]:
        """What the generated cluster depends on: changes with the same base can share it."""
        return (self.nodes, self.groups, self.partitions_total, self.backups, self.seed, self.conf)

    def describe(self) -> str:
        per_group = self.partitions_total // self.groups
        return (f"{self.nodes:,} nodes, {self.groups:,} x {per_group:,} partitions, {self.backups} "
                f"backup{'s' if self.backups != 1 else ''}; {self.event} {self.node}")


def scenario_changes(tiny: bool = False) -> list[Change]:
    """Every scenario change, in running order. ``tiny`` shrinks M, L, XL and XXL (trying the suite out only)."""
    m_nodes, m_parts = (10, 200) if tiny else (10, 20_000)
    l_nodes, l_groups, l_size = (12, 4, 64) if tiny else (100, 64, 1_024)
    xl_nodes, xl_groups, xl_size = (20, 8, 64) if tiny else (1_000, 256, 1_024)
    xxl_nodes, xxl_groups, xxl_size = (20, 16, 64) if tiny else (1_000, 912, 1_024)
    last = f"node{m_nodes - 1}"
    m = {"groups": 1, "partitions_total": m_parts, "backups": 1, "conf": HAZELCAST_CONF, "caps": CAPS}

    def failure(scenario: str, nodes: int, groups: int, group_size: int) -> Change:
        node = f"node{nodes // 2}"
        return Change(scenario, "failure", f"failure: {node} fails", nodes, groups, groups * group_size, 2,
                      "NODE_FAILED", node)

    return [
        Change("S", "join", "join: node3 joins 3", 3, 1, 3, 1, "NODE_JOINED", "node3"),
        Change("M", "scale-down", f"scale-down: {last} leaves", m_nodes, event="NODE_LEFT", node=last, **m),
        Change("M", "scale-up", f"scale-up: {last} joins {m_nodes - 1}", m_nodes - 1, event="NODE_JOINED",
               node=last, **m),
        Change("M", "crash", f"crash: {last} fails", m_nodes, event="NODE_FAILED", node=last, **m),
        failure("L", l_nodes, l_groups, l_size),
        Change("L", "join", f"join: node{l_nodes} joins {l_nodes}", l_nodes, l_groups, l_groups * l_size, 2,
               "NODE_JOINED", f"node{l_nodes}"),
        failure("XL", xl_nodes, xl_groups, xl_size),
        failure("XXL", xxl_nodes, xxl_groups, xxl_size),
    ]


def select(changes: list[Change], only: list[str] | None) -> tuple[list[Change], list[str]]:
    """The changes and other benchmarks named by ``--only`` (all when None)."""
    if not only:
        return changes, list(OTHER_BENCHMARKS)
    known = {c.scenario for c in changes} | {c.key for c in changes} | set(OTHER_BENCHMARKS)
    unknown = [n for n in only if n not in known]
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; use {', '.join(sorted(known))}")
    return ([c for c in changes if c.scenario in only or c.key in only],
            [b for b in OTHER_BENCHMARKS if b in only])


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] suite: {message}", file=sys.stderr, flush=True)


def run_logged(cmd: list[str], log_path: Path) -> tuple[int, float, str]:
    """Run ``cmd`` from the repository root, its stderr shown as it comes (progress) and both streams kept in
    ``log_path``; returns the exit code, the wall seconds and the last lines of stderr."""
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=25)
    with open(log_path, "w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write("    " + line)
            out.write(line)
            tail.append(line.rstrip())
        code = proc.wait()
    return code, round(time.perf_counter() - t0, 1), "\n".join(tail)


def exchange_command(c: Change, out: Path, args: argparse.Namespace, pristine: dict[tuple[Any, ...], Path],
                     shared: set[tuple[Any, ...]], work: Path) -> list[str]:
    cmd = [
        sys.executable, "bench/exchange.py", "--name", c.key, "--nodes", str(c.nodes), "--groups", str(c.groups),
        "--partitions-total", str(c.partitions_total), "--backups", str(c.backups), "--seed", str(c.seed),
        "--event", c.event, "--node", c.node, "--runs", str(args.runs), "--cli-runs", str(args.cli_runs),
        "--out", str(out),
    ]
    if c.conf:
        cmd += ["--conf", c.conf]
    if c.caps:
        cmd += ["--caps", ",".join(map(str, c.caps))]
    if not args.profile:
        cmd.append("--no-profile")
    if c.base in pristine:
        cmd += ["--pristine", str(pristine[c.base])]
    elif c.base in shared:
        pristine[c.base] = work / f"pristine-{len(pristine)}"
        cmd += ["--save-pristine", str(pristine[c.base])]
    return cmd


def run_changes(changes: list[Change], args: argparse.Namespace, work: Path,
                save: Any) -> list[dict[str, Any]]:
    """Every change in its own exchange.py process; a failed change is recorded with its error and the rest go on."""
    bases = [c.base for c in changes]
    shared = {b for b in bases if bases.count(b) > 1}
    pristine: dict[tuple[Any, ...], Path] = {}
    entries: list[dict[str, Any]] = []
    for i, c in enumerate(changes, 1):
        out = work / f"{c.scenario}-{c.change}.json"
        cmd = exchange_command(c, out, args, pristine, shared, work)
        log(f"[{i}/{len(changes)}] {c.key}: {c.describe()}")
        code, seconds, tail = run_logged(cmd, work / f"{c.scenario}-{c.change}.log")
        entry: dict[str, Any] = {
            "key": c.key, "scenario": c.scenario, "change": c.change, "label": c.label, "spec": asdict(c),
            "replicas": c.replicas, "command": shlex.join(["python", *cmd[1:]]), "seconds": seconds,
            "result": None, "error": None,
        }
        if code == 0 and out.exists():
            entry["result"] = json.loads(out.read_text())
        else:
            entry["error"] = f"exit code {code}; last lines of stderr:\n{tail}"
            log(f"{c.key} FAILED (exit code {code}); going on")
            pristine.pop(c.base, None)  # a failed first change may have left no pristine copy
        log(f"{c.key}: {seconds:.0f} s")
        entries.append(entry)
        save(entries)
    return entries


def run_other(name: str, work: Path, reuse: Path | None) -> dict[str, Any]:
    """bench/migrations.py or bench/affinity.py in a subprocess (or an earlier result file of it)."""
    if reuse is not None:
        return {"command": None, "reused_from": str(reuse), "result": json.loads(reuse.read_text()), "error": None}
    out = work / f"{name}.json"
    cmd = [sys.executable, f"bench/{name}.py", "--out", str(out)]
    log(f"{name}: {shlex.join(['python', *cmd[1:]])}")
    code, seconds, tail = run_logged(cmd, work / f"{name}.log")
    ok = code == 0 and out.exists()
    log(f"{name}: {seconds:.0f} s" + ("" if ok else f" FAILED (exit code {code})"))
    return {"command": shlex.join(["python", *cmd[1:]]), "seconds": seconds, "reused_from": None,
            "result": json.loads(out.read_text()) if ok else None,
            "error": None if ok else f"exit code {code}; last lines of stderr:\n{tail}"}


def shown(path: Path) -> str:
    """A path relative to the repository root when it is inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine_facts() -> dict[str, Any]:
    """The machine and the versions, read without importing Spark (package versions from their metadata)."""
    cpu_model = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        java = None
    versions = {}
    for package in ("rebalancer", "pyspark", "delta-spark", "deltalake", "pyarrow", "numpy", "matplotlib"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu_model": cpu_model, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
        "os": platform.platform(), "kernel": platform.release(), "python": platform.python_version(),
        "java": java, "versions": versions,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    changes, others = select(scenario_changes(args.tiny), args.only)
    # a benchmark whose results are given (--migrations-from, --affinity-from) is included even if --only omits it
    others += [name for name, given in (("migrations", args.migrations_from), ("affinity", args.affinity_from))
               if given is not None and name not in others]
    started = time.time()
    results: dict[str, Any] = {
        "suite": {
            "mode": "quick" if args.quick else "full", "tiny": args.tiny,
            "command": shlex.join([".venv/bin/python", "bench/suite.py", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "finished": None, "seconds": None, "runs": args.runs, "cli_runs": args.cli_runs,
            "only": args.only,
        },
        "machine": machine_facts(),
        "code": {"commit": git("rev-parse", "--short", "HEAD"),
                 "uncommitted_changes": git("status", "--porcelain").splitlines()},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "changes": [],
        "migrations": None,
        "affinity": None,
    }

    def save(entries: list[dict[str, Any]] | None = None) -> None:
        if entries is not None:
            results["changes"] = entries
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="rebalancer-suite-") as tmp:
        work = Path(tmp)
        if changes:
            run_changes(changes, args, work, save)
        for name in others:
            reuse = args.migrations_from if name == "migrations" else args.affinity_from
            results[name] = run_other(name, work, reuse)
            save()
    results["suite"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results["suite"]["seconds"] = round(time.time() - started, 1)
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    save()
    log(f"results in {shown(args.out)}, {results['suite']['seconds']:.0f} s in all")
    return results


# ---------------------------------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------------------------------
def secs(value: float | None) -> str:
    """Seconds for a person: 0.85 s, 12.3 s, 2m05s, 1h02m."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} s"
    if value < 100:
        return f"{value:.1f} s"
    m, s = divmod(round(value), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def spread_text(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:.1f} ({len(s['runs'])} run{'s' if len(s['runs']) != 1 else ''})"
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def size(n_bytes: float | None) -> str:
    if n_bytes is None:
        return "-"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes:,.0f} B"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def measured(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The changes that produced results."""
    return [c for c in results["changes"] if c.get("result")]


def peak_mb(r: dict[str, Any], role: str) -> tuple[float | None, str]:
    """The largest peak RSS of a role over the whole-process runs (the warm runs when there are none)."""
    for mode in ("cli", "warm"):
        s = r["summary"].get(mode)
        if s:
            value = s["peak_rss_sum_mb"]["max"] if role == "sum" else s["peak_rss_mb"][role]["max"]
            return value, mode
    return None, "-"


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------
def summary_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for c in results["changes"]:
        if not c.get("result"):
            rows.append([c["scenario"], c["label"], f"{c['replicas']:,}", "**failed**: see the results file",
                         *["-"] * 8])
            continue
        r = c["result"]
        cli, warm, mig = r["summary"].get("cli"), r["summary"].get("warm"), r["migrations"]
        driver, mode = peak_mb(r, "driver")
        jvm, _ = peak_mb(r, "jvm")
        mk, per_node = mig["makespan"], mig["replicas_per_node"]
        rows.append([
            c["scenario"], c["label"], f"{c['replicas']:,}",
            spread_text(cli["wall_s"]) if cli else "-",
            spread_text(warm["wall_s"]) if warm else "-",
            f"{driver / 1024:.2f} / {jvm / 1024:.2f}" + ("" if mode == "cli" else " (warm)"),
            f"{r['rows_written_total']:,}", size(r["bytes_written_total"]),
            f"{mig['copies']:,} / {mig['minimum_copies']:,} / {mig['balance_minimum']:,}",
            f"{per_node['max']:,} / {per_node['mean']:,.1f}",
            f"{secs(mk['ours_s'])} / {secs(mk['hazelcast_s'])} / {secs(mk['serial_s'])} / {secs(mk['lower_bound_s'])}",
        ])
    return table(
        ["scenario", "change", "replicas", "whole process, s: median (min-max)", "warm `run_exchange`, s",
         "peak RSS driver / JVM, GiB", "rows written", "bytes written", "COPYs / minimum / balance min",
         "replicas per node max / mean", "makespan ours / hazelcast / serial / bound"],
        rows,
    )


def stage_tables(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for scenario in SCENARIO_ORDER:
        changes = [c for c in measured(results) if c["scenario"] == scenario]
        if not changes:
            continue
        header, columns, outside = ["stage"], [], []
        for c in changes:
            for mode, title in (("warm", "warm"), ("cli", "whole process")):
                s = c["result"]["summary"].get(mode)
                if s:
                    header.append(f"{c['change']}: {title}")
                    columns.append(s)
                    # per run, then the median (medians of the parts need not add up to the median of the whole)
                    rest = [r[mode]["wall_s"] - sum(r[mode].get("stage_s", {}).values())
                            for r in c["result"]["runs"] if mode in r]
                    outside.append(f"{statistics.median(rest):.2f} s "
                                   f"({statistics.median(rest) / s['wall_s']['median']:.0%})")
        # rebalancer.exchange.job.STAGES as exchange.py recorded it (this script does not import the package)
        order = [n for c in changes for n in c["result"].get("stages", [])]
        order += [n for s in columns for n in s["stage_s"]]
        rows = []
        for stage in dict.fromkeys(order):
            if not any(stage in s["stage_s"] for s in columns):
                continue
            cells = []
            for s in columns:
                seconds = s["stage_s"].get(stage, {}).get("median")
                wall = s["wall_s"]["median"]
                cells.append("-" if seconds is None else f"{seconds:.2f} s ({seconds / wall:.0%})")
            rows.append([stage, *cells])
        rows.append(["outside the stages", *outside])
        rows.append(["**wall (median)**", *(f"**{s['wall_s']['median']:.2f} s**" for s in columns)])
        replicas = changes[0]["result"]["cluster"]["replicas"]
        lines += [f"**{scenario}** ({replicas:,} replicas)", "", *table(header, rows), ""]
    return lines


def cap_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in measured(results):
        for cap, m in c["result"]["migrations"]["caps"].items():
            rows.append([f"{c['scenario']} {c['label']}", cap, secs(m["ours_s"]), secs(m["hazelcast_s"]),
                         secs(m["serial_s"]), secs(m["lower_bound_s"]),
                         f"{m['ours_s'] / m['lower_bound_s']:.3f}" if m["lower_bound_s"] else "-",
                         f"{m['hazelcast_s'] / m['ours_s']:.2f}x" if m["ours_s"] else "-"])
    return rows


def migrations_table(data: dict[str, Any]) -> list[str]:
    rows = []
    for r in data["scenarios"]:
        for cap, c in r["caps"].items():
            rows.append([
                r["scenario"], cap, f"{r['copies']:,} ({r['minimum_copies']:,})", f"{r['promotes']:,} / {r['drops']:,}",
                f"{r['bytes_moved'] / 1e12:.2f}", secs(c["ours_makespan_s"]), secs(c["lower_bound_s"]),
                f"{c['ours_over_bound']:.3f}", secs(c["hazelcast_makespan_s"]), f"{c['hazelcast_over_ours']:.1f}x",
                secs(c["serial_makespan_s"]),
            ])
    return table(["scenario", "cap", "data-bearing copies (minimum)", "promotes / drops", "TB moved", "ours",
                  "lower bound", "ours / bound", "hazelcast", "hazelcast / ours", "serial"], rows)


def affinity_table(data: dict[str, Any]) -> list[str]:
    rows = [[f"{r['partitions']:,} x {r['nodes']:,}", r["affinity"], f"{r['output_rows']:,}",
             f"{r['spark_median_s']:.2f} s", f"{r['kernel_one_core_median_s']:.4f} s"] for r in data["results"]]
    return table(["partitions x nodes", "affinity", "replicas", "Spark stage, local[*] (median of 3)",
                  "NumPy kernel, 1 core, no Spark"], rows)


def target_lines(results: dict[str, Any]) -> list[str]:
    """Each speed target, met or not, from the measured whole-process medians (and the peak memory for XXL)."""
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for c in measured(results):
        by_scenario.setdefault(c["scenario"], []).append(c)
    targets = [("M", 15.0, "an M exchange (each of the three changes) takes under 15 s, whole process"),
               ("XL", 60.0, "an XL exchange takes under 60 s, whole process"),
               ("XXL", 180.0, "an XXL exchange takes under 3 min, whole process, with peak memory within 24 GiB")]
    rows = []
    for scenario, limit, text in targets:
        changes = by_scenario.get(scenario, [])
        walls = [(c, c["result"]["summary"].get("cli")) for c in changes]
        if not changes or any(s is None for _, s in walls):
            rows.append([text, "not measured in this run", "-"])
            continue
        met = all(s["wall_s"]["median"] < limit for _, s in walls)
        detail = "; ".join(f"{c['change']} {secs(s['wall_s']['median'])} (max {secs(s['wall_s']['max'])})"
                           for c, s in walls)
        if scenario == "XXL":
            peak = max(peak_mb(c["result"], "sum")[0] or 0.0 for c in changes)
            detail += f"; peak RSS driver + JVM + Python workers {peak / 1024:.1f} GiB"
            met = met and peak <= 24 * 1024
        rows.append([text, "**met**" if met else "**not met**", detail])
    if results["suite"].get("tiny"):
        rows = [[t, "not applicable: tiny trial sizes", "-"] for t, _, _ in rows]
    return table(["target", "result", "measured (median of the whole-process runs)"], rows)


def rebuilt_matches(m: dict[str, Any]) -> bool:
    """exchange.py's check that the plan it rebuilt is the committed one (recomputed for older results files)."""
    if "rebuilt_matches_committed" in m:
        return bool(m["rebuilt_matches_committed"])
    steps = sum(a["steps"] for a in m["committed_plan"].values())
    ours, committed = m["makespan"]["ours_s"], m["committed_makespan_s"]
    return m["rebuilt_plan"]["steps"] == steps and abs(ours - committed) <= 0.01 + 1e-6 * committed


def conditions_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for c in measured(results):
        r = c["result"]
        cli = r["summary"].get("cli")
        load = r["load_average"]["during_timed_runs_1min"] or {}
        match = rebuilt_matches(r["migrations"])
        rows.append([c["key"], f"{load.get('mean', '-')} (max {load.get('max', '-')})",
                     spread_text(cli["other_work_core_s"]) if cli else "-",
                     spread_text(cli["tree_cpu_s"]) if cli else "-", secs(c["seconds"]),
                     "yes" if match else "**no**"])
    return table(["change", "load average (1 min) during the timed runs", "core-s used by other work during a "
                  "whole-process run", "core-s used by the whole process", "benchmark process, all included",
                  "rebuilt plan = committed plan"], rows)


def merge(results: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """``results`` with the changes of ``others`` added (a change measured again replaces the earlier one), in the
    order of :func:`scenario_changes`; each other run's suite facts are kept under ``suite.merged``."""
    changes = {c["key"]: c for c in results["changes"]}
    merged = list(results["suite"].get("merged", []))
    for other in others:
        changes.update({c["key"]: c for c in other["changes"]})
        merged.append({**{k: other["suite"].get(k) for k in ("command", "started", "seconds", "runs", "cli_runs")},
                       "changes": [c["key"] for c in other["changes"]], "commit": other["code"].get("commit")})
    order = {c.key: i for i, c in enumerate(scenario_changes(results["suite"].get("tiny", False)))}
    out = dict(results)
    out["changes"] = sorted(changes.values(), key=lambda c: order.get(c["key"], len(order)))
    out["suite"] = {**results["suite"], "merged": merged}
    return out


def render(results: dict[str, Any], images: Path | None, source: str = "bench/results/latest.json") -> str:
    """docs/BENCHMARKS.md from a results file (``images``: where the plots were written, None for none)."""
    suite, machine, code = results["suite"], results["machine"], results["code"]
    v = machine["versions"]
    first = next((c["result"] for c in measured(results)), None)
    engine = first["machine"] if first else {}
    lines = [
        "# Benchmarks",
        "",
        f"<!-- Generated by bench/suite.py from {source}: do not edit by hand; run `make bench` "
        "(or `.venv/bin/python bench/suite.py --from-results` after editing the generator). -->",
        "",
        "*This page is generated by `bench/suite.py` (`make bench`) from the results file; edit the generator, not "
        "the page.* What the figures mean, what was changed to get them and what is left: "
        "[PERFORMANCE.md](PERFORMANCE.md).",
        "",
    ]
    if suite.get("tiny"):
        lines += [
            "> **Trial run at tiny sizes, not the benchmark.** These figures come from `bench/suite.py --tiny`, which "
            "shrinks M, L, XL and XXL to a few hundred partitions to try the suite out. They only show what the page "
            "looks like; regenerate it with `make bench`.",
            "",
        ]
    every_change = {c.key for c in scenario_changes(bool(suite.get("tiny")))}
    if suite.get("only") and not every_change <= {c["key"] for c in results["changes"]}:
        lines += [f"> Partial run: only {', '.join(suite['only'])} (`--only`).", ""]
    dirty = code.get("uncommitted_changes") or []
    lines += table(["", ""], [
        ["date", f"{suite['started']} (UTC), {secs(suite['seconds'])} in all"],
        ["command", f"`{suite['command']}`"],
        ["commit", f"`{code['commit']}`" + (f" plus uncommitted changes ({plural(len(dirty), 'file')})" if dirty
                                            else "")],
        ["machine", f"{machine['cores']} cores ({machine['cpu_model']}), {machine['memory_gib']} GiB, "
                    f"{machine['os']}"],
        ["versions", f"Python {machine['python']}, {machine['java']}, pyspark {v['pyspark']}, deltalake "
                     f"{v['deltalake']}, delta-spark {v['delta-spark'] or 'not installed'}, pyarrow {v['pyarrow']}, "
                     f"numpy {v['numpy']}"],
        ["Spark", f"`{engine.get('spark_master', '-')}`, {engine.get('shuffle_partitions', '-')} shuffle "
                  f"partitions, driver memory {engine.get('driver_memory', '-')}, storage engine "
                  f"{engine.get('storage_engine', '-')}"],
        ["runs", f"{plural(suite['runs'], 'warm run')} and {plural(suite['cli_runs'], 'whole-process run')} per "
                 "change; figures are the median (min-max)"],
        *[
            [f"merged: {', '.join(m['changes'])}",
             f"measured by `{m['command']}` at {m['started']} (UTC), commit `{m['commit']}`, "
             f"{plural(m['runs'], 'warm run')} and {plural(m['cli_runs'], 'whole-process run')} per change"]
            for m in suite.get("merged", [])
        ],
    ])
    lines += ["", "## Summary", ""]
    if results["changes"]:
        lines += summary_table(results)
        lines += [
            "",
            "Columns: *whole process* is the wall time of `rebalancer exchange` from start to exit (interpreter, "
            "imports, JVM start, the exchange, shutdown); *warm* is `run_exchange` in a session that has already run "
            "an exchange. Peak RSS is of the whole-process runs (the largest of the runs). Rows and bytes are what "
            "the exchange wrote (rows of the new version in every table, bytes of the data files added). "
            "*COPYs* are the data-bearing steps of the committed plan; *minimum* the ideal copies whose node owns no "
            "data (counted in SQL without the planner); *balance min* what a perfectly balanced placement moves: "
            "the copies a failed or leaving node held, or a joining node's fair share (see \"How measured\"). "
            "Makespans are the plan's simulated durations at the default cap "
            "(`migration.max_parallel_per_node`) under the cost model of docs/PLANNING.md, and *bound* is the lower "
            "bound of ours.",
            "",
        ]
    else:
        lines += ["No scenario was run.", ""]
    if measured(results):
        lines += ["## Where the time goes", "",
                  "Seconds per stage of the exchange (`ExchangeSummary.stage_seconds`, the CLI's `seconds by stage` "
                  "line), median of the runs, and the share of the median wall time. *Outside the stages*: for a warm "
                  "run, Python between the stages; for the whole process, interpreter start, imports, starting Spark "
                  "and shutdown.", "", *stage_tables(results)]
    caps = cap_rows(results)
    if caps:
        lines += ["## Makespan against the per-node cap (M)", "",
                  "The plan each M exchange committed, rebuilt from its tables and scheduled by the three policies at "
                  "each cap (`migration.max_parallel_per_node`); the lower bound is that of ours. Serial runs one "
                  "step at a time, so the cap does not change it.", "",
                  *table(["change", "cap", "ours", "hazelcast", "serial", "lower bound", "ours / bound",
                          "hazelcast / ours"], caps), ""]
    for name, title, render_table, text in (
        ("migrations", "Hazelcast's scale-down in our cost model (`bench/migrations.py`)", migrations_table,
         "10 nodes, 20,000 partitions of 205 MB with 1 backup; the graceful scale-down keeps node9 alive as a "
         "supplier until its data has moved (docs/PLANNING.md explains the scenarios and the columns)."),
        ("affinity", "Ideal assignment stage (`bench/affinity.py`)", affinity_table,
         "The ideal-assignment stage in a warm local session beside its NumPy kernel on one core, 2 backups "
         "(docs/AFFINITY.md)."),
    ):
        entry = results.get(name)
        if not entry:
            continue
        lines += [f"## {title}", "", text, ""]
        if entry.get("reused_from"):
            lines += [f"> Not run by this suite run: taken from `{entry['reused_from']}` "
                      f"({entry['result'].get('date') or entry['result'].get('when') or 'undated'}).", ""]
        lines += render_table(entry["result"]) if entry.get("result") else ["**failed**: see the results file."]
        lines.append("")
    if images is not None and measured(results):
        rel = os.path.relpath(images, DOC.parent)
        lines += ["## Plots", "", f"![exchange time against replicas]({rel}/{TIME_PLOT})", ""]
        if caps:
            lines += [f"![M makespan against the per-node cap]({rel}/{CAP_PLOT})", ""]
    lines += HOW_MEASURED
    if measured(results):
        lines += ["Conditions of each change. The machine may be shared: CPU used by other work (from `/proc/stat`, "
                  "steal time included) makes the times upper bounds. The last column checks that the plan rebuilt "
                  "for the makespans is the committed one (same steps, same makespan by ours).", "",
                  *conditions_table(results), ""]
    lines += ["## Targets", "", *target_lines(results), ""]
    failed = [c for c in results["changes"] if not c.get("result")]
    if failed:
        lines += ["## Failed", "", *(f"- {c['key']}: `{c['error'].splitlines()[0]}`" for c in failed), ""]
    return "\n".join(lines)


HOW_MEASURED = [
    "## How measured",
    "",
    "- **One process per change.** `bench/suite.py` starts `bench/exchange.py` once per scenario change, so every "
    "change has its own JVM and its own memory figures. exchange.py generates the cluster with the CLI "
    "(`rebalancer --warehouse W [--conf C] generate --nodes ... --seed 20261121`), runs the first exchange (the "
    "initial joins) in its own session and keeps that warehouse as a snapshot. Changes of one scenario that start "
    "from the same cluster (M's scale-down and crash, L's two changes) share the snapshot; the later ones then run "
    "one untimed exchange of their change first, so that their warm session has also run an exchange.",
    "- **Each run** restores the snapshot and appends the change's event (`NODE_LEFT`, `NODE_JOINED` or "
    "`NODE_FAILED`, fixed time). *Whole process*: `rebalancer --warehouse W [--conf C] exchange` in a subprocess, "
    "timed from start to exit. *Warm*: `run_exchange` in exchange.py's session. Every run must commit the same "
    "version with the same counts, or the benchmark fails.",
    "- **Stages**: `ExchangeSummary.stage_seconds` (warm runs) and the CLI's `seconds by stage` line (whole "
    "process): the wall seconds of each stage of `rebalancer.exchange.job.STAGES`; each stage materialises its "
    "result before the next starts.",
    "- **Memory**: peak resident set (`VmHWM`) of the driver Python process, the Spark JVM and the Python workers, "
    "polled every 0.5 s; for the warm runs the peaks are reset before each run. The XXL target compares the sum of "
    "the three peaks (an upper bound of the tree's peak) with 24 GiB.",
    "- **Rows and bytes written**: rows of the new version in every versioned table plus the `exchanges` row, and "
    "the bytes of the data files each table gained.",
    "- **Minimum**: counted in Spark SQL over the committed tables, without the planner: ideal copies of the new "
    "version whose node holds no OWNING copy in the previous version's `partition_map` among the nodes alive now, "
    "for partitions with at least one such owner. **Balance minimum**: for a failure or a leave, the copies the node "
    "owned (each must be re-created somewhere); for a join, ceil(replicas / nodes), the new node's fair share (the "
    "affinity function may give it a few more or fewer).",
    "- **Replicas per node**: of the new `ideal_assignment`, over the alive server nodes.",
    "- **Makespans**: the plan is rebuilt from the committed tables of the new version with "
    "`planner.plan_migrations` and the latest reports, then scheduled with `rebalancer.planning.schedule` by "
    "`ours`, `hazelcast` (first-fit, copying from the primary) and `serial` (one step at a time); the bound is "
    "`lower_bound` of ours. Simulated under the cost model, so independent of the machine.",
    "- **Plots** (matplotlib): exchange wall time against replicas, log-log, one point per change (median, bars "
    "min-max), with the speed targets; M's makespans against the per-node cap, one panel per change.",
    "",
]


# ---------------------------------------------------------------------------------------------------------------
# The plots
# ---------------------------------------------------------------------------------------------------------------
def plot(results: dict[str, Any], images: Path) -> list[Path]:
    """The two PNGs (the cap plot only when some change has a cap sweep); returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    def log_axes(ax: Any, x_label: Any, y_label: Any) -> None:
        """Log-log axes labelled with plain numbers (1,000 and 2m05s rather than 10^3)."""
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(x_label))
        ax.yaxis.set_major_formatter(FuncFormatter(y_label))
        ax.yaxis.set_major_locator(FixedLocator(NICE_SECONDS))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)

    def seconds_label(value: float, _pos: Any) -> str:
        if value < 60:
            return f"{value:g}s"
        m, s = divmod(round(value), 60)
        return f"{m}m{s:02d}s" if s else f"{m}m"

    done = measured(results)
    if not done:
        return []
    images.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for mode, label, marker, color in (("cli", "whole process (`rebalancer exchange`)", "o", "tab:blue"),
                                       ("warm", "warm session (`run_exchange`)", "s", "tab:orange")):
        points = [(c["replicas"], c["result"]["summary"][mode]["wall_s"]) for c in done
                  if mode in c["result"]["summary"]]
        if not points:
            continue
        xs = [x for x, _ in points]
        ys = [s["median"] for _, s in points]
        err = [[s["median"] - s["min"] for _, s in points], [s["max"] - s["median"] for _, s in points]]
        ax.errorbar(xs, ys, yerr=err, fmt=marker, color=color, label=label.replace("`", ""), capsize=3, alpha=0.85)
    if not results["suite"].get("tiny"):
        target_x = {c["scenario"]: c["replicas"] for c in done}
        tx = [(target_x[s], t) for s, t in (("M", 15), ("XL", 60), ("XXL", 180)) if s in target_x]
        if tx:
            ax.scatter([x for x, _ in tx], [t for _, t in tx], marker="_", s=400, color="tab:red", linewidths=2,
                       label="target (whole process)")
    for scenario in SCENARIO_ORDER:  # the scenario's name above its highest point, each change's beside its own
        changes = [c for c in done if c["scenario"] == scenario]
        if not changes:
            continue
        top = max(s["wall_s"]["max"] for c in changes for s in c["result"]["summary"].values())
        ax.annotate(scenario, (changes[0]["replicas"], top), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=10, fontweight="bold")
        if len(changes) > 1:
            for c in changes:
                summary = c["result"]["summary"]
                y = (summary.get("cli") or summary["warm"])["wall_s"]["median"]
                ax.annotate(c["change"], (c["replicas"], y), textcoords="offset points", xytext=(7, -3),
                            fontsize=7, color="dimgray")
    log_axes(ax, lambda x, _pos: f"{x:,.0f}", seconds_label)
    xs = [c["replicas"] for c in done]
    ax.set_xlim(min(xs) / 2.5, max(xs) * 4)  # room for the labels
    low, high = ax.get_ylim()
    ax.set_ylim(low / 1.2, high * 1.35)
    ax.set_xlabel("replicas (partitions x (backups + 1))")
    ax.set_ylabel("wall time per exchange (median; bars: min-max)")
    title = "Exchange after one topology change: time against cluster size"
    ax.set_title(title + (" (TINY TRIAL SIZES)" if results["suite"].get("tiny") else ""), fontsize=11)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    path = images / TIME_PLOT
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    sweeps = [c for c in done if c["result"]["migrations"]["caps"]]
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(max(4.6 * len(sweeps), 7.5), 4.4), squeeze=False,
                                 sharey=True)
        for ax, c in zip(axes[0], sweeps, strict=True):
            caps = c["result"]["migrations"]["caps"]
            xs = [int(k) for k in caps]
            # hazelcast often ties with ours: hollow, larger markers keep both visible
            for key, label, style, extra in (
                ("serial_s", "serial", "-^", {}),
                ("hazelcast_s", "hazelcast", "-s", {"markersize": 9, "markerfacecolor": "none"}),
                ("ours_s", "ours", "-o", {"markersize": 4}),
                ("lower_bound_s", "lower bound", "--", {"color": "black", "linewidth": 1}),
            ):
                ax.plot(xs, [caps[k][key] for k in caps], style, label=label, **extra)
            log_axes(ax, lambda x, _pos: f"{x:g}", seconds_label)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
            ax.set_xlabel("per-node cap (max_parallel_per_node)")
            ax.set_title(f"{c['scenario']} {c['label']}", fontsize=10)
        axes[0][0].set_ylabel("simulated makespan, s")
        axes[0][0].legend(fontsize=9)
        title = "Makespan of the committed plan against the per-node cap"
        fig.suptitle(title + ("\n(TINY TRIAL SIZES)" if results["suite"].get("tiny") else ""), fontsize=11)
        fig.tight_layout()
        path = images / CAP_PLOT
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the M crash, 1 warm + 1 whole-process run; writes quick.json, prints the tables")
    parser.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=None,
                        metavar="NAMES", help="scenarios (S, M, L, XL, XXL), changes (M/crash), migrations, affinity")
    parser.add_argument("--runs", type=int, default=None, help="warm runs per change (default 3; 1 with --quick)")
    parser.add_argument("--cli-runs", type=int, default=None,
                        help="whole-process runs per change (default: --runs; 1 with --quick)")
    parser.add_argument("--profile", action="store_true", help="add exchange.py's instrumented run to each change")
    parser.add_argument("--tiny", action="store_true",
                        help="try the suite out: M, L, XL, XXL at a few hundred partitions (marked as such)")
    parser.add_argument("--migrations-from", type=Path, default=None, metavar="FILE",
                        help="use this bench/migrations.py result instead of running it")
    parser.add_argument("--affinity-from", type=Path, default=None, metavar="FILE",
                        help="use this bench/affinity.py result instead of running it")
    parser.add_argument("--from-results", nargs="?", type=Path, const=RESULTS / "latest.json", default=None,
                        metavar="FILE", help="only regenerate the page and plots from FILE (default latest.json)")
    parser.add_argument("--merge", nargs="+", type=Path, default=[], metavar="FILE",
                        help="with --from-results: add the changes of these results files (same key: theirs win); "
                        "the page names each file's command and date")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default latest.json / quick.json; with --from-results: where to save the "
                        "results with the sections added by --migrations-from / --affinity-from)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to write (default docs/BENCHMARKS.md)")
    parser.add_argument("--images", type=Path, default=IMAGES, help="where the plots go (default docs/images)")
    args = parser.parse_args()
    if args.from_results is not None:
        results = json.loads(args.from_results.read_text())
        if args.merge:
            results = merge(results, [json.loads(path.read_text()) for path in args.merge])
        for name, reuse in (("migrations", args.migrations_from), ("affinity", args.affinity_from)):
            if reuse is not None:  # add or replace that benchmark's section
                results[name] = run_other(name, Path(), reuse)
        if args.out is not None:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    else:
        if args.quick:
            args.only = args.only or ["M/crash"]
        args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
        args.cli_runs = args.cli_runs if args.cli_runs is not None else (1 if args.quick else args.runs)
        args.out = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
        results = measure(args)
    if args.quick and args.from_results is None:
        print(render(results, None, shown(args.out)))
    else:
        written = plot(results, args.images)
        source = args.out or args.from_results
        source_name = shown(source)
        args.doc.write_text(render(results, args.images if written else None, source_name) + "\n")
        for path in (args.doc, *written):
            log(f"wrote {shown(path)}")
    failed = [c["key"] for c in results["changes"] if not c.get("result")]
    failed += [name for name in OTHER_BENCHMARKS if (results.get(name) or {}).get("error")]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (see the results file)")


if __name__ == "__main__":
    main()
