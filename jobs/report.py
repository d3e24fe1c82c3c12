"""spark-submit entry point: `spark-submit jobs/report.py [--warehouse W] [--version MAJOR.MINOR] [--out DIR]`
= `rebalancer report`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("report", sys.argv[1:])
