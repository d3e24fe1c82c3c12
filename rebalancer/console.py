"""What people read: every line the CLI, the jobs and the demo print, in one place.

The engine returns data (summaries, twin rounds, stability); this module turns it into text with ``rich``. A
spinner shows while a long step runs, only when the output is a terminal.
"""

from __future__ import annotations

import csv
import datetime as dt
import enum
import io
import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = [
    "RowFormat",
    "console",
    "err_console",
    "print_balance",
    "print_collect",
    "print_execute",
    "print_ignite_collect",
    "print_kafka_round",
    "print_round",
    "print_rows",
    "print_stability",
    "print_summary",
    "print_what_if",
    "step",
]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def step(label: str) -> Iterator[None]:
    """Show a spinner while a long step runs, then its duration.

    On a terminal the spinner follows the engine's progress: the latest INFO line of the ``rebalancer`` loggers
    (the stage running, its Spark tasks done). Not on a terminal (a pipe, a log file, CI) nothing but the final
    duration line is printed.
    """
    start = time.perf_counter()
    with err_console.status(f"{label}...") as status:
        handler = _SpinnerLines(status, label) if err_console.is_terminal else None
        engine = logging.getLogger("rebalancer")
        level = engine.level
        if handler is not None:
            engine.addHandler(handler)
            if not engine.isEnabledFor(logging.INFO):
                engine.setLevel(logging.INFO)
        try:
            yield
        finally:
            if handler is not None:
                engine.removeHandler(handler)
                engine.setLevel(level)
    err_console.print(f"[dim]{label}: {time.perf_counter() - start:.1f} s[/dim]")


class _SpinnerLines(logging.Handler):
    """Shows each INFO line of the engine in the spinner (replacing the previous one)."""

    def __init__(self, status: Any, label: str) -> None:
        super().__init__(logging.INFO)
        self._status, self._label = status, label

    def emit(self, record: logging.LogRecord) -> None:
        self._status.update(f"{self._label}: {record.getMessage()}")


def print_summary(s: Any) -> None:
    """Print one exchange summary in a few readable lines."""
    events = ", ".join(str(e) for e in s.merged_event_seqs) or "-"
    console.print(
        f"[bold]exchange {s.exchange_id}[/bold] -> version {s.topology_major}.{s.topology_minor} "
        f"({s.exchange_type}; events {events}; coordinator {s.coordinator or '-'})"
    )
    console.print(f"  nodes: {s.alive_servers} servers, {s.alive_clients} clients; partitions: {s.partitions:,}")
    console.print(
        f"  lost: {s.lost_partitions:,}; moving copies: {s.moving_copies:,}; "
        f"temporary primaries: {s.temporary_primaries:,}; counter conflicts: {s.counter_conflicts:,}"
    )
    console.print(
        f"  plan: {s.migrations:,} steps, {s.bytes_to_move / 2**30:,.2f} GiB to move; "
        f"makespan {s.makespan_s:,.1f} s (lower bound {s.makespan_lower_bound_s:,.1f} s)"
    )
    if s.stage_seconds:
        stages = ", ".join(f"{name} {seconds:.1f}" for name, seconds in s.stage_seconds.items())
        jobs = "" if s.spark_jobs is None else f"; {s.spark_jobs} Spark jobs"
        console.print(f"  seconds by stage: {stages}{jobs}")


def print_round(r: Any) -> None:
    """Print what one twin round did."""
    console.print(
        f"[bold]twin round[/bold] on version {r.version[0]}.{r.version[1]}: {r.copies:,} copies and "
        f"{r.drops:,} drops finished; {r.waiting_promotions:,} promotions left to the switch"
        + (f"; {r.failed_node} failed" if r.failed_node else "")
    )
    for summary in r.exchanges:
        print_summary(summary)


def print_stability(status: Any) -> None:
    """Print whether the cluster is stable, and what is left when it is not."""
    if status is None:
        return
    if status.stable:
        console.print(f"stable at version {status.version[0]}.{status.version[1]}: the serving assignment is the "
                      "ideal one, every ideal copy owns and no surplus copy is left")
    else:
        console.print(
            f"not stable at version {status.version[0]}.{status.version[1]}: "
            f"{status.assignment_differences:,} assignment rows differ from ideal, "
            f"{status.ideal_not_owning:,} ideal copies not owning, {status.surplus_copies:,} surplus copies, "
            f"{status.lost_partitions:,} lost partitions"
            + (" (run `event RESET_LOST_PARTITIONS --group G` to recover them)" if status.lost_partitions else "")
        )


def print_balance(report: Any, top: int) -> None:
    """Print a ``rebalancer.balance.BalanceReport``: the most and least loaded nodes, the ratios, the alternative."""
    nodes = report.nodes
    shown = nodes if len(nodes) <= 2 * top else nodes[:top] + nodes[-max(1, top // 2):]
    table = Table(show_header=True, header_style="bold", box=None, title_justify="left",
                  title=f"version {report.version[0]}.{report.version[1]}: {len(nodes)} servers, most loaded first "
                  "(ratio = count / capacity-weighted share)")
    for name in ("node", "capacity", "replicas", "ratio", "primaries", "ratio", "GiB", "ratio"):
        table.add_column(name, justify="left" if name == "node" else "right", no_wrap=True)
    for i, n in enumerate(shown):
        if len(shown) < len(nodes) and i == top:
            table.add_row("...", *[""] * 7)
        table.add_row(n.node_id, f"{n.capacity:g}", f"{n.replicas:,}", f"{n.replica_ratio:.3f}", f"{n.primaries:,}",
                      f"{n.primary_ratio:.3f}", f"{n.bytes / 2**30:,.1f}", f"{n.bytes_ratio:.3f}")
    console.print(table)
    console.print(f"most loaded / share: replicas {report.replica_ratio:.3f}, primaries {report.primary_ratio:.3f}, "
                  f"bytes {report.bytes_ratio:.3f}; servers with no replica: {report.idle_servers}")
    console.print(f"the balanced affinity would place {report.balanced_copies:,} copies elsewhere and reach "
                  f"replicas {report.balanced_replica_ratio:.3f}, primaries {report.balanced_primary_ratio:.3f}")


class RowFormat(enum.StrEnum):
    """How ``rebalancer sql`` prints rows on stdout (``route`` draws a table)."""

    TABLE = "table"  # drawn for a terminal; plain and never cut when stdout is a pipe or a file
    CSV = "csv"  # RFC 4180, a header row first; nested values as JSON
    JSON = "json"  # JSON Lines: one object per row, keys in column order


def print_rows(columns: list[str], rows: list[tuple[Any, ...]], limit: int,
               row_format: RowFormat = RowFormat.TABLE) -> None:
    """Print at most ``limit`` of ``rows`` in ``row_format``, then how many were shown.

    For csv and json the count goes to stderr, so that stdout is the data alone. Timestamps and dates are ISO 8601;
    structs, maps and arrays are JSON objects and arrays in json and csv; a null is empty in csv, ``null`` in json
    and ``NULL`` in a table.
    """
    shown = rows[:limit]
    count = f"{len(shown)} row(s)" + (" (more not shown; --limit N)" if len(rows) > limit else "")
    if row_format is RowFormat.TABLE:
        _print_table(columns, shown)
        console.print(count)
        return
    out = io.StringIO()
    if row_format is RowFormat.CSV:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_csv_cell(v) for v in row] for row in shown)
    else:
        for row in shown:
            out.write(json.dumps({c: _plain(v) for c, v in zip(columns, row, strict=True)}, ensure_ascii=False))
            out.write("\n")
    sys.stdout.write(out.getvalue())
    sys.stdout.flush()
    err_console.print(f"[dim]{count}[/dim]")


def _print_table(columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    table = Table(show_header=True, header_style="bold", box=None if not console.is_terminal else box.SQUARE)
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*[Text("NULL" if v is None else str(v)) for v in row])  # cells are data, never markup
    if console.is_terminal:
        console.print(table)
        return
    # Off a terminal the table is as wide as its widest row (rich would fit it to 80 columns and cut every cell):
    # a log or a script reads every cell whole.
    width = Measurement.get(console, console.options.update_width(10**6), table).maximum
    Console(file=console.file, width=width, highlight=False, soft_wrap=True).print(table)


def _plain(value: Any) -> Any:
    """A value as JSON holds it: structs as objects (field order kept), timestamps as ISO 8601 text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # NaN and infinities are not JSON numbers
    if hasattr(value, "asDict"):  # a Spark Row: a struct
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)  # Decimal, bytes and the rest: their text, exactly


def _csv_cell(value: Any) -> Any:
    plain = _plain(value)
    if plain is None:
        return ""
    if isinstance(plain, dict | list):
        return json.dumps(plain, ensure_ascii=False)
    return plain


def print_what_if(run: Any, top: int) -> None:
    """Print a ``rebalancer.what_if.WhatIfRun``: its scenarios worst first, then where the rows are."""
    rows = run.rows.to_pylist()
    table = Table(show_header=True, header_style="bold", box=None, title_justify="left",
                  title=f"what if, against version {run.base[0]}.{run.base[1]}: {len(rows)} scenarios, worst first")
    for name in ("lost", "no backup", "copies", "GiB", "makespan s", "bound s", "max/node", "mean/node"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("scenario", min_width=24, overflow="fold")  # last: it wraps, the figures never do
    for r in rows[:top]:
        table.add_row(f"{r['lost_partitions']:,}", f"{r['partitions_without_backup']:,}", f"{r['copies']:,}",
                      f"{r['bytes_to_move'] / 2**30:,.1f}", f"{r['makespan_s']:,.1f}",
                      f"{r['makespan_lower_bound_s']:,.1f}", f"{r['max_replicas_per_node']:,}",
                      f"{r['mean_replicas_per_node']:,.1f}", r["scenario"])
    console.print(table)
    more = f" ({len(rows) - top} more not shown; --top N)" if len(rows) > top else ""
    jobs = "" if run.spark_jobs is None else f", {run.spark_jobs} Spark jobs"
    console.print(f"{min(len(rows), top)} of {len(rows)} scenarios shown{more}; {run.seconds:.1f} s{jobs}; nothing "
                  f"committed. All rows: rebalancer sql \"SELECT * FROM what_if WHERE run_id = '{run.run_id}'\"")


def _appended(result: Any) -> str:
    """What a collect appended, per table, or that it appended nothing."""
    return ", ".join(f"{n} {name}" for name, n in result.appended.items() if n) or "nothing (unchanged)"


def print_collect(result: Any) -> None:
    """One line per collect of a live cluster: what it saw and what it appended."""
    appended = _appended(result)
    console.print(f"cluster {result.cluster_id}: {result.brokers} brokers, {result.topics} topics, "
                  f"{result.partitions} partitions; appended {appended}")


def print_ignite_collect(result: Any) -> None:
    """One line per collect of a live Ignite cluster, then one per group it skipped and why."""
    appended = _appended(result)
    console.print(f"{result.cluster_id}: {result.servers} servers, {result.clients} clients, {result.groups} cache "
                  f"groups, {result.partitions} partitions; appended {appended}", markup=False)
    for why in result.skipped.values():
        console.print(f"skipped: {why}", markup=False)
    for c in result.conflicts:
        counters = ", ".join(f"{node} {counter}" for node, counter in c.counters.items())
        console.print(f"update counter conflict: {c.group} partition {c.partition}: {counters}", markup=False)


def print_execute(result: Any, collects: int) -> None:
    """What an execution of a plan on a live cluster did."""
    console.print(f"moves: {result.submitted} submitted, {result.resumed} resumed in flight, {result.already_done} "
                  f"already done, {result.finished} finished in {result.seconds:.1f} s; at most "
                  f"{result.max_in_flight_per_broker} in flight on one broker; progress collected {collects} times")


def print_kafka_round(r: Any) -> None:
    """One round of collect -> exchange -> execute."""
    print_collect(r.collected)
    for s in r.exchanges:
        print_summary(s)
    if r.executed is not None:
        print_execute(r.executed, r.collects_during)
    console.print("stable: nothing left to move" if r.stable else f"{len(r.planned.moves)} moves planned")
