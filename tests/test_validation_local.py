"""The driver-side verdicts (rebalancer/validation_local.py) agree with the Spark validator, row by row.

- The whole validation catalogue of tests/test_validation.py: the rows the driver calls bad are exactly the rows the
  catalogue expects rejected (its cases are all SPEC-typed).
- Random dirty rows (nulls, values outside an enum, negatives, blank names, duplicate keys across and within
  commits, references to missing, rejected or client nodes, stale and out-of-order reports, reports of dead nodes
  and stopped groups, counter regressions): the driver's bad rows are exactly the rows ``validate_inputs`` rejects.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer import validation_local as vl
from rebalancer.storage.base import COMMIT_COLUMN
from rebalancer.tables import INPUT_TABLES
from rebalancer.validation import ROW_COLUMN, Consumer, validate_inputs
from rebalancer.validation_local import bad_reports, bad_small_tables
from tests.test_validation import CASES, TABLES

# Each example runs Spark's validation (about 10 s on 2 cores beside the other test workers); the soak profile
# (`make soak`) runs 200. `make test` runs 3: the rules themselves get hundreds of examples without Spark (the
# columnwise test below, against the same rules row by row).
EXAMPLES = int(os.environ.get("VALIDATION_LOCAL_EXAMPLES",
                              "200" if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else "3"))


def arrow(table: str, rows: list[dict[str, Any]], commits: list[int] | None = None) -> pa.Table:
    schema = to_arrow_schema(INPUT_TABLES[table], timezone="UTC")
    out = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    if commits is not None:
        out = out.append_column(COMMIT_COLUMN, pa.array(commits, pa.int64()))
    return out


def test_the_driver_calls_bad_exactly_the_rows_the_catalogue_rejects() -> None:
    rows = {t: [r for c in CASES.values() for r in c.rows[t]] for t in TABLES}
    small = {t: arrow(t, rows[t]) for t in ("cache_groups", "nodes", "topology_events")}
    bad, references = bad_small_tables(small)
    bad["partition_reports"] = bad_reports(arrow("partition_reports", rows["partition_reports"]), None, references)
    expected = {t: Counter(id(r) for c in CASES.values() for tt, r, _ in c.rejected if tt == t) for t in TABLES}
    for t in TABLES:
        got = Counter(id(r) for r, b in zip(rows[t], bad[t].tolist(), strict=True) if b)
        # exact copies: which copy is rejected is not specified, so compare by content
        as_content = Counter(repr(sorted(r.items())) for r, b in zip(rows[t], bad[t].tolist(), strict=True) if b)
        wanted = Counter(repr(sorted(r.items())) for c in CASES.values() for tt, r, _ in c.rejected if tt == t)
        assert as_content == wanted, f"{t}: driver {sorted(as_content - wanted)} vs catalogue " \
                                     f"{sorted(wanted - as_content)}"
        assert sum(got.values()) == sum(expected[t].values())


NODES = ["a", "b", "c", "d", " "]
GROUPS = ["g", "h", "x", ""]


@st.composite
def dirty_inputs(draw: st.DrawFn) -> dict[str, Any]:
    maybe = st.one_of
    nodes = [
        {"node_id": draw(maybe(st.none(), st.sampled_from(NODES))), "node_order": draw(maybe(st.none(),
                                                                                             st.integers(1, 4))),
         "node_uuid": draw(st.sampled_from([None, None, "00000000-0000-0000-0000-000000000001", "nope"])),
         "capacity": draw(st.sampled_from([None, 1.0, 2.0, 0.0, -1.0, float("nan"), float("inf")])),
         "is_client": draw(st.sampled_from([None, False, True])), "host": "h", "attributes": None}
        for _ in range(draw(st.integers(1, 5)))
    ]
    groups = [
        {"group_name": draw(maybe(st.none(), st.sampled_from(GROUPS))),
         "partitions": draw(st.sampled_from([None, 0, 1, 3, 70000])),
         "backups": draw(st.sampled_from([None, -1, 0, 1])),
         "mode": draw(st.sampled_from([None, "PARTITIONED", "partitioned"])),
         "affinity": draw(st.sampled_from([None, "ignite", "other"])),
         "backup_filter": draw(st.sampled_from([None, [], ["zone"], ["zone", None]])),
         "loss_policy": draw(st.sampled_from([None, "IGNORE", "NOPE"])),
         "persistent": draw(st.sampled_from([None, True, False])),
         "partitioner": draw(st.sampled_from([None, "murmur3", "bad"]))}
        for _ in range(draw(st.integers(1, 4)))
    ]
    events = [
        {"event_seq": draw(maybe(st.none(), st.integers(1, 3))),
         "event_type": draw(st.sampled_from([None, "NODE_JOINED", "CACHE_STARTED", "RESET_LOST_PARTITIONS", "X"])),
         "node_id": draw(maybe(st.none(), st.sampled_from(NODES + ["ghost"]))),
         "group_name": draw(maybe(st.none(), st.sampled_from(GROUPS + ["nope"])))}
        for _ in range(draw(st.integers(0, 4)))
    ]
    report = st.fixed_dictionaries({
        "node_id": maybe(st.none(), st.sampled_from(NODES + ["ghost"])),
        "group_name": maybe(st.none(), st.sampled_from(GROUPS + ["nope"])),
        "partition_id": maybe(st.none(), st.integers(-1, 3)),
        "state": st.sampled_from([None, "OWNING", "OWNING", "MOVING", "EVICTED", "owning"]),
        "update_counter": maybe(st.none(), st.integers(-1, 6)),
        "size": st.sampled_from([None, -1, 1, 2]),
        "bytes": st.sampled_from([None, -1, 10]),
        "wal_history_counter": maybe(st.none(), st.integers(-1, 6)),
        "report_seq": maybe(st.none(), st.integers(1, 6)),
    })
    stored = draw(st.lists(report, max_size=4))
    new = draw(st.lists(report, max_size=8))
    return {
        "nodes": nodes, "groups": groups, "events": events,
        "event_commits": draw(st.lists(st.integers(1, 3), min_size=len(events), max_size=len(events))),
        "stored": stored, "new": new,
        "new_commits": draw(st.lists(st.integers(1, 3), min_size=len(new), max_size=len(new))),
        "alive": draw(st.lists(st.sampled_from(NODES), unique=True, max_size=3)),
        "running": draw(st.lists(st.sampled_from(GROUPS), unique=True, max_size=2)),
    }


def _tables(data: dict[str, Any]) -> tuple[dict[str, pa.Table], pa.Table, pa.Table]:
    """A drawn example as Arrow: the three small tables, the new reports and the stored ones."""
    small = {
        "cache_groups": arrow("cache_groups", data["groups"]),
        "nodes": arrow("nodes", data["nodes"]),
        "topology_events": arrow("topology_events", data["events"], data["event_commits"]),
    }
    return small, arrow("partition_reports", data["new"], data["new_commits"]), arrow("partition_reports",
                                                                                       data["stored"])


@pytest.mark.slow  # Spark's validator plans for seconds per example: `make spark-slow` (CI)
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=dirty_inputs())
def test_the_driver_and_spark_reject_the_same_rows(spark: SparkSession, data: dict[str, Any]) -> None:
    small, new, stored = _tables(data)
    bad, references = bad_small_tables(small)
    bad["partition_reports"] = bad_reports(new, stored, references, data["alive"], data["running"])

    def numbered(t: pa.Table) -> Any:
        return spark.createDataFrame(t.append_column(ROW_COLUMN, pa.array(np.arange(t.num_rows), pa.int64())))

    raw = {name: numbered(t) for name, t in small.items()}
    raw["partition_reports"] = numbered(new)
    consumer = Consumer("9.0", tuple(data["alive"]), tuple(data["running"]))
    validated = validate_inputs(raw, exchange_id=1, stored_reports=spark.createDataFrame(stored), consumer=consumer)
    rejected = validated.numbered.select("table_name", ROW_COLUMN, "reason").collect()
    for table in TABLES:
        spark_bad = sorted(r[ROW_COLUMN] for r in rejected if r["table_name"] == table)
        local_bad = np.flatnonzero(bad[table]).tolist()
        note(f"{table}: spark {[(r[ROW_COLUMN], r['reason']) for r in rejected if r['table_name'] == table]}")
        assert local_bad == spark_bad, f"{table}: driver {local_bad} vs spark {spark_bad}"


def _row_by_row(
    new: pa.Table,
    stored: pa.Table | None,
    facts: Any,
    alive: list[str] | None = None,
    running: list[str] | None = None,
) -> Any:
    """The rules as the catalogue states them, one row at a time (the driver's code before it went columnwise)."""
    columns = INPUT_TABLES["partition_reports"].fieldNames()
    rows = vl._rows(new, columns)
    old = vl._rows(stored, columns) if stored is not None else []
    all_rows = rows + old
    is_new = [True] * len(rows) + [False] * len(old)
    commits = vl._commits(new) + [-1] * len(old)
    alive_set = None if alive is None else set(alive)
    running_set = None if running is None else set(running)
    newest_stored: dict[tuple[Any, ...], int] = {}
    for r in old:
        key = tuple(r[c] for c in vl._COPY)
        if r["report_seq"] is not None:
            newest_stored[key] = max(newest_stored.get(key, r["report_seq"]), r["report_seq"])
    bad = np.zeros(len(all_rows), dtype=bool)
    for i, r in enumerate(all_rows):
        node = facts.nodes.get(r["node_id"]) if r["node_id"] is not None else None
        group = facts.groups.get(r["group_name"]) if r["group_name"] is not None else None
        counter, wal, pid = r["update_counter"], r["wal_history_counter"], r["partition_id"]
        broken = (
            any(r[c] is None for c in ("node_id", "group_name", "partition_id", "report_seq", "state"))
            or (r["state"] is not None and r["state"] not in vl.STATES)
            or counter is None or counter < 0 or r["size"] is None or r["size"] < 0
            or r["bytes"] is None or r["bytes"] < 0
            or (wal is not None and (wal < 0 or (counter is not None and wal > counter)))
            or (pid is not None and pid < 0)
            or (r["node_id"] is not None and (node is None or not node[0] or node[1]))
            or (r["group_name"] is not None and (group is None or not group[0]))
            or (group is not None and group[0] and pid is not None and group[1] is not None and pid >= group[1])
        )
        if is_new[i] and not broken:
            key = tuple(r[c] for c in vl._COPY)
            stale = key in newest_stored and r["report_seq"] <= newest_stored[key]
            not_alive = alive_set is not None and node is not None and node[0] and not node[1] \
                and r["node_id"] not in alive_set
            not_running = running_set is not None and group is not None and group[0] \
                and r["group_name"] not in running_set
            broken = stale or not_alive or not_running
        bad[i] = broken
    keys = [tuple(r[c] for c in (*vl._COPY, "report_seq")) for r in all_rows]
    bad |= vl._unique_bad(keys, [vl._content(r, columns) for r in all_rows], commits, is_new, main=True)
    bad |= vl._regressions(all_rows, bad, facts)
    return bad[: len(rows)]


@st.composite
def mostly_clean_reports(draw: st.DrawFn) -> dict[str, Any]:
    """Valid nodes and groups; reports over a few copies, each field valid most of the time, so that a row breaks
    one rule at a time and copies share keys, stored reports and counters (each rule shows, not masked by others)."""
    uuid = "00000000-0000-0000-0000-00000000000"
    nodes = [{"node_id": n, "node_order": i + 1, "node_uuid": f"{uuid}{i}", "capacity": 1.0, "is_client": n == "d",
              "host": "h", "attributes": None} for i, n in enumerate("abcd")]
    groups = [{"group_name": g, "partitions": 3, "backups": 1, "mode": "PARTITIONED", "affinity": "rendezvous",
               "backup_filter": None, "loss_policy": "IGNORE", "persistent": g == "g", "partitioner": None}
              for g in "gh"]
    report = st.fixed_dictionaries({
        "node_id": st.sampled_from(["a", "b", "c"] * 4 + ["d", "ghost", None]),
        "group_name": st.sampled_from(["g", "h"] * 6 + ["x", None]),
        "partition_id": st.sampled_from([0, 1, 2] * 4 + [3, -1, None]),
        "state": st.sampled_from(["OWNING"] * 10 + ["MOVING", "EVICTED", "owning", None]),
        "update_counter": st.sampled_from([0, 2, 4, 6] * 3 + [-1, None]),
        "size": st.sampled_from([1] * 12 + [-1, None]),
        "bytes": st.sampled_from([10] * 12 + [-1, None]),
        "wal_history_counter": st.sampled_from([None, 0, 1] * 4 + [7, -1]),
        "report_seq": st.sampled_from([1, 2, 3, 4] * 3 + [None]),
    })
    new = draw(st.lists(report, max_size=10))
    return {
        "nodes": nodes, "groups": groups, "events": [], "event_commits": [],
        "stored": draw(st.lists(report, max_size=6)), "new": new,
        "new_commits": draw(st.lists(st.integers(1, 3), min_size=len(new), max_size=len(new))),
        "alive": draw(st.sampled_from([["a", "b", "c"], ["a", "b", "c"], ["a", "b"]])),
        "running": draw(st.sampled_from([["g", "h"], ["g", "h"], ["g"]])),
    }


@settings(max_examples=3000 if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else 300, deadline=None)
@given(data=st.one_of(mostly_clean_reports(), dirty_inputs()))
def test_the_columnwise_report_rules_give_the_row_by_row_verdicts(data: dict[str, Any]) -> None:
    """No Spark: the reports' rules as NumPy over columns (only rows sharing a key or a copy reach Python) call bad
    exactly the rows the same rules applied row by row do."""
    small, new, stored = _tables(data)
    _, references = bad_small_tables(small)
    for kept, alive, running in ((stored, data["alive"], data["running"]), (None, None, None)):
        assert bad_reports(new, kept, references, alive, running).tolist() == \
            _row_by_row(new, kept, references, alive, running).tolist()
