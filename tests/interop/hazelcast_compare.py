"""Hazelcast's real migrations against rebalancer's planner on the same membership change (docs/INTEROP.md).

Contract:
    - :func:`benchmark_script` is the membership script of Hazelcast's parallel-migrations benchmark: ten members,
      10 -> 9 graceful shutdown, 9 -> 10 join, a crash of one, with ``backups`` backups.
    - :func:`classify` sorts the migrations Hazelcast's master completed (with their replica indexes, from the
      harness) into Hazelcast's kinds and says which move data: a migration moves data when its destination gets a
      replica index <= backups and held none of the partition's data before (no replica, or one above backups).
    - :func:`compare` plans the same change with rebalancer's exchange kernel from Hazelcast's layout before it (no
      Spark: the kernel's ``decide`` on every partition in one batch, as the pipeline's tasks run it), for two
      targets: Hazelcast's own layout after it (same target: planner and schedule compared) and rebalancer's
      rendezvous ideal over the members after it; it schedules both plans, and Hazelcast's migrations, under
      rebalancer's cost model. Every figure is a plain dict of numbers, for the test and for docs/INTEROP.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The cluster of bench/migrations.py (205 MB partitions, one counter, every copy OWNING) and its kernel input.
from bench.migrations import GROUP, PARTITION_BYTES, Layout, duration_text, kernel_input, minimum_copies
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.client.affinity import assign
from rebalancer.config import MigrationSettings
from rebalancer.exchange.kernel import KernelContext, decide
from rebalancer.groups import GroupSettings
from rebalancer.planning.plan import cost_model, finish_plan
from rebalancer.planning.schedule import PLAN_INPUT_SCHEMA, lower_bound, makespan, schedule


def benchmark_script(partitions: int, backups: int = 1, members: int = 10) -> dict[str, Any]:
    """The harness script: start ``members``, then the three changes of the benchmark on the last member."""
    names = [f"member{i}" for i in range(members)]
    last = names[-1]
    steps: list[dict[str, Any]] = [{"op": "start", "member": m, "layout": m == last} for m in names]
    steps += [
        {"op": "shutdown", "member": last, "scenario": f"graceful shutdown {members} -> {members - 1}"},
        {"op": "start", "member": last, "scenario": f"join {members - 1} -> {members}"},
        {"op": "terminate", "member": last, "scenario": f"crash {members} -> {members - 1}"},
    ]
    return {"partitions": partitions, "backups": backups, "steps": steps}


def kind_of(m: dict[str, Any]) -> str:
    """Hazelcast's name for a migration, from its replica indexes (``MigrationPlanner``'s vocabulary)."""
    if m["kind"] == "PROMOTION":
        return "PROMOTION"
    if m["destination_current"] != -1:
        return "SHIFT UP"
    if m["source"] is None or m["source_current"] == -1:
        return "COPY"
    if m["source_new"] == -1:
        return "MOVE"
    return "SHIFT DOWN"


def moves_data(m: dict[str, Any], backups: int) -> bool:
    """The destination receives a data-holding replica (index <= backups) it held no data of before."""
    if m["kind"] == "PROMOTION" or not m["success"]:
        return False
    held = m["destination_current"]
    return m["destination_new"] <= backups and (held == -1 or held > backups)


def classify(migrations: list[dict[str, Any]], backups: int) -> dict[str, Any]:
    """Counts by kind, data-bearing ones, the total, and the rows (promotions deduplicated by partition, member)."""
    seen: set[tuple[int, str | None]] = set()
    rows = []
    for m in migrations:
        if m["kind"] == "PROMOTION":
            key = (m["partition"], m["destination"])
            if key in seen:
                continue
            seen.add(key)
        rows.append(m)
    kinds = Counter(kind_of(m) for m in rows)
    data = [m for m in rows if moves_data(m, backups)]
    return {
        "migrations": sum(1 for m in rows if m["kind"] == "MIGRATION"),
        "promotions": kinds.pop("PROMOTION", 0),
        "kinds": dict(sorted(kinds.items())),
        "data_bearing": len(data),
        "data_bearing_rows": data,
        "rows": rows,
    }


def data_layout(layout: Layout, backups: int) -> Layout:
    """The replicas that hold data: indexes 0..backups of Hazelcast's 7-slot table, empty slots dropped."""
    return [[n for n in row[: backups + 1] if n is not None] for row in layout]


@dataclass(frozen=True)
class PlanFigures:
    """One plan under rebalancer's cost model (cap = ``migration.max_parallel_per_node``)."""

    copies: int
    promotes: int
    drops: int
    steps: int
    makespan_s: float
    lower_bound_s: float


def _our_plan(before: Layout, after: Layout, alive: list[str], backups: int) -> pa.Table:
    """The kernel's plan from ``before`` to the target ``after`` (placed as given, not by an affinity function),
    over the ``alive`` members (a graceful leaver is alive: it supplies its data until the copies are done)."""
    nodes = NodeSet.of(sorted(alive))
    index = {n: i for i, n in enumerate(nodes.node_ids)}
    width = max(len(r) for r in after)
    target = np.full((len(after), width), -1, dtype=np.int32)
    for p, row in enumerate(after):
        target[p, : len(row)] = [index[n] for n in row]
    ctx = KernelContext(nodes, {n: i + 1 for i, n in enumerate(nodes.node_ids)},
                        {GROUP: GroupSettings(GROUP, len(after), backups)}, history_threshold=500,
                        placements={GROUP: target})
    return finish_plan(decide(kernel_input(before), ctx).steps, MigrationSettings())  # decide checks invariants


def _figures(plan: pa.Table, policy: str, cap: int) -> PlanFigures:
    model = cost_model(MigrationSettings().model_copy(update={"max_parallel_per_node": cap}))
    counts = {r["values"]: r["counts"] for r in pc.value_counts(plan.column("action")).to_pylist()}
    scheduled = schedule(plan, model, policy)
    return PlanFigures(counts.get("COPY", 0), counts.get("PROMOTE", 0), counts.get("DROP", 0), plan.num_rows,
                       round(makespan(scheduled), 1), round(lower_bound(scheduled, model), 1))


def hazelcast_plan(migrations: list[dict[str, Any]], before: Layout, after: Layout, backups: int) -> pa.Table:
    """Hazelcast's completed migrations as a plan in rebalancer's model, in the order Hazelcast ran them.

    A data-bearing migration is a COPY of one partition's bytes from its source (when Hazelcast names none, from a
    member that holds the partition's data after the change); every other migration or promotion moves no data
    and is a one-member step that costs the per-step overhead on its destination (a DROP-shaped step: no bytes).
    """
    rows: list[dict[str, Any]] = []
    steps: Counter[int] = Counter()
    for m in migrations:
        if not m["success"]:
            continue
        p = m["partition"]
        steps[p] += 1
        data = moves_data(m, backups)
        held = m["source"] is not None and 0 <= m["source_current"] <= backups
        holders = [n for n in after[p] if n != m["destination"]] or before[p] or [m["destination"]]
        source = m["source"] if held else holders[0]
        rows.append({
            "migration_id": len(rows) + 1, "group_name": GROUP, "partition_id": p, "step": steps[p],
            "action": "COPY" if data else "DROP",
            "source_node": source if data else m["destination"],
            "target_node": m["destination"] if data else None,
            "candidates": [source] if data else [],
            "primary_node": before[p][0] if before[p] else source,
            "transfer": "entries" if data else None,
            "bytes": PARTITION_BYTES if data else 0,
            "owners": len(before[p]), "replicas": backups + 1,
        })
    return pa.Table.from_pylist(rows, schema=PLAN_INPUT_SCHEMA)


def compare(run: dict[str, Any], cap: int = 10) -> list[dict[str, Any]]:
    """One row per scenario step of ``run`` (the harness dump of :func:`benchmark_script`)."""
    backups = int(run["backups"])
    steps = run["steps"]
    out = []
    for i, step in enumerate(steps):
        scenario = step["step"].get("scenario")
        if scenario is None:
            continue
        before_full = steps[i - 1]["layout"]
        before = data_layout(before_full, backups)
        after = data_layout(step["layout"], backups)
        members_after = list(step["members"])
        leaver = step["step"]["member"]
        graceful = step["step"]["op"] == "shutdown"
        # A graceful leaver stays a source until its data moved; a crashed one is gone; a joiner holds nothing.
        alive = members_after + ([leaver] if graceful else [])
        hz = classify(step["migrations"], backups)
        hz_plan = hazelcast_plan(hz["rows"], before, after, backups)
        same_target = _our_plan(before, after, alive, backups)
        ours_ideal = [list(r) for r in assign(sorted(members_after), len(after), backups)]
        own_target = _our_plan(before, ours_ideal, alive, backups)
        out.append({
            "scenario": scenario,
            "partitions": len(after),
            "hazelcast_seconds": round(float(step["seconds"]), 1),
            "hazelcast": {k: v for k, v in hz.items() if k not in ("data_bearing_rows", "rows")},
            "hazelcast_listener_completed": step["listener_completed"],
            "minimum_copies_hazelcast_target": minimum_copies(before, after, set(alive)),
            "minimum_copies_rendezvous_target": minimum_copies(before, ours_ideal, set(alive)),
            "hazelcast_plan": _figures(hz_plan, "hazelcast", cap).__dict__,
            "ours_same_target": _figures(same_target, "portfolio", cap).__dict__,
            "ours_rendezvous_target": _figures(own_target, "portfolio", cap).__dict__,
            "cap": cap,
        })
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The docs/INTEROP.md table of :func:`compare`'s rows."""
    head = ("| scenario | partitions | Hazelcast migrations (+ promotions) | by kind | data-bearing | "
            "ours, same target: copies / promotes / drops = steps | ours, rendezvous target: copies / steps | "
            "makespan: Hazelcast's migrations | ours, same target | ours, rendezvous target |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        hz, same, own, hzp = r["hazelcast"], r["ours_same_target"], r["ours_rendezvous_target"], r["hazelcast_plan"]
        kinds = ", ".join(f"{k} {v:,}" for k, v in hz["kinds"].items())
        lines.append(
            f"| {r['scenario']} | {r['partitions']:,} | {hz['migrations']:,} (+ {hz['promotions']:,}) | {kinds} | "
            f"{hz['data_bearing']:,} | {same['copies']:,} / {same['promotes']:,} / {same['drops']:,} = "
            f"{same['steps']:,} | {own['copies']:,} / {own['steps']:,} | {duration_text(hzp['makespan_s'])} | "
            f"{duration_text(same['makespan_s'])} | {duration_text(own['makespan_s'])} |"
        )
    return "\n".join(lines)

