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
    rows = _rows(new, columns)
    old = _rows(stored, columns) if stored is not None else []
    all_rows = rows + old
    is_new = [True] * len(rows) + [False] * len(old)
    commits = _commits(new) + [-1] * len(old)
    alive_set = None if alive is None else set(alive)
    running_set = None if running is None else set(running)
    newest_stored: dict[tuple[Any, ...], int] = {}
    for r in old:
        key = tuple(r[c] for c in _COPY)
        if r["report_seq"] is not None:
            newest_stored[key] = max(newest_stored.get(key, r["report_seq"]), r["report_seq"])
    bad = np.zeros(len(all_rows), dtype=bool)
    for i, r in enumerate(all_rows):
        node = facts.nodes.get(r["node_id"]) if r["node_id"] is not None else None
        group = facts.groups.get(r["group_name"]) if r["group_name"] is not None else None
        counter, wal, pid = r["update_counter"], r["wal_history_counter"], r["partition_id"]
        broken = (
            any(r[c] is None for c in ("node_id", "group_name", "partition_id", "report_seq", "state"))
            or (r["state"] is not None and r["state"] not in STATES)
            or counter is None or counter < 0 or r["size"] is None or r["size"] < 0
            or r["bytes"] is None or r["bytes"] < 0
            or (wal is not None and (wal < 0 or (counter is not None and wal > counter)))
            or (pid is not None and pid < 0)
            or (r["node_id"] is not None and (node is None or not node[0] or node[1]))
            or (r["group_name"] is not None and (group is None or not group[0]))
            or (group is not None and group[0] and pid is not None and group[1] is not None and pid >= group[1])
        )
        if is_new[i] and not broken:
            key = tuple(r[c] for c in _COPY)
            stale = key in newest_stored and r["report_seq"] <= newest_stored[key]
            not_alive = alive_set is not None and node is not None and node[0] and not node[1] \
                and r["node_id"] not in alive_set
            not_running = running_set is not None and group is not None and group[0] \
                and r["group_name"] not in running_set
            broken = stale or not_alive or not_running
        bad[i] = broken
    keys = [tuple(r[c] for c in (*_COPY, "report_seq")) for r in all_rows]
    bad |= _unique_bad(keys, [_content(r, columns) for r in all_rows], commits, is_new, main=True)
    bad |= _regressions(all_rows, bad, facts)
    return bad[: len(rows)]


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
