"""The walkthrough notebook runs top to bottom, headless, on a small cluster (as a user would run it locally)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "rebalance_walkthrough.ipynb"


@pytest.mark.slow  # a Jupyter kernel and its own Spark session, about a minute: `make spark-slow` (CI)
def test_walkthrough_notebook_runs_and_ends_stable(tmp_path: Path, monkeypatch: Any) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook cleared"
    # The kernel is a new process: it opens its own local Spark session with these small parameters.
    monkeypatch.setenv("REBALANCER_WAREHOUSE", str(tmp_path / "w"))
    for name, value in (("NODES", "4"), ("GROUPS", "1"), ("PARTITIONS", "16"), ("BACKUPS", "1")):
        monkeypatch.setenv(f"WALKTHROUGH_{name}", value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(NOTEBOOK.parent.parent),
                                                                   os.environ.get("PYTHONPATH")])))
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    stability = next(c for c in nb.cells if c.cell_type == "code" and "simulate(" in c.source)
    text = "".join(o.get("data", {}).get("text/plain", "") for o in stability.outputs)
    stable = "assignment_differences=0, ideal_not_owning=0, surplus_copies=0, lost_partitions=0"
    assert stable in text, text
    sweep = next(c for c in nb.cells if c.cell_type == "code" and "what_if(" in c.source)
    assert any("scenarios against version" in o.get("text", "") for o in sweep.outputs), sweep.outputs
    explained = next(c for c in nb.cells if c.cell_type == "code" and "describe(explain(" in c.source)
    assert any("waited for: " in o.get("text", "") for o in explained.outputs), explained.outputs
    plots = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert plots, "the plots cell drew nothing"

    kafka = next(c for c in nb.cells if c.cell_type == "code" and "drive_kafka(" in c.source)
    assert any("skipped: no Kafka cluster named" in o.get("text", "") for o in kafka.outputs), kafka.outputs
