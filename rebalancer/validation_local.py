"""The rule catalogue's verdicts on the driver, for small input tables that already have the SPEC types.

An exchange reads a few new events and, usually, a few thousand new reports. Judging them with Spark
(:mod:`rebalancer.validation`) builds a plan of thousands of expressions, and a fresh JVM spends seconds on it,
whatever the row count. This module gives the same verdict, row by row, in plain Python and NumPy: which rows
break a rule of docs/VALIDATION.md. It does not write reasons: when any row breaks a rule, the caller runs the
Spark validation, which says why in the exact words of the catalogue; so the Spark validator remains the one
place where reasons are written, and this one only has to agree on *which* rows are bad. A property test holds
the two to the same verdicts on random rows, good and bad (``tests/test_validation_local.py``).

Only tables whose columns have exactly the SPEC types are judged here (:func:`spec_typed`); a table that needs
casts (numbers written as text, ...) goes to Spark, whose ``try_cast`` decides what casts.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.storage.base import COMMIT_COLUMN
from rebalancer.tables import INPUT_TABLES
from rebalancer.vocabulary import (
    AFFINITIES,
    EVENT_TYPES,
    GROUP_EVENTS,
    LOSS_POLICIES,
    MAX_PARTITIONS,
    MODES,
    NODE_EVENTS,
    OWNING,
    PARTITIONERS,
    STATES,
)

__all__ = ["References", "bad_reports", "bad_small_tables", "spec_typed"]

B = npt.NDArray[np.bool_]
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def spec_typed(name: str, table: pa.Table) -> bool:
    """Whether ``table`` has every SPEC column of input table ``name`` with exactly its type (as Spark would cast
    it to Arrow), so that no value needs a cast."""
    from pyspark.sql.pandas.types import to_arrow_schema

    spec = to_arrow_schema(INPUT_TABLES[name], timezone="UTC")
    return all(f.name in table.column_names and table.schema.field(f.name).type == f.type for f in spec)


@dataclass(frozen=True)
class References:
    """What reports may refer to: per node id (a valid row has it, it is a client), per group (a valid row has it,
    its partitions, persistent with null read as true). Ids that no row has are absent."""

    nodes: Mapping[str, tuple[bool, bool]]
    groups: Mapping[str, tuple[bool, int | None, bool]]


def _rows(table: pa.Table, columns: Sequence[str]) -> list[dict[str, Any]]:
    return table.select(list(columns)).to_pylist()


def _commits(table: pa.Table) -> list[int]:
    if COMMIT_COLUMN in table.column_names:
        return [int(c) for c in table.column(COMMIT_COLUMN).to_pylist()]
    return [0] * table.num_rows


def _unique_bad(
    keys: list[tuple[Any, ...]], contents: list[tuple[Any, ...]], commits: list[int], new: list[bool],
    main: bool,
) -> B:
    """The uniqueness rules of one key (conflicting, taken, and with ``main`` the extra-copy rule)."""
    n = len(keys)
    bad = np.zeros(n, dtype=bool)
    by_key: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        by_key[key].append(i)
    for key, rows in by_key.items():
        present = all(k is not None for k in key)
        per_commit: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
        for i in rows:
            if new[i]:
                per_commit[commits[i]].add(contents[i])
        deciding = [c for c, seen in per_commit.items() if len(seen) == 1]
        decided = min(deciding) if deciding else None
        standing = next(iter(per_commit[decided])) if decided is not None else None
        ranked: dict[int, int] = defaultdict(int)
        for i in rows:
            c = commits[i]
            distinct = len(per_commit.get(c, ()))
            if present and distinct > 1:
                bad[i] = True
            later = decided is not None and c > decided
            if present and later and contents[i] != standing:
                bad[i] = True
            if main:
                ranked[c] += 1
                if (decided is not None and c == decided and distinct == 1 and ranked[c] > 1) or (
                    later and contents[i] == standing
                ):
                    bad[i] = True
    return bad


def _content(row: dict[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    def frozen(v: Any) -> Any:
        if isinstance(v, list):
            return tuple(frozen(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted(v.items()))
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return v

    return tuple(frozen(row[c]) for c in columns)


def _blank(value: str | None) -> bool:
    return value is not None and value.strip(" ") == ""  # Spark's trim removes spaces only


def bad_small_tables(tables: Mapping[str, pa.Table]) -> tuple[dict[str, B], References]:
    """Which rows of ``cache_groups``, ``nodes`` and ``topology_events`` break a rule, and the reference facts.

    Args:
        tables: the three tables with their SPEC columns and types (see :func:`spec_typed`); rows may carry
            :data:`~rebalancer.storage.base.COMMIT_COLUMN`; ``topology_events`` holds only new rows.

    Returns:
        Per table, True where the row breaks a rule; and the facts reports may refer to.
    """
    groups = _rows(tables["cache_groups"], INPUT_TABLES["cache_groups"].fieldNames())
    g_bad = np.zeros(len(groups), dtype=bool)
    for i, g in enumerate(groups):
        p, b = g["partitions"], g["backups"]
        g_bad[i] = (
            g["group_name"] is None or _blank(g["group_name"]) or p is None or not 1 <= p <= MAX_PARTITIONS
            or b is None or b < 0
            or (g["mode"] is not None and g["mode"] not in MODES)
            or (g["affinity"] is not None and g["affinity"] not in AFFINITIES)
            or (g["backup_filter"] is not None and any(x is None for x in g["backup_filter"]))
            or (g["loss_policy"] is not None and g["loss_policy"] not in LOSS_POLICIES)
            or (g["partitioner"] is not None and g["partitioner"] not in PARTITIONERS)
        )
    g_columns = INPUT_TABLES["cache_groups"].fieldNames()
    g_commits = _commits(tables["cache_groups"])
    g_new = [True] * len(groups)
    g_bad |= _unique_bad([(g["group_name"],) for g in groups], [_content(g, g_columns) for g in groups], g_commits,
                         g_new, main=True)

    nodes = _rows(tables["nodes"], INPUT_TABLES["nodes"].fieldNames())
    n_bad = np.zeros(len(nodes), dtype=bool)
    for i, n in enumerate(nodes):
        cap = n["capacity"]
        n_bad[i] = (
            n["node_id"] is None or _blank(n["node_id"])
            or (n["node_uuid"] is not None and not _UUID.search(n["node_uuid"]))
            or n["node_order"] is None
            or (cap is not None and (cap <= 0 or math.isnan(cap) or cap == math.inf))
        )
    n_columns = INPUT_TABLES["nodes"].fieldNames()
    n_contents = [_content(n, n_columns) for n in nodes]
    n_commits = _commits(tables["nodes"])
    n_new = [True] * len(nodes)
    n_bad |= _unique_bad([(n["node_id"],) for n in nodes], n_contents, n_commits, n_new, main=True)
    n_bad |= _unique_bad([(n["node_uuid"],) for n in nodes], n_contents, n_commits, n_new, main=False)
    n_bad |= _unique_bad([(n["node_order"],) for n in nodes], n_contents, n_commits, n_new, main=False)

    node_facts: dict[str, tuple[bool, bool]] = {}
    for n, bad in zip(nodes, n_bad.tolist(), strict=True):
        if n["node_id"] is None:
            continue
        fact = (not bad, (not bad) and bool(n["is_client"]))
        node_facts[n["node_id"]] = max(node_facts.get(n["node_id"], fact), fact)
    group_facts: dict[str, tuple[bool, int | None, bool]] = {}
    for g, bad in zip(groups, g_bad.tolist(), strict=True):
        if g["group_name"] is None:
            continue
        group_fact = (not bad, g["partitions"], True if g["persistent"] is None else bool(g["persistent"]))
        previous = group_facts.get(g["group_name"])
        group_facts[g["group_name"]] = group_fact if previous is None or group_fact[0] > previous[0] else previous

    events = _rows(tables["topology_events"], INPUT_TABLES["topology_events"].fieldNames())
    e_bad = np.zeros(len(events), dtype=bool)
    for i, e in enumerate(events):
        kind = e["event_type"]
        e_bad[i] = (
            e["event_seq"] is None or kind is None or kind not in EVENT_TYPES
            or (kind in NODE_EVENTS and e["node_id"] is None)
            or (kind in GROUP_EVENTS and e["group_name"] is None)
            or (e["node_id"] is not None and not node_facts.get(e["node_id"], (False, False))[0])
            or (e["group_name"] is not None and not group_facts.get(e["group_name"], (False, None, True))[0])
        )
    e_columns = INPUT_TABLES["topology_events"].fieldNames()
    e_bad |= _unique_bad([(e["event_seq"],) for e in events], [_content(e, e_columns) for e in events],
                         _commits(tables["topology_events"]), [True] * len(events), main=True)
    return {"cache_groups": g_bad, "nodes": n_bad, "topology_events": e_bad}, References(node_facts, group_facts)


_COPY = ("node_id", "group_name", "partition_id")


def bad_reports(
    new: pa.Table,
    stored: pa.Table | None,
    facts: References,
    alive: Sequence[str] | None = None,
    running: Sequence[str] | None = None,
) -> B:
    """Which new reports break a rule (the stored ones give the rules that look across a copy's reports context).

    The rules of one row are NumPy over the columns; the rules that compare rows (uniqueness, counter regressions)
    run in Python over the rows that share a key or a copy only: a first exchange's hundreds of thousands of
    reports, one per copy, never reach them.

    Args:
        new: the reports committed since the last version (SPEC columns and types, and the commit column).
        stored: the reports an earlier exchange consumed for the copies ``new`` names (or None).
        facts: the nodes and groups, as :func:`bad_small_tables` judged them.
        alive: the alive servers of the consuming version (None: not checked).
        running: its running groups (None: not checked).

    Returns:
        True where a row of ``new`` breaks a rule.
    """
    columns = INPUT_TABLES["partition_reports"].fieldNames()
    schema = pa.schema([f.with_nullable(True) for f in new.select(columns).schema])
    rows = pa.concat_tables([t.select(columns).cast(schema) for t in (new, stored) if t is not None]).combine_chunks()
    n_new, n = new.num_rows, rows.num_rows
    is_new = np.arange(n) < n_new
    commits = np.concatenate([np.asarray(_commits(new), dtype=np.int64), np.full(n - n_new, -1, dtype=np.int64)])

    def null(c: str) -> B:
        return np.asarray(rows.column(c).is_null().to_numpy(zero_copy_only=False), dtype=bool)

    def values(c: str) -> npt.NDArray[np.int64]:
        return np.asarray(rows.column(c).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)

    counter, wal, pid, seq = values("update_counter"), values("wal_history_counter"), values("partition_id"), \
        values("report_seq")
    node_code, node_names = _codes(rows.column("node_id"))
    group_code, group_names = _codes(rows.column("group_name"))
    node_facts = [facts.nodes.get(name) for name in node_names]
    group_facts = [facts.groups.get(name) for name in group_names]
    node_ok = _per_code(node_code, [f is not None and f[0] and not f[1] for f in node_facts])  # a valid server
    group_ok = _per_code(group_code, [f is not None and bool(f[0]) for f in group_facts])
    partitions = _per_code(group_code, [f[1] if f is not None and f[0] and f[1] is not None else -1
                                        for f in group_facts], np.int64)
    state = rows.column("state")
    broken = (
        null("node_id") | null("group_name") | null("partition_id") | null("report_seq") | null("state")
        | ~np.asarray(pc.is_in(state, value_set=pa.array(sorted(STATES))).fill_null(True).to_numpy(
            zero_copy_only=False), dtype=bool)
        | null("update_counter") | (counter < 0) | null("size") | (values("size") < 0)
        | null("bytes") | (values("bytes") < 0)
        | (~null("wal_history_counter") & ((wal < 0) | (~null("update_counter") & (wal > counter))))
        | (~null("partition_id") & (pid < 0))
        | ((node_code >= 0) & ~node_ok)
        | ((group_code >= 0) & ~group_ok)
        | (group_ok & ~null("partition_id") & (partitions >= 0) & (pid >= partitions))
    )
    copy = _dense((node_code, group_code, np.where(null("partition_id"), -1, pid), null("partition_id")))
    newest = np.full(int(copy.max(initial=-1)) + 1, np.iinfo(np.int64).min)
    from_stored = ~is_new & ~null("report_seq")
    np.maximum.at(newest, copy[from_stored], seq[from_stored])
    stale = seq <= newest[copy]  # never true for a copy without a stored report (its newest is the minimum)
    alive_set, running_set = set(alive or ()), set(running or ())
    not_alive = np.zeros(n, dtype=bool) if alive is None else node_ok & ~_per_code(
        node_code, [name in alive_set for name in node_names])
    not_running = np.zeros(n, dtype=bool) if running is None else group_ok & ~_per_code(
        group_code, [name in running_set for name in group_names])
    bad = broken | (is_new & (stale | not_alive | not_running))

    # Rules across rows, on the rows that share a key (copy and report_seq) or a copy with another row only.
    key = _dense((copy, np.where(null("report_seq"), 0, seq), null("report_seq")))
    shared_key = np.flatnonzero(np.bincount(key)[key] > 1)
    if shared_key.size:
        some = rows.take(shared_key).to_pylist()
        bad[shared_key] |= _unique_bad([tuple(r[c] for c in (*_COPY, "report_seq")) for r in some],
                                       [_content(r, columns) for r in some], commits[shared_key].tolist(),
                                       is_new[shared_key].tolist(), main=True)
    shared_copy = np.flatnonzero(np.bincount(copy)[copy] > 1)
    if shared_copy.size:
        bad[shared_copy] |= _regressions(rows.take(shared_copy).to_pylist(), bad[shared_copy], facts)
    return bad[:n_new]


def _codes(column: pa.ChunkedArray) -> tuple[npt.NDArray[np.int64], list[Any]]:
    """Dictionary codes of a column (-1 for null) and the distinct values they index."""
    encoded = column.combine_chunks().dictionary_encode()
    codes = np.asarray(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, encoded.dictionary.to_pylist()


def _per_code(codes: npt.NDArray[np.int64], per_value: list[Any], dtype: Any = bool) -> npt.NDArray[Any]:
    """A value per row from one per distinct value (a null row, code -1, gets the zero of ``dtype``)."""
    table = np.asarray([*per_value, 0], dtype=dtype)  # index -1 reads the appended zero
    return table[codes]


def _dense(columns: tuple[npt.NDArray[Any], ...]) -> npt.NDArray[np.int64]:
    """One code per distinct combination of the columns' values, 0..k-1."""
    arrays = [np.asarray(c, dtype=np.int64) for c in columns]
    if arrays[0].size == 0:
        return np.zeros(0, dtype=np.int64)
    lows = [int(a.min()) for a in arrays]
    spans = [int(a.max()) - low + 1 for a, low in zip(arrays, lows, strict=True)]
    if math.prod(spans) < 2**62:  # one int64 per row (mixed radix): a 1-D unique, far faster than rows of a matrix
        combined = np.zeros(arrays[0].size, dtype=np.int64)
        for a, low, span in zip(arrays, lows, spans, strict=True):
            combined = combined * span + (a - low)
        return np.unique(combined, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return np.unique(np.stack(arrays, axis=1), axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _regressions(rows: list[dict[str, Any]], bad: B, facts: References) -> B:
    """The counter-regression rule, among the rows that broke no other rule (docs/VALIDATION.md, decision 8)."""
    out = np.zeros(len(rows), dtype=bool)
    by_copy: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_copy[tuple(r[c] for c in _COPY)].append(i)
    for indexes in by_copy.values():
        if len(indexes) < 2:
            continue
        indexes.sort(key=lambda i: (rows[i]["report_seq"] is None, rows[i]["report_seq"] or 0))
        segment = 0
        best: tuple[int, int, int] | None = None  # the greatest (segment, counter, seq) among earlier clean OWNING
        for i in indexes:
            r = rows[i]
            clean = not bad[i]
            if clean and r["state"] != OWNING:
                segment += 1
            owning = clean and r["state"] == OWNING
            group = facts.groups.get(r["group_name"])
            persistent = bool(group[2]) if group is not None else False
            if owning and persistent and best is not None and best[0] == segment and r["update_counter"] < best[1]:
                out[i] = True
            if owning:
                candidate = (segment, r["update_counter"], r["report_seq"])
                best = candidate if best is None or candidate > best else best
    return out
