"""The format check as a user meets it: every command refuses a missing or earlier-format warehouse with one sentence
and writes nothing; `upgrade --dry-run` lists, `upgrade` upgrades once; `init` and `generate` create."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rebalancer.formats import CURRENT_FORMAT
from tests.test_cli import run
from tests.upgrade.test_upgrade import PREVIOUS, delta_versions, open_at, unpack

# Every command that opens the warehouse, with arguments it would accept on a current one.
COMMANDS = [
    ["exchange"],
    ["sql", "SELECT 1"],
    ["event", "NODE_FAILED", "--node", "node2"],
    ["simulate"],
    ["what-if", "--scenario", "NODE_FAILED node2"],
    ["explain", "--group", "group0", "--partition", "0"],
    ["vacuum", "--keep-versions", "1"],
    ["export-affinity", "--out", "routing.json"],
    ["route", "--group", "group0", "k1"],
    ["report"],
    ["balance"],
    ["kafka", "execute", "--dry-run"],
    ["init"],
    ["generate", "--nodes", "3", "--partitions", "8"],
    ["demo", "--nodes", "3", "--partitions", "8"],
]


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(PREVIOUS, tmp_path_factory.mktemp("previous"))


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_command_on_the_previous_format_says_upgrade_and_changes_nothing(
    spark: Any, capsys: Any, previous: Path, argv: list[str], tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    before = delta_versions(open_at(spark, previous))
    code, out, err = run(capsys, "--warehouse", str(previous), *argv)
    assert code == 1, out
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert f"is in format {PREVIOUS}, this release's is {CURRENT_FORMAT}: run `rebalancer upgrade`" in line
    assert delta_versions(open_at(spark, previous)) == before


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] not in ("init", "generate", "demo")],
                         ids=lambda a: a[0])
def test_a_command_on_a_path_with_no_warehouse_names_it_and_creates_nothing(
    spark: Any, capsys: Any, tmp_path: Path, argv: list[str], monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "warehuose"
    code, _, err = run(capsys, "--warehouse", str(typo), *argv)
    assert code == 1
    assert f"error: there is no warehouse at {typo}: create one with `rebalancer init`" in err
    assert not typo.exists()


def test_upgrade_dry_run_then_upgrade_then_the_commands_work(spark: Any, capsys: Any, tmp_path: Path) -> None:
    w = unpack(PREVIOUS, tmp_path)
    before = delta_versions(open_at(spark, w))
    code, out, _ = run(capsys, "--warehouse", str(w), "upgrade", "--dry-run")
    assert code == 0
    assert f"format {PREVIOUS} -> {CURRENT_FORMAT}" in out and "would make" in out
    assert "warehouse_format: record format" in out
    assert delta_versions(open_at(spark, w)) == before
    code, out, _ = run(capsys, "--warehouse", str(w), "upgrade")
    assert code == 0 and "made" in out
    code, out, _ = run(capsys, "--warehouse", str(w), "upgrade")
    assert code == 0 and f"already in format {CURRENT_FORMAT}: nothing to do" in out
    code, out, _ = run(capsys, "--warehouse", str(w), "sql", "SELECT format, note FROM warehouse_format")
    assert code == 0 and f"upgraded from format {PREVIOUS}" in out
    code, out, _ = run(capsys, "--warehouse", str(w), "event", "NODE_JOINED", "--node", "node1")
    assert code == 0
    code, out, _ = run(capsys, "--warehouse", str(w), "exchange")
    assert code == 0 and "exchange" in out


def test_generate_creates_a_warehouse_and_says_so(spark: Any, capsys: Any, tmp_path: Path) -> None:
    w = tmp_path / "new"
    code, out, err = run(capsys, "--warehouse", str(w), "generate", "--nodes", "3", "--partitions", "8")
    assert code == 0, err
    assert f"created a new warehouse at {w}" in err
    code, out, _ = run(capsys, "--warehouse", str(w), "upgrade", "--dry-run")
    assert f"already in format {CURRENT_FORMAT}" in out
