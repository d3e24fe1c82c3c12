"""One ``rebalancer exchange`` run, top to bottom: inputs -> kernel -> plan -> schedule -> commit.

1. **Inputs** (:mod:`rebalancer.inputs`): the newest committed version, and what the input tables gained since
   (validated; bad rows recorded once in ``rejected_rows``). Pending events become the exchanges to commit
   (:mod:`rebalancer.exchange.events`); with none pending, a ``LATE_AFFINITY_SWITCH`` is committed when the
   partitions waiting for it are ready.
2. **Which partitions can change** (:func:`_unsettled`): those the previous version left unstable (with plan
   steps, lost, or in conflict), those with new reports, those with a copy on a node that left, those whose ideal
   list gains a node that joined, and every partition of a group started, reset or changed. Every other partition
   is *settled*: its rows are carried over unchanged (docs/EXCHANGE.md, "Settled partitions", argues why that is
   what recomputing would give, and a property test checks it).
3. **Kernel** (:mod:`rebalancer.exchange.kernel`): one shuffle of the unsettled partitions' rows by partition, and
   every per-partition decision in NumPy (``mapInArrow``). Its output is cached: the small tables are collected
   once, the large ones written from it.
4. **Plan and schedule** (:mod:`rebalancer.planning.plan`, :mod:`rebalancer.planning.schedule`): suppliers,
   bytes and ids over the whole plan, then the cost model's schedule, on the driver (a plan is one row per step).
5. **Commit**: every output of the version (large tables through Spark, small ones as Arrow from the driver;
   independent commits, up to ``storage.concurrent_commits`` at once), then the ``exchanges`` row. A version
   without that row does not exist for readers; a re-run after a crash recomputes the same version from the same
   inputs and replaces the partial rows. Two runs racing for the same version: the second to commit its
   ``exchanges`` row fails with :class:`ExchangeConflictError`.

Nothing here decides anything about a partition; it wires the stages to storage and counts what happened.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from rebalancer.affinity.assign import assign_indexes
from rebalancer.affinity.balanced import BalancedGroup, PreviousPlacement, assign_balanced
from rebalancer.affinity.ideal import ideal_assignment, previous_placement
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange import routing
from rebalancer.exchange.batches import KINDS, OUTPUT_SCHEMA, SUMMARY, SUMMARY_COLUMNS, decide_stream
from rebalancer.exchange.events import (
    ClusterState,
    Event,
    ExchangeStep,
    NodeInfo,
    TopologyState,
    coordinator_of,
    placement_servers,
    plan_exchanges,
)
from rebalancer.exchange.kernel import (
    ASSIGNMENT,
    DECISION_SCHEMAS,
    INPUT_SCHEMA,
    LOST_ROW,
    MAP,
    PARTITION,
    REPORT,
    VERSION,
    GroupSettings,
    KernelContext,
)
from rebalancer.exchange.stamps import STAMPS_SCHEMA, stamps_of
from rebalancer.frames import parallelism
from rebalancer.inputs import (
    Committed,
    Inputs,
    Reports,
    cluster_columns,
    last_committed,
    read_inputs,
    record_rejections,
    validate_reports,
)
from rebalancer.planning.plan import finish_plan, schedule_plan
from rebalancer.storage import Warehouse
from rebalancer.storage.base import sql_literal
from rebalancer.tables import (
    EXCHANGES,
    OUTPUT_TABLES,
    REJECTED_ROWS,
    REPLICA_INDEX,
    TOPOLOGY,
    VERSION_COLUMNS,
    version_where,
)
from rebalancer.validation import Consumer, InvalidInputError
from rebalancer.vocabulary import (
    BALANCED,
    LATE_AFFINITY_SWITCH,
    MAX_PARTITIONS,
    MOVING,
    NONE,
    OWNING,
    PARTITION_KEY,
    REPLICATED,
)

__all__ = [
    "STAGES",
    "VERSIONED_TABLES",
    "ExchangeConflictError",
    "ExchangeSummary",
    "Hypothesis",
    "Hypothetical",
    "Meter",
    "run_exchange",
    "tagged",
]

_log = logging.getLogger(__name__)

#: Tables that hold one complete copy per committed version (every output but ``exchanges``, ``rejected_rows``
#: and ``what_if``).
VERSIONED_TABLES = tuple(n for n in OUTPUT_TABLES if n not in ("exchanges", "rejected_rows", "what_if"))
#: Versioned tables with one row per partition or copy: written from Spark. The others go through the driver.
# Which partitions a node's departure or arrival touches is found on the driver up to these sizes (copies of the
# carried groups read as Arrow; partitions x servers ranked by the client's affinity), beyond them by a Spark job.
DRIVER_COPIES = 1_000_000
DRIVER_RANKINGS = 5_000_000
KEYS_AS_LITERALS = 5_000  # see _Selection
#: Exchanges of clusters with at most this many replicas (partitions x copies over the running groups) are decided
#: on the driver when the warehouse reads Arrow there (``Warehouse.reads_on_driver``): the kernel over Arrow read
#: from the tables, the routing maps folded on the driver, every output written as Arrow. The same kernel, so the
#: same rows as the Spark path, without its Spark jobs (each a fixed few hundred milliseconds whatever its size):
#: at L (196,608 replicas, 2 cores) 0.8-1.7 s instead of 5-7.5 s (docs/PERFORMANCE.md). Larger clusters keep the one
#: pass in Spark, which spreads the kernel over the executors.
DRIVER_KERNEL_REPLICAS = 250_000
LARGE_TABLES = ("ideal_assignment", "affinity_assignment", "partition_map", "partition_versions")  # + client_affinity
#: The stages an exchange's wall time is split into (``ExchangeSummary.stage_seconds``), in the order they run.
STAGES = ("inputs", "unsettled", "kernel", "plan", "routing", "writes", "stamps", "commit")
_SMALL_KINDS = ("counter_conflicts", "lost_partitions", "steps")
#: The tables every exchange commits to, in the order it does (an engine prepares those commits while the exchange
#: computes its rows: ``Warehouse.commits_ahead``). Not the small kinds, often empty and then not committed at all.
PREPARED_TABLES = ("topology", *LARGE_TABLES, "client_affinity", "partition_stamps", "exchanges")


class ExchangeConflictError(RuntimeError):
    """Another exchange committed the same topology version first."""


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


# =====================================================================================================================
# Measuring: wall time per stage and Spark jobs
# =====================================================================================================================


class Meter:
    """Wall seconds per stage, and the Spark jobs started under one job group (classic sessions only); every job
    is described in the Spark UI as ``rebalancer <work>: <stage>``.

    Each stage is logged (logger ``rebalancer.pipeline``, INFO) when it starts and ends; while one runs and INFO
    is enabled, the progress of its Spark tasks is logged when it changes (the CLI shows these lines in its
    spinner on a terminal).
    """

    def __init__(self, spark: SparkSession, work: str = "exchange") -> None:
        self.seconds: dict[str, float] = {}
        self.stage_jobs: dict[str, int] = {}
        self._work = work
        self._group = f"rebalancer-{work}-{uuid.uuid4().hex[:12]}"
        try:
            self._sc: Any = spark.sparkContext
        except Exception:  # Spark Connect: no SparkContext, no job count
            self._sc = None
        if self._sc is not None:
            self._sc.setJobGroup(self._group, f"rebalancer {work}")

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        label = f"{self._work}: {name}"
        if self._sc is not None:
            self._sc.setJobDescription(f"rebalancer {label}")
        _log.info("%s", label)
        watch = _TaskProgress(self._sc, label) if self._sc is not None and _log.isEnabledFor(logging.INFO) else None
        t0 = time.perf_counter()
        jobs0 = self.jobs() or 0
        try:
            yield
        finally:
            if watch is not None:
                watch.stop()
            seconds = time.perf_counter() - t0
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            jobs = (self.jobs() or 0) - jobs0
            self.stage_jobs[name] = self.stage_jobs.get(name, 0) + jobs
            _log.info("%s done in %.1f s, %d Spark jobs", label, seconds, jobs)

    def jobs(self) -> int | None:
        if self._sc is None:
            return None
        return len(self._sc.statusTracker().getJobIdsForGroup(self._group))

    def close(self) -> None:
        if self._sc is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", None)
            self._sc.setJobDescription(None)


class _TaskProgress:
    """Logs the tasks done of the Spark stages running now, when that changes (a thread polling the status
    tracker twice a second until stopped)."""

    def __init__(self, sc: Any, label: str) -> None:
        self._sc, self._label = sc, label
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rebalancer-progress", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        last = None
        while not self._done.wait(0.5):
            try:
                tracker = self._sc.statusTracker()
                infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            except Exception:  # the session is stopping: nothing to show
                return
            infos = [i for i in infos if i is not None]
            if not infos:
                continue
            done = sum(i.numCompletedTasks for i in infos)
            total = sum(i.numTasks for i in infos)
            if (done, total) != last:
                last = (done, total)
                _log.info("%s: Spark tasks %d/%d", self._label, done, total)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


# =====================================================================================================================
# The run
# =====================================================================================================================


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
    hook = fault_hook or (lambda _point: None)
    run_started = clock()
    meter = Meter(spark)
    run: _Run | None = None
    try:
        with meter.stage("inputs"):
            warehouse.create_tables()
            committed = last_committed(warehouse)
            first_id = (committed.exchange_id if committed else 0) + 1
            inputs = read_inputs(spark, warehouse, settings, committed, first_id)
            state = committed.state if committed else TopologyState()
            steps, rejections = plan_exchanges(
                state, inputs.events, inputs.node_catalog, inputs.groups.column("group_name").to_pylist(),
                settings.baseline,
            )
            rejections = inputs.late + rejections
            if rejections and settings.validation.strict:
                raise InvalidInputError.of(
                    {"topology_events": len(rejections)}, {"topology_events": [r.reason for r in rejections]}
                )
            record_rejections(warehouse, pa.concat_tables([inputs.rejected, _event_rejections(rejections, first_id)]))
        run = _Run(spark, warehouse, settings, inputs, clock, hook, carry_settled)
        run.run_started = run_started
        summaries: list[ExchangeSummary] = []
        prev = committed
        if not steps and committed is not None:
            if not state.cluster.active:
                return []  # an inactive cluster moves no data: no late affinity switch either
            switch = ExchangeStep(
                state.major, state.minor + 1, LATE_AFFINITY_SWITCH, (), state.alive, state.groups,
                coordinator=coordinator_of(state.alive), cluster=state.cluster,
            )
            summary = run.exchange(switch, prev, meter, last=True, switch_check=True)
            return [summary] if summary is not None else []
        for i, step in enumerate(steps):
            with warehouse.commits_ahead(PREPARED_TABLES):
                summary = run.exchange(step, prev, meter, last=i == len(steps) - 1)
            assert summary is not None
            summaries.append(summary)
            prev = run.committed_after(step, summary, prev)
            meter = Meter(spark)
        return summaries
    finally:
        meter.close()
        if run is not None:
            run.release()


@dataclass(frozen=True)
class Hypothesis:
    """One exchange decided but not run (``rebalancer what-if``): what its kernel would be given.

    Attributes:
        step: the exchange the event set makes.
        groups: its running groups.
        context: the kernel's exchange-wide facts.
        everything: every partition is recomputed (else ``whole_groups`` and ``keys``).
        whole_groups: groups recomputed whole.
        keys: single partitions recomputed, ``(group_name, partition_id)``.
    """

    step: ExchangeStep
    groups: dict[str, GroupSettings]
    context: KernelContext
    everything: bool
    whole_groups: frozenset[str]
    keys: frozenset[tuple[str, int]]


class Hypothetical:
    """Exchanges decided but not run (``rebalancer what-if``): for an event set, the exchange it would make after
    the latest committed version and which partitions that exchange recomputes, exactly as :func:`run_exchange`
    would decide them; nothing is run or written.

    Only the committed state counts: pending events and reports in the input tables are not applied.

    Attributes:
        committed: the latest committed version.
        node_rows: the ``nodes`` rows by node id.

    Raises:
        ValueError: nothing is committed yet.
    """

    def __init__(self, spark: SparkSession, warehouse: Warehouse, settings: Settings) -> None:
        committed = last_committed(warehouse)
        if committed is None:
            raise ValueError("what-if starts from the latest committed version and there is none yet: "
                             "run `rebalancer exchange` first")
        self.committed = committed
        self._reads = _ReadOnce(warehouse)
        inputs = read_inputs(spark, self._reads, settings, committed, committed.exchange_id + 1)  # type: ignore[arg-type]
        inputs = dataclasses.replace(inputs, events=[], late=[], new_reports=None, many_reports=False)
        self._run = _Run(spark, self._reads, settings, inputs, lambda: datetime.now(UTC),  # type: ignore[arg-type]
                         lambda _point: None, True)
        self._catalog = inputs.node_catalog
        self._groups = inputs.groups.column("group_name").to_pylist()
        self.node_rows: dict[str, dict[str, Any]] = dict(self._run._nodes)

    def decide(self, events: Sequence[Event]) -> Hypothesis | str:
        """The :class:`Hypothesis` of ``events`` (numbered above the committed ones), or why they make none: an
        event the exchange would reject, or events that make more than one exchange (node events go together, a
        cluster or cache event is an exchange of its own)."""
        committed, run = self.committed, self._run
        steps, rejected = plan_exchanges(committed.state, events, self._catalog, self._groups,
                                         run.settings.baseline)
        if rejected:
            return "; ".join(r.reason for r in rejected)
        if len(steps) != 1:
            return (f"these events make {len(steps)} exchanges, not one: node events go together, a cluster or "
                    "cache event is an exchange of its own")
        [step] = steps
        if step.exchange_type == NONE:  # clients only: the version repeats the previous one's decisions
            keys: set[tuple[str, int]] = set()
            for name in ("migration_plan", "lost_partitions", "counter_conflicts"):
                keys |= _pairs(self._reads.read_arrow(name, where=version_where(committed.version)))
            u = _Unsettled(everything=False, keys=frozenset(keys))
        else:
            u = run._unsettled(step, committed, None)
        groups = run.group_settings(step, committed)
        return Hypothesis(step, groups, run.context(step, committed, groups), u.everything, u.groups, u.keys)


class _ReadOnce:
    """A warehouse that answers a repeated read from memory: what-if asks the same reads for every event set, and
    an exchange decided on the driver reads the previous version's tables for its kernel and again for its writes."""

    def __init__(self, warehouse: Warehouse) -> None:
        self._warehouse = warehouse
        self._memo: dict[tuple[Any, ...], Any] = {}

    def read_arrow(self, name: str, where: Mapping[str, Any] | None = None, version: int | None = None) -> pa.Table:
        key = ("arrow", name, repr(sorted((where or {}).items())), version)
        if key not in self._memo:
            self._memo[key] = self._warehouse.read_arrow(name, where=where, version=version)
        return self._memo[key]

    def read(self, name: str, version: int | None = None, where: Mapping[str, Any] | None = None) -> DataFrame:
        key = ("frame", name, repr(sorted((where or {}).items())), version)
        if key not in self._memo:
            self._memo[key] = self._warehouse.read(name, version=version, where=where)
        return self._memo[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._warehouse, name)


def _event_rejections(rejections: Sequence[Any], exchange_id: int) -> pa.Table:
    import json

    rows = [
        {
            "table_name": "topology_events",
            "row_json": json.dumps({"event_seq": r.event.event_seq, "event_type": r.event.event_type,
                                    "node_id": r.event.node_id, "group_name": r.event.group_name}),
            "reason": r.reason,
            "exchange_id": exchange_id,
        }
        for r in rejections
    ]
    return pa.Table.from_pylist(rows, schema=_arrow(REJECTED_ROWS))


def _arrow(schema: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


@dataclass
class _Unsettled:
    """The partitions an exchange recomputes: all, or every partition of ``groups`` plus ``keys``."""

    everything: bool
    groups: frozenset[str] = frozenset()
    keys: frozenset[tuple[str, int]] = frozenset()

    def touched_groups(self, running: frozenset[str]) -> frozenset[str]:
        if self.everything:
            return running
        return (self.groups | {g for g, _ in self.keys}) & running

    def count(self, partitions: Mapping[str, int]) -> int:
        if self.everything:
            return sum(partitions.values())
        return sum(partitions.get(g, 0) for g in self.groups) + sum(1 for g, _ in self.keys if g not in self.groups)


class _Run:
    """What every exchange of one run shares: session, warehouse, settings, the inputs read."""

    def __init__(
        self, spark: SparkSession, warehouse: Warehouse, settings: Settings, inputs: Inputs,
        clock: Callable[[], datetime], hook: Callable[[str], None], carry: bool,
    ) -> None:
        self.spark, self.warehouse, self.settings, self.inputs = spark, warehouse, settings, inputs
        self.clock, self.hook, self.carry = clock, hook, carry
        self.reports_consumed = False
        self.run_started: datetime | None = None
        self.max_report_seq: int | None = None
        self._reports: Reports | None = None
        self._nodes = {r["node_id"]: r for r in inputs.nodes.to_pylist()}
        self._groups = {r["group_name"]: r for r in inputs.groups.to_pylist()}
        # the placements of the step being decided: computed once, by whichever of scope and kernel asks first
        self._placed: tuple[ExchangeStep, dict[str, Any], dict[str, Any], tuple[PreviousPlacement, ...]] | None = None

    def release(self) -> None:
        if self._reports is not None:
            self._reports.release()

    def reports_for(self, step: ExchangeStep, exchange_id: int) -> Reports | None:
        """The new reports validated for ``step``, the version that consumes them (once per run)."""
        if self._reports is None and self.inputs.has_reports:
            consumer = Consumer(
                version=f"{step.major}.{step.minor}",
                alive=tuple(sorted(n for n, i in step.alive.items() if not i.is_client)),
                running=tuple(sorted(step.groups)),
            )
            self._reports = validate_reports(self.spark, self.warehouse, self.settings, self.inputs, consumer,
                                             exchange_id)
        return self._reports

    # ---- facts of one step ----
    def node_set(self, alive: Mapping[str, NodeInfo]) -> NodeSet:
        return NodeSet.from_rows([self._nodes[n] for n, info in alive.items() if not info.is_client])

    def group_settings(self, step: ExchangeStep, prev: Committed | None) -> dict[str, GroupSettings]:
        before = prev.state.groups if prev else frozenset()
        out = {}
        for name in sorted(step.groups):
            g = self._groups[name]
            out[name] = GroupSettings(
                name=name,
                partitions=int(g["partitions"]),
                backups=int(g["backups"]),
                mode=g["mode"] or "PARTITIONED",
                affinity=g["affinity"] or "rendezvous",
                exclude_neighbors=bool(g["exclude_neighbors"]),
                backup_filter=tuple(g["backup_filter"] or ()),
                loss_policy=g["loss_policy"] or "READ_WRITE_SAFE",
                started=name in step.new_groups or name not in before,
                reset=name in step.reset_groups,
                persistent=g.get("persistent") is not False,  # SPEC: null = true
            )
        return out

    def committed_after(self, step: ExchangeStep, summary: ExchangeSummary, prev: Committed | None) -> Committed:
        merged = (prev.merged_event_seqs if prev else frozenset()) | frozenset(step.merged_event_seqs)
        return Committed(
            exchange_id=summary.exchange_id,
            state=TopologyState(step.major, step.minor, step.alive, step.groups, step.cluster),
            last_event_seq=max(merged, default=0),
            merged_event_seqs=merged,
            max_report_seq=self.max_report_seq if self.reports_consumed else (prev.max_report_seq if prev else None),
            input_versions=self._recorded_versions(prev, last=False),
            row={},
        )

    def _recorded_versions(self, prev: Committed | None, last: bool) -> dict[str, int]:
        """What an exchange records as consumed (see docs/EXCHANGE.md, "Inputs read incrementally")."""
        before = dict(prev.input_versions) if prev else {}
        now = dict(self.inputs.versions)
        out = {"nodes": now["nodes"], "cache_groups": now["cache_groups"]}
        # Events: only the run's last exchange consumes them all (a crash in between re-reads the rest).
        if last:
            out["topology_events"] = now["topology_events"]
        elif "topology_events" in before:
            out["topology_events"] = before["topology_events"]
        if self.reports_consumed:
            out["partition_reports"] = now["partition_reports"]
        elif "partition_reports" in before:
            out["partition_reports"] = before["partition_reports"]
        return out

    # ---- one exchange ----
    def exchange(
        self, step: ExchangeStep, prev: Committed | None, meter: Meter, *, last: bool, switch_check: bool = False
    ) -> ExchangeSummary | None:
        # the first exchange of a run started with the run (its inputs stage); later ones start here
        started, self.run_started = self.run_started or self.clock(), None
        t0 = time.perf_counter()
        version = (step.major, step.minor)
        exchange_id = (prev.exchange_id if prev else 0) + 1
        consume = step.exchange_type != NONE and not self.reports_consumed and self.inputs.has_reports
        reports = None
        with meter.stage("unsettled"):
            if step.exchange_type == NONE and prev is not None:
                unsettled = _Unsettled(everything=False)
                consume = False
            else:
                reports = self.reports_for(step, exchange_id) if consume else None
                unsettled = self._unsettled(step, prev, reports)
        groups = self.group_settings(step, prev)
        out: DataFrame | pa.Table | None = None
        small = {name: DECISION_SCHEMAS[name].empty_table() for name in _SMALL_KINDS}
        summary_counts = dict.fromkeys(SUMMARY_COLUMNS, 0)
        summary_counts["max_report_seq"] = -1
        previous = _ReadOnce(self.warehouse)  # the driver path reads the previous version's tables once
        if groups and (unsettled.everything or unsettled.groups or unsettled.keys):  # no running group: nothing
            with meter.stage("kernel"):
                small_kinds = [KINDS[k] for k in _SMALL_KINDS] + [SUMMARY]
                if self._on_driver(groups, reports):
                    decided = self._kernel_arrow(step, prev, groups, unsettled, reports, previous)
                    collected = decided.filter(pc.is_in(decided.column("kind"), pa.array(small_kinds, pa.int8())))
                    out = decided
                else:
                    frame = self._kernel(step, prev, groups, unsettled, reports)
                    collected = frame.where(F.col("kind").isin(small_kinds)).toArrow()
                    out = frame
                small, summary_counts = _split_small(collected)
        if switch_check:
            due = summary_counts["switch_waiting_partitions"] > 0 and summary_counts["switch_unready_partitions"] == 0
            if not due:
                _release(out)
                return None
        if consume:
            self.reports_consumed = True
            newest = max(summary_counts["max_report_seq"], (prev.max_report_seq if prev else None) or -1)
            self.max_report_seq = newest if newest >= 0 else None
            if reports is not None:
                record_rejections(self.warehouse, reports.rejected)
        if not step.cluster.active:  # a deactivated cluster moves no data (the maps still record the version)
            small["steps"] = small["steps"].slice(0, 0)
        with meter.stage("plan"):
            plan, bound = schedule_plan(finish_plan(small["steps"], self.settings.migration), self.settings.migration)
        try:
            counts = self._write(step, prev, version, groups, unsettled, out, small, plan, meter, previous)
        finally:
            _release(out)
        if step.exchange_type == NONE and prev is not None:
            counts = {k: int(prev.row.get(k) or 0) for k in _COUNT_FIELDS}
            plan_times = {k: float(prev.row.get(k) or 0.0) for k in ("makespan_s", "makespan_lower_bound_s")}
        else:
            counts.update(
                moving_copies=summary_counts["moving_copies"],
                temporary_primaries=summary_counts["temporary_primaries"],
            )
            plan_times = {
                "makespan_s": float(pc.max(plan.column("est_end_s")).as_py() or 0.0) if plan.num_rows else 0.0,
                "makespan_lower_bound_s": float(bound),
            }
        servers = sum(1 for i in step.alive.values() if not i.is_client)
        summary = ExchangeSummary(
            exchange_id=exchange_id,
            topology_major=step.major,
            topology_minor=step.minor,
            exchange_type=step.exchange_type,
            merged_event_seqs=step.merged_event_seqs,
            coordinator=step.coordinator,
            alive_servers=servers,
            alive_clients=len(step.alive) - servers,
            seconds=time.perf_counter() - t0,
            makespan_s=plan_times["makespan_s"],
            makespan_lower_bound_s=plan_times["makespan_lower_bound_s"],
            stage_seconds=dict(meter.seconds),
            stage_jobs=dict(meter.stage_jobs),
            recomputed_partitions=unsettled.count({g: s.partitions for g, s in groups.items()}),
            **counts,
        )
        with meter.stage("commit"):
            summary = _replace(summary, spark_jobs=meter.jobs())
            self._commit_row(summary, step, prev, started, last)
        self.hook("after:exchanges")
        _log.info("exchange %d committed version %d.%d (%s): %d steps, %d lost partitions, %.1f s",
                  summary.exchange_id, summary.topology_major, summary.topology_minor, summary.exchange_type,
                  summary.migrations, summary.lost_partitions, summary.seconds)
        # the summary also reports the commit stage, which its committed row cannot hold
        return _replace(summary, stage_seconds=dict(meter.seconds), stage_jobs=dict(meter.stage_jobs),
                        spark_jobs=meter.jobs())

    # ---- which partitions can change ----
    def _unsettled(self, step: ExchangeStep, prev: Committed | None, reports: Reports | None) -> _Unsettled:
        if prev is None or not self.carry or self._nodes_changed(prev, step) or step.activated or (
                _placing(prev.state.alive, prev.state.cluster) != _placing(step.alive, step.cluster)):
            # activation validates counters across every report; a drain or a baseline change moves placements
            return _Unsettled(everything=True)
        before, now = prev.state, step
        servers_before = {n for n, i in before.alive.items() if not i.is_client}
        servers_now = {n for n, i in now.alive.items() if not i.is_client}
        departed, joined = sorted(servers_before - servers_now), sorted(servers_now - servers_before)
        full = set(step.new_groups) | set(step.reset_groups) | {g for g in step.groups if g not in before.groups}
        changed_settings = self._groups_changed(prev, step.groups & before.groups)
        full |= changed_settings
        full |= self._balanced_moved(before, step, servers_before != servers_now, changed_settings)
        keys: set[tuple[str, int]] = self._placement_changed(step, prev, full)
        for g in step.groups & before.groups:
            settings = self._groups[g]
            replicated = (settings["mode"] or "PARTITIONED") == REPLICATED
            if replicated and servers_before != servers_now:
                full.add(g)
            backups = int(settings["backups"])
            if min(backups + 1, len(servers_before)) != min(backups + 1, len(servers_now)):
                full.add(g)
        where = version_where(prev.version)
        for name in ("migration_plan", "lost_partitions", "counter_conflicts"):
            t = self.warehouse.read_arrow(name, where=where).select(list(PARTITION_KEY))
            keys |= _pairs(t)
        sources: list[DataFrame] = []
        carried = sorted(step.groups - full)
        # Small clusters answer on the driver (Arrow and the client's affinity): a Spark job costs more than the
        # work. Large ones keep the work in Spark.
        carried_partitions = sum(int(self._groups[g]["partitions"]) for g in carried)
        copies_on_driver = carried_partitions * (1 + max((int(self._groups[g]["backups"]) for g in carried),
                                                         default=0)) <= DRIVER_COPIES
        ranks_on_driver = carried_partitions * len(servers_now) <= DRIVER_RANKINGS
        if reports is not None:
            if reports.keys is not None:
                keys |= _pairs(reports.keys)
            else:
                sources.append(reports.valid.select(*PARTITION_KEY))
        if departed and carried and copies_on_driver:
            copies = self.warehouse.read_arrow("partition_map", where=where)
            copies = copies.filter(pc.and_(pc.is_in(copies.column("node_id"), pa.array(departed, pa.string())),
                                           pc.is_in(copies.column("group_name"), pa.array(carried, pa.string()))))
            keys |= _pairs(copies)
        elif departed and carried:
            sources.append(
                self.warehouse.read("partition_map", where=where)
                .where(F.expr(f"node_id IN ({_sql_list(departed)}) AND group_name IN ({_sql_list(carried)})"))
                .select(*PARTITION_KEY)
            )
        if joined and carried and ranks_on_driver:
            nodes = self.node_set({n: step.alive[n] for n in servers_now})
            joined_codes = [nodes.node_ids.index(n) for n in joined]
            for g in carried:
                gs = self._groups[g]
                pids = np.arange(int(gs["partitions"]), dtype=np.int64)
                matrix = assign_indexes(
                    pids, nodes, int(gs["backups"]), gs["affinity"], gs["mode"], gs["exclude_neighbors"],
                    tuple(gs["backup_filter"] or ()), self.settings.affinity.ignite_ids_as_strings,
                )
                keys |= {(g, int(p)) for p in pids[np.isin(matrix, joined_codes).any(axis=1)]}
        elif joined and carried:
            nodes_df = self.spark.createDataFrame(
                pa.Table.from_pylist([self._nodes[n] for n in sorted(servers_now)], schema=self.inputs.nodes.schema)
            )
            groups_df = self.spark.createDataFrame(self.inputs.groups).where(
                F.expr(f"group_name IN ({_sql_list(carried)})")
            )
            sources.append(
                ideal_assignment(nodes_df, groups_df, self.settings.affinity)
                .where(F.col("node_id").isin(joined))
                .select(*PARTITION_KEY)
            )
        if sources:
            found = functools.reduce(DataFrame.unionByName, sources).distinct().toArrow()
            keys |= _pairs(found)
        running = {g: int(self._groups[g]["partitions"]) for g in step.groups}
        keys = {(g, p) for g, p in keys if g in running and g not in full and 0 <= p < running[g]}
        return _Unsettled(everything=False, groups=frozenset(full & set(running)), keys=frozenset(keys))

    def _balanced_moved(self, before: TopologyState, step: ExchangeStep, servers_changed: bool,
                        changed_settings: set[str]) -> set[str]:
        """The running balanced groups whose placement may change: balanced groups are placed together (one
        group's partitions can take room another's needed), so all of them whenever the servers, the running
        groups or any group's settings change."""
        balanced = {g for g in step.groups if self._groups[g]["affinity"] == BALANCED}
        if balanced and (servers_changed or step.groups != before.groups or changed_settings):
            return balanced
        return set()

    def _placement_changed(self, step: ExchangeStep, prev: Committed, full: set[str]) -> set[tuple[str, int]]:
        """The partitions of carried balanced groups whose placement is not the previous ideal list. A placement
        ``balanced`` made is its own continuation when the servers stay, so this is empty for it; a placement
        adopted from a live cluster's reports (``_adopted``) need not be: where it is skewed, the first exchange
        after it evens it, and every partition it moves is recomputed (carried rows keep the previous lists)."""
        carried = sorted(g for g in step.groups & prev.state.groups
                         if g not in full and self._groups[g]["affinity"] == BALANCED)
        if not carried:
            return set()
        groups = self.group_settings(step, prev)
        alive = self.node_set(step.alive)
        placed, _ = self._placements(step, prev, groups, alive)
        where = {n: i for i, n in enumerate(alive.node_ids)}
        changed: set[tuple[str, int]] = set()
        for before in self._previous_of(step):  # the previous ideal lists _place read and continued from
            to_alive = np.array([where.get(n, -1) for n in before.node_ids] + [-1], dtype=np.int32)
            for g in carried:
                now, then = placed.get(g), before.matrices.get(g)
                if now is None or then is None:
                    continue
                width = max(now.shape[1], then.shape[1])
                old = np.full((now.shape[0], width), -1, dtype=np.int32)
                k = min(now.shape[0], then.shape[0])
                old[:k, : then.shape[1]] = to_alive[np.where(then[:k] >= 0, then[:k], len(before.node_ids))]
                old = np.take_along_axis(old, np.argsort(old < 0, axis=1, kind="stable"), axis=1)
                new = np.full_like(old, -1)
                new[:, : now.shape[1]] = np.take_along_axis(now, np.argsort(now < 0, axis=1, kind="stable"), axis=1)
                changed |= {(g, int(p)) for p in np.flatnonzero((old != new).any(axis=1))}
        return changed

    def _placements(self, step: ExchangeStep, prev: Committed | None, groups: Mapping[str, GroupSettings],
                    alive: NodeSet) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._placed is None or self._placed[0] is not step:
            self._placed = (step, *self._place(step, prev, groups, alive))
        return self._placed[1], self._placed[2]

    def _previous_of(self, step: ExchangeStep) -> tuple[PreviousPlacement, ...]:
        """The previous placements :meth:`_placements` continued from for ``step`` (called for it first)."""
        assert self._placed is not None and self._placed[0] is step, "placements of another step"
        return self._placed[3]

    def _place(self, step: ExchangeStep, prev: Committed | None, groups: Mapping[str, GroupSettings],
               alive: NodeSet) -> tuple[dict[str, Any], dict[str, Any], tuple[PreviousPlacement, ...]]:
        """Replica matrices (indexes into ``alive``) decided on the driver instead of in the kernel: balanced groups
        (placed together), and every group whose candidates are not the alive servers - draining nodes leave the
        placement while they still serve, and persistent groups are placed over the baseline, where an offline node
        keeps its place but gets no copy (docs/EXCHANGE.md "Baseline, activation, drain"). Also the lists
        ``ideal_assignment`` shows for groups whose placement names offline nodes (``KernelContext.listed``)."""
        everyone = frozenset(alive.node_ids)
        by_kind = {persistent: self._candidates(step, persistent) for persistent in {s.persistent for s in
                                                                                       groups.values()}}
        candidates = {name: by_kind[s.persistent] for name, s in groups.items()}
        out: dict[str, Any] = {}
        listed: dict[str, Any] = {}
        placed_before: dict[str, int] = {}  # balanced group -> how many of its partitions the previous ideal placed
        previous_read: list[PreviousPlacement] = []
        for chosen in sorted(set(candidates.values()), key=sorted):
            members = {g: s for g, s in groups.items() if candidates[g] == chosen}
            nodes = alive if chosen == everyone else NodeSet.from_rows([self._nodes[n] for n in sorted(chosen)])
            previous = self._balanced_previous(prev, members)
            if previous is not None:
                previous_read.append(previous)
                placed_before.update((g, m.shape[0]) for g, m in previous.matrices.items())
            placed = _balanced_placements(members, nodes, self.settings.affinity.balanced_spread, previous)
            if chosen != everyone:
                for g, s in members.items():
                    if g not in placed:
                        placed[g] = assign_indexes(
                            np.arange(s.partitions), nodes, s.backups, s.affinity, s.mode, s.exclude_neighbors,
                            s.backup_filter, self.settings.affinity.ignite_ids_as_strings)
                if not chosen <= everyone:
                    listed.update((g, (tuple(nodes.node_ids), m)) for g, m in placed.items())
                placed = {g: placed_onto(m, nodes.node_ids, alive.node_ids) for g, m in placed.items()}
            out.update(placed)
        out.update(self._adopted(out, groups, alive, placed_before))
        return out, listed, tuple(previous_read)

    def _adopted(self, placed: Mapping[str, Any], groups: Mapping[str, GroupSettings], alive: NodeSet,
                 placed_before: Mapping[str, int]) -> dict[str, Any]:
        """A collected cluster's own placement, adopted where the engine has none yet (docs/KAFKA.md "Adopting a
        running cluster"): for each balanced group, every partition beyond the previous ideal's (all of them on the
        first exchange, of a group started since, and a group's added partitions) whose copies on alive nodes the
        reports place (``replica_index``, the extra column collectors write; OWNING or MOVING copies, latest report
        per copy) keeps those nodes in that order; the others keep the placement decided. So an exchange plans
        nothing for partitions the cluster placed itself, and later ones continue from them."""
        names = [g for g, s in groups.items() if s.affinity == BALANCED and g in placed
                 and placed_before.get(g, 0) < s.partitions]
        if not names or REPLICA_INDEX not in self.warehouse.read_raw("partition_reports").columns:
            return {}
        where = {n: i for i, n in enumerate(alive.node_ids)}
        lists: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for r in self.warehouse.latest_reports(names).to_pylist():
            if r[REPLICA_INDEX] is not None and r["state"] in (OWNING, MOVING) and r["node_id"] in where:
                lists.setdefault((r["group_name"], r["partition_id"]), []).append(
                    (r[REPLICA_INDEX], where[r["node_id"]]))
        adopted: dict[str, Any] = {}
        for (group, pid), copies in sorted(lists.items()):
            matrix = adopted.get(group)
            if matrix is None:
                matrix = adopted[group] = np.array(placed[group], copy=True)
            if placed_before.get(group, 0) <= pid < matrix.shape[0]:
                nodes = [i for _, i in sorted(copies)][: matrix.shape[1]]
                matrix[pid] = nodes + [-1] * (matrix.shape[1] - len(nodes))
        return adopted

    def _candidates(self, step: ExchangeStep, persistent: bool) -> frozenset[str]:
        """The nodes a group is placed over: the alive servers not draining, or for a persistent group the
        baseline (which may name offline nodes) when one is set."""
        cluster = step.cluster
        if persistent and cluster.baseline is not None:
            return frozenset(n for n in cluster.baseline if n in self._nodes)
        return placement_servers(step.alive, cluster.draining)

    def _balanced_previous(self, prev: Committed | None, groups: Mapping[str, GroupSettings]
                           ) -> PreviousPlacement | None:
        """The balanced groups' ideal assignment at the previous version: their new placement continues from it
        (docs/AFFINITY.md step 9), so a change moves what it must and little more."""
        names = [g for g, s in groups.items() if s.affinity == BALANCED]
        if prev is None or not names:
            return None
        rows = self.warehouse.read_arrow("ideal_assignment", where=version_where(prev.version))
        return previous_placement(rows.filter(pc.is_in(rows.column("group_name"), pa.array(names, pa.string()))))

    def _nodes_changed(self, prev: Committed, step: ExchangeStep) -> bool:
        """Whether a server alive before and now changed what placement reads (host, attributes, capacity, ...)."""
        then = prev.input_versions.get("nodes")
        if then is None:
            return True
        if then == self.inputs.versions["nodes"]:
            return False
        old = {r["node_id"]: r for r in self.warehouse.read_arrow("nodes", version=then).to_pylist()}
        keep = ("node_uuid", "node_order", "host", "attributes", "capacity", "is_client")
        for node_id in step.alive:
            if node_id in prev.state.alive and node_id in old:
                a, b = old[node_id], self._nodes[node_id]
                if any(_norm(a.get(k)) != _norm(b.get(k)) for k in keep):
                    return True
        return False

    def _groups_changed(self, prev: Committed, names: frozenset[str]) -> set[str]:
        then = prev.input_versions.get("cache_groups")
        if then is None:
            return set(names)
        if then == self.inputs.versions["cache_groups"]:
            return set()
        old = {r["group_name"]: r for r in self.warehouse.read_arrow("cache_groups", version=then).to_pylist()}
        return {g for g in names if g not in old or any(
            _norm(old[g].get(k)) != _norm(self._groups[g].get(k)) for k in self._groups[g]
        )}

    # ---- the kernel ----
    def context(self, step: ExchangeStep, prev: Committed | None, groups: dict[str, GroupSettings]) -> KernelContext:
        """The exchange-wide facts the kernel decides ``step`` with."""
        nodes = self.node_set(step.alive)
        placements, listed = self._placements(step, prev, groups, nodes)
        return KernelContext(
            nodes=nodes,
            node_orders={n: i.node_order for n, i in step.alive.items()},
            groups=groups,
            history_threshold=self.settings.rebalance.history_threshold,
            ids_as_strings=self.settings.affinity.ignite_ids_as_strings,
            placements=placements,
            listed=listed,
        )

    def _kernel(
        self, step: ExchangeStep, prev: Committed | None, groups: dict[str, GroupSettings], u: _Unsettled,
        reports: Reports | None,
    ) -> DataFrame:
        ctx = self.context(step, prev, groups)
        spark = self.spark
        sizes = {g: s.partitions for g, s in groups.items()}
        select = _Selection(spark, u, sizes)
        group_rows = pa.table({"group_name": list(sizes), "partitions": [sizes[g] for g in sizes]},
                              schema=pa.schema([("group_name", pa.string()), ("partitions", pa.int32())]))
        marker_groups = sorted(sizes) if u.everything else sorted(u.groups)
        parts: list[DataFrame] = []
        if marker_groups:
            parts.append(
                tagged(
                    spark.createDataFrame(group_rows.filter(pc.is_in(group_rows.column("group_name"),
                                                                     pa.array(marker_groups, pa.string()))))
                    .select("group_name", F.explode(F.sequence(F.lit(0), F.col("partitions") - 1))
                            .alias("partition_id")),
                    PARTITION,
                )
            )
        if u.keys:
            keys = sorted(k for k in u.keys if k[0] not in u.groups)
            if keys:
                parts.append(tagged(spark.createDataFrame(
                    pa.table({"group_name": [g for g, _ in keys], "partition_id": [p for _, p in keys]},
                             schema=pa.schema([("group_name", pa.string()), ("partition_id", pa.int32())]))
                ), PARTITION))
        if prev is not None:
            where = version_where(prev.version)
            for name, kind in (("partition_map", MAP), ("affinity_assignment", ASSIGNMENT),
                               ("partition_versions", VERSION)):
                parts.append(tagged(select.unsettled(self.warehouse.read(name, where=where)), kind))
            lost = self._unsettled_lost(where, u, sizes)
            if lost.num_rows:
                parts.append(tagged(spark.createDataFrame(lost), LOST_ROW))
        if reports is not None:
            parts.append(tagged(select.unsettled(reports.valid), REPORT))
        rows = functools.reduce(DataFrame.unionByName, parts)
        tasks = max(1, min(parallelism(spark) * 2, math.ceil(u.count(sizes) / 50_000)))
        schema = from_arrow_schema(OUTPUT_SCHEMA)

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return decide_stream(batches, ctx)

        return (
            rows.repartition(tasks, "group_name", "partition_id")
            .sortWithinPartitions("group_name", "partition_id")
            .mapInArrow(run, schema)
            .persist()
        )

    def _unsettled_lost(self, where: Mapping[str, Any], u: _Unsettled, sizes: Mapping[str, int]) -> pa.Table:
        """The keys of the previous version's lost partitions among the recomputed ones (both kernel paths)."""
        lost = self.warehouse.read_arrow("lost_partitions", where=where).select(list(PARTITION_KEY))
        return lost.filter(_unsettled_mask(lost, u, sizes))

    def _on_driver(self, groups: Mapping[str, GroupSettings], reports: Reports | None) -> bool:
        """Whether this exchange is decided on the driver (:data:`DRIVER_KERNEL_REPLICAS`)."""
        replicas = sum(g.partitions * (g.backups + 1) for g in groups.values())
        return (self.warehouse.reads_on_driver and replicas <= DRIVER_KERNEL_REPLICAS
                and (reports is None or reports.arrow is not None))

    def _kernel_arrow(
        self, step: ExchangeStep, prev: Committed | None, groups: dict[str, GroupSettings], u: _Unsettled,
        reports: Reports | None, previous: _ReadOnce,
    ) -> pa.Table:
        """:meth:`_kernel` on the driver: the same tagged rows, read as Arrow (through ``previous``, which keeps the
        previous version's tables for :meth:`_write` to carry the settled partitions from), decided by the same
        stream function in one buffer ordered by partition; the long output table."""
        ctx = self.context(step, prev, groups)
        sizes = {g: s.partitions for g, s in groups.items()}
        key = pa.schema([("group_name", pa.string()), ("partition_id", pa.int32())])
        parts: list[pa.Table] = []
        marker_groups = sorted(sizes) if u.everything else sorted(u.groups)
        if marker_groups:
            counts = [sizes[g] for g in marker_groups]
            parts.append(_tagged_arrow(pa.table({
                "group_name": pa.array(np.repeat(np.array(marker_groups, dtype=object), counts), pa.string()),
                "partition_id": pa.array(np.concatenate([np.arange(n, dtype=np.int32) for n in counts]), pa.int32()),
            }, schema=key), PARTITION))
        keys = sorted(k for k in u.keys if k[0] not in u.groups)
        if keys:
            parts.append(_tagged_arrow(pa.table({"group_name": [g for g, _ in keys],
                                                 "partition_id": [p for _, p in keys]}, schema=key), PARTITION))
        if prev is not None:
            where = version_where(prev.version)
            for name, kind in (("partition_map", MAP), ("affinity_assignment", ASSIGNMENT),
                               ("partition_versions", VERSION)):
                rows = previous.read_arrow(name, where=where)
                parts.append(_tagged_arrow(rows.filter(_unsettled_mask(rows, u, sizes)), kind))
            lost = self._unsettled_lost(where, u, sizes)
            if lost.num_rows:
                parts.append(_tagged_arrow(lost, LOST_ROW))
        if reports is not None and reports.arrow is not None:
            parts.append(_tagged_arrow(reports.arrow.filter(_unsettled_mask(reports.arrow, u, sizes)), REPORT))
        rows = pa.concat_tables(parts).sort_by([("group_name", "ascending"), ("partition_id", "ascending")])
        decided = list(decide_stream(rows.to_batches(), ctx))
        return pa.Table.from_batches(decided, schema=OUTPUT_SCHEMA)

    # ---- commit ----
    def _write(
        self, step: ExchangeStep, prev: Committed | None, version: tuple[int, int], groups: dict[str, GroupSettings],
        u: _Unsettled, out: DataFrame | pa.Table | None, small: dict[str, pa.Table], plan: pa.Table, meter: Meter,
        previous: _ReadOnce,
    ) -> dict[str, int]:
        wh, where = self.warehouse, version_where(version)
        sizes = {g: s.partitions for g, s in groups.items()}
        carried_groups = sorted(set(sizes) - (set(sizes) if u.everything else set(u.groups)))
        on_driver = isinstance(out, pa.Table) or (out is None and self._on_driver(groups, None))
        keep = (_Selection(self.spark, u, sizes) if prev is not None and carried_groups and not on_driver
                else None)

        def large_arrow(name: str) -> pa.Table:
            schema = _arrow(OUTPUT_TABLES[name])
            columns = [f.name for f in schema if f.name not in VERSION_COLUMNS]
            parts = [schema.empty_table().select(columns)]
            if isinstance(out, pa.Table):
                parts.append(out.filter(pc.equal(out.column("kind"), KINDS[name])).select(columns)
                             .cast(parts[0].schema))
            if prev is not None and carried_groups:
                before = previous.read_arrow(name, where=version_where(prev.version))
                parts.append(before.filter(_settled_mask(before, u, sizes)).select(columns).cast(parts[0].schema))
            return _versioned_arrow(pa.concat_tables(parts), name, version)

        def large(name: str) -> DataFrame:
            columns = [f for f in OUTPUT_TABLES[name].fieldNames() if f not in VERSION_COLUMNS]
            frames = []
            if isinstance(out, DataFrame):
                frames.append(out.where(F.col("kind") == KINDS[name]).select(*columns))
            if keep is not None and prev is not None:
                frames.append(keep.settled(wh.read(name, where=version_where(prev.version))).select(*columns))
            if not frames:  # no running group
                frames.append(wh.read(name).limit(0).select(*columns))
            return _versioned(functools.reduce(DataFrame.unionByName, frames), version)

        def small_table(name: str, rows: pa.Table) -> pa.Table:
            if step.exchange_type == NONE and prev is not None:
                rows = wh.read_arrow(name, where=version_where(prev.version))
            return _versioned_arrow(rows, name, version)

        topology = pa.Table.from_pylist(
            [{"topology_major": version[0], "topology_minor": version[1], "node_id": n, "node_order": i.node_order,
              "is_client": i.is_client} for n, i in sorted(step.alive.items())],
            schema=_arrow(TOPOLOGY),
        )
        touched = u.touched_groups(frozenset(sizes))
        frames: dict[str, DataFrame | pa.Table] = {
            name: large_arrow(name) if on_driver else large(name) for name in LARGE_TABLES}
        with meter.stage("routing"):
            recompute = bool(touched) or prev is None or step.groups != prev.state.groups
            if on_driver:
                assignment_rows = frames["affinity_assignment"]
                assert isinstance(assignment_rows, pa.Table)
                if recompute:
                    routes = routing.client_affinity_arrow(assignment_rows, [self._groups[g] for g in sizes])
                else:
                    assert prev is not None
                    routes = wh.read_arrow("client_affinity", where=version_where(prev.version))
                frames["client_affinity"] = _versioned_arrow(routes, "client_affinity", version)
            elif recompute:
                assignment = frames["affinity_assignment"]
                assert isinstance(assignment, DataFrame)
                digests = routing.routing_digests(assignment).toArrow().to_pylist()
                mappings = routing.fold(digests, [self._groups[g] for g in sizes])
                frames["client_affinity"] = _versioned(routing.client_affinity(assignment, mappings), version)
            else:
                assert prev is not None
                frames["client_affinity"] = _versioned(
                    wh.read("client_affinity", where=version_where(prev.version)).drop(*VERSION_COLUMNS), version
                )
        with meter.stage("writes"):
            outputs: dict[str, DataFrame | pa.Table] = {"topology": topology, **frames}
            for name, rows in (("counter_conflicts", small["counter_conflicts"]),
                               ("lost_partitions", small["lost_partitions"]), ("migration_plan", plan)):
                outputs[name] = small_table(name, rows)
            replicas = sum(g.partitions * (g.backups + 1) for g in groups.values())
            wh.replace_where_many(outputs, where, committed=lambda name: self.hook(f"after:{name}"),
                                  rows_hint=4 * replicas)  # ideal, assignment, map; versions and routing
        with meter.stage("stamps"):
            stamps = self._stamps(prev, version, sizes, touched)
            wh.replace_where_arrow("partition_stamps", small_table("partition_stamps", stamps), where)
            self.hook("after:partition_stamps")
        lost = small["lost_partitions"]
        return {
            "partitions": sum(sizes.values()),
            "lost_partitions": lost.num_rows,
            "counter_conflicts": small["counter_conflicts"].num_rows,
            "migrations": plan.num_rows,
            "bytes_to_move": int(pc.sum(plan.column("bytes")).as_py() or 0) if plan.num_rows else 0,
        }

    def _stamps(
        self, prev: Committed | None, version: tuple[int, int], sizes: dict[str, int], touched: frozenset[str]
    ) -> pa.Table:
        """Every running group's stamp: recomputed (on the driver) for groups with a recomputed partition, else
        carried. A group's versions are one narrow row per partition, read from the version just written."""
        parts = []
        if touched:
            versions = self.warehouse.read_arrow("partition_versions", where=version_where(version))
            parts.append(stamps_of(versions, {g: sizes[g] for g in touched}))
        rest = sorted(set(sizes) - touched)
        if rest and prev is not None:
            old = self.warehouse.read_arrow("partition_stamps", where=version_where(prev.version))
            parts.append(old.filter(pc.is_in(old.column("group_name"), pa.array(rest, pa.string())))
                         .select(["group_name", "stamp"]).cast(STAMPS_SCHEMA))
        return pa.concat_tables(parts) if parts else STAMPS_SCHEMA.empty_table()

    def _commit_row(
        self, s: ExchangeSummary, step: ExchangeStep, prev: Committed | None, started: datetime, last: bool
    ) -> None:
        """Commit the ``exchanges`` row, the moment the version starts to exist; detect a rival's commit."""
        row = {
            "exchange_id": s.exchange_id, "topology_major": s.topology_major, "topology_minor": s.topology_minor,
            "exchange_type": s.exchange_type, "merged_event_seqs": list(s.merged_event_seqs),
            "coordinator": s.coordinator,
            "max_report_seq": self.max_report_seq if self.reports_consumed else (
                prev.max_report_seq if prev else None),
            "started_at": started, "finished_at": self.clock(), "running_groups": sorted(step.groups),
            "alive_servers": s.alive_servers, "alive_clients": s.alive_clients, "partitions": s.partitions,
            "lost_partitions": s.lost_partitions, "moving_copies": s.moving_copies,
            "temporary_primaries": s.temporary_primaries, "counter_conflicts": s.counter_conflicts,
            "migrations": s.migrations, "bytes_to_move": s.bytes_to_move, "makespan_s": s.makespan_s,
            "makespan_lower_bound_s": s.makespan_lower_bound_s,
            "input_versions": list(self._recorded_versions(prev, last).items()),
            "stage_seconds": list(s.stage_seconds.items()), "spark_jobs": s.spark_jobs,
            "stage_jobs": list(s.stage_jobs.items()) if s.spark_jobs is not None else None,
            **cluster_columns(step.cluster),
        }
        self.warehouse.insert_absent_arrow("exchanges", pa.Table.from_pylist([row], schema=_arrow(EXCHANGES)),
                                           ["exchange_id"])
        committed = self.warehouse.read_arrow("exchanges", where={"exchange_id": s.exchange_id}).to_pylist()
        if len(committed) != 1 or abs(committed[0]["started_at"].timestamp() - started.timestamp()) > 1e-6:
            raise ExchangeConflictError(
                f"exchange {s.exchange_id} (version {s.topology_major}.{s.topology_minor}) was committed by another "
                "run while this one worked; nothing was duplicated, run `rebalancer exchange` again to continue"
            )


_COUNT_FIELDS = (
    "partitions", "lost_partitions", "moving_copies", "temporary_primaries", "counter_conflicts", "migrations",
    "bytes_to_move",
)


# =====================================================================================================================
# Small helpers
# =====================================================================================================================


def _replace(summary: ExchangeSummary, **changes: Any) -> ExchangeSummary:
    import dataclasses

    return dataclasses.replace(summary, **changes)


def _norm(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return value


def _versioned(df: DataFrame, version: tuple[int, int]) -> DataFrame:
    return df.select(
        F.lit(version[0]).cast("long").alias("topology_major"), F.lit(version[1]).cast("int").alias("topology_minor"),
        *[c for c in df.columns if c not in VERSION_COLUMNS],
    )


class _Selection:
    """The rows of the unsettled partitions of a frame, or of the settled ones of carried groups.

    Groups are chosen by SQL text (one py4j call: a Column built with ``isin`` makes one call per literal, 6.6 s
    for an M scale-down's 3,896 keys). Single partitions too, up to :data:`KEYS_AS_LITERALS` of them; beyond, by a
    join with a broadcast table of their keys: thousands of literals in a plan make every later analysis of it
    slow (1.6 s to build an M scale-down's writes), while a broadcast costs a Spark job per query (4 to 10).
    """

    def __init__(self, spark: SparkSession, u: _Unsettled, sizes: Mapping[str, int]) -> None:
        self.u, self.sizes = u, sizes
        keys = sorted(k for k in u.keys if k[0] in sizes and k[0] not in u.groups)
        self.literal: str | None = None
        self.keys: DataFrame | None = None
        if keys and len(keys) <= KEYS_AS_LITERALS:
            codes = {g: i for i, g in enumerate(sorted(sizes))}
            key_sql = (f"CAST(element_at({_sql_map(codes.items())}, group_name) AS BIGINT) * {MAX_PARTITIONS}"
                       " + partition_id")
            self.literal = f"{key_sql} IN ({_sql_list(codes[g] * MAX_PARTITIONS + p for g, p in keys)})"
        elif keys:
            self.keys = F.broadcast(spark.createDataFrame(pa.table(
                {"group_name": [g for g, _ in keys], "partition_id": [p for _, p in keys]},
                schema=pa.schema([("group_name", pa.string()), ("partition_id", pa.int32())]),
            )))

    def unsettled(self, df: DataFrame) -> DataFrame:
        """Rows of the unsettled partitions (of running groups, in range)."""
        in_range = _in_range_sql(self.sizes, self.sizes)
        if self.u.everything:
            return df.where(F.expr(in_range))
        whole = _in_range_sql(self.u.groups, self.sizes)
        if self.literal is not None:
            return df.where(F.expr(f"{whole} OR ({in_range} AND {self.literal})"))
        if self.keys is not None:
            return df.where(F.expr(whole)).unionByName(
                df.where(F.expr(in_range)).join(self.keys, list(PARTITION_KEY), "left_semi"))
        return df.where(F.expr(whole))

    def settled(self, df: DataFrame) -> DataFrame:
        """Rows of the settled partitions of carried groups (running before and now, not recomputed whole)."""
        carried = _in_range_sql(set(self.sizes) - set(self.u.groups), self.sizes)
        if self.literal is not None:
            return df.where(F.expr(f"{carried} AND NOT ({self.literal})"))
        if self.keys is not None:
            return df.where(F.expr(carried)).join(self.keys, list(PARTITION_KEY), "left_anti")
        return df.where(F.expr(carried))


def _sql_list(values: Iterable[str | int]) -> str:
    return ", ".join(sql_literal(v) for v in values)


def _sql_map(pairs: Iterable[tuple[str, int]]) -> str:
    return "map(" + ", ".join(f"{sql_literal(k)}, {sql_literal(v)}" for k, v in pairs) + ")"


def _in_range_sql(groups: Iterable[str], sizes: Mapping[str, int]) -> str:
    """Rows of ``groups`` whose partition_id is below the group's partition count."""
    names = sorted(groups)
    if not names:
        return "FALSE"
    return (f"(group_name IN ({_sql_list(names)}) AND "
            f"partition_id < element_at({_sql_map((g, sizes[g]) for g in sorted(sizes))}, group_name))")


def _pairs(t: pa.Table) -> set[tuple[str, int]]:
    """The (group_name, partition_id) pairs of an Arrow table."""
    return set(zip(t.column("group_name").to_pylist(), t.column("partition_id").to_pylist(), strict=True))


def _key_codes(t: pa.Table, sizes: Mapping[str, int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Each row's partition as one integer (its group's rank among ``sizes``' groups x MAX_PARTITIONS + its
    partition id) and whether it is in range (a running group, a partition id below the group's count)."""
    names = sorted(sizes)
    rank = np.asarray(pc.fill_null(pc.index_in(t.column("group_name"), pa.array(names, pa.string())), -1),
                      dtype=np.int64)
    pid = np.asarray(pc.fill_null(t.column("partition_id").cast(pa.int64()), -1), dtype=np.int64)
    limit = np.asarray([sizes[g] for g in names] + [0], dtype=np.int64)[rank]
    return rank * MAX_PARTITIONS + pid, (rank >= 0) & (pid >= 0) & (pid < limit)


def _keys_of(keys: Iterable[tuple[str, int]], sizes: Mapping[str, int]) -> npt.NDArray[np.int64]:
    rank = {g: i for i, g in enumerate(sorted(sizes))}
    return np.array([rank[g] * MAX_PARTITIONS + p for g, p in keys if g in rank], dtype=np.int64)


def _in_groups(t: pa.Table, names: Iterable[str]) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(pc.is_in(t.column("group_name"), pa.array(sorted(names), pa.string())), False),
                      dtype=bool)


def _unsettled_mask(t: pa.Table, u: _Unsettled, sizes: Mapping[str, int]) -> pa.Array:
    """:meth:`_Selection.unsettled` over an Arrow table: rows of the recomputed partitions."""
    code, in_range = _key_codes(t, sizes)
    if u.everything:
        return pa.array(in_range)
    return pa.array(in_range & (_in_groups(t, u.groups) | np.isin(code, _keys_of(u.keys, sizes))))


def _settled_mask(t: pa.Table, u: _Unsettled, sizes: Mapping[str, int]) -> pa.Array:
    """:meth:`_Selection.settled` over an Arrow table: rows of the carried groups' settled partitions."""
    code, in_range = _key_codes(t, sizes)
    carried = _in_groups(t, set(sizes) - set(u.groups))
    return pa.array(in_range & carried & ~np.isin(code, _keys_of(u.keys, sizes)))


def _tagged_arrow(t: pa.Table, kind: int) -> pa.Table:
    """:func:`tagged` over an Arrow table: every :data:`INPUT_SCHEMA` column (missing ones null)."""
    n = t.num_rows
    columns = []
    for f in INPUT_SCHEMA:
        if f.name == "kind":
            columns.append(pa.array(np.full(n, kind, np.int8)))
        elif f.name in t.column_names:
            columns.append(t.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=INPUT_SCHEMA)


def _versioned_arrow(rows: pa.Table, name: str, version: tuple[int, int]) -> pa.Table:
    """``rows`` as the versioned table ``name``'s rows at ``version`` (its columns in order, missing ones null)."""
    schema = _arrow(OUTPUT_TABLES[name])
    n = rows.num_rows
    data = {"topology_major": pa.array(np.full(n, version[0], np.int64)),
            "topology_minor": pa.array(np.full(n, version[1], np.int32))}
    for f in schema:
        if f.name not in VERSION_COLUMNS:
            data[f.name] = rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type)
    return pa.table(data).cast(schema)


def _release(out: DataFrame | pa.Table | None) -> None:
    if isinstance(out, DataFrame):
        out.unpersist()


def tagged(df: DataFrame, kind: int, keep: Sequence[str] = ()) -> DataFrame:
    """``df`` as kernel input rows of ``kind``: every :data:`INPUT_SCHEMA` column, in order (missing ones null),
    after the columns named in ``keep``."""
    from pyspark.sql.pandas.types import from_arrow_type

    columns = [F.col(c) for c in keep]
    for f in INPUT_SCHEMA:
        if f.name == "kind":
            columns.append(F.lit(kind).cast("byte").alias("kind"))
        elif f.name in df.columns:
            columns.append(F.col(f.name).cast(from_arrow_type(f.type)).alias(f.name))
        else:
            columns.append(F.lit(None).cast(from_arrow_type(f.type)).alias(f.name))
    return df.select(*columns)


def _split_small(collected: pa.Table) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """The collected long rows split into the small decision tables, and the summary counts summed."""
    kinds = collected.column("kind")
    tables = {}
    for name in _SMALL_KINDS:
        schema = DECISION_SCHEMAS[name]
        rows = collected.filter(pc.equal(kinds, KINDS[name])).select(schema.names)
        tables[name] = rows.cast(schema)
    summaries = collected.filter(pc.equal(kinds, SUMMARY))
    counts = {c: int(pc.sum(summaries.column(c)).as_py() or 0) for c in SUMMARY_COLUMNS if c != "max_report_seq"}
    counts["max_report_seq"] = int(pc.max(summaries.column("max_report_seq")).as_py() or -1) if summaries.num_rows \
        else -1
    return tables, counts


def _placing(alive: Mapping[str, NodeInfo], cluster: ClusterState) -> tuple[frozenset[str] | None, frozenset[str],
                                                                           bool]:
    """What of the cluster state decides placements and plans beyond the alive servers: a baseline that is not
    simply the alive servers (auto-adjust makes it so after every node event), the draining nodes, activity."""
    servers = placement_servers(alive, cluster.draining)
    baseline = None if cluster.baseline is None or cluster.baseline == servers else cluster.baseline
    return baseline, cluster.draining, cluster.active


def placed_onto(matrix: npt.NDArray[np.int32], nodes: Sequence[str], alive: Sequence[str]) -> npt.NDArray[np.int32]:
    """A matrix of indexes into ``nodes`` (node ids) as indexes into ``alive``: a node that is not alive leaves its
    slot, and each row's alive nodes move up in order (so column 0 is the first alive one: the ideal primary). A
    group's placement is this of its ``KernelContext.listed`` matrix whenever it has one."""
    where = {n: i for i, n in enumerate(alive)}
    to_alive = np.array([where.get(n, -1) for n in nodes] + [-1], dtype=np.int32)
    mapped = to_alive[np.where(matrix >= 0, matrix, len(nodes))]
    order = np.argsort(mapped < 0, axis=1, kind="stable")
    return np.take_along_axis(mapped, order, axis=1)


def _balanced_placements(groups: Mapping[str, GroupSettings], nodes: NodeSet, spread: bool,
                         previous: PreviousPlacement | None) -> dict[str, Any]:
    """The replica matrices of the running ``balanced`` groups, placed together on the driver (the kernel's tasks
    get them in their context: the placement is a function of every balanced group, not of one partition), continuing
    from ``previous``."""
    balanced = [BalancedGroup(s.name, s.partitions, s.backups, s.mode, s.exclude_neighbors, s.backup_filter)
                for s in groups.values() if s.affinity == BALANCED]
    return assign_balanced(balanced, nodes, spread=spread, previous=previous) if balanced and len(nodes) else {}
