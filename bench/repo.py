"""The repository the benchmarks run from, and what git says of it (the commit a result was measured at)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    """``git ARGS`` run in the repository: its output, stripped; "" when git is missing or fails."""
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
