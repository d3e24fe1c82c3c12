"""Sessions rebalancer builds: a local Spark Connect server per process, on a port of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# One process: a local Connect session (api_mode = "connect"), a query, then it holds its server until `release`
# exists, so that another process starts its own meanwhile.
_HOLDER = """
import sys, time
from pathlib import Path
from rebalancer.config import SparkSettings
from rebalancer.session import get_spark

spark = get_spark(SparkSettings(master="local[1]", api_mode="connect", shuffle_partitions=3))
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
assert get_spark() is spark  # later calls get the same Connect session, not the classic one serving it
print("ready", spark.range(4).count(), spark.conf.get("spark.sql.shuffle.partitions"), flush=True)
release = Path(sys.argv[1])
deadline = time.monotonic() + 240
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
spark.stop()
"""


_CONNECT_ENVIRONMENT = ("SPARK_TESTING", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE",
                        "SPARK_CONNECT_AUTHENTICATE_TOKEN")


@pytest.mark.slow  # two Spark Connect servers (about 30 s): CI runs it with `make connect-slow`
def test_two_processes_each_run_a_local_connect_server_at_once(tmp_path: Path) -> None:
    """pyspark's own local Connect mode binds port 15002 (outside its tests), so a second process on the machine
    failed to start; each rebalancer process now serves its Connect session on a free port."""
    env = {k: v for k, v in os.environ.items() if k not in _CONNECT_ENVIRONMENT}
    release = tmp_path / "release"
    first = subprocess.Popen([sys.executable, "-c", _HOLDER, str(release)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().split() == ["ready", "4", "3"]  # the first server is up and holds its port
        release_second = tmp_path / "release-second"
        release_second.touch()
        second = subprocess.run([sys.executable, "-c", _HOLDER, str(release_second)], env=env, capture_output=True,
                                text=True, timeout=240)
        assert second.returncode == 0, second.stderr[-3000:]
        assert second.stdout.split() == ["ready", "4", "3"]
    finally:
        release.touch()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
