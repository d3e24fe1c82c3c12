"""Warehouses written by earlier releases (tests/upgrade/fixtures, built by build_fixtures.py from this repository's
history) refused until upgraded, upgraded losing nothing, and continued exactly as a warehouse the current release
replayed from the same inputs.

The suite's engine (``REBALANCER_TEST_ENGINE``) opens, upgrades and continues every fixture: delta-rs in `make test`,
delta-spark in `make storage-slow`.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from rebalancer.config import Settings
from rebalancer.formats import (
    CURRENT_FORMAT,
    WarehouseMissingError,
    WarehouseOutdatedError,
    WarehouseTooNewError,
    create_warehouse,
    require_current,
    stored_format,
)
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange
from rebalancer.storage import Warehouse, open_warehouse
from rebalancer.tables import INPUT_TABLES, SCHEMAS
from rebalancer.twin.simulate import simulate
from rebalancer.upgrade import Change, consumed_versions, upgrade
from tests.conftest import TEST_ENGINE, TEST_STORAGE

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BUILT = sorted(int(p.stem.split("-")[1]) for p in FIXTURES.glob("format-*.json"))
PREVIOUS = CURRENT_FORMAT - 1
# Each format's continuation is slow (20-50 s here on delta-rs: the replay is five exchange runs): CI's storage tier
# continues the first (every kind of change, every fill) and the previous format on both engines (the Makefile's
# CONTINUED_FORMATS names the previous one: move it with CURRENT_FORMAT), `make test-all` every format.
CONTINUED = [pytest.param(f, marks=pytest.mark.slow) for f in BUILT]
# Columns that hold the clock, the run's own measurements or Delta versions (which differ between two warehouses
# holding the same rows): not part of what an exchange decides.
UNCOMPARED = {"started_at", "finished_at", "stage_seconds", "spark_jobs", "stage_jobs", "input_versions"}


def manifest(fmt: int) -> dict[str, Any]:
    return json.loads((FIXTURES / f"format-{fmt}.json").read_text())


def unpack(fmt: int, into: Path) -> Path:
    with tarfile.open(FIXTURES / f"format-{fmt}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "warehouse"


def settings_for(path: Path, engine: str = TEST_ENGINE) -> Settings:
    return Settings().with_overrides(storage={"warehouse": str(path), "engine": engine, **TEST_STORAGE})


def open_at(spark: Any, path: Path, engine: str = TEST_ENGINE) -> Warehouse:
    return open_warehouse(spark, settings_for(path, engine).storage)


def delta_versions(wh: Warehouse) -> dict[str, int]:
    return {name: wh.table_version(name) for name in SCHEMAS if wh.exists(name)}


def rows_of(wh: Warehouse, name: str, version: int | None = None, columns: list[str] | None = None) -> Counter:
    table = wh.read_stored_arrow(name) if version is None else wh.read_arrow(name, version=version)
    keep = [c for c in (columns or table.column_names) if c not in UNCOMPARED]
    return Counter(json.dumps(r, default=str, sort_keys=True) for r in table.select(keep).to_pylist())


def newest_version(wh: Warehouse) -> tuple[int, int]:
    rows = wh.read_arrow("exchanges").to_pylist()
    return max((r["topology_major"], r["topology_minor"]) for r in rows)


# ---- the format check ----
@pytest.mark.parametrize("fmt", BUILT)
def test_an_earlier_format_is_recognised_and_refused_with_one_sentence(spark: Any, tmp_path: Path, fmt: int) -> None:
    wh = open_at(spark, unpack(fmt, tmp_path))
    before = delta_versions(wh)
    assert stored_format(wh) == fmt
    with pytest.raises(WarehouseOutdatedError, match=r"format \d+, this release's is \d+: run `rebalancer upgrade`"):
        require_current(wh)
    assert delta_versions(wh) == before


def test_a_missing_warehouse_is_named_and_not_created(spark: Any, tmp_path: Path) -> None:
    wh = open_at(spark, tmp_path / "typo")
    with pytest.raises(WarehouseMissingError, match="there is no warehouse at .*typo.*rebalancer init"):
        require_current(wh)
    assert not (tmp_path / "typo").exists()


def test_a_new_warehouse_records_the_current_format_and_a_later_one_is_refused(spark: Any, tmp_path: Path) -> None:
    wh = open_at(spark, tmp_path / "w")
    assert "warehouse_format" in create_warehouse(wh)
    assert stored_format(wh) == CURRENT_FORMAT
    require_current(wh)
    assert upgrade(wh, Settings()).changes == ()  # nothing to do
    later = CURRENT_FORMAT + 1
    wh.append_arrow("warehouse_format", pa.Table.from_pylist(
        [{"format": later, "release": "9.9.9", "written_at": datetime.now(UTC), "note": "a later release"}],
        schema=wh.read_arrow("warehouse_format").schema))
    before = delta_versions(wh)
    with pytest.raises(WarehouseTooNewError, match=f"format {later}, written by rebalancer 9.9.9.*install"):
        require_current(wh)
    with pytest.raises(WarehouseTooNewError):
        upgrade(wh, Settings())
    assert delta_versions(wh) == before


# ---- the upgrade ----
def test_a_dry_run_lists_each_change_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    wh = open_at(spark, unpack(1, tmp_path))
    before = delta_versions(wh)
    result = upgrade(wh, settings_for(tmp_path), dry_run=True)
    assert delta_versions(wh) == before
    said = [str(c) for c in result.changes]
    assert "migration_plan: add columns transfer, chunks, candidates, primary_node, owners, replicas" in said
    assert "what_if: create table" in said
    assert said[-1] == f"warehouse_format: record format {CURRENT_FORMAT}"
    assert any("input_versions of exchange" in s for s in said)


def test_the_input_versions_reconstructed_from_commit_times_are_those_recorded(spark: Any, tmp_path: Path) -> None:
    """Format 3 and later record what each exchange consumed: the reconstruction an upgrade makes for earlier
    formats (each input table's newest version committed before the exchange started) gives the same."""
    wh = open_at(spark, unpack(PREVIOUS, tmp_path))
    times = {name: wh.commit_times(name) for name in INPUT_TABLES}
    rows = wh.read_arrow("exchanges").to_pylist()
    assert len(rows) >= 3
    for row in rows:
        assert consumed_versions(times, row["started_at"]) == dict(row["input_versions"])


class Upgraded:
    """Each fixture upgraded once, when a test first asks for it (the tests read it; each continues its own copy)."""

    def __init__(self, spark: Any, tmp: pytest.TempPathFactory) -> None:
        self.spark, self.tmp, self.paths = spark, tmp, {}

    def __getitem__(self, fmt: int) -> Path:
        if fmt not in self.paths:
            path = unpack(fmt, self.tmp.mktemp(f"upgraded-{fmt}"))
            upgrade(open_at(self.spark, path), settings_for(path))
            self.paths[fmt] = path
        return self.paths[fmt]


@pytest.fixture(scope="module")
def upgraded(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Upgraded:
    return Upgraded(spark, tmp_path_factory)


@pytest.mark.parametrize("fmt", [f if f in (1, PREVIOUS) else pytest.param(f, marks=pytest.mark.slow) for f in BUILT])
def test_an_upgraded_warehouse_keeps_every_earlier_version(
    spark: Any, tmp_path: Path, upgraded: Upgraded, fmt: int
) -> None:
    pristine = open_at(spark, unpack(fmt, tmp_path))
    wh = open_at(spark, upgraded[fmt])
    assert stored_format(wh) == CURRENT_FORMAT
    require_current(wh)
    for name in SCHEMAS:  # still plain Delta, whichever engine upgraded it
        table = DeltaTable(str(upgraded[fmt] / name))
        assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == (1, 2), name
        assert table.metadata().configuration.get("delta.enableDeletionVectors", "false") == "false", name
    for name, last in delta_versions(pristine).items():
        assert wh.table_version(name) >= last
        for version in range(last + 1):  # time travel to every version before the upgrade: the same rows
            old = pristine.read_arrow(name, version=version)
            assert rows_of(wh, name, version, old.column_names) == rows_of(pristine, name, version), (name, version)


@pytest.mark.parametrize("fmt", CONTINUED)
def test_an_upgraded_warehouse_continues_as_one_the_current_release_replayed(
    spark: Any, tmp_path: Path, upgraded: Upgraded, fmt: int
) -> None:
    """After the upgrade, a node's return, its exchange and a round of the twin commit the same rows as they do in
    a warehouse the current release built by replaying the fixture's inputs, exchange by exchange."""
    continued = tmp_path / "continued"
    shutil.copytree(upgraded[fmt], continued)
    wh = open_at(spark, continued)
    replay = replayed(spark, unpack(fmt, tmp_path / "pristine"), tmp_path / "replay")
    last_id = max(wh.read_arrow("exchanges").column("exchange_id").to_pylist())
    assert max(replay.read_arrow("exchanges").column("exchange_id").to_pylist()) == last_id
    last = newest_version(wh)
    assert newest_version(replay) == last
    for target in (wh, replay):
        continue_story(spark, target)
    assert max(wh.read_arrow("exchanges").column("exchange_id").to_pylist()) > last_id + 1
    for name in (*VERSIONED_TABLES, "exchanges"):
        assert after(wh, name, last) == after(replay, name, last), name
    assert rows_of_rejected(wh, last_id) == rows_of_rejected(replay, last_id)


def after(wh: Warehouse, name: str, version: tuple[int, int]) -> Counter:
    table = wh.read_arrow(name)
    keep = [c for c in table.column_names if c not in UNCOMPARED]
    return Counter(json.dumps(r, default=str, sort_keys=True) for r in table.select(keep).to_pylist()
                   if (r["topology_major"], r["topology_minor"]) > version)


def rows_of_rejected(wh: Warehouse, after_id: int) -> Counter:
    rows = wh.read_arrow("rejected_rows").to_pylist()
    return Counter(json.dumps(r, sort_keys=True) for r in rows if r["exchange_id"] > after_id)


def continue_story(spark: Any, wh: Warehouse) -> None:
    """node1 (failed in every fixture) joins again; an exchange; one round of the twin."""
    seq = max(wh.read_arrow("topology_events").column("event_seq").to_pylist()) + 1
    event = {"event_seq": seq, "event_type": "NODE_JOINED", "node_id": "node1", "group_name": None,
             "event_time": datetime(2026, 12, 1, tzinfo=UTC)}
    wh.append_arrow("topology_events", pa.Table.from_pylist([event], schema=wh.read_arrow("topology_events").schema))
    settings = settings_for(Path(wh.location), wh.engine)
    run_exchange(spark, wh, settings)
    simulate(spark, wh, settings)


def replayed(spark: Any, fixture: Path, into: Path) -> Warehouse:
    """A current-release warehouse fed the fixture's input rows in the same steps, one exchange run per step. On
    delta-rs whatever the suite's engine: both engines commit the same rows (tests/test_delta_spark.py), and the
    engine under test is the upgraded warehouse's."""
    old = open_at(spark, fixture, "delta-rs")
    new = open_at(spark, into, "delta-rs")
    create_warehouse(new)
    times = {name: old.commit_times(name) for name in INPUT_TABLES}
    runs: list[dict[str, int]] = []
    for row in sorted(old.read_arrow("exchanges").to_pylist(), key=lambda r: r["exchange_id"]):
        consumed = dict(row["input_versions"]) if row["input_versions"] else consumed_versions(times, row["started_at"])
        if not runs or runs[-1] != consumed:
            runs.append(consumed)
    # the fixture's last run may have committed nothing (an event it rejected): its inputs count too
    runs.append({name: old.table_version(name) for name in INPUT_TABLES})
    fed: dict[str, int] = {}
    for consumed in runs:
        for name, version in consumed.items():
            feed(old, new, name, fed.get(name), version)
            fed[name] = version
        run_exchange(spark, new, settings_for(into, "delta-rs"))
    return new


def feed(old: Warehouse, new: Warehouse, name: str, since: int | None, version: int) -> None:
    """Give ``new``'s input table ``name`` the rows ``old``'s gained from ``since`` to ``version``: appended when
    only added, replaced otherwise (``generate``)."""
    if since == version:
        return
    now = old.read_arrow(name, version=version)
    if since is None:
        new.replace_where_arrow(name, now, {})
        return
    before = Counter(json.dumps(r, default=str, sort_keys=True)
                     for r in old.read_arrow(name, version=since).to_pylist())
    added = []
    for r in now.to_pylist():
        key = json.dumps(r, default=str, sort_keys=True)
        if before[key]:
            before[key] -= 1
        else:
            added.append(r)
    if +before:  # rows went away: the table was replaced
        new.replace_where_arrow(name, now, {})
    elif added:
        new.append_arrow(name, pa.Table.from_pylist(added, schema=now.schema))


# ---- crash safety ----
class Stop(Exception):
    pass


def test_an_upgrade_stopped_at_any_write_ends_like_one_that_was_not(spark: Any, tmp_path: Path) -> None:
    """Format 1 (every kind of change) stopped before each of its writes in turn: each run makes one write and is
    stopped before the next, as a crash there would leave it, and the warehouse is refused meanwhile; run after run
    resumes where the last stopped, the last finishes, and every table holds what a clean upgrade leaves."""
    clean = unpack(1, tmp_path / "clean")
    writes = [str(c) for c in upgrade(open_at(spark, clean), settings_for(clean)).changes]
    assert {w.split(": ")[1].split(" ")[0] for w in writes} == {"add", "create", "fill", "record"}
    expected = {name: rows_of(open_at(spark, clean), name) for name in SCHEMAS if name != "warehouse_format"}
    path = unpack(1, tmp_path / "stopped")
    wh = open_at(spark, path)
    made: list[str] = []
    in_this_run: list[str] = []

    def one_write_then_stop(change: Change) -> None:
        if in_this_run:
            raise Stop(str(change))
        in_this_run.append(str(change))
        made.append(str(change))

    for _ in range(2 * len(writes)):
        in_this_run.clear()
        try:
            upgrade(wh, settings_for(path), fault_hook=one_write_then_stop)
            break
        except Stop:
            with pytest.raises(WarehouseOutdatedError):  # no command takes a half-upgraded warehouse for current
                require_current(wh)
    assert made == writes  # each run resumed where the last one stopped
    require_current(wh)
    assert upgrade(wh, settings_for(path)).changes == ()
    for name, rows in expected.items():
        assert rows_of(wh, name) == rows, name


def test_ci_continues_the_first_and_the_previous_format() -> None:
    """The Makefile names the formats CI continues (CONTINUED_FORMATS, UPGRADE_CONTINUED_ON_DELTA_SPARK): a new
    format must move them, or CI would stop continuing the previous one."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    named = {int(n) for n in re.findall(r"replayed\[(\d+)\]", makefile)}
    assert named == {1, PREVIOUS}, f"the Makefile continues {sorted(named)}; CI should continue 1 and {PREVIOUS}"
