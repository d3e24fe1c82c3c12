"""The kernel over a stream of Arrow batches: what ``mapInArrow`` runs in each task of the exchange's one shuffle.

The pipeline sends the kernel's tagged input rows (:data:`rebalancer.exchange.kernel.INPUT_SCHEMA`) through one
shuffle by ``(group_name, partition_id)``, sorted within each task, so every partition's rows arrive together.
:func:`decide_stream` buffers batches, decides every complete partition (a partition's rows may straddle two
batches, so the last one waits for the next batch), and yields the decisions as one long table per buffer
(:data:`OUTPUT_SCHEMA`): a ``kind`` column names the output table, the other columns are the union of the
tables' columns. One ``SUMMARY`` row per buffer carries the counts the exchange needs without another Spark job.
On the driver the decisions need no transport: :func:`decided_chunks` gives each buffer's tables and counts as they
are, and :func:`total_counts` adds the counts up (as the pipeline does with the ``SUMMARY`` rows of every task).

No Spark import: tests feed it batches directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.exchange.kernel import DECISION_SCHEMAS, REPORT, Decisions, KernelContext, decide
from rebalancer.vocabulary import MOVING

__all__ = ["KINDS", "OUTPUT_SCHEMA", "SUMMARY", "SUMMARY_COLUMNS", "decide_stream", "decided_chunks", "to_long",
           "total_counts"]

#: Output kinds, one per decision table, and the per-buffer summary.
KINDS: dict[str, int] = {name: i for i, name in enumerate(DECISION_SCHEMAS)}
SUMMARY = len(KINDS)
#: Counts of one buffer, summed by the pipeline (``SUMMARY`` rows only).
SUMMARY_COLUMNS = (
    "switch_waiting_partitions",  # partitions waiting for the late affinity switch (with an owner)
    "switch_unready_partitions",  # ... of which some ideal node does not own yet
    "temporary_primaries",
    "moving_copies",
    "max_report_seq",  # the newest report the buffer consumed (-1: none)
)


def _output_schema() -> pa.Schema:
    fields: dict[str, pa.Field] = {"kind": pa.field("kind", pa.int8())}
    for schema in DECISION_SCHEMAS.values():
        for f in schema:
            if f.name in fields and fields[f.name].type != f.type:
                raise TypeError(f"decision column {f.name} has two types: {fields[f.name].type}, {f.type}")
            fields.setdefault(f.name, f)
    for name in SUMMARY_COLUMNS:
        fields[name] = pa.field(name, pa.int64())
    return pa.schema(list(fields.values()))


#: The long output: ``kind`` plus every decision table's columns (null where a kind has no such column).
OUTPUT_SCHEMA = _output_schema()


def to_long(decisions: Decisions, summary: dict[str, int]) -> pa.Table:
    """The decisions as one :data:`OUTPUT_SCHEMA` table, plus one ``SUMMARY`` row holding ``summary``."""
    parts = []
    for name, table in decisions.tables().items():
        if table.num_rows == 0:
            continue
        columns = {
            f.name: table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in OUTPUT_SCHEMA
            if f.name != "kind"
        }
        kind = pa.array(np.full(table.num_rows, KINDS[name], np.int8))
        parts.append(pa.table({"kind": kind, **columns}, schema=OUTPUT_SCHEMA))
    row: dict[str, list[Any]] = {f.name: [None] for f in OUTPUT_SCHEMA}
    row["kind"] = [SUMMARY]
    for name in SUMMARY_COLUMNS:
        row[name] = [int(summary[name])]
    parts.append(pa.table(row, schema=OUTPUT_SCHEMA))
    return pa.concat_tables(parts)


def summarise(decisions: Decisions, consumed: pa.Table) -> dict[str, int]:
    """The :data:`SUMMARY_COLUMNS` counts of one batch's decisions (``consumed``: its input rows)."""
    p = decisions.partitions
    waiting = pc.and_(p.column("switch_waiting"), p.column("has_owner"))
    unready = pc.and_(waiting, pc.invert(p.column("switch_ready")))
    a = decisions.affinity_assignment
    temporary = pc.and_(a.column("is_temporary"), pc.equal(a.column("replica_index"), 0))
    reports = consumed.filter(pc.equal(consumed.column("kind"), REPORT))
    newest = pc.max(reports.column("report_seq")).as_py() if reports.num_rows else None
    return {
        "switch_waiting_partitions": int(pc.sum(waiting.cast(pa.int64())).as_py() or 0),
        "switch_unready_partitions": int(pc.sum(unready.cast(pa.int64())).as_py() or 0),
        "temporary_primaries": int(pc.sum(temporary.cast(pa.int64())).as_py() or 0),
        "moving_copies": int(pc.sum(pc.equal(decisions.partition_map.column("state"), MOVING).cast(pa.int64()))
                             .as_py() or 0),
        "max_report_seq": -1 if newest is None else int(newest),
    }


def total_counts(summaries: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The :data:`SUMMARY_COLUMNS` counts of many buffers: summed, and the newest report seq (-1: none)."""
    summaries = list(summaries)
    counts = {c: sum(int(s[c] or 0) for s in summaries) for c in SUMMARY_COLUMNS if c != "max_report_seq"}
    counts["max_report_seq"] = int(max(s["max_report_seq"] for s in summaries) or -1) if summaries else -1
    return counts


def decide_stream(
    batches: Iterable[pa.RecordBatch], ctx: KernelContext, buffer_rows: int = 500_000
) -> Iterator[pa.RecordBatch]:
    """Decide every partition of a stream of input batches sorted by (group_name, partition_id).

    Args:
        batches: tagged input rows, sorted by ``group_name`` then ``partition_id`` (one task's share).
        ctx: the exchange-wide facts.
        buffer_rows: decide once this many rows are buffered (memory bound; a partition is never split).

    Yields:
        :data:`OUTPUT_SCHEMA` record batches.
    """
    for decisions, summary in decided_chunks(batches, ctx, buffer_rows):
        yield from to_long(decisions, summary).to_batches()


def decided_chunks(
    batches: Iterable[pa.RecordBatch], ctx: KernelContext, buffer_rows: int = 500_000
) -> Iterator[tuple[Decisions, dict[str, int]]]:
    """:func:`decide_stream`'s decisions before they are made one long table: each buffer's, with its counts."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        held += batch.num_rows
        if held >= buffer_rows:
            table = pa.Table.from_batches(pending)
            cut = _last_partition_start(table)
            if cut > 0:
                yield _decided(table.slice(0, cut), ctx)
                rest = table.slice(cut)
                pending, held = rest.to_batches(), rest.num_rows
    if held:
        yield _decided(pa.Table.from_batches(pending), ctx)


def _last_partition_start(table: pa.Table) -> int:
    """Index of the first row of the table's last partition (rows sorted by partition)."""
    group = table.column("group_name")[-1]
    pid = table.column("partition_id")[-1]
    last = pc.and_(pc.equal(table.column("group_name"), group), pc.equal(table.column("partition_id"), pid))
    return int(np.argmax(np.asarray(last.to_numpy(zero_copy_only=False), bool)))


def _decided(table: pa.Table, ctx: KernelContext) -> tuple[Decisions, dict[str, int]]:
    decisions = decide(table, ctx)
    return decisions, summarise(decisions, table)
