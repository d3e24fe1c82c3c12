"""Packaging for clusters (docs/DEPLOY.md, "Packaging"): ``python -m build`` makes the wheel; installed into a clean
virtualenv with its core dependencies only, the Spark-free client imports and routes a key without pyspark, and
the ``rebalancer`` command says which extra brings the engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CLIENT_SCRIPT = """
import importlib.util, json
assert importlib.util.find_spec("pyspark") is None, "pyspark must not come with the core"
assert importlib.util.find_spec("deltalake") is None
from rebalancer.client import partition_of
from rebalancer.client.affinity import assign
p = partition_of("user-42", 1024)
nodes = assign(["node0", "node1", "node2", "node3"], 1024, 1)[p]
print(json.dumps({"partition": p, "nodes": nodes}))
"""


def test_the_wheel_installs_without_spark_and_its_client_routes_a_key(tmp_path: Path) -> None:
    # build from a copy: setuptools leaves build/ and *.egg-info beside the sources, and a stale build/lib would
    # go into later wheels
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "rebalancer", source / "rebalancer", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)], check=True,
                   capture_output=True, text=True)
    [wheel] = dist.glob("rebalancer-*.whl")
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, capture_output=True,
                   text=True)
    out = subprocess.run([str(python), "-c", CLIENT_SCRIPT], check=True, capture_output=True, text=True)
    # the same answer as the engine's client in this interpreter
    from rebalancer.client import partition_of
    from rebalancer.client.affinity import assign

    p = partition_of("user-42", 1024)
    assert json.loads(out.stdout) == {"partition": p, "nodes": assign(["node0", "node1", "node2", "node3"], 1024, 1)[p]}
    command = subprocess.run([str(env / "bin" / "rebalancer"), "--help"], capture_output=True, text=True)
    assert command.returncode == 2 and "rebalancer[local]" in command.stderr, command.stderr
