"""``rebalancer demo``: the main job end to end on the embedded default (local Spark, local Delta warehouse).

It generates a steady cluster, validates the inputs, shows how data and primaries spread over nodes, then runs the
partition map exchange through a node failure and a node join, printing what each exchange decided and planned,
asks what every single failure and every zone outage would do from there (what-if), and ends with the twin
executing the plans until the cluster is stable.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from rebalancer.affinity.ideal import ideal_assignment_arrow
from rebalancer.console import console, print_round, print_stability, print_summary, print_what_if, step
from rebalancer.operations import generate_into, validate_warehouse
from rebalancer.summary import node_load
from rebalancer.workspace import Workspace

__all__ = ["run_demo"]


def _gib(n: int | None) -> str:
    return f"{(n or 0) / 2**30:,.1f} GiB"


def run_demo(state: Workspace, nodes: int, groups: int, partitions: int, backups: int, seed: int,
             report_dir: Path = Path("report")) -> None:
    """Run the demo, printing each step (see the module docstring)."""

    spark, warehouse, settings = state.spark, state.new_or_current_warehouse(), state.settings
    console.print(f"[bold]rebalancer demo[/bold]: warehouse {warehouse.location} (engine {warehouse.engine})")
    with step(f"generating a steady cluster: {nodes} nodes, {groups} groups x {partitions} partitions, "
              f"{backups} backups"):
        counts = generate_into(spark, warehouse, settings, nodes, groups, partitions, backups, seed)
    console.print(
        f"  {counts['nodes']} nodes, {counts['cache_groups']} groups, {counts['partition_reports']:,} partition copies"
    )
    with step("validating inputs"):
        rejected = validate_warehouse(warehouse, strict=settings.validation.strict)
    console.print(f"  {rejected} rejected rows" + ("" if rejected == 0 else " (see table rejected_rows)"))

    with step("computing the load per node"):
        node_rows = warehouse.read_arrow("nodes").to_pylist()
        assignment = ideal_assignment_arrow(node_rows, warehouse.read_arrow("cache_groups").to_pylist(),
                                            settings.affinity)
        load = {r["node_id"]: r for r in node_load(warehouse.read_arrow("partition_reports"), assignment).to_pylist()}
        rows = [{**load[n["node_id"]], "host": n["host"], "zone": dict(n["attributes"] or {}).get("zone")}
                for n in sorted(node_rows, key=lambda n: n["node_order"]) if n["node_id"] in load]
    table = Table(title="data per node", show_header=True, header_style="bold")
    for column in ("node", "host", "zone", "replicas", "primaries", "bytes"):
        table.add_column(column, justify="right" if column in ("replicas", "primaries", "bytes") else "left")
    for r in rows:
        table.add_row(r["node_id"], r["host"], r["zone"] or "", f"{r['replicas']:,}", f"{r['primaries']:,}",
                      _gib(r["bytes"]))
    console.print(table)
    replicas = [r["replicas"] for r in rows]
    if replicas:
        mean = sum(replicas) / len(replicas)
        console.print(
            f"  replicas per node: min {min(replicas):,}, mean {mean:,.1f}, max {max(replicas):,} "
            f"(max/mean {max(replicas) / mean:.3f}); total {_gib(sum(r['bytes'] or 0 for r in rows))}"
        )
    from rebalancer.operations import append_event
    from rebalancer.pipeline import run_exchange
    from rebalancer.report import collect_report_data, write_report
    from rebalancer.twin.simulate import simulate
    from rebalancer.what_if import what_if

    victim, newcomer = "node3", f"node{nodes}"
    join_version = None
    for title, event in (
        ("first exchange: the nodes join", None),
        (f"{victim} fails", ("NODE_FAILED", victim)),
        (f"{newcomer} joins", ("NODE_JOINED", newcomer)),
    ):
        if event is not None:
            append_event(spark, warehouse, event[0], node_id=event[1], zone="zone0")
        with step(f"exchange: {title}"):
            summaries = run_exchange(spark, warehouse, settings)
        for summary in summaries:
            print_summary(summary)
            join_version = (summary.topology_major, summary.topology_minor)

    with step("what if: every single failure and every zone outage, from the join's version"):
        sweep = what_if(spark, warehouse, settings, sweeps=["nodes", "zone"])
    print_what_if(sweep, 5)

    with step("twin: executing the plans until the cluster is stable"):
        result = simulate(spark, warehouse, settings, until_stable=True, on_round=print_round)
    print_stability(result.stability)

    with step("report of the join's plan"):
        page = write_report(collect_report_data(spark, warehouse, join_version, settings), report_dir)

    location = warehouse.location
    console.print("\nwhere to look next:")
    console.print(f"  the join's placement, data moved and schedule as charts: {page}")
    console.print(f"  rebalancer --warehouse {location} sql \"SELECT exchange_id, topology_major, topology_minor, "
                  "exchange_type, lost_partitions, temporary_primaries, migrations, makespan_s FROM exchanges "
                  "ORDER BY exchange_id\"")
    console.print(f"  rebalancer --warehouse {location} sql \"SELECT topology_major, topology_minor, action, "
                  "count(*), sum(bytes), max(est_end_s) FROM migration_plan GROUP BY ALL ORDER BY ALL\"")
    console.print(f"  rebalancer --warehouse {location} route --group group0 user-42 order-7")
    console.print(f"  rebalancer --warehouse {location} explain --group group0 --partition 0   # why it is where it is")
    console.print("  more ready queries: docs/QUERIES.md; the same story in a notebook: "
                  "notebooks/rebalance_walkthrough.ipynb")
