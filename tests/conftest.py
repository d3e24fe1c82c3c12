"""One session-scoped local SparkSession for the whole suite (local[2], 2 shuffle partitions, UI off, UTC)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "soak", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The storage engine the suite's warehouses use: delta-rs by default; `make storage-slow` runs the storage, exchange
# scenario, crash and concurrency tests again with REBALANCER_TEST_ENGINE=delta-spark (the session then carries the
# Delta jars, so every warehouse opened with engine "auto" is a delta-spark one).
TEST_ENGINE = os.environ.get("REBALANCER_TEST_ENGINE", "delta-rs")
# The Spark API the suite's session speaks: classic by default; CI runs the exchange scenarios once more with
# REBALANCER_TEST_API_MODE=connect (a local Spark Connect server, as on Databricks serverless).
TEST_API_MODE = os.environ.get("REBALANCER_TEST_API_MODE", "classic")
# Whether delta-spark warehouses in a local directory read the log on the driver (storage.driver_reader): on by
# default; CI runs the storage contract and exchange scenarios once more with REBALANCER_TEST_DRIVER_READER=off,
# everything through Delta as on catalog tables and remote storage (Databricks' path).
TEST_DRIVER_READER = os.environ.get("REBALANCER_TEST_DRIVER_READER", "on") != "off"
# Whether delta-spark commits rows built on the driver through delta-rs (storage.driver_writer, with the driver
# reader): on by default; on delta-spark, CI runs the storage contract with REBALANCER_TEST_DRIVER_WRITER=off, every
# commit made by Delta from the driver's rows (guarded appends, the small session).
TEST_DRIVER_WRITER = TEST_DRIVER_READER and os.environ.get("REBALANCER_TEST_DRIVER_WRITER", "on") != "off"
#: The storage settings every warehouse of the suite opens with (beside its directory and engine).
TEST_STORAGE = {"driver_reader": TEST_DRIVER_READER, "driver_writer": TEST_DRIVER_WRITER}
delta_rs_only = pytest.mark.skipif(TEST_ENGINE != "delta-rs", reason="about the delta-rs engine's own commit protocol")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from rebalancer.config import SparkSettings
    from rebalancer.session import get_spark

    session = get_spark(
        SparkSettings(
            master="local[2]",
            shuffle_partitions=2,
            driver_memory="2g",
            app_name="rebalancer-tests",
            adaptive=False,
            api_mode=TEST_API_MODE,  # type: ignore[arg-type]
        ),
        extra_conf={
            "spark.default.parallelism": "2",
            # Interpreted execution for the suite's tiny frames: each new query shape otherwise spends 1-3 s
            # compiling generated code (the same query runs in 0.1 s the second time). Results do not depend on it.
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        },
        delta=TEST_ENGINE == "delta-spark",
    )
    yield session
    session.stop()


@pytest.fixture()
def warehouse_dir(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


# Seconds each of the slowest modules took in `make test` (3 workers, 2026-11-28). With `--dist loadscope` a worker
# takes the next whole module as it frees up, in collection order, which is alphabetical: test_validation, the
# longest, went last and its worker finished alone. Offered longest first, the modules end together. A module
# missing here keeps its place after these; a wrong figure changes only the order.
_MODULE_SECONDS = {
    "test_validation.py": 132, "test_storage.py": 105, "test_exchange_job.py": 90, "test_what_if.py": 76,
    "test_queries.py": 71, "test_bad_input.py": 71, "test_cli.py": 95, "test_upgrade.py": 70,
    "test_incremental_inputs.py": 46, "test_validation_local.py": 50, "test_report.py": 42,
    "test_kernel_properties.py": 41, "test_explain.py": 41, "test_schedule_properties.py": 39,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -_MODULE_SECONDS.get(item.path.name, 0))  # stable: a module's order is kept
