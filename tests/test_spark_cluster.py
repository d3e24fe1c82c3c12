"""On a real multi-process Spark: ``local-cluster`` is a standalone master and two worker JVMs started from
pyspark's own jars on loopback, each running an executor, so tasks, their Python workers and broadcast data cross
processes as on any cluster. The story of tests/cluster_story.py (generate, the first exchange, a failure, a join,
what-if over every node, every stage on its Spark path) commits there, on both storage engines, exactly the rows
``local[2]`` commits; the story and the CLI's commands end without an error line. Slow: `make cluster-slow` (CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rebalancer import delta_jars

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "local-cluster[2,1,1024]"
LOCAL = "local[2]"
ENGINES = ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.skipif(
    not delta_jars.jars(), reason="the Delta jars are not fetched (make install runs python -m rebalancer.delta_jars)",
))]
# The JVM prints this for the incubator module Spark's launcher adds, whatever the options (Spark 4.2).
JVM_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"
pytestmark = pytest.mark.slow


def _story(master: str, engine: str, work: Path) -> tuple[dict[str, Any], str]:
    name = f"{'cluster' if master == CLUSTER else 'local'}-{engine}"  # no glob characters in a warehouse path
    out = work / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "tests.cluster_story", master, engine, str(work / name), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stderr


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "ERROR" in line or "Exception" in line or line.lstrip().startswith("at ")]


@pytest.fixture(scope="module")
def on_local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The story on ``local[2]``, once: both engines commit the same rows (tests/test_delta_spark.py), so each
    engine's run on the cluster is held to this one (a local run per engine cost CI a story process more)."""
    story, _ = _story(LOCAL, "delta-rs", tmp_path_factory.mktemp("local"))
    return story


@pytest.mark.parametrize("engine", ENGINES)
def test_a_spark_cluster_commits_what_local_spark_commits_and_ends_without_an_error(
        engine: str, tmp_path: Path, on_local: dict[str, Any]) -> None:
    on_cluster, stderr = _story(CLUSTER, engine, tmp_path)
    assert on_cluster["engine"] == engine
    assert on_cluster["summaries"] == [["ALL", 0, 0], ["ALL", 42, 0], ["ALL", 162, 0]]
    assert len(on_cluster["what_if"]) == 6, "one scenario per server"
    assert set(on_cluster) == set(on_local)
    for table in on_local.keys() - {"engine"}:
        assert on_cluster[table] == on_local[table], table
    assert _error_lines(stderr) == [], stderr[-3000:]


def test_commands_on_a_spark_cluster_end_without_an_error_line_and_a_failed_one_with_its_sentence(
        tmp_path: Path) -> None:
    """Each command a process of its own, as a user runs them: the session it started is stopped before it exits
    (executors first), where an exit alone left the workers relaunching executors during the JVM's shutdown. A
    failed query prints its one sentence (PySpark's query log and the JVM trace are for --verbose)."""
    conf = tmp_path / "cluster.toml"
    conf.write_text(f'[spark]\nmaster = "{CLUSTER}"\n[storage]\nengine = "delta-rs"\n')
    rebalancer = Path(sys.executable).parent / "rebalancer"
    for command in (["generate", "--nodes", "8", "--groups", "2", "--partitions", "256", "--backups", "1"],
                    ["exchange"], ["event", "NODE_FAILED", "--node", "node2"], ["exchange"],
                    ["what-if", "--sweep", "nodes"], ["sql", "SELECT count(*) FROM migration_plan"]):
        done = subprocess.run([str(rebalancer), "--conf", str(conf), "--warehouse", str(tmp_path / "w"), *command],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (command, done.stderr[-3000:])
        lines = [line for line in done.stderr.splitlines() if line.strip() and line != JVM_WARNING]
        assert _error_lines(done.stderr) == [], (command, done.stderr[-3000:])
        assert all(line.endswith(" s") or line.startswith(("storage engine ", "created a new warehouse"))
                   for line in lines), (command, done.stderr)
    # A failed query: its one sentence, no JSON log record of PySpark's, no Java stack trace, no log-level banner.
    done = subprocess.run([str(rebalancer), "--conf", str(conf), "--warehouse", str(tmp_path / "w"), "sql",
                           "SELECT no_such_column FROM nodes"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.strip() and line != JVM_WARNING]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "no_such_column" in errors[0] and lines[-1] == errors[0], done.stderr
    assert all(line.endswith(" s") or line.startswith("storage engine ") for line in lines[:-1]), done.stderr
