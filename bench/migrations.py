"""Benchmark: Hazelcast's migration scenario in our cost model, planned by the exchange kernel, scheduled three ways.

Hazelcast measured its "parallel independent migrations" on 10 members, 20,000 partitions with 1 backup, about
4.1 TB, on 20 Gbps links: a 10 -> 9 graceful scale-down took 35m34s with serial migrations, 4m45s with 5 parallel
migrations per member and 3m22s with 20. This script rebuilds that cluster (20,000 partitions of 205 MB, rendezvous
affinity over ``node0..node9``, every ideal copy OWNING at the same counter) and three changes:

- ``scale-down``: ``node9`` leaves gracefully: it is no longer an affinity node but stays alive and OWNING until
  its data has moved (Hazelcast's graceful shutdown; Ignite's baseline change). The kernel sees it as an alive
  server of capacity 0, which rendezvous never selects (the script checks that the ideal lists are those of the
  nine others). Hazelcast's table still names it primary of its partitions when the migrations start, so the
  ``hazelcast`` baseline copies those from it (``primary_node`` = the previous primary while it is alive).
- ``scale-up``: ``node9`` joins a cluster of nine.
- ``crash``: ``node9`` fails: its copies are gone and the survivors re-create them.

For each, the exchange kernel decides every partition (``rebalancer.exchange.kernel.decide`` on the previous map,
assignment and versions, in one batch, as the pipeline's ``mapInArrow`` tasks do) and
``rebalancer.planning.plan.finish_plan`` picks the suppliers and sets bytes and ids; then the plan is scheduled
(``rebalancer.planning.schedule``) by ``portfolio``, ``hazelcast`` and ``serial`` at per-node caps 5, 10 and 20, under
the default cost model (docs/PLANNING.md). Pure Python and NumPy: no Spark. Reported per scenario: data-bearing
copies and the theoretical minimum (ideal copies whose node holds no data, counted from the layouts alone), bytes
moved, makespans, the lower bound of our schedule, and how long planning and scheduling took.

Run from the repository root: ``.venv/bin/python bench/migrations.py`` (``--tiny``: 200 partitions, to try it
out). Writes ``bench/results/migrations.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # running from a checkout without `pip install -e .`

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from rebalancer.affinity.assign import assign  # noqa: E402
from rebalancer.affinity.nodeset import NodeSet  # noqa: E402
from rebalancer.config import MigrationSettings  # noqa: E402
from rebalancer.exchange.kernel import (  # noqa: E402
    ASSIGNMENT,
    INPUT_SCHEMA,
    MAP,
    PARTITION,
    VERSION,
    KernelContext,
    decide,
)
from rebalancer.groups import GroupSettings  # noqa: E402
from rebalancer.planning.plan import cost_model, finish_plan  # noqa: E402
from rebalancer.planning.schedule import lower_bound, makespan, schedule  # noqa: E402
from rebalancer.vocabulary import OWNING  # noqa: E402

PARTITIONS, BACKUPS = 20_000, 1
PARTITION_BYTES = 205_000_000  # 20,000 x 205 MB = 4.1 TB of primary data
ENTRIES = 200_000
COUNTER = 1_000
CAPS = (5, 10, 20)
GROUP = "hz"
# Hazelcast's published times for the graceful 10 -> 9 scale-down (its blog on parallel migrations)
HAZELCAST_PUBLISHED_S = {"serial": 35 * 60 + 34, "5": 4 * 60 + 45, "20": 3 * 60 + 22}

Layout = list[list[str]]


def kernel_input(before: Layout) -> pa.Table:
    """The kernel's rows for every partition: its marker, the previous map (every copy OWNING, on alive and dead
    nodes alike), the previous assignment (the previous ideal lists) and the previous version (1)."""
    n = len(before)
    pids = np.arange(n, dtype=np.int32)
    copies = np.array([len(nodes) for nodes in before])
    copy_pid = np.repeat(pids, copies)
    copy_node = [node for nodes in before for node in nodes]
    replica = np.concatenate([np.arange(k, dtype=np.int32) for k in copies]) if n else np.zeros(0, np.int32)
    m = copy_pid.size
    parts = [
        {"kind": np.full(n, PARTITION), "partition_id": pids},
        {"kind": np.full(m, MAP), "partition_id": copy_pid, "node_id": copy_node, "state": [OWNING] * m,
         "update_counter": np.full(m, COUNTER), "size": np.full(m, ENTRIES), "bytes": np.full(m, PARTITION_BYTES)},
        {"kind": np.full(m, ASSIGNMENT), "partition_id": copy_pid, "node_id": copy_node, "replica_index": replica,
         "is_temporary": np.zeros(m, bool)},
        {"kind": np.full(n, VERSION), "partition_id": pids, "partition_version": np.ones(n, np.int64)},
    ]
    tables = []
    for columns in parts:
        rows = len(columns["kind"])
        tables.append(pa.table({f.name: pa.array(columns[f.name], f.type) if f.name in columns else
                                (pa.array([GROUP] * rows, f.type) if f.name == "group_name" else pa.nulls(rows, f.type))
                                for f in INPUT_SCHEMA}, schema=INPUT_SCHEMA))
    return pa.concat_tables(tables)


def plan(before: Layout, after: Layout, nodes: NodeSet, settings: MigrationSettings) -> tuple[pa.Table, float]:
    """The kernel's decisions for every partition, finished into a plan; and the kernel's seconds."""
    ctx = KernelContext(nodes, {n: i for i, n in enumerate(nodes.node_ids)},
                        {GROUP: GroupSettings(GROUP, len(before), BACKUPS)}, history_threshold=500)
    table = kernel_input(before)
    t0 = time.perf_counter()
    d = decide(table, ctx)
    kernel_s = time.perf_counter() - t0
    ideal = d.ideal_assignment.sort_by([("partition_id", "ascending"), ("replica_index", "ascending")])
    got = [[] for _ in after]  # type: list[list[str]]
    for p, node in zip(ideal.column("partition_id").to_pylist(), ideal.column("node_id").to_pylist(), strict=True):
        got[p].append(node)
    if got != after:
        raise RuntimeError("the kernel's ideal assignment is not the expected layout after the change")
    return finish_plan(d.steps, settings), kernel_s


def with_primary(table: pa.Table, before: Layout, alive: set[str]) -> pa.Table:
    """``primary_node`` = the primary at the start of the migrations, as Hazelcast's partition table has it: the
    previous primary while it is alive (the graceful leaver included), else the serving primary."""
    old = [before[p][0] for p in table.column("partition_id").to_pylist()]
    serving = table.column("primary_node").to_pylist()
    primary = [o if o in alive else s for o, s in zip(old, serving, strict=True)]
    index = table.schema.get_field_index("primary_node")
    return table.set_column(index, "primary_node", pa.array(primary, pa.string()))


def minimum_copies(before: Layout, after: Layout, alive: set[str]) -> int:
    """Ideal copies whose node holds no data: what any plan must copy (counted without the kernel)."""
    return sum(1 for p, nodes in enumerate(after) for n in nodes if n not in before[p] or n not in alive)


def run_scenario(name: str, before: Layout, after: Layout, nodes: NodeSet, base: MigrationSettings) -> dict[str, Any]:
    alive = set(nodes.node_ids)
    t0 = time.perf_counter()
    table, kernel_s = plan(before, after, nodes, base)
    plan_s = time.perf_counter() - t0
    table = with_primary(table, before, alive)
    counts = {a["values"]: a["counts"] for a in pc.value_counts(table.column("action")).to_pylist()}
    copies = table.filter(pc.equal(table.column("action"), "COPY"))
    row: dict[str, Any] = {
        "scenario": name,
        "steps": table.num_rows,
        "copies": counts.get("COPY", 0),
        "promotes": counts.get("PROMOTE", 0),
        "drops": counts.get("DROP", 0),
        "minimum_copies": minimum_copies(before, after, alive),
        "bytes_moved": int(pc.sum(copies.column("bytes")).as_py() or 0),
        "plan_s": round(plan_s, 2),
        "kernel_s": round(kernel_s, 2),
        "caps": {},
    }
    serial = None
    for cap in CAPS:
        model = cost_model(base.model_copy(update={"max_parallel_per_node": cap}))
        result: dict[str, Any] = {}
        for policy in ("portfolio", "hazelcast") + (("serial",) if serial is None else ()):
            t = time.perf_counter()
            scheduled = schedule(table, model, policy)
            result[f"{policy}_schedule_s"] = round(time.perf_counter() - t, 2)
            result[f"{policy}_makespan_s"] = round(makespan(scheduled), 1)
            if policy == "portfolio":
                result["lower_bound_s"] = round(lower_bound(scheduled, model), 1)
                result["portfolio_waves"] = int(pc.max(scheduled.column("wave")).as_py() or 0)
            if policy == "serial":
                serial = result["serial_makespan_s"]
        result["serial_makespan_s"] = serial
        result["portfolio_over_bound"] = round(result["portfolio_makespan_s"] / result["lower_bound_s"], 3)
        result["hazelcast_over_portfolio"] = round(result["hazelcast_makespan_s"] / result["portfolio_makespan_s"], 2)
        row["caps"][str(cap)] = result
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | cap | data-bearing copies (minimum) | promotes / drops | TB moved | portfolio | lower bound | "
        "portfolio / bound | hazelcast | hazelcast / portfolio | serial |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for cap, c in r["caps"].items():
            t = {k: duration_text(c[k]) for k in ("portfolio_makespan_s", "lower_bound_s", "hazelcast_makespan_s",
                                                  "serial_makespan_s")}
            lines.append(
                f"| {r['scenario']} | {cap} | {r['copies']:,} ({r['minimum_copies']:,}) | "
                f"{r['promotes']:,} / {r['drops']:,} | {r['bytes_moved'] / 1e12:.2f} | "
                f"{t['portfolio_makespan_s']} | {t['lower_bound_s']} | {c['portfolio_over_bound']:.3f} | "
                f"{t['hazelcast_makespan_s']} | {c['hazelcast_over_portfolio']:.1f}x | {t['serial_makespan_s']} |"
            )
    return "\n".join(lines)


def duration_text(seconds: float) -> str:
    """Seconds for a table: ``2m49.7s``, ``57.6s``."""
    m, s = divmod(seconds, 60)
    return f"{int(m)}m{s:04.1f}s" if m else f"{s:.1f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "migrations.json"))
    parser.add_argument("--tiny", action="store_true", help="200 partitions instead of 20,000 (trying it out)")
    args = parser.parse_args()
    partitions = 200 if args.tiny else PARTITIONS
    ten = [f"node{i}" for i in range(10)]
    nine = ten[:9]

    def layout(nodes: NodeSet) -> Layout:
        return assign(nodes, partitions, BACKUPS)

    base = MigrationSettings()
    started = time.time()
    drained = NodeSet.of(ten, capacities=[1.0] * 9 + [0.0])  # node9 alive, never selected: a graceful leave
    rows = [
        run_scenario("scale-down 10 -> 9 (graceful)", layout(NodeSet.of(ten)), layout(NodeSet.of(nine)), drained,
                     base),
        run_scenario("scale-up 9 -> 10", layout(NodeSet.of(nine)), layout(NodeSet.of(ten)), NodeSet.of(ten), base),
        run_scenario("crash of one (10 -> 9)", layout(NodeSet.of(ten)), layout(NodeSet.of(nine)), NodeSet.of(nine),
                     base),
    ]
    report = {
        "benchmark": "migrations",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "command": "python bench/migrations.py" + (" --tiny" if args.tiny else ""),
        "planned_by": "rebalancer.exchange.kernel.decide + rebalancer.planning.plan.finish_plan (no Spark)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "numpy": np.__version__, "pyarrow": pa.__version__},
        "cluster": {"nodes": 10, "partitions": partitions, "backups": BACKUPS, "partition_bytes": PARTITION_BYTES,
                    "total_primary_bytes": partitions * PARTITION_BYTES},
        "cost_model": cost_model(base).__dict__ | {"caps": list(CAPS)},
        "hazelcast_published_scale_down_s": HAZELCAST_PUBLISHED_S,
        "scenarios": rows,
        "seconds": round(time.time() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(rows))
    print(f"\nwrote {args.out} in {report['seconds']} s")


if __name__ == "__main__":
    main()
