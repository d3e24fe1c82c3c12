"""spark-submit job: evaluate hypothetical events against the latest committed version (= `rebalancer what-if`).

    spark-submit jobs/what_if.py [--warehouse W] [--conf F] [--scenario "NODE_FAILED n3; NODE_FAILED n7"]...
        [--sweep nodes|hosts|ATTRIBUTE]... [--top N]
"""

import argparse
import sys

from rebalancer.console import print_what_if
from rebalancer.what_if import parse_scenario, what_if
from rebalancer.workspace import Workspace


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", action="append", default=[], metavar="EVENTS")
    parser.add_argument("--sweep", action="append", default=[], metavar="KIND")
    parser.add_argument("--top", type=int, default=20)


def main(argv: list[str]) -> None:
    ws, a = Workspace.from_args(argv, "Evaluate hypothetical events; commit nothing.", options)
    scenarios = [parse_scenario(text) for text in a.scenario]
    print_what_if(what_if(ws.spark, ws.warehouse, ws.settings, scenarios, a.sweep), a.top)


if __name__ == "__main__":
    main(sys.argv[1:])
