"""Replay a real Ignite run through rebalancer and compare them version by version (docs/INTEROP.md).

Contract:
    - :func:`replay` turns every harness step into rows of rebalancer's input tables (``nodes``,
      ``topology_events``, ``cache_groups`` and the ``partition_reports`` the nodes would send, taken from the
      harness's dump of each node's local partitions) and runs the exchange after each step, through
      :func:`run_exchange_once`, the only call into the exchange pipeline.
    - Reports are the changes between two dumps. For a ``rebalance`` step they are written before the exchange
      (rebalancing finished, so the new copies own and the switch is due), evictions after it; for every other
      step after the exchange (a node's single message carries the states the exchange itself decided).
    - :func:`compare_step` holds, for one step, what Ignite committed and what rebalancer committed: versions,
      exchange kinds, ideal and serving assignment, temporary primaries, MOVING copies, lost partitions; the test
      decides what must agree and pins what may not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rebalancer.config import Settings
from rebalancer.pipeline import run_exchange
from rebalancer.storage import Warehouse, open_warehouse
from rebalancer.tables import INPUT_TABLES

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVENT_OF_OP = {"start": "NODE_JOINED", "client": "NODE_JOINED", "stop": "NODE_LEFT", "kill": "NODE_FAILED",
               "start_cache": "CACHE_STARTED", "stop_cache": "CACHE_STOPPED", "reset_lost": "RESET_LOST_PARTITIONS",
               "activate": "CLUSTER_ACTIVATED", "deactivate": "CLUSTER_DEACTIVATED"}
Copy = tuple[str, str, int]  # (node, cache, partition)


def run_exchange_once(spark: SparkSession, warehouse: Warehouse, settings: Settings, now: datetime) -> list[Any]:
    """The one call into the exchange pipeline: every pending event and new report, committed versions' summaries."""
    return run_exchange(spark, warehouse, settings, clock=lambda: now)


@dataclass
class StepResult:
    """What rebalancer committed for one harness step."""

    op: str
    versions: list[tuple[int, int]] = field(default_factory=list)
    exchange_types: list[str] = field(default_factory=list)


def _copies(dump: dict[str, Any]) -> dict[Copy, tuple[str, int, int]]:
    out = {}
    for cache, nodes in dump.get("partitions", {}).items():
        for node, rows in nodes.items():
            for p, state, counter, size in rows:
                out[(node, cache, int(p))] = (state, int(counter), int(size))
    return out


class _Writer:
    def __init__(self, spark: SparkSession, warehouse: Warehouse) -> None:
        self.spark, self.warehouse = spark, warehouse
        self.event_seq = self.report_seq = 0

    def append(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            self.warehouse.append(table, self.spark.createDataFrame(rows, INPUT_TABLES[table]))

    def event(self, event_type: str, node: str | None, group: str | None) -> None:
        self.event_seq += 1
        self.append("topology_events", [(self.event_seq, event_type, node, group,
                                         T0 + timedelta(seconds=self.event_seq))])

    def reports(self, changes: list[tuple[Copy, tuple[str, int, int]]]) -> None:
        rows = []
        for (node, cache, p), (state, counter, size) in sorted(changes):
            self.report_seq += 1
            rows.append((node, cache, p, state, counter, size, size * 100, None, self.report_seq))
        self.append("partition_reports", rows)


def _diff(before: dict[Copy, tuple[str, int, int]], after: dict[Copy, tuple[str, int, int]],
          alive: set[str]) -> tuple[list[Any], list[Any]]:
    """(changed or new copies, copies an alive node no longer holds: EVICTED)."""
    changed = [(k, v) for k, v in after.items() if before.get(k) != v]
    evicted = [(k, ("EVICTED", before[k][1], 0)) for k in before if k not in after and k[0] in alive]
    return changed, evicted


def replay(spark: SparkSession, path: Path, script: dict[str, Any], run: dict[str, Any], *,
           persistent: bool = False, **overrides: dict[str, Any]) -> list[StepResult]:
    """Write each step of ``run`` (the harness dump of ``script``) into a new warehouse and run its exchange;
    ``persistent``: the caches' ``persistent`` column; ``overrides``: settings sections (e.g. ``baseline``)."""
    settings = Settings().with_overrides(storage={"warehouse": str(path)}, **overrides)
    warehouse = open_warehouse(spark, settings.storage)
    warehouse.create_tables()
    w = _Writer(spark, warehouse)
    previous: dict[Copy, tuple[str, int, int]] = {}
    known: set[str] = set()
    results = []
    for k, step in enumerate(run["steps"]):
        op, node, cache = step["step"]["op"], step["step"].get("node"), step["step"].get("cache")
        now = T0 + timedelta(minutes=k + 1)
        current = _copies(step)
        alive = {n["node_id"] for n in step.get("nodes", [])}
        changed, evicted = _diff(previous, current, alive)
        for n in step.get("nodes", []):
            if n["node_id"] not in known:
                known.add(n["node_id"])
                w.append("nodes", [(n["node_id"], n["node_uuid"], int(n["node_order"]), n["host"],
                                    n.get("attributes") or {}, 1.0, bool(n["is_client"]))])
        if op == "start_cache":
            spec = script["caches"][cache]
            w.append("cache_groups", [(cache, spec["partitions"], spec.get("backups", 0), spec.get("mode"), "ignite",
                                       spec.get("exclude_neighbors", False), spec.get("backup_filter"),
                                       spec.get("loss_policy", "READ_WRITE_SAFE"), persistent, None)])
        if op in EVENT_OF_OP:
            w.event(EVENT_OF_OP[op], node, cache)
        result = StepResult(op)
        if op == "rebalance":
            w.reports(changed)
            summaries = run_exchange_once(spark, warehouse, settings, now)
            w.reports(evicted)
        elif op in ("put", "keys"):  # no event: the reports wait for the next exchange
            summaries = []
            w.reports(changed + evicted)
        else:
            summaries = run_exchange_once(spark, warehouse, settings, now)
            w.reports(changed + evicted)
        result.versions = [(s.topology_major, s.topology_minor) for s in summaries]
        result.exchange_types = [s.exchange_type for s in summaries]
        results.append(result)
        previous = current
    run["warehouse"] = warehouse
    return results


def _at(warehouse: Warehouse, name: str, version: tuple[int, int]) -> list[Any]:
    major, minor = version
    df = warehouse.read(name).where((F.col("topology_major") == major) & (F.col("topology_minor") == minor))
    return df.collect()


def ours_at(warehouse: Warehouse, cache: str, version: tuple[int, int], partitions: int) -> dict[str, Any]:
    """rebalancer's committed tables of ``cache`` at ``version`` in the harness's shapes."""
    ideal: list[list[str]] = [[] for _ in range(partitions)]
    for r in sorted(_at(warehouse, "ideal_assignment", version), key=lambda r: r.replica_index):
        if r.group_name == cache:
            ideal[r.partition_id].append(r.node_id)
    serving: list[list[str]] = [[] for _ in range(partitions)]
    temporary: set[int] = set()
    for r in sorted(_at(warehouse, "affinity_assignment", version), key=lambda r: r.replica_index):
        if r.group_name == cache:
            serving[r.partition_id].append(r.node_id)
            if r.is_temporary:
                temporary.add(r.partition_id)
    states = {(r.node_id, r.partition_id): r.state for r in _at(warehouse, "partition_map", version)
              if r.group_name == cache}
    lost = sorted(r.partition_id for r in _at(warehouse, "lost_partitions", version) if r.group_name == cache)
    return {"ideal": ideal, "assignment": serving, "temporary": temporary, "states": states, "lost": lost}


def ignite_at(step: dict[str, Any], cache: str) -> dict[str, Any]:
    """Ignite's state of ``cache`` at the end of a step: last affinity version, local states, lost partitions."""
    versions = step.get("affinity", {}).get(cache, [])
    last = versions[-1] if versions else None
    states = {(node, p): state for node, rows in step.get("partitions", {}).get(cache, {}).items()
              for p, state, _c, _s in rows}
    return {"affinity": last, "states": states, "lost": step.get("lost", {}).get(cache, [])}


def temporary_of(ideal: list[list[str]], assignment: list[list[str]]) -> set[int]:
    """Partitions whose serving list is not the ideal one (Ignite marks none: this is how its dump shows them)."""
    return {p for p, (i, a) in enumerate(zip(ideal, assignment, strict=True)) if i != a}
