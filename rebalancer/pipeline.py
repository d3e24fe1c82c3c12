"""One ``rebalancer exchange`` run, composed of its stages in the order they run.

1. **inputs** (:func:`rebalancer.inputs.read_run`): the newest committed version, what the input tables gained
   since (validated once, rejected rows recorded once), and the exchanges the pending events make; with none, a
   ``LATE_AFFINITY_SWITCH`` committed when the partitions waiting for it are ready.
2. **previous** (:mod:`rebalancer.stages.previous`): each exchange's committed predecessor, read once, handed down.
3. **placement** (:mod:`rebalancer.stages.placement`) and **scope** (:mod:`rebalancer.stages.scope`): the
   placements decided on the driver, and which partitions can change; the rest are carried over unchanged.
4. **kernel** (:mod:`rebalancer.exchange.kernel`): every per-partition decision, over the rows assembled once by
   :func:`rebalancer.stages.rows.kernel_input`, as Arrow on the driver or in one Spark pass.
5. **plan** (:mod:`rebalancer.planning`): suppliers, bytes and ids over the whole plan, then its schedule.
6. **commit** (:mod:`rebalancer.stages.commit`): every versioned table, the stamps, then the ``exchanges`` row.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange.events import ExchangeStep, TopologyState
from rebalancer.exchange.kernel import DECISION_SCHEMAS
from rebalancer.groups import GroupSettings
from rebalancer.inputs import Committed, Run, cluster_columns, read_run, record_rejections
from rebalancer.planning.plan import finish_plan, schedule_plan
from rebalancer.stages.commit import ExchangeConflictError, commit_exchange_row, plan_figures, write_version
from rebalancer.stages.meter import STAGES, Meter
from rebalancer.stages.placement import kernel_context, place
from rebalancer.stages.previous import Previous
from rebalancer.stages.rows import LARGE_TABLES, SMALL_KINDS, kernel_input, rows_for
from rebalancer.stages.scope import Scope, ScopeFacts, decide_scope
from rebalancer.storage import Warehouse
from rebalancer.tables import OUTPUT_TABLES
from rebalancer.vocabulary import NONE

__all__ = ["STAGES", "VERSIONED_TABLES", "ExchangeConflictError", "ExchangeSummary", "Meter", "run_exchange"]

_log = logging.getLogger(__name__)

#: Tables that hold one complete copy per committed version (every output but ``exchanges``, ``rejected_rows``
#: and ``what_if``).
VERSIONED_TABLES = tuple(n for n in OUTPUT_TABLES if n not in ("exchanges", "rejected_rows", "what_if"))
#: The tables every exchange commits to, in the order it does (an engine prepares those commits while the exchange
#: computes its rows: ``Warehouse.commits_ahead``). Not the small ones, often empty and then not committed at all.
PREPARED_TABLES = ("topology", *LARGE_TABLES, "client_affinity", "partition_stamps", "exchanges")
#: The counts of an ``exchanges`` row a ``NONE`` exchange repeats from the previous version.
REPEATED = ("partitions", "lost_partitions", "moving_copies", "temporary_primaries", "counter_conflicts",
            "migrations", "bytes_to_move", "makespan_s", "makespan_lower_bound_s")


@dataclass(frozen=True)
class ExchangeSummary:
    """What one committed exchange did, for people (the CLI prints it), benchmarks and tests."""

    exchange_id: int
    topology_major: int
    topology_minor: int
    exchange_type: str
    merged_event_seqs: tuple[int, ...]
    coordinator: str | None
    alive_servers: int
    alive_clients: int
    partitions: int = 0
    lost_partitions: int = 0
    moving_copies: int = 0
    temporary_primaries: int = 0
    counter_conflicts: int = 0
    migrations: int = 0
    bytes_to_move: int = 0
    makespan_s: float = 0.0
    makespan_lower_bound_s: float = 0.0
    seconds: float = 0.0
    #: Wall seconds per stage (:data:`STAGES`); the first exchange of a run also carries the run's "inputs".
    stage_seconds: dict[str, float] = field(default_factory=dict, compare=False)
    #: Spark jobs the exchange started (the first of a run includes the inputs'); None on Spark Connect.
    spark_jobs: int | None = field(default=None, compare=False)
    #: Spark jobs per stage (same stages as ``stage_seconds``).
    stage_jobs: dict[str, int] = field(default_factory=dict, compare=False)
    #: Partitions recomputed by the kernel (the rest were carried over).
    recomputed_partitions: int = field(default=0, compare=False)


def run_exchange(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    fault_hook: Callable[[str], None] | None = None,
    *,
    carry_settled: bool = True,
) -> list[ExchangeSummary]:
    """Process every pending event and the newest reports; commit the resulting versions.

    Args:
        spark: the session.
        warehouse: where inputs are read and outputs written.
        settings: validation strictness, affinity, rebalance and migration settings.
        clock: the time source for ``started_at``/``finished_at`` (tests pin it).
        fault_hook: called with a point name after each write (tests inject crashes here).
        carry_settled: carry the settled partitions over (False recomputes every partition; tests compare).

    Returns:
        One summary per committed exchange, in commit order (empty when nothing was due).

    Raises:
        ExchangeConflictError: another run committed the same exchange first.
        InvalidInputError: strict validation found bad input rows.
        InputSchemaError: an input table misses a column or has one of an unusable type.
    """
    started = clock()
    meter = Meter(spark)
    run: Run | None = None
    try:
        with meter.stage("inputs"):
            run = read_run(spark, warehouse, settings)
        exchanges = _Exchanges(spark, warehouse, settings, run, clock, fault_hook or (lambda _point: None),
                               carry_settled)
        if run.switch is not None:
            summary = exchanges.one(run.switch, run.committed, meter, started, last=True, switch_check=True)
            return [summary] if summary is not None else []
        summaries: list[ExchangeSummary] = []
        prev = run.committed
        for i, step in enumerate(run.steps):
            with warehouse.commits_ahead(PREPARED_TABLES):
                summary = exchanges.one(step, prev, meter, started if i == 0 else clock(), last=i == len(run.steps) - 1)
            assert summary is not None
            summaries.append(summary)
            prev = exchanges.committed_after(step, summary, prev)
            meter = Meter(spark)
        return summaries
    finally:
        meter.close()
        if run is not None:
            run.release()


@dataclass
class _Exchanges:
    """The exchanges of one run, one after the other; what they share, and whether the new reports were consumed."""

    spark: SparkSession
    warehouse: Warehouse
    settings: Settings
    run: Run
    clock: Callable[[], datetime]
    hook: Callable[[str], None]
    carry: bool
    reports_consumed: bool = False
    max_report_seq: int | None = None

    def __post_init__(self) -> None:
        inputs = self.run.inputs
        self.node_rows = {r["node_id"]: r for r in inputs.nodes.to_pylist()}
        self.group_rows = {r["group_name"]: r for r in inputs.groups.to_pylist()}
        self.facts = ScopeFacts(self.node_rows, self.group_rows, inputs.nodes, inputs.groups, inputs.versions)

    def one(self, step: ExchangeStep, prev: Committed | None, meter: Meter, started: datetime, *, last: bool,
            switch_check: bool = False) -> ExchangeSummary | None:
        """Decide and commit ``step`` after ``prev``; a switch that is not due yet commits nothing (None)."""
        t0 = time.perf_counter()
        previous = Previous(self.warehouse, prev)
        repeat = step.exchange_type == NONE and prev is not None  # clients only: the previous version's decisions
        reports = self.run.reports if step.exchange_type != NONE and not self.reports_consumed else None
        before = prev.state.groups if prev else frozenset()
        groups = {g: GroupSettings.from_row(self.group_rows[g]) for g in sorted(step.groups)}
        sizes = {g: s.partitions for g, s in groups.items()}
        replicas = sum(s.partitions * (s.backups + 1) for s in groups.values())
        alive = NodeSet.from_rows([self.node_rows[n] for n, i in step.alive.items() if not i.is_client])
        with meter.stage("scope"):
            placements = None if repeat else place(step, previous, groups, alive, self.node_rows, self.settings,
                                                   self.warehouse)
            scope = Scope(everything=False) if placements is None else decide_scope(
                self.spark, step, previous, self.facts, groups, placements, alive, reports, self.settings, self.carry)
        rows = rows_for(self.spark, self.warehouse, previous, scope, sizes, replicas, reports)
        decided = None
        small = {name: DECISION_SCHEMAS[name].empty_table() for name in SMALL_KINDS}
        counts = {"switch_waiting_partitions": 0, "switch_unready_partitions": 0, "moving_copies": 0,
                  "temporary_primaries": 0, "max_report_seq": -1}
        try:
            if groups and not scope.empty and placements is not None:
                with meter.stage("kernel"):
                    ctx = kernel_context(alive, {n: i.node_order for n, i in step.alive.items()}, groups,
                                         frozenset(g for g in groups if g in step.new_groups or g not in before),
                                         frozenset(step.reset_groups) & frozenset(groups), placements, self.settings)
                    decided = rows.decide(kernel_input(rows, reports), ctx)
                    small, counts = decided.small, decided.counts
            if switch_check and not (counts["switch_waiting_partitions"] > 0
                                     and counts["switch_unready_partitions"] == 0):
                return None
            if reports is not None:
                self.reports_consumed = True
                newest = max(counts["max_report_seq"], (prev.max_report_seq if prev else None) or -1)
                self.max_report_seq = newest if newest >= 0 else None
                if switch_check:  # read_run left these for the switch to record when it commits
                    record_rejections(self.warehouse, reports.rejected)
            steps = small["steps"] if step.cluster.active else small["steps"].slice(0, 0)  # inactive: no moves
            with meter.stage("plan"):
                plan, bound = schedule_plan(finish_plan(steps, self.settings.migration), self.settings.migration)
            write_version(rows, decided, small, step, plan, list(groups.values()), replicas,
                          meter, self.hook)
        finally:
            rows.release(decided)
        figures: dict[str, Any] = {
            "partitions": sum(sizes.values()), "lost_partitions": small["lost_partitions"].num_rows,
            "counter_conflicts": small["counter_conflicts"].num_rows, "moving_copies": counts["moving_copies"],
            "temporary_primaries": counts["temporary_primaries"], **plan_figures(plan, bound)}
        if repeat:
            assert prev is not None
            figures = {k: type(figures[k])(prev.row.get(k) or 0) for k in REPEATED}
        servers = sum(1 for i in step.alive.values() if not i.is_client)
        summary = ExchangeSummary(
            exchange_id=(prev.exchange_id if prev else 0) + 1, topology_major=step.major, topology_minor=step.minor,
            exchange_type=step.exchange_type, merged_event_seqs=step.merged_event_seqs, coordinator=step.coordinator,
            alive_servers=servers, alive_clients=len(step.alive) - servers, seconds=time.perf_counter() - t0,
            stage_seconds=dict(meter.seconds), stage_jobs=dict(meter.stage_jobs), spark_jobs=meter.jobs(),
            recomputed_partitions=scope.count(sizes), **figures)
        with meter.stage("commit"):
            commit_exchange_row(self.warehouse, self._row(summary, step, prev, started, last))
        self.hook("after:exchanges")
        _log.info("exchange %d committed version %d.%d (%s): %d steps, %d lost partitions, %.1f s",
                  summary.exchange_id, summary.topology_major, summary.topology_minor, summary.exchange_type,
                  summary.migrations, summary.lost_partitions, summary.seconds)
        # the summary also reports the commit stage, which its committed row cannot hold
        return dataclasses.replace(summary, stage_seconds=dict(meter.seconds), stage_jobs=dict(meter.stage_jobs),
                                   spark_jobs=meter.jobs())

    def committed_after(self, step: ExchangeStep, summary: ExchangeSummary, prev: Committed | None) -> Committed:
        """The version ``step`` committed, as the next exchange of the run starts from it."""
        merged = (prev.merged_event_seqs if prev else frozenset()) | frozenset(step.merged_event_seqs)
        return Committed(
            exchange_id=summary.exchange_id,
            state=TopologyState(step.major, step.minor, step.alive, step.groups, step.cluster),
            last_event_seq=max(merged, default=0),
            merged_event_seqs=merged,
            max_report_seq=self._max_report_seq(prev),
            input_versions=self._recorded_versions(prev, last=False),
            row={},
        )

    def _max_report_seq(self, prev: Committed | None) -> int | None:
        return self.max_report_seq if self.reports_consumed else (prev.max_report_seq if prev else None)

    def _recorded_versions(self, prev: Committed | None, last: bool) -> dict[str, int]:
        """What an exchange records as consumed (see docs/EXCHANGE.md, "Inputs read incrementally")."""
        before = dict(prev.input_versions) if prev else {}
        now = self.run.inputs.versions
        out = {"nodes": now["nodes"], "cache_groups": now["cache_groups"]}
        # Events: only the run's last exchange consumes them all (a crash in between re-reads the rest).
        for name, consumed in (("topology_events", last), ("partition_reports", self.reports_consumed)):
            if consumed:
                out[name] = now[name]
            elif name in before:
                out[name] = before[name]
        return out

    def _row(self, s: ExchangeSummary, step: ExchangeStep, prev: Committed | None, started: datetime,
             last: bool) -> dict[str, Any]:
        """The ``exchanges`` row of summary ``s``."""
        return {
            **{k: getattr(s, k) for k in ("exchange_id", "topology_major", "topology_minor", "exchange_type",
                                          "coordinator", "alive_servers", "alive_clients", *REPEATED)},
            "merged_event_seqs": list(s.merged_event_seqs), "max_report_seq": self._max_report_seq(prev),
            "started_at": started, "finished_at": self.clock(), "running_groups": sorted(step.groups),
            "input_versions": list(self._recorded_versions(prev, last).items()),
            "stage_seconds": list(s.stage_seconds.items()), "spark_jobs": s.spark_jobs,
            "stage_jobs": list(s.stage_jobs.items()) if s.spark_jobs is not None else None,
            **cluster_columns(step.cluster),
        }
