"""`rebalancer report`: the charts of one committed version, end to end on a real warehouse and on hand-built data.

The plotting tests build a :class:`ReportData` by hand (no Spark) and read the drawn bars back from the figures.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from rebalancer import report as rep
from rebalancer.report import (
    ExchangeSummary,
    GanttBar,
    NodeLoad,
    ReportData,
    Schedule,
    parse_version,
    plot_bytes_moved,
    plot_losses,
    plot_node_load,
    plot_schedule,
    write_report,
)
from tests.test_cli import run

GIB = 2**30


# ---- end to end (Spark) ----
def test_report_of_a_failure_writes_four_charts_and_one_self_contained_page(
    spark: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = str(tmp_path / "w")
    for argv in (
        ["generate", "--nodes", "4", "--groups", "1", "--partitions", "16", "--backups", "1"],
        ["exchange"],
        ["event", "NODE_FAILED", "--node", "node1"],
        ["exchange"],
    ):
        code, out, err = run(capsys, "--warehouse", w, *argv)
        assert code == 0, (argv, out, err)

    out_dir = tmp_path / "report"
    code, out, err = run(capsys, "--warehouse", w, "report", "--out", str(out_dir))
    assert code == 0, (out, err)
    page = out_dir / "report.html"
    assert str(page) in out
    for stem in ("nodes", "bytes", "schedule", "losses"):
        assert (out_dir / f"{stem}.png").read_bytes().startswith(b"\x89PNG"), stem
    text = page.read_text(encoding="utf-8")
    assert text.count("data:image/png;base64,") == 4
    assert "version 5.0" in text
    assert "No what-if run against this version yet" in text
    # the worst partitions explained: those of the plan's last steps (nothing is lost)
    assert "<h2>Explain: the worst partitions</h2>" in text and text.count("<h3>group0 partition ") == 3
    assert "waited for: " in text

    # a what-if run against the version is on the page, worst first
    code, out, err = run(capsys, "--warehouse", w, "what-if", "--scenario", "NODE_FAILED node0",
                         "--scenario", "NODE_FAILED node2; NODE_FAILED node3")
    assert code == 0, err
    run(capsys, "--warehouse", w, "report", "--out", str(out_dir))
    text = page.read_text(encoding="utf-8")
    assert "2 scenarios of what-if run" in text
    assert text.index("NODE_FAILED node2; NODE_FAILED node3") < text.index("<td>NODE_FAILED node0</td>")
    assert not re.search(r'src="(?!data:)', text), "the page must not reference any other file"

    code, out, err = run(capsys, "--warehouse", w, "report", "--version", "9.0", "--out", str(out_dir))
    assert code == 1
    assert "error: version 9.0 was never committed; the latest is 5.0" in err

    # The collected aggregates agree with the exchange's own summary (counted by other code).
    from rebalancer.config import load_settings
    from rebalancer.storage import open_warehouse

    settings = load_settings(None).with_overrides(storage={"warehouse": w})
    warehouse = open_warehouse(spark, settings.storage)
    data = rep.collect_report_data(spark, warehouse, (5, 0))
    assert data.previous_version == (4, 0)
    assert sum(v.replicas for v in data.before.values()) == 32 and "node1" in data.before
    assert sum(v.replicas for v in data.after.values()) == 32 and "node1" not in data.after
    assert sum(v.primaries for v in data.after.values()) == 16
    assert sum(data.bytes_sent.values()) == sum(data.bytes_received.values()) == data.exchange.bytes_to_move > 0
    assert data.schedule.steps == data.exchange.migrations > 0
    assert not data.schedule.merged

    # A plan larger than the limit is drawn from merged runs that cover every step.
    monkeypatch.setattr(rep, "MAX_GANTT_STEPS", 1)
    merged = rep.collect_report_data(spark, warehouse, (5, 0)).schedule
    assert merged.merged and merged.steps == data.schedule.steps
    assert 0 < len(merged.bars) <= len(data.schedule.bars)
    for bar in data.schedule.bars:
        assert any(
            m.node == bar.node and m.action == bar.action and m.start_s <= bar.start_s and bar.end_s <= m.end_s
            for m in merged.bars
        ), bar


# ---- hand-built data (no Spark) ----
def _summary(**overrides: Any) -> ExchangeSummary:
    values: dict[str, Any] = dict(
        exchange_id=2, exchange_type="ALL", alive_servers=3, partitions=8, lost_partitions=1, moving_copies=2,
        temporary_primaries=0, counter_conflicts=3, migrations=4, bytes_to_move=3 * GIB, makespan_s=12.0,
        makespan_lower_bound_s=10.0,
    )
    values.update(overrides)
    return ExchangeSummary(**values)


def _data(**overrides: Any) -> ReportData:
    values: dict[str, Any] = dict(
        version=(6, 0),
        previous_version=(5, 0),
        exchange=_summary(),
        before={"node10": NodeLoad(5, 2), "node2": NodeLoad(6, 3), "node1": NodeLoad(5, 3)},
        after={"node10": NodeLoad(8, 4), "node2": NodeLoad(8, 4)},
        bytes_sent={"node2": 2 * GIB, "node10": GIB},
        bytes_received={"node10": 3 * GIB},
        schedule=Schedule(
            bars=(
                GanttBar("node2", "COPY", 0.0, 8.0),
                GanttBar("node10", "COPY", 0.0, 8.0),
                GanttBar("node10", "COPY", 1.0, 12.0),
                GanttBar("node2", "PROMOTE", 8.0, 8.1),
                GanttBar("node10", "PROMOTE", 8.0, 8.1),
                GanttBar("node2", "DROP", 8.1, 8.2),
            ),
            steps=4,
        ),
        lost_by_group={"orders": 1},
        conflicts_by_group={("users", "RESET_TO_MOVING"): 2, ("users", "SIZE_MISMATCH"): 1},
    )
    values.update(overrides)
    return ReportData(**values)


def _bar_heights(fig: Figure, axes: int = 0) -> list[list[float]]:
    return [[p.get_height() for p in c] for c in fig.axes[axes].containers]


def _texts(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_node_load_draws_before_and_after_per_node_in_natural_order() -> None:
    fig = plot_node_load(_data())
    replicas, primaries = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in primaries.get_xticklabels()] == ["node1", "node2", "node10"]
    assert _bar_heights(fig, 0) == [[5, 6, 5], [0, 8, 8]]  # before, after: node1 failed, so nothing after
    assert _bar_heights(fig, 1) == [[3, 3, 2], [0, 4, 4]]
    assert replicas.get_ylabel() == "replicas (copies)"
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels == ["before: version 5.0, serving (affinity_assignment)",
                      "after: version 6.0, ideal (ideal_assignment)"]


def test_node_load_of_a_first_version_has_no_before_bars() -> None:
    fig = plot_node_load(_data(previous_version=None, before={}))
    assert _bar_heights(fig, 0) == [[0, 0], [8, 8]]
    assert "before: none (first version)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_bytes_moved_is_in_gib_per_node() -> None:
    fig = plot_bytes_moved(_data())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["node2", "node10"]
    assert _bar_heights(fig) == [[2.0, 1.0], [0.0, 3.0]]  # sent, received
    assert ax.get_ylabel() == "bytes (GiB)"


def test_bytes_moved_without_copies_says_none() -> None:
    fig = plot_bytes_moved(_data(bytes_sent={}, bytes_received={}))
    assert "none" in _texts(fig)
    assert fig.axes[0].containers == []


def test_schedule_draws_one_broken_barh_per_node_and_action_and_marks_the_makespan() -> None:
    fig = plot_schedule(_data())
    ax = fig.axes[0]
    collections = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(collections) == 5  # node2: COPY, PROMOTE, DROP; node10: COPY, PROMOTE
    assert sum(len(c.get_paths()) for c in collections) == 6  # one rectangle per bar
    assert [t.get_text() for t in ax.get_yticklabels()] == ["node2", "node10"]
    assert sorted(line.get_xdata()[0] for line in ax.lines) == [10.0, 12.0]  # lower bound, makespan
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["COPY", "PROMOTE", "DROP", "makespan 12.0 s", "lower bound 10.0 s"]
    assert ax.get_xlabel() == "time since the plan starts (s)"


def test_schedule_rows_keep_idle_nodes_of_the_ideal_assignment() -> None:
    data = _data(after={**_data().after, "node3": NodeLoad(4, 1)})
    ax = plot_schedule(data).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["node2", "node3", "node10"]


def test_schedule_of_an_empty_plan_says_none() -> None:
    fig = plot_schedule(_data(schedule=Schedule(bars=(), steps=0)))
    assert "none" in _texts(fig)
    assert not fig.axes[0].collections


def test_losses_show_lost_partitions_and_stacked_conflicts_per_group() -> None:
    fig = plot_losses(_data())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["orders", "users"]
    assert _bar_heights(fig) == [[1, 0], [0, 2], [0, 1]]  # lost; RESET_TO_MOVING; SIZE_MISMATCH on top
    assert [p.get_y() for p in ax.containers[2]] == [0, 2]


def test_losses_without_any_say_none() -> None:
    fig = plot_losses(_data(lost_by_group={}, conflicts_by_group={}))
    assert "none: no lost partitions and no counter conflicts" in _texts(fig)


def test_write_report_embeds_every_chart_and_the_summary(tmp_path: Path) -> None:
    page = write_report(_data(), tmp_path / "out")
    assert page == tmp_path / "out" / "report.html"
    text = page.read_text(encoding="utf-8")
    assert text.count("data:image/png;base64,") == 4
    assert "<title>rebalancer report: version 6.0 (ALL)</title>" in text
    expected = (("exchange type", "ALL"), ("bytes to move", "3.00 GiB"), ("makespan", "12.0 s"),
                ("makespan lower bound", "10.0 s"), ("lost partitions", "1"), ("temporary primaries", "0"))
    for label, value in expected:
        assert re.search(rf"<th>{label}</th><td[^>]*>{re.escape(value)}", text), label
    assert text.count("<figcaption>") == 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bytes.png", "losses.png", "nodes.png", "report.html", "schedule.png"
    ]


def test_merged_schedule_says_so_in_its_caption(tmp_path: Path) -> None:
    bars = (GanttBar("node2", "COPY", 0.0, 12.0), GanttBar("node10", "COPY", 0.0, 11.0))
    schedule = Schedule(bars=bars, steps=25_000, merged=True, merge_gap_s=0.006)
    text = write_report(_data(schedule=schedule), tmp_path).read_text(encoding="utf-8")
    assert "25,000 steps are more than 20,000" in text and "aggregated into 2 bars" in text


@pytest.mark.parametrize(("text", "version"), [("6.0", (6, 0)), ("12.3", (12, 3)), ("7", (7, 0)), (" 6.1 ", (6, 1))])
def test_parse_version(text: str, version: tuple[int, int]) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text", ["", "six", "6.0.1", "-1.0", "6."])
def test_parse_version_rejects_other_text(text: str) -> None:
    with pytest.raises(ValueError, match="write MAJOR.MINOR"):
        parse_version(text)
