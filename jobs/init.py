"""spark-submit job: create every table of the contract that is missing (= `rebalancer init`).

    spark-submit jobs/init.py [--warehouse W] [--conf F]
"""

import sys

from rebalancer.console import console
from rebalancer.formats import create_warehouse
from rebalancer.workspace import Workspace


def main(argv: list[str]) -> None:
    ws, _ = Workspace.from_args(argv, "Create the missing tables of the warehouse.")
    created = create_warehouse(ws.any_warehouse())
    console.print(f"created {len(created)} tables in {ws.warehouse.location}: {', '.join(created) or '-'}")


if __name__ == "__main__":
    main(sys.argv[1:])
