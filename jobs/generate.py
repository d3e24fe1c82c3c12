"""spark-submit entry point for `rebalancer generate` (global options may come anywhere in argv)."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("generate", sys.argv[1:])
