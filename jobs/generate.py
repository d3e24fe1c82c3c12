"""spark-submit entry point: `spark-submit jobs/generate.py [--warehouse W] [--conf F] [options]` = `rebalancer generate`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("generate", sys.argv[1:])
