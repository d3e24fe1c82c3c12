"""Drive a live Kafka cluster with rebalancer: collect, exchange, execute the committed plan, until it is stable.

Contract (docs/KAFKA.md):
    - :func:`planned_moves` reads the newest committed version's ``migration_plan`` and ``ideal_assignment`` (driver
      reads, no Spark job) and turns them into one Kafka reassignment per partition that has steps.
    - :func:`execute_plan` applies them (:func:`rebalancer.kafka.execute.execute`: waves under
      ``[migration] max_parallel_per_node``, throttled when ``[kafka] throttle_bytes_per_s`` is set) and writes the
      progress back as reports: a collect when moves finished (at most every :data:`PROGRESS_EVERY_S`), and one at
      the end. It keeps
      no state of its own: a re-run after a kill finds the moves in flight on the cluster and the plan in Delta.
    - :func:`run` is collect -> exchange -> execute, once or (``until_stable``) until a round finds nothing left to
      move, at most ``[kafka] until_stable_rounds`` rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from rebalancer.config import Settings
from rebalancer.inputs import latest_version
from rebalancer.kafka.admin import ClusterSnapshot, read_cluster
from rebalancer.kafka.collect import CollectResult, record
from rebalancer.kafka.execute import ExecuteResult, Move, dry_run_json, execute, ideal_lists, moves_of
from rebalancer.pipeline import ExchangeSummary, run_exchange
from rebalancer.storage import Warehouse
from rebalancer.tables import version_where

__all__ = ["NotStableError", "PlannedMoves", "Round", "collect_cluster", "execute_plan", "planned_moves", "run",
           "snapshot_of"]


class NotStableError(RuntimeError):
    """``run --until-stable`` used every round it may and the cluster still moved; one sentence."""


@dataclass(frozen=True)
class PlannedMoves:
    version: tuple[int, int] | None
    moves: list[Move]
    ideal: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)  # every partition's ideal list

    def as_reassignment_json(self) -> dict[str, Any]:
        """The moves in the format ``kafka-reassign-partitions --execute`` reads."""
        return dry_run_json(self.moves)


@dataclass(frozen=True)
class Round:
    collected: CollectResult
    exchanges: list[ExchangeSummary]
    planned: PlannedMoves
    executed: ExecuteResult | None = None  # None: the cluster has no committed version yet
    collects_during: int = 0

    @property
    def stable(self) -> bool:
        """Nothing was left to move: the cluster already is what the committed plan leads to."""
        return self.executed is None or (self.executed.submitted == 0 and self.executed.resumed == 0)


# Progress is collected when moves finish, at most this often (each collect is a few admin requests and a Spark
# job), and always once at the end of an execution.
PROGRESS_EVERY_S = 5.0


@dataclass
class _Progress:
    warehouse: Warehouse
    bootstrap: str
    settings: Settings
    collects: list[CollectResult] = field(default_factory=list)
    last: float = 0.0

    def __call__(self, _finished: list[Move]) -> None:
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.final()

    def final(self) -> None:
        self.collects.append(collect_cluster(self.warehouse, self.settings, self.bootstrap))
        self.last = time.monotonic()


def _bootstrap(settings: Settings, bootstrap: str | None) -> str:
    chosen = bootstrap or settings.kafka.bootstrap
    if not chosen:
        raise ValueError("no Kafka cluster named: pass --bootstrap HOST:PORT or set [kafka] bootstrap")
    return chosen


def snapshot_of(settings: Settings, bootstrap: str | None = None) -> ClusterSnapshot:
    """The cluster at ``bootstrap`` (or ``[kafka] bootstrap``) as it is now; no warehouse needed (the CLI reads the
    cluster before it starts Spark: an unreachable cluster fails in seconds)."""
    return read_cluster(_bootstrap(settings, bootstrap), timeout_s=settings.kafka.client_timeout_s,
                        include_internal=settings.kafka.include_internal)


def collect_cluster(warehouse: Warehouse, settings: Settings, bootstrap: str | None = None,
                    snapshot: ClusterSnapshot | None = None) -> CollectResult:
    """Collect the cluster at ``bootstrap`` (or ``[kafka] bootstrap``; or ``snapshot``, already read) into the
    warehouse's input tables."""
    return record(warehouse, snapshot or snapshot_of(settings, bootstrap))


def planned_moves(warehouse: Warehouse) -> PlannedMoves:
    """The reassignments the newest committed plan asks for (none before the first exchange)."""
    version = latest_version(warehouse)
    if version is None:
        return PlannedMoves(None, [])
    where = version_where(version)
    plan = warehouse.read_arrow("migration_plan", where=where)
    ideal = warehouse.read_arrow("ideal_assignment", where=where)
    return PlannedMoves(version, moves_of(plan, ideal), ideal_lists(ideal))


def execute_plan(warehouse: Warehouse, settings: Settings, bootstrap: str | None = None,
                 planned: PlannedMoves | None = None,
                 on_poll: Callable[[dict[int, int]], None] | None = None) -> tuple[ExecuteResult, int]:
    """Apply the newest committed plan to the cluster and write its progress back as reports.

    Returns:
        What the executor did, and how many collects wrote the progress.

    Raises:
        ExecuteError: a topic of the plan is gone, the cluster is unreachable, or the moves took longer than
            ``[kafka] execute_timeout_s`` (one sentence; a re-run resumes).
    """
    address = _bootstrap(settings, bootstrap)
    planned = planned or planned_moves(warehouse)
    progress = _Progress(warehouse, address, settings)
    k = settings.kafka
    result = execute(address, planned.moves, cap=settings.migration.max_parallel_per_node,
                     throttle_bytes_per_s=k.throttle_bytes_per_s, poll_interval_s=k.poll_interval_s,
                     timeout_s=k.execute_timeout_s, client_timeout_s=k.client_timeout_s, on_done=progress,
                     on_poll=on_poll, plan_version=planned.version, ideal=planned.ideal)
    if planned.moves or result.submitted:
        progress.final()
    return result, len(progress.collects)


def run(spark: SparkSession, warehouse: Warehouse, settings: Settings, bootstrap: str | None = None, *,
        until_stable: bool = False, on_round: Callable[[Round], None] | None = None) -> list[Round]:
    """collect -> exchange -> execute, once, or until a round finds nothing to move.

    Raises:
        ExecuteError, KafkaUnreachableError, CollectError: one sentence each; what was committed stays.
        NotStableError: ``until_stable`` and the last allowed round still moved something.
    """
    address = _bootstrap(settings, bootstrap)
    rounds: list[Round] = []
    for _ in range(settings.kafka.until_stable_rounds if until_stable else 1):
        collected = collect_cluster(warehouse, settings, address)
        summaries = run_exchange(spark, warehouse, settings)
        planned = planned_moves(warehouse)
        executed, collects = execute_plan(warehouse, settings, address, planned)
        done = Round(collected, summaries, planned, executed, collects)
        rounds.append(done)
        if on_round is not None:
            on_round(done)
        if done.stable:
            return rounds
        time.sleep(settings.kafka.poll_interval_s)
    if until_stable:
        raise NotStableError(f"the cluster was not stable after {len(rounds)} rounds ([kafka] until_stable_rounds); "
                             f"what each round committed and moved stays")
    return rounds
