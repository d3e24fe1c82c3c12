"""``rebalancer what-if``: many hypothetical event sets against the latest committed version, in one Spark pass.

A *scenario* is a set of events (``NODE_FAILED node3; NODE_FAILED node7``): written by hand, or made by a sweep
(every alive server failing alone, every host, every value of a node attribute such as ``zone``). For each one the
driver decides, as :func:`rebalancer.pipeline.run_exchange` would and with the same stages, the exchange the
events make and which partitions it recomputes (:class:`Hypothetical`; a single failure recomputes the
partitions with a copy on the failed node, not the cluster). Then one Spark query does the work of every scenario:

1. the keys ``(scenario, group_name, partition_id)`` of every recomputed partition, joined with the committed
   version's rows of those partitions (map, assignment, versions, losses, and the ideal lists for the "before"
   side of the replica counts), tagged as kernel input with the scenario as a column;
2. grouped by scenario (``applyInArrow``): the kernel decides the scenario's partitions, the plan picks suppliers
   and the scheduler times it, and one row of figures comes out (:func:`figures`);
3. collected: one small row per scenario.

Nothing is committed to the versioned tables; the figures go to the ``what_if`` table (one row per scenario, all
rows of a run share its ``run_id``). They equal what an exchange of the same events would commit
(tests/test_what_if.py runs both): settled partitions keep their rows in a real exchange, so the totals are the
committed version's totals with the recomputed partitions' "before" replaced by their "after".

Figures, per scenario (docs/OPERATIONS.md "What if"):

- ``lost_partitions``: rows the exchange would write to ``lost_partitions`` (each group's loss policy decides: an
  IGNORE loss is listed in the version of the loss), and ``lost_by_policy``: the same by loss policy;
- ``partitions_without_backup``: partitions of groups that keep backups (``backups >= 1`` or REPLICATED) with
  exactly one OWNING copy right after the exchange (one more failure loses them; lost ones are counted above);
- ``copies`` and ``bytes_to_move``: the plan's COPY steps and its bytes (what ``exchanges.bytes_to_move`` holds);
- ``makespan_s`` and ``makespan_lower_bound_s``: the plan's schedule under the cost model, and its bound;
- ``max_replicas_per_node`` / ``mean_replicas_per_node``: ideal replicas per alive server, where the plan ends.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange.events import Event, ExchangeStep, plan_exchanges
from rebalancer.exchange.kernel import INPUT_SCHEMA, MAP, PARTITION, KernelContext, decide
from rebalancer.groups import GroupSettings
from rebalancer.inputs import Committed, last_committed, read_inputs
from rebalancer.planning.event_loop import compile_for_every_plan
from rebalancer.planning.plan import finish_plan, schedule_plan
from rebalancer.stages.meter import Meter
from rebalancer.stages.placement import Placements, kernel_context, place, placed_onto
from rebalancer.stages.previous import Previous
from rebalancer.stages.rows import KernelRows, kernel_input, key_codes, tagged, tagged_arrow
from rebalancer.stages.scope import Scope, ScopeFacts, decide_scope
from rebalancer.storage import Warehouse
from rebalancer.vocabulary import (
    CLUSTER_EVENTS,
    COPY,
    EVENT_TYPES,
    GROUP_EVENTS,
    NODE_EVENTS,
    NODE_FAILED,
    NONE,
    OWNING,
    PARTITION_KEY,
    REPLICATED,
)

__all__ = [
    "FIGURES",
    "Hypothesis",
    "Hypothetical",
    "Scenario",
    "ScenarioError",
    "WhatIfRun",
    "figures",
    "parse_scenario",
    "ranked",
    "sweep",
    "what_if",
]

#: The figures of one scenario, in ``what_if`` column order (SPEC section 3).
FIGURES = (
    "lost_partitions", "partitions_without_backup", "copies", "bytes_to_move", "makespan_s",
    "makespan_lower_bound_s", "max_replicas_per_node", "mean_replicas_per_node",
)
SCENARIO = "scenario_index"
#: A sweep recomputing at least this many partitions (summed over its scenarios: the L cluster's 100 failures
#: recompute 196,608) and evaluated on the driver schedules every plan with the compiled loop
#: (``event_loop.compile_for_every_plan``): loading it costs half a second, and the Python loop over 1,000 XL failure
#: plans about 180 s against 15 s compiled. A Spark pass leaves its workers to the loop's own rule (by plan size): on a
#: cluster each executor would compile the loop first where numba has no cache.
COMPILED_SCHEDULER_FROM_PARTITIONS = 100_000
IDEAL_BEFORE = 99  # a row kind of what-if's own: the committed ideal list of a recomputed partition (not for decide)
_RESULT = pa.schema(
    [(SCENARIO, pa.int32()), ("lost_partitions", pa.int64()), ("partitions_without_backup", pa.int64()),
     ("copies", pa.int64()), ("bytes_to_move", pa.int64()), ("makespan_s", pa.float64()),
     ("makespan_lower_bound_s", pa.float64()), ("max_replicas_per_node", pa.int64()),
     ("mean_replicas_per_node", pa.float64()), ("recomputed_partitions", pa.int64()),
     ("lost_by_policy", pa.map_(pa.string(), pa.int64()))]
)


_EMPTY_INPUT = INPUT_SCHEMA.empty_table()


@dataclass(frozen=True)
class Hypothesis:
    """One exchange decided but not run: what its kernel would be given.

    Attributes:
        step: the exchange the event set makes.
        groups: its running groups.
        context: the kernel's exchange-wide facts.
        scope: the partitions it recomputes.
    """

    step: ExchangeStep
    groups: dict[str, GroupSettings]
    context: KernelContext
    scope: Scope


class Hypothetical:
    """Exchanges decided but not run: for an event set, the exchange it would make after the latest committed
    version and which partitions that exchange recomputes, decided by the stages :func:`run_exchange
    <rebalancer.pipeline.run_exchange>` runs; nothing is run or written.

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
        self.committed: Committed = committed
        self.previous = Previous(warehouse, committed)
        self._spark, self._warehouse, self._settings = spark, warehouse, settings
        inputs = read_inputs(spark, warehouse, settings, committed, committed.exchange_id + 1)
        self.node_rows: dict[str, dict[str, Any]] = {r["node_id"]: r for r in inputs.nodes.to_pylist()}
        self._group_rows = {r["group_name"]: r for r in inputs.groups.to_pylist()}
        self._facts = ScopeFacts(self.node_rows, self._group_rows, inputs.nodes, inputs.groups, inputs.versions)
        self._catalog = inputs.node_catalog

    def decide(self, events: Sequence[Event]) -> Hypothesis | str:
        """The :class:`Hypothesis` of ``events`` (numbered above the committed ones), or why they make none: an
        event the exchange would reject, or events that make more than one exchange (node events go together, a
        cluster or cache event is an exchange of its own)."""
        before = self.committed.state
        steps, rejected = plan_exchanges(before, events, self._catalog, list(self._group_rows),
                                         self._settings.baseline)
        if rejected:
            return "; ".join(r.reason for r in rejected)
        if len(steps) != 1:
            return (f"these events make {len(steps)} exchanges, not one: node events go together, a cluster or "
                    "cache event is an exchange of its own")
        [step] = steps
        groups = {g: GroupSettings.from_row(self._group_rows[g]) for g in sorted(step.groups)}
        alive = NodeSet.from_rows([self.node_rows[n] for n, i in step.alive.items() if not i.is_client])
        placements = place(step, self.previous, groups, alive, self.node_rows, self._settings, self._warehouse)
        if step.exchange_type == NONE:  # clients only: the version repeats the previous one's decisions
            scope = Scope(everything=False, keys=frozenset(self.previous.unstable_keys()))
        else:
            scope = decide_scope(self._spark, step, self.previous, self._facts, groups, placements, alive, None,
                                 self._settings)
        context = kernel_context(alive, {n: i.node_order for n, i in step.alive.items()}, groups,
                                 frozenset(g for g in groups if g in step.new_groups or g not in before.groups),
                                 frozenset(step.reset_groups) & frozenset(groups), placements, self._settings)
        return Hypothesis(step, groups, context, scope)


class ScenarioError(ValueError):
    """A scenario that cannot be evaluated: malformed text, or events an exchange would reject; says which."""


@dataclass(frozen=True)
class Scenario:
    """A set of events to try.

    Attributes:
        events: ``(event_type, node_id or group_name or None)`` in the order they would be appended.
        label: where the scenario came from: ``custom``, or the sweep and its subject (``host host1``).
    """

    events: tuple[tuple[str, str | None], ...]
    label: str = "custom"

    @property
    def text(self) -> str:
        """The events as written on the command line, joined by ``"; "`` (the ``scenario`` column)."""
        return "; ".join(t if subject is None else f"{t} {subject}" for t, subject in self.events)


def parse_scenario(text: str) -> Scenario:
    """``"NODE_FAILED node3; NODE_FAILED node7"`` as a :class:`Scenario` (node events name a node, cache events and
    ``RESET_LOST_PARTITIONS`` a group, cluster events nothing).

    Raises:
        ScenarioError: an unknown event type, or a missing or extra argument.
    """
    events: list[tuple[str, str | None]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        words = part.split()
        kind = words[0].upper()
        if kind not in EVENT_TYPES:
            raise ScenarioError(f"scenario {text!r}: unknown event type {words[0]!r} (one of {', '.join(EVENT_TYPES)})")
        wants = "a node id" if kind in NODE_EVENTS else "a group name" if kind in GROUP_EVENTS else None
        if kind in CLUSTER_EVENTS and len(words) != 1:
            raise ScenarioError(f"scenario {text!r}: {kind} takes no argument")
        if wants and len(words) != 2:
            raise ScenarioError(f"scenario {text!r}: {kind} takes {wants}, e.g. '{kind} x'")
        events.append((kind, words[1] if wants else None))
    if not events:
        raise ScenarioError("an empty scenario: give events such as 'NODE_FAILED node3; NODE_FAILED node7'")
    return Scenario(tuple(events))


def sweep(kind: str, servers: Sequence[str], node_rows: Mapping[str, Mapping[str, Any]]) -> list[Scenario]:
    """The scenarios of one built-in sweep over the alive ``servers`` (in join order).

    Args:
        kind: ``nodes`` (each server fails alone), ``hosts`` (every server of a host fails), or the name of a node
            attribute such as ``zone`` (every server with one value of it fails).
        servers: the alive server nodes.
        node_rows: ``nodes`` rows by node id.

    Raises:
        ScenarioError: no alive server has that attribute.
    """
    if kind == "nodes":
        return [Scenario(((NODE_FAILED, n),), f"node {n}") for n in servers]
    if kind == "hosts":
        members = _by(servers, lambda n: node_rows[n].get("host") or n)
        return [Scenario(tuple((NODE_FAILED, n) for n in nodes), f"host {host}") for host, nodes in members.items()]
    members = _by(servers, lambda n: dict(node_rows[n].get("attributes") or {}).get(kind))
    members.pop(None, None)
    if not members:
        raise ScenarioError(f"no alive server has a node attribute {kind!r}: sweep nodes, hosts or an attribute "
                            "the nodes table sets")
    return [Scenario(tuple((NODE_FAILED, n) for n in nodes), f"{kind} {value}") for value, nodes in members.items()]


def _by(servers: Sequence[str], key: Any) -> dict[Any, list[str]]:
    out: dict[Any, list[str]] = {}
    for n in servers:
        out.setdefault(key(n), []).append(n)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] is None, str(kv[0]))))


@dataclass(frozen=True)
class WhatIfRun:
    """One what-if run: its rows as written to ``what_if`` (ranked worst first) and what it cost."""

    run_id: str
    base: tuple[int, int]
    rows: pa.Table
    seconds: float
    spark_jobs: int | None
    stage_seconds: dict[str, float]


def what_if(
    spark: SparkSession, warehouse: Warehouse, settings: Settings, scenarios: Sequence[Scenario] = (),
    sweeps: Sequence[str] = (), *, write: bool = True,
) -> WhatIfRun:
    """Evaluate ``scenarios`` and the scenarios of ``sweeps`` against the latest committed version.

    Args:
        spark: the session.
        warehouse: the warehouse (its versioned tables are only read).
        settings: the settings an exchange would use.
        scenarios: hand-written scenarios (:func:`parse_scenario`).
        sweeps: built-in sweeps (:func:`sweep`); with neither, every single server failure.
        write: append the rows to the ``what_if`` table.

    Returns:
        The run, its rows ranked worst first (:func:`ranked`).

    Raises:
        ScenarioError: a scenario an exchange would reject (names the scenario and the reason).
        ValueError: nothing is committed yet.
    """
    t0 = time.perf_counter()
    created_at = datetime.now(UTC)
    meter = Meter(spark, "what-if")
    try:
        with meter.stage("scenarios"):
            hypothetical = Hypothetical(spark, warehouse, settings)
            committed = hypothetical.committed
            wanted = list(scenarios)
            if not wanted and not sweeps:
                sweeps = ("nodes",)
            servers = [n for n, i in sorted(committed.state.alive.items(), key=lambda kv: kv[1].node_order)
                       if not i.is_client]
            for kind in sweeps:
                wanted += sweep(kind, servers, hypothetical.node_rows)
            unique: dict[str, Scenario] = {}
            for s in wanted:  # a scenario given twice (a host of one node, say) is evaluated once, first label kept
                unique.setdefault(s.text, s)
            wanted = list(unique.values())
            outcomes: list[Hypothesis] = []
            problems = []
            for s in wanted:
                outcome = hypothetical.decide(_events(s, committed.last_event_seq, created_at))
                if isinstance(outcome, str):
                    problems.append(f"scenario {s.text!r}: {outcome}")
                else:
                    outcomes.append(outcome)
            if problems:
                raise ScenarioError("; ".join(problems))
        with meter.stage("evaluate"):
            result = _evaluate(spark, hypothetical.previous, settings, outcomes, hypothetical.node_rows)
        run_id = f"{created_at:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        index = result.column(SCENARIO).to_pylist()
        n = result.num_rows
        rows = ranked(pa.table(
            {
                "run_id": pa.array([run_id] * n, pa.string()),
                "base_major": pa.array([committed.version[0]] * n, pa.int64()),
                "base_minor": pa.array([committed.version[1]] * n, pa.int32()),
                "scenario": pa.array([wanted[i].text for i in index], pa.string()),
                **{name: result.column(name) for name in FIGURES},
                "label": pa.array([wanted[i].label for i in index], pa.string()),
                "lost_by_policy": result.column("lost_by_policy"),
                "recomputed_partitions": result.column("recomputed_partitions"),
                "created_at": pa.array([created_at] * n, pa.timestamp("us", tz="UTC")),
            }
        ))
        if write:
            with meter.stage("write"):
                warehouse.create_tables(["what_if"])  # a warehouse made before what-if existed has none
                warehouse.replace_where_arrow("what_if", rows, {"run_id": run_id})
        return WhatIfRun(run_id, committed.version, rows, time.perf_counter() - t0, meter.jobs(),
                         dict(meter.seconds))
    finally:
        meter.close()


def ranked(rows: pa.Table) -> pa.Table:
    """Worst first: most lost partitions, then most without a backup, most bytes to move, longest makespan."""
    return rows.sort_by([("lost_partitions", "descending"), ("partitions_without_backup", "descending"),
                         ("bytes_to_move", "descending"), ("makespan_s", "descending"), ("scenario", "ascending")])


def _events(s: Scenario, after_seq: int, at: datetime) -> list[Event]:
    return [Event(after_seq + 1 + i, kind, subject if kind not in GROUP_EVENTS else None,
                  subject if kind in GROUP_EVENTS else None, at) for i, (kind, subject) in enumerate(s.events)]


# =====================================================================================================================
# The Spark pass
# =====================================================================================================================


@dataclass(frozen=True)
class _Facts:
    """What a task needs to rebuild one scenario's kernel context and total its figures (small, unlike contexts:
    a thousand scenarios ship a thousand of these, not a thousand node sets)."""

    servers: tuple[str, ...]
    groups: int  # index into the shared group settings
    started: frozenset[str]
    reset: frozenset[str]
    placements: Mapping[str, int]  # index into the shared matrices, for the groups not listed
    listed: Mapping[str, tuple[int, int]]  # indexes into the shared node lists and matrices
    active: bool
    without_backup_committed: int  # partitions without a backup in the committed version (the running groups)
    replicas: int  # index into the shared per-node ideal counts of the committed version


class _ScenarioRows(KernelRows[DataFrame]):
    """Every scenario's recomputed partitions at once: the committed rows joined with the ``(scenario, group_name,
    partition_id)`` keys, tagged with the scenario."""

    def __init__(self, spark: SparkSession, previous: Previous, keys: pa.Table) -> None:
        self.spark, self.previous = spark, previous
        self._keys = F.broadcast(spark.createDataFrame(keys))

    def table(self, rows: pa.Table) -> DataFrame:
        return self.spark.createDataFrame(rows)

    def read(self, name: str) -> DataFrame:
        return self.previous.frame(name)

    def markers(self) -> DataFrame:
        return self._keys

    def unsettled(self, frame: DataFrame) -> DataFrame:
        return frame.join(self._keys, list(PARTITION_KEY))

    def tagged(self, frame: DataFrame, kind: int) -> DataFrame:
        return tagged(frame, kind, keep=[SCENARIO])


class _ScenarioArrowRows(KernelRows[pa.Table]):
    """:class:`_ScenarioRows` on the driver, for a warehouse that reads there and a sweep of at most its
    ``driver_replicas`` rows: the same rows, joined with NumPy instead of Spark (no Spark job)."""

    def __init__(self, previous: Previous, keys: pa.Table, sizes: Mapping[str, int]) -> None:
        self.previous, self._keys, self._sizes = previous, keys, sizes

    def table(self, rows: pa.Table) -> pa.Table:
        return rows

    def read(self, name: str) -> pa.Table:
        return self.previous.arrow(name)

    def markers(self) -> pa.Table:
        return self._keys

    def unsettled(self, frame: pa.Table) -> pa.Table:
        """Every row of ``frame`` once per scenario that recomputes its partition, with that scenario."""
        code, in_range = key_codes(frame, self._sizes)
        row_codes = np.where(in_range, code, -1)  # the keys are all in range: such a row matches none
        order = np.argsort(row_codes, kind="stable")
        ranked = row_codes[order]
        wanted = key_codes(self._keys, self._sizes)[0]
        first = np.searchsorted(ranked, wanted, "left")
        counts = np.searchsorted(ranked, wanted, "right") - first
        key_of_row = np.repeat(np.arange(wanted.size), counts)
        offsets = np.cumsum(counts) - counts
        rows = order[np.repeat(first - offsets, counts) + np.arange(int(counts.sum()))]
        return frame.take(pa.array(rows)).append_column(
            SCENARIO, self._keys.column(SCENARIO).take(pa.array(key_of_row)))

    def tagged(self, frame: pa.Table, kind: int) -> pa.Table:
        return tagged_arrow(frame, kind, keep=[SCENARIO])


def _evaluate(spark: SparkSession, previous: Previous, settings: Settings, outcomes: Sequence[Hypothesis],
              node_rows: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    committed_map = previous.arrow("partition_map")
    committed_ideal = previous.arrow("ideal_assignment")
    group_sets: list[dict[str, GroupSettings]] = []
    shared_lists = _Pool()  # node lists and matrices of the scenarios' placements, each shipped once
    shared_matrices = _Pool()
    replica_sets: list[dict[str, int]] = []
    replica_keys: dict[frozenset[str], int] = {}
    unprotected: dict[frozenset[str], int] = {}
    facts: list[_Facts] = []
    keys: dict[str, list[Any]] = {SCENARIO: [], "group_name": [], "partition_id": []}
    for i, h in enumerate(outcomes):
        try:
            g = group_sets.index(h.groups)
        except ValueError:
            group_sets.append(h.groups)
            g = len(group_sets) - 1
        running = frozenset(h.groups)
        if running not in replica_keys:  # usually one set for every scenario: computed once
            replica_keys[running] = len(replica_sets)
            replica_sets.append(_per_node(_rows_of(committed_ideal, running)))
            unprotected[running] = _without_backup(_rows_of(committed_map, running), h.groups)
        whole = h.scope.whole_groups(list(h.groups))
        for name in whole:
            n = h.groups[name].partitions
            keys[SCENARIO] += [i] * n
            keys["group_name"] += [name] * n
            keys["partition_id"] += range(n)
        singles = sorted(k for k in h.scope.keys if k[0] in h.groups and k[0] not in whole)
        keys[SCENARIO] += [i] * len(singles)
        keys["group_name"] += [k[0] for k in singles]
        keys["partition_id"] += [k[1] for k in singles]
        # A listed group's placement is its listed matrix onto this scenario's servers (`placed_onto`): the task
        # derives it, so a persistent cluster's scenarios share the baseline's matrices instead of shipping theirs.
        listed = {name: (shared_lists.index(tuple(ids)), shared_matrices.index(m))
                  for name, (ids, m) in h.context.listed.items()}
        placements = {name: shared_matrices.index(m) for name, m in h.context.placements.items() if name not in listed}
        facts.append(_Facts(
            servers=tuple(h.context.nodes.node_ids), groups=g, started=h.context.started, reset=h.context.reset,
            placements=placements, listed=listed, active=h.step.cluster.active,
            without_backup_committed=unprotected[running],
            replicas=replica_keys[running],
        ))
    key_table = pa.table(keys, schema=pa.schema([(SCENARIO, pa.int32()), ("group_name", pa.string()),
                                                  ("partition_id", pa.int32())]))
    shared = _Shared(tuple(facts), tuple(group_sets), tuple(replica_sets), dict(node_rows), settings,
                     tuple(shared_lists.values), tuple(shared_matrices.values))
    # the rows the pass reads: each scenario's recomputed partitions with their copies (as many as the ideal has)
    sizes = {name: s.partitions for h in outcomes for name, s in h.groups.items()}
    copies = committed_ideal.num_rows / max(1, sum(sizes.values()))
    if previous.warehouse.reads_on_driver and key_table.num_rows * copies <= previous.warehouse.driver_replicas:
        if key_table.num_rows >= COMPILED_SCHEDULER_FROM_PARTITIONS:
            compile_for_every_plan()
        arrow_rows = _ScenarioArrowRows(previous, key_table, sizes)
        tagged_rows = pa.concat_tables([
            *kernel_input(arrow_rows, None),
            arrow_rows.tagged(arrow_rows.unsettled(arrow_rows.read("ideal_assignment")), IDEAL_BEFORE)])
        tagged_rows = tagged_rows.take(pc.sort_indices(tagged_rows.column(SCENARIO)))
        scenario = np.asarray(tagged_rows.column(SCENARIO).to_numpy(zero_copy_only=False))
        starts = np.flatnonzero(np.r_[True, scenario[1:] != scenario[:-1]]) if scenario.size else np.zeros(0, int)
        ends = np.r_[starts[1:], scenario.size]
        out = pa.concat_tables([_RESULT.empty_table(), *(
            figures(int(scenario[a]), tagged_rows.slice(a, b - a), shared).cast(_RESULT)
            for a, b in zip(starts, ends, strict=True))])
    else:
        rows = _ScenarioRows(spark, previous, key_table)
        parts = [*kernel_input(rows, None), rows.tagged(rows.unsettled(rows.read("ideal_assignment")), IDEAL_BEFORE)]

        def run(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
            return figures(int(key[0].as_py()), table, shared)

        from pyspark.sql.pandas.types import from_arrow_schema

        out = functools.reduce(DataFrame.unionByName, parts).groupBy(SCENARIO) \
            .applyInArrow(run, from_arrow_schema(_RESULT)).toArrow()
    # a scenario that recomputes nothing (a server holding no copy fails) has no rows in the pass: its figures are
    # the committed version's, computed here from no rows
    nothing = _EMPTY_INPUT.append_column(SCENARIO, pa.array([], pa.int32()))
    missing = sorted(set(range(len(outcomes))) - set(out.column(SCENARIO).to_pylist()))
    out = pa.concat_tables([out.cast(_RESULT), *(figures(i, nothing, shared) for i in missing)])
    return out.sort_by(SCENARIO)


@dataclass(frozen=True)
class _Shared:
    facts: tuple[_Facts, ...]
    group_sets: tuple[dict[str, GroupSettings], ...]
    replica_sets: tuple[dict[str, int], ...]
    node_rows: dict[str, Mapping[str, Any]]
    settings: Settings
    node_lists: tuple[tuple[str, ...], ...]
    matrices: tuple[np.ndarray, ...]


class _Pool:
    """Distinct values (node id tuples, NumPy matrices), each kept once: :meth:`index` gives a value's index,
    adding it unless an equal one is there. Equal matrices are found by a digest of their bytes."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._by_digest: dict[Any, list[int]] = {}

    def index(self, value: Any) -> int:
        array = isinstance(value, np.ndarray)
        digest = (value.dtype.str, value.shape, hash(value.tobytes())) if array else hash(value)
        seen = self._by_digest.setdefault(digest, [])
        for i in seen:
            if np.array_equal(self.values[i], value) if array else self.values[i] == value:
                return i
        self.values.append(value)
        seen.append(len(self.values) - 1)
        return len(self.values) - 1


def figures(scenario: int, table: pa.Table, shared: _Shared) -> pa.Table:
    """One scenario's figures from its tagged rows (what each group of the Spark pass runs; no Spark here)."""
    f = shared.facts[scenario]
    groups = shared.group_sets[f.groups]
    placements = Placements(
        {**{name: shared.matrices[i] for name, i in f.placements.items()},
         **{name: placed_onto(shared.matrices[m], shared.node_lists[ids], f.servers)
            for name, (ids, m) in f.listed.items()}},
        {name: (shared.node_lists[ids], shared.matrices[m]) for name, (ids, m) in f.listed.items()})
    ctx = kernel_context(NodeSet.from_rows([shared.node_rows[n] for n in f.servers]),
                         {n: int(shared.node_rows[n]["node_order"]) for n in f.servers}, groups, f.started, f.reset,
                         placements, shared.settings)
    kind = table.column("kind")
    before = table.filter(pc.equal(kind, IDEAL_BEFORE))
    decided = decide(table.filter(pc.not_equal(kind, IDEAL_BEFORE)).select(INPUT_SCHEMA.names).cast(INPUT_SCHEMA),
                     ctx)
    steps = decided.steps if f.active else decided.steps.slice(0, 0)
    plan, bound = schedule_plan(finish_plan(steps, shared.settings.migration), shared.settings.migration)
    previous_map = table.filter(pc.equal(kind, MAP))
    without_backup = (f.without_backup_committed - _without_backup(previous_map, groups)
                      + _without_backup(decided.partition_map, groups))
    counts = Counter(shared.replica_sets[f.replicas])
    counts.subtract(_per_node(before))
    counts.update(_per_node(decided.ideal_assignment))
    per_server = np.array([counts.get(n, 0) for n in f.servers], dtype=np.int64)
    return pa.table(
        {
            SCENARIO: [scenario],
            "lost_partitions": [decided.lost_partitions.num_rows],
            "partitions_without_backup": [without_backup],
            "copies": [int(pc.sum(pc.equal(plan.column("action"), COPY).cast(pa.int64())).as_py() or 0)],
            "bytes_to_move": [int(pc.sum(plan.column("bytes")).as_py() or 0)],
            "makespan_s": [float(pc.max(plan.column("est_end_s")).as_py() or 0.0) if plan.num_rows else 0.0],
            "makespan_lower_bound_s": [float(bound)],
            "max_replicas_per_node": [int(per_server.max()) if per_server.size else 0],
            "mean_replicas_per_node": [float(per_server.mean()) if per_server.size else 0.0],
            "recomputed_partitions": [int(pc.sum(pc.equal(kind, PARTITION).cast(pa.int64())).as_py() or 0)],
            "lost_by_policy": [sorted(Counter(decided.lost_partitions.column("loss_policy").to_pylist()).items())],
        },
        schema=_RESULT,
    )


def _rows_of(table: pa.Table, groups: Iterable[str]) -> pa.Table:
    return table.filter(pc.is_in(table.column("group_name"), pa.array(sorted(groups), pa.string())))


def _per_node(ideal: pa.Table) -> dict[str, int]:
    """Ideal replicas per node of ``ideal_assignment``-shaped rows."""
    if ideal.num_rows == 0:
        return {}
    counted = ideal.group_by("node_id").aggregate([("node_id", "count")])
    return dict(zip(counted.column("node_id").to_pylist(), counted.column("node_id_count").to_pylist(), strict=True))


def _without_backup(copies: pa.Table, groups: Mapping[str, GroupSettings]) -> int:
    """Partitions of groups that keep a backup with exactly one OWNING copy among ``copies`` (map-shaped rows)."""
    keeping = [g for g, s in groups.items() if s.backups >= 1 or s.mode == REPLICATED]
    if copies.num_rows == 0 or not keeping:
        return 0
    owning = copies.filter(pc.and_(pc.equal(copies.column("state"), OWNING),
                                   pc.is_in(copies.column("group_name"), pa.array(keeping, pa.string()))))
    if owning.num_rows == 0:
        return 0
    per_partition = owning.group_by(list(PARTITION_KEY)).aggregate([("node_id", "count")])
    return int(pc.sum(pc.equal(per_partition.column("node_id_count"), 1).cast(pa.int64())).as_py() or 0)
