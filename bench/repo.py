"""The repository the benchmarks run from, and what git says of it (the commit a result was measured at)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = REPO) -> str:
    """``git ARGS`` run in the repository (or ``cwd``): its output, stripped; "" when git is missing or fails."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def measured_code() -> dict[str, Any]:
    """The commit of the ``rebalancer`` package this process imports, and its uncommitted changes: this checkout's,
    or another checkout's put first on ``PYTHONPATH`` (a worktree of an older commit, for before/after runs that
    alternate), named then in ``rebalancer_from``."""
    import rebalancer

    tree = Path(rebalancer.__file__).resolve().parent.parent
    code: dict[str, Any] = {
        "commit": git("rev-parse", "--short", "HEAD", cwd=tree),
        "uncommitted_changes_in_rebalancer": git("status", "--porcelain", "--", "rebalancer", cwd=tree).splitlines(),
    }
    if tree != REPO:
        code["rebalancer_from"] = str(tree)
    return code


def select_one_seconds() -> float:
    """Wall time of one ``rebalancer sql "SELECT 1"`` process on an empty warehouse (made by ``init``, not timed):
    the machine's speed, quoted beside a benchmark's figures so that they are read as ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(REPO / ".venv" / "bin" / "rebalancer"), "--warehouse", tmp, "init"],
                       check=True, capture_output=True, cwd=REPO)
        started = time.monotonic()
        subprocess.run([str(REPO / ".venv" / "bin" / "rebalancer"), "--warehouse", tmp, "sql", "SELECT 1"],
                       check=True, capture_output=True, cwd=REPO)
        return round(time.monotonic() - started, 1)
