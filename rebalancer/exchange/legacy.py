"""The exchange job: read pending events and new reports, commit one or more topology versions.

Order of work for each exchange (each step is a pure stage; this module only wires them and does the I/O):

1. validate inputs (bad rows -> ``rejected_rows``, once each), plan exchanges from pending events
   (:mod:`rebalancer.exchange.events`);
2. ideal assignment of the running groups over alive servers (:mod:`rebalancer.affinity.ideal`);
3. full map: previous map on alive nodes + reports newer than the previous version consumed
   (:mod:`rebalancer.exchange.fullmap`);
4. reset of lost partitions, counter validation, loss decisions (:mod:`counters`, :mod:`lost`);
5. late affinity (:mod:`late_affinity`), MOVING rows for ideal nodes without a copy, surplus copies RENTING;
6. the migration plan: COPY/PROMOTE/DROP steps (:mod:`rebalancer.planning.planner`, with the COPY demands of
   :mod:`demands`), scheduled under the cost model (:mod:`rebalancer.planning.schedule`); partition versions and
   stamps (:mod:`rebalancer.planning.versions`); the client routing map (:mod:`routing`);
7. write every output for the version (replacing rows a crashed run may have left), then the ``exchanges`` row.

A version exists for readers only once its ``exchanges`` row is committed; a re-run after a crash recomputes the
same version from the same inputs and replaces its partial rows, so nothing is duplicated. Two runs racing for
the same version: the second to commit its ``exchanges`` row fails with :class:`ExchangeConflictError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.affinity.ideal import ideal_assignment
from rebalancer.config import Settings
from rebalancer.exchange import counters, demands, fullmap, late_affinity, lost, routing, settled
from rebalancer.exchange.events import (
    Event,
    ExchangeStep,
    NodeInfo,
    Rejection,
    TopologyState,
    coordinator_of,
    late_events,
    plan_exchanges,
)
from rebalancer.exchange.fullmap import PARTITION_KEY
from rebalancer.frames import at_version, scalar
from rebalancer.planning import planner, versions
from rebalancer.storage import Warehouse
from rebalancer.tables import EXCHANGES, INPUT_TABLES, OUTPUT_TABLES, REJECTED_ROWS, VERSION_COLUMNS
from rebalancer.validation import InvalidInputError, validate_inputs, with_defaults

__all__ = ["ExchangeConflictError", "ExchangeSummary", "current_map", "run_exchange"]

# Tables that hold one complete copy per committed version (everything but exchanges and rejected_rows).
VERSIONED_TABLES = tuple(n for n in OUTPUT_TABLES if n not in ("exchanges", "rejected_rows"))


class ExchangeConflictError(RuntimeError):
    """Another exchange committed the same topology version first."""


@dataclass(frozen=True)
class ExchangeSummary:
    """What one committed exchange did, for people (the CLI prints it) and for tests."""

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
    # Wall seconds per stage (see STAGES); the first exchange of a run also carries the shared "inputs" time.
    stage_seconds: dict[str, float] = field(default_factory=dict, compare=False)


# The stages an exchange's wall time is split into, in the order they run. Each stage materialises its result before
# the next starts, so its Spark work lands in its own entry; "writes" also computes the small lazy outputs (client
# routing, stamps) while writing them.
STAGES = (
    "inputs", "affinity", "settled", "full map", "counters", "loss", "late affinity", "plan", "schedule", "versions",
    "counts", "writes", "commit",
)


class _StageClock:
    """Accumulates wall seconds per stage name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class _Committed:
    """The last committed version as the next exchange needs it."""

    exchange_id: int
    state: TopologyState
    last_event_seq: int
    max_report_seq: int | None


def _with_version(df: DataFrame, major: int, minor: int) -> DataFrame:
    return df.select(
        F.lit(major).cast("long").alias("topology_major"), F.lit(minor).cast("int").alias("topology_minor"), "*"
    )


def _last_committed(warehouse: Warehouse) -> _Committed | None:
    last = warehouse.read("exchanges").orderBy(F.col("exchange_id").desc()).limit(1).collect()
    if not last:
        return None
    row = last[0]
    last_event_seq = scalar(warehouse.read("exchanges").agg(F.max(F.array_max("merged_event_seqs"))))
    topology = at_version(warehouse.read("topology"), (row.topology_major, row.topology_minor)).collect()
    alive = {t.node_id: NodeInfo(int(t.node_order), bool(t.is_client)) for t in topology}
    state = TopologyState(row.topology_major, row.topology_minor, alive, frozenset(row.running_groups or []))
    return _Committed(row.exchange_id, state, int(last_event_seq or 0), row.max_report_seq)


def _record_rejections(warehouse: Warehouse, rejected_df: DataFrame) -> int:
    """Append rejected rows not already recorded (a bad row is reported once, by the first exchange that saw it)."""
    existing = warehouse.read("rejected_rows").select("table_name", "row_json", "reason")
    new = rejected_df.join(existing, ["table_name", "row_json", "reason"], "left_anti").cache()
    count = new.count()
    if count:
        warehouse.append("rejected_rows", new.select(*REJECTED_ROWS.fieldNames()))
    new.unpersist()
    return count


def _event_rejections(spark: SparkSession, rejections: list[Rejection], exchange_id: int) -> DataFrame:
    rows = [
        (
            "topology_events",
            json.dumps({"event_seq": r.event.event_seq, "event_type": r.event.event_type,
                        "node_id": r.event.node_id, "group_name": r.event.group_name}),
            r.reason,
            exchange_id,
        )
        for r in rejections
    ]
    return spark.createDataFrame(rows, REJECTED_ROWS)


def _late_events(warehouse: Warehouse, events_df: DataFrame, last_seq: int) -> list[Rejection]:
    """Valid events at or below the newest merged seq that no exchange merged or rejected: they would never apply."""
    if last_seq <= 0:
        return []
    merged_df = warehouse.read("exchanges").select(F.explode("merged_event_seqs").alias("event_seq"))
    rejected_df = (
        warehouse.read("rejected_rows")
        .where(F.col("table_name") == "topology_events")
        .select(F.get_json_object("row_json", "$.event_seq").cast("long").alias("event_seq"))
    )
    late_df = events_df.where(F.col("event_seq") <= last_seq).join(
        merged_df.unionByName(rejected_df), "event_seq", "left_anti"
    )
    late = [Event(r.event_seq, r.event_type, r.node_id, r.group_name) for r in late_df.collect()]
    return late_events(late, last_seq)


def _materialize(df: DataFrame) -> DataFrame:
    """Compute ``df`` once and cut its lineage (stages downstream read it several times)."""
    return df.localCheckpoint(eager=True)


def _groups_frame(spark: SparkSession, names: frozenset[str]) -> DataFrame:
    return spark.createDataFrame([(g,) for g in sorted(names)], "group_name string")


def _previous(warehouse: Warehouse, prev: _Committed | None, name: str) -> DataFrame:
    """Table ``name`` at the previous committed version, without version columns (empty before the first)."""
    df = warehouse.read(name).drop("wal_history_counter")  # a column the multi-stage path never wrote
    if prev is None:
        return df.limit(0).drop(*VERSION_COLUMNS)
    return at_version(df, (prev.state.major, prev.state.minor))


@dataclass(frozen=True)
class _Inputs:
    """What every exchange of one run reads: validated inputs with SPEC defaults, and the newest report seq."""

    nodes: DataFrame
    groups: DataFrame
    reports: DataFrame
    max_report_seq: int | None


def _compute(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    inputs: _Inputs,
    step: ExchangeStep,
    prev: _Committed | None,
    alive_df: DataFrame,
    timer: _StageClock,
    carry_settled: bool,
) -> tuple[dict[str, DataFrame], dict[str, int], dict[str, float]]:
    """Every output of one data-affecting exchange (the call order of docs/EXCHANGE.md), and its summary counts.

    With ``carry_settled`` the stages run only on the partitions :mod:`rebalancer.exchange.settled` finds unsettled;
    the previous rows of the others are carried into ``partition_map``, ``affinity_assignment`` and
    ``partition_versions`` (settled partitions have no conflict, loss or plan step). The counts are the same either
    way: settled partitions have no MOVING copy and no temporary primary.
    """
    stage = timer.stage
    groups_df = inputs.groups.join(F.broadcast(_groups_frame(spark, step.groups)), "group_name")
    alive_nodes_df = inputs.nodes.join(F.broadcast(alive_df.select("node_id")), "node_id")
    with stage("affinity"):
        ideal_df = _materialize(ideal_assignment(alive_nodes_df, groups_df, settings.affinity))
    reset_groups_df = _groups_frame(spark, step.reset_groups)
    new_groups_df = _groups_frame(spark, step.new_groups)
    prev_max = prev.max_report_seq if prev else None
    prev_tables = {
        name: _previous(warehouse, prev, name)
        for name in ("partition_map", "affinity_assignment", "lost_partitions", "partition_versions")
    }
    full_ideal_df = ideal_df
    carry: _Carry | None = None
    if prev is not None and carry_settled:
        with stage("settled"):
            carry = _settle(spark, warehouse, inputs, step, prev, ideal_df, groups_df, prev_tables)
            # From here on the stages see only the unsettled partitions (each input restricted once, not at every
            # reference); the settled ones are carried over at the end.
            prev_tables = {
                name: _materialize(df.join(carry.unsettled, list(PARTITION_KEY), "left_semi"))
                for name, df in prev_tables.items()
            }
            ideal_df = _materialize(ideal_df.join(carry.unsettled, list(PARTITION_KEY), "left_semi"))
    prev_map_df = prev_tables["partition_map"]
    prev_assignment_df = prev_tables["affinity_assignment"].drop("is_temporary")
    prev_lost_df = prev_tables["lost_partitions"]

    prev_owned_df = prev_map_df.where(F.col("state") == "OWNING").select("group_name", "partition_id").distinct()
    with stage("full map"):
        map_df = fullmap.base_map(prev_map_df, inputs.reports, alive_df, groups_df, prev_max)
        map_df = _materialize(lost.apply_reset(map_df, reset_groups_df))
    with stage("counters"):
        conflicts_df = _materialize(counters.find_counter_conflicts(map_df))
        map_df = counters.apply_counter_resets(map_df)
    with stage("loss"):
        lost_df = _materialize(
            lost.find_lost(map_df, prev_owned_df, prev_lost_df, groups_df, reset_groups_df, new_groups_df)
        )
        map_df = _materialize(
            lost.apply_loss_decisions(
                map_df, lost_df, ideal_df, new_groups_df, reset_groups_df, groups_df,
                prev_map_df.select("group_name", "partition_id"),
            )
        )
    with stage("late affinity"):
        assignment_df = _materialize(late_affinity.late_affinity(ideal_df, prev_assignment_df, map_df, alive_df))
        map_df = late_affinity.surplus_to_renting(map_df, assignment_df, ideal_df)
        map_df = _materialize(demands.add_moving_targets(map_df, ideal_df))
    migration = settings.migration
    with stage("plan"):
        steps_df = _materialize(
            planner.plan_migrations(
                ideal_df,
                assignment_df,
                map_df,
                inputs.reports,
                history_threshold=settings.rebalance.history_threshold,
                full_rebalance=migration.full_rebalance,
                file_chunk_bytes=migration.file_chunk_bytes,
            )
        )
    with stage("schedule"):
        plan_df = _materialize(planner.schedule_plan(steps_df, planner.cost_model(migration), "ours"))
    with stage("versions"):
        versions_df = _materialize(
            versions.partition_versions(prev_tables["partition_versions"], prev_assignment_df, assignment_df)
        )
    computed = {"partition_map": map_df, "affinity_assignment": assignment_df, "partition_versions": versions_df}
    complete = dict(computed)
    if carry is not None:
        complete = {name: df.unionByName(carry.rows[name]) for name, df in computed.items()}
    stamps_df = versions.partition_stamps(complete["partition_versions"], groups_df)
    assignment_done = complete["affinity_assignment"]
    mappings = routing.fold(routing.routing_digests(assignment_done).toArrow().to_pylist(),
                            [r.asDict() for r in groups_df.collect()])
    routing_df = routing.client_affinity(assignment_done, mappings)

    with stage("counts"):
        plan_totals = plan_df.agg(
            F.count(F.lit(1)),
            F.coalesce(F.sum("bytes"), F.lit(0)),
            F.coalesce(F.max("est_end_s"), F.lit(0.0)),
            F.coalesce(F.max("plan_lower_bound_s"), F.lit(0.0)),
        ).collect()[0]
        counts = {
            "partitions": int(scalar(groups_df.agg(F.coalesce(F.sum("partitions"), F.lit(0))))),
            "lost_partitions": lost_df.count(),
            "moving_copies": map_df.where(F.col("state") == "MOVING").count(),
            "temporary_primaries": assignment_df.where(
                F.col("is_temporary") & (F.col("replica_index") == 0)
            ).count(),
            "counter_conflicts": conflicts_df.count(),
            "migrations": int(plan_totals[0]),
            "bytes_to_move": int(plan_totals[1]),
        }
    plan_times = {"makespan_s": float(plan_totals[2]), "makespan_lower_bound_s": float(plan_totals[3])}
    outputs = {
        **complete,
        "ideal_assignment": full_ideal_df,
        "counter_conflicts": conflicts_df,
        "lost_partitions": lost_df,
        "migration_plan": plan_df,
        "client_affinity": routing_df,
        "partition_stamps": stamps_df,
    }
    return outputs, counts, plan_times


@dataclass(frozen=True)
class _Carry:
    """The unsettled partitions of an exchange and the previous rows of the settled ones, per carried table."""

    unsettled: DataFrame
    rows: dict[str, DataFrame]


def _settle(
    spark: SparkSession,
    warehouse: Warehouse,
    inputs: _Inputs,
    step: ExchangeStep,
    prev: _Committed,
    ideal_df: DataFrame,
    groups_df: DataFrame,
    prev_tables: dict[str, DataFrame],
) -> _Carry:
    carried_groups_df = _groups_frame(spark, (prev.state.groups & step.groups) - step.reset_groups - step.new_groups)
    new_reports_df = inputs.reports
    if prev.max_report_seq is not None:
        new_reports_df = new_reports_df.where(F.col("report_seq") > F.lit(prev.max_report_seq))
    # Broadcast where it restricts or carries a table: it is a few partitions in a steady cluster, and at worst
    # (every partition of a started group) one narrow row per partition.
    unsettled_df = F.broadcast(_materialize(
        settled.unsettled_partitions(
            ideal_df,
            prev_tables["partition_map"],
            prev_tables["affinity_assignment"],
            prev_tables["lost_partitions"],
            _previous(warehouse, prev, "counter_conflicts"),
            new_reports_df,
            carried_groups_df,
        )
    ))
    rows = {
        name: settled.carried(prev_tables[name], unsettled_df, groups_df, carried_groups_df)
        for name in ("partition_map", "affinity_assignment", "partition_versions")
    }
    return _Carry(unsettled_df, rows)


def _current_map(
    spark: SparkSession, warehouse: Warehouse, groups_df: DataFrame, reports_df: DataFrame, prev: _Committed
) -> DataFrame:
    """The committed map overridden by the reports it has not consumed yet, counter rule applied."""
    groups_df = groups_df.join(F.broadcast(_groups_frame(spark, prev.state.groups)), "group_name")
    prev_map_df = _previous(warehouse, prev, "partition_map")
    map_df = fullmap.base_map(prev_map_df, reports_df, _alive_frame(spark, prev.state), groups_df,
                              prev.max_report_seq)
    return counters.apply_counter_resets(map_df)


def current_map(spark: SparkSession, warehouse: Warehouse) -> tuple[tuple[int, int], DataFrame] | None:
    """The latest committed version and its map as the nodes' newest reports make it now (None: no version).

    This is what the next exchange would start from: the committed ``partition_map`` on the version's alive nodes,
    overridden by every valid report newer than the version's ``max_report_seq``, after the counter rule.
    Nothing is written (rejected rows are recorded by the exchange that consumes them).
    """
    prev = _last_committed(warehouse)
    if prev is None:
        return None
    valid = validate_inputs({name: warehouse.read_raw(name) for name in INPUT_TABLES}, exchange_id=None).valid
    groups_df = with_defaults("cache_groups", valid["cache_groups"])
    map_df = _current_map(spark, warehouse, groups_df, valid["partition_reports"], prev)
    return (prev.state.major, prev.state.minor), map_df


def _switch_is_due(
    spark: SparkSession, warehouse: Warehouse, inputs: _Inputs, prev: _Committed
) -> bool:
    """Whether the committed assignment has temporary primaries whose ideal nodes now all own their copies."""
    prev_map_df = _previous(warehouse, prev, "partition_map")
    map_df = _current_map(spark, warehouse, inputs.groups, inputs.reports, prev)
    due = late_affinity.switch_due(
        _previous(warehouse, prev, "ideal_assignment"),
        _previous(warehouse, prev, "affinity_assignment"),
        map_df,
        prev_map_df,
    ).first()
    return bool(due is not None and due["due"])


def _alive_frame(spark: SparkSession, state: TopologyState) -> DataFrame:
    return spark.createDataFrame(
        [(n, i.node_order, i.is_client) for n, i in sorted(state.alive.items())],
        "node_id string, node_order bigint, is_client boolean",
    )


def run_exchange(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    fault_hook: Callable[[str], None] | None = None,
    *,
    carry_settled: bool = True,
) -> list[ExchangeSummary]:
    """Process every pending event and the latest reports; commit the resulting versions.

    Args:
        spark: the session.
        warehouse: where inputs are read and outputs written.
        settings: rebalance threshold, validation strictness, affinity settings.
        clock: the time source for ``started_at``/``finished_at`` (tests pin it).
        fault_hook: called with a point name after each write (tests inject crashes here).
        carry_settled: recompute only the unsettled partitions and carry the others over
            (:mod:`rebalancer.exchange.settled`); False recomputes every partition (tests compare the two).

    Returns:
        One summary per committed exchange, in commit order (empty when nothing was due).

    Raises:
        ExchangeConflictError: another run committed the same exchange first.
        InvalidInputError: strict validation found bad input rows.
        InputSchemaError: an input table misses a column or has one of an unusable type.
    """
    hook = fault_hook or (lambda _point: None)
    inputs_timer = _StageClock()
    with inputs_timer.stage("inputs"):
        inputs, committed, steps = _prepare(spark, warehouse, settings)
    summaries: list[ExchangeSummary] = []
    prev = committed
    for step in steps:
        timer = _StageClock()
        if not summaries:
            timer.seconds.update(inputs_timer.seconds)
        summary = _commit(spark, warehouse, settings, inputs, step, prev, clock, hook, timer, carry_settled)
        summaries.append(summary)
        prev = _Committed(
            summary.exchange_id,
            TopologyState(step.major, step.minor, step.alive, step.groups),
            max(step.merged_event_seqs, default=prev.last_event_seq if prev else 0),
            _consumed_report_seq(step, prev, inputs),
        )
    for df in (inputs.nodes, inputs.groups):  # the cached inputs (reports are read from validation's checkpoint)
        df.unpersist()
    return summaries


def _prepare(
    spark: SparkSession, warehouse: Warehouse, settings: Settings
) -> tuple[_Inputs, _Committed | None, list[ExchangeStep]]:
    """Validate the inputs (recording rejected rows and events), and plan the exchanges that are due."""
    warehouse.create_tables()
    raw = {name: warehouse.read_raw(name) for name in INPUT_TABLES}
    prior = scalar(warehouse.read("exchanges").agg(F.max("exchange_id"))) or 0
    validated = validate_inputs(raw, exchange_id=prior + 1, strict=settings.validation.strict, persist=True)
    _record_rejections(warehouse, validated.rejected)
    valid = validated.valid
    nodes_df = with_defaults("nodes", valid["nodes"]).cache()
    groups_df = with_defaults("cache_groups", valid["cache_groups"]).cache()
    # No cache: validation already checked every report once (persist=True); this is a filter of those rows.
    reports_df = valid["partition_reports"]
    node_catalog = {
        r.node_id: NodeInfo(int(r.node_order), bool(r.is_client))
        for r in nodes_df.select("node_id", "node_order", "is_client").collect()
    }
    group_catalog = [r.group_name for r in groups_df.select("group_name").collect()]
    committed = _last_committed(warehouse)
    state = committed.state if committed else TopologyState()
    last_seq = committed.last_event_seq if committed else 0
    pending = [
        Event(r.event_seq, r.event_type, r.node_id, r.group_name)
        for r in valid["topology_events"].where(F.col("event_seq") > last_seq).collect()
    ]
    steps, rejections = plan_exchanges(state, pending, node_catalog, group_catalog)
    rejections = _late_events(warehouse, valid["topology_events"], last_seq) + rejections
    if rejections and settings.validation.strict:
        raise InvalidInputError.of(
            {"topology_events": len(rejections)}, {"topology_events": [r.reason for r in rejections]}
        )
    if rejections:
        _record_rejections(warehouse, _event_rejections(spark, rejections, prior + 1))
    inputs = _Inputs(
        nodes=nodes_df,
        groups=groups_df,
        reports=reports_df,
        max_report_seq=scalar(reports_df.agg(F.max("report_seq"))),
    )
    if not steps and committed is not None and _switch_is_due(spark, warehouse, inputs, committed):
        steps = [
            ExchangeStep(
                state.major, state.minor + 1, "LATE_AFFINITY_SWITCH", (), state.alive, state.groups,
                coordinator=coordinator_of(state.alive),
            )
        ]
    return inputs, committed, steps


def _consumed_report_seq(step: ExchangeStep, prev: _Committed | None, inputs: _Inputs) -> int | None:
    """The ``max_report_seq`` a version records: the newest report it applied.

    A ``NONE`` exchange repeats the previous placement and applies no report, so it keeps the previous value;
    recording the newest one would make the next exchange skip reports that no map ever applied.
    """
    if step.exchange_type == "NONE" and prev is not None:
        return prev.max_report_seq
    return inputs.max_report_seq


def _commit(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    inputs: _Inputs,
    step: ExchangeStep,
    prev: _Committed | None,
    clock: Callable[[], datetime],
    hook: Callable[[str], None],
    timer: _StageClock,
    carry_settled: bool,
) -> ExchangeSummary:
    started = clock()
    t0 = time.perf_counter()
    exchange_id = (prev.exchange_id if prev else 0) + 1
    major, minor = step.major, step.minor
    alive_df = _alive_frame(spark, TopologyState(major, minor, step.alive, step.groups))
    if step.exchange_type == "NONE" and prev is not None:
        # Clients joined or left: no data work; the version repeats the previous one's placement.
        outputs = {name: _previous(warehouse, prev, name) for name in VERSIONED_TABLES if name != "topology"}
        counts, plan_times = _previous_counts(warehouse, prev)
    else:
        outputs, counts, plan_times = _compute(
            spark, warehouse, settings, inputs, step, prev, alive_df, timer, carry_settled
        )
    outputs["topology"] = alive_df
    for name in VERSIONED_TABLES:
        with timer.stage("writes"):
            frame = _with_version(outputs[name], major, minor)
            if name == "partition_map" and "wal_history_counter" not in frame.columns:
                frame = frame.withColumn("wal_history_counter", F.lit(None).cast("long"))
            warehouse.replace_where(
                name,
                frame.select(*OUTPUT_TABLES[name].fieldNames()),
                {"topology_major": major, "topology_minor": minor},
            )
        hook(f"after:{name}")
    servers = sum(1 for i in step.alive.values() if not i.is_client)
    summary = ExchangeSummary(
        exchange_id=exchange_id,
        topology_major=major,
        topology_minor=minor,
        exchange_type=step.exchange_type,
        merged_event_seqs=step.merged_event_seqs,
        coordinator=step.coordinator,
        alive_servers=servers,
        alive_clients=len(step.alive) - servers,
        seconds=time.perf_counter() - t0,
        makespan_s=plan_times.get("makespan_s", 0.0),
        makespan_lower_bound_s=plan_times.get("makespan_lower_bound_s", 0.0),
        stage_seconds=timer.seconds,
        **counts,
    )
    with timer.stage("commit"):
        _commit_exchange_row(
            spark, warehouse, summary, step, _consumed_report_seq(step, prev, inputs), started, clock()
        )
    hook("after:exchanges")
    for df in outputs.values():
        df.unpersist()
    return summary


_COUNT_FIELDS = (
    "partitions", "lost_partitions", "moving_copies", "temporary_primaries", "counter_conflicts", "migrations",
    "bytes_to_move",
)


def _previous_counts(warehouse: Warehouse, prev: _Committed) -> tuple[dict[str, int], dict[str, float]]:
    row = warehouse.read("exchanges").where(F.col("exchange_id") == prev.exchange_id).first()
    if row is None:
        return {}, {}
    counts = {name: int(row[name] or 0) for name in _COUNT_FIELDS}
    return counts, {name: float(row[name] or 0.0) for name in ("makespan_s", "makespan_lower_bound_s")}


def _commit_exchange_row(
    spark: SparkSession,
    warehouse: Warehouse,
    s: ExchangeSummary,
    step: ExchangeStep,
    max_report_seq: int | None,
    started: datetime,
    finished: datetime,
) -> None:
    """Commit the ``exchanges`` row: the moment the version starts to exist for readers.

    Insert-if-absent on ``exchange_id`` (concurrent merges into one table conflict, and the loser re-runs against
    the winner's row); reading the row back tells this run whether its row or a rival's was committed.
    """
    row = (
        s.exchange_id, s.topology_major, s.topology_minor, s.exchange_type, list(s.merged_event_seqs),
        s.coordinator, max_report_seq, started, finished, sorted(step.groups), s.alive_servers, s.alive_clients,
        s.partitions, s.lost_partitions, s.moving_copies, s.temporary_primaries, s.counter_conflicts,
        s.migrations, s.bytes_to_move, s.makespan_s, s.makespan_lower_bound_s, None, None, None,
    )
    warehouse.merge("exchanges", spark.createDataFrame([row], EXCHANGES), keys=["exchange_id"], insert_only=True)
    committed = warehouse.read("exchanges").where(F.col("exchange_id") == s.exchange_id).collect()
    # PySpark returns naive local datetimes; compare instants, not representations.
    if len(committed) != 1 or abs(committed[0].started_at.timestamp() - started.timestamp()) > 1e-6:
        raise ExchangeConflictError(
            f"exchange {s.exchange_id} (version {s.topology_major}.{s.topology_minor}) was committed by another "
            "run while this one worked; nothing was duplicated, run `rebalancer exchange` again to continue"
        )
