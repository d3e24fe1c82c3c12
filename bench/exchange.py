"""Benchmark: the partition map exchange after one topology change (one scenario change per invocation).

A scenario change is a cluster (``--nodes``, ``--groups``, ``--partitions-total``, ``--backups``, ``--seed``,
``--conf``) and one event (``--event NODE_FAILED|NODE_LEFT|NODE_JOINED``, ``--node``; ``--fail-node X`` is short for
``--event NODE_FAILED --node X``). Default: 100 nodes, 1 group x 65,536 partitions, 2 backups, ``node50`` fails.
``bench/suite.py`` runs every scenario of docs/BENCHMARKS.md through this script, one subprocess per change.

Setup (untimed): ``rebalancer --warehouse W [--conf C] generate ...`` (the CLI, in a subprocess, so the scenario is
exactly what the command generates) into a fresh warehouse; then the first exchange (the initial joins, all merged
into one version) in this process; the warehouse is kept aside as a pristine snapshot (``--save-pristine DIR`` also
copies it there, and ``--pristine DIR`` reuses such a copy instead of generating; the session then runs one untimed
exchange of the change instead of the first exchange, so that the warm runs always follow an exchange). Then, for
each of ``--runs`` rounds, in this order:

- ``cli`` (the first ``--cli-runs`` rounds, default all): restore the warehouse from the snapshot, append the event
  (``rebalancer.operations.append_event``, fixed event time), and time the whole process
  ``rebalancer --warehouse W exchange`` (subprocess wall time: interpreter start, imports, JVM start, the exchange,
  shutdown). The CLI's own lines split it into "starting Spark" and "running the exchange", and its
  ``seconds by stage:`` line into the stages of ``rebalancer.exchange.job.STAGES``.
- ``warm``: restore again, append the same event, and time ``run_exchange`` in this process, whose session is
  already started and has already run the first exchange. ``ExchangeSummary.stage_seconds`` gives the stages.

Both use the same settings (``--conf``, default: ``conf/default.toml``'s values: ``local[*]``, 8 shuffle
partitions, 4g driver) and the same storage engine. Every run must commit the same exchange with the same counts;
the script fails otherwise.

Memory is the peak resident set (``VmHWM`` in ``/proc/<pid>/status``) of the driver Python process, the Spark JVM
and the Python workers the JVM starts (``mapInArrow``); before each warm run the peaks of this process and its JVM
are reset (``/proc/<pid>/clear_refs``), so each figure belongs to one run. CPU seconds of the process tree and of
the whole machine (``/proc/stat``) are read around each run; the difference is what other work on the machine
used. The load average is sampled every 5 s.

After the timed rounds, from the committed tables of the last run (untimed):

- rows and bytes written: rows of the new version per table, data files and bytes each table gained;
- data-bearing migrations: COPY steps of the committed ``migration_plan``, against the theoretical minimum counted
  independently in Spark SQL (ideal copies at the new version whose node holds no OWNING copy in the previous
  version's ``partition_map`` among the nodes alive now, for partitions with at least one such owner), and the
  *balance minimum* (a failure or leave: the copies the node owned; a join: ceil(replicas / nodes));
- replicas per node (max, mean, min) of the new ``ideal_assignment``;
- makespans: the plan is rebuilt from the committed tables of the new version with
  ``planner.plan_migrations`` and scheduled in this process (``rebalancer.planning.schedule``) by the policies
  ``ours``, ``hazelcast`` and ``serial`` at the configured cap, with the lower bound of ours; ``--caps 1,2,5``
  adds a sweep over per-node caps.

Optionally (not with ``--no-profile``) one more warm run is *instrumented* (not part of the figures): ``cProfile``
(cumulative wall time per function), a 20 Hz wall-clock stack sampler of the main thread (time per line of
``rebalancer/exchange/job.py``, and per kind of wait: Spark JVM via py4j, delta-rs, Python), and the number of
Spark jobs and tasks it ran.

Writes ``--out`` (default ``bench/results/exchange.json``) and prints Markdown tables. Run from the repository root::

    .venv/bin/python bench/exchange.py                  # 1 group x 65,536 partitions, node50 fails
    .venv/bin/python bench/exchange.py --groups 64      # 64 groups x 1,024 partitions
    .venv/bin/python bench/exchange.py --nodes 9 --partitions-total 20000 --backups 1 \\
        --event NODE_JOINED --node node9 --conf bench/conf/hazelcast.toml --caps 1,2,5,10,20

Options for experiments: ``--spark-conf KEY=VALUE`` (both modes; the CLI gets it through ``PYSPARK_SUBMIT_ARGS``),
``--no-cli``, ``--runs``, ``--cli-runs``, ``--pristine DIR``, ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import linecache
import os
import platform
import pstats
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
try:  # running from a checkout without `pip install -e .`: make the package importable here and in the workers
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import pyspark  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from rebalancer.config import Settings, load_settings  # noqa: E402
from rebalancer.exchange.fullmap import latest_reports  # noqa: E402
from rebalancer.exchange.job import STAGES, VERSIONED_TABLES, ExchangeSummary, run_exchange  # noqa: E402
from rebalancer.frames import at_version  # noqa: E402
from rebalancer.operations import append_event  # noqa: E402
from rebalancer.planning import planner  # noqa: E402
from rebalancer.planning.schedule import lower_bound, makespan, schedule  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402
from rebalancer.storage import Warehouse, open_warehouse  # noqa: E402

TOTAL_PARTITIONS = 65_536
NODES = 100
BACKUPS = 2
SEED = 20_261_121
RUNS = 3
EVENTS = ("NODE_FAILED", "NODE_LEFT", "NODE_JOINED")
POLICIES = ("ours", "hazelcast", "serial")
# A fixed event time keeps every run's inputs identical.
EVENT_TIME = datetime(2026, 1, 2, tzinfo=UTC)
COUNT_FIELDS = (
    "partitions", "lost_partitions", "moving_copies", "temporary_primaries", "counter_conflicts", "migrations",
    "bytes_to_move",
)
JOB_PY = str(REPO / "rebalancer" / "exchange" / "job.py")
PACKAGE_DIR = str(REPO / "rebalancer") + os.sep
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Functions of job.py whose lines are the steps of an exchange; helpers (_materialize, _previous, ...) and
# comprehensions are charged to the step line that called them.
JOB_STEPS = (
    "run_exchange", "_compute", "_commit", "_commit_exchange_row", "_last_committed", "_record_rejections",
    "_switch_is_due", "_previous_counts",
)


# ---------------------------------------------------------------------------------------------------------------
# /proc helpers: memory peaks, CPU seconds, process trees (no dependency beyond the standard library)
# ---------------------------------------------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state, 1 the parent pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _cpu_seconds(pid: int | str) -> float | None:
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def _comm(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _cmdline(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(entry)
            if fields is not None:
                parent.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _reset_peak(pid: int) -> bool:
    """Reset VmHWM of a process we own to its current RSS (Linux >= 4.0); False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) core-seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    comm = _comm(pid)
    if comm == "?":
        return "gone"
    if comm == "java":
        return "jvm"
    if "pyspark" in _cmdline(pid) or comm.startswith("python"):
        return "python_workers"
    return "other"


class TreeWatch:
    """Polls a process tree: peak RSS per role, CPU seconds used while watched, machine CPU, load average."""

    def __init__(self, root: int, interval: float = 0.5, rescan: float = 2.0) -> None:
        self.root = root
        self.interval = interval
        self.rescan = rescan
        self._tree: list[int] = []
        self._scanned = -1e9
        self.peak_kb: dict[int, int] = {}
        self.first_cpu: dict[int, float] = {}
        self.last_cpu: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _pids(self) -> list[int]:
        # Scanning /proc for the tree costs a few ms; known processes are re-read at every tick, the tree less often.
        now = time.perf_counter()
        if now - self._scanned >= self.rescan:
            self._tree, self._scanned = _descendants(self.root), now
        return [self.root, *self._tree]

    def _sample(self, baseline: bool = False) -> None:
        for pid in self._pids():
            hwm, cpu = _status_kb(pid, "VmHWM"), _cpu_seconds(pid)
            if hwm is None or cpu is None:
                continue
            if pid not in self.first_cpu:
                # A process that appears while watched used all of its CPU time during the watch.
                self.first_cpu[pid] = cpu if baseline else 0.0
            # Re-read every time: a child seen between fork and exec still looks like its parent.
            role = _role(pid, self.root)
            if role != "gone":
                self.roles[pid] = role
            self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), hwm)
            self.last_cpu[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeWatch:
        self.t0 = time.perf_counter()
        self.machine0 = _machine_cpu()
        self._sample(baseline=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()
        self.wall = time.perf_counter() - self.t0
        self.machine1 = _machine_cpu()

    def report(self) -> dict[str, Any]:
        by_role: dict[str, dict[str, Any]] = {}
        for pid, role in self.roles.items():
            r = by_role.setdefault(role, {"processes": 0, "peak_rss_mb": 0.0, "cpu_s": 0.0})
            r["processes"] += 1
            r["peak_rss_mb"] = max(r["peak_rss_mb"], round(self.peak_kb.get(pid, 0) / 1024, 1))
            r["cpu_s"] = round(r["cpu_s"] + self.last_cpu[pid] - self.first_cpu[pid], 2)
        ours = sum(r["cpu_s"] for r in by_role.values())
        busy = self.machine1[0] - self.machine0[0]
        capacity = self.machine1[1] - self.machine0[1]
        return {
            "by_role": by_role,
            "tree_cpu_s": round(ours, 2),
            "machine_busy_core_s": round(busy, 2),
            "machine_capacity_core_s": round(capacity, 2),
            "other_work_core_s": round(max(0.0, busy - ours), 2),
        }


class LoadSampler:
    """1-minute load average every ``interval`` seconds, for the whole benchmark."""

    def __init__(self, interval: float = 5.0) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), os.getloadavg()[0]))
            if self._stop.wait(self._interval):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> dict[str, float] | None:
        values = [v for t, v in self.samples if t0 <= t <= t1]
        if not values:
            return None
        return {"min": round(min(values), 2), "mean": round(statistics.mean(values), 2), "max": round(max(values), 2)}


def _jvm_pid(parent: int) -> int | None:
    """The Spark JVM this process started (the longest-running java child)."""
    javas = [p for p in _descendants(parent) if _comm(p) == "java"]
    return min(javas) if javas else None


# ---------------------------------------------------------------------------------------------------------------
# Wall-clock stack sampler: where the main thread spends its time, per line of exchange/job.py
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class StackSampler:
    interval: float = 0.05
    samples: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self._main)
            job_line, inner, kind = "(outside job.py)", "(none)", "python"
            files = []
            while frame is not None:
                files.append(frame.f_code.co_filename)
                filename = frame.f_code.co_filename
                if inner == "(none)" and filename.startswith(PACKAGE_DIR):
                    inner = f"{os.path.relpath(filename, REPO)}:{frame.f_code.co_name}"
                if job_line == "(outside job.py)" and filename == JOB_PY and frame.f_code.co_name in JOB_STEPS:
                    job_line = f"{frame.f_code.co_name}:{frame.f_lineno}"
                frame = frame.f_back
            if any("/py4j/" in f for f in files):
                kind = "JVM (py4j call)"
            elif any("/deltalake/" in f for f in files):
                kind = "delta-rs"
            elif any("/pyarrow/" in f for f in files):
                kind = "pyarrow"
            self.samples[(job_line, inner, kind)] += 1

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def seconds(self, key_index: int) -> list[tuple[str, float]]:
        agg: Counter[str] = Counter()
        for key, n in self.samples.items():
            agg[key[key_index]] += n
        return [(k, round(n * self.interval, 2)) for k, n in agg.most_common()]


def _job_line_source(key: str) -> str:
    """The source text of a ``function:line`` key of job.py, joined with its continuation lines."""
    if ":" not in key:
        return key
    lineno = int(key.rsplit(":", 1)[1])
    text = linecache.getline(JOB_PY, lineno).strip()
    depth = text.count("(") - text.count(")")
    nxt = lineno + 1
    while depth > 0 and nxt < lineno + 4:
        more = linecache.getline(JOB_PY, nxt).strip()
        text += " " + more
        depth += more.count("(") - more.count(")")
        nxt += 1
    return re.sub(r"\s+", " ", text)[:110]


def _phase(key: str, source: str) -> str:
    """A coarse phase for a job.py line."""
    function = key.split(":", 1)[0]
    if function in ("_last_committed",):
        return "inputs: last committed version"
    if function == "_record_rejections" or "validate" in source:
        return "inputs: validation and rejected rows"
    if function == "run_exchange":
        if "latest_reports" in source:
            return "inputs: latest reports (materialize)"
        return "inputs: catalogs, events, report seq"
    if function == "_compute":
        if "ideal_assignment" in source:
            return "ideal assignment (materialize)"
        if "_materialize" in source:
            return "map stages (materialize)"
        return "summary counts"
    if function == "_commit":
        return "writes: versioned tables (replace_where)" if "replace_where" in source else "commit: other"
    if function == "_commit_exchange_row":
        return "commit: exchanges row (merge + read back)"
    return f"other ({function})"


# ---------------------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Context:
    spark: SparkSession
    settings: Settings
    warehouse_dir: Path
    pristine_dir: Path
    event_type: str
    node: str
    cli: Path
    conf: Path | None
    spark_conf: dict[str, str]

    def warehouse(self) -> Warehouse:
        return open_warehouse(self.spark, self.settings.storage, self.warehouse_dir)


def restore(ctx: Context) -> float:
    """Put the warehouse back to the post-first-exchange snapshot and append the change event; seconds taken.

    A ``NODE_JOINED`` of a node the cluster does not know also adds its ``nodes`` row (``append_event``)."""
    t0 = time.perf_counter()
    shutil.rmtree(ctx.warehouse_dir, ignore_errors=True)
    shutil.copytree(ctx.pristine_dir, ctx.warehouse_dir)
    appended = append_event(ctx.spark, ctx.warehouse(), ctx.event_type, ctx.node, now=EVENT_TIME)
    if (appended.event_type, appended.node_id) != (ctx.event_type, ctx.node):
        raise RuntimeError(f"unexpected event {appended}")
    return time.perf_counter() - t0


def committed_counts(warehouse: Warehouse) -> dict[str, Any]:
    """The newest ``exchanges`` row: version, type and the summary counts."""
    row = warehouse.read("exchanges").orderBy(F.col("exchange_id").desc()).limit(1).collect()[0]
    out = {name: int(row[name] or 0) for name in COUNT_FIELDS}
    out.update(exchange_id=int(row.exchange_id), version=f"{row.topology_major}.{row.topology_minor}",
               exchange_type=row.exchange_type)
    return out


def summary_counts(s: ExchangeSummary) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(s, name) for name in COUNT_FIELDS}
    out.update(exchange_id=s.exchange_id, version=f"{s.topology_major}.{s.topology_minor}",
               exchange_type=s.exchange_type)
    return out


_STEP = re.compile(r"^(starting Spark|running the exchange|generating [^:]*): ([0-9.]+) s$")
_STAGE_LINE = re.compile(r"^seconds by stage: (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli_command(cli: Path, warehouse: Path, conf: Path | None, *command: str) -> list[str]:
    """``rebalancer --warehouse W [--conf C] <command...>``."""
    return [str(cli), "--warehouse", str(warehouse), *(["--conf", str(conf)] if conf is not None else []), *command]


def run_watched(cmd: list[str], spark_conf: dict[str, str], load: LoadSampler) -> dict[str, Any]:
    """Run a CLI command in a subprocess under a ``TreeWatch``: wall time, peak memory and CPU per role, the
    durations of the CLI's own step lines (``<label>: 1.2 s`` on stderr) and its stdout lines."""
    env = dict(os.environ)
    if spark_conf:
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(
            f"--conf {shlex.quote(f'{k}={v}')}" for k, v in spark_conf.items()
        ) + " pyspark-shell"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    with TreeWatch(proc.pid) as watch:
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    steps = {}
    for line in _ANSI.sub("", err).splitlines():
        m = _STEP.match(line.strip())
        if m:
            steps[m.group(1)] = float(m.group(2))
    return {
        "wall_s": round(wall, 3),
        "steps_s": steps,
        "command": shlex.join(cmd),
        "load_1min": load.between(t0, time.perf_counter()),
        **watch.report(),
        "stdout": _ANSI.sub("", out).strip().splitlines(),
    }


def parse_stage_seconds(stdout: list[str]) -> dict[str, float]:
    """The CLI's ``  seconds by stage: inputs 1.2, full map 0.3, ...`` line as ``{stage: seconds}`` (the last one
    printed, empty when the CLI prints none). Stage names may contain spaces; the number is the last word."""
    stages: dict[str, float] = {}
    for line in stdout:
        m = _STAGE_LINE.match(line.strip())
        if m:
            stages = {}
            for item in m.group(1).split(","):
                name, _, seconds = item.strip().rpartition(" ")
                stages[name] = float(seconds)
    return stages


def run_cli(ctx: Context, load: LoadSampler) -> dict[str, Any]:
    """One whole-process ``rebalancer exchange``, split by the CLI's step lines and its stage line."""
    result = run_watched(cli_command(ctx.cli, ctx.warehouse_dir, ctx.conf, "exchange"), ctx.spark_conf, load)
    steps = result.pop("steps_s")
    # The CLI starts Spark lazily, inside its "running the exchange" step: that step includes "starting Spark".
    spark_start, exchange_step = steps.get("starting Spark") or 0.0, steps.get("running the exchange") or 0.0
    wall = result.pop("wall_s")
    return {
        "wall_s": wall,
        "cli_starting_spark_s": spark_start,
        "cli_exchange_without_spark_start_s": round(exchange_step - spark_start, 2),
        "interpreter_imports_and_shutdown_s": round(wall - exchange_step, 2),
        "stage_s": parse_stage_seconds(result["stdout"]),
        **result,
    }


def run_warm(ctx: Context, load: LoadSampler, instrument: bool = False) -> tuple[dict[str, Any], ExchangeSummary]:
    me, jvm = os.getpid(), _jvm_pid(os.getpid())
    reset = _reset_peak(me) and (jvm is None or _reset_peak(jvm))
    for worker in _descendants(jvm) if jvm else []:
        _reset_peak(worker)
    sc = ctx.spark.sparkContext
    jobs_before = max(sc.statusTracker().getJobIdsForGroup(None) or [-1])
    rdds_before = len(sc._jsc.sc().getRDDStorageInfo())
    jvm_before = _jvm_counters(ctx.spark)
    known_stages = {s.stageId() for s in _stages(ctx.spark)}
    warehouse = ctx.warehouse()
    write_s: dict[str, float] = {}
    if instrument:  # time each table's write (the sampler sees one line for all of them)
        original = warehouse.replace_where

        def timed_replace_where(name: str, df: Any, where: Any) -> None:
            start = time.perf_counter()
            original(name, df, where)
            write_s[name] = round(write_s.get(name, 0.0) + time.perf_counter() - start, 2)

        warehouse.replace_where = timed_replace_where  # type: ignore[method-assign]
    profiler = cProfile.Profile() if instrument else None
    sampler = StackSampler() if instrument else contextlib.nullcontext()
    t0, t0_ms = time.perf_counter(), time.time() * 1000
    with TreeWatch(me) as watch, sampler:
        if profiler:
            profiler.enable()
        summaries = run_exchange(ctx.spark, warehouse, ctx.settings)
        if profiler:
            profiler.disable()
    wall, t1_ms = time.perf_counter() - t0, time.time() * 1000
    if len(summaries) != 1:
        raise RuntimeError(f"expected one exchange, got {summaries}")
    jvm_after = _jvm_counters(ctx.spark)
    tracker = sc.statusTracker()
    job_ids = [j for j in tracker.getJobIdsForGroup(None) if j > jobs_before]
    stages = {s for j in job_ids if (info := tracker.getJobInfo(j)) for s in info.stageIds}
    tasks = sum(info.numTasks for s in stages if (info := tracker.getStageInfo(s)))
    result: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "commit_s": round(summaries[0].seconds, 3),  # ExchangeSummary.seconds: _compute + writes, not the inputs
        "load_1min": load.between(t0, time.perf_counter()),
        "peaks_reset": reset,
        "spark_jobs": (max(job_ids) - jobs_before) if job_ids else 0,
        "spark_stages_retained": len(stages),
        "spark_tasks_retained": tasks,
        "codegen_compilations": jvm_after["compilations"] - jvm_before["compilations"],
        "codegen_compile_s": _compile_seconds(jvm_before, jvm_after),
        "catalyst_rule_s": round(jvm_after["rule_s"] - jvm_before["rule_s"], 2),
        "jvm_stages": stage_report(ctx.spark, known_stages, t0_ms, t1_ms),
        "cached_rdds_before": rdds_before,
        "cached_rdds_after": len(sc._jsc.sc().getRDDStorageInfo()),
        "stage_s": {name: round(seconds, 3) for name, seconds in summaries[0].stage_seconds.items()},
        **watch.report(),
    }
    if profiler is not None and isinstance(sampler, StackSampler):
        result["profile"] = profile_report(profiler, sampler, wall)
        result["profile"]["replace_where_s_per_table"] = write_s
    return result, summaries[0]


def _stages(spark: SparkSession) -> list[Any]:
    """Every stage the session's status store retains (``v1.StageData`` objects)."""
    gateway = spark.sparkContext._gateway
    store = spark.sparkContext._jsc.sc().statusStore()
    stages = store.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)
    return list(gateway.jvm.scala.jdk.javaapi.CollectionConverters.asJava(stages))


def stage_report(spark: SparkSession, known: set[int], t0_ms: float, t1_ms: float) -> dict[str, Any]:
    """What the JVM executed for the stages not in ``known``: task time, CPU, and how much of the wall it covers."""
    new = [s for s in _stages(spark) if s.stageId() not in known and s.status().toString() == "COMPLETE"]
    intervals = sorted(
        (s.submissionTime().get().getTime(), s.completionTime().get().getTime())
        for s in new
        if s.submissionTime().isDefined() and s.completionTime().isDefined()
    )
    covered, end = 0.0, -1.0
    for start, stop in intervals:  # length of the union of the stages' [submitted, completed] intervals
        start = max(start, end)
        if stop > start:
            covered += stop - start
            end = stop
    wall_ms = max(t1_ms - t0_ms, 1.0)
    return {
        "stages": len(new),
        "tasks": sum(s.numTasks() for s in new),
        "task_run_s": round(sum(s.executorRunTime() for s in new) / 1000, 2),
        "task_cpu_s": round(sum(s.executorCpuTime() for s in new) / 1e9, 2),
        "task_deserialize_s": round(sum(s.executorDeserializeTime() for s in new) / 1000, 2),
        "task_gc_s": round(sum(s.jvmGcTime() for s in new) / 1000, 2),
        "shuffle_write_records": sum(s.shuffleWriteRecords() for s in new),
        "stage_busy_wall_s": round(covered / 1000, 2),
        "stage_busy_share": round(covered / wall_ms, 3),
    }


def _jvm_counters(spark: SparkSession) -> dict[str, Any]:
    """Cumulative JVM counters: generated-code compilations (count, sampled ms) and Catalyst rule time."""
    jvm = spark._jvm
    histogram = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    snapshot = histogram.getSnapshot()
    rules = jvm.org.apache.spark.sql.catalyst.rules.RuleExecutor.getCurrentMetrics()
    return {
        "compilations": int(histogram.getCount()),
        "compile_ms_sum": sum(snapshot.getValues()),
        "compile_ms_mean": float(snapshot.getMean()),
        "rule_s": rules.time() / 1e9,  # analyzer + optimizer rules, every query of the session
    }


# Dropwizard's default histogram reservoir keeps 1,028 samples; below that its sum is exact.
_RESERVOIR = 1028


def _compile_seconds(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds spent compiling generated code between two counter readings (estimated past 1,028 samples)."""
    n = after["compilations"] - before["compilations"]
    if after["compilations"] <= _RESERVOIR:
        return round((after["compile_ms_sum"] - before["compile_ms_sum"]) / 1000, 2)
    return round(n * after["compile_ms_mean"] / 1000, 2)


def profile_report(profiler: cProfile.Profile, sampler: StackSampler, wall: float) -> dict[str, Any]:
    stats = pstats.Stats(profiler, stream=io.StringIO())
    functions = []
    for (filename, line, name), (_cc, ncalls, _tt, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if filename.startswith(PACKAGE_DIR) or name in (
            "collect", "count", "first", "localCheckpoint", "parquet", "toArrow", "create_write_transaction",
        ):
            where = os.path.relpath(filename, REPO) if filename.startswith(PACKAGE_DIR) else Path(filename).name
            functions.append(
                {"function": f"{where}:{line}({name})", "calls": ncalls, "cumulative_s": round(cumtime, 2)}
            )
    functions.sort(key=lambda f: -f["cumulative_s"])
    py4j_s = sum(v[3] for k, v in stats.stats.items() if k[2] == "send_command" and "py4j" in k[0])  # type: ignore[attr-defined]
    lines = []
    phases: Counter[str] = Counter()
    for key, seconds in sampler.seconds(0):
        source = _job_line_source(key)
        phase = _phase(key, source) if key != "(outside job.py)" else "outside job.py"
        phases[phase] += seconds
        lines.append({"line": key, "source": source, "phase": phase, "seconds": seconds,
                      "share": round(seconds / wall, 3)})
    return {
        "wall_s": round(wall, 2),
        "sampler_interval_s": sampler.interval,
        "phases": [{"phase": p, "seconds": round(s, 2), "share": round(s / wall, 3)} for p, s in phases.most_common()],
        "job_lines": lines[:30],
        "innermost_rebalancer_function": [{"function": k, "seconds": s} for k, s in sampler.seconds(1)[:25]],
        "wait_kind": [{"kind": k, "seconds": s, "share": round(s / wall, 3)} for k, s in sampler.seconds(2)],
        "cprofile_py4j_send_command_s": round(py4j_s, 2),
        "cprofile_top": functions[:40],
    }


def rows_written(ctx: Context, version: str) -> dict[str, Any]:
    """Rows of the new version per versioned table, and the data files each table gained (vs the snapshot)."""
    from deltalake import DeltaTable

    major, minor = (int(x) for x in version.split("."))
    warehouse = ctx.warehouse()
    out: dict[str, Any] = {}
    for name in (*VERSIONED_TABLES, "exchanges", "rejected_rows"):
        df = warehouse.read(name)
        if "topology_major" in df.columns:
            rows = df.where((F.col("topology_major") == major) & (F.col("topology_minor") == minor)).count()
        else:
            rows = None
        before_path, after_path = ctx.pristine_dir / name, ctx.warehouse_dir / name
        before = {Path(u).relative_to(before_path.resolve()) for u in _local_uris(DeltaTable(str(before_path)))}
        after_table = DeltaTable(str(after_path))
        added = [
            rel for u in _local_uris(after_table) if (rel := Path(u).relative_to(after_path.resolve())) not in before
        ]
        out[name] = {
            "rows_at_version": rows,
            "files_added": len(added),
            "bytes_added": sum((after_path / f).stat().st_size for f in added),
            "delta_commits": after_table.version() - DeltaTable(str(before_path)).version(),
        }
    return out


def _version_of(text: str) -> tuple[int, int]:
    major, minor = (int(x) for x in text.split("."))
    return major, minor


def migration_figures(ctx: Context, version: str, caps: list[int]) -> dict[str, Any]:
    """Migrations of the committed version against their minimum, balance, and the plan's makespans.

    Reads the committed tables of the last run (Spark SQL over the warehouse's views). The plan is rebuilt with
    ``planner.plan_migrations`` from the committed ``ideal_assignment``, ``affinity_assignment`` and
    ``partition_map`` of the new version and the latest ``partition_reports``, then scheduled in this process by
    each policy (``rebalancer.planning.schedule``): at the configured cap, and at every cap of ``caps``.
    """
    t_start = time.perf_counter()
    spark, settings = ctx.spark, ctx.settings
    warehouse = ctx.warehouse()
    warehouse.register_views()
    new = _version_of(version)
    prev_row = spark.sql(
        "SELECT topology_major, topology_minor FROM exchanges "
        f"WHERE topology_major < {new[0]} OR (topology_major = {new[0]} AND topology_minor < {new[1]}) "
        "ORDER BY topology_major DESC, topology_minor DESC LIMIT 1"
    ).first()
    if prev_row is None:
        raise RuntimeError(f"no committed version before {version}")
    prev = (int(prev_row[0]), int(prev_row[1]))

    def at(table: str, v: tuple[int, int]) -> str:
        return f"(SELECT * FROM {table} WHERE topology_major = {v[0]} AND topology_minor = {v[1]})"

    plan_rows = spark.sql(
        f"SELECT action, count(*) AS steps, coalesce(sum(bytes), 0) AS bytes FROM {at('migration_plan', new)} "
        "GROUP BY action"
    ).collect()
    committed = {r.action: {"steps": int(r.steps), "bytes": int(r.bytes)} for r in plan_rows}
    # The minimum, without the planner: ideal copies of the new version whose node holds no OWNING copy in the
    # previous version's map among the nodes alive now, for partitions that still have such an owner.
    minimum = spark.sql(f"""
        WITH alive AS (SELECT node_id FROM {at('topology', new)} WHERE NOT coalesce(is_client, false)),
        owners AS (
            SELECT m.group_name, m.partition_id, m.node_id FROM {at('partition_map', prev)} m
            JOIN alive a ON m.node_id = a.node_id WHERE m.state = 'OWNING'),
        bearing AS (SELECT DISTINCT group_name, partition_id FROM owners),
        ideal AS (SELECT group_name, partition_id, node_id FROM {at('ideal_assignment', new)})
        SELECT count(*) FROM ideal i
        JOIN bearing b ON i.group_name = b.group_name AND i.partition_id = b.partition_id
        LEFT ANTI JOIN owners o
            ON i.group_name = o.group_name AND i.partition_id = o.partition_id AND i.node_id = o.node_id
    """).first()[0]
    per_node = spark.sql(f"""
        WITH alive AS (SELECT node_id FROM {at('topology', new)} WHERE NOT coalesce(is_client, false)),
        counts AS (
            SELECT a.node_id, count(i.partition_id) AS replicas FROM alive a
            LEFT JOIN {at('ideal_assignment', new)} i ON i.node_id = a.node_id GROUP BY a.node_id)
        SELECT count(*) AS nodes, sum(replicas) AS replicas, max(replicas) AS most, min(replicas) AS least FROM counts
    """).first()
    if ctx.event_type == "NODE_JOINED":
        balance = -(-int(per_node.replicas) // int(per_node.nodes))
        balance_rule = "join: ceil(replicas / nodes) at the new version"
    else:
        balance = spark.sql(
            f"SELECT count(*) FROM {at('partition_map', prev)} WHERE node_id = '{ctx.node}' AND state = 'OWNING'"
        ).first()[0]
        balance_rule = f"{ctx.event_type}: the OWNING copies {ctx.node} held at the previous version"
    exchange_row = spark.sql(
        f"SELECT makespan_s, makespan_lower_bound_s FROM {at('exchanges', new)}"
    ).first()

    t0 = time.perf_counter()
    migration = settings.migration
    steps = planner.plan_migrations(
        at_version(warehouse.read("ideal_assignment"), new),
        at_version(warehouse.read("affinity_assignment"), new),
        at_version(warehouse.read("partition_map"), new),
        latest_reports(warehouse.read("partition_reports")),
        history_threshold=settings.rebalance.history_threshold,
        full_rebalance=migration.full_rebalance,
        file_chunk_bytes=migration.file_chunk_bytes,
    ).toArrow()
    plan_s = time.perf_counter() - t0
    rebuilt_copies = sum(1 for a in steps.column("action").to_pylist() if a == "COPY")

    serial: dict[str, float] = {}

    def makespans(cap: int) -> dict[str, Any]:
        model = planner.cost_model(migration.model_copy(update={"max_parallel_per_node": cap}))
        out: dict[str, Any] = {}
        for policy in POLICIES:
            if policy == "serial" and serial:  # one step at a time: the cap does not matter
                out.update(serial)
                continue
            t = time.perf_counter()
            scheduled = schedule(steps, model, policy)
            out[f"{policy}_schedule_s"] = round(time.perf_counter() - t, 3)
            out[f"{policy}_s"] = round(makespan(scheduled), 2)
            if policy == "ours":
                out["lower_bound_s"] = round(lower_bound(scheduled, model), 2)
            if policy == "serial":
                serial.update({"serial_s": out["serial_s"], "serial_schedule_s": out["serial_schedule_s"]})
        return out

    at_cap = makespans(migration.max_parallel_per_node)
    committed_makespan = round(float(exchange_row.makespan_s or 0.0), 2)
    return {
        "previous_version": f"{prev[0]}.{prev[1]}",
        "version": version,
        "committed_plan": committed,
        "copies": committed.get("COPY", {}).get("steps", 0),
        "copy_bytes": committed.get("COPY", {}).get("bytes", 0),
        "minimum_copies": int(minimum),
        "copies_at_minimum": committed.get("COPY", {}).get("steps", 0) == int(minimum),
        "balance_minimum": int(balance),
        "balance_minimum_rule": balance_rule,
        "replicas_per_node": {
            "nodes": int(per_node.nodes),
            "max": int(per_node.most),
            "mean": round(int(per_node.replicas) / int(per_node.nodes), 2),
            "min": int(per_node.least),
        },
        "committed_makespan_s": committed_makespan,
        "committed_lower_bound_s": round(float(exchange_row.makespan_lower_bound_s or 0.0), 2),
        "rebuilt_plan": {"steps": steps.num_rows, "copies": rebuilt_copies, "plan_s": round(plan_s, 2)},
        # the rebuilt plan is the committed one: same steps, and ours schedules it to the committed makespan
        "rebuilt_matches_committed": (
            steps.num_rows == sum(a["steps"] for a in committed.values())
            and abs(at_cap["ours_s"] - committed_makespan) <= 0.01 + 1e-6 * committed_makespan
        ),
        "cap": migration.max_parallel_per_node,
        "makespan": at_cap,
        "caps": {str(cap): makespans(cap) for cap in caps},
        "seconds": round(time.perf_counter() - t_start, 2),
    }


def _local_uris(table: Any) -> list[str]:
    from urllib.parse import unquote, urlparse

    return [unquote(urlparse(u).path) if u.startswith("file:") else u for u in table.file_uris()]


def source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted((REPO / "rebalancer").rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def machine_info(spark: SparkSession, settings: Settings, warehouse: Warehouse) -> dict[str, Any]:
    import deltalake
    import numpy
    import pyarrow

    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    try:
        from importlib.metadata import version

        delta_spark = version("delta-spark")
    except Exception:
        delta_spark = None
    conf = spark.sparkContext.getConf()
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": java[0] if java else None,
        "pyspark": pyspark.__version__,
        "deltalake": deltalake.__version__,
        "delta_spark": delta_spark,
        "pyarrow": pyarrow.__version__,
        "numpy": numpy.__version__,
        "storage_engine": warehouse.engine,
        "spark_master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "driver_memory": conf.get("spark.driver.memory"),
    }


@contextlib.contextmanager
def workdir(parent: Path, keep: bool) -> Iterator[Path]:
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="rebalancer-bench-exchange-", dir=parent))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:  # noqa: C901 (a linear script)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default=None, help="label of the scenario change (kept in the results)")
    parser.add_argument("--groups", type=int, default=1,
                        help="cache groups; the partitions are split evenly (1: 1 x 65,536; 64: 64 x 1,024)")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--partitions-total", type=int, default=TOTAL_PARTITIONS, help="partitions over all groups")
    parser.add_argument("--backups", type=int, default=BACKUPS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--event", choices=EVENTS, default=None, help="the change (default: NODE_FAILED)")
    parser.add_argument("--node", default=None,
                        help="its node (default: node<nodes/2> fails or leaves; node<nodes> joins)")
    parser.add_argument("--fail-node", default=None, help="short for --event NODE_FAILED --node FAIL_NODE")
    parser.add_argument("--runs", type=int, default=RUNS, help="timed rounds (each: a whole-process and a warm run)")
    parser.add_argument("--cli-runs", type=int, default=None,
                        help="whole-process runs, in the first rounds only (default: every round)")
    parser.add_argument("--caps", type=_csv_ints, default=[], metavar="N,N,...",
                        help="also schedule the rebuilt plan at these per-node caps (e.g. 1,2,5,10,20)")
    parser.add_argument("--conf", type=Path, default=None, help="TOML settings for every run (rebalancer --conf)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for both modes (repeatable)")
    parser.add_argument("--no-cli", action="store_true", help="skip the whole-process runs")
    parser.add_argument("--no-profile", action="store_true", help="skip the instrumented run")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()),
                        help="a fresh directory is made under it for the warehouses (default: the temp dir)")
    parser.add_argument("--pristine", type=Path, default=None,
                        help="reuse this post-first-exchange warehouse instead of generating one")
    parser.add_argument("--save-pristine", type=Path, default=None,
                        help="copy the post-first-exchange warehouse here (for --pristine of another change)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "exchange.json")
    args = parser.parse_args()
    if args.partitions_total % args.groups or not 1 <= args.partitions_total // args.groups <= 65_536:
        parser.error("--groups must divide --partitions-total into groups of 1..65,536 partitions")
    if args.fail_node and (args.node or args.event not in (None, "NODE_FAILED")):
        parser.error("--fail-node is short for --event NODE_FAILED --node X; do not combine it with those")
    per_group = args.partitions_total // args.groups
    event_type = "NODE_FAILED" if args.fail_node else args.event or "NODE_FAILED"
    node = args.fail_node or args.node or (
        f"node{args.nodes}" if event_type == "NODE_JOINED" else f"node{args.nodes // 2}"
    )
    cli_runs = args.runs if args.cli_runs is None else min(args.cli_runs, args.runs)
    if args.no_cli:
        cli_runs = 0
    spark_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    settings = load_settings(args.conf)
    cli = Path(sys.executable).with_name("rebalancer")
    if (cli_runs or args.pristine is None) and not cli.exists():
        parser.error(f"{cli} not found; install the package into this interpreter's environment")

    digest_start, load_before = source_digest(), os.getloadavg()
    load = LoadSampler()
    load.start()
    t_start = time.perf_counter()
    with workdir(args.workdir, args.keep) as work:
        setup: dict[str, Any] = {}
        pristine_dir = work / "pristine"
        if args.pristine is not None:
            shutil.copytree(args.pristine, pristine_dir)
            setup["reused_pristine"] = str(args.pristine)
        else:
            log(f"rebalancer generate: {args.nodes} nodes, {args.groups} x {per_group} partitions, "
                f"{args.backups} backups, seed {args.seed}")
            generated = run_watched(
                cli_command(cli, pristine_dir, args.conf, "generate", "--nodes", str(args.nodes), "--groups",
                            str(args.groups), "--partitions", str(per_group), "--backups", str(args.backups),
                            "--seed", str(args.seed)),
                spark_conf, load,
            )
            setup["generate"] = {key: generated[key] for key in ("command", "wall_s", "steps_s", "by_role", "stdout")}
            log(f"  {generated['wall_s']:.1f} s")
        log("starting Spark")
        spark = get_spark(settings.spark, extra_conf=spark_conf)
        ctx = Context(spark, settings, work / "warehouse", pristine_dir, event_type, node, cli, args.conf, spark_conf)
        if args.pristine is None:
            log("first exchange (the initial joins)")
            t0 = time.perf_counter()
            first = run_exchange(spark, open_warehouse(spark, settings.storage, ctx.pristine_dir), settings)
            setup["first_exchange_warm_s"] = round(time.perf_counter() - t0, 2)
            setup["first_exchange"] = [summary_counts(s) | {"merged_events": len(s.merged_event_seqs)}
                                       for s in first]
            if args.save_pristine is not None:
                shutil.rmtree(args.save_pristine, ignore_errors=True)
                shutil.copytree(ctx.pristine_dir, args.save_pristine)
        pristine = open_warehouse(spark, settings.storage, ctx.pristine_dir)
        groups = pristine.read("cache_groups").agg(F.count("*"), F.sum("partitions"), F.max("backups")).first()
        node_ids = {r.node_id for r in pristine.read("nodes").select("node_id").collect()}
        if (len(node_ids), groups[0], groups[1], groups[2]) != (
            args.nodes, args.groups, args.partitions_total, args.backups
        ):
            raise SystemExit(f"the pristine warehouse has {len(node_ids)} nodes and {tuple(groups)} (groups, "
                             "partitions, backups); it does not match the arguments")
        if (node in node_ids) != (event_type != "NODE_JOINED"):
            raise SystemExit(f"{event_type} {node}: the node must {'not ' if event_type == 'NODE_JOINED' else ''}"
                             "be one of the generated nodes")
        machine = machine_info(spark, settings, pristine)
        if args.pristine is not None:
            # The warm runs are meant for a session that has already run an exchange (JIT, generated code, Python
            # workers): without the first exchange here, one untimed run of the change takes its place.
            log("warm-up: one untimed exchange of the change (the first exchange ran in another process)")
            restore(ctx)
            t0 = time.perf_counter()
            run_exchange(spark, ctx.warehouse(), settings)
            setup["warmup_exchange_warm_s"] = round(time.perf_counter() - t0, 2)

        runs: list[dict[str, Any]] = []
        expected: dict[str, Any] | None = None
        t_runs = time.perf_counter()
        for i in range(1, args.runs + 1):
            entry: dict[str, Any] = {"run": i}
            if i <= cli_runs:
                entry["restore_s"] = round(restore(ctx), 2)
                log(f"run {i}/{args.runs}: rebalancer exchange (whole process)")
                entry["cli"] = run_cli(ctx, load)
                entry["cli"]["counts"] = committed_counts(ctx.warehouse())
                log(f"  {entry['cli']['wall_s']:.1f} s")
            restore(ctx)
            log(f"run {i}/{args.runs}: run_exchange in the warm session")
            entry["warm"], summary = run_warm(ctx, load)
            entry["warm"]["counts"] = summary_counts(summary)
            log(f"  {entry['warm']['wall_s']:.1f} s")
            for mode in ("cli", "warm"):
                if mode in entry:
                    expected = expected or entry[mode]["counts"]
                    if entry[mode]["counts"] != expected:
                        raise RuntimeError(f"run {i} {mode} committed {entry[mode]['counts']}, expected {expected}")
            runs.append(entry)
        t_runs_end = time.perf_counter()
        assert expected is not None
        log("rows written, migrations against their minimum, makespans (untimed)")
        written = rows_written(ctx, expected["version"])
        migrations = migration_figures(ctx, expected["version"], args.caps)
        log(f"  {migrations['seconds']:.1f} s")

        profile: dict[str, Any] | None = None
        if not args.no_profile:
            restore(ctx)
            log("instrumented warm run (cProfile + stack sampler; not part of the figures)")
            instrumented, _ = run_warm(ctx, load, instrument=True)
            profile = instrumented.pop("profile")
            profile["run"] = instrumented
            log(f"  {instrumented['wall_s']:.1f} s")

        load.stop()
        rev = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "rebalancer").splitlines()
        report: dict[str, Any] = {
            "name": args.name,
            "command": shlex.join([".venv/bin/python", "bench/exchange.py", *sys.argv[1:]]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "total_benchmark_s": round(time.perf_counter() - t_start, 1),
            "code": {"commit": rev, "uncommitted_changes_in_rebalancer": dirty,
                     "source_digest_start": digest_start, "source_digest_end": source_digest()},
            "machine": machine,
            "load_average": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in os.getloadavg()],
                "during_timed_runs_1min": load.between(t_runs, t_runs_end),
            },
            "cluster": {
                "nodes": args.nodes, "groups": args.groups, "partitions_per_group": per_group,
                "partitions_total": args.partitions_total, "backups": args.backups,
                "replicas": args.partitions_total * (args.backups + 1), "seed": args.seed,
                "event": event_type, "node": node, "spark_conf": spark_conf,
                "conf": str(args.conf) if args.conf else "defaults (conf/default.toml)",
                "avg_partition_bytes": settings.generate.avg_partition_bytes,
            },
            "setup": setup,
            "stages": list(STAGES),
            "exchange": expected,
            "rows_written": written,
            "rows_written_total": sum(w["rows_at_version"] or 0 for w in written.values()),
            "bytes_written_total": sum(w["bytes_added"] for w in written.values()),
            "migrations": migrations,
            "summary": {mode: summarize(runs, mode) for mode in ("cli", "warm") if any(mode in r for r in runs)},
            "runs": runs,
            "profile": profile,
            "bench_process_peak_rss_mb": round(
                __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        if report["code"]["source_digest_start"] != report["code"]["source_digest_end"]:
            log("WARNING: rebalancer/ changed while the benchmark ran; the runs may have measured different code")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_markdown(report)
    log(f"written to {args.out}")
    spark.stop()


def summarize(all_runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Median, min, max (``spread``) of each figure over the runs of one mode (``cli`` or ``warm``)."""
    runs = [r[mode] for r in all_runs if mode in r]
    seen = [name for r in runs for name in r.get("stage_s", {})]
    stages = [name for name in STAGES if name in seen] + [n for n in dict.fromkeys(seen) if n not in STAGES]
    out: dict[str, Any] = {"runs": len(runs), "wall_s": spread([r["wall_s"] for r in runs])}
    if mode == "cli":
        for key in ("cli_starting_spark_s", "cli_exchange_without_spark_start_s", "interpreter_imports_and_shutdown_s"):
            out[key] = spread([r[key] for r in runs])
    out["stage_s"] = {name: spread([r.get("stage_s", {}).get(name, 0.0) for r in runs]) for name in stages}
    # Wall time no stage covers (per run, then the spread): Python between the stages, and for the whole process the
    # interpreter start, imports, starting Spark and shutdown.
    out["outside_stages_s"] = spread([r["wall_s"] - sum(r.get("stage_s", {}).values()) for r in runs])
    out["peak_rss_mb"] = {
        role: spread([r["by_role"].get(role, {}).get("peak_rss_mb", 0) for r in runs])
        for role in ("driver", "jvm", "python_workers")
    }
    # An upper bound of the process tree's peak: the sum of each role's peak (they need not peak together).
    out["peak_rss_sum_mb"] = spread(
        [sum(r["by_role"].get(role, {}).get("peak_rss_mb", 0) for role in ("driver", "jvm", "python_workers"))
         for r in runs]
    )
    if mode == "warm":
        for key in ("commit_s", "spark_jobs", "codegen_compilations", "codegen_compile_s", "catalyst_rule_s"):
            out[key] = spread([r[key] for r in runs])
        for key in ("stages", "tasks", "task_run_s", "task_cpu_s", "stage_busy_wall_s", "stage_busy_share"):
            out[f"jvm_{key}"] = spread([r["jvm_stages"][key] for r in runs])
    out["tree_cpu_s"] = spread([r["tree_cpu_s"] for r in runs])
    out["other_work_core_s"] = spread([r["other_work_core_s"] for r in runs])
    return out


def print_markdown(r: dict[str, Any]) -> None:
    c = r["cluster"]
    title = f"{r['name']}: " if r.get("name") else ""
    print(f"### {title}{c['nodes']} nodes, {c['groups']} x {c['partitions_per_group']:,} partitions, "
          f"{c['backups']} backups, {c['event']} {c['node']}\n")
    print("| measure | median | min-max |")
    print("|---|---|---|")

    def row(label: str, s: dict[str, Any], unit: str) -> None:
        print(f"| {label} | {s['median']:,} {unit} | {s['min']:,}-{s['max']:,} {unit} |")

    for mode, title in (("cli", "`rebalancer exchange`, whole process"), ("warm", "`run_exchange`, warm session")):
        if mode not in r["summary"]:
            continue
        s = r["summary"][mode]
        row(f"{title}: wall ({s['runs']} runs)", s["wall_s"], "s")
        if mode == "cli":
            row("&nbsp;&nbsp;of which interpreter start, imports, shutdown",
                s["interpreter_imports_and_shutdown_s"], "s")
            row("&nbsp;&nbsp;of which starting Spark (JVM, session)", s["cli_starting_spark_s"], "s")
            row("&nbsp;&nbsp;of which the exchange", s["cli_exchange_without_spark_start_s"], "s")
        if mode == "warm":
            row("&nbsp;&nbsp;of which `_commit` (compute + writes)", s["commit_s"], "s")
            row("&nbsp;&nbsp;Spark jobs", s["spark_jobs"], "")
            row("&nbsp;&nbsp;Spark stages", s["jvm_stages"], "")
            row("&nbsp;&nbsp;Spark tasks", s["jvm_tasks"], "")
            row("&nbsp;&nbsp;task run time (sum over tasks)", s["jvm_task_run_s"], "s")
            row("&nbsp;&nbsp;task CPU time (sum over tasks)", s["jvm_task_cpu_s"], "s")
            row("&nbsp;&nbsp;wall time with a stage running", s["jvm_stage_busy_wall_s"], "s")
            row("&nbsp;&nbsp;generated-code compilations", s["codegen_compilations"], "")
            row("&nbsp;&nbsp;compiling generated code", s["codegen_compile_s"], "s")
            row("&nbsp;&nbsp;Catalyst analyzer + optimizer rules", s["catalyst_rule_s"], "s")
        for role in ("driver", "jvm", "python_workers"):
            row(f"&nbsp;&nbsp;peak RSS, {role.replace('_', ' ')}", s["peak_rss_mb"][role], "MB")
        for stage, seconds in s["stage_s"].items():
            row(f"&nbsp;&nbsp;stage {stage}", seconds, "s")
        row("&nbsp;&nbsp;CPU of the process tree", s["tree_cpu_s"], "core-s")
        row("&nbsp;&nbsp;CPU used by other work meanwhile", s["other_work_core_s"], "core-s")
    e = r["exchange"]
    print(f"\nExchange {e['exchange_id']} -> version {e['version']} ({e['exchange_type']}): lost "
          f"{e['lost_partitions']:,}, moving copies {e['moving_copies']:,}, temporary primaries "
          f"{e['temporary_primaries']:,}, migrations {e['migrations']:,}, "
          f"{e['bytes_to_move'] / 2**30:,.1f} GiB to move.\n")
    print("| table | rows at the new version | files added | bytes added |")
    print("|---|---|---|---|")
    for name, w in r["rows_written"].items():
        rows = "-" if w["rows_at_version"] is None else f"{w['rows_at_version']:,}"
        print(f"| {name} | {rows} | {w['files_added']} | {w['bytes_added']:,} |")
    m = r["migrations"]
    mk = m["makespan"]
    print(f"\nMigrations {m['previous_version']} -> {m['version']}: {m['copies']:,} COPY steps "
          f"(minimum {m['minimum_copies']:,}, balance minimum {m['balance_minimum']:,}), "
          f"{m['copy_bytes'] / 2**30:,.1f} GiB; replicas per node max {m['replicas_per_node']['max']:,} / mean "
          f"{m['replicas_per_node']['mean']:,}; makespan at cap {m['cap']}: ours {mk['ours_s']:,} s, hazelcast "
          f"{mk['hazelcast_s']:,} s, serial {mk['serial_s']:,} s, lower bound {mk['lower_bound_s']:,} s.")
    if m["caps"]:
        print("\n| cap | ours | hazelcast | serial | lower bound |")
        print("|---|---|---|---|---|")
        for cap, c in m["caps"].items():
            print(f"| {cap} | {c['ours_s']:,} s | {c['hazelcast_s']:,} s | {c['serial_s']:,} s | "
                  f"{c['lower_bound_s']:,} s |")
    if r.get("profile"):
        p = r["profile"]
        print(f"\nInstrumented warm run: {p['wall_s']} s\n")
        print("| phase | seconds | share |")
        print("|---|---|---|")
        for ph in p["phases"]:
            print(f"| {ph['phase']} | {ph['seconds']} | {ph['share']:.0%} |")
        print("\n| job.py line | source | seconds |")
        print("|---|---|---|")
        for line in p["job_lines"][:15]:
            print(f"| {line['line']} | `{line['source']}` | {line['seconds']} |")
    la = r["load_average"]
    print(f"\nload average before {la['before']}, during the timed runs (1-min) {la['during_timed_runs_1min']}, "
          f"after {la['after']}")


if __name__ == "__main__":
    main()
