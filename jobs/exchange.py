"""spark-submit job: process every pending event and the newest reports (= `rebalancer exchange`).

    spark-submit jobs/exchange.py [--warehouse W] [--conf F] [--strict]
"""

import sys

from rebalancer.console import console, print_summary
from rebalancer.pipeline import run_exchange
from rebalancer.workspace import Workspace


def main(argv: list[str]) -> None:
    ws, _ = Workspace.from_args(argv, "Process pending events and reports; commit topology versions.")
    summaries = run_exchange(ws.spark, ws.warehouse, ws.settings)
    if not summaries:
        console.print("nothing to do: no pending event and no late affinity switch due")
    for summary in summaries:
        print_summary(summary)


if __name__ == "__main__":
    main(sys.argv[1:])
