"""``rebalancer what-if``: many hypothetical event sets against the latest committed version, in one Spark pass.

A *scenario* is a set of events (``NODE_FAILED node3; NODE_FAILED node7``): written by hand, or made by a sweep
(every alive server failing alone, every host, every value of a node attribute such as ``zone``). For each one the
driver decides, as :func:`rebalancer.pipeline.run_exchange` would, the exchange the events make and which
partitions it recomputes (:func:`rebalancer.pipeline.hypothetical_exchanges`; a single failure recomputes the
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
from rebalancer.exchange.events import Event
from rebalancer.exchange.kernel import (
    ASSIGNMENT,
    INPUT_SCHEMA,
    LOST_ROW,
    MAP,
    PARTITION,
    VERSION,
    GroupSettings,
    KernelContext,
    decide,
)
from rebalancer.pipeline import Hypothesis, Hypothetical, Meter, placed_onto, tagged
from rebalancer.planning.plan import finish_plan, schedule_plan
from rebalancer.storage import Warehouse
from rebalancer.tables import version_where
from rebalancer.vocabulary import (
    CLUSTER_EVENTS,
    COPY,
    EVENT_TYPES,
    GROUP_EVENTS,
    NODE_EVENTS,
    NODE_FAILED,
    OWNING,
    PARTITION_KEY,
    REPLICATED,
)

__all__ = [
    "FIGURES",
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
IDEAL_BEFORE = 99  # a row kind of what-if's own: the committed ideal list of a recomputed partition (not for decide)
_RESULT = pa.schema(
    [(SCENARIO, pa.int32()), ("lost_partitions", pa.int64()), ("partitions_without_backup", pa.int64()),
     ("copies", pa.int64()), ("bytes_to_move", pa.int64()), ("makespan_s", pa.float64()),
     ("makespan_lower_bound_s", pa.float64()), ("max_replicas_per_node", pa.int64()),
     ("mean_replicas_per_node", pa.float64()), ("recomputed_partitions", pa.int64()),
     ("lost_by_policy", pa.map_(pa.string(), pa.int64()))]
)


_EMPTY_INPUT = INPUT_SCHEMA.empty_table()


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
            result = _evaluate(spark, warehouse, settings, committed.version, outcomes, hypothetical.node_rows)
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
    placements: Mapping[str, int]  # index into the shared matrices, for the groups not listed
    listed: Mapping[str, tuple[int, int]]  # indexes into the shared node lists and matrices
    active: bool
    without_backup_committed: int  # partitions without a backup in the committed version (the running groups)
    replicas: int  # index into the shared per-node ideal counts of the committed version


def _evaluate(spark: SparkSession, warehouse: Warehouse, settings: Settings, version: tuple[int, int],
              outcomes: Sequence[Hypothesis], node_rows: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    where = version_where(version)
    committed_map = warehouse.read_arrow("partition_map", where=where)
    committed_ideal = warehouse.read_arrow("ideal_assignment", where=where)
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
        whole = set(h.groups) if h.everything else set(h.whole_groups) & set(h.groups)
        for name in sorted(whole):
            n = h.groups[name].partitions
            keys[SCENARIO] += [i] * n
            keys["group_name"] += [name] * n
            keys["partition_id"] += range(n)
        singles = sorted(k for k in h.keys if k[0] in h.groups and k[0] not in whole)
        keys[SCENARIO] += [i] * len(singles)
        keys["group_name"] += [k[0] for k in singles]
        keys["partition_id"] += [k[1] for k in singles]
        # A listed group's placement is its listed matrix onto this scenario's servers (`placed_onto`): the task
        # derives it, so a persistent cluster's scenarios share the baseline's matrices instead of shipping theirs.
        listed = {name: (shared_lists.index(tuple(ids)), shared_matrices.index(m))
                  for name, (ids, m) in h.context.listed.items()}
        placements = {name: shared_matrices.index(m) for name, m in h.context.placements.items() if name not in listed}
        facts.append(_Facts(
            servers=tuple(h.context.nodes.node_ids), groups=g, placements=placements,
            listed=listed, active=h.step.cluster.active,
            without_backup_committed=unprotected[running],
            replicas=replica_keys[running],
        ))
    key_table = pa.table(keys, schema=pa.schema([(SCENARIO, pa.int32()), ("group_name", pa.string()),
                                                  ("partition_id", pa.int32())]))
    key_frame = F.broadcast(spark.createDataFrame(key_table))
    parts: list[DataFrame] = [tagged(key_frame, PARTITION, keep=[SCENARIO])]
    for name, kind in (("partition_map", MAP), ("affinity_assignment", ASSIGNMENT),
                       ("partition_versions", VERSION), ("ideal_assignment", IDEAL_BEFORE)):
        joined = warehouse.read(name, where=where).join(key_frame, list(PARTITION_KEY))
        parts.append(tagged(joined, kind, keep=[SCENARIO]))
    lost = warehouse.read_arrow("lost_partitions", where=where).select(list(PARTITION_KEY))
    if lost.num_rows:
        lost_keys = key_table.join(lost, list(PARTITION_KEY), join_type="inner")
        if lost_keys.num_rows:
            parts.append(tagged(spark.createDataFrame(lost_keys), LOST_ROW, keep=[SCENARIO]))
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p)
    shared = _Shared(tuple(facts), tuple(group_sets), tuple(replica_sets), dict(node_rows), settings,
                     tuple(shared_lists.values), tuple(shared_matrices.values))

    def run(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
        return figures(int(key[0].as_py()), table, shared)

    from pyspark.sql.pandas.types import from_arrow_schema

    out = rows.groupBy(SCENARIO).applyInArrow(run, from_arrow_schema(_RESULT)).toArrow()
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
    ctx = KernelContext(
        nodes=NodeSet.from_rows([shared.node_rows[n] for n in f.servers]),
        node_orders={n: int(shared.node_rows[n]["node_order"]) for n in f.servers},
        groups=groups,
        history_threshold=shared.settings.rebalance.history_threshold,
        ids_as_strings=shared.settings.affinity.ignite_ids_as_strings,
        placements={**{name: shared.matrices[i] for name, i in f.placements.items()},
                    **{name: placed_onto(shared.matrices[m], shared.node_lists[ids], f.servers)
                       for name, (ids, m) in f.listed.items()}},
        listed={name: (shared.node_lists[ids], shared.matrices[m]) for name, (ids, m) in f.listed.items()},
    )
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
