"""spark-submit job: replace the warehouse's inputs with a steady synthetic cluster (= `rebalancer generate`).

    spark-submit jobs/generate.py [--warehouse W] [--conf F] --nodes N --groups G --partitions P --backups B --seed S
"""

import argparse
import sys

from rebalancer.console import console
from rebalancer.operations import generate_into
from rebalancer.workspace import Workspace


def options(parser: argparse.ArgumentParser) -> None:
    for name, default in (("--nodes", 5), ("--groups", 2), ("--partitions", 1024), ("--backups", 1), ("--seed", 0)):
        parser.add_argument(name, type=int, default=default)


def main(argv: list[str]) -> None:
    ws, a = Workspace.from_args(argv, "Generate a steady synthetic cluster.", options)
    warehouse = ws.new_or_current_warehouse()
    counts = generate_into(ws.spark, warehouse, ws.settings, a.nodes, a.groups, a.partitions, a.backups, a.seed)
    console.print(f"wrote {counts['nodes']} nodes, {counts['cache_groups']} cache groups, "
                  f"{counts['topology_events']} events and {counts['partition_reports']} partition reports "
                  f"to {ws.warehouse.location}")


if __name__ == "__main__":
    main(sys.argv[1:])
