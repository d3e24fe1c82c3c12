"""Watching long work: every Spark job labelled with its stage, stages and Spark task progress logged through
``logging``, the CLI quiet off a terminal and talkative with ``--verbose``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from rebalancer.config import Settings
from rebalancer.operations import generate_into
from rebalancer.pipeline import STAGES, Meter, run_exchange
from rebalancer.storage import open_warehouse
from rebalancer.what_if import what_if
from tests.conftest import TEST_ENGINE


def _jobs(spark: Any) -> list[tuple[str | None, str | None]]:
    """(job group, description) of every job the session's status store holds."""
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    jobs = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc.statusStore().jobsList(None))

    def text(option: Any) -> str | None:
        return str(option.get()) if option.isDefined() else None

    return [(text(j.jobGroup()), text(j.description())) for j in jobs]


def test_every_spark_job_of_generate_an_exchange_and_a_what_if_is_labelled_with_its_stage(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    # generate and the exchange on their Spark paths: jobs to label
    settings = Settings().with_overrides(storage={"warehouse": str(tmp_path / "w"), "engine": "delta-rs",
                                                  "driver_replicas": 0})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=4, groups=1, partitions=16, backups=1, seed=1)
    run_exchange(spark, wh, settings)
    what_if(spark, wh, settings)
    labels = {"generate": {"cluster", "load"}, "exchange": set(STAGES), "what-if": {"scenarios", "evaluate", "write"}}
    found = {work: 0 for work in labels}
    for group, description in _jobs(spark):  # earlier tests' jobs in this session must be labelled too
        work = next((w for w in labels if group and group.startswith(f"rebalancer-{w}-")), None)
        if work is None:
            continue
        assert description is not None and description.startswith(f"rebalancer {work}: "), (group, description)
        assert description.removeprefix(f"rebalancer {work}: ") in labels[work], description
        found[work] += 1
    assert all(found.values()), found


def test_stages_and_spark_task_progress_are_logged(spark: Any, caplog: Any) -> None:
    def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            time.sleep(0.4)
            yield batch

    caplog.set_level(logging.INFO, logger="rebalancer")
    meter = Meter(spark, "test")
    try:
        with meter.stage("slow"):
            spark.range(0, 8, 1, 4).mapInArrow(slow, "id long").collect()
    finally:
        meter.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "rebalancer.pipeline"]
    assert lines[0] == "test: slow" and lines[-1].startswith("test: slow done in ")
    assert lines[-1].endswith(", 1 Spark jobs")
    progress = [line for line in lines if line.startswith("test: slow: Spark tasks ")]
    assert progress and all(line.endswith("/4") for line in progress), lines


def test_the_cli_is_quiet_off_a_terminal_and_logs_with_verbose(spark: Any, tmp_path: Path, capsys: Any) -> None:
    from rebalancer.cli import main

    def cli(*argv: str) -> str:
        try:
            main(["--warehouse", str(tmp_path / "w"), *argv])
        except SystemExit as exc:
            assert exc.code in (0, None)
        return str(capsys.readouterr().err)

    cli("generate", "--nodes", "3", "--groups", "1", "--partitions", "8")
    err = cli("exchange")
    lines = [line for line in err.splitlines() if line]
    assert any(line.startswith("running the exchange: ") for line in lines), err
    # the engine and why, once (the suite's session has no Delta jars), then durations only
    engine = [line for line in lines if line.startswith("storage engine ")]
    assert len(engine) == 1, err
    assert engine[0].startswith(f"storage engine {TEST_ENGINE}: storage.engine = 'auto' and the Delta jars are "), err
    assert all(line.endswith(" s") and "rebalancer." not in line for line in lines if line not in engine), err
    cli("event", "NODE_FAILED", "--node", "node1")
    err = cli("--verbose", "exchange")
    assert "rebalancer.pipeline: exchange: kernel" in err and "committed version 4.0 (ALL)" in err
    err = cli("sql", "SELECT 1")  # verbose is off again for the next command of the same process
    assert "rebalancer.pipeline" not in err
