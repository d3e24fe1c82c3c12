"""spark-submit entry point: `spark-submit jobs/exchange.py [--warehouse W] [--conf F]` = `rebalancer exchange`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("exchange", sys.argv[1:])
