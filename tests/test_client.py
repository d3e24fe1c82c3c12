"""rebalancer.client: routes keys without Spark, and is the very same code as the engine's partitioners."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import rebalancer
import rebalancer.client
import rebalancer.client.partition
from rebalancer.affinity import partitioners

REPO_ROOT = Path(rebalancer.__file__).resolve().parents[1]

# Modules a pure-Python client must never pay for (Spark and its JVM bridge, Arrow, pandas).
HEAVY_MODULES = ("pyspark", "py4j", "pyarrow", "pandas")

_PROBE = """
import json, sys
import rebalancer.client as client
routed = [
    client.partition_of("user-42", 1024),
    client.partition_of(42, 271, "hazelcast"),
    client.partition_of(2**40, 1024, "ignite"),
    client.partition_of(b"raw", 8),
]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print(json.dumps({{"routed": routed, "heavy": loaded}}))
"""


def test_importing_and_using_the_client_imports_no_spark_arrow_or_pandas() -> None:
    # A fresh interpreter: this test process has pyspark loaded already (conftest, other tests).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=set(HEAVY_MODULES))],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [], f"rebalancer.client imported {report['heavy']}"
    assert report["routed"] == [
        partitioners.partition_of("user-42", 1024),
        partitioners.partition_of(42, 271, "hazelcast"),
        partitioners.partition_of(2**40, 1024, "ignite"),
        partitioners.partition_of(b"raw", 8),
    ]


def test_client_reexports_the_engine_functions_not_copies() -> None:
    assert rebalancer.client.partition_of is partitioners.partition_of
    assert rebalancer.client.key_hash is partitioners.key_hash
    assert rebalancer.client.partition.PARTITIONERS == ("murmur3", "ignite", "hazelcast")
    assert rebalancer.client.partition.HAZELCAST_DEFAULT_PARTITIONS == 271


def test_client_pinned_routes() -> None:
    # Same pins as the engine tests: mmh3(utf8("user-42"), 0) = 3111312080 -> 720 of 1024.
    assert rebalancer.client.partition_of("user-42", 1024) == 720
    assert rebalancer.client.partition_of("hello", 1024, "ignite") == (99162322 ^ (99162322 >> 16)) & 1023


def test_partition_module_examples_run() -> None:
    result = doctest.testmod(rebalancer.client.partition, raise_on_error=False, verbose=False)
    assert result.attempted >= 3
    assert result.failed == 0
