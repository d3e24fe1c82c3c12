"""spark-submit job: the main job end to end (= `rebalancer demo`).

    spark-submit jobs/demo.py [--warehouse W] [--conf F] [--nodes N --groups G --partitions P --backups B]
"""

import argparse
import sys
from pathlib import Path

from rebalancer.demo import run_demo
from rebalancer.workspace import Workspace


def options(parser: argparse.ArgumentParser) -> None:
    for name, default in (("--nodes", 12), ("--groups", 4), ("--partitions", 256), ("--backups", 2), ("--seed", 42)):
        parser.add_argument(name, type=int, default=default)
    parser.add_argument("--report-dir", type=Path, default=Path("report"))


def main(argv: list[str]) -> None:
    ws, a = Workspace.from_args(argv, "Run the demo end to end.", options)
    run_demo(ws, nodes=a.nodes, groups=a.groups, partitions=a.partitions, backups=a.backups, seed=a.seed,
             report_dir=a.report_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
