"""The twin: executes the committed migration plan as the nodes would, by writing their partition reports.

The planner's rows are data; the twin is the only thing that "executes" them (``rebalancer simulate``). One
*round* works on the latest committed version:

1. Pending events first: :func:`~rebalancer.exchange.job.run_exchange` runs (it commits nothing when no event is
   pending and no switch is due), so the plan executed is always the newest one.
2. The executable steps of the plan: every step of a partition before its ``PROMOTE``. A PROMOTE is the primary
   switch, which Ignite performs for all partitions at once in the ``LATE_AFFINITY_SWITCH`` exchange; the twin
   does not fake it with a report but lets the exchange install it, so the DROPs after it wait for the next round's
   plan (where the switch has made the surplus copies RENTING). With ``fail_node``/``at_wave`` only the steps of
   waves ``< at_wave`` run in the first round.
   Steps whose effect the newest reports already show are skipped (:func:`not_yet_applied`), so a round run again
   after a crash reports nothing twice.
3. Reports, one append, ``report_seq`` in the order the steps finish (``est_end_s``, then ``migration_id``):
   a COPY turns its target OWNING with the plan's ``to_counter`` and the supplier copy's ``size`` and ``bytes``
   (its WAL history starts at that counter); a DROP turns the copy EVICTED (size and bytes 0), which removes it
   from the next map. PROMOTE writes nothing.
4. The injected failure, if any: a ``NODE_FAILED`` event for ``fail_node``, after the reports of the steps that
   finished before it.
5. ``run_exchange`` again: it consumes the reports (and the failure), and commits the switch once every waiting
   partition's ideal nodes own. A failure produces a new version with a new plan; the next round executes it.

:func:`stability` says whether the cluster is *stable*: the committed serving assignment equals the ideal one,
every ideal copy is OWNING and no copy lies outside the ideal nodes, judged on the committed map overridden by the
newest reports (an eviction shows in ``partition_map`` only at the next committed version, as in Ignite, where a
RENTING copy is gone before any exchange records it), and no partition is lost (a lost partition waits for
``RESET_LOST_PARTITIONS``; the twin never resets on its own). ``until_stable`` repeats rounds until the cluster is
stable or a round changes nothing (the twin is stuck: lost partitions, or data no node can supply).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from rebalancer.config import Settings
from rebalancer.frames import at_version, scalar
from rebalancer.inputs import last_committed
from rebalancer.operations import append_event, latest_committed_version
from rebalancer.pipeline import ExchangeSummary, run_exchange
from rebalancer.storage import Warehouse
from rebalancer.tables import PARTITION_REPORTS
from rebalancer.vocabulary import COPY, COPY_KEY, DROP, EVICTED, MOVING, OWNING, PARTITION_KEY, PROMOTE

__all__ = [
    "Stability", "TwinError", "TwinResult", "TwinRound", "executable_steps", "not_yet_applied", "reports_for",
    "simulate", "stability",
]



class TwinError(RuntimeError):
    """The twin cannot run (no committed version, or an invalid failure injection)."""


@dataclass(frozen=True)
class Stability:
    """How far the latest committed version is from stable (all counts 0 = stable)."""

    version: tuple[int, int]
    assignment_differences: int  # serving-assignment rows that differ from the ideal assignment
    ideal_not_owning: int  # ideal copies that are not OWNING
    surplus_copies: int  # copies on nodes outside the partition's ideal list
    lost_partitions: int

    @property
    def stable(self) -> bool:
        return not (self.assignment_differences or self.ideal_not_owning or self.surplus_copies
                    or self.lost_partitions)


@dataclass(frozen=True)
class TwinRound:
    """What one round did."""

    version: tuple[int, int]  # the version whose plan was executed
    copies: int
    drops: int
    waiting_promotions: int  # PROMOTE steps left to the switch exchange
    failed_node: str | None
    exchanges: tuple[ExchangeSummary, ...]

    @property
    def changed_anything(self) -> bool:
        return bool(self.copies or self.drops or self.failed_node or self.exchanges)


@dataclass(frozen=True)
class TwinResult:
    rounds: tuple[TwinRound, ...] = field(default_factory=tuple)
    stability: Stability | None = None


def executable_steps(plan_df: DataFrame, before_wave: int | None = None) -> DataFrame:
    """The steps of ``plan_df`` the twin runs now: each partition's steps before its first PROMOTE.

    Args:
        plan_df: one version's ``migration_plan`` (version columns optional).
        before_wave: keep only steps of waves ``< before_wave`` (None: all).
    """
    part = list(PARTITION_KEY)
    promote_df = plan_df.where(F.col("action") == PROMOTE).groupBy(*part).agg(F.min("step").alias("_promote_step"))
    steps_df = plan_df.join(promote_df, part, "left").where(
        F.col("_promote_step").isNull() | (F.col("step") < F.col("_promote_step"))
    )
    if before_wave is not None:
        steps_df = steps_df.where(F.col("wave") < before_wave)
    return steps_df.where(F.col("action") != PROMOTE).drop("_promote_step")


def not_yet_applied(steps_df: DataFrame, map_now_df: DataFrame) -> DataFrame:
    """``steps_df`` without the steps whose effect the newest reports already show.

    A COPY is applied once its target owns the partition at ``to_counter`` or later; a DROP once the copy has left
    the map. This makes a round idempotent: a twin that crashed after writing its reports, run again, does not
    report the same steps twice.

    Args:
        steps_df: COPY and DROP steps of one plan.
        map_now_df: the committed map overridden by the newest reports (:func:`current_map`).
    """
    part = list(PARTITION_KEY)
    owned_df = map_now_df.where(F.col("state") == OWNING).select(
        *part, F.col("node_id").alias("target_node"), F.col("update_counter").alias("_owned_counter")
    )
    held_df = map_now_df.select(*part, F.col("node_id").alias("source_node"), F.lit(True).alias("_held"))
    return (
        steps_df.join(owned_df, [*part, "target_node"], "left")
        .join(held_df, [*part, "source_node"], "left")
        .where(
            ((F.col("action") == COPY) & ~F.coalesce(F.col("_owned_counter") >= F.col("to_counter"), F.lit(False)))
            | ((F.col("action") == DROP) & F.coalesce(F.col("_held"), F.lit(False)))
        )
        .drop("_owned_counter", "_held")
    )


def reports_for(steps_df: DataFrame, map_df: DataFrame, first_seq: int) -> DataFrame:
    """The partition reports the nodes send when ``steps_df`` (COPY and DROP steps) finish.

    Args:
        steps_df: executed steps (``migration_plan`` columns).
        map_df: the map of the plan's version (suppliers' size and bytes, dropped copies' counters).
        first_seq: the ``report_seq`` of the first report; the others follow in finishing order.

    Returns:
        ``partition_reports`` rows.
    """
    copy_of = map_df.select(*COPY_KEY, "update_counter", "size", "bytes")
    # A COPY's target owns the supplier's copy at to_counter (its WAL history starts there).
    copied_df = (
        steps_df.where(F.col("action") == COPY)
        .join(
            copy_of.select(*PARTITION_KEY, F.col("node_id").alias("source_node"), F.col("size").alias("_size"),
                           F.col("bytes").alias("_bytes")),  # the plan's own bytes column is the replay size
            [*PARTITION_KEY, "source_node"],
            "left",
        )
        .select(
            F.col("target_node").alias("node_id"), *PARTITION_KEY, F.lit(OWNING).alias("state"),
            F.col("to_counter").alias("update_counter"),
            F.coalesce(F.col("_size"), F.lit(0)).alias("size"),
            F.coalesce(F.col("_bytes"), F.lit(0)).alias("bytes"),
            F.col("to_counter").alias("wal_history_counter"), "est_end_s", "migration_id",
        )
    )
    # A DROP's node evicts its copy.
    dropped_df = (
        steps_df.where(F.col("action") == DROP)
        .join(
            copy_of.select(*PARTITION_KEY, F.col("node_id").alias("source_node"), "update_counter"),
            [*PARTITION_KEY, "source_node"],
            "left",
        )
        .select(
            F.col("source_node").alias("node_id"), *PARTITION_KEY, F.lit("EVICTED").alias("state"),
            F.coalesce(F.col("update_counter"), F.lit(0)).alias("update_counter"),
            F.lit(0).cast("long").alias("size"), F.lit(0).cast("long").alias("bytes"),
            F.lit(None).cast("long").alias("wal_history_counter"), "est_end_s", "migration_id",
        )
    )
    order = Window.orderBy(F.col("est_end_s").asc_nulls_last(), "migration_id")
    out_df = copied_df.unionByName(dropped_df).withColumn(
        "report_seq", F.lit(first_seq - 1).cast("long") + F.row_number().over(order)
    )
    return out_df.select(*[F.col(f.name).cast(f.dataType) for f in PARTITION_REPORTS.fields])


def current_map(spark: SparkSession, warehouse: Warehouse) -> tuple[tuple[int, int], DataFrame] | None:
    """The latest committed version and its map as the nodes' newest reports make it now (None: no version).

    The committed ``partition_map`` on the version's alive servers, each copy replaced by its newest report
    committed after the version (EVICTED copies leave), then the counter rule (OWNING copies below the highest
    OWNING counter of their partition count as MOVING): what the next exchange would start from, for the twin
    to see which steps the reports already show. Nothing is written; the reports are not validated (the twin
    writes them itself).
    """
    committed = last_committed(warehouse)
    if committed is None:
        return None
    version = committed.version
    servers = [n for n, info in committed.state.alive.items() if not info.is_client]
    columns = [*COPY_KEY, "state", "update_counter", "size", "bytes"]
    kept_df = at_version(warehouse.read("partition_map"), version).select(*columns, F.lit(1).alias("_source"),
                                                                        F.lit(None).cast("long").alias("report_seq"))
    new_df = warehouse.changes("partition_reports", committed.input_versions.get("partition_reports")).rows
    reported_df = new_df.where(
        F.col("node_id").isin(servers) & F.col("group_name").isin(sorted(committed.state.groups))
    ).select(*columns, F.lit(0).alias("_source"), "report_seq")
    newest = Window.partitionBy(*COPY_KEY).orderBy("_source", F.col("report_seq").desc_nulls_last())
    merged_df = (
        kept_df.unionByName(reported_df)
        .withColumn("_rn", F.row_number().over(newest))
        .where((F.col("_rn") == 1) & (F.col("state") != EVICTED))
    )
    owning = F.col("state") == OWNING
    top = F.max(F.when(owning, F.col("update_counter"))).over(Window.partitionBy(*PARTITION_KEY))
    map_df = merged_df.withColumn(
        "state", F.when(owning & (F.col("update_counter") < top), F.lit(MOVING)).otherwise(F.col("state"))
    ).select(*columns)
    return version, map_df


def stability(spark: SparkSession, warehouse: Warehouse) -> Stability | None:
    """How far the latest committed version is from stable (module docstring); None before the first exchange."""
    current = current_map(spark, warehouse)
    if current is None:
        return None
    version, map_df = current
    ideal_df = at_version(warehouse.read("ideal_assignment"), version).select(*COPY_KEY, "replica_index")
    assignment_df = at_version(warehouse.read("affinity_assignment"), version).select(*COPY_KEY, "replica_index")
    # Rows present on one side only (a full outer join with side markers, one job).
    sided_df = ideal_df.withColumn("_ideal", F.lit(1)).join(
        assignment_df.withColumn("_serving", F.lit(1)), [*COPY_KEY, "replica_index"], "full"
    )
    owning_df = map_df.where(F.col("state") == OWNING).select(*COPY_KEY)
    return Stability(
        version=version,
        assignment_differences=sided_df.where(F.col("_ideal").isNull() | F.col("_serving").isNull()).count(),
        ideal_not_owning=ideal_df.select(*COPY_KEY).join(owning_df, list(COPY_KEY), "left_anti").count(),
        surplus_copies=map_df.select(*COPY_KEY).join(ideal_df.select(*COPY_KEY), list(COPY_KEY), "left_anti").count(),
        lost_partitions=at_version(warehouse.read("lost_partitions"), version).count(),
    )


def _run_round(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    fail: tuple[str, int] | None,
    clock: Callable[[], datetime],
    hook: Callable[[str], None],
) -> TwinRound:
    before = run_exchange(spark, warehouse, settings, clock=clock, fault_hook=hook)
    current = current_map(spark, warehouse)
    if current is None:
        raise TwinError("no exchange has been committed yet; run `rebalancer exchange` first")
    version, now_df = current
    plan_df = at_version(warehouse.read("migration_plan"), version)
    steps_df = not_yet_applied(executable_steps(plan_df, before_wave=fail[1] if fail else None), now_df)
    steps_df = steps_df.localCheckpoint(eager=True)
    counts = {r["action"]: int(r["n"]) for r in steps_df.groupBy("action").agg(F.count(F.lit(1)).alias("n")).collect()}
    waiting = plan_df.where(F.col("action") == PROMOTE).count()
    if counts:
        first_seq = int(scalar(warehouse.read("partition_reports").agg(F.coalesce(F.max("report_seq"), F.lit(0))))) + 1
        map_df = at_version(warehouse.read("partition_map"), version)
        warehouse.append("partition_reports", reports_for(steps_df, map_df, first_seq))
        hook("after:reports")
    failed = None
    if fail is not None:
        append_event(spark, warehouse, "NODE_FAILED", node_id=fail[0], now=clock())
        failed = fail[0]
        hook("after:event")
    after = run_exchange(spark, warehouse, settings, clock=clock, fault_hook=hook)
    steps_df.unpersist()
    return TwinRound(
        version=version,
        copies=counts.get(COPY, 0),
        drops=counts.get(DROP, 0),
        waiting_promotions=waiting,
        failed_node=failed,
        exchanges=tuple(before) + tuple(after),
    )


def simulate(
    spark: SparkSession,
    warehouse: Warehouse,
    settings: Settings,
    *,
    until_stable: bool = False,
    fail_node: str | None = None,
    at_wave: int | None = None,
    max_rounds: int = 20,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    fault_hook: Callable[[str], None] | None = None,
    on_round: Callable[[TwinRound], None] | None = None,
) -> TwinResult:
    """Run the twin: one round, or rounds until the cluster is stable (module docstring).

    Args:
        spark: the session.
        warehouse: the warehouse whose plan is executed and whose reports and events the twin appends to.
        settings: passed to every exchange.
        until_stable: repeat rounds until stable, or until a round changes nothing, at most ``max_rounds``.
        fail_node: a server to fail during the first round (with ``at_wave``).
        at_wave: the failure happens once the steps of waves ``1 .. at_wave - 1`` have finished.
        max_rounds: the most rounds ``until_stable`` runs.
        clock: the time source for events and exchanges.
        fault_hook: called with a point name after each write: the twin's (``after:reports``, ``after:event``)
            and those of the exchanges it runs (``after:<table>``); tests inject crashes and pauses here.
        on_round: called after each round (the CLI prints it).

    Raises:
        TwinError: nothing committed yet, or ``fail_node`` and ``at_wave`` not given together, or an unknown or
            dead ``fail_node``.
    """
    if (fail_node is None) != (at_wave is None):
        raise TwinError("--fail NODE and --at-wave K go together")
    if at_wave is not None and at_wave < 1:
        raise TwinError(f"--at-wave must be 1 or more, got {at_wave}")
    if fail_node is not None:
        _check_alive_server(warehouse, fail_node)
    hook = fault_hook or (lambda _point: None)
    fail = (fail_node, at_wave) if fail_node is not None and at_wave is not None else None
    rounds: list[TwinRound] = []
    for _ in range(max_rounds if until_stable else 1):
        twin_round = _run_round(spark, warehouse, settings, fail, clock, hook)
        fail = None
        rounds.append(twin_round)
        if on_round is not None:
            on_round(twin_round)
        if not twin_round.changed_anything:
            break
        if until_stable:
            status = stability(spark, warehouse)
            if status is not None and status.stable:
                return TwinResult(tuple(rounds), status)
    return TwinResult(tuple(rounds), stability(spark, warehouse))


def _check_alive_server(warehouse: Warehouse, node_id: str) -> None:
    version = latest_committed_version(warehouse)
    if version is None:
        raise TwinError("no exchange has been committed yet; run `rebalancer exchange` first")
    alive = at_version(warehouse.read("topology"), version).where(
        (F.col("node_id") == node_id) & ~F.coalesce(F.col("is_client"), F.lit(False))
    )
    if alive.limit(1).count() == 0:
        raise TwinError(f"--fail {node_id}: no alive server node {node_id!r} at version {version[0]}.{version[1]}")
