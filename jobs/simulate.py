"""spark-submit job: execute the committed plan in the twin (= `rebalancer simulate`).

    spark-submit jobs/simulate.py [--warehouse W] [--conf F] [--until-stable] [--fail NODE --at-wave K]
"""

import argparse
import sys

from rebalancer.console import print_round, print_stability
from rebalancer.twin.simulate import simulate
from rebalancer.workspace import Workspace


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--until-stable", action="store_true")
    parser.add_argument("--fail", metavar="NODE")
    parser.add_argument("--at-wave", type=int, metavar="K")
    parser.add_argument("--max-rounds", type=int, default=20)


def main(argv: list[str]) -> None:
    ws, a = Workspace.from_args(argv, "Execute the committed migration plan in the twin.", options)
    result = simulate(ws.spark, ws.warehouse, ws.settings, until_stable=a.until_stable, fail_node=a.fail,
                      at_wave=a.at_wave, max_rounds=a.max_rounds, on_round=print_round)
    print_stability(result.stability)


if __name__ == "__main__":
    main(sys.argv[1:])
