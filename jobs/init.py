"""spark-submit entry point for `rebalancer init`: `spark-submit jobs/init.py [--warehouse W] [--conf F] [options]`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("init", sys.argv[1:])
