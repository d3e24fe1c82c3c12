"""``rebalancer vacuum --keep-versions N``: older versions' rows leave the versioned tables, Delta VACUUM frees their
files, the tables stay plain Delta, and the next exchange commits exactly what it commits on an untouched copy.
(The same on delta-spark: tests/test_delta_spark.py, through tests/engine_scenario.run_vacuum.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import deltalake
import pytest

from rebalancer.config import Settings
from rebalancer.operations import generate_into, vacuum_warehouse
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange
from rebalancer.producers import append_event
from rebalancer.storage import open_warehouse
from rebalancer.tables import SCHEMAS
from tests.engine_scenario import COMPARED, run_vacuum


def _open(spark: Any, path: Path) -> Any:
    return open_warehouse(spark, Settings().with_overrides(storage={"warehouse": str(path), "engine": "delta-rs"})
                          .storage)


def _versions(wh: Any) -> dict[str, set[tuple[int, int]]]:
    return {name: {(r[0], r[1]) for r in wh.read(name).select("topology_major", "topology_minor").distinct()
                   .collect()} for name in VERSIONED_TABLES}


@pytest.fixture(scope="module")
def three_versions(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 nodes join (4.0), node1 fails (5.0), node1 joins again (6.0)."""
    path = tmp_path_factory.mktemp("vacuum") / "w"
    settings = Settings().with_overrides(storage={"warehouse": str(path), "engine": "delta-rs"})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=4, groups=2, partitions=16, backups=1, seed=5)
    run_exchange(spark, wh, settings)
    for kind in ("NODE_FAILED", "NODE_JOINED"):
        append_event(spark, wh, kind, node_id="node1")
        run_exchange(spark, wh, settings)
    return path


def test_vacuum_keeps_the_newest_versions_and_the_next_exchange_is_unchanged(
    spark: Any, three_versions: Path, tmp_path: Path
) -> None:
    vacuumed, untouched = tmp_path / "vacuumed", tmp_path / "untouched"
    shutil.copytree(three_versions, vacuumed)
    shutil.copytree(three_versions, untouched)
    wh, control = _open(spark, vacuumed), _open(spark, untouched)
    assert _versions(wh)["partition_map"] == {(4, 0), (5, 0), (6, 0)}
    kept_rows = {name: sorted(map(tuple, wh.read(name).where("topology_major >= 5").collect()), key=repr)
                 for name in VERSIONED_TABLES}

    result = vacuum_warehouse(wh, keep_versions=2, retain_hours=0)
    assert (result.kept, result.removed) == ([(5, 0), (6, 0)], 1)
    assert result.files_deleted > 0 and result.bytes_before is not None and result.bytes_after is not None
    assert result.bytes_after < result.bytes_before
    for name, versions in _versions(wh).items():
        assert versions <= {(5, 0), (6, 0)}, name
        assert sorted(map(tuple, wh.read(name).collect()), key=repr) == kept_rows[name], name
    assert wh.read("exchanges").count() == 3  # the history stays
    for name in SCHEMAS:
        protocol = deltalake.DeltaTable(str(vacuumed / name)).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features, name

    # the next exchange commits the same rows as on the untouched copy
    new_rows = []
    for w in (wh, control):
        append_event(spark, w, "NODE_FAILED", node_id="node2")
        [summary] = run_exchange(spark, w, Settings().with_overrides(storage={"engine": "delta-rs"}))
        assert (summary.topology_major, summary.topology_minor) == (7, 0)
        new_rows.append({name: sorted(map(tuple, w.read(name).where("topology_major = 7").collect()), key=repr)
                         for name in VERSIONED_TABLES})
    assert new_rows[0] == new_rows[1]

    # vacuuming again keeps what is there; keep 1 leaves the newest version only
    assert vacuum_warehouse(wh, keep_versions=1, retain_hours=0).kept == [(7, 0)]
    assert all(v <= {(7, 0)} for v in _versions(wh).values())
    with pytest.raises(ValueError, match="at least 1"):
        vacuum_warehouse(wh, keep_versions=0)


def test_the_cli_says_what_it_kept_and_freed(spark: Any, three_versions: Path, tmp_path: Path, capsys: Any) -> None:
    from rebalancer.cli import main

    w = tmp_path / "w"
    shutil.copytree(three_versions, w)

    def cli(*argv: str) -> tuple[int, str, str]:
        try:
            main(["--warehouse", str(w), "vacuum", *argv])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = cli("--keep-versions", "0")
    assert code != 0 and "at least 1" in err
    code, out, err = cli("--keep-versions", "1", "--retain-hours", "0")
    assert code == 0, err
    assert "kept 1 version(s), 6.0 to 6.0; removed the rows of 2 older version(s); VACUUM deleted " in out
    assert "MiB ->" in out


def test_vacuum_on_delta_rs_gives_the_rows_the_engine_story_compares(spark: Any, tmp_path: Path) -> None:
    """The delta-rs half of the engines' comparison (tests/test_delta_spark.py runs the delta-spark half)."""
    from tests.engine_scenario import run_story

    run_story(spark, "delta-rs", tmp_path / "w")
    out = run_vacuum(spark, "delta-rs", tmp_path / "w")
    assert out["kept"] == [[5, 0]] and out["versions_left"] == [[5, 0]] and out["files_deleted"] > 0
    assert set(out["next"]) == set(COMPARED) - {"exchanges"}
