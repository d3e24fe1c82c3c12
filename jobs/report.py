"""spark-submit job: chart one committed version as PNGs and one HTML page (= `rebalancer report`).

    spark-submit jobs/report.py [--warehouse W] [--conf F] [--version MAJOR.MINOR] [--out DIR]
"""

import argparse
import sys
from pathlib import Path

from rebalancer.console import console
from rebalancer.report import collect_report_data, parse_version, write_report
from rebalancer.workspace import Workspace


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", metavar="MAJOR.MINOR")
    parser.add_argument("--out", type=Path, default=Path("report"))


def main(argv: list[str]) -> None:
    ws, a = Workspace.from_args(argv, "Chart one committed version.", options)
    wanted = None if a.version is None else parse_version(a.version)
    data = collect_report_data(ws.spark, ws.warehouse, wanted, ws.settings)
    page = write_report(data, a.out)
    console.print(f"wrote the report of version {data.version_text} to {page}")


if __name__ == "__main__":
    main(sys.argv[1:])
