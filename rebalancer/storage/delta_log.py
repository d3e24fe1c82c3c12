"""A local Delta table's JSON log read directly, without deltalake: local paths, and the files each commit added."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["files_added_by_commit", "local_directory"]


def local_directory(location: str | Path) -> str | None:
    """The absolute local directory of a path (relative to the working directory, or absolute) or a ``file:`` URI;
    None for a remote URI (s3://, abfss://, dbfs:/ ...). The directory need not exist."""
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        text = unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:  # one letter is a Windows drive, not a scheme
        return None
    return str(Path(text).expanduser().resolve())


def files_added_by_commit(table_dir: str, since: int | None, now: int) -> dict[int, list[str]] | None:
    """Data files added by each commit after ``since`` (all commits when None), from the JSON commit files of a
    table in a local directory (both engines: Delta keeps the commit that added a row only in its log).

    Returns None when the window holds a ``remove`` of a file (the table was rewritten, not only appended to) or
    a commit file is missing (cleaned up after a checkpoint): the caller then compares contents instead.
    """
    added: dict[int, list[str]] = {}
    for version in range((since + 1) if since is not None else 0, now + 1):
        path = os.path.join(table_dir, "_delta_log", f"{version:020d}.json")
        try:
            with open(path, encoding="utf-8") as log:
                actions = [json.loads(line) for line in log if line.strip()]
        except FileNotFoundError:
            return None
        for action in actions:
            if "remove" in action and since is not None:
                return None
            if "add" in action:
                added.setdefault(version, []).append(unquote(action["add"]["path"]))
    return added
