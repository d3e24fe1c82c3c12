"""Benchmark suite: every scenario of docs/BENCHMARKS.md, one results file, one generated page, two plots.

What runs (``make bench``):

- Every *scenario change* below as its own ``bench/exchange.py`` subprocess, so that each has a fresh JVM and its
  own memory figures. exchange.py generates the cluster with the ``rebalancer generate`` CLI (fixed seed), runs the
  first exchange, then times ``--runs`` whole-process ``rebalancer exchange`` runs (each beside a whole-process
  ``rebalancer sql "SELECT 1"``) and as many ``run_exchange`` runs in its warm session, each after restoring the
  post-first-exchange warehouse and appending the change's event; stage seconds and Spark job counts are read as
  data (the committed ``exchanges`` row, ``ExchangeSummary``); then it counts migrations against their minimum
  and re-schedules the committed plan by three policies (its docstring has the details). Changes of one scenario
  that start from the same cluster share it (``--save-pristine`` / ``--pristine``).

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

  For M, the committed plan is also scheduled at per-node caps 1, 2, 5, 10 and 20.
- ``bench/migrations.py`` (Hazelcast's scenario planned by the kernel, pure Python), ``bench/affinity.py`` (the
  ideal-assignment stage) and ``demo`` (the whole process ``rebalancer demo``, what ``make demo`` runs after the
  install, in a temporary directory), each in its own subprocess.

Everything lands in ``bench/results/latest.json``; the page ``docs/BENCHMARKS.md`` and the plots
``docs/images/bench-*.png`` are generated from it (``--from-results`` regenerates them without measuring). The page
puts the figures of ``--before`` (default ``bench/results/before-kernel.json``: the results of the multi-stage
exchange the one-pass kernel replaced) beside the new ones, for the changes measured at the same size, and judges
the performance targets (:data:`WHOLE_PROCESS_S` and the constants after it: met / not met). ``--notes FILE``
(default ``bench/results/targets-notes.md`` when it exists) is Markdown put under the targets table: what would
meet the targets not met.

``--quick`` (``make bench-quick``) runs the M crash with the M cap sweep, one warm and one whole-process run, writes
``bench/results/quick.json`` and prints the page; it leaves latest.json, the page and the plots alone.

Options: ``--only S,M`` (scenario names, ``M/crash`` for one change, ``migrations``, ``affinity``, ``demo``),
``--runs``, ``--cli-runs``, ``--tiny`` (for trying the suite out: M, L, XL and XXL shrunk to a few hundred
partitions, a small demo; the results and the page say so), ``--migrations-from FILE`` / ``--affinity-from FILE``
(take that benchmark's results from an earlier run), ``--merge FILE...`` (with ``--from-results``: add the
changes of other results files).

Run from the repository root: ``.venv/bin/python bench/suite.py [--quick]``. This script itself imports neither
Spark nor the package: it only starts the benchmarks and formats their results (matplotlib for the plots).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
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
sys.path.insert(0, str(REPO))  # the bench package (bench/repo.py)

from bench.repo import git  # noqa: E402

RESULTS = REPO / "bench" / "results"
BEFORE = RESULTS / "before-kernel.json"
NOTES = RESULTS / "targets-notes.md"
# Sections measured outside this suite, kept as Markdown and appended to the page as they are (bench/scale.py,
# bench/schedule.py, bench/what_if.py, bench/retention.py, bench/exchange.py on both engines).
HAND_SECTIONS = (RESULTS / "scale-section.md", RESULTS / "schedule-section.md", RESULTS / "what-if-section.md",
                 RESULTS / "retention-section.md", RESULTS / "engines-section.md")
DOC = REPO / "docs" / "BENCHMARKS.md"
IMAGES = REPO / "docs" / "images"
TIME_PLOT = "bench-time-vs-replicas.png"
CAP_PLOT = "bench-makespan-vs-cap.png"
HAZELCAST_CONF = "bench/conf/hazelcast.toml"
DELTA_RS_CONF = "bench/conf/delta-rs.toml"  # the kernel targets are measured on delta-rs (auto: delta-spark)
SEED = 20_261_121
CAPS = (1, 2, 5, 10, 20)
SCENARIO_ORDER = ("S", "M", "L", "XL", "XXL")
NICE_SECONDS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800, 3600, 7200)
OTHER_BENCHMARKS = ("migrations", "affinity", "balance", "demo")
GIB = 2**30
#: The performance targets the page judges (met / not met): whole-process and warm seconds per scenario, jobs per
#: exchange, memory, the demo.
WHOLE_PROCESS_S = {"S": 8.0, "M": 12.0, "XL": 30.0, "XXL": 90.0}
WARM_S = {"S": 1.5, "M": 3.0}
SELECT1_FACTOR = 2.0  # M: at most twice a `rebalancer sql "SELECT 1"` process of the same run
XXL_PEAK_GIB = 6.0
MAX_JOBS = 12
DEMO_S = 90.0


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
    conf: str | None = DELTA_RS_CONF
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


def run_logged(cmd: list[str], log_path: Path, cwd: Path = REPO) -> tuple[int, float, str]:
    """Run ``cmd`` (from the repository root by default), its stderr shown as it comes (progress) and both streams
    kept in ``log_path``; returns the exit code, the wall seconds and the last lines of stderr."""
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=25)
    with open(log_path, "w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.PIPE, text=True)
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
    if c.base in pristine:
        cmd += ["--pristine", str(pristine[c.base])]
    elif c.base in shared:
        pristine[c.base] = work / f"pristine-{len(pristine)}"
        cmd += ["--save-pristine", str(pristine[c.base])]
    return cmd


def run_changes(changes: list[Change], args: argparse.Namespace, work: Path, save: Any) -> list[dict[str, Any]]:
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


def reused(args: argparse.Namespace) -> dict[str, Path | None]:
    """The other benchmarks whose results may be given instead of run (``--<name>-from FILE``)."""
    return {"migrations": args.migrations_from, "affinity": args.affinity_from, "balance": args.balance_from}


def run_other(name: str, work: Path, reuse: Path | None, tiny: bool) -> dict[str, Any]:
    """bench/migrations.py, bench/affinity.py or the demo in a subprocess (or an earlier result file of it)."""
    if reuse is not None:
        return {"command": None, "reused_from": str(reuse), "result": json.loads(reuse.read_text()), "error": None}
    if name == "demo":
        return run_demo(work, tiny)
    out = work / f"{name}.json"
    cmd = [sys.executable, f"bench/{name}.py", "--out", str(out)] + (["--tiny"] if tiny else [])
    log(f"{name}: {shlex.join(['python', *cmd[1:]])}")
    code, seconds, tail = run_logged(cmd, work / f"{name}.log")
    ok = code == 0 and out.exists()
    log(f"{name}: {seconds:.0f} s" + ("" if ok else f" FAILED (exit code {code})"))
    return {"command": shlex.join(["python", *cmd[1:]]), "seconds": seconds, "reused_from": None,
            "result": json.loads(out.read_text()) if ok else None,
            "error": None if ok else f"exit code {code}; last lines of stderr:\n{tail}"}


def run_demo(work: Path, tiny: bool) -> dict[str, Any]:
    """The whole process ``rebalancer demo`` (what ``make demo`` runs once installed) in a fresh directory."""
    home = work / "demo"
    home.mkdir()
    cmd = [str(Path(sys.executable).with_name("rebalancer")), "--warehouse", str(home / "warehouse"), "demo",
           "--report-dir", str(home / "report")]
    if tiny:
        cmd += ["--nodes", "4", "--groups", "1", "--partitions", "16"]
    log(f"demo: {shlex.join(cmd)}")
    code, seconds, tail = run_logged(cmd, work / "demo.log", cwd=home)
    log(f"demo: {seconds:.0f} s" + ("" if code == 0 else f" FAILED (exit code {code})"))
    return {"command": shlex.join(["rebalancer", *cmd[1:]]), "seconds": seconds, "reused_from": None,
            "result": {"wall_s": seconds, "tiny": tiny} if code == 0 else None,
            "error": None if code == 0 else f"exit code {code}; last lines of stderr:\n{tail}"}


def shown(path: Path) -> str:
    """A path relative to the repository root when it is inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


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
    others += [name for name, given in reused(args).items() if given is not None and name not in others]
    started = time.time()
    results: dict[str, Any] = {
        "suite": {
            "mode": "quick" if args.quick else "full", "tiny": args.tiny,
            "command": shlex.join([".venv/bin/python", "bench/suite.py", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "finished": None, "seconds": None, "runs": args.runs, "cli_runs": args.cli_runs, "only": args.only,
        },
        "machine": machine_facts(),
        "code": {"commit": git("rev-parse", "--short", "HEAD"),
                 "uncommitted_changes": git("status", "--porcelain").splitlines()},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "changes": [],
        **dict.fromkeys(OTHER_BENCHMARKS),
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
            reuse = reused(args).get(name)
            results[name] = run_other(name, work, reuse, args.tiny)
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


def spread_text(s: dict[str, Any] | None, unit: str = " s") -> str:
    """``median (min-max)``, or ``median (n runs)`` when every run gave the same figure."""
    if not s:
        return "-"
    if s["min"] == s["max"]:
        n = len(s["runs"])
        return f"{s['median']:,.1f}{unit} ({n} run{'s' if n != 1 else ''})"
    return f"{s['median']:,.1f}{unit} ({s['min']:,.1f}-{s['max']:,.1f})"


def count_text(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:,.0f}" if s["min"] == s["max"] else f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


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


def mode(c: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The summary of one mode (``cli``, ``select1``, ``warm``) of a measured change, None when not run."""
    return c["result"]["summary"].get(name) if c.get("result") else None


def median(c: dict[str, Any] | None, name: str, key: str = "wall_s") -> float | None:
    s = mode(c, name) if c else None
    return s[key]["median"] if s and s.get(key) else None


def peak_gib(c: dict[str, Any] | None) -> float | None:
    """The largest sum of the driver, JVM and Python workers' peaks over the whole-process runs (warm if none)."""
    for name in ("cli", "warm"):
        s = mode(c, name) if c else None
        if s:
            return s["peak_rss_sum_mb"]["max"] / 1024
    return None


def most_jobs(c: dict[str, Any]) -> int | None:
    """The most Spark jobs any run of the change started for its exchange (whole process or warm)."""
    counts = [s["spark_jobs"]["max"] for name in ("cli", "warm") if (s := mode(c, name)) and s.get("spark_jobs")]
    return max(counts) if counts else None


class Before:
    """The results of ``--before`` (today's figures), by change key, for the changes measured at the same size."""

    def __init__(self, results: dict[str, Any] | None, source: str | None) -> None:
        self.results, self.source = results, source
        self.changes = {c["key"]: c for c in (results or {}).get("changes", []) if c.get("result")}

    def of(self, c: dict[str, Any]) -> dict[str, Any] | None:
        old = self.changes.get(c["key"])
        return old if old and old["replicas"] == c["replicas"] else None

    def jobs(self, c: dict[str, Any]) -> int | None:
        """The earlier benchmark's count: job ids the warm session allocated during the exchange (median)."""
        s = mode(old, "warm") if (old := self.of(c)) else None
        return round(s["spark_jobs"]["median"]) if s and s.get("spark_jobs") else None


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------
def time_table(results: dict[str, Any], before: Before) -> list[str]:
    rows = []
    for c in results["changes"]:
        if not c.get("result"):
            rows.append([c["scenario"], c["label"], f"{c['replicas']:,}", "**failed**: see the results file",
                         *["-"] * 9])
            continue
        old = before.of(c)
        rows.append([
            c["scenario"], c["label"], f"{c['replicas']:,}",
            secs(median(old, "cli")), spread_text(mode(c, "cli")["wall_s"]) if mode(c, "cli") else "-",
            secs(median(old, "warm")), spread_text(mode(c, "warm")["wall_s"]) if mode(c, "warm") else "-",
            spread_text(mode(c, "select1")["wall_s"]) if mode(c, "select1") else "-",
            f"{before.jobs(c):,}" if before.jobs(c) is not None else "-",
            count_text((mode(c, "cli") or {}).get("spark_jobs")), count_text((mode(c, "warm") or {}).get("spark_jobs")),
            f"{peak_gib(old):.2f}" if peak_gib(old) is not None else "-",
            f"{peak_gib(c):.2f}" if peak_gib(c) is not None else "-",
        ])
    return table(["scenario", "change", "replicas", "whole process: before", "whole process, s: after",
                  "warm: before", "warm, s: after", '`sql "SELECT 1"` process, s', "Spark jobs: before (warm)",
                  "Spark jobs: whole process", "Spark jobs: warm", "peak RSS, GiB: before", "peak RSS, GiB: after"],
                 rows)


def work_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for c in measured(results):
        r = c["result"]
        mig = r["migrations"]
        mk, per_node = mig["makespan"], mig["replicas_per_node"]
        recomputed = {run["warm"].get("recomputed_partitions") for run in r["runs"] if "warm" in run}
        rows.append([
            c["scenario"], c["label"], f"{r['exchange']['partitions']:,}",
            ", ".join(f"{x:,}" for x in sorted(x for x in recomputed if x is not None)) or "-",
            f"{r['rows_written_total']:,}", size(r["bytes_written_total"]),
            f"{mig['copies']:,} / {mig['minimum_copies']:,} / {mig['balance_minimum']:,}",
            f"{per_node['max']:,} / {per_node['mean']:,.1f} / {per_node['min']:,}",
            f"{secs(mk['portfolio_s'])} / {secs(mk['hazelcast_s'])} / {secs(mk['serial_s'])} / "
            f"{secs(mk['lower_bound_s'])}",
        ])
    return table(["scenario", "change", "partitions", "recomputed (warm)", "rows written", "bytes written",
                  "COPYs / minimum / balance min", "replicas per node max / mean / min",
                  "makespan portfolio / hazelcast / serial / bound"], rows)


def stage_tables(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for scenario in SCENARIO_ORDER:
        changes = [c for c in measured(results) if c["scenario"] == scenario]
        if not changes:
            continue
        header, columns = ["stage"], []
        for c in changes:
            for name, title in (("warm", "warm"), ("cli", "whole process")):
                if (s := mode(c, name)) is not None:
                    header.append(f"{c['change']}: {title}")
                    columns.append((c, name, s))
        order = [n for c in changes for n in c["result"].get("stages", [])]
        order += [n for _, _, s in columns for n in s["stage_s"]]
        rows = []
        for stage in dict.fromkeys(order):
            cells = []
            for _, _name, s in columns:
                seconds, jobs = s["stage_s"].get(stage, {}).get("median"), s.get("stage_jobs", {}).get(stage)
                if seconds is None:
                    cells.append("-")
                    continue
                cell = f"{seconds:.2f} s ({seconds / s['wall_s']['median']:.0%})"
                cells.append(cell + (f", {jobs['median']:g} jobs" if jobs and jobs["median"] else ""))
            rows.append([stage, *cells])

        def extra(label: str, key: str, cols: list[Any] = columns) -> list[str]:
            return [label, *(f"{s[key]['median']:.2f} s" if key in s else "-" for _, _, s in cols)]

        rows += [extra("outside the stages", "outside_stages_s"),
                 extra("&nbsp;&nbsp;of which startup: interpreter, imports, Spark", "startup_s"),
                 extra("&nbsp;&nbsp;of which after `finished_at`: commit, shutdown", "after_s"),
                 ["Spark jobs", *(count_text(s.get("spark_jobs")) for _, _, s in columns)],
                 ["**wall (median)**", *(f"**{s['wall_s']['median']:.2f} s**" for _, _, s in columns)]]
        replicas = changes[0]["result"]["cluster"]["replicas"]
        lines += [f"**{scenario}** ({replicas:,} replicas)", "", *table(header, rows), ""]
        for c in changes:
            if sites := (mode(c, "warm") or {}).get("spark_job_sites"):
                lines += [f"Spark jobs of {c['change']}'s last warm run by Spark's call site: "
                          + ", ".join(f"`{k}` x{v}" for k, v in sites.items()) + ".", ""]
    return lines


def cap_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in measured(results):
        for cap, m in c["result"]["migrations"]["caps"].items():
            rows.append([f"{c['scenario']} {c['label']}", cap, secs(m["portfolio_s"]), secs(m["hazelcast_s"]),
                         secs(m["serial_s"]), secs(m["lower_bound_s"]),
                         f"{m['portfolio_s'] / m['lower_bound_s']:.3f}" if m["lower_bound_s"] else "-",
                         f"{m['hazelcast_s'] / m['portfolio_s']:.2f}x" if m["portfolio_s"] else "-"])
    return rows


def migrations_table(data: dict[str, Any]) -> list[str]:
    cluster = data.get("cluster", {})
    rows = []
    for r in data["scenarios"]:
        for cap, c in r["caps"].items():
            rows.append([
                r["scenario"], cap, f"{r['copies']:,} ({r['minimum_copies']:,})", f"{r['promotes']:,} / {r['drops']:,}",
                f"{r['bytes_moved'] / 1e12:.2f}", secs(c["portfolio_makespan_s"]), secs(c["lower_bound_s"]),
                f"{c['portfolio_over_bound']:.3f}", secs(c["hazelcast_makespan_s"]),
                f"{c['hazelcast_over_portfolio']:.1f}x", secs(c["serial_makespan_s"]),
            ])
    return [f"{cluster.get('nodes', 10)} nodes, {cluster.get('partitions', 20_000):,} partitions of "
            f"{cluster.get('partition_bytes', 205e6) / 1e6:,.0f} MB with {cluster.get('backups', 1)} backup, planned "
            f"by {data.get('planned_by', 'the planner (Spark)')}.", "",
            *table(["scenario", "cap", "data-bearing copies (minimum)", "promotes / drops", "TB moved", "portfolio",
                    "lower bound", "portfolio / bound", "hazelcast", "hazelcast / portfolio", "serial"], rows)]


def balance_table(data: dict[str, Any]) -> list[str]:
    def moved(count: int, minimum: int) -> str:
        return f"{count:,} / {minimum:,} ({100 * (count - minimum) / minimum:+.1f} %)" if minimum else f"{count:,} / 0"

    rows = []
    for r in data["rows"]:
        e = r["after_failure"]
        rows.append([r["scenario"], r["affinity"], f"{e['replicas_max']:,} / {e['replicas_mean']:,.1f} / "
                     f"{e['replicas_min']:,} ({e['replicas_ratio']:.3f})", f"{e['primaries_max']:,} / "
                     f"{e['primaries_mean']:,.1f} / {e['primaries_min']:,} ({e['primaries_ratio']:.3f})",
                     moved(r["failure_moved"], r["failure_minimum"]), moved(r["join_moved"], r["join_minimum"]),
                     f"{r['seconds']:.2f} s ({r['seconds_min']:.2f} s)",
                     f"{r['continue_seconds']:.2f} s" if r.get("continue_seconds") is not None else "-"])
    rel = os.path.relpath(IMAGES / "balance-affinities.png", DOC.parent)
    return [f"Measured {data.get('date', 'undated')}: {data.get('machine', '')}; {data.get('versions', '')}.", "",
            *table(["scenario", "affinity", "replicas per node after the failure: max / mean / min (max/mean)",
                    "primaries: max / mean / min (max/mean)", "failure: copies moved / minimum",
                    "join: copies moved / minimum", "ranking time, median (min)",
                    "after the failure, continuing from before (balanced)"], rows),
            "", f"![evenness and movement of rendezvous, ignite and balanced]({rel})"]


def affinity_table(data: dict[str, Any]) -> list[str]:
    rows = [[f"{r['partitions']:,} x {r['nodes']:,}", r["affinity"], f"{r['output_rows']:,}",
             f"{r['spark_median_s']:.2f} s", f"{r['kernel_one_core_median_s']:.4f} s"] for r in data["results"]]
    runs = max((len(r.get("spark_runs_s", [])) for r in data["results"]), default=3)
    return table(["partitions x nodes", "affinity", "replicas", f"Spark stage, local[*] (median of {runs})",
                  "NumPy kernel, 1 core, no Spark"], rows)


def demo_table(data: dict[str, Any]) -> list[str]:
    return table(["command", "wall"], [["`rebalancer demo`" + (" (tiny: 4 nodes, 1 x 16)" if data.get("tiny") else ""),
                                        secs(data["wall_s"])]])


def largest_parts(c: dict[str, Any], name: str) -> str:
    """Where a change's time went in one mode: startup and the three longest stages (with their jobs, warm)."""
    s = mode(c, name)
    if not s:
        return "-"
    warm = mode(c, "warm") or {}
    parts = [(f"startup {secs(s['startup_s']['median'])}", s["startup_s"]["median"])] if "startup_s" in s else []
    for stage, x in s["stage_s"].items():
        jobs = warm.get("stage_jobs", {}).get(stage, {}).get("median")
        parts.append((f"{stage} {secs(x['median'])}" + (f" ({jobs:g} jobs)" if jobs else ""), x["median"]))
    return ", ".join(p for p, _ in sorted(parts, key=lambda p: -p[1])[:4])


def target_rows(results: dict[str, Any], before: Before) -> list[list[str]]:
    """The performance targets: before, after, met or not, and for one not met the largest parts of the time."""
    done = measured(results)
    by: dict[str, list[dict[str, Any]]] = {}
    for c in done:
        by.setdefault(c["scenario"], []).append(c)
    rows: list[list[str]] = []

    def verdict(ok: bool | None) -> str:
        return "not measured in this run" if ok is None else ("**met**" if ok else "**not met**")

    def per_change(changes: list[dict[str, Any]], value: Any, fmt: Any = secs, name: str = "change") -> str:
        return "; ".join(f"{c[name]} {fmt(v)}" for c in changes if (v := value(c)) is not None) or "-"

    for scenario, limit in WHOLE_PROCESS_S.items():
        changes = [c for c in by.get(scenario, []) if mode(c, "cli")]
        ok = all(median(c, "cli") <= limit for c in changes) if changes else None
        worst = max(changes, key=lambda c: median(c, "cli") or 0.0) if changes else None
        rows.append([f"{scenario}: whole process `rebalancer exchange` <= {secs(limit)}" +
                     (", each change" if len(changes) > 1 else ""),
                     per_change(by.get(scenario, []), lambda c: median(before.of(c), "cli")),
                     per_change(changes, lambda c: median(c, "cli")), verdict(ok),
                     largest_parts(worst, "cli") if worst and not ok else ""])
        if scenario == "M":
            ratio = [c for c in changes if mode(c, "select1")]
            ok = all(median(c, "cli") <= SELECT1_FACTOR * median(c, "select1") for c in ratio) if ratio else None
            rows.append([f'M: whole process <= {SELECT1_FACTOR:g}x a `rebalancer sql "SELECT 1"` process of the same '
                         "run", "-",
                         per_change(ratio, lambda c: median(c, "cli") / median(c, "select1"), lambda v: f"{v:.1f}x") +
                         ("" if not ratio else f" (SELECT 1: {secs(median(ratio[0], 'select1'))})"), verdict(ok), ""])
    xxl = by.get("XXL", [])
    peak_ok = all(peak_gib(c) <= XXL_PEAK_GIB for c in xxl) if xxl else None
    rows.append([f"XXL: peak RSS of all processes <= {XXL_PEAK_GIB:g} GiB (sum of the driver's, JVM's and Python "
                 "workers' peaks)", per_change(xxl, lambda c: peak_gib(before.of(c)), lambda v: f"{v:.1f} GiB"),
                 per_change(xxl, peak_gib, lambda v: f"{v:.1f} GiB"), verdict(peak_ok), ""])
    for scenario, limit in WARM_S.items():
        changes = [c for c in by.get(scenario, []) if mode(c, "warm")]
        ok = all(median(c, "warm") <= limit for c in changes) if changes else None
        worst = max(changes, key=lambda c: median(c, "warm") or 0.0) if changes else None
        rows.append([f"{scenario}: warm `run_exchange` (a session that has run one exchange) <= {secs(limit)}",
                     per_change(by.get(scenario, []), lambda c: median(before.of(c), "warm")),
                     per_change(changes, lambda c: median(c, "warm")), verdict(ok),
                     largest_parts(worst, "warm") if worst and not ok else ""])
    demo = (results.get("demo") or {}).get("result")
    rows.append([f"`make demo` after the install <= {secs(DEMO_S)}", "-", secs(demo["wall_s"]) if demo else "-",
                 verdict(demo["wall_s"] <= DEMO_S if demo else None), ""])
    jobs = [(c, j) for c in done if (j := most_jobs(c)) is not None]
    ok = all(j <= MAX_JOBS for _, j in jobs) if jobs else None
    worst_jobs = max(jobs, key=lambda x: x[1])[0] if jobs else None
    warm_of_worst = (mode(worst_jobs, "warm") or {}) if worst_jobs else {}
    stage_jobs, sites = warm_of_worst.get("stage_jobs", {}), warm_of_worst.get("spark_job_sites", {})
    rows.append([f"Spark jobs per data-affecting exchange <= {MAX_JOBS} (every change, whole process and warm)",
                 f"{max(j for c in done if (j := before.jobs(c)) is not None):,} (warm, most)"
                 if any(before.jobs(c) is not None for c in done) else "-",
                 per_change([c for c, _ in jobs], most_jobs, lambda v: f"{v:,}", "key"), verdict(ok),
                 ", ".join(f"{k} {v['median']:g}" for k, v in
                           sorted(stage_jobs.items(), key=lambda kv: -kv[1]["median"]) if v["median"])
                 + ("; by call site: " + ", ".join(f"`{k}` x{v}" for k, v in list(sites.items())[:3]) if sites else "")
                 if worst_jobs and not ok else ""])
    if results["suite"].get("tiny"):
        rows = [[r[0], r[1], r[2], "not applicable: tiny trial sizes", r[4]] for r in rows]
    return rows


def conditions_table(results: dict[str, Any]) -> list[str]:
    rows = []
    for c in measured(results):
        r = c["result"]
        cli = mode(c, "cli")
        load = r["load_average"]["during_timed_runs_1min"] or {}
        warm = mode(c, "warm") or {}
        seen = warm.get("spark_jobs_seen")
        rows.append([c["key"], f"{load.get('mean', '-')} (max {load.get('max', '-')})",
                     spread_text(cli["other_work_core_s"], "") if cli else "-",
                     spread_text(cli["tree_cpu_s"], "") if cli else "-", secs(c["seconds"]),
                     "yes" if seen and seen == warm.get("spark_jobs") else f"**no**: {count_text(seen)} seen",
                     "yes" if r["migrations"].get("rescheduled_matches_committed") else "**no**"])
    return table(["change", "load average (1 min) during the timed runs", "core-s used by other work during a "
                  "whole-process run", "core-s used by the whole process", "benchmark process, all included",
                  "engine's job count = jobs the status store saw (warm)", "committed plan re-scheduled = committed "
                  "makespan"], rows)


def merge(results: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """``results`` with the changes of ``others`` added (a change measured again replaces the earlier one), in the
    order of :func:`scenario_changes`; each other run's suite facts are kept under ``suite.merged``."""
    changes = {c["key"]: c for c in results["changes"]}
    merged = list(results["suite"].get("merged", []))
    for other in others:
        changes.update({c["key"]: c for c in other["changes"]})
        merged.append({**{k: other["suite"].get(k) for k in ("command", "started", "seconds", "runs", "cli_runs")},
                       "changes": [c["key"] for c in other["changes"]], "commit": other["code"].get("commit")})
        for name in OTHER_BENCHMARKS:  # a benchmark the other run measured itself (not --*-from) replaces ours
            theirs = other.get(name) or {}
            if theirs.get("result") and (not (results.get(name) or {}).get("result")
                                         or not theirs.get("reused_from")):
                results = {**results, name: theirs}
    order = {c.key: i for i, c in enumerate(scenario_changes(results["suite"].get("tiny", False)))}
    out = dict(results)
    out["changes"] = sorted(changes.values(), key=lambda c: order.get(c["key"], len(order)))
    out["suite"] = {**results["suite"], "merged": merged}
    return out


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
    "timed from start to exit; beside it, in the same round, the whole process `rebalancer --warehouse W sql "
    "\"SELECT 1\"`. *Warm*: `run_exchange` in exchange.py's session. Every run must commit the same version with "
    "the same counts, or the benchmark fails.",
    "- **Stages and Spark jobs are read as data**, never from printed text: the whole process's from the `exchanges` "
    "row it committed (`stage_seconds`, `spark_jobs`; the row is written inside the `commit` stage, so it has no "
    "seconds for that stage), its startup and its tail from the row's `started_at` / `finished_at` against the "
    "process's launch and exit; the warm run's from `ExchangeSummary` (`stage_seconds`, `stage_jobs`, "
    "`spark_jobs`). The engine counts the jobs of its job group with Spark's status tracker; the warm runs check "
    "that count against every job the session's status store lists once the listener bus is drained (conditions "
    "table). *Before*: the figures of " + "{before}" + ", measured by the benchmark of the multi-stage exchange; "
    "its job counts are the job ids a warm session allocated during the exchange.",
    "- **Memory**: peak resident set (`VmHWM`) of the driver Python process, the Spark JVM and the Python workers, "
    "polled every 0.5 s; for the warm runs the peaks are reset before each run. The XXL target compares the sum of "
    "the three peaks (an upper bound of the tree's peak) with the limit.",
    "- **Rows and bytes written**: rows of the new version in every versioned table plus the `exchanges` row, and "
    "the bytes of the data files each table gained.",
    "- **Minimum**: counted in Spark SQL over the committed tables, without the engine's plan: ideal copies of the "
    "new version whose node holds no OWNING copy in the previous version's `partition_map` among the nodes alive "
    "now, for partitions with at least one such owner. **Balance minimum**: for a failure or a leave, the copies the "
    "node owned (each must be re-created somewhere); for a join, ceil(replicas / nodes), the new node's fair share.",
    "- **Replicas per node**: of the new `ideal_assignment`, over the alive server nodes.",
    "- **Makespans**: the committed `migration_plan` (which keeps each COPY's `candidates`, the `primary_node`, "
    "`owners` and `replicas`) re-scheduled as it is with `rebalancer.planning.schedule` by `portfolio`, `hazelcast` "
    "(first-fit, copying from the primary) and `serial` (one step at a time); the bound is `lower_bound` of portfolio. "
    "Simulated under the cost model, so independent of the machine.",
    "- **Demo**: the whole process `rebalancer --warehouse W demo --report-dir R` (what `make demo` runs once the "
    "install is done) in a fresh directory.",
    "- **Plots** (matplotlib): exchange wall time against replicas, log-log, one point per change (median, bars "
    "min-max), before and after, with the whole-process targets; M's makespans against the per-node cap.",
    "",
]


def render(results: dict[str, Any], images: Path | None, source: str, before: Before, notes: str | None) -> str:
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
        ["before", f"`{before.source}`: " + (f"`{before.results['suite']['command']}` at "
                                              f"{before.results['suite']['started']} (UTC), commit "
                                              f"`{before.results['code']['commit']}`" if before.results else
                                              "not found")],
        *[
            [f"merged: {', '.join(m['changes'])}",
             f"measured by `{m['command']}` at {m['started']} (UTC), commit `{m['commit']}`, "
             f"{plural(m['runs'], 'warm run')} and {plural(m['cli_runs'], 'whole-process run')} per change"]
            for m in suite.get("merged", [])
        ],
    ])
    lines += ["", "## Targets", "",
              "Before: the figures of the multi-stage exchange (`before` above); after: this run. *Largest parts* "
              "name where the time (or the jobs) went in the slowest change of a target not met.", "",
              *table(["target", "before", "after (median)", "result", "largest parts (after)"],
                     target_rows(results, before)), ""]
    if notes:
        lines += [notes.strip(), ""]
    lines += ["## Summary", ""]
    if results["changes"]:
        lines += [*time_table(results, before), "",
                  "*Whole process*: `rebalancer exchange` from start to exit (interpreter, imports, JVM start, the "
                  "exchange, shutdown); *warm*: `run_exchange` in a session that has already run an exchange; "
                  '`sql "SELECT 1"`: the whole process `rebalancer sql "SELECT 1"` on the same warehouse, the floor '
                  "of any command that starts Spark. *Spark jobs*: of the exchange, as the engine counted them. Peak "
                  "RSS: the sum of the driver's, the JVM's and the Python workers' peaks, largest of the "
                  "whole-process runs.", "",
                  *work_table(results), "",
                  "*Recomputed*: partitions the kernel decided (the others were carried over). Rows and bytes: what "
                  "the exchange wrote (rows of the new version in every table, bytes of the data files added). "
                  "*COPYs*: data-bearing steps of the committed plan; *minimum*: ideal copies whose node owns no data "
                  "(counted in SQL); *balance min*: the copies a failed or leaving node held, or a joining node's "
                  "fair share. Makespans: the committed plan at the default cap (`migration.max_parallel_per_node`) "
                  "under the cost model of docs/PLANNING.md; *bound* is the lower bound of portfolio.", ""]
    else:
        lines += ["No scenario was run.", ""]
    if measured(results):
        lines += ["## Where the time goes", "",
                  "Seconds per stage of `rebalancer.pipeline.STAGES` (warm: `ExchangeSummary.stage_seconds` and "
                  "`stage_jobs`; whole process: the committed row's `stage_seconds`), median of the runs, share of "
                  "the median wall time. *Outside the stages*: for a warm run, Python between the stages; for the "
                  "whole process, startup (interpreter, imports, Spark session), the commit of the `exchanges` row "
                  "and shutdown.", "", *stage_tables(results)]
    caps = cap_rows(results)
    if caps:
        lines += ["## Makespan against the per-node cap (M)", "",
                  "The plan each M exchange committed, re-scheduled by the three policies at each cap "
                  "(`migration.max_parallel_per_node`); the lower bound is that of portfolio. Serial runs one step "
                  "at a time, so the cap does not change it.", "",
                  *table(["change", "cap", "portfolio", "hazelcast", "serial", "lower bound", "portfolio / bound",
                          "hazelcast / portfolio"], caps), ""]
    for name, title, render_table, text in (
        ("migrations", "Hazelcast's scale-down in our cost model (`bench/migrations.py`)", migrations_table,
         "Hazelcast's cluster; the graceful scale-down keeps node9 alive as a supplier until its data has moved "
         "(docs/PLANNING.md explains the scenarios and the columns)."),
        ("affinity", "Ideal assignment stage (`bench/affinity.py`)", affinity_table,
         "The ideal-assignment stage in a warm local session beside its NumPy kernel on one core, 2 backups "
         "(docs/AFFINITY.md)."),
        ("balance", "Affinities side by side: evenness and movement (`bench/balance.py`)", balance_table,
         "The scenarios' clusters placed by `rendezvous`, `ignite` and `balanced` (spread and collocate), one failure "
         "(`node{N/2}`) and one join (`node{N}`) each, no Spark (`balanced` continues from the placement before the "
         "change, as the exchange does): replicas and primaries per node after the failure, copies moved against "
         "the minimum (the failed node's copies; the joiner's fair share), and the ranking time of the whole "
         "scenario on one core (docs/AFFINITY.md explains the algorithm and the bounds)."),
        ("demo", "The demo (`rebalancer demo`)", demo_table, "The whole process, as `make demo` runs it after the "
         "install."),
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
    lines += [x.replace("{before}", f"`{before.source}`") for x in HOW_MEASURED]
    if measured(results):
        lines += ["Conditions of each change. The machine may be shared: CPU used by other work (from `/proc/stat`, "
                  "steal time included) makes the times upper bounds.", "", *conditions_table(results), ""]
    failed = [c for c in results["changes"] if not c.get("result")]
    failed += [{"key": n, **results[n]} for n in OTHER_BENCHMARKS if (results.get(n) or {}).get("error")]
    if failed:
        lines += ["## Failed", "", *(f"- {c['key']}: `{c['error'].splitlines()[0]}`" for c in failed), ""]
    lines += [section.read_text().rstrip("\n") + "\n" for section in HAND_SECTIONS if section.exists()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The plots
# ---------------------------------------------------------------------------------------------------------------
def plot(results: dict[str, Any], images: Path, before: Before) -> list[Path]:
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
        ax.xaxis.set_minor_formatter(NullFormatter())
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
    olds = [(c, old) for c in done if (old := before.of(c)) is not None]
    for name, label, marker, color, changes in (
        ("cli", "before: whole process", "o", "silver", [old for _, old in olds]),
        ("warm", "before: warm session", "s", "silver", [old for _, old in olds]),
        ("cli", "whole process (rebalancer exchange)", "o", "tab:blue", done),
        ("warm", "warm session (run_exchange)", "s", "tab:orange", done),
    ):
        points = [(c["replicas"], s["wall_s"]) for c in changes if (s := mode(c, name))]
        if not points:
            continue
        xs = [x for x, _ in points]
        ys = [s["median"] for _, s in points]
        err = [[s["median"] - s["min"] for _, s in points], [s["max"] - s["median"] for _, s in points]]
        style = {"markerfacecolor": "none"} if color == "silver" else {}
        ax.errorbar(xs, ys, yerr=err, fmt=marker, color=color, label=label, capsize=3, alpha=0.85, **style)
    if not results["suite"].get("tiny"):
        target_x = {c["scenario"]: c["replicas"] for c in done}
        tx = [(target_x[s], t) for s, t in WHOLE_PROCESS_S.items() if s in target_x]
        if tx:
            ax.scatter([x for x, _ in tx], [t for _, t in tx], marker="_", s=400, color="tab:red", linewidths=2,
                       label="target (whole process)")
    for scenario in SCENARIO_ORDER:  # the scenario's name above its highest point, each change's beside its own
        changes = [c for c in done if c["scenario"] == scenario]
        if not changes:
            continue
        top = max(s["wall_s"]["max"] for c in changes for s in c["result"]["summary"].values())
        top = max([top] + [s["wall_s"]["max"] for c in changes if (old := before.of(c))
                           for s in old["result"]["summary"].values()])
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
    ax.legend(loc="best", fontsize=9)
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
            # hazelcast often ties with portfolio: hollow, larger markers keep both visible
            for key, label, style, extra in (
                ("serial_s", "serial", "-^", {}),
                ("hazelcast_s", "hazelcast", "-s", {"markersize": 9, "markerfacecolor": "none"}),
                ("portfolio_s", "portfolio", "-o", {"markersize": 4}),
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
                        help="the M crash, 1 warm + 1 whole-process run; writes quick.json, prints the page")
    parser.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=None,
                        metavar="NAMES",
                        help="scenarios (S, M, L, XL, XXL), changes (M/crash), migrations, affinity, demo")
    parser.add_argument("--runs", type=int, default=None, help="warm runs per change (default 3; 1 with --quick)")
    parser.add_argument("--cli-runs", type=int, default=None,
                        help="whole-process runs per change (default: --runs; 1 with --quick)")
    parser.add_argument("--tiny", action="store_true",
                        help="try the suite out: M, L, XL, XXL at a few hundred partitions (marked as such)")
    parser.add_argument("--migrations-from", type=Path, default=None, metavar="FILE",
                        help="use this bench/migrations.py result instead of running it")
    parser.add_argument("--affinity-from", type=Path, default=None, metavar="FILE",
                        help="use this bench/affinity.py result instead of running it")
    parser.add_argument("--balance-from", type=Path, default=None, metavar="FILE",
                        help="use this bench/balance.py result instead of running it")
    parser.add_argument("--from-results", nargs="?", type=Path, const=RESULTS / "latest.json", default=None,
                        metavar="FILE", help="only regenerate the page and plots from FILE (default latest.json)")
    parser.add_argument("--merge", nargs="+", type=Path, default=[], metavar="FILE",
                        help="with --from-results: add the changes of these results files (same key: theirs win); "
                        "the page names each file's command and date")
    parser.add_argument("--before", type=Path, default=BEFORE, metavar="FILE",
                        help="results to show as 'before' (default bench/results/before-kernel.json)")
    parser.add_argument("--notes", type=Path, default=NOTES if NOTES.exists() else None, metavar="FILE",
                        help="Markdown put under the targets table (default bench/results/targets-notes.md if any)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default latest.json / quick.json; with --from-results: where to save the "
                        "results with the sections added by --merge / --migrations-from / --affinity-from)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to write (default docs/BENCHMARKS.md)")
    parser.add_argument("--images", type=Path, default=IMAGES, help="where the plots go (default docs/images)")
    args = parser.parse_args()
    if args.from_results is not None:
        results = json.loads(args.from_results.read_text())
        if args.merge:
            results = merge(results, [json.loads(path.read_text()) for path in args.merge])
        for name, reuse in reused(args).items():
            if reuse is not None:  # add or replace that benchmark's section
                results[name] = run_other(name, Path(), reuse, False)
        if args.out is not None:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    else:
        if args.quick:
            args.only = args.only or ["M/crash"]
        args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
        args.cli_runs = args.cli_runs if args.cli_runs is not None else (1 if args.quick else args.runs)
        args.out = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
        results = measure(args)
    before = Before(json.loads(args.before.read_text()) if args.before.exists() else None, shown(args.before))
    notes = args.notes.read_text() if args.notes is not None else None
    if args.quick and args.from_results is None:
        print(render(results, None, shown(args.out), before, notes))
    else:
        written = plot(results, args.images, before)
        source = shown(args.out or args.from_results)
        args.doc.write_text(render(results, args.images if written else None, source, before, notes) + "\n")
        for path in (args.doc, *written):
            log(f"wrote {shown(path)}")
    failed = [c["key"] for c in results["changes"] if not c.get("result")]
    failed += [name for name in OTHER_BENCHMARKS if (results.get(name) or {}).get("error")]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (see the results file)")


if __name__ == "__main__":
    main()
