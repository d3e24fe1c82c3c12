"""spark-submit entry point for `rebalancer demo`: `spark-submit jobs/demo.py [--warehouse W] [--conf F] [options]`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("demo", sys.argv[1:])
