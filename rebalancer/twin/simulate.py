"""The twin: executes the committed migration plan as the nodes would, by writing their partition reports.

The planner's rows are data; the twin is the only thing that "executes" them (``rebalancer simulate``). One
*round* works on the latest committed version:

1. Pending events first: :func:`~rebalancer.pipeline.run_exchange` runs (it commits nothing when no event is
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
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer.config import Settings
from rebalancer.inputs import Committed, last_committed
from rebalancer.pipeline import ExchangeSummary, run_exchange
from rebalancer.producers import append_event
from rebalancer.storage import Warehouse
from rebalancer.tables import PARTITION_REPORTS, version_where
from rebalancer.vocabulary import COPY, DROP, EVICTED, MOVING, OWNING, PROMOTE

__all__ = [
    "Stability", "TwinError", "TwinResult", "TwinRound", "check_failure_options", "executable_steps",
    "not_yet_applied", "reports_for", "simulate", "stability",
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


Copy = tuple[str, int, str]  # (group_name, partition_id, node_id)


def executable_steps(plan: list[dict[str, Any]], before_wave: int | None = None) -> list[dict[str, Any]]:
    """The steps of one version's plan the twin runs now: each partition's steps before its first PROMOTE.

    Args:
        plan: one version's ``migration_plan`` rows.
        before_wave: keep only steps of waves ``< before_wave`` (None: all).
    """
    first_promote: dict[tuple[str, int], int] = {}
    for r in plan:
        if r["action"] == PROMOTE:
            key = (r["group_name"], r["partition_id"])
            first_promote[key] = min(first_promote.get(key, r["step"]), r["step"])
    return [
        r for r in plan
        if r["action"] != PROMOTE
        and r["step"] < first_promote.get((r["group_name"], r["partition_id"]), r["step"] + 1)
        and (before_wave is None or (r["wave"] is not None and r["wave"] < before_wave))
    ]


def not_yet_applied(steps: list[dict[str, Any]], now: dict[Copy, dict[str, Any]]) -> list[dict[str, Any]]:
    """``steps`` without those whose effect the newest reports already show.

    A COPY is applied once its target owns the partition at ``to_counter`` or later; a DROP once the copy has left
    the map. This makes a round idempotent: a twin that crashed after writing its reports, run again, does not
    report the same steps twice.

    Args:
        steps: COPY and DROP steps of one plan.
        now: the committed map overridden by the newest reports (:func:`current_map`), by copy.
    """
    out = []
    for r in steps:
        part = (r["group_name"], r["partition_id"])
        if r["action"] == COPY:
            held = now.get((*part, r["target_node"]))
            if not (held and held["state"] == OWNING and held["update_counter"] >= r["to_counter"]):
                out.append(r)
        elif r["action"] == DROP and (*part, r["source_node"]) in now:
            out.append(r)
    return out


def reports_for(steps: list[dict[str, Any]], map_rows: dict[Copy, dict[str, Any]], first_seq: int) -> pa.Table:
    """The partition reports the nodes send when ``steps`` (COPY and DROP steps) finish, in finishing order.

    A COPY's target owns the supplier's copy (its size and bytes in the plan's version map) at ``to_counter``, its
    WAL history starting there; a DROP's node evicts its copy.

    Args:
        steps: executed steps (``migration_plan`` rows).
        map_rows: the map of the plan's version, by copy.
        first_seq: the ``report_seq`` of the first report.
    """
    ordered = sorted(steps, key=lambda r: (r["est_end_s"] is None, r["est_end_s"] or 0.0, r["migration_id"]))
    rows = []
    for seq, r in enumerate(ordered, start=first_seq):
        part = (r["group_name"], r["partition_id"])
        if r["action"] == COPY:
            supplier = map_rows.get((*part, r["source_node"]), {})
            rows.append({"node_id": r["target_node"], "group_name": part[0], "partition_id": part[1],
                         "state": OWNING, "update_counter": r["to_counter"], "size": supplier.get("size") or 0,
                         "bytes": supplier.get("bytes") or 0, "wal_history_counter": r["to_counter"],
                         "report_seq": seq})
        else:
            dropped = map_rows.get((*part, r["source_node"]), {})
            rows.append({"node_id": r["source_node"], "group_name": part[0], "partition_id": part[1],
                         "state": EVICTED, "update_counter": dropped.get("update_counter") or 0, "size": 0,
                         "bytes": 0, "wal_history_counter": None, "report_seq": seq})
    return pa.Table.from_pylist(rows, schema=_REPORTS)


_REPORTS = to_arrow_schema(PARTITION_REPORTS, timezone="UTC")


def _by_copy(rows: pa.Table) -> dict[Copy, dict[str, Any]]:
    return {(r["group_name"], r["partition_id"], r["node_id"]): r for r in rows.to_pylist()}


def current_map(warehouse: Warehouse) -> tuple[Committed, dict[Copy, dict[str, Any]], int] | None:
    """The latest committed version, its map as the nodes' newest reports make it now, and the newest report_seq.

    The committed ``partition_map`` on the version's alive servers, each copy replaced by its newest report
    committed after the version (EVICTED copies leave), then the counter rule (OWNING copies below the highest
    OWNING counter of their partition count as MOVING): what the next exchange would start from, for the twin to
    see which steps the reports already show. Driver-side reads of one version (the twin simulates; it does not
    scale with the exchange). The reports are not validated (the twin writes them itself).

    Returns:
        None before the first exchange.
    """
    committed = last_committed(warehouse)
    if committed is None:
        return None
    servers = {n for n, info in committed.state.alive.items() if not info.is_client}
    copies = _by_copy(warehouse.read_arrow("partition_map", where=version_where(committed.version)))
    new, _ = warehouse.changes_arrow("partition_reports", committed.input_versions.get("partition_reports"))
    assert new is not None  # no max_rows: always read
    newest_seq = committed.max_report_seq or 0
    for r in sorted(new.to_pylist(), key=lambda r: r["report_seq"] or 0):
        newest_seq = max(newest_seq, r["report_seq"] or 0)
        if r["node_id"] not in servers or r["group_name"] not in committed.state.groups:
            continue
        key = (r["group_name"], r["partition_id"], r["node_id"])
        if r["state"] == EVICTED:
            copies.pop(key, None)
        else:
            copies[key] = r
    top: dict[tuple[str, int], int] = {}
    for (g, p, _), r in copies.items():
        if r["state"] == OWNING:
            top[(g, p)] = max(top.get((g, p), -1), r["update_counter"])
    for (g, p, _), r in copies.items():
        if r["state"] == OWNING and r["update_counter"] < top[(g, p)]:
            copies[(g, p, r["node_id"])] = {**r, "state": MOVING}
    return committed, copies, newest_seq


def stability(warehouse: Warehouse) -> Stability | None:
    """How far the latest committed version is from stable (module docstring); None before the first exchange."""
    current = current_map(warehouse)
    if current is None:
        return None
    committed, copies, _ = current
    at = version_where(committed.version)
    # an offline baseline node keeps its place in the ideal lists but is no target: compare the alive part,
    # numbered again, with what serves
    alive = {r["node_id"] for r in warehouse.read_arrow("topology", where=at).to_pylist()}
    lists: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for r in warehouse.read_arrow("ideal_assignment", where=at).to_pylist():
        if r["node_id"] in alive:
            lists.setdefault((r["group_name"], r["partition_id"]), []).append((r["replica_index"], r["node_id"]))
    ideal = {(g, p, i, n) for (g, p), nodes in lists.items() for i, (_, n) in enumerate(sorted(nodes))}
    serving = {(r["group_name"], r["partition_id"], r["replica_index"], r["node_id"])
               for r in warehouse.read_arrow("affinity_assignment", where=at).to_pylist()}
    ideal_copies = {(g, p, n) for g, p, _, n in ideal}
    owning = {key for key, r in copies.items() if r["state"] == OWNING}
    return Stability(
        version=committed.version,
        assignment_differences=len(ideal ^ serving),
        ideal_not_owning=len(ideal_copies - owning),
        surplus_copies=len(set(copies) - ideal_copies),
        lost_partitions=warehouse.read_arrow("lost_partitions", where=at).num_rows,
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
    current = current_map(warehouse)
    if current is None:
        raise TwinError("no exchange has been committed yet; run `rebalancer exchange` first")
    committed, now, newest_seq = current
    plan = warehouse.read_arrow("migration_plan", where=version_where(committed.version)).to_pylist()
    steps = not_yet_applied(executable_steps(plan, before_wave=fail[1] if fail else None), now)
    counts = {COPY: sum(r["action"] == COPY for r in steps), DROP: sum(r["action"] == DROP for r in steps)}
    waiting = sum(r["action"] == PROMOTE for r in plan)
    if steps:
        map_rows = _by_copy(warehouse.read_arrow("partition_map", where=version_where(committed.version)))
        warehouse.append_arrow("partition_reports", reports_for(steps, map_rows, newest_seq + 1))
        hook("after:reports")
    failed = None
    if fail is not None:
        append_event(spark, warehouse, "NODE_FAILED", node_id=fail[0], now=clock())
        failed = fail[0]
        hook("after:event")
    after = run_exchange(spark, warehouse, settings, clock=clock, fault_hook=hook)
    return TwinRound(
        version=committed.version,
        copies=counts[COPY],
        drops=counts[DROP],
        waiting_promotions=waiting,
        failed_node=failed,
        exchanges=tuple(before) + tuple(after),
    )


def check_failure_options(fail_node: str | None, at_wave: int | None) -> None:
    """Raise :class:`TwinError` unless ``fail_node`` and ``at_wave`` are given together, ``at_wave`` >= 1 (the
    CLI checks before it opens the warehouse)."""
    if (fail_node is None) != (at_wave is None):
        raise TwinError("--fail NODE and --at-wave K go together")
    if at_wave is not None and at_wave < 1:
        raise TwinError(f"--at-wave must be 1 or more, got {at_wave}")


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
    check_failure_options(fail_node, at_wave)
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
            status = stability(warehouse)
            if status is not None and status.stable:
                return TwinResult(tuple(rounds), status)
    return TwinResult(tuple(rounds), stability(warehouse))


def _check_alive_server(warehouse: Warehouse, node_id: str) -> None:
    committed = last_committed(warehouse)
    if committed is None:
        raise TwinError("no exchange has been committed yet; run `rebalancer exchange` first")
    info = committed.state.alive.get(node_id)
    if info is None or info.is_client:
        major, minor = committed.version
        raise TwinError(f"--fail {node_id}: no alive server node {node_id!r} at version {major}.{minor}")
