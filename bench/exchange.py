"""Benchmark: the partition map exchange after one topology change (one scenario change per invocation).

A scenario change is a cluster (``--nodes``, ``--groups``, ``--partitions-total``, ``--backups``, ``--seed``,
``--conf``) and one event (``--event NODE_FAILED|NODE_LEFT|NODE_JOINED``, ``--node``). Default: 100 nodes, 1 group
x 65,536 partitions, 2 backups, ``node50`` fails. ``bench/suite.py`` runs every scenario of docs/BENCHMARKS.md
through this script, one subprocess per change.

Setup (untimed): ``rebalancer --warehouse W [--conf C] generate ...`` in a subprocess (the scenario is exactly what
the command generates), then the first exchange (the initial joins) with ``run_exchange`` in this process; that
warehouse is the *pristine* snapshot (``--save-pristine DIR`` copies it there, ``--pristine DIR`` reuses such a
copy instead of generating, and the session then runs one untimed exchange of the change, so that the warm runs
always follow an exchange in the same session). Then, for each of ``--runs`` rounds:

- ``cli`` (the first ``--cli-runs`` rounds): restore the snapshot, append the event (fixed event time), and time
  the whole process ``rebalancer --warehouse W [--conf C] exchange``. Stage seconds and the Spark job count are
  read from the ``exchanges`` row it committed (``stage_seconds``, ``spark_jobs``; the row is written inside the
  ``commit`` stage, so it cannot hold that stage's own seconds). Its ``started_at`` / ``finished_at`` split the
  wall time, as data, into *startup* (interpreter, imports, Spark session: launch until ``run_exchange`` began:
  ``started_at``, which the run stamps before its ``inputs`` stage), the *exchange* (until ``finished_at``) and
  *after* (the commit of the row, printing, stopping Spark, exit). No printed text is parsed.
- ``select1`` (the same rounds): the whole process ``rebalancer --warehouse W sql "SELECT 1"``, the floor a
  command that starts Spark and opens the warehouse pays (the M target compares the exchange with it).
- ``warm``: restore again, append the same event, and time ``run_exchange`` in this process
  (``ExchangeSummary.stage_seconds``, ``stage_jobs``, ``spark_jobs``). ``spark_jobs_seen`` counts, as a check of
  the engine's own count, every job the session's status store lists after the listener bus is drained, and
  ``spark_job_sites`` groups them by Spark's call site (``toArrow at rebalancer/inputs.py:179``).

Every run must commit the same exchange with the same counts; the script fails otherwise.

Memory: peak resident set (``VmHWM``) of the driver Python process, the Spark JVM and the Python workers, polled
every 0.5 s (peaks of this process and its JVM are reset before each warm run); ``peak_rss_sum_mb`` adds the
roles' peaks (an upper bound of the tree's peak), ``peak_rss_tree_sampled_mb`` is the largest sampled sum of
``VmRSS`` (a lower bound). CPU seconds of the tree and of the machine are read around each run (their difference
is other work on a shared machine); the load average is sampled every 5 s.

After the timed rounds, from the tables the last run committed (untimed): rows of the new version and data bytes
added per table; COPY steps of ``migration_plan`` against the minimum counted independently in Spark SQL (ideal
copies whose node holds no OWNING copy in the previous ``partition_map`` among the nodes alive now, for partitions
with such an owner) and the balance minimum (failure or leave: the copies the node owned; join: ceil(replicas /
nodes)); replicas per node of ``ideal_assignment``; makespans of the committed plan re-scheduled as it is
(``rebalancer.planning.schedule``: ``portfolio``, ``hazelcast``, ``serial`` and the lower bound) at the configured cap
and at every ``--caps`` cap.

Not here any more (the earlier script had them): cProfile, a stack sampler charging time to lines of the old
``job.py``, JVM code-generation and Catalyst counters. When needed: ``python -m cProfile -o out.prof
bench/exchange.py ...``, or Spark's UI (``--spark-conf spark.ui.enabled=true --keep``).

Writes ``--out`` (default ``bench/results/exchange.json``) and prints Markdown. From the repository root::

    .venv/bin/python bench/exchange.py --nodes 10 --partitions-total 400 --backups 1 --runs 1   # a smoke test
    .venv/bin/python bench/exchange.py --nodes 10 --partitions-total 20000 --backups 1 --event NODE_FAILED \\
        --node node9 --conf bench/conf/hazelcast.toml --caps 1,2,5,10,20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
try:  # running from a checkout without `pip install -e .`: make the package importable here and in the workers
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

sys.path.insert(0, str(REPO))  # the bench package (bench/repo.py)
import pyarrow.compute as pc  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from bench.repo import measured_code  # noqa: E402
from rebalancer.config import Settings, load_settings  # noqa: E402
from rebalancer.operations import append_event  # noqa: E402
from rebalancer.pipeline import STAGES, VERSIONED_TABLES, ExchangeSummary, run_exchange  # noqa: E402
from rebalancer.planning.plan import cost_model  # noqa: E402
from rebalancer.planning.schedule import POLICIES, lower_bound, makespan, schedule  # noqa: E402
from rebalancer.session import get_spark, wants_delta_jars  # noqa: E402
from rebalancer.storage import Warehouse, open_warehouse  # noqa: E402

EVENTS = ("NODE_FAILED", "NODE_LEFT", "NODE_JOINED")
EVENT_TIME = datetime(2026, 1, 2, tzinfo=UTC)  # a fixed event time keeps every run's inputs identical
COUNT_FIELDS = ("partitions", "lost_partitions", "moving_copies", "temporary_primaries", "counter_conflicts",
                "migrations", "bytes_to_move")
ROLES = ("driver", "jvm", "python_workers")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------------------------
# /proc: memory peaks, CPU seconds, process trees (standard library only)
# ---------------------------------------------------------------------------------------------------------------
def _status_kb(pid: int, *keys: str) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in keys:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state, 1 the parent pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    comm = _read(f"/proc/{pid}/comm")
    if comm == "java":
        return "jvm"
    if comm.startswith("python") or "pyspark" in _read(f"/proc/{pid}/cmdline"):
        return "python_workers"
    return "other" if comm else "gone"


def _reset_peak(pid: int) -> bool:
    """Reset VmHWM of a process we own to its current RSS (Linux >= 4.0); False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) core-seconds of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK, sum(values[:8]) / CLK_TCK


class TreeWatch:
    """Polls a process tree: peak RSS per role, the largest sampled RSS sum, CPU seconds, machine CPU."""

    def __init__(self, root: int, interval: float = 0.5, rescan: float = 2.0) -> None:
        self.root, self.interval, self.rescan = root, interval, rescan
        self._tree: list[int] = []
        self._scanned = -1e9
        self.peak_kb: dict[int, int] = {}
        self.first_cpu: dict[int, float] = {}
        self.last_cpu: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        self.tree_peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, baseline: bool = False) -> None:
        now = time.perf_counter()
        if now - self._scanned >= self.rescan:  # scanning /proc costs a few ms: the tree is re-read less often
            self._tree, self._scanned = _descendants(self.root), now
        total = 0
        for pid in [self.root, *self._tree]:
            status, fields = _status_kb(pid, "VmHWM", "VmRSS"), _stat_fields(pid)
            if "VmHWM" not in status or fields is None:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
            self.first_cpu.setdefault(pid, cpu if baseline else 0.0)  # a process born while watched: all its CPU
            # the role is re-read: between fork and exec a child still looks like its parent
            if (role := _role(pid, self.root)) != "gone":
                self.roles[pid] = role
            self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), status["VmHWM"])
            self.last_cpu[pid] = cpu
            total += status.get("VmRSS", 0)
        self.tree_peak_kb = max(self.tree_peak_kb, total)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeWatch:
        self.machine0 = _machine_cpu()
        self._sample(baseline=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()
        self.machine1 = _machine_cpu()

    def report(self) -> dict[str, Any]:
        by_role: dict[str, dict[str, Any]] = {}
        for pid, role in self.roles.items():
            r = by_role.setdefault(role, {"processes": 0, "peak_rss_mb": 0.0, "cpu_s": 0.0})
            r["processes"] += 1
            r["peak_rss_mb"] = max(r["peak_rss_mb"], round(self.peak_kb.get(pid, 0) / 1024, 1))
            r["cpu_s"] = round(r["cpu_s"] + self.last_cpu[pid] - self.first_cpu[pid], 2)
        ours = sum(r["cpu_s"] for r in by_role.values())
        return {
            "by_role": by_role,
            "peak_rss_sum_mb": round(sum(by_role.get(role, {}).get("peak_rss_mb", 0.0) for role in ROLES), 1),
            "peak_rss_tree_sampled_mb": round(self.tree_peak_kb / 1024, 1),
            "tree_cpu_s": round(ours, 2),
            "other_work_core_s": round(max(0.0, self.machine1[0] - self.machine0[0] - ours), 2),
        }


class LoadSampler:
    """1-minute load average every ``interval`` seconds, for the whole benchmark."""

    def __init__(self, interval: float = 5.0) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), os.getloadavg()[0]))
            if self._stop.wait(self._interval):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> dict[str, float] | None:
        values = [v for t, v in self.samples if t0 <= t <= t1]
        if not values:
            return None
        return {"min": round(min(values), 2), "mean": round(statistics.mean(values), 2), "max": round(max(values), 2)}


# ---------------------------------------------------------------------------------------------------------------
# The runs
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

    def warehouse(self, path: Path | None = None) -> Warehouse:
        return open_warehouse(self.spark, self.settings.storage, path or self.warehouse_dir)


def restore(ctx: Context) -> None:
    """The warehouse back to the pristine snapshot, plus the change's event (a new node's ``nodes`` row too)."""
    shutil.rmtree(ctx.warehouse_dir, ignore_errors=True)
    shutil.copytree(ctx.pristine_dir, ctx.warehouse_dir)
    appended = append_event(ctx.spark, ctx.warehouse(), ctx.event_type, ctx.node, now=EVENT_TIME)
    if (appended.event_type, appended.node_id) != (ctx.event_type, ctx.node):
        raise RuntimeError(f"unexpected event {appended}")


def exchange_rows(warehouse: Warehouse) -> list[dict[str, Any]]:
    """Every committed ``exchanges`` row, newest first, as plain dicts (maps as dicts)."""
    rows = warehouse.read_arrow("exchanges").to_pylist()
    for r in rows:
        for key in ("stage_seconds", "input_versions"):
            r[key] = dict(r[key] or [])
    return sorted(rows, key=lambda r: r["exchange_id"], reverse=True)


def counts(source: ExchangeSummary | dict[str, Any]) -> dict[str, Any]:
    """The figures every run of a change must agree on, from a summary or an ``exchanges`` row."""
    get = source.get if isinstance(source, dict) else lambda k: getattr(source, k)
    out: dict[str, Any] = {name: int(get(name) or 0) for name in COUNT_FIELDS}
    return out | {"exchange_id": int(get("exchange_id")), "exchange_type": get("exchange_type"),
                  "version": f"{get('topology_major')}.{get('topology_minor')}"}


def cli_command(ctx: Context, warehouse: Path, *command: str) -> list[str]:
    conf = ["--conf", str(ctx.conf)] if ctx.conf is not None else []
    return [str(ctx.cli), "--warehouse", str(warehouse), *conf, *command]


def run_process(cmd: list[str], spark_conf: dict[str, str], load: LoadSampler) -> dict[str, Any]:
    """A CLI command in a subprocess under a :class:`TreeWatch`: wall seconds, epoch launch/exit, memory, CPU."""
    env = dict(os.environ)
    if spark_conf:
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(f"--conf {shlex.quote(f'{k}={v}')}" for k, v in spark_conf.items()) \
            + " pyspark-shell"
    launched, t0 = time.time(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    with TreeWatch(proc.pid) as watch:
        _, err = proc.communicate()
    wall, exited = time.perf_counter() - t0, time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": round(wall, 3), "launched": launched, "exited": exited, "command": shlex.join(cmd),
            "load_1min": load.between(t0, time.perf_counter()), **watch.report()}


def run_cli(ctx: Context, load: LoadSampler) -> dict[str, Any]:
    """One whole-process ``rebalancer exchange``; its stages and jobs from the ``exchanges`` row it committed."""
    result = run_process(cli_command(ctx, ctx.warehouse_dir, "exchange"), ctx.spark_conf, load)
    row = exchange_rows(ctx.warehouse())[0]
    stages = {k: round(v, 3) for k, v in row["stage_seconds"].items()}
    began = _epoch(row["started_at"])  # stamped as run_exchange begins, before its inputs stage
    finished, launched, exited = _epoch(row["finished_at"]), result.pop("launched"), result.pop("exited")
    if not launched <= began <= finished <= exited:  # the split would be wrong (it once subtracted inputs twice)
        raise RuntimeError(f"started_at/finished_at outside the process: {launched} {began} {finished} {exited}")
    return {**result, "stage_s": stages, "spark_jobs": row["spark_jobs"], "counts": counts(row),
            "startup_s": round(began - launched, 2), "exchange_s": round(finished - began, 2),
            "after_s": round(exited - finished, 2)}


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def run_select_one(ctx: Context, load: LoadSampler) -> dict[str, Any]:
    """The whole process ``rebalancer sql "SELECT 1"`` on the same warehouse: Spark's start and little else."""
    result = run_process(cli_command(ctx, ctx.warehouse_dir, "sql", "SELECT 1"), ctx.spark_conf, load)
    result.pop("launched"), result.pop("exited")
    return result


def _jobs(spark: SparkSession) -> dict[int, str]:
    """Every job the session's status store holds (id -> Spark's call site, ``toArrow at path:line``), once the
    listener bus has delivered every event."""
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    jobs = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc.statusStore().jobsList(None))
    return {int(j.jobId()): str(j.name()).replace(f"{REPO}{os.sep}", "") for j in jobs}


def run_warm(ctx: Context, load: LoadSampler) -> tuple[dict[str, Any], ExchangeSummary]:
    """One ``run_exchange`` in this process's session (which has run an exchange before)."""
    me = os.getpid()
    javas = [p for p in _descendants(me) if _read(f"/proc/{p}/comm") == "java"]
    reset = all(_reset_peak(p) for p in [me, *javas, *(c for j in javas for c in _descendants(j))])
    before = _jobs(ctx.spark)
    warehouse = ctx.warehouse()
    t0 = time.perf_counter()
    with TreeWatch(me) as watch:
        summaries = run_exchange(ctx.spark, warehouse, ctx.settings)
    wall = time.perf_counter() - t0
    if len(summaries) != 1:
        raise RuntimeError(f"expected one exchange, got {summaries}")
    s = summaries[0]
    return {
        "wall_s": round(wall, 3),
        "stage_s": {k: round(v, 3) for k, v in s.stage_seconds.items()},
        "stage_jobs": dict(s.stage_jobs),
        "spark_jobs": s.spark_jobs,
        "spark_jobs_seen": len(seen := [name for i, name in _jobs(ctx.spark).items() if i not in before]),
        "spark_job_sites": dict(Counter(seen).most_common()),
        "recomputed_partitions": s.recomputed_partitions,
        "peaks_reset": reset,
        "load_1min": load.between(t0, time.perf_counter()),
        "counts": counts(s),
        **watch.report(),
    }, s


# ---------------------------------------------------------------------------------------------------------------
# What the committed version holds (untimed)
# ---------------------------------------------------------------------------------------------------------------
def _local_files(path: Path) -> set[Path]:
    from urllib.parse import unquote, urlparse

    from deltalake import DeltaTable

    root = path.resolve()
    return {Path(unquote(urlparse(u).path) if u.startswith("file:") else u).relative_to(root)
            for u in DeltaTable(str(path)).file_uris()}


def rows_written(ctx: Context, version: tuple[int, int]) -> dict[str, Any]:
    """Rows of the new version per table, and the data files and bytes each table gained over the snapshot."""
    warehouse, out = ctx.warehouse(), {}
    for name in (*VERSIONED_TABLES, "exchanges", "rejected_rows"):
        df = warehouse.read(name)
        rows = None
        if "topology_major" in df.columns:
            rows = df.where(f"topology_major = {version[0]} AND topology_minor = {version[1]}").count()
        added = _local_files(ctx.warehouse_dir / name) - _local_files(ctx.pristine_dir / name)
        out[name] = {"rows_at_version": rows, "files_added": len(added),
                     "bytes_added": sum((ctx.warehouse_dir / name / f).stat().st_size for f in added)}
    return out


def migration_figures(ctx: Context, caps: list[int]) -> dict[str, Any]:
    """COPYs of the committed plan against their minimum (Spark SQL), replicas per node, and the committed plan
    re-scheduled by each policy at the configured cap and at ``caps`` (no planner rebuild)."""
    t_start = time.perf_counter()
    spark, warehouse = ctx.spark, ctx.warehouse()
    warehouse.register_views()
    new_row, prev_row = exchange_rows(warehouse)[:2]
    new = (new_row["topology_major"], new_row["topology_minor"])
    prev = (prev_row["topology_major"], prev_row["topology_minor"])

    def at(table: str, v: tuple[int, int]) -> str:
        return f"(SELECT * FROM {table} WHERE topology_major = {v[0]} AND topology_minor = {v[1]})"

    minimum = spark.sql(f"""
        WITH alive AS (SELECT node_id FROM {at('topology', new)} WHERE NOT coalesce(is_client, false)),
        owners AS (SELECT m.group_name, m.partition_id, m.node_id FROM {at('partition_map', prev)} m
                   JOIN alive a ON m.node_id = a.node_id WHERE m.state = 'OWNING'),
        bearing AS (SELECT DISTINCT group_name, partition_id FROM owners)
        SELECT count(*) FROM {at('ideal_assignment', new)} i
        JOIN bearing b ON i.group_name = b.group_name AND i.partition_id = b.partition_id
        LEFT ANTI JOIN owners o
            ON i.group_name = o.group_name AND i.partition_id = o.partition_id AND i.node_id = o.node_id
    """).first()[0]
    per_node = spark.sql(f"""
        WITH alive AS (SELECT node_id FROM {at('topology', new)} WHERE NOT coalesce(is_client, false)),
        counts AS (SELECT a.node_id, count(i.partition_id) AS replicas FROM alive a
                   LEFT JOIN {at('ideal_assignment', new)} i ON i.node_id = a.node_id GROUP BY a.node_id)
        SELECT count(*) AS nodes, sum(replicas) AS replicas, max(replicas) AS most, min(replicas) AS least FROM counts
    """).first()
    if ctx.event_type == "NODE_JOINED":
        balance = -(-int(per_node.replicas) // int(per_node.nodes))
        rule = "join: ceil(replicas / nodes) at the new version"
    else:
        balance = spark.sql(f"SELECT count(*) FROM {at('partition_map', prev)} "
                            f"WHERE node_id = '{ctx.node}' AND state = 'OWNING'").first()[0]
        rule = f"{ctx.event_type}: the OWNING copies {ctx.node} held at the previous version"

    plan = warehouse.read_arrow("migration_plan", where={"topology_major": new[0], "topology_minor": new[1]})
    plan = plan.sort_by([("group_name", "ascending"), ("partition_id", "ascending"), ("step", "ascending")])
    by_action = {a: plan.filter(pc.equal(plan.column("action"), a)) for a in pc.unique(plan.column("action"))
                 .to_pylist()} if plan.num_rows else {}
    committed = {a: {"steps": t.num_rows, "bytes": int(pc.sum(t.column("bytes")).as_py() or 0)}
                 for a, t in by_action.items()}
    serial: dict[str, float] = {}

    def makespans(cap: int) -> dict[str, Any]:
        model = cost_model(ctx.settings.migration.model_copy(update={"max_parallel_per_node": cap}))
        out: dict[str, Any] = {}
        for policy in POLICIES:
            if policy == "serial" and serial:  # one step at a time: the cap does not change it
                out.update(serial)
                continue
            t = time.perf_counter()
            scheduled = schedule(plan, model, policy) if plan.num_rows else plan
            out[f"{policy}_schedule_s"] = round(time.perf_counter() - t, 3)
            out[f"{policy}_s"] = round(makespan(scheduled), 2) if plan.num_rows else 0.0
            if policy == "portfolio":
                out["lower_bound_s"] = round(lower_bound(scheduled, model), 2) if plan.num_rows else 0.0
            if policy == "serial":
                serial.update({k: out[k] for k in ("serial_s", "serial_schedule_s")})
        return out

    at_cap = makespans(ctx.settings.migration.max_parallel_per_node)
    committed_makespan = round(float(new_row["makespan_s"] or 0.0), 2)
    copies = committed.get("COPY", {"steps": 0, "bytes": 0})
    return {
        "previous_version": f"{prev[0]}.{prev[1]}", "version": f"{new[0]}.{new[1]}",
        "committed_plan": committed, "copies": copies["steps"], "copy_bytes": copies["bytes"],
        "minimum_copies": int(minimum), "copies_at_minimum": copies["steps"] == int(minimum),
        "balance_minimum": int(balance), "balance_minimum_rule": rule,
        "replicas_per_node": {"nodes": int(per_node.nodes), "max": int(per_node.most),
                              "mean": round(int(per_node.replicas) / int(per_node.nodes), 2),
                              "min": int(per_node.least)},
        "committed_makespan_s": committed_makespan,
        "committed_lower_bound_s": round(float(new_row["makespan_lower_bound_s"] or 0.0), 2),
        # re-scheduling the committed plan by portfolio at the same cap gives the committed makespan
        "rescheduled_matches_committed": (abs(at_cap["portfolio_s"] - committed_makespan)
                                          <= 0.01 + 1e-6 * committed_makespan),
        "cap": ctx.settings.migration.max_parallel_per_node,
        "makespan": at_cap,
        "caps": {str(cap): makespans(cap) for cap in caps},
        "seconds": round(time.perf_counter() - t_start, 2),
    }


# ---------------------------------------------------------------------------------------------------------------
# Summaries and the report
# ---------------------------------------------------------------------------------------------------------------
def spread(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def summarize(all_runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Median, min and max of each figure over the runs of one mode (``cli``, ``select1`` or ``warm``)."""
    runs = [r[mode] for r in all_runs if mode in r]
    out: dict[str, Any] = {"runs": len(runs), "wall_s": spread([r["wall_s"] for r in runs])}
    if mode != "select1":
        seen = [n for r in runs for n in r["stage_s"]]
        names = [n for n in STAGES if n in seen] + [n for n in dict.fromkeys(seen) if n not in STAGES]
        out["stage_s"] = {n: spread([r["stage_s"].get(n, 0.0) for r in runs]) for n in names}
        out["outside_stages_s"] = spread([r["wall_s"] - sum(r["stage_s"].values()) for r in runs])
        out["spark_jobs"] = spread([r["spark_jobs"] for r in runs]) if all(r["spark_jobs"] is not None
                                                                           for r in runs) else None
    if mode == "cli":
        out |= {k: spread([r[k] for r in runs]) for k in ("startup_s", "exchange_s", "after_s")}
    if mode == "warm":
        out["stage_jobs"] = {n: spread([r["stage_jobs"].get(n, 0) for r in runs]) for n in out["stage_s"]}
        out["spark_jobs_seen"] = spread([r["spark_jobs_seen"] for r in runs])
        out["spark_job_sites"] = runs[-1]["spark_job_sites"]  # Spark's call site of each job, the last run's
    out["peak_rss_mb"] = {role: spread([r["by_role"].get(role, {}).get("peak_rss_mb", 0.0) for r in runs])
                          for role in ROLES}
    for key in ("peak_rss_sum_mb", "peak_rss_tree_sampled_mb", "tree_cpu_s", "other_work_core_s"):
        out[key] = spread([r[key] for r in runs])
    return out


def machine_info(spark: SparkSession, warehouse: Warehouse) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def v(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    conf = spark.sparkContext.getConf()
    return {
        "nproc": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "kernel": platform.release(),
        "python": platform.python_version(), "java": java[0] if java else None,
        **{p.replace("-", "_"): v(p) for p in ("pyspark", "deltalake", "delta-spark", "pyarrow", "numpy")},
        "storage_engine": warehouse.engine, "spark_master": spark.sparkContext.master,
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


def print_markdown(r: dict[str, Any]) -> None:
    c, s = r["cluster"], r["summary"]
    print(f"### {r['name'] + ': ' if r.get('name') else ''}{c['nodes']} nodes, {c['groups']} x "
          f"{c['partitions_per_group']:,} partitions, {c['backups']} backups, {c['event']} {c['node']}\n")
    print("| measure | median | min-max |\n|---|---|---|")

    def row(label: str, x: dict[str, Any] | None, unit: str = "s") -> None:
        if x is not None:
            print(f"| {label} | {x['median']:,} {unit} | {x['min']:,}-{x['max']:,} {unit} |")

    for mode, title in (("cli", "`rebalancer exchange`, whole process"), ("select1", '`rebalancer sql "SELECT 1"`'),
                        ("warm", "`run_exchange`, warm session")):
        if mode not in s:
            continue
        m = s[mode]
        row(f"{title}: wall ({m['runs']} runs)", m["wall_s"])
        for key, label in (("startup_s", "startup (interpreter, imports, Spark)"), ("exchange_s", "the exchange"),
                           ("after_s", "commit row, shutdown")):
            row(f"&nbsp;&nbsp;{label}", m.get(key))
        row("&nbsp;&nbsp;Spark jobs (engine's count)", m.get("spark_jobs"), "")
        row("&nbsp;&nbsp;Spark jobs seen by the status store", m.get("spark_jobs_seen"), "")
        for stage, x in m.get("stage_s", {}).items():
            jobs = m.get("stage_jobs", {}).get(stage)
            row(f"&nbsp;&nbsp;stage {stage}" + (f" ({jobs['median']:g} jobs)" if jobs else ""), x)
        for role in ROLES:
            row(f"&nbsp;&nbsp;peak RSS, {role.replace('_', ' ')}", m["peak_rss_mb"][role], "MB")
        row("&nbsp;&nbsp;CPU of the process tree", m["tree_cpu_s"], "core-s")
        row("&nbsp;&nbsp;CPU used by other work meanwhile", m["other_work_core_s"], "core-s")
    sites = s.get("warm", {}).get("spark_job_sites")
    if sites:
        print("\nSpark jobs of the last warm run by call site: " + ", ".join(f"{k} x{v}" for k, v in sites.items()))
    e, m = r["exchange"], r["migrations"]
    print(f"\nExchange {e['exchange_id']} -> version {e['version']} ({e['exchange_type']}): lost "
          f"{e['lost_partitions']:,}, moving copies {e['moving_copies']:,}, temporary primaries "
          f"{e['temporary_primaries']:,}, migrations {e['migrations']:,}, {e['bytes_to_move'] / 2**30:,.1f} GiB.\n")
    print("| table | rows at the new version | files added | bytes added |\n|---|---|---|---|")
    for name, w in r["rows_written"].items():
        rows = "-" if w["rows_at_version"] is None else f"{w['rows_at_version']:,}"
        print(f"| {name} | {rows} | {w['files_added']} | {w['bytes_added']:,} |")
    mk, per_node = m["makespan"], m["replicas_per_node"]
    print(f"\nMigrations {m['previous_version']} -> {m['version']}: {m['copies']:,} COPYs (minimum "
          f"{m['minimum_copies']:,}, balance minimum {m['balance_minimum']:,}); replicas per node max "
          f"{per_node['max']:,} / mean {per_node['mean']:,} / min {per_node['min']:,}; makespan at cap {m['cap']}: "
          f"portfolio {mk['portfolio_s']:,} s (committed {m['committed_makespan_s']:,} s), "
          f"hazelcast {mk['hazelcast_s']:,} s, serial {mk['serial_s']:,} s, lower bound {mk['lower_bound_s']:,} s.")
    if m["caps"]:
        print("\n| cap | portfolio | hazelcast | serial | lower bound |\n|---|---|---|---|---|")
        for cap, x in m["caps"].items():
            print(f"| {cap} | {x['portfolio_s']:,} s | {x['hazelcast_s']:,} s | {x['serial_s']:,} s | "
                  f"{x['lower_bound_s']:,} s |")
    la = r["load_average"]
    print(f"\nload average before {la['before']}, during the timed runs (1 min) {la['during_timed_runs_1min']}, "
          f"after {la['after']}")


def main() -> None:  # noqa: C901 (a linear script)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default=None, help="label of the scenario change (kept in the results)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--groups", type=int, default=1, help="cache groups; the partitions are split evenly")
    parser.add_argument("--partitions-total", type=int, default=65_536, help="partitions over all groups")
    parser.add_argument("--backups", type=int, default=2)
    parser.add_argument("--seed", type=int, default=20_261_121)
    parser.add_argument("--event", choices=EVENTS, default="NODE_FAILED")
    parser.add_argument("--node", default=None, help="default: node<nodes/2> fails or leaves; node<nodes> joins")
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (a whole-process and a warm run each)")
    parser.add_argument("--cli-runs", type=int, default=None,
                        help="whole-process runs, in the first rounds only (default: every round)")
    parser.add_argument("--caps", type=lambda t: [int(x) for x in t.split(",") if x.strip()], default=[],
                        metavar="N,N,...", help="also schedule the committed plan at these per-node caps")
    parser.add_argument("--conf", type=Path, default=None, help="TOML settings for every run (rebalancer --conf)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for every mode (the CLI gets it through PYSPARK_SUBMIT_ARGS)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--pristine", type=Path, default=None, help="reuse this post-first-exchange warehouse")
    parser.add_argument("--save-pristine", type=Path, default=None, help="copy the post-first-exchange warehouse here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "exchange.json")
    args = parser.parse_args()
    if args.partitions_total % args.groups or not 1 <= args.partitions_total // args.groups <= 65_536:
        parser.error("--groups must divide --partitions-total into groups of 1..65,536 partitions")
    per_group = args.partitions_total // args.groups
    node = args.node or (f"node{args.nodes}" if args.event == "NODE_JOINED" else f"node{args.nodes // 2}")
    cli_runs = args.runs if args.cli_runs is None else min(args.cli_runs, args.runs)
    spark_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    settings = load_settings(args.conf)
    cli = Path(sys.executable).with_name("rebalancer")
    if not cli.exists():
        parser.error(f"{cli} not found; install the package into this interpreter's environment")

    load_before, load = os.getloadavg(), LoadSampler()
    t_start = time.perf_counter()
    with workdir(args.workdir, args.keep) as work:
        setup: dict[str, Any] = {}
        spark = get_spark(settings.spark, extra_conf=spark_conf, delta=wants_delta_jars(settings.storage))
        ctx = Context(spark, settings, work / "warehouse", work / "pristine", args.event, node, cli, args.conf,
                      spark_conf)
        if args.pristine is not None:
            shutil.copytree(args.pristine, ctx.pristine_dir)
            setup["reused_pristine"] = str(args.pristine)
        else:
            log(f"rebalancer generate: {args.nodes} nodes, {args.groups} x {per_group} partitions, "
                f"{args.backups} backups, seed {args.seed}")
            setup["generate"] = run_process(cli_command(
                ctx, ctx.pristine_dir, "generate", "--nodes", str(args.nodes), "--groups", str(args.groups),
                "--partitions", str(per_group), "--backups", str(args.backups), "--seed", str(args.seed),
            ), spark_conf, load)
            log("first exchange (the initial joins)")
            t0 = time.perf_counter()
            first = run_exchange(spark, ctx.warehouse(ctx.pristine_dir), settings)
            setup["first_exchange"] = {"wall_s": round(time.perf_counter() - t0, 2),
                                       "spark_jobs": [s.spark_jobs for s in first],
                                       "exchanges": [counts(s) for s in first]}
            if args.save_pristine is not None:
                shutil.rmtree(args.save_pristine, ignore_errors=True)
                shutil.copytree(ctx.pristine_dir, args.save_pristine)
        pristine = ctx.warehouse(ctx.pristine_dir)
        groups = pristine.read_arrow("cache_groups")
        node_ids = set(pristine.read_arrow("nodes").column("node_id").to_pylist())
        found = (len(node_ids), groups.num_rows, pc.sum(groups.column("partitions")).as_py(),
                 pc.max(groups.column("backups")).as_py())
        if found != (args.nodes, args.groups, args.partitions_total, args.backups):
            raise SystemExit(f"the pristine warehouse has (nodes, groups, partitions, backups) {found}; "
                             "it does not match the arguments")
        if (node in node_ids) != (args.event != "NODE_JOINED"):
            raise SystemExit(f"{args.event} {node}: the node must {'not ' if args.event == 'NODE_JOINED' else ''}"
                             "be one of the generated nodes")
        if args.pristine is not None:
            log("warm-up: one untimed exchange of the change (the first exchange ran in another process)")
            restore(ctx)
            t0 = time.perf_counter()
            run_exchange(spark, ctx.warehouse(), settings)
            setup["warmup_exchange_wall_s"] = round(time.perf_counter() - t0, 2)

        runs: list[dict[str, Any]] = []
        expected: dict[str, Any] | None = None
        t_runs = time.perf_counter()
        for i in range(1, args.runs + 1):
            entry: dict[str, Any] = {"run": i}
            if i <= cli_runs:
                restore(ctx)
                log(f"run {i}/{args.runs}: rebalancer exchange (whole process)")
                entry["cli"] = run_cli(ctx, load)
                log(f"  {entry['cli']['wall_s']:.1f} s, {entry['cli']['spark_jobs']} Spark jobs")
                entry["select1"] = run_select_one(ctx, load)
                log(f"  rebalancer sql 'SELECT 1': {entry['select1']['wall_s']:.1f} s")
            restore(ctx)
            log(f"run {i}/{args.runs}: run_exchange in the warm session")
            entry["warm"], _ = run_warm(ctx, load)
            log(f"  {entry['warm']['wall_s']:.1f} s, {entry['warm']['spark_jobs']} Spark jobs")
            for mode in ("cli", "warm"):
                if mode in entry:
                    expected = expected or entry[mode]["counts"]
                    if entry[mode]["counts"] != expected:
                        raise RuntimeError(f"run {i} {mode} committed {entry[mode]['counts']}, expected {expected}")
            runs.append(entry)
        t_runs_end = time.perf_counter()
        assert expected is not None
        log("rows written, migrations against their minimum, makespans (untimed)")
        version = tuple(int(x) for x in expected["version"].split("."))
        written = rows_written(ctx, (version[0], version[1]))
        migrations = migration_figures(ctx, args.caps)
        load.stop()
        report: dict[str, Any] = {
            "name": args.name,
            "command": shlex.join([".venv/bin/python", "bench/exchange.py", *sys.argv[1:]]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "total_benchmark_s": round(time.perf_counter() - t_start, 1),
            "code": measured_code(),
            "machine": machine_info(spark, pristine),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()],
                             "during_timed_runs_1min": load.between(t_runs, t_runs_end)},
            "cluster": {"nodes": args.nodes, "groups": args.groups, "partitions_per_group": per_group,
                        "partitions_total": args.partitions_total, "backups": args.backups,
                        "replicas": args.partitions_total * (args.backups + 1), "seed": args.seed,
                        "event": args.event, "node": node, "spark_conf": spark_conf,
                        "conf": str(args.conf) if args.conf else "defaults (conf/default.toml)"},
            "setup": setup,
            "stages": list(STAGES),
            "exchange": expected,
            "rows_written": written,
            "rows_written_total": sum(w["rows_at_version"] or 0 for w in written.values()),
            "bytes_written_total": sum(w["bytes_added"] for w in written.values()),
            "migrations": migrations,
            "summary": {m: summarize(runs, m) for m in ("cli", "select1", "warm") if any(m in r for r in runs)},
            "runs": runs,
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print_markdown(report)
    log(f"written to {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
