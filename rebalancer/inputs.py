"""An exchange run's inputs: the last committed version, and what the input tables gained since, validated.

Every committed version records, per input table, the Delta version it consumed (``exchanges.input_versions``).
A run reads only what was committed after those versions (:meth:`~rebalancer.storage.Warehouse.changes`): new
topology events and new partition reports. ``nodes`` and ``cache_groups`` are small and read whole. New rows are
validated (:mod:`rebalancer.validation`) together with the stored rows the cross-row rules need (a copy's earlier
reports); each bad row is recorded once in ``rejected_rows``.

Small tables travel as Arrow on the driver (one node or group per row); reports stay in Spark (one row per copy).
Validating the small tables is one Spark action (the rejected rows are collected; the valid rows are the rows
read minus those, no second collect). The new reports are validated by the version that consumes them
(:func:`validate_reports`, one more action), because whether a report applies depends on that version's alive
nodes; the valid ones stay cached for the kernel.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer.collecting import record_rejections
from rebalancer.config import Settings
from rebalancer.exchange.events import (
    ClusterState,
    Event,
    ExchangeStep,
    NodeInfo,
    Rejection,
    TopologyState,
    coordinator_of,
    late_events,
    plan_exchanges,
)
from rebalancer.storage import Warehouse
from rebalancer.tables import INPUT_TABLES, REJECTED_ROWS
from rebalancer.validation import ROW_COLUMN, Consumer, InvalidInputError, Validated, validate_inputs
from rebalancer.validation_local import References, bad_reports, bad_small_tables, spec_typed
from rebalancer.vocabulary import COPY_KEY, LATE_AFFINITY_SWITCH, NONE

__all__ = [
    "Committed", "Inputs", "Reports", "Run", "cluster_columns", "cluster_of", "last_committed",
    "latest_version", "local_verdict", "read_as_consumed", "read_inputs", "read_run",
    "record_rejections", "validate_reports",
]

#: The input tables read incrementally (the others are read whole).
INCREMENTAL = ("topology_events", "partition_reports")


@dataclass(frozen=True)
class Committed:
    """The newest committed version, as the next exchange starts from it.

    Attributes:
        exchange_id: its ``exchanges.exchange_id``.
        state: its version, alive nodes and running groups.
        last_event_seq: the newest event any committed exchange merged.
        merged_event_seqs: every event seq a committed exchange merged.
        max_report_seq: the newest report consumed so far.
        input_versions: per input table, the Delta version consumed.
        row: the ``exchanges`` row itself (its counts are repeated by a ``NONE`` exchange).
    """

    exchange_id: int
    state: TopologyState
    last_event_seq: int
    merged_event_seqs: frozenset[int]
    max_report_seq: int | None
    input_versions: Mapping[str, int]
    row: Mapping[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> tuple[int, int]:
        return (self.state.major, self.state.minor)


def latest_version(warehouse: Warehouse) -> tuple[int, int] | None:
    """The newest committed topology version (the one whose ``exchanges`` row exists), or None."""
    exchanges = warehouse.read_arrow("exchanges").select(["topology_major", "topology_minor"]).to_pylist()
    return max(((r["topology_major"], r["topology_minor"]) for r in exchanges), default=None)


def read_as_consumed(warehouse: Warehouse, name: str, exchange: Mapping[str, Any]) -> pa.Table:
    """Input table ``name`` as an exchange read it: at the Delta version its ``exchanges`` row recorded as consumed
    (``input_versions``), so that what changed since (a host, an attribute, a capacity, a group setting) does not
    rewrite the account of an older version; today's rows where the row records no version."""
    version = dict(exchange.get("input_versions") or {}).get(name)
    return warehouse.read_arrow(name, version=None if version is None else int(version))


def cluster_of(row: Mapping[str, Any]) -> ClusterState:
    """The cluster state an ``exchanges`` row records (:func:`cluster_columns` wrote it)."""
    baseline = row.get("baseline_nodes")
    return ClusterState(
        baseline=frozenset(baseline) if baseline is not None else None,
        active=row.get("cluster_active") is not False,  # null: active without an activation event (yet)
        explicit=row.get("cluster_active") is not None,
        draining=frozenset(row.get("draining_nodes") or []),
        last_node_event_at=row.get("last_node_event_at"),
        adjust_due=bool(row.get("baseline_adjust_due")),
    )


def cluster_columns(cluster: ClusterState) -> dict[str, Any]:
    """The ``exchanges`` columns that record a version's cluster state (the next exchange starts from them)."""
    return {
        "baseline_nodes": sorted(cluster.baseline) if cluster.baseline is not None else None,
        "cluster_active": cluster.active if cluster.explicit else None,
        "draining_nodes": sorted(cluster.draining),
        "last_node_event_at": cluster.last_node_event_at,
        "baseline_adjust_due": cluster.adjust_due,
    }


def last_committed(warehouse: Warehouse) -> Committed | None:
    """The newest committed version (driver-side reads of ``exchanges`` and ``topology``), or None before the first."""
    exchanges = warehouse.read_arrow("exchanges")
    if exchanges.num_rows == 0:
        return None
    rows = exchanges.to_pylist()
    row = max(rows, key=lambda r: r["exchange_id"])
    merged = frozenset(s for r in rows for s in (r["merged_event_seqs"] or []))
    topology = warehouse.read_arrow(
        "topology", where={"topology_major": row["topology_major"], "topology_minor": row["topology_minor"]}
    ).to_pylist()
    alive = {t["node_id"]: NodeInfo(int(t["node_order"]), bool(t["is_client"])) for t in topology}
    state = TopologyState(row["topology_major"], row["topology_minor"], alive, frozenset(row["running_groups"] or []),
                          cluster_of(row))
    return Committed(
        exchange_id=row["exchange_id"],
        state=state,
        last_event_seq=max(merged, default=0),
        merged_event_seqs=merged,
        max_report_seq=row["max_report_seq"],
        input_versions=dict(row["input_versions"] or {}),
        row=row,
    )


@dataclass
class Inputs:
    """What a run reads: the small tables validated, the new reports not yet (see :func:`validate_reports`).

    Attributes:
        nodes: the valid ``nodes`` rows (SPEC schema, Arrow).
        groups: the valid ``cache_groups`` rows (SPEC schema, Arrow).
        events: the valid new events not merged yet, by ``event_seq``.
        late: new valid events below the newest merged seq that no exchange merged: rejected as late.
        new_reports: the reports committed since the last consumed version (raw, Arrow), or None when there are
            none or more than the warehouse's ``driver_replicas`` (then ``many_reports``).
        many_reports: more new reports than the warehouse's ``driver_replicas``: they are read and judged in
            Spark. XL's first exchange (786,432 new reports): 2.0 s on the driver, 118 s in Spark (docs/SCALING.md).
        versions: per input table, the Delta version read.
        rejected: the small tables' rows rejected by this run (``rejected_rows`` schema), to record.
    """

    nodes: pa.Table
    groups: pa.Table
    events: list[Event]
    late: list[Rejection]
    new_reports: pa.Table | None
    many_reports: bool
    versions: dict[str, int]
    rejected: pa.Table
    references: References | None = None
    _reports_since: int | None = None

    @property
    def has_reports(self) -> bool:
        return self.many_reports or self.new_reports is not None

    @property
    def node_catalog(self) -> dict[str, NodeInfo]:
        return {
            r["node_id"]: NodeInfo(int(r["node_order"]), bool(r["is_client"]))
            for r in self.nodes.select(["node_id", "node_order", "is_client"]).to_pylist()
        }


@dataclass
class Reports:
    """The new reports as one version consumes them: the valid ones (cached in Spark), the rejected ones.

    ``keys``: the (group_name, partition_id) of the valid reports when they were validated on the driver (None when
    Spark validated them): the pipeline then finds their partitions without a Spark job. ``arrow``: the valid
    reports themselves in that case, for an exchange decided on the driver.
    """

    _valid: DataFrame | Callable[[], DataFrame]
    rejected: pa.Table
    _validated: Validated | None = None
    keys: pa.Table | None = None
    arrow: pa.Table | None = None

    @property
    def valid(self) -> DataFrame:
        """The valid reports in Spark. Reports validated on the driver are handed to Spark only when asked for (an
        exchange decided on the driver never asks: a first exchange's 196,608 reports cost 1.2 s to hand over)."""
        if not isinstance(self._valid, DataFrame):
            self._valid = self._valid()
        return self._valid

    def release(self) -> None:
        if self._validated is not None:
            self._validated.release()


def read_inputs(
    spark: SparkSession, warehouse: Warehouse, settings: Settings, committed: Committed | None, exchange_id: int
) -> Inputs:
    """Read what is new since ``committed`` and validate the small tables (module docstring).

    Args:
        spark: the session.
        warehouse: where the input tables are.
        settings: ``validation.strict`` is read.
        committed: the newest committed version (None: everything is new).
        exchange_id: the id the run's first exchange will have, written into its rejected rows.

    Raises:
        InvalidInputError: strict validation found bad rows (nothing is recorded).
        InputSchemaError: an input table misses a column or has one of an unusable type.
    """
    since = committed.input_versions if committed else {}
    small: dict[str, pa.Table] = {}
    versions: dict[str, int] = {}
    for name in ("cache_groups", "nodes", "topology_events"):
        rows, versions[name] = warehouse.changes_arrow(name, since.get(name) if name in INCREMENTAL else None)
        assert rows is not None  # no max_rows: always read
        small[name] = rows.append_column(ROW_COLUMN, pa.array(range(rows.num_rows), pa.int64()))
    reports_since = since.get("partition_reports")
    new_reports, versions["partition_reports"] = warehouse.changes_arrow(
        "partition_reports", reports_since, max_rows=warehouse.driver_replicas
    )
    verdict = local_verdict(small)
    if verdict is not None:  # every row is valid: no Spark job (the usual case)
        valid_small = {name: _spec(name, table) for name, table in small.items()}
        rejected_all = REJECTED_ARROW.empty_table()
        references = verdict
    else:
        raw = {name: _local_frame(spark, table) for name, table in small.items()}
        raw["partition_reports"] = _no_reports(warehouse)
        validated = validate_inputs(raw, exchange_id=exchange_id, small=True)
        rejected_all = validated.numbered.toArrow()
        _raise_if_strict(settings, rejected_all)
        valid_small = {name: _valid(name, table, rejected_all, validated) for name, table in small.items()}
        references = _references(small, valid_small)
    events = [
        Event(r["event_seq"], r["event_type"], r["node_id"], r["group_name"], r["event_time"])
        for r in valid_small["topology_events"].to_pylist()
    ]
    last_seq = committed.last_event_seq if committed else 0
    merged = committed.merged_event_seqs if committed else frozenset()
    late = late_events([e for e in events if e.event_seq <= last_seq and e.event_seq not in merged], last_seq)
    late += _taken_seqs(warehouse, [e for e in events if e.event_seq in merged], since.get("topology_events"))
    pending = sorted((e for e in events if e.event_seq > last_seq), key=lambda e: e.event_seq)
    return Inputs(
        nodes=valid_small["nodes"],
        groups=valid_small["cache_groups"],
        events=pending,
        late=late,
        new_reports=new_reports if new_reports is None or new_reports.num_rows else None,
        many_reports=new_reports is None,
        versions=versions,
        rejected=rejected_all.select(REJECTED_ROWS.fieldNames()),
        references=references,
        _reports_since=reports_since,
    )


def _taken_seqs(warehouse: Warehouse, reused: list[Event], consumed: int | None) -> list[Rejection]:
    """New events whose ``event_seq`` a committed exchange already merged for another event.

    Such a row is not pending (its seq is merged) and must not be dropped silently: the first committed row of a
    seq stands (SPEC section 2, unique keys), so a later row with other content is rejected with that reason. A
    row with the same content is the merged event itself, read again (a run that crashed between its exchanges
    re-reads the events its committed exchanges merged), and is left alone.
    """
    if not reused or consumed is None:
        return []
    stored = warehouse.read_arrow("topology_events", version=consumed)
    standing: dict[int, tuple[Any, ...]] = {}
    for r in stored.to_pylist():  # the first stored row of each seq stands
        standing.setdefault(r["event_seq"], (r["event_type"], r["node_id"], r["group_name"]))
    out = []
    for e in sorted(reused, key=lambda e: e.event_seq):
        first = standing.get(e.event_seq)
        if first is not None and first != (e.event_type, e.node_id, e.group_name):
            applied = " ".join(str(x) for x in first if x is not None)
            out.append(Rejection(e, f"{e.event_type} event_seq {e.event_seq} was never applied: a committed "
                                    f"exchange already applied another event with that seq ({applied}), and the "
                                    "first row of a seq stands; append it again with a new event_seq"))
    return out


REJECTED_ARROW = to_arrow_schema(REJECTED_ROWS, timezone="UTC")


def local_verdict(small: Mapping[str, pa.Table]) -> References | None:
    """The reference facts when every row of the small tables is valid (judged on the driver), else None."""
    if not all(spec_typed(name, table) for name, table in small.items()):
        return None
    bad, references = bad_small_tables(small)
    return None if any(b.any() for b in bad.values()) else references


def _spec(name: str, rows: pa.Table) -> pa.Table:
    spec = to_arrow_schema(INPUT_TABLES[name], timezone="UTC")
    return rows.select(spec.names).cast(spec)


def _references(small: Mapping[str, pa.Table], valid: Mapping[str, pa.Table]) -> References:
    """What reports may refer to: every node and group of the tables, with whether its row is valid."""
    nodes: dict[str, tuple[bool, bool]] = {}
    for n in small["nodes"].column("node_id").to_pylist():
        if isinstance(n, str):
            nodes[n] = (False, False)
    for r in valid["nodes"].select(["node_id", "is_client"]).to_pylist():
        nodes[r["node_id"]] = (True, bool(r["is_client"]))
    groups: dict[str, tuple[bool, int | None, bool]] = {}
    for g in small["cache_groups"].column("group_name").to_pylist():
        if isinstance(g, str):
            groups[g] = (False, None, True)
    for r in valid["cache_groups"].select(["group_name", "partitions", "persistent"]).to_pylist():
        groups[r["group_name"]] = (True, r["partitions"], True if r["persistent"] is None else bool(r["persistent"]))
    return References(nodes, groups)


def validate_reports(
    spark: SparkSession, warehouse: Warehouse, settings: Settings, inputs: Inputs, consumer: Consumer,
    exchange_id: int,
) -> Reports | None:
    """Validate the new reports for the version that consumes them (None when there are none).

    A copy's reports committed earlier are given to the rules that look across reports; a report of a node that
    is not alive at ``consumer``, or of a group that does not run there, is rejected with a reason. One Spark
    action (the rejected rows are collected); the valid reports stay cached for the kernel.

    Raises:
        InvalidInputError: strict validation found bad rows.
    """
    if not inputs.has_reports:
        return None
    since = inputs._reports_since
    if inputs.new_reports is not None and spec_typed("partition_reports", inputs.new_reports):
        new = inputs.new_reports
        stored = _stored_reports(warehouse, since, new) if since is not None else None
        assert inputs.references is not None
        bad = bad_reports(new, stored, inputs.references, consumer.alive, consumer.running)
        if not bad.any():  # every report is valid: no Spark job to judge them
            typed = _spec("partition_reports", new)
            return Reports(lambda: spark.createDataFrame(typed), REJECTED_ARROW.empty_table(),
                           keys=new.select(["group_name", "partition_id"]), arrow=typed)
    if inputs.new_reports is not None:
        new_df = spark.createDataFrame(inputs.new_reports)
    else:
        new_df = warehouse.changes("partition_reports", since).rows
    stored_df = None
    if since is not None:
        copies = new_df.select(*COPY_KEY).distinct()
        stored_df = warehouse.read("partition_reports", version=since).join(
            F.broadcast(copies), list(COPY_KEY), "left_semi"
        )
    raw = {name: warehouse.read_raw(name).limit(0) for name in ("cache_groups", "nodes", "topology_events")}
    raw["partition_reports"] = new_df
    validated = validate_inputs(raw, exchange_id=exchange_id, persist=True, stored_reports=stored_df,
                                consumer=consumer, references=inputs.references)
    rejected = validated.rejected.where(F.col("table_name") == "partition_reports").toArrow()
    try:
        _raise_if_strict(settings, rejected)
    except InvalidInputError:
        validated.release()
        raise
    return Reports(validated.valid["partition_reports"], rejected.select(REJECTED_ROWS.fieldNames()), validated)


def _stored_reports(warehouse: Warehouse, since: int, new: pa.Table) -> pa.Table:
    """The reports consumed at Delta version ``since`` of the copies ``new`` names (driver-side read)."""
    stored = warehouse.read_arrow("partition_reports", version=since)
    wanted = {tuple(r.values()) for r in new.select(list(COPY_KEY)).to_pylist()}
    keys = zip(*(stored.column(c).to_pylist() for c in COPY_KEY), strict=True)
    return stored.filter(pa.array([k in wanted for k in keys], pa.bool_()))


def _raise_if_strict(settings: Settings, rejected: pa.Table) -> None:
    if rejected.num_rows == 0 or not settings.validation.strict:
        return
    counts: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    for r in rejected.select(["table_name", "reason"]).to_pylist():
        counts[r["table_name"]] = counts.get(r["table_name"], 0) + 1
        reasons.setdefault(r["table_name"], []).append(r["reason"])
    raise InvalidInputError.of(counts, reasons)


def _no_reports(warehouse: Warehouse) -> DataFrame:
    return warehouse.read_raw("partition_reports").limit(0)


def _local_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A small Arrow table as a Spark local relation (no job; the rows travel inside the query plan)."""
    return spark.createDataFrame(table)


def _valid(name: str, rows: pa.Table, rejected: pa.Table, validated: Validated) -> pa.Table:
    """The valid rows of a small table with SPEC types: the rows read minus the rejected ones, cast on the driver
    when the table stores SPEC types (the usual case), else collected from Spark's validated rows."""
    mine = rejected.filter(pc.equal(rejected.column("table_name"), name)).column(ROW_COLUMN)
    keep = pc.invert(pc.is_in(rows.column(ROW_COLUMN), value_set=pc.drop_null(mine).combine_chunks()))
    kept = rows.filter(keep)
    spec = to_arrow_schema(INPUT_TABLES[name], timezone="UTC")
    if all(f.name in kept.column_names and kept.schema.field(f.name).type == f.type for f in spec):
        return kept.select(spec.names)
    return validated.valid[name].toArrow().cast(spec)


@dataclass
class Run:
    """What one ``rebalancer exchange`` run starts from, read and judged once (its ``inputs`` stage).

    Attributes:
        committed: the newest committed version (None before the first exchange).
        inputs: the input tables' new rows, validated.
        steps: the exchanges the pending events make, in order (none: maybe a late affinity switch).
        switch: with no steps, the late affinity switch the run may commit when its partitions are ready.
        reports: the new reports validated for the version that consumes them (the first step that is not
            ``NONE``, or the switch), or None.
    """

    committed: Committed | None
    inputs: Inputs
    steps: list[ExchangeStep]
    switch: ExchangeStep | None
    reports: Reports | None

    def release(self) -> None:
        if self.reports is not None:
            self.reports.release()


def read_run(spark: SparkSession, warehouse: Warehouse, settings: Settings) -> Run:
    """Read what is new since the last committed version, plan the exchanges its events make, validate the new
    reports for the exchange that consumes them, and record every rejected row (once: a row recorded before is
    not appended again).

    The reports a late affinity switch would consume are recorded when it commits: if its partitions are not
    ready, nothing is committed and a later run judges them again, perhaps for another version.

    Raises:
        InvalidInputError: strict validation found bad rows (nothing is recorded).
        InputSchemaError: an input table misses a column or has one of an unusable type.
    """
    warehouse.create_tables()
    committed = last_committed(warehouse)
    first_id = (committed.exchange_id if committed else 0) + 1
    inputs = read_inputs(spark, warehouse, settings, committed, first_id)
    state = committed.state if committed else TopologyState()
    steps, rejections = plan_exchanges(state, inputs.events, inputs.node_catalog,
                                       inputs.groups.column("group_name").to_pylist(), settings.baseline)
    rejections = inputs.late + rejections
    if rejections and settings.validation.strict:
        raise InvalidInputError.of({"topology_events": len(rejections)},
                                   {"topology_events": [r.reason for r in rejections]})
    switch = None
    if not steps and committed is not None and state.cluster.active:  # an inactive cluster moves no data
        switch = ExchangeStep(state.major, state.minor + 1, LATE_AFFINITY_SWITCH, (), state.alive, state.groups,
                              coordinator=coordinator_of(state.alive), cluster=state.cluster)
    consumer = next((s for s in steps if s.exchange_type != NONE), switch)
    reports = None
    if consumer is not None and inputs.has_reports:
        servers = tuple(sorted(n for n, i in consumer.alive.items() if not i.is_client))
        reports = validate_reports(spark, warehouse, settings, inputs,
                                   Consumer(f"{consumer.major}.{consumer.minor}", servers,
                                            tuple(sorted(consumer.groups))),
                                   first_id + (steps.index(consumer) if consumer in steps else 0))
    rejected = [inputs.rejected, _event_rejections(rejections, first_id)]
    if reports is not None and consumer is not switch:
        rejected.append(reports.rejected)
    record_rejections(warehouse, pa.concat_tables(rejected))
    return Run(committed, inputs, steps, switch, reports)


def _event_rejections(rejections: Sequence[Rejection], exchange_id: int) -> pa.Table:
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
    return pa.Table.from_pylist(rows, schema=REJECTED_ARROW)
