"""``rebalancer demo``: the main job end to end on the embedded default (local Spark, local Delta warehouse).

Today it generates a steady cluster, validates the inputs and shows how data and primaries spread over nodes.
The exchange, migration plan and twin simulation join it as they land.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from rich.table import Table

from rebalancer.affinity.ideal import ideal_assignment
from rebalancer.operations import generate_into, validate_warehouse
from rebalancer.summary import node_load

if TYPE_CHECKING:
    from rebalancer.cli import CliState

__all__ = ["run_demo"]


def _gib(n: int | None) -> str:
    return f"{(n or 0) / 2**30:,.1f} GiB"


def run_demo(state: CliState, nodes: int, groups: int, partitions: int, backups: int, seed: int) -> None:
    """Run the demo, printing each step (see the module docstring)."""
    from rebalancer.cli import console, step

    spark, warehouse, settings = state.spark, state.warehouse, state.settings
    console.print(f"[bold]rebalancer demo[/bold]: warehouse {warehouse.location} (engine {warehouse.engine})")
    with step(f"generating a steady cluster: {nodes} nodes, {groups} groups x {partitions} partitions, "
              f"{backups} backups"):
        counts = generate_into(spark, warehouse, settings, nodes, groups, partitions, backups, seed)
    console.print(
        f"  {counts['nodes']} nodes, {counts['cache_groups']} groups, {counts['partition_reports']:,} partition copies"
    )
    with step("validating inputs"):
        rejected = validate_warehouse(warehouse, strict=settings.validation.strict).count()
    console.print(f"  {rejected} rejected rows" + ("" if rejected == 0 else " (see table rejected_rows)"))

    with step("computing the load per node"):
        nodes_df = warehouse.read("nodes")
        assignment_df = ideal_assignment(nodes_df, warehouse.read("cache_groups"), settings.affinity)
        load = node_load(warehouse.read("partition_reports"), assignment_df)
        rows = load.join(nodes_df.select("node_id", "node_order", "host", F.col("attributes")["zone"].alias("zone")),
                         "node_id").orderBy("node_order").collect()
    table = Table(title="data per node", show_header=True, header_style="bold")
    for column in ("node", "host", "zone", "replicas", "primaries", "bytes"):
        table.add_column(column, justify="right" if column in ("replicas", "primaries", "bytes") else "left")
    for r in rows:
        table.add_row(r.node_id, r.host, r.zone or "", f"{r.replicas:,}", f"{r.primaries:,}", _gib(r.bytes))
    console.print(table)
    replicas = [r.replicas for r in rows]
    if replicas:
        mean = sum(replicas) / len(replicas)
        console.print(
            f"  replicas per node: min {min(replicas):,}, mean {mean:,.1f}, max {max(replicas):,} "
            f"(max/mean {max(replicas) / mean:.3f}); total {_gib(sum(r.bytes or 0 for r in rows))}"
        )
    console.print("\nnext:")
    location = warehouse.location
    console.print(f"  rebalancer --warehouse {location} sql \"SELECT state, count(*) FROM partition_reports GROUP BY state\"")
    console.print(f"  rebalancer --warehouse {location} event NODE_FAILED --node node3")
