"""Differential check while the kernel replaces the stages: recompute every committed version with the kernel.

For each version an exchange of the multi-stage path committed, the kernel gets the same inputs (the previous
version's tables, the reports the version consumed, the alive nodes, the running groups and which were started or
reset) and must decide exactly the rows the stages wrote, in every versioned table.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange.kernel import (
    ASSIGNMENT,
    INPUT_SCHEMA,
    LOST_ROW,
    MAP,
    PARTITION,
    REPORT,
    VERSION,
    GroupSettings,
    KernelContext,
    decide,
)
from rebalancer.planning.plan import finish_plan, schedule_plan
from rebalancer.storage import Warehouse


def _arrow(df: Any) -> pa.Table:
    return df.toArrow()


def _at(warehouse: Warehouse, name: str, version: tuple[int, int]) -> pa.Table:
    df = warehouse.read(name).where(
        (F.col("topology_major") == version[0]) & (F.col("topology_minor") == version[1])
    ).drop("topology_major", "topology_minor")
    return _arrow(df)


def _rows(t: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in t.to_pylist())


def replay(spark: SparkSession, warehouse: Warehouse, settings: Settings) -> int:
    """Recompute every committed data-affecting version with the kernel; assert equal rows. Returns versions checked."""
    exchanges = sorted(_arrow(warehouse.read("exchanges")).to_pylist(), key=lambda r: r["exchange_id"])
    events = {r["event_seq"]: r for r in _arrow(warehouse.read("topology_events")).to_pylist()}
    reports = _arrow(warehouse.read("partition_reports"))
    nodes = {r["node_id"]: r for r in _arrow(warehouse.read("nodes")).to_pylist()}
    groups = {r["group_name"]: r for r in _arrow(warehouse.read("cache_groups")).to_pylist()}
    checked = 0
    prev: dict[str, Any] | None = None
    for ex in exchanges:
        version = (ex["topology_major"], ex["topology_minor"])
        if ex["exchange_type"] == "NONE":
            prev = ex
            continue
        pv = (prev["topology_major"], prev["topology_minor"]) if prev else None
        topology = _at(warehouse, "topology", version).to_pylist()
        alive = [t for t in topology if not t["is_client"]]
        node_set = NodeSet.from_rows([nodes[t["node_id"]] for t in alive])
        orders = {t["node_id"]: t["node_order"] for t in topology}
        running = set(ex["running_groups"] or [])
        before = set(prev["running_groups"] or []) if prev else set()
        reset = {events[s]["group_name"] for s in ex["merged_event_seqs"]
                 if events[s]["event_type"] == "RESET_LOST_PARTITIONS"}
        settings_by_group = {
            g: GroupSettings(
                g, groups[g]["partitions"], groups[g]["backups"], groups[g]["mode"] or "PARTITIONED",
                groups[g]["affinity"] or "rendezvous", bool(groups[g]["exclude_neighbors"]),
                tuple(groups[g]["backup_filter"] or ()), groups[g]["loss_policy"] or "READ_WRITE_SAFE",
                started=g not in before, reset=g in reset,
            )
            for g in running
        }
        ctx = KernelContext(node_set, orders, settings_by_group, settings.rebalance.history_threshold)
        lo = prev["max_report_seq"] if prev and prev["max_report_seq"] is not None else -1
        hi = ex["max_report_seq"] if ex["max_report_seq"] is not None else -1
        seq = reports.column("report_seq")
        consumed = reports.filter(pc.and_(pc.greater(seq, lo), pc.less_equal(seq, hi)))
        older = reports.filter(pc.less_equal(seq, lo)).to_pylist()
        latest: dict[tuple[str, str, int], dict[str, Any]] = {}
        for r in sorted(older, key=lambda r: r["report_seq"]):
            latest[(r["node_id"], r["group_name"], r["partition_id"])] = r
        rows: list[dict[str, Any]] = []
        for g, s in settings_by_group.items():
            rows += [{"kind": PARTITION, "group_name": g, "partition_id": p} for p in range(s.partitions)]
        in_scope = {(g, p) for g, s in settings_by_group.items() for p in range(s.partitions)}
        if pv is not None:
            for r in _at(warehouse, "partition_map", pv).to_pylist():
                if (r["group_name"], r["partition_id"]) in in_scope:
                    rep = latest.get((r["node_id"], r["group_name"], r["partition_id"]))
                    rows.append({"kind": MAP, **r, "wal_history_counter": rep["wal_history_counter"] if rep else None})
            for r in _at(warehouse, "affinity_assignment", pv).to_pylist():
                if (r["group_name"], r["partition_id"]) in in_scope:
                    rows.append({"kind": ASSIGNMENT, **r})
            for r in _at(warehouse, "lost_partitions", pv).to_pylist():
                if (r["group_name"], r["partition_id"]) in in_scope:
                    rows.append({"kind": LOST_ROW, "group_name": r["group_name"], "partition_id": r["partition_id"]})
            for r in _at(warehouse, "partition_versions", pv).to_pylist():
                if (r["group_name"], r["partition_id"]) in in_scope:
                    rows.append({"kind": VERSION, **r})
        for r in consumed.to_pylist():
            if (r["group_name"], r["partition_id"]) in in_scope:
                rows.append({"kind": REPORT, **r})
        d = decide(pa.Table.from_pylist(rows, schema=INPUT_SCHEMA), ctx)
        plan, bound = schedule_plan(finish_plan(d.steps, settings.migration), settings.migration)
        where = f"version {version} (exchange {ex['exchange_id']}, {ex['exchange_type']})"
        compare = {
            "partition_map": ["group_name", "partition_id", "node_id", "state", "update_counter", "size", "bytes"],
            "counter_conflicts": ["group_name", "partition_id", "node_id", "update_counter", "max_update_counter",
                                  "size", "action"],
            "lost_partitions": ["group_name", "partition_id", "loss_policy", "read_allowed", "write_allowed"],
            "ideal_assignment": ["group_name", "partition_id", "replica_index", "node_id"],
            "affinity_assignment": ["group_name", "partition_id", "replica_index", "node_id", "is_temporary"],
            "partition_versions": ["group_name", "partition_id", "partition_version"],
        }
        for name, columns in compare.items():
            old = _rows(_at(warehouse, name, version), columns)
            new = _rows(getattr(d, name), columns)
            assert old == new, f"{where}: {name} differs\n old-only {sorted(set(old) - set(new))[:8]}\n " \
                               f"new-only {sorted(set(new) - set(old))[:8]}"
        plan_columns = ["migration_id", "group_name", "partition_id", "step", "action", "source_node", "target_node",
                        "rebalance_mode", "from_counter", "to_counter", "bytes", "wave", "transfer", "chunks"]
        old_plan = _at(warehouse, "migration_plan", version)
        assert _rows(old_plan, plan_columns) == _rows(plan, plan_columns), f"{where}: migration_plan differs\n" \
            f" old {_rows(old_plan, plan_columns)[:6]}\n new {_rows(plan, plan_columns)[:6]}"
        old_end = sorted(round(x, 6) for x in old_plan.column("est_end_s").to_pylist())
        new_end = sorted(round(x, 6) for x in plan.column("est_end_s").to_pylist())
        assert old_end == new_end, f"{where}: schedule differs"
        assert abs((ex["makespan_lower_bound_s"] or 0.0) - bound) < 1e-6, f"{where}: bound {bound} vs old"
        checked += 1
        prev = ex
    return checked
