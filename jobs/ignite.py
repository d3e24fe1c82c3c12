"""spark-submit job: collect a live Apache Ignite 2.x cluster (= `rebalancer ignite collect`, docs/IGNITE.md).

    spark-submit jobs/ignite.py collect [--host H] [--port P] [--warehouse W] [--conf F]

A scheduled job every few minutes runs `collect`, then jobs/exchange.py: every topology version of the grid in Delta.
"""

import argparse
import sys

from rebalancer.console import print_ignite_collect
from rebalancer.ignite.collect import collect
from rebalancer.workspace import Workspace


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["collect"])
    parser.add_argument("--host", help="a server node's thin-client host (default: [ignite] host)")
    parser.add_argument("--port", type=int, help="its thin-client port (default: [ignite] port)")


def main(argv: list[str]) -> None:
    ws, args = Workspace.from_args(argv, "Collect a live Ignite cluster into the input tables.", _options)
    print_ignite_collect(collect(ws.warehouse, ws.settings.ignite, args.host, args.port))


if __name__ == "__main__":
    main(sys.argv[1:])
