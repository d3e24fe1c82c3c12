"""Build the old-format warehouses the upgrade tests start from, with the code of each earlier format.

Each fixture is a small warehouse written by this repository's own code at the last commit of one earlier format
(``FORMAT_COMMITS``; ``rebalancer.upgrade.FORMATS`` says what each format added), run from a git worktree with this
checkout's virtualenv, through the ``rebalancer`` command line of that commit. The story (``story``): a generated
cluster, its first exchange, a node failure and its exchange, the twin executing part of the plan when a second node
fails mid-plan (formats with a twin), an event naming an unknown node (a rejected row) and its exchange.

Written to ``tests/upgrade/fixtures/format-<N>.tar.gz`` (the warehouse) beside ``format-<N>.json`` (the commit, the
steps, and each input table's Delta version after every step). Needs git history and a few minutes per format::

    python -m tests.upgrade.build_fixtures            # every format
    python -m tests.upgrade.build_fixtures 3 8        # some
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The last commit that wrote each earlier format (format 9, this release's, records itself in warehouse_format).
FORMAT_COMMITS = {
    1: "b0859a8",
    2: "725067f",
    3: "17275ab",
    4: "771c3e8",
    5: "49ca911",
    6: "19380dd",
    7: "e033d68",
    8: "3b0cc17",
}
INPUTS = ("cache_groups", "nodes", "topology_events", "partition_reports")
_RUN = "import sys; sys.argv[0] = 'rebalancer'; from rebalancer.cli import app; app()"


def story(has_twin: bool) -> list[list[str]]:
    """The commands each fixture runs, in order."""
    steps = [
        ["generate", "--nodes", "5", "--groups", "1", "--partitions", "16", "--backups", "1", "--seed", "5"],
        ["exchange"],
        ["event", "NODE_FAILED", "--node", "node1"],
        ["exchange"],
    ]
    if has_twin:  # one round: the first wave's steps, then node2 fails mid-plan and the exchange plans again
        steps.append(["simulate", "--fail", "node2", "--at-wave", "2"])
    steps += [["event", "NODE_LEFT", "--node", "nosuch"], ["exchange"]]
    return steps


def _input_versions(warehouse: Path) -> dict[str, int]:
    return {name: DeltaTable(str(warehouse / name)).version() for name in INPUTS if (warehouse / name).exists()}


def build(fmt: int, work: Path) -> None:
    """Write fixture ``fmt`` (its tarball and manifest) from the code of ``FORMAT_COMMITS[fmt]``."""
    commit = FORMAT_COMMITS[fmt]
    tree = work / f"tree-{fmt}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), commit], check=True,
                   capture_output=True)
    try:
        warehouse = work / f"format-{fmt}"
        conf = work / "conf.toml"
        conf.write_text('[storage]\nengine = "delta-rs"\n')
        has_twin = "def simulate(" in (tree / "rebalancer" / "cli.py").read_text()
        steps = []
        for args in story(has_twin):
            command = [sys.executable, "-c", _RUN, "--conf", str(conf), "--warehouse", str(warehouse), *args]
            done = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"format {fmt} at {commit}: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
            steps.append({"args": args, "input_versions": _input_versions(warehouse)})
            print(f"format {fmt}: {' '.join(args)}", flush=True)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        with tarfile.open(FIXTURES / f"format-{fmt}.tar.gz", "w:gz") as tar:
            tar.add(warehouse, arcname="warehouse")
        manifest = {"format": fmt, "commit": commit, "engine": "delta-rs", "steps": steps}
        (FIXTURES / f"format-{fmt}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main(argv: list[str]) -> None:
    formats = [int(a) for a in argv] or sorted(FORMAT_COMMITS)
    with tempfile.TemporaryDirectory(prefix="rebalancer-fixtures-") as tmp:
        for fmt in formats:
            build(fmt, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
