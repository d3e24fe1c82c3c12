"""Issue 8, the bad input catalogue: one test per item, each checking the reason text, the ``rejected_rows`` entry
and that valid rows are untouched (docs/VALIDATION.md, "Issue 8 catalogue", maps each item to its test).

Cheap first: the row rules run through one shared ``validate_inputs`` call over every scenario's rows (each row
carries an extra ``case`` column, which validation ignores and which finds the row again in ``row_json``). Then one
warehouse goes through the exchange-level items in three runs (bad reports beside valid ones, an impossible
NODE_LEFT, an empty cluster, a late event), and a warehouse with one bad report shows strict mode and ``--strict``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rebalancer.cli import main
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange
from rebalancer.tables import TOPOLOGY_EVENTS
from rebalancer.validation import InputSchemaError, InvalidInputError, validate_inputs
from tests.exchange_scenarios import T0, Cluster

STATES = "OWNING, MOVING, RENTING, EVICTED, LOST"
EVENT_TYPES = ("NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING, CACHE_STARTED, CACHE_STOPPED, "
               "RESET_LOST_PARTITIONS, BASELINE_CHANGED, CLUSTER_ACTIVATED, CLUSTER_DEACTIVATED")

# =====================================================================================================================
# The rows: (case, expected reason or None for a valid row, then the row's SPEC values)
# =====================================================================================================================

VALID = None

# cache_groups: case, expected, group_name, partitions, backups, persistent
GROUPS: list[tuple[Any, ...]] = [
    ("base", VALID, "g", 4, 1, None),
    ("backups_exceed_nodes", VALID, "wide", 2, 9, None),  # 3 nodes: valid, replicas = min(backups + 1, nodes)
    ("null_keys", "group_name is null; it must be a unique name", None, 4, 1, None),
]

# nodes: case, expected, node_id, node_order
NODES: list[tuple[Any, ...]] = [
    ("base", VALID, "n1", 1),
    ("base", VALID, "n2", 2),
    ("base", VALID, "n3", 3),
    ("null_keys", "node_id is null; it must be a unique consistent id", None, 4),
    ("null_keys", "node_order is null; it must be a unique bigint join order", "n9", None),
]

# topology_events: case, expected, event_seq, event_type, node_id, group_name
EVENTS: list[tuple[Any, ...]] = [
    ("base", VALID, 1, "NODE_JOINED", "n1", None),
    ("base", VALID, 2, "NODE_JOINED", "n2", None),
    ("base", VALID, 3, "NODE_JOINED", "n3", None),
    ("unknown_type", f"event_type 'NODE_EXPLODED' is not one of {EVENT_TYPES}", 10, "NODE_EXPLODED", "n1", None),
    ("unknown_type", f"event_type 'node_joined' is not one of {EVENT_TYPES}", 11, "node_joined", "n1", None),
    ("unknown_node", "node_id 'ghost' is not in nodes", 12, "NODE_JOINED", "ghost", None),
    ("unknown_node", "group_name 'nope' is not in cache_groups", 13, "CACHE_STOPPED", None, "nope"),
    ("duplicate_seq", "event_seq 14 appears in 2 different topology_events rows committed together; it must be "
     "unique, so all of them are rejected", 14, "NODE_LEFT", "n1", None),
    ("duplicate_seq", "event_seq 14 appears in 2 different topology_events rows committed together; it must be "
     "unique, so all of them are rejected", 14, "NODE_FAILED", "n1", None),
    ("exact_copy_seq", VALID, 15, "NODE_LEFT", "n2", None),
    ("exact_copy_seq", "exact duplicate of another topology_events row (one copy is used, the others are rejected)",
     15, "NODE_LEFT", "n2", None),
    ("null_keys", "event_seq is null; it must be a unique bigint", None, "NODE_LEFT", "n1", None),
    ("null_keys", f"event_type is null; it must be one of {EVENT_TYPES}", 16, None, "n1", None),
    ("null_keys", "NODE_LEFT event has no node_id; NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING events need one",
     17, "NODE_LEFT", None, None),
]


def _r(case: str, expected: str | None, node: str | None, group: str | None, partition: Any, state: str | None,
       counter: Any, seq: int | None, size: int = 5) -> tuple[Any, ...]:
    """A report row; partition_id and update_counter are written as text (the table's columns are strings)."""
    text = (None if partition is None else str(partition), None if counter is None else str(counter))
    return (case, expected, node, group, text[0], state, text[1], size, size * 10, None, seq)


_NOT_LOWER = "the counter of a persistent OWNING copy never decreases"
REPORTS: list[tuple[Any, ...]] = [
    *[_r("base", VALID, n, "g", p, "OWNING", 10, 100 + 10 * i + p) for i, n in enumerate(("n1", "n2"))
      for p in range(4)],
    *[_r("base", VALID, n, "wide", p, "OWNING", 10, 200 + 10 * i + p) for i, n in enumerate(("n1", "n2"))
      for p in range(2)],
    _r("unknown_state", f"state 'OWNED' is not one of {STATES}", "n3", "g", 0, "OWNED", 10, 1),
    _r("unknown_state", f"state 'owning' is not one of {STATES}", "n3", "g", 1, "owning", 10, 2),
    _r("negative_counters", "update_counter -1 is negative; it must be >= 0", "n3", "g", 0, "OWNING", -1, 3),
    _r("negative_counters", "size -5 is negative; it must be >= 0; bytes -50 is negative; it must be >= 0",
       "n3", "g", 1, "OWNING", 10, 4, size=-5),
    # n3/g/2: 50, then 40 with no reset in between (rejected), then 60 (valid: compared with the run's max 50)
    _r("decreasing_counter", VALID, "n3", "g", 2, "OWNING", 50, 30),
    _r("decreasing_counter", "update_counter 40 is lower than 50 in the earlier OWNING report of this copy "
       f"(report_seq 30) with no MOVING, RENTING, EVICTED or LOST report in between; {_NOT_LOWER}",
       "n3", "g", 2, "OWNING", 40, 31),
    _r("decreasing_counter", VALID, "n3", "g", 2, "OWNING", 60, 32),
    # n3/g/3: 50, then MOVING (cleared for a full rebalance), then OWNING again from 5: a legitimate restart
    _r("decreasing_counter", VALID, "n3", "g", 3, "OWNING", 50, 33),
    _r("decreasing_counter", VALID, "n3", "g", 3, "MOVING", 0, 34),
    _r("decreasing_counter", VALID, "n3", "g", 3, "OWNING", 5, 35),
    _r("duplicate_report_seq", "report_seq 40 of node 'n3', group 'wide', partition 1 appears in 2 different "
       "partition_reports rows committed together; it must be unique per copy, so all of them are rejected",
       "n3", "wide", 1, "OWNING", 10, 40),
    _r("duplicate_report_seq", "report_seq 40 of node 'n3', group 'wide', partition 1 appears in 2 different "
       "partition_reports rows committed together; it must be unique per copy, so all of them are rejected",
       "n3", "wide", 1, "OWNING", 11, 40),
    _r("duplicate_report_seq", VALID, "n3", "wide", 0, "OWNING", 10, 41),
    _r("duplicate_report_seq", "exact duplicate of another partition_reports row (one copy is used, the others are "
       "rejected)", "n3", "wide", 0, "OWNING", 10, 41),
    _r("partition_out_of_range", "partition_id 4 is out of range for group 'g', which has 4 partitions (0..3)",
       "n1", "g", 4, "OWNING", 10, 50),
    _r("partition_out_of_range", "partition_id -1 is negative; it must be >= 0", "n1", "g", -1, "OWNING", 10, 51),
    _r("partition_out_of_range", "partition_id 2 is out of range for group 'wide', which has 2 partitions (0..1)",
       "n1", "wide", 2, "OWNING", 10, 52),
    _r("unknown_reporter", "node_id 'ghost' is not in nodes", "ghost", "g", 0, "OWNING", 10, 60),
    _r("unknown_reporter", "group_name 'nope' is not in cache_groups", "n1", "nope", 0, "OWNING", 10, 61),
    _r("null_keys", "node_id is null; it must be the id of the reporting node", None, "g", 0, "OWNING", 10, 70),
    _r("null_keys", "group_name is null; it must be the name of the reported cache group",
       "n1", None, 0, "OWNING", 10, 71),
    _r("null_keys", "partition_id is null; it must be an int >= 0", "n1", "g", None, "OWNING", 10, 72),
    _r("null_keys", "report_seq is null; it must be a bigint (the latest report per node, group and partition "
       "wins)", "n1", "g", 0, "OWNING", 10, None),
    _r("null_keys", f"state is null; it must be one of {STATES}", "n1", "g", 0, None, 10, 73),
    _r("wrong_types", "partition_id: 'abc' is not an int", "n1", "g", "abc", "OWNING", 10, 80),
    _r("wrong_types", "update_counter: '1.5' is not a bigint", "n1", "g", 0, "OWNING", "1.5", 81),
    _r("wrong_types", "partition_id: '3000000000' is not an int", "n1", "g", 3000000000, "OWNING", 10, 82),
]

SCHEMAS = {
    "cache_groups": "case string, group_name string, partitions int, backups int, mode string, affinity string, "
    "exclude_neighbors boolean, backup_filter array<string>, loss_policy string, persistent boolean, "
    "partitioner string",
    "nodes": "case string, node_id string, node_uuid string, node_order bigint, host string, "
    "attributes map<string,string>, capacity double, is_client boolean",
    "topology_events": "case string, event_seq bigint, event_type string, node_id string, group_name string, "
    "event_time timestamp",
    # partition_id and update_counter as text, as a careless writer would store them: values are cast row by row
    "partition_reports": "case string, node_id string, group_name string, partition_id string, state string, "
    "update_counter string, size bigint, bytes bigint, wal_history_counter bigint, report_seq bigint",
}


def _raw_rows() -> dict[str, list[tuple[Any, ...]]]:
    """Every scenario row as written (with the case column), by table; and without the expected reason."""
    return {
        "cache_groups": [(c, g, p, b, None, None, None, None, None, pers, None) for c, _, g, p, b, pers in GROUPS],
        "nodes": [(c, n, None, o, n and f"h-{n}", {}, 1.0, False) for c, _, n, o in NODES],
        "topology_events": [(c, s, t, n, g, T0 + timedelta(seconds=s or 0)) for c, _, s, t, n, g in EVENTS],
        "partition_reports": [(r[0], *r[2:]) for r in REPORTS],
    }


EXPECTED = {"cache_groups": GROUPS, "nodes": NODES, "topology_events": EVENTS, "partition_reports": REPORTS}


@dataclass(frozen=True)
class Outcome:
    """The shared validation: rejected rows by case, valid rows (SPEC columns) by table."""

    rejected: dict[str, list[tuple[str, dict[str, Any], str, int]]]  # case -> (table, row, reason, exchange_id)
    valid: dict[str, list[tuple[Any, ...]]]


@pytest.fixture(scope="module")
def outcome(spark: SparkSession) -> Outcome:
    raw = {name: spark.createDataFrame(rows, SCHEMAS[name]) for name, rows in _raw_rows().items()}
    validated = validate_inputs(raw, exchange_id=8)
    rejected: dict[str, list[tuple[str, dict[str, Any], str, int]]] = defaultdict(list)
    for r in validated.rejected.collect():
        row = json.loads(r.row_json)
        rejected[row["case"]].append((r.table_name, row, r.reason, r.exchange_id))
    valid = {name: [tuple(r) for r in df.collect()] for name, df in validated.valid.items()}
    return Outcome(dict(rejected), valid)


def _spec_values(table: str, written: tuple[Any, ...]) -> tuple[Any, ...]:
    """A written valid row as validation returns it: the SPEC columns, cast to the SPEC types."""
    values = list(written[1:])
    if table == "partition_reports":
        values[2], values[4] = int(values[2]), int(values[4])
    if table == "topology_events":
        values[4] = values[4].replace(tzinfo=None)  # Spark returns naive local (UTC in the suite) datetimes
    return tuple(values)


def check_case(outcome: Outcome, case: str) -> None:
    """Every row of ``case``: a bad row is in rejected_rows with exactly its reason, a valid row is in the valid
    frame unchanged; and nothing else of the case is rejected."""
    expected_rejected: list[tuple[str, str]] = []
    raw = _raw_rows()
    for table, rows in EXPECTED.items():
        for (row_case, reason, *_), written in zip(rows, raw[table], strict=True):
            if row_case != case:
                continue
            if reason is None:
                assert _spec_values(table, written) in outcome.valid[table], (table, written)
            else:
                expected_rejected.append((table, reason))
    actual = [(table, reason) for table, _, reason, _ in outcome.rejected.get(case, [])]
    assert sorted(actual) == sorted(expected_rejected)
    assert all(exchange_id == 8 for *_, exchange_id in outcome.rejected.get(case, []))


# =====================================================================================================================
# Row rules (one shared validate_inputs call)
# =====================================================================================================================


def test_unknown_state_or_event_type_is_rejected_naming_the_allowed_values(outcome: Outcome) -> None:
    check_case(outcome, "unknown_state")
    check_case(outcome, "unknown_type")


def test_negative_counters_are_rejected(outcome: Outcome) -> None:
    check_case(outcome, "negative_counters")


def test_decreasing_owning_counter_is_rejected_but_a_restart_after_a_reset_is_valid(outcome: Outcome) -> None:
    check_case(outcome, "decreasing_counter")


def test_duplicate_reports_with_one_report_seq_are_all_rejected_and_exact_copies_keep_one(outcome: Outcome) -> None:
    check_case(outcome, "duplicate_report_seq")
    kept = [r for r in outcome.valid["partition_reports"] if r[:3] == ("n3", "wide", 0)]
    assert len(kept) == 1


def test_partition_id_out_of_range_is_rejected(outcome: Outcome) -> None:
    check_case(outcome, "partition_out_of_range")


def test_reports_from_unknown_nodes_or_groups_are_rejected(outcome: Outcome) -> None:
    check_case(outcome, "unknown_reporter")


def test_nulls_in_key_columns_are_rejected(outcome: Outcome) -> None:
    check_case(outcome, "null_keys")


def test_wrong_value_types_reject_the_row_and_wrong_column_types_the_table(
    spark: SparkSession, outcome: Outcome
) -> None:
    check_case(outcome, "wrong_types")
    # a whole column of a type that never casts is a writer bug: the run stops, naming the column and both types
    raw = {name: spark.createDataFrame([], schema) for name, schema in SCHEMAS.items()}
    groups_schema = SCHEMAS["cache_groups"].replace("partitions int", "partitions boolean")
    raw["cache_groups"] = spark.createDataFrame([], groups_schema)
    with pytest.raises(InputSchemaError, match=r"cache_groups: column type\(s\) that cannot be cast: partitions is "
                       r"boolean \(expected int\)"):
        validate_inputs(raw)


def test_duplicate_event_seq_is_rejected(outcome: Outcome) -> None:
    check_case(outcome, "duplicate_seq")
    check_case(outcome, "exact_copy_seq")


def test_event_for_unknown_node_or_group_is_rejected(outcome: Outcome) -> None:
    check_case(outcome, "unknown_node")


def test_group_with_more_backups_than_nodes_is_valid(outcome: Outcome) -> None:
    check_case(outcome, "backups_exceed_nodes")  # valid: 9 backups over 3 nodes is 3 copies (see the exchange test)


def test_missing_input_table_is_an_input_schema_error(spark: SparkSession) -> None:
    raw = {name: spark.createDataFrame([], schema) for name, schema in SCHEMAS.items() if name != "nodes"}
    with pytest.raises(InputSchemaError) as error:
        validate_inputs(raw)
    assert str(error.value) == (
        "missing input table(s): nodes (all of cache_groups, nodes, topology_events, partition_reports are needed; "
        "`rebalancer init` creates the missing ones empty)"
    )


def test_valid_rows_pass_unchanged_beside_every_bad_row(outcome: Outcome) -> None:
    """Nothing valid is dropped or altered, whatever bad rows sit next to it (exact copies: one is kept)."""
    raw = _raw_rows()
    for table, rows in EXPECTED.items():
        expected = {repr(_spec_values(table, w)) for r, w in zip(rows, raw[table], strict=True) if r[1] is None}
        actual = [repr(v) for v in outcome.valid[table]]
        assert sorted(actual) == sorted(expected), table
    for case in {row[0] for rows in EXPECTED.values() for row in rows}:
        check_case(outcome, case)


# =====================================================================================================================
# Exchange level: one warehouse, three runs
# =====================================================================================================================

REPORT_SCHEMA = "node_id string, group_name string, partition_id int, state string, update_counter bigint, " \
    "size bigint, bytes bigint, wal_history_counter bigint, report_seq bigint"


@dataclass(frozen=True)
class History:
    cluster: Cluster
    first: list[Any]  # ExchangeSummary: n1 and n2 join; bad reports beside valid ones
    second: list[Any]  # NODE_LEFT n1, NODE_LEFT n1 again, NODE_FAILED n2: no server left
    third: list[Any]  # a late event (event_seq 3, appended after the exchange that applied 4 and 6)

    def rejected(self, table: str) -> dict[int, list[tuple[str, int]]]:
        """``rejected_rows`` of ``table`` by the row's event_seq (events) or report_seq (reports)."""
        key = "event_seq" if table == "topology_events" else "report_seq"
        out: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for r in self.cluster.warehouse.read("rejected_rows").where(F.col("table_name") == table).collect():
            out[json.loads(r.row_json)[key]].append((r.reason, r.exchange_id))
        return dict(out)


@pytest.fixture(scope="module")
def history(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> History:
    c = Cluster.create(spark, tmp_path_factory.mktemp("bad_input") / "w")
    c.group("g", 3, 1)
    c.group("wide", 2, 5)  # 5 backups, 2 nodes
    c.join("n1", "n2")  # events 1, 2
    c.report([(n, g, p, "OWNING", 10, 5, None) for g, parts in (("g", 3), ("wide", 2)) for p in range(parts)
              for n in ("n1", "n2")])  # report_seq 1..10
    bad = [
        ("n1", "g", 0, "OWNED", 99, 7, 70, None, 100),  # newer than n1's valid report of g/0, but unusable
        ("ghost", "g", 1, "OWNING", 99, 7, 70, None, 101),
        ("n2", "g", 3, "OWNING", 99, 7, 70, None, 102),
    ]
    c.warehouse.append("partition_reports", spark.createDataFrame(bad, REPORT_SCHEMA))
    first = c.exchange()
    c._seq = 3  # event_seq 3 stays free: the late event below takes it
    c.event("NODE_LEFT", node="n1")  # 4
    c.event("NODE_LEFT", node="n1")  # 5: n1 is already gone
    c.event("NODE_FAILED", node="n2")  # 6: no server is left
    second = c.exchange()
    c.node("n3")
    late = [(3, "NODE_JOINED", "n3", None, T0 + timedelta(seconds=30))]
    c.warehouse.append("topology_events", spark.createDataFrame(late, TOPOLOGY_EVENTS))
    third = c.exchange()
    return History(c, first, second, third)


def test_bad_reports_go_to_rejected_rows_and_valid_data_still_flows(history: History) -> None:
    c = history.cluster
    [s] = history.first
    assert (s.topology_major, s.topology_minor, s.exchange_type, s.merged_event_seqs) == (2, 0, "ALL", (1, 2))
    # the map is exactly the valid reports: n1's newer OWNED report of g/0 did not replace its valid one
    assert c.rows("partition_map", (2, 0), "group_name", "partition_id", "node_id", "state", "update_counter",
                  "size") == {(g, p, n, "OWNING", 10, 5) for g, parts in (("g", 3), ("wide", 2))
                              for p in range(parts) for n in ("n1", "n2")}
    assert s.lost_partitions == 0 and s.moving_copies == 0 and s.migrations == 0
    assert history.rejected("partition_reports") == {
        100: [(f"state 'OWNED' is not one of {STATES}", 1)],
        101: [("node_id 'ghost' is not in nodes", 1)],
        102: [("partition_id 3 is out of range for group 'g', which has 3 partitions (0..2)", 1)],
    }
    assert "cache_groups" not in {r.table_name for r in c.warehouse.read("rejected_rows").collect()}


def test_group_with_more_backups_than_nodes_gets_one_copy_per_node(history: History) -> None:
    # replicas = min(backups + 1, alive servers): wide (5 backups) has 2 copies on 2 nodes, and nothing is rejected
    ideal = history.cluster.rows("ideal_assignment", (2, 0), "group_name", "partition_id", "replica_index", "node_id")
    wide = sorted((p, i, n) for g, p, i, n in ideal if g == "wide")
    assert [(p, i) for p, i, _ in wide] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {n for _, _, n in wide} == {"n1", "n2"}
    assert history.first[0].partitions == 5


def test_node_left_for_a_node_already_gone_is_rejected(history: History) -> None:
    [s] = history.second
    assert s.merged_event_seqs == (4, 6)  # the valid events around it still apply
    assert history.rejected("topology_events")[5] == [(
        "NODE_LEFT for node 'n1', which is not alive (it already left or failed, or never joined); the event "
        "changes nothing", 2)]


def test_empty_cluster_commits_every_partition_lost_and_nothing_to_assign(
    spark: SparkSession, history: History, tmp_path: Path
) -> None:
    c = history.cluster
    [s] = history.second
    assert (s.topology_major, s.topology_minor, s.exchange_type) == (4, 0, "ALL")
    assert (s.coordinator, s.alive_servers, s.alive_clients) == (None, 0, 0)
    assert (s.partitions, s.lost_partitions, s.migrations, s.moving_copies) == (5, 5, 0, 0)
    for name in ("topology", "ideal_assignment", "affinity_assignment", "partition_map", "migration_plan",
                 "client_affinity"):
        assert c.rows(name, (4, 0)) == set(), name
    assert c.rows("lost_partitions", (4, 0)) == {
        (g, p, "READ_WRITE_SAFE", False, False) for g, parts in (("g", 3), ("wide", 2)) for p in range(parts)
    }
    # a warehouse with groups but no node at all: nothing to do, nothing committed
    empty = Cluster.create(spark, tmp_path / "empty")
    empty.group("g", 3, 1)
    assert empty.exchange() == []
    assert empty.warehouse.read("exchanges").count() == 0


def test_late_event_reason_names_the_seq_to_append_above() -> None:
    from rebalancer.exchange.events import Event, late_events

    [rejection] = late_events([Event(3, "NODE_JOINED", node_id="n3")], 6)
    assert rejection.event.event_seq == 3
    assert rejection.reason == (
        "NODE_JOINED event_seq 3 arrived late: committed exchanges already applied the events up to event_seq 6, "
        "so this event was never applied (versions are not rewritten); append it again with an event_seq above 6"
    )


def test_late_event_with_a_lower_event_seq_is_rejected_not_silently_skipped(history: History) -> None:
    assert history.third == []  # nothing to commit: the late event is not applied, committed versions stay
    assert history.rejected("topology_events") == {
        5: [("NODE_LEFT for node 'n1', which is not alive (it already left or failed, or never joined); the event "
             "changes nothing", 2)],  # still one entry: an event already rejected is not also "late"
        3: [("NODE_JOINED event_seq 3 arrived late: committed exchanges already applied the events up to "
             "event_seq 6, so this event was never applied (versions are not rewritten); append it again with an "
             "event_seq above 6", 3)],
    }


def test_an_event_reusing_a_merged_seq_is_rejected_not_silently_skipped(spark: SparkSession, tmp_path: Path) -> None:
    """The first committed row of an event_seq stands; a later row with that seq and other content was never
    applied, so it is rejected with the reason (it was skipped without a word before). The same row again is the
    merged event itself and is left alone."""
    c = Cluster.create(spark, tmp_path / "w")
    c.group("g", 2, 1)
    c.join("n1", "n2")  # events 1 and 2
    c.exchange()
    c.event_at(2, "NODE_FAILED", node="n1")  # seq 2 is the merged NODE_JOINED n2
    c.event_at(1, "NODE_JOINED", node="n1")  # an exact copy of merged event 1
    assert c.exchange() == []  # nothing pending: nothing committed
    assert c.exchange() == []  # a second run records nothing twice
    rejected = [(json.loads(r.row_json)["event_seq"], r.reason, r.exchange_id)
                for r in c.warehouse.read("rejected_rows").collect()]
    assert rejected == [(2, "NODE_FAILED event_seq 2 was never applied: a committed exchange already applied "
                            "another event with that seq (NODE_JOINED n2), and the first row of a seq stands; "
                            "append it again with a new event_seq", 2)]


# =====================================================================================================================
# Strict mode and --strict
# =====================================================================================================================


@pytest.fixture(scope="module")
def one_bad_report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    c = Cluster.create(spark, tmp_path_factory.mktemp("strict") / "w")
    c.group("g", 2, 0)
    c.join("n1")
    c.report([("n1", "g", 0, "OWNING", 10, 5, None), ("n1", "g", 1, "OWNED", 10, 5, None)])
    return c


def _nothing_committed(c: Cluster) -> None:
    assert c.warehouse.read("exchanges").count() == 0
    assert c.warehouse.read("rejected_rows").count() == 0
    for name in VERSIONED_TABLES:
        assert c.warehouse.read(name).count() == 0, name


def test_strict_setting_fails_the_exchange_and_commits_nothing(one_bad_report: Cluster) -> None:
    c = one_bad_report
    settings = c.settings.with_overrides(validation={"strict": True})
    with pytest.raises(InvalidInputError) as error:
        run_exchange(c.spark, c.warehouse, settings)
    assert error.value.counts == {"partition_reports": 1}
    assert str(error.value).splitlines()[0] == (
        f"strict validation: 1 input row(s) rejected (partition_reports: 1); first: partition_reports: state "
        f"'OWNED' is not one of {STATES}"
    )
    _nothing_committed(c)


def test_strict_setting_fails_on_an_event_that_cannot_apply(spark: SparkSession, tmp_path: Path) -> None:
    c = Cluster.create(spark, tmp_path / "w", validation={"strict": True})
    c.group("g", 2, 0)
    c.node("n1")
    c.event("NODE_LEFT", node="n1")  # valid row, but n1 never joined
    with pytest.raises(InvalidInputError, match="NODE_LEFT for node 'n1', which is not alive") as error:
        c.exchange()
    assert error.value.counts == {"topology_events": 1}
    _nothing_committed(c)


def test_cli_strict_switch_exits_1_naming_the_problem(one_bad_report: Cluster, capsys: Any) -> None:
    try:
        main(["--warehouse", one_bad_report.settings.storage.warehouse, "--strict", "exchange"])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: strict validation: 1 input row(s) rejected (partition_reports: 1); first: partition_reports: "
        f"state 'OWNED' is not one of {STATES}"
    ], err
    _nothing_committed(one_bad_report)
