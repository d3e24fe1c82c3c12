"""Reports for people: four charts of one committed topology version, as PNGs and one self-contained HTML page.

The pipeline has three parts, and only the first touches Spark and only the last writes files:

1. :func:`collect_report_data` reads the version's tables, aggregates them in Spark and collects only small results
   (one row per node, per group, and the plan's steps for the Gantt chart) into a plain :class:`ReportData`.
2. ``plot_*`` functions turn a :class:`ReportData` into a matplotlib :class:`~matplotlib.figure.Figure` (Agg canvas;
   no pyplot, so no global figure state and no display needed). They are pure and testable on hand-built data.
3. :func:`write_report` saves the PNGs and ``report.html``, which embeds the same PNGs as base64 data URIs.

The charts:

* **nodes**: replicas and primaries per node, *before* (the previous committed version's ``affinity_assignment``,
  the serving assignment the plan starts from) and *after* (this version's ``ideal_assignment``, where the plan
  leads);
* **bytes**: bytes each node sends and receives in the plan's COPY steps;
* **schedule**: the plan as a Gantt chart, one row per node with a lane per action. A COPY or a PROMOTE shows on
  both of its nodes, a DROP on its node. Plans of more than :data:`MAX_GANTT_STEPS` steps are *aggregated*, not
  sampled: steps of one action on one node that overlap or lie closer than 1/2000 of the makespan (under a pixel)
  are merged into one bar, so the picture is the same as with every step drawn, from a bounded number of bars;
* **losses**: lost partitions and counter conflicts (by action) per group.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from rebalancer.config import Settings
from rebalancer.explain import describe, explain
from rebalancer.frames import at_version
from rebalancer.inputs import latest_version as latest_committed_version
from rebalancer.storage import Warehouse
from rebalancer.vocabulary import ACTIONS as PLAN_ACTIONS
from rebalancer.vocabulary import COPY
from rebalancer.what_if import ranked

__all__ = [
    "ACTIONS",
    "CHARTS",
    "MAX_GANTT_STEPS",
    "ExchangeSummary",
    "GanttBar",
    "NodeLoad",
    "ReportData",
    "Schedule",
    "collect_report_data",
    "merge_close_steps",
    "parse_version",
    "plot_bytes_moved",
    "plot_losses",
    "plot_node_load",
    "plot_schedule",
    "render_html",
    "summary_rows",
    "write_report",
]

EXPLAINED = 3
"""Partitions the page explains (rebalancer.explain), worst first."""
MAX_GANTT_STEPS = 20_000
"""Plans with more steps than this are drawn from merged bars (module docstring)."""
MERGE_RESOLUTION = 2000
"""Merged bars join steps closer than makespan / MERGE_RESOLUTION: narrower than a pixel at the chart's width."""
ACTIONS = PLAN_ACTIONS
ACTION_COLORS = {"COPY": "#1f77b4", "PROMOTE": "#ff7f0e", "DROP": "#d62728"}
BEFORE_COLOR, AFTER_COLOR = "#9e9e9e", "#1f77b4"
SENT_COLOR, RECEIVED_COLOR = "#ff7f0e", "#2ca02c"
LOST_COLOR = "#d62728"
BOUND_COLOR = "#2ca02c"
CONFLICT_COLORS = {"RESET_TO_MOVING": "#9467bd", "SIZE_MISMATCH": "#8c564b"}
DPI = 110

_VERSION_TEXT = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*$")


# ---- data ----
@dataclass(frozen=True)
class ExchangeSummary:
    """The summary columns of a version's ``exchanges`` row."""

    exchange_id: int
    exchange_type: str
    alive_servers: int
    partitions: int
    lost_partitions: int
    moving_copies: int
    temporary_primaries: int
    counter_conflicts: int
    migrations: int
    bytes_to_move: int
    makespan_s: float
    makespan_lower_bound_s: float


@dataclass(frozen=True)
class NodeLoad:
    """Replicas and primaries (replica_index 0) one node holds in an assignment."""

    replicas: int
    primaries: int


@dataclass(frozen=True)
class GanttBar:
    """One step of the plan on one of its nodes (or, in a merged schedule, a run of such steps)."""

    node: str
    action: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Schedule:
    """The bars of the Gantt chart.

    Attributes:
        bars: one per (step, node it touches), or merged runs of them when ``merged``.
        steps: the steps of the plan (every action).
        merged: the plan had more than :data:`MAX_GANTT_STEPS` steps and ``bars`` are merged runs.
        merge_gap_s: with ``merged``, steps closer than this were joined.
    """

    bars: tuple[GanttBar, ...]
    steps: int
    merged: bool = False
    merge_gap_s: float = 0.0


@dataclass(frozen=True)
class ReportData:
    """Everything the charts of one version need: small, plain Python, no Spark.

    Attributes:
        version: the reported version ``(major, minor)``.
        previous_version: the committed version before it, whose serving assignment the plan starts from.
        exchange: the version's ``exchanges`` row.
        before: per node, the previous version's ``affinity_assignment`` (empty without a previous version).
        after: per node, this version's ``ideal_assignment``.
        bytes_sent / bytes_received: per node, the bytes of this version's COPY steps.
        schedule: the Gantt bars of this version's plan.
        lost_by_group: lost partitions per group (groups without any are absent).
        conflicts_by_group: counter conflicts per ``(group, action)``.
        what_if: the rows of the newest ``what-if`` run against this version, worst first (none: not run).
        explained: ``(title, lines)`` of :func:`rebalancer.explain.describe` for the worst partitions (lost ones
            first, then those of the plan's last steps), at most :data:`EXPLAINED`.
    """

    version: tuple[int, int]
    previous_version: tuple[int, int] | None
    exchange: ExchangeSummary
    before: Mapping[str, NodeLoad]
    after: Mapping[str, NodeLoad]
    bytes_sent: Mapping[str, int]
    bytes_received: Mapping[str, int]
    schedule: Schedule
    lost_by_group: Mapping[str, int]
    conflicts_by_group: Mapping[tuple[str, str], int]
    what_if: tuple[Mapping[str, Any], ...] = ()
    explained: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def version_text(self) -> str:
        return _version_text(self.version)

    def nodes(self) -> list[str]:
        """Every node any chart mentions, in natural order (node2 before node10)."""
        names: set[str] = set(self.before) | set(self.after) | set(self.bytes_sent) | set(self.bytes_received)
        names.update(bar.node for bar in self.schedule.bars)
        return sorted(names, key=_natural_key)

    def groups(self) -> list[str]:
        """Every group with a lost partition or a counter conflict, in natural order."""
        names = set(self.lost_by_group) | {group for group, _ in self.conflicts_by_group}
        return sorted(names, key=_natural_key)


def _version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]


def parse_version(text: str) -> tuple[int, int]:
    """``"6.0"`` (or ``"6"``) as ``(6, 0)``.

    Raises:
        ValueError: the text is not ``MAJOR.MINOR`` with non-negative integers.
    """
    match = _VERSION_TEXT.match(text)
    if match is None:
        raise ValueError(f"--version {text!r} is not a topology version; write MAJOR.MINOR, for example 6.0")
    return int(match.group(1)), int(match.group(2) or 0)


# ---- collection (Spark) ----
def _committed_versions(warehouse: Warehouse, version: tuple[int, int] | None) -> tuple[
    tuple[int, int], tuple[int, int] | None
]:
    """The version to report (default: the latest committed) and the committed version before it."""
    exchanges_df = warehouse.read("exchanges")
    latest_version = latest_committed_version(warehouse)
    if latest_version is None:
        raise LookupError("no exchange has been committed yet; run `rebalancer exchange` first")
    target = version or latest_version
    if at_version(exchanges_df, target).limit(1).count() == 0:
        raise LookupError(
            f"version {_version_text(target)} was never committed; the latest is {_version_text(latest_version)}"
        )
    major, minor = target
    earlier = (F.col("topology_major") < major) | (
        (F.col("topology_major") == major) & (F.col("topology_minor") < minor)
    )
    previous = (
        exchanges_df.where(earlier)
        .orderBy(F.col("topology_major").desc(), F.col("topology_minor").desc())
        .select("topology_major", "topology_minor")
        .first()
    )
    return target, (None if previous is None else (int(previous[0]), int(previous[1])))


def _node_load(assignment_df: DataFrame) -> dict[str, NodeLoad]:
    rows = (
        assignment_df.groupBy("node_id")
        .agg(F.count(F.lit(1)).alias("replicas"), F.sum((F.col("replica_index") == 0).cast("long")).alias("primaries"))
        .collect()
    )
    return {r["node_id"]: NodeLoad(int(r["replicas"]), int(r["primaries"] or 0)) for r in rows}


def _bytes_moved(plan_df: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    copies = plan_df.where(F.col("action") == COPY)
    moved = copies.select(
        F.col("source_node").alias("node_id"), F.col("bytes").alias("sent"), F.lit(0).cast("long").alias("received")
    ).unionByName(
        copies.select(
            F.col("target_node").alias("node_id"), F.lit(0).cast("long").alias("sent"), F.col("bytes").alias("received")
        )
    )
    rows = (
        moved.where(F.col("node_id").isNotNull())
        .groupBy("node_id")
        .agg(F.sum("sent").alias("sent"), F.sum("received").alias("received"))
        .collect()
    )
    return (
        {r["node_id"]: int(r["sent"] or 0) for r in rows},
        {r["node_id"]: int(r["received"] or 0) for r in rows},
    )


def _step_nodes(plan_df: DataFrame) -> DataFrame:
    """``(node, action, start_s, end_s)``: each step once per node it touches (a DROP has no target)."""
    nodes = F.array_distinct(F.array("source_node", "target_node"))
    return (
        plan_df.select(
            F.explode(nodes).alias("node"),
            "action",
            F.col("est_start_s").alias("start_s"),
            F.col("est_end_s").alias("end_s"),
        )
        .where(F.col("node").isNotNull() & F.col("start_s").isNotNull() & F.col("end_s").isNotNull())
    )


def merge_close_steps(steps_df: DataFrame, gap_s: float) -> DataFrame:
    """Merge each (node, action)'s steps that overlap or lie closer than ``gap_s`` into one bar.

    Args:
        steps_df: ``(node, action, start_s, end_s)``.
        gap_s: the largest gap between two steps that still joins them.

    Returns:
        ``(node, action, start_s, end_s)``, one row per merged bar.
    """
    ordered = Window.partitionBy("node", "action").orderBy("start_s", "end_s")
    reach = F.max("end_s").over(ordered.rowsBetween(Window.unboundedPreceding, -1))
    starts_bar = (reach.isNull() | (F.col("start_s") > reach + F.lit(gap_s))).cast("long")
    return (
        steps_df.withColumn("starts_bar", starts_bar)
        .withColumn("bar", F.sum("starts_bar").over(ordered.rowsBetween(Window.unboundedPreceding, 0)))
        .groupBy("node", "action", "bar")
        .agg(F.min("start_s").alias("start_s"), F.max("end_s").alias("end_s"))
        .drop("bar")
    )


def _schedule(plan_df: DataFrame, makespan_s: float) -> Schedule:
    steps = plan_df.count()
    steps_df = _step_nodes(plan_df)
    merged = steps > MAX_GANTT_STEPS
    gap_s = 0.0
    if merged:
        extent = makespan_s or (plan_df.agg(F.max("est_end_s")).first() or [0.0])[0] or 0.0
        gap_s = float(extent) / MERGE_RESOLUTION
        steps_df = merge_close_steps(steps_df, gap_s)
    bars = tuple(
        GanttBar(r["node"], r["action"], float(r["start_s"]), float(r["end_s"]))
        for r in steps_df.orderBy("node", "action", "start_s").collect()
    )
    return Schedule(bars=bars, steps=steps, merged=merged, merge_gap_s=gap_s)


def _exchange_summary(exchanges_df: DataFrame) -> ExchangeSummary:
    row = exchanges_df.first()
    assert row is not None  # the caller checked that the version is committed
    r = row.asDict()
    return ExchangeSummary(
        exchange_id=int(r["exchange_id"] or 0),
        exchange_type=str(r["exchange_type"]),
        alive_servers=int(r["alive_servers"] or 0),
        partitions=int(r["partitions"] or 0),
        lost_partitions=int(r["lost_partitions"] or 0),
        moving_copies=int(r["moving_copies"] or 0),
        temporary_primaries=int(r["temporary_primaries"] or 0),
        counter_conflicts=int(r["counter_conflicts"] or 0),
        migrations=int(r["migrations"] or 0),
        bytes_to_move=int(r["bytes_to_move"] or 0),
        makespan_s=float(r["makespan_s"] or 0.0),
        makespan_lower_bound_s=float(r["makespan_lower_bound_s"] or 0.0),
    )


def collect_report_data(
    spark: SparkSession, warehouse: Warehouse, version: tuple[int, int] | None = None,
    settings: Settings | None = None,
) -> ReportData:
    """Read one committed version's tables and collect what the charts need.

    Aggregation runs in Spark; the driver receives one row per node and per group, and the plan's steps for the
    Gantt chart (merged runs when the plan has more than :data:`MAX_GANTT_STEPS` steps).

    Args:
        spark: the session (every read goes through ``warehouse``; kept for the operations' common signature).
        warehouse: an open warehouse.
        version: ``(major, minor)``; the latest committed version when None.
        settings: what explain reads (history threshold, cap); the defaults when None.

    Returns:
        The report's data.

    Raises:
        LookupError: no exchange has been committed yet, or ``version`` was never committed.
    """
    target, previous = _committed_versions(warehouse, version)
    exchange = _exchange_summary(at_version(warehouse.read("exchanges"), target))
    before = _node_load(at_version(warehouse.read("affinity_assignment"), previous)) if previous else {}
    after = _node_load(at_version(warehouse.read("ideal_assignment"), target))
    plan_df = at_version(warehouse.read("migration_plan"), target).select(
        "action", "source_node", "target_node", "bytes", "est_start_s", "est_end_s"
    )
    sent, received = _bytes_moved(plan_df)
    schedule = _schedule(plan_df, exchange.makespan_s)
    lost = {
        r["group_name"]: int(r["n"])
        for r in at_version(warehouse.read("lost_partitions"), target)
        .groupBy("group_name")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    conflicts = {
        (r["group_name"], r["action"]): int(r["n"])
        for r in at_version(warehouse.read("counter_conflicts"), target)
        .groupBy("group_name", "action")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    return ReportData(
        version=target,
        previous_version=previous,
        exchange=exchange,
        before=before,
        after=after,
        bytes_sent=sent,
        bytes_received=received,
        schedule=schedule,
        lost_by_group=lost,
        conflicts_by_group=conflicts,
        what_if=_what_if_rows(warehouse, target),
        explained=tuple(
            (f"{g} partition {p}", tuple(describe(explain(warehouse, settings or Settings(), g, p, target))))
            for g, p in _worst_partitions(warehouse, target)
        ),
    )


def _what_if_rows(warehouse: Warehouse, version: tuple[int, int]) -> tuple[Mapping[str, Any], ...]:
    """The newest what-if run against ``version``, ranked worst first."""
    if not warehouse.exists("what_if"):  # a warehouse made before what-if existed
        return ()
    rows = warehouse.read_arrow("what_if", where={"base_major": version[0], "base_minor": version[1]})
    if rows.num_rows == 0:
        return ()
    newest = max(zip(rows.column("created_at").to_pylist(), rows.column("run_id").to_pylist(), strict=True))[1]
    return tuple(ranked(rows.filter(pc.equal(rows.column("run_id"), newest))).to_pylist())


def _worst_partitions(warehouse: Warehouse, version: tuple[int, int]) -> list[tuple[str, int]]:
    """Lost partitions first, then the partitions of the plan's last-ending steps; at most :data:`EXPLAINED`."""
    where = {"topology_major": version[0], "topology_minor": version[1]}
    lost = warehouse.read_arrow("lost_partitions", where=where)
    worst = sorted(zip(lost.column("group_name").to_pylist(), lost.column("partition_id").to_pylist(), strict=True))
    plan = warehouse.read_arrow("migration_plan", where=where)
    if plan.num_rows:
        plan = plan.sort_by([("est_end_s", "descending"), ("group_name", "ascending"), ("partition_id", "ascending")])
        worst += zip(plan.column("group_name").to_pylist(), plan.column("partition_id").to_pylist(), strict=True)
    return list(dict.fromkeys(worst))[:EXPLAINED]


# ---- plots (pure) ----
def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _width_for(n: int) -> float:
    return min(max(7.0, 1.2 + 0.55 * n), 24.0)


def _label_nodes(ax: Axes, names: list[str], positions: Iterable[float]) -> None:
    ax.set_xticks(list(positions))
    ax.set_xticklabels(names, rotation=0 if len(names) <= 12 else 60, ha="center" if len(names) <= 12 else "right")


def _say_none(fig: Figure, ax: Axes, text: str) -> Figure:
    fig.set_figheight(2.2)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=13, color="#555555", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def _style_bars(ax: Axes, counts: bool = True) -> None:
    if counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.margins(y=0.12)


def _legend_below(fig: Figure, ax: Axes, extra: Iterable[Artist] = ()) -> None:
    """The legend under the plot, where it never hides a bar."""
    handles: list[Artist] = [*ax.get_legend_handles_labels()[0], *extra]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9, frameon=False)


def _number_format(largest: float) -> str:
    return "{:,.2f}" if largest < 10 else "{:,.1f}" if largest < 100 else "{:,.0f}"


def _seconds(value: float, scale: float) -> str:
    """``value`` with as many decimals as the scale of its chart needs (0.88 s, 42.5 s, 180 s)."""
    return _number_format(scale).format(value)


def plot_node_load(data: ReportData) -> Figure:
    """Replicas (top) and primaries (bottom) per node, before and after the plan: grouped bars.

    Every node either assignment mentions has a slot; a node that failed shows only its *before* bars.
    """
    nodes = sorted(set(data.before) | set(data.after), key=_natural_key)
    fig = _figure(_width_for(len(nodes)), 6.5)
    fig.suptitle(f"Replicas and primaries per node, version {data.version_text}", fontsize=13)
    if not nodes:
        return _say_none(fig, fig.subplots(), "none: the version assigns no partition")
    top, bottom = fig.subplots(2, 1, sharex=True)
    before_label = (
        f"before: version {_version_text(data.previous_version)}, serving (affinity_assignment)"
        if data.previous_version
        else "before: none (first version)"
    )
    after_label = f"after: version {data.version_text}, ideal (ideal_assignment)"
    x = list(range(len(nodes)))
    w = 0.4
    for ax, metric, ylabel in ((top, "replicas", "replicas (copies)"), (bottom, "primaries", "primaries")):
        for offset, loads, color, label in ((-w / 2, data.before, BEFORE_COLOR, before_label),
                                            (w / 2, data.after, AFTER_COLOR, after_label)):
            values = [getattr(loads.get(n), metric, 0) for n in nodes]
            bars = ax.bar([i + offset for i in x], values, w, color=color, label=label)
            if len(nodes) <= 16:
                ax.bar_label(bars, labels=[f"{v:,}" if v else "" for v in values], fontsize=8, padding=1)
        ax.set_ylabel(ylabel)
        _style_bars(ax)
    _legend_below(fig, top)
    _label_nodes(bottom, nodes, x)
    bottom.set_xlabel("node")
    return fig


def _byte_unit(largest: int) -> tuple[str, float]:
    for name, size in (("TiB", 2.0**40), ("GiB", 2.0**30)):
        if largest >= size:
            return name, size
    return "MiB", 2.0**20


def plot_bytes_moved(data: ReportData) -> Figure:
    """Bytes each node sends and receives in the plan's COPY steps: grouped bars (GiB, or MiB/TiB by size).

    Every node of the ideal assignment has a slot, and so has any other node that sends (a node leaving gracefully).
    """
    nodes = sorted(set(data.after) | set(data.bytes_sent) | set(data.bytes_received), key=_natural_key)
    fig = _figure(_width_for(len(nodes)), 4.5)
    fig.suptitle(f"Bytes moved per node, version {data.version_text}", fontsize=13)
    ax = fig.subplots()
    sent = [data.bytes_sent.get(n, 0) for n in nodes]
    received = [data.bytes_received.get(n, 0) for n in nodes]
    if not any(sent) and not any(received):
        return _say_none(fig, ax, "none: the plan copies no data")
    unit, size = _byte_unit(max(sent + received))
    number = _number_format(max(sent + received) / size)
    x = list(range(len(nodes)))
    w = 0.4
    for offset, values, color, label in ((-w / 2, sent, SENT_COLOR, "sent (COPY source)"),
                                         (w / 2, received, RECEIVED_COLOR, "received (COPY target)")):
        scaled = [v / size for v in values]
        bars = ax.bar([i + offset for i in x], scaled, w, color=color, label=label)
        if len(nodes) <= 16:
            ax.bar_label(bars, labels=[number.format(v) if v else "" for v in scaled], fontsize=8, padding=1)
    ax.set_ylabel(f"bytes ({unit})")
    ax.set_xlabel("node")
    _label_nodes(ax, nodes, x)
    _style_bars(ax, counts=False)
    _legend_below(fig, ax)
    return fig


def plot_schedule(data: ReportData) -> Figure:
    """The plan as a Gantt chart: a row per node, a lane per action, one ``broken_barh`` per (node, action).

    Rows are the nodes of the ideal assignment (an idle node shows as an empty row) and any node a step touches.
    Bars are half transparent, so steps that run at once on a node show as a darker color.
    """
    nodes = sorted(set(data.after) | {bar.node for bar in data.schedule.bars}, key=_natural_key)
    height = min(max(3.0, 1.4 + 0.4 * len(nodes)), 30.0)
    fig = _figure(12.0, height)
    fig.suptitle(f"Migration schedule, version {data.version_text}: {data.schedule.steps:,} steps", fontsize=13)
    ax = fig.subplots()
    if not data.schedule.bars:
        return _say_none(fig, ax, "none: the plan has no steps")
    present = {bar.action for bar in data.schedule.bars}
    lanes = [a for a in ACTIONS if a in present] + sorted(present - set(ACTIONS))
    lane = 0.8 / len(lanes)
    row = {n: i for i, n in enumerate(nodes)}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for bar in data.schedule.bars:
        spans.setdefault((bar.node, bar.action), []).append((bar.start_s, max(bar.end_s - bar.start_s, 0.0)))
    alpha = 1.0 if data.schedule.merged else 0.45
    for (node, action), xranges in sorted(spans.items()):
        y = row[node] - 0.4 + lanes.index(action) * lane
        ax.broken_barh(xranges, (y, lane), facecolors=ACTION_COLORS.get(action, "#7f7f7f"), alpha=alpha,
                       linewidth=0)
    makespan = data.exchange.makespan_s
    bound = data.exchange.makespan_lower_bound_s
    ax.axvline(makespan, color="black", linewidth=1.4)
    ax.axvline(bound, color=BOUND_COLOR, linewidth=1.6, linestyle=(0, (4, 3)), zorder=3)
    ax.set_yticks(range(len(nodes)))
    every = max(1, -(-len(nodes) // 60))
    ax.set_yticklabels([n if i % every == 0 else "" for i, n in enumerate(nodes)])
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlim(0, max([makespan, bound] + [b.end_s for b in data.schedule.bars]) * 1.03 or 1.0)
    ax.set_xlabel("time since the plan starts (s)")
    ax.set_ylabel("node")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    handles: list[Artist] = [Patch(color=ACTION_COLORS.get(a, "#7f7f7f"), label=a) for a in lanes]
    handles += [
        Line2D([], [], color="black", linewidth=1.4, label=f"makespan {_seconds(makespan, makespan)} s"),
        Line2D([], [], color=BOUND_COLOR, linewidth=1.6, linestyle=(0, (4, 3)),
               label=f"lower bound {_seconds(bound, makespan)} s"),
    ]
    title = "merged runs of steps" if data.schedule.merged else "darker: steps at once"
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False,
              title=title, title_fontsize=9, alignment="left")
    return fig


def plot_losses(data: ReportData) -> Figure:
    """Lost partitions and counter conflicts (stacked by action) per group: grouped bars, or "none"."""
    groups = data.groups()
    fig = _figure(_width_for(2 * len(groups)), 4.5)
    fig.suptitle(f"Lost partitions and counter conflicts by group, version {data.version_text}", fontsize=13)
    ax = fig.subplots()
    if not groups:
        return _say_none(fig, ax, "none: no lost partitions and no counter conflicts")
    x = list(range(len(groups)))
    w = 0.4
    lost = [data.lost_by_group.get(g, 0) for g in groups]
    bars = ax.bar([i - w / 2 for i in x], lost, w, color=LOST_COLOR, label="lost partitions")
    ax.bar_label(bars, labels=[f"{v:,}" if v else "" for v in lost], fontsize=8, padding=1)
    bottom = [0] * len(groups)
    for action in sorted({a for _, a in data.conflicts_by_group}):
        counts = [data.conflicts_by_group.get((g, action), 0) for g in groups]
        bars = ax.bar([i + w / 2 for i in x], counts, w, bottom=bottom, color=CONFLICT_COLORS.get(action, "#7f7f7f"),
               label=f"counter conflicts: {action}")
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    if any(bottom):
        ax.bar_label(bars, labels=[f"{v:,}" if v else "" for v in bottom], fontsize=8, padding=1)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=0 if len(groups) <= 8 else 45, ha="center" if len(groups) <= 8 else "right")
    ax.set_xlabel("cache group")
    ax.set_ylabel("partitions (lost) / copies (conflicts)")
    _style_bars(ax)
    none = [] if data.conflicts_by_group else [Patch(facecolor="white", edgecolor="#999999",
                                                      label="counter conflicts: none")]
    _legend_below(fig, ax, none)
    return fig


# ---- captions and the page ----
def _caption_nodes(data: ReportData) -> str:
    before = (
        f"the serving assignment of version {_version_text(data.previous_version)}"
        if data.previous_version
        else "nothing (this is the first version)"
    )
    return (
        f"Replicas and primaries each node holds before the plan ({before}) and after it (the ideal assignment "
        f"of version {data.version_text})."
    )


def _caption_bytes(data: ReportData) -> str:
    total = data.exchange.bytes_to_move / 2**30
    return f"Bytes each node sends and receives in the plan's COPY steps, {total:,.2f} GiB in all."


def _caption_schedule(data: ReportData) -> str:
    s, e = data.schedule, data.exchange
    drawn = (
        f"the plan's {s.steps:,} steps are more than {MAX_GANTT_STEPS:,}, so steps of one action on a node that "
        f"overlap or lie closer than {s.merge_gap_s:.3g} s are aggregated into {len(s.bars):,} bars (nothing is "
        "sampled away)"
        if s.merged
        else f"each of the plan's {s.steps:,} steps is drawn on every node it touches, half transparent, so a "
        "darker bar means more steps at once"
    )
    return (
        f"The migration schedule per node, with COPY, PROMOTE and DROP in their own lanes and the makespan "
        f"({_seconds(e.makespan_s, e.makespan_s)} s) against its lower bound "
        f"({_seconds(e.makespan_lower_bound_s, e.makespan_s)} s); "
        f"{drawn}."
    )


def _caption_losses(data: ReportData) -> str:
    lost = sum(data.lost_by_group.values())
    conflicts = sum(data.conflicts_by_group.values())
    return f"Lost partitions ({lost:,}) and counter conflicts ({conflicts:,}) per cache group at this version."


CHARTS: tuple[tuple[str, str, Callable[[ReportData], Figure], Callable[[ReportData], str]], ...] = (
    ("nodes", "Replicas and primaries per node", plot_node_load, _caption_nodes),
    ("bytes", "Bytes moved per node", plot_bytes_moved, _caption_bytes),
    ("schedule", "Migration schedule", plot_schedule, _caption_schedule),
    ("losses", "Lost partitions and counter conflicts", plot_losses, _caption_losses),
)
"""(file stem, heading, plot, caption) of each chart, in page order."""


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def summary_rows(data: ReportData) -> list[tuple[str, str]]:
    """The summary table of the page: (label, value) from the version's ``exchanges`` row."""
    e = data.exchange
    return [
        ("version", data.version_text),
        ("exchange type", e.exchange_type),
        ("exchange id", f"{e.exchange_id}"),
        ("previous version", _version_text(data.previous_version) if data.previous_version else "none"),
        ("alive servers", f"{e.alive_servers:,}"),
        ("partitions", f"{e.partitions:,}"),
        ("lost partitions", f"{e.lost_partitions:,}"),
        ("counter conflicts", f"{e.counter_conflicts:,}"),
        ("moving copies", f"{e.moving_copies:,}"),
        ("temporary primaries", f"{e.temporary_primaries:,}"),
        ("migrations (steps)", f"{e.migrations:,}"),
        ("bytes to move", f"{e.bytes_to_move / 2**30:,.2f} GiB ({e.bytes_to_move:,} B)"),
        ("makespan", f"{_seconds(e.makespan_s, e.makespan_s)} s"),
        ("makespan lower bound", f"{_seconds(e.makespan_lower_bound_s, e.makespan_s)} s"),
    ]


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { text-align: left; padding: 0.25em 1em 0.25em 0; border-bottom: 1px solid #ddd; }
td.value { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0 0 2.5em 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; margin-top: 0.4em; }
"""


def render_html(data: ReportData, images: list[tuple[str, bytes, str]]) -> str:
    """The self-contained page: title, summary table, and ``(heading, png, caption)`` images inlined as base64."""
    title = f"rebalancer report: version {data.version_text} ({data.exchange.exchange_type})"
    rows = "\n".join(
        f"<tr><th>{html.escape(label)}</th><td class=\"value\">{html.escape(value)}</td></tr>"
        for label, value in summary_rows(data)
    )
    figures = "\n".join(
        f"<h2>{html.escape(heading)}</h2>\n<figure>\n"
        f"<img alt=\"{html.escape(heading)}\" src=\"data:image/png;base64,{base64.b64encode(png).decode('ascii')}\">\n"
        f"<figcaption>{html.escape(caption)}</figcaption>\n</figure>"
        for heading, png, caption in images
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<table>\n{rows}\n</table>\n{figures}\n{_what_if_html(data)}\n"
        f"{_explained_html(data)}\n</body>\n</html>\n"
    )


WHAT_IF_SHOWN = 15
"""Scenarios the page lists, worst first (the what_if table holds all of them)."""


def _what_if_html(data: ReportData) -> str:
    if not data.what_if:
        return ("<h2>What if</h2>\n<p>No what-if run against this version yet: <code>rebalancer what-if --sweep "
                "nodes --sweep zone</code> adds one.</p>")
    columns = ("scenario", "lost", "without backup", "copies", "GiB to move", "makespan s", "bound s",
               "max replicas/node")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "\n".join(
        "<tr>" + f"<td>{html.escape(r['scenario'])}</td>" + "".join(
            f"<td class=\"value\">{html.escape(v)}</td>" for v in (
                f"{r['lost_partitions']:,}", f"{r['partitions_without_backup']:,}", f"{r['copies']:,}",
                f"{r['bytes_to_move'] / 2**30:,.1f}", f"{r['makespan_s']:,.1f}", f"{r['makespan_lower_bound_s']:,.1f}",
                f"{r['max_replicas_per_node']:,}")) + "</tr>"
        for r in data.what_if[:WHAT_IF_SHOWN]
    )
    first = data.what_if[0]
    caption = (f"{len(data.what_if)} scenarios of what-if run {first['run_id']} against this version, worst first "
               f"(most lost partitions, then most left without a backup, most bytes, longest makespan)"
               + (f"; the first {WHAT_IF_SHOWN} shown" if len(data.what_if) > WHAT_IF_SHOWN else "") + ".")
    return (f"<h2>What if</h2>\n<p>{html.escape(caption)}</p>\n<table>\n<tr>{head}</tr>\n{body}\n</table>")


def _explained_html(data: ReportData) -> str:
    if not data.explained:
        return "<h2>Explain</h2>\n<p>No partition is lost or has a plan step at this version.</p>"
    parts = [f"<h3>{html.escape(title)}</h3>\n<pre>{html.escape(chr(10).join(lines))}</pre>"
             for title, lines in data.explained]
    return ("<h2>Explain: the worst partitions</h2>\n<p>Lost partitions first, then those of the plan's last "
            "steps (<code>rebalancer explain --group G --partition P</code>).</p>\n" + "\n".join(parts))


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Write ``nodes.png``, ``bytes.png``, ``schedule.png``, ``losses.png`` and ``report.html`` into ``out_dir``.

    Returns:
        The path of ``report.html``, which needs no other file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    images = []
    for stem, heading, plot, caption in CHARTS:
        png = _png(plot(data))
        (out_dir / f"{stem}.png").write_bytes(png)
        images.append((heading, png, caption(data)))
    page = out_dir / "report.html"
    page.write_text(render_html(data, images), encoding="utf-8")
    return page
