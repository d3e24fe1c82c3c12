"""spark-submit entry point: `spark-submit jobs/simulate.py [--warehouse W] [--until-stable] [--fail N --at-wave K]`
= `rebalancer simulate`."""

import sys

from rebalancer.cli import run_job

if __name__ == "__main__":
    run_job("simulate", sys.argv[1:])
