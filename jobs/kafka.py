"""spark-submit job: drive a live Kafka cluster (= `rebalancer kafka collect | execute | run`, docs/KAFKA.md).

    spark-submit jobs/kafka.py collect [--bootstrap HOST:PORT] [--warehouse W] [--conf F]
    spark-submit jobs/kafka.py execute [--bootstrap HOST:PORT] [--dry-run] [--warehouse W] [--conf F]
    spark-submit jobs/kafka.py run [--bootstrap HOST:PORT] [--until-stable] [--warehouse W] [--conf F]

A scheduled job every few minutes runs `run` (one round) or `collect` followed by jobs/exchange.py.
"""

import argparse
import json
import sys

from rebalancer.console import console, print_collect, print_execute, print_kafka_round
from rebalancer.kafka.drive import collect_cluster, execute_plan, planned_moves, run
from rebalancer.workspace import Workspace


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["collect", "execute", "run"])
    parser.add_argument("--bootstrap", help="HOST:PORT[,HOST:PORT...] (default: [kafka] bootstrap)")
    parser.add_argument("--dry-run", action="store_true", help="execute: print the reassignment JSON only")
    parser.add_argument("--until-stable", action="store_true", help="run: repeat until nothing is left to move")


def main(argv: list[str]) -> None:
    ws, args = Workspace.from_args(argv, "Collect, execute on or drive a live Kafka cluster.", _options)
    if args.action == "collect":
        print_collect(collect_cluster(ws.warehouse, ws.settings, args.bootstrap))
    elif args.action == "execute":
        planned = planned_moves(ws.warehouse)
        if args.dry_run:
            console.print(json.dumps(planned.as_reassignment_json(), indent=2), markup=False)
            return
        print_execute(*execute_plan(ws.warehouse, ws.settings, args.bootstrap, planned))
    else:
        run(ws.spark, ws.warehouse, ws.settings, args.bootstrap, until_stable=args.until_stable,
            on_round=print_kafka_round)


if __name__ == "__main__":
    main(sys.argv[1:])
