"""Benchmark: Hazelcast's migration scenario in our cost model, planned by our planner, scheduled three ways.

Hazelcast measured its "parallel independent migrations" on 10 members, 20,000 partitions with 1 backup, about
4.1 TB, on 20 Gbps links: a 10 -> 9 graceful scale-down took 35m34s with serial migrations, 4m45s with 5 parallel
migrations per member and 3m22s with 20. This script rebuilds that cluster (20,000 partitions of 205 MB, rendezvous
affinity over ``node0..node9``) and three changes:

- ``scale-down``: ``node9`` leaves gracefully: it is no longer an affinity node but stays alive and OWNING until
  its data has moved (Hazelcast's graceful shutdown; Ignite's baseline change). Hazelcast's table still names it
  primary of its partitions when the migrations start, so the ``hazelcast`` baseline copies those from it.
- ``scale-up``: ``node9`` joins a cluster of nine.
- ``crash``: ``node9`` fails: its copies are gone and the survivors re-create them.

For each, the real stages compute the late assignment and the map (``late_affinity``, ``surplus_to_renting``,
``add_moving_targets``) and the plan (``plan_migrations``, Spark); then the plan is scheduled in this process
(``rebalancer.planning.schedule``) with the policies ``ours``, ``hazelcast`` and ``serial`` at per-node caps 5, 10
and 20, under the default cost model (docs/PLANNING.md). Reported per scenario: data-bearing copies and the
theoretical minimum (ideal copies whose node holds no data, counted independently of the planner), bytes moved,
makespans, the lower bound of our schedule, and how long planning and scheduling took.

Run from the repository root: ``.venv/bin/python bench/migrations.py`` (about a minute). Writes
``bench/results/migrations.json`` and prints a Markdown table.
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
try:  # running from a checkout without `pip install -e .`: make the package importable here and in the workers
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from rebalancer.client.affinity import assign  # noqa: E402
from rebalancer.config import MigrationSettings, SparkSettings  # noqa: E402
from rebalancer.exchange import demands, fullmap, late_affinity  # noqa: E402
from rebalancer.exchange.fullmap import MAP_SCHEMA, REPORT_SCHEMA  # noqa: E402
from rebalancer.planning import planner  # noqa: E402
from rebalancer.planning.schedule import CostModel, lower_bound, makespan, schedule  # noqa: E402
from rebalancer.session import get_spark  # noqa: E402

PARTITIONS, BACKUPS = 20_000, 1
PARTITION_BYTES = 205_000_000  # 20,000 x 205 MB = 4.1 TB of primary data
ENTRIES = 200_000
COUNTER = 1_000
CAPS = (5, 10, 20)
GROUP = "hz"
# Hazelcast's published times for the graceful 10 -> 9 scale-down (its blog on parallel migrations)
HAZELCAST_PUBLISHED_S = {"serial": 35 * 60 + 34, "5": 4 * 60 + 45, "20": 3 * 60 + 22}

Layout = list[list[str]]


def layout(nodes: list[str]) -> Layout:
    return [list(r) for r in assign(nodes, PARTITIONS, BACKUPS)]


def frames(spark: SparkSession, before: Layout, after: Layout, alive: list[str]) -> dict[str, Any]:
    """The stage inputs: ideal (after), previous assignment (before), the map of copies on alive nodes, nodes."""
    ideal_rows = [(GROUP, p, i, n) for p, nodes in enumerate(after) for i, n in enumerate(nodes)]
    prev_rows = [(GROUP, p, i, n) for p, nodes in enumerate(before) for i, n in enumerate(nodes)]
    map_rows = [(GROUP, p, n, "OWNING", COUNTER, ENTRIES, PARTITION_BYTES)
                for p, nodes in enumerate(before) for n in nodes if n in alive]
    ddl = "group_name string, partition_id int, replica_index int, node_id string"
    return {
        "ideal": spark.createDataFrame(ideal_rows, ddl).localCheckpoint(),
        "prev": spark.createDataFrame(prev_rows, ddl),
        "map": spark.createDataFrame(map_rows, MAP_SCHEMA).localCheckpoint(),
        "nodes": spark.createDataFrame([(n, i + 1) for i, n in enumerate(alive)], "node_id string, node_order bigint"),
    }


def plan(spark: SparkSession, f: dict[str, Any]) -> pa.Table:
    assignment = late_affinity.late_affinity(f["ideal"], f["prev"], f["map"], f["nodes"]).localCheckpoint()
    map_df = late_affinity.surplus_to_renting(f["map"], assignment, f["ideal"])
    map_df = demands.add_moving_targets(map_df, f["ideal"]).localCheckpoint()
    no_reports = fullmap.latest_reports(spark.createDataFrame([], REPORT_SCHEMA))
    plan_df = planner.plan_migrations(f["ideal"], assignment, map_df, no_reports, history_threshold=500)
    return plan_df.toArrow()


def with_primary(table: pa.Table, before: Layout, alive: set[str]) -> pa.Table:
    """``primary_node`` = the primary at the start of the migrations, as Hazelcast's partition table has it: the
    previous primary while it is alive (the graceful leaver included), else the serving primary."""
    old = [before[p][0] for p in table.column("partition_id").to_pylist()]
    serving = table.column("primary_node").to_pylist()
    primary = [o if o in alive else s for o, s in zip(old, serving, strict=True)]
    index = table.schema.get_field_index("primary_node")
    return table.set_column(index, "primary_node", pa.array(primary, pa.string()))


def minimum_copies(before: Layout, after: Layout, alive: set[str]) -> int:
    """Ideal copies whose node holds no data: what any plan must copy (counted without the planner)."""
    return sum(1 for p, nodes in enumerate(after) for n in nodes if n not in before[p] or n not in alive)


def run_scenario(spark: SparkSession, name: str, before: Layout, after: Layout, alive: list[str],
                 base: MigrationSettings) -> dict[str, Any]:
    t0 = time.perf_counter()
    table = plan(spark, frames(spark, before, after, alive))
    plan_s = time.perf_counter() - t0
    table = with_primary(table, before, set(alive))
    actions = pc.value_counts(table.column("action")).to_pylist()
    counts = {a["values"]: a["counts"] for a in actions}
    copies = table.filter(pc.equal(table.column("action"), "COPY"))
    row: dict[str, Any] = {
        "scenario": name,
        "steps": table.num_rows,
        "copies": counts.get("COPY", 0),
        "promotes": counts.get("PROMOTE", 0),
        "drops": counts.get("DROP", 0),
        "minimum_copies": minimum_copies(before, after, set(alive)),
        "bytes_moved": int(pc.sum(copies.column("bytes")).as_py() or 0),
        "plan_s": round(plan_s, 2),
        "caps": {},
    }
    serial = None
    for cap in CAPS:
        model = planner.cost_model(base.model_copy(update={"max_parallel_per_node": cap}))
        result: dict[str, Any] = {}
        for policy in ("ours", "hazelcast") + (("serial",) if serial is None else ()):
            t = time.perf_counter()
            scheduled = schedule(table, model, policy)
            result[f"{policy}_schedule_s"] = round(time.perf_counter() - t, 2)
            result[f"{policy}_makespan_s"] = round(makespan(scheduled), 1)
            if policy == "ours":
                result["lower_bound_s"] = round(lower_bound(scheduled, model), 1)
                result["ours_waves"] = int(pc.max(scheduled.column("wave")).as_py() or 0)
            if policy == "serial":
                serial = result["serial_makespan_s"]
        result["serial_makespan_s"] = serial
        result["ours_over_bound"] = round(result["ours_makespan_s"] / result["lower_bound_s"], 3)
        result["hazelcast_over_ours"] = round(result["hazelcast_makespan_s"] / result["ours_makespan_s"], 2)
        row["caps"][str(cap)] = result
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | cap | data-bearing copies (minimum) | promotes / drops | TB moved | ours | lower bound | "
        "ours / bound | hazelcast | hazelcast / ours | serial |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for cap, c in r["caps"].items():
            lines.append(
                f"| {r['scenario']} | {cap} | {r['copies']:,} ({r['minimum_copies']:,}) | "
                f"{r['promotes']:,} / {r['drops']:,} | {r['bytes_moved'] / 1e12:.2f} | "
                f"{_t(c['ours_makespan_s'])} | {_t(c['lower_bound_s'])} | {c['ours_over_bound']:.3f} | "
                f"{_t(c['hazelcast_makespan_s'])} | {c['hazelcast_over_ours']:.1f}x | {_t(c['serial_makespan_s'])} |"
            )
    return "\n".join(lines)


def _t(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    return f"{int(m)}m{s:04.1f}s" if m else f"{s:.1f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "migrations.json"))
    args = parser.parse_args()
    spark = get_spark(SparkSettings(master="local[*]", shuffle_partitions=8, app_name="bench-migrations"))
    ten = [f"node{i}" for i in range(10)]
    nine = ten[:9]
    base = MigrationSettings()
    started = time.time()
    rows = [
        run_scenario(spark, "scale-down 10 -> 9 (graceful)", layout(ten), layout(nine), ten, base),
        run_scenario(spark, "scale-up 9 -> 10", layout(nine), layout(ten), ten, base),
        run_scenario(spark, "crash of one (10 -> 9)", layout(ten), layout(nine), nine, base),
    ]
    report = {
        "benchmark": "migrations",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "command": "python bench/migrations.py",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "pyspark": pyspark.__version__},
        "cluster": {"nodes": 10, "partitions": PARTITIONS, "backups": BACKUPS, "partition_bytes": PARTITION_BYTES,
                    "total_primary_bytes": PARTITIONS * PARTITION_BYTES},
        "cost_model": CostModel().__dict__ | {"caps": list(CAPS)},
        "hazelcast_published_scale_down_s": HAZELCAST_PUBLISHED_S,
        "scenarios": rows,
        "seconds": round(time.time() - started, 1),
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(rows))
    print(f"\nwrote {args.out} in {report['seconds']} s")


if __name__ == "__main__":
    main()
