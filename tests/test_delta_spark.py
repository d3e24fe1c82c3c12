"""The delta-spark engine, for real: Delta Lake's jars (fetched from Maven Central at install), a session of its own
in a subprocess, the same story as on delta-rs with identical committed rows; its tables stay plain Delta and the
delta-rs engine continues the warehouse where delta-spark left it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import deltalake
import pytest

from rebalancer import delta_jars
from rebalancer.config import Settings
from rebalancer.pipeline import run_exchange
from rebalancer.producers import append_event
from rebalancer.storage import open_warehouse
from rebalancer.tables import SCHEMAS
from tests.conftest import TEST_ENGINE
from tests.engine_scenario import COMPARED, run_across, run_story
from tests.interop.harness import once_per_session

REPO = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.skipif(
        not delta_jars.jars(),
        reason="delta-spark tests skipped: the Delta jars are not fetched (make install runs python -m "
        "rebalancer.delta_jars, which needs mvn and Maven Central)",
    ),
]


# The story is a delta-spark process of its own (4 to 6 minutes on 2 cores beside the other test workers): CI runs
# these with `make storage-slow`, which runs this file's slow tests first; `make test` stays within its budget.
_STORY = pytest.mark.slow


@pytest.fixture(scope="session")
def delta_spark_story(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The delta-spark process, once per test session: its result is shared by every xdist worker (a worker per
    test would otherwise run it again: 3 x 230 s measured in CI)."""

    def run(work: Path) -> dict[str, Any]:
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(
            [sys.executable, "-m", "tests.engine_scenario", "delta-spark", str(work / "w"), str(work / "story.json")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return {"warehouse": str(work / "w"), "story": json.loads((work / "story.json").read_text())}

    shared = once_per_session(tmp_path_factory.getbasetemp(), "delta-spark-story", run)
    return Path(shared["warehouse"]), shared["story"]


@_STORY
def test_delta_spark_commits_the_rows_delta_rs_commits(spark: Any, delta_spark_story: Any, tmp_path: Path) -> None:
    warehouse, on_delta_spark = delta_spark_story
    assert on_delta_spark["engine"] == "delta-spark"
    on_delta_rs = run_story(spark, "delta-rs", tmp_path / "w")
    assert on_delta_rs["engine"] == "delta-rs"
    for name in COMPARED:
        assert on_delta_spark[name] == on_delta_rs[name], name
    assert len(on_delta_spark["migration_plan"]) > 0 and len(on_delta_spark["exchanges"]) == 2

    # delta-rs continues both warehouses with the same event: the same rows again
    continued = []
    for path in (warehouse, tmp_path / "w"):
        settings = Settings().with_overrides(storage={"warehouse": str(path), "engine": "delta-rs"})
        wh = open_warehouse(spark, settings.storage)
        append_event(spark, wh, "NODE_JOINED", node_id="node1")
        [summary] = run_exchange(spark, wh, settings)
        assert (summary.topology_major, summary.exchange_type) == (6, "ALL")
        where = f"topology_major = 6 AND topology_minor = {summary.topology_minor}"
        continued.append({name: sorted(map(tuple, wh.read(name).where(where).collect()), key=repr)
                          for name in ("ideal_assignment", "affinity_assignment", "partition_map")})
    assert continued[0] == continued[1]


@_STORY
def test_delta_spark_tables_stay_plain_delta(delta_spark_story: Any) -> None:
    warehouse, _ = delta_spark_story
    for name in SCHEMAS:
        protocol = deltalake.DeltaTable(str(warehouse / name)).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features, name


@_STORY
def test_time_travel_history_and_restore_work_by_table_name(delta_spark_story: Any) -> None:
    """Every ``-- delta-spark only`` block of docs/QUERIES.md runs on the delta-spark warehouse by table name (its
    tables are catalog tables of the session, not views): history, VERSION AS OF, TIMESTAMP AS OF, RESTORE."""
    _, story = delta_spark_story
    q = story["queries"]
    history, version_1, timestamp, restore = q["results"]
    assert history["sql"].endswith("DESCRIBE HISTORY partition_reports")
    assert [row[0] for row in history["rows"]][-1] == 0 and len(history["rows"]) >= 2  # Delta versions, newest first
    assert version_1["rows"] == [[q["reports_at_1"]]] and q["reports_at_1"] == q["reports_now"] > 0
    copies = {row[0]: row[1] for row in timestamp["rows"]}
    assert copies["COPY"] == sum(1 for r in story["migration_plan"] if r[6] == "COPY") > 0
    assert restore["sql"].startswith("-- delta-spark only\nRESTORE TABLE migration_plan")
    assert q["plan_before"] > 0 and q["plan_at_0"] == 0
    assert q["plan_after_restore"] == q["plan_read_after_restore"] == 0


@_STORY
def test_a_catalog_prefix_warehouse_commits_the_same_rows_in_a_schema(delta_spark_story: Any) -> None:
    """``storage.catalog_prefix = "spark_catalog.rebalancer"`` (a schema of the session catalog, as a Unity Catalog
    ``catalog.schema``): the same story creates, writes and reads its tables by name, with the same rows as the
    path warehouse, and they time travel by their full names."""
    _, story = delta_spark_story
    catalog = story["catalog"]
    assert catalog["engine"] == "delta-spark"
    for name in COMPARED:
        assert catalog[name] == story[name], name
    assert set(catalog["tables"]) >= set(SCHEMAS)
    assert catalog["exchanges_now"] == 2 and catalog["exchanges_at_1"] < 2 and catalog["history"] >= 3


@_STORY
def test_two_exchanges_racing_on_delta_spark_commit_one_version_and_one_clear_error(delta_spark_story: Any) -> None:
    """As on delta-rs (tests/test_exchange_job.py): both runs compute version 6.0; one commits it, the other gets
    the one-sentence ExchangeConflictError and nothing is duplicated."""
    _, story = delta_spark_story
    race = story["race"]
    won, lost = race["outcomes"]
    assert won == {"committed": [[6, 0]]}, race
    assert lost["error"] == "ExchangeConflictError" and "committed by another run" in lost["message"], race
    assert "\n" not in lost["message"]
    assert [e[1:] for e in race["exchanges"]] == [[4, 0], [5, 0], [6, 0]]


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="needs the Delta jars in the session: make storage-slow")
def test_a_warehouse_crossing_engines_rs_spark_rs_commits_what_one_engine_commits(spark: Any, tmp_path: Path) -> None:
    """Exchange 1 on delta-rs, exchange 2 (a failure) on delta-spark, exchange 3 (the node back) on delta-rs again:
    every committed row equals a warehouse that stayed on delta-rs, and the tables stay plain Delta."""
    across = run_across(spark, ["delta-rs", "delta-spark", "delta-rs"], tmp_path / "across")
    alone = run_across(spark, ["delta-rs"] * 3, tmp_path / "alone")
    for name in COMPARED:
        assert across[name] == alone[name], name
    assert len(across["exchanges"]) == 3 and len(across["migration_plan"]) > 0
    for name in SCHEMAS:
        protocol = deltalake.DeltaTable(str(tmp_path / "across" / name)).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name


@pytest.mark.slow  # about a minute of delta-spark (a process of its own): CI runs it with `make storage-slow`
def test_vacuum_on_delta_spark_keeps_the_newest_version_and_the_next_exchange_matches_delta_rs(
    spark: Any, tmp_path: Path
) -> None:
    """``vacuum --keep-versions 1 --retain-hours 0`` on a copy of each engine's story warehouse: only the newest
    version's rows stay, files are deleted, and the next exchange commits the same rows on both engines."""
    from tests.engine_scenario import run_story, run_vacuum

    work = tmp_path / "delta-spark"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "tests.engine_scenario", "delta-spark", str(work / "w"), str(work / "story.json"),
         "vacuum"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warehouse = work / "w"
    on_delta_spark = json.loads((work / "story.json").read_text())["vacuum"]
    assert on_delta_spark["kept"] == [[5, 0]] and on_delta_spark["versions_left"] == [[5, 0]]
    assert on_delta_spark["files_deleted"] > 0
    run_story(spark, "delta-rs", tmp_path / "w")
    on_delta_rs = run_vacuum(spark, "delta-rs", tmp_path / "w")
    assert on_delta_spark["next"] == on_delta_rs["next"]
    for name in SCHEMAS:  # still plain Delta after delta-spark's DELETE and VACUUM
        protocol = deltalake.DeltaTable(str(warehouse.parent / "w-vacuumed" / name)).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features, name
