"""spark-submit job: bring the warehouse to this release's format (= `rebalancer upgrade [--dry-run]`).

Run it once after installing a new release, before the scheduled jobs (docs/DEPLOY.md "Upgrading"):

    spark-submit jobs/upgrade.py [--warehouse W] [--conf F] [--dry-run]
"""

import argparse
import sys

from rebalancer.console import console
from rebalancer.upgrade import describe, upgrade
from rebalancer.workspace import Workspace


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list each change per table; write nothing")


def main(argv: list[str]) -> None:
    ws, args = Workspace.from_args(argv, "Bring the warehouse to this release's format.", _options)
    for line in describe(upgrade(ws.any_warehouse(), ws.settings, dry_run=args.dry_run)):
        console.print(line, markup=False)


if __name__ == "__main__":
    main(sys.argv[1:])
