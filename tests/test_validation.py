"""Input validation (SPEC section 2): one scenario per rule, plus schema errors, strict mode and a property.

Spark actions are slow on a small machine, so the rule scenarios share one validation run: every scenario below
registers its own rows (names prefixed with the scenario's name, so scenarios cannot interfere), the module fixture
validates all of them together once, and each test then checks *its* rows exactly: the rejected rows (table, original
row as JSON, reason, exchange_id) and the valid rows (unchanged). Raw rows carry an extra ``case`` column, which
validation must ignore and which identifies a rejected row's scenario through ``row_json``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from chispa import assert_basic_rows_equality, assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructField, StructType

from rebalancer.tables import INPUT_TABLES, REJECTED_ROWS
from rebalancer.validation import (
    InputSchemaError,
    InvalidInputError,
    Validated,
    conform,
    validate_inputs,
    with_defaults,
)

EXCHANGE_ID = 42
TABLES = tuple(INPUT_TABLES)
Record = dict[str, Any]

# =====================================================================================================================
# Row builders: every SPEC column, in SPEC order, with healthy defaults
# =====================================================================================================================

_node_orders = itertools.count(1)


def _row(table: str, values: Record) -> Record:
    unknown = set(values) - set(INPUT_TABLES[table].fieldNames())
    assert not unknown, f"not {table} columns: {unknown}"
    return {name: values.get(name) for name in INPUT_TABLES[table].fieldNames()}


def group(name: str | None, partitions: int | None = 8, backups: int | None = 1, **columns: Any) -> Record:
    return _row("cache_groups", {"group_name": name, "partitions": partitions, "backups": backups, **columns})


def node(node_id: str | None, **columns: Any) -> Record:
    columns.setdefault("node_order", next(_node_orders))
    return _row("nodes", {"node_id": node_id, "host": f"host-{node_id}", **columns})


def event(seq: int | None, event_type: str | None, node_id: str | None = None, group_name: str | None = None) -> Record:
    return _row(
        "topology_events", {"event_seq": seq, "event_type": event_type, "node_id": node_id, "group_name": group_name}
    )


def report(node_id: str | None, group_name: str | None, partition_id: int | None, **columns: Any) -> Record:
    values = {"state": "OWNING", "update_counter": 10, "size": 5, "bytes": 500, "report_seq": 1, **columns}
    return _row(
        "partition_reports", {"node_id": node_id, "group_name": group_name, "partition_id": partition_id, **values}
    )


# =====================================================================================================================
# Scenario catalogue
# =====================================================================================================================


@dataclass(frozen=True)
class Case:
    """Rows of one scenario and the rows it expects to be rejected, with their reasons."""

    name: str
    rows: dict[str, list[Record]]
    rejected: list[tuple[str, Record, str]] = field(default_factory=list)

    def valid(self, table: str) -> list[Record]:
        """The scenario's rows of ``table`` that no rule rejects (identity, so exact copies count separately)."""
        rejected_ids = {id(row) for t, row, _ in self.rejected if t == table}
        return [row for row in self.rows[table] if id(row) not in rejected_ids]


CASES: dict[str, Case] = {}


def case(
    name: str,
    *,
    cache_groups: Sequence[Record] = (),
    nodes: Sequence[Record] = (),
    topology_events: Sequence[Record] = (),
    partition_reports: Sequence[Record] = (),
    rejected: Sequence[tuple[str, Record, str]] = (),
) -> Case:
    """Register a scenario. Valid rows must carry the scenario's name as the prefix of their node or group names."""
    rows = {
        "cache_groups": list(cache_groups),
        "nodes": list(nodes),
        "topology_events": list(topology_events),
        "partition_reports": list(partition_reports),
    }
    for table, row, _ in rejected:
        assert any(row is r for r in rows[table]), f"{name}: expected rejected row is not among its {table} rows"
    new = Case(name, rows, list(rejected))
    for table in TABLES:
        for row in new.valid(table):
            assert _owner_name(table, row).startswith(f"{name}-"), f"{name}: valid {table} row {row} lacks the prefix"
    assert name not in CASES
    CASES[name] = new
    return new


def _owner_name(table: str, row: Record) -> str:
    """The name that ties a valid row to its scenario (valid events always have a node or a group)."""
    return row["node_id"] if table in ("nodes", "partition_reports") or row.get("node_id") else row["group_name"]


def _spark_json(row: Record, case_name: str) -> str:
    """``to_json`` of a raw row as Spark writes it: compact, nulls kept, NaN and infinities as strings."""

    def value(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    return json.dumps({**{k: value(v) for k, v in row.items()}, "case": case_name}, separators=(",", ":"))


# ---- cache_groups --------------------------------------------------------------------------------------------------

_bad = group(None)
GROUP_WITHOUT_NAME = case(
    "gnull",
    cache_groups=[group("gnull-g"), _bad],
    rejected=[("cache_groups", _bad, "group_name is null; it must be a unique name")],
)


def test_group_without_name_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_WITHOUT_NAME)


_bad = group("  ")
GROUP_WITH_BLANK_NAME = case(
    "gblank",
    cache_groups=[group("gblank-g"), _bad],
    rejected=[("cache_groups", _bad, "group_name '  ' is blank; it must be a name")],
)


def test_group_with_blank_name_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_WITH_BLANK_NAME)


_zero, _too_many, _null = group("gparts-0", 0), group("gparts-big", 65537), group("gparts-null", None)
GROUP_PARTITIONS = case(
    "gparts",
    cache_groups=[group("gparts-1", 1), group("gparts-max", 65536), _zero, _too_many, _null],
    rejected=[
        ("cache_groups", _zero, "partitions 0 is not in 1..65536"),
        ("cache_groups", _too_many, "partitions 65537 is not in 1..65536"),
        ("cache_groups", _null, "partitions is null; it must be an int in 1..65536"),
    ],
)


def test_group_with_partitions_outside_1_to_65536_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_PARTITIONS)


_negative, _null = group("gbackups-neg", backups=-1), group("gbackups-null", backups=None)
GROUP_BACKUPS = case(
    "gbackups",
    cache_groups=[group("gbackups-0", backups=0), _negative, _null],
    rejected=[
        ("cache_groups", _negative, "backups -1 is negative; it must be >= 0"),
        ("cache_groups", _null, "backups is null; it must be an int >= 0"),
    ],
)


def test_group_with_negative_or_null_backups_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_BACKUPS)


_mode = group("genum-mode", mode="partitioned")
_affinity = group("genum-aff", affinity="fair")
_policy = group("genum-policy", loss_policy="READ_ONLY")
_partitioner = group("genum-part", partitioner="crc32")
GROUP_ENUMS = case(
    "genum",
    cache_groups=[
        group("genum-defaults"),
        group("genum-explicit", mode="REPLICATED", affinity="ignite", loss_policy="IGNORE", partitioner="ignite"),
        _mode,
        _affinity,
        _policy,
        _partitioner,
    ],
    rejected=[
        ("cache_groups", _mode, "mode 'partitioned' is not one of PARTITIONED, REPLICATED (null means PARTITIONED)"),
        ("cache_groups", _affinity,
         "affinity 'fair' is not one of rendezvous, ignite, balanced (null means rendezvous)"),
        (
            "cache_groups",
            _policy,
            "loss_policy 'READ_ONLY' is not one of READ_ONLY_SAFE, READ_WRITE_SAFE, IGNORE "
            "(null means READ_WRITE_SAFE)",
        ),
        (
            "cache_groups",
            _partitioner,
            "partitioner 'crc32' is not one of murmur3, ignite, hazelcast "
            "(null means ignite for the ignite affinity, else murmur3)",
        ),
    ],
)


def test_group_with_value_outside_an_enum_is_rejected_naming_the_allowed_values(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_ENUMS)


GROUP_PARTITIONER_COMBINATIONS = case(
    "gcombo",
    cache_groups=[
        group("gcombo-a", affinity="ignite", partitioner="murmur3"),
        group("gcombo-b", affinity="rendezvous", partitioner="hazelcast", partitions=271),
        group("gcombo-c", affinity="ignite", partitioner="hazelcast", partitions=1000),
    ],
)


def test_group_with_any_partitioner_for_any_affinity_is_valid(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_PARTITIONER_COMBINATIONS)


_bad = group("gfilter-bad", backup_filter=["zone", None])
GROUP_BACKUP_FILTER = case(
    "gfilter",
    cache_groups=[group("gfilter-ok", backup_filter=["zone", "rack"], exclude_neighbors=True), _bad],
    rejected=[("cache_groups", _bad, "backup_filter [zone, null] contains a null; list attribute names only")],
)


def test_group_with_null_attribute_in_backup_filter_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_BACKUP_FILTER)


_first, _second = group("gdup-g", 8), group("gdup-g", 16)
_reason = (
    "group_name 'gdup-g' appears in 2 different cache_groups rows committed together;"
    " names must be unique, so all of them are rejected"
)
GROUP_DUPLICATE_NAME = case(
    "gdup",
    cache_groups=[group("gdup-other"), _first, _second],
    rejected=[("cache_groups", _first, _reason), ("cache_groups", _second, _reason)],
)


def test_groups_sharing_a_name_are_all_rejected(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_DUPLICATE_NAME)


_copy = group("gcopy-g")
GROUP_EXACT_COPY = case(
    "gcopy",
    cache_groups=[group("gcopy-g"), _copy],
    rejected=[
        (
            "cache_groups",
            _copy,
            "exact duplicate of another cache_groups row (one copy is used, the others are rejected)",
        )
    ],
)


def test_exact_duplicate_group_rows_keep_one_copy_and_reject_the_others(outcome: Outcome) -> None:
    outcome.assert_case(GROUP_EXACT_COPY)


# ---- nodes ----------------------------------------------------------------------------------------------------------

_null, _blank = node(None), node("")
NODE_WITHOUT_ID = case(
    "nnull",
    nodes=[node("nnull-n"), _null, _blank],
    rejected=[
        ("nodes", _null, "node_id is null; it must be a unique consistent id"),
        ("nodes", _blank, "node_id '' is blank; it must be a name"),
    ],
)


def test_node_without_id_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_WITHOUT_ID)


_bad = node("norder-bad", node_order=None)
NODE_WITHOUT_ORDER = case(
    "norder",
    nodes=[node("norder-ok"), _bad],
    rejected=[("nodes", _bad, "node_order is null; it must be a unique bigint join order")],
)


def test_node_without_node_order_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_WITHOUT_ORDER)


_first, _second = node("ndup-n", host="a"), node("ndup-n", host="b")
_reason = (
    "node_id 'ndup-n' appears in 2 different nodes rows committed together;"
    " node ids must be unique, so all of them are rejected"
)
NODE_DUPLICATE_ID = case(
    "ndup",
    nodes=[node("ndup-other"), _first, _second],
    rejected=[("nodes", _first, _reason), ("nodes", _second, _reason)],
)


def test_nodes_sharing_an_id_are_all_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_DUPLICATE_ID)


_first, _second = node("nsame-a", node_order=9001), node("nsame-b", node_order=9001)
_reason = (
    "node_order 9001 appears in 2 different nodes rows committed together;"
    " join orders must be unique, so all of them are rejected"
)
NODE_DUPLICATE_ORDER = case(
    "nsame",
    nodes=[node("nsame-c"), _first, _second],
    rejected=[("nodes", _first, _reason), ("nodes", _second, _reason)],
)


def test_nodes_sharing_a_node_order_are_all_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_DUPLICATE_ORDER)


_uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
_first, _second = node("nuuid-a", node_uuid=_uuid), node("nuuid-b", node_uuid=_uuid)
_malformed = node("nuuid-bad", node_uuid="not-a-uuid")
_reason = (
    f"node_uuid '{_uuid}' appears in 2 different nodes rows committed together;"
        " runtime UUIDs must be unique, so all of them are rejected"
)
NODE_UUIDS = case(
    "nuuid",
    nodes=[node("nuuid-ok", node_uuid="7C9E6679-7425-40DE-944B-E07FC1F90AE7"), _first, _second, _malformed],
    rejected=[
        ("nodes", _first, _reason),
        ("nodes", _second, _reason),
        ("nodes", _malformed, "node_uuid 'not-a-uuid' is not a UUID (8-4-4-4-12 hex digits)"),
    ],
)


def test_nodes_sharing_a_node_uuid_or_with_a_malformed_one_are_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_UUIDS)


_capacities = [0.0, -1.0, math.nan, math.inf]
_bad_nodes = [node(f"ncap-bad{i}", capacity=c) for i, c in enumerate(_capacities)]
_shown = ["0.0", "-1.0", "NaN", "Infinity"]
NODE_CAPACITY = case(
    "ncap",
    nodes=[node("ncap-default"), node("ncap-half", capacity=0.5), *_bad_nodes],
    rejected=[
        ("nodes", n, f"capacity {shown} is not a finite number > 0 (null means 1.0)")
        for n, shown in zip(_bad_nodes, _shown, strict=True)
    ],
)


def test_node_with_non_positive_or_non_finite_capacity_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(NODE_CAPACITY)


NODE_CLIENT_FLAG_NULL = case(
    "nserver",
    cache_groups=[group("nserver-g")],
    nodes=[node("nserver-n", is_client=None, attributes={"zone": "a"})],
    partition_reports=[report("nserver-n", "nserver-g", 0)],
)


def test_node_with_null_is_client_is_a_server_whose_reports_are_valid(outcome: Outcome) -> None:
    outcome.assert_case(NODE_CLIENT_FLAG_NULL)


# ---- topology_events ------------------------------------------------------------------------------------------------

_bad = event(None, "NODE_JOINED", "eseq-n")
EVENT_WITHOUT_SEQ = case(
    "eseq",
    nodes=[node("eseq-n")],
    topology_events=[event(100, "NODE_JOINED", "eseq-n"), _bad],
    rejected=[("topology_events", _bad, "event_seq is null; it must be a unique bigint")],
)


def test_event_without_event_seq_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_WITHOUT_SEQ)


_first, _second = event(201, "NODE_JOINED", "edup-n"), event(201, "NODE_LEFT", "edup-n")
_reason = (
    "event_seq 201 appears in 2 different topology_events rows committed together;"
    " it must be unique, so all of them are rejected"
)
EVENT_DUPLICATE_SEQ = case(
    "edup",
    nodes=[node("edup-n")],
    topology_events=[event(200, "NODE_JOINED", "edup-n"), _first, _second],
    rejected=[("topology_events", _first, _reason), ("topology_events", _second, _reason)],
)


def test_events_sharing_an_event_seq_are_all_rejected(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_DUPLICATE_SEQ)


_unknown, _null = event(301, "NODE_CRASHED", "etype-n"), event(302, None, "etype-n")
_allowed = ("NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING, CACHE_STARTED, CACHE_STOPPED, RESET_LOST_PARTITIONS, "
            "BASELINE_CHANGED, CLUSTER_ACTIVATED, CLUSTER_DEACTIVATED")
EVENT_TYPE = case(
    "etype",
    nodes=[node("etype-n")],
    topology_events=[event(300, "NODE_FAILED", "etype-n"), _unknown, _null],
    rejected=[
        ("topology_events", _unknown, f"event_type 'NODE_CRASHED' is not one of {_allowed}"),
        ("topology_events", _null, f"event_type is null; it must be one of {_allowed}"),
    ],
)


def test_event_with_unknown_or_null_type_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_TYPE)


_joined, _failed = event(401, "NODE_JOINED", group_name="enode-g"), event(402, "NODE_FAILED")
_need = "NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING events need one"
ENODE = case(
    "enode",
    cache_groups=[group("enode-g")],
    nodes=[node("enode-n")],
    topology_events=[event(400, "NODE_LEFT", "enode-n"), _joined, _failed],
    rejected=[
        ("topology_events", _joined, f"NODE_JOINED event has no node_id; {_need}"),
        ("topology_events", _failed, f"NODE_FAILED event has no node_id; {_need}"),
    ],
)


def test_node_event_without_node_id_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(ENODE)


_started, _reset = event(501, "CACHE_STARTED", "ecache-n"), event(502, "RESET_LOST_PARTITIONS")
_groups = "CACHE_STARTED, CACHE_STOPPED, RESET_LOST_PARTITIONS events need one"
EVENT_CACHE_WITHOUT_GROUP = case(
    "ecache",
    cache_groups=[group("ecache-g")],
    nodes=[node("ecache-n")],
    topology_events=[event(500, "CACHE_STOPPED", group_name="ecache-g"), _started, _reset],
    rejected=[
        ("topology_events", _started, f"CACHE_STARTED event has no group_name; {_groups}"),
        ("topology_events", _reset, f"RESET_LOST_PARTITIONS event has no group_name; {_groups}"),
    ],
)


def test_cache_event_without_group_name_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_CACHE_WITHOUT_GROUP)


_node, _group = event(601, "NODE_JOINED", "eref-ghost"), event(602, "CACHE_STARTED", group_name="eref-nogroup")
EVENT_UNKNOWN_REFERENCES = case(
    "eref",
    cache_groups=[group("eref-g")],
    nodes=[node("eref-n")],
    topology_events=[
        _row(
            "topology_events",
            {
                "event_seq": 600,
                "event_type": "RESET_LOST_PARTITIONS",
                "group_name": "eref-g",
                "event_time": datetime(2026, 11, 20, 12, 0),
            },
        ),
        _node,
        _group,
    ],  # fmt: skip
    rejected=[
        ("topology_events", _node, "node_id 'eref-ghost' is not in nodes"),
        ("topology_events", _group, "group_name 'eref-nogroup' is not in cache_groups"),
    ],
)


def test_event_for_unknown_node_or_group_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_UNKNOWN_REFERENCES)


_bad_node = node("erej-n", capacity=-2.0)
_event = event(701, "NODE_JOINED", "erej-n")
EVENT_OF_REJECTED_NODE = case(
    "erej",
    nodes=[node("erej-ok"), _bad_node],
    topology_events=[event(700, "NODE_JOINED", "erej-ok"), _event],
    rejected=[
        ("nodes", _bad_node, "capacity -2.0 is not a finite number > 0 (null means 1.0)"),
        ("topology_events", _event, "node_id 'erej-n' refers to a nodes row that was rejected (see its reason)"),
    ],
)


def test_event_for_a_rejected_node_is_rejected_saying_so(outcome: Outcome) -> None:
    outcome.assert_case(EVENT_OF_REJECTED_NODE)


# ---- partition_reports ----------------------------------------------------------------------------------------------

_nulls = [
    (report(None, "rnull-g", 1), "node_id is null; it must be the id of the reporting node"),
    (report("rnull-n", None, 2), "group_name is null; it must be the name of the reported cache group"),
    (report("rnull-n", "rnull-g", None), "partition_id is null; it must be an int >= 0"),
    (
        report("rnull-n", "rnull-g", 3, report_seq=None),
        "report_seq is null; it must be a bigint (the latest report per node, group and partition wins)",
    ),
    (
        report("rnull-n", "rnull-g", 4, state=None),
        "state is null; it must be one of OWNING, MOVING, RENTING, EVICTED, LOST",
    ),
]
REPORT_NULL_KEYS = case(
    "rnull",
    cache_groups=[group("rnull-g")],
    nodes=[node("rnull-n")],
    partition_reports=[report("rnull-n", "rnull-g", 0), *(r for r, _ in _nulls)],
    rejected=[("partition_reports", r, reason) for r, reason in _nulls],
)


def test_report_with_null_key_columns_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_NULL_KEYS)


_bad = report("rstate-n", "rstate-g", 1, state="OWNED")
REPORT_UNKNOWN_STATE = case(
    "rstate",
    cache_groups=[group("rstate-g")],
    nodes=[node("rstate-n")],
    partition_reports=[report("rstate-n", "rstate-g", 0, state="LOST"), _bad],
    rejected=[("partition_reports", _bad, "state 'OWNED' is not one of OWNING, MOVING, RENTING, EVICTED, LOST")],
)


def test_report_with_unknown_state_is_rejected_with_reason(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_UNKNOWN_STATE)


_counter = report("rneg-n", "rneg-g", 1, update_counter=-1)
_size_bytes = report("rneg-n", "rneg-g", 2, size=-5, bytes=-500)
_history = report("rneg-n", "rneg-g", 3, wal_history_counter=-1)
_null_counters = report("rneg-n", "rneg-g", 4, update_counter=None, size=None, bytes=None)
REPORT_NEGATIVE_COUNTERS = case(
    "rneg",
    cache_groups=[group("rneg-g")],
    nodes=[node("rneg-n")],
    partition_reports=[
        report("rneg-n", "rneg-g", 0, update_counter=0, size=0, bytes=0, wal_history_counter=0),
        _counter,
        _size_bytes,
        _history,
        _null_counters,
    ],
    rejected=[
        ("partition_reports", _counter, "update_counter -1 is negative; it must be >= 0"),
        (
            "partition_reports",
            _size_bytes,
            "size -5 is negative; it must be >= 0; bytes -500 is negative; it must be >= 0",
        ),
        ("partition_reports", _history, "wal_history_counter -1 is negative; it must be >= 0"),
        (
            "partition_reports",
            _null_counters,
            "update_counter is null; it must be a bigint >= 0; size is null; it must be a bigint >= 0 (entries); "
            "bytes is null; it must be a bigint >= 0",
        ),
    ],
)


def test_report_with_negative_or_null_counters_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_NEGATIVE_COUNTERS)


_bad = report("rwal-n", "rwal-g", 1, update_counter=10, wal_history_counter=11)
REPORT_HISTORY_BEYOND_COUNTER = case(
    "rwal",
    cache_groups=[group("rwal-g")],
    nodes=[node("rwal-n")],
    partition_reports=[report("rwal-n", "rwal-g", 0, update_counter=10, wal_history_counter=10), _bad],
    rejected=[
        (
            "partition_reports",
            _bad,
            "wal_history_counter 11 is greater than update_counter 10; "
            "a node's WAL history cannot start after its current counter",
        )
    ],
)


def test_report_with_wal_history_beyond_its_counter_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_HISTORY_BEYOND_COUNTER)


_negative, _beyond = report("rrange-n", "rrange-g", -1), report("rrange-n", "rrange-g", 8)
REPORT_PARTITION_OUT_OF_RANGE = case(
    "rrange",
    cache_groups=[group("rrange-g", partitions=8)],
    nodes=[node("rrange-n")],
    partition_reports=[report("rrange-n", "rrange-g", 0), report("rrange-n", "rrange-g", 7), _negative, _beyond],
    rejected=[
        ("partition_reports", _negative, "partition_id -1 is negative; it must be >= 0"),
        (
            "partition_reports",
            _beyond,
            "partition_id 8 is out of range for group 'rrange-g', which has 8 partitions (0..7)",
        ),
    ],
)


def test_report_with_partition_id_out_of_range_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_PARTITION_OUT_OF_RANGE)


_node, _group = report("runk-ghost", "runk-g", 1), report("runk-n", "runk-nogroup", 1)
REPORT_UNKNOWN_REFERENCES = case(
    "runk",
    cache_groups=[group("runk-g")],
    nodes=[node("runk-n")],
    partition_reports=[report("runk-n", "runk-g", 0), _node, _group],
    rejected=[
        ("partition_reports", _node, "node_id 'runk-ghost' is not in nodes"),
        ("partition_reports", _group, "group_name 'runk-nogroup' is not in cache_groups"),
    ],
)


def test_report_from_unknown_node_or_of_unknown_group_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_UNKNOWN_REFERENCES)


_bad_group = group("rrej-bad", partitions=0)
_of_bad_group = report("rrej-n", "rrej-bad", 0)
_dup_nodes = [node("rrej-twin", host="x"), node("rrej-twin", host="y")]
_of_dup_node = report("rrej-twin", "rrej-g", 0)
_twin_reason = (
    "node_id 'rrej-twin' appears in 2 different nodes rows committed together;"
    " node ids must be unique, so all of them are rejected"
)
REPORT_OF_REJECTED_ROWS = case(
    "rrej",
    cache_groups=[group("rrej-g"), _bad_group],
    nodes=[node("rrej-n"), *_dup_nodes],
    partition_reports=[report("rrej-n", "rrej-g", 0), _of_bad_group, _of_dup_node],
    rejected=[
        ("cache_groups", _bad_group, "partitions 0 is not in 1..65536"),
        ("nodes", _dup_nodes[0], _twin_reason),
        ("nodes", _dup_nodes[1], _twin_reason),
        (
            "partition_reports",
            _of_bad_group,
            "group_name 'rrej-bad' refers to a cache_groups row that was rejected (see its reason)",
        ),
        (
            "partition_reports",
            _of_dup_node,
            "node_id 'rrej-twin' refers to a nodes row that was rejected (see its reason)",
        ),
    ],
)


def test_report_of_a_rejected_group_or_node_is_rejected_saying_so(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_OF_REJECTED_ROWS)


_bad = report("rclient-c", "rclient-g", 0)
REPORT_FROM_CLIENT = case(
    "rclient",
    cache_groups=[group("rclient-g")],
    nodes=[node("rclient-s", is_client=False), node("rclient-c", is_client=True)],
    partition_reports=[report("rclient-s", "rclient-g", 0), _bad],
    rejected=[
        (
            "partition_reports",
            _bad,
            "node_id 'rclient-c' is a client node (is_client = true); clients hold no partitions",
        )
    ],
)


def test_report_from_a_client_node_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_FROM_CLIENT)


_first = report("rdup-n", "rdup-g", 3, report_seq=9, update_counter=10)
_second = report("rdup-n", "rdup-g", 3, report_seq=9, update_counter=12)
_reason = (
    "report_seq 9 of node 'rdup-n', group 'rdup-g', partition 3 appears in 2 different partition_reports rows "
    "committed together; "
    "it must be unique per copy, so all of them are rejected"
)
REPORT_DUPLICATE_SEQ = case(
    "rdup",
    cache_groups=[group("rdup-g")],
    nodes=[node("rdup-n")],
    partition_reports=[report("rdup-n", "rdup-g", 3, report_seq=8), report("rdup-n", "rdup-g", 4, report_seq=9), _first,
                       _second],
    rejected=[("partition_reports", _first, _reason), ("partition_reports", _second, _reason)],
)  # fmt: skip


def test_reports_with_the_same_report_seq_for_one_copy_are_all_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_DUPLICATE_SEQ)


_copy = report("rcopy-n", "rcopy-g", 0, report_seq=5)
REPORT_EXACT_COPY = case(
    "rcopy",
    cache_groups=[group("rcopy-g")],
    nodes=[node("rcopy-n")],
    partition_reports=[report("rcopy-n", "rcopy-g", 0, report_seq=5), _copy],
    rejected=[
        (
            "partition_reports",
            _copy,
            "exact duplicate of another partition_reports row (one copy is used, the others are rejected)",
        )
    ],
)


def test_exact_duplicate_reports_keep_one_copy_and_reject_the_others(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_EXACT_COPY)


_lower = report("rdrop-n", "rdrop-g", 0, report_seq=3, update_counter=40)
_still_lower = report("rdrop-n", "rdrop-g", 0, report_seq=4, update_counter=90)
_regression = (
    "in the earlier OWNING report of this copy (report_seq 2) with no MOVING, RENTING, EVICTED or LOST report in "
    "between; the counter of a persistent OWNING copy never decreases"
)
REPORT_COUNTER_REGRESSION = case(
    "rdrop",
    cache_groups=[group("rdrop-g", persistent=True)],
    nodes=[node("rdrop-n")],
    partition_reports=[
        report("rdrop-n", "rdrop-g", 0, report_seq=1, update_counter=50),
        report("rdrop-n", "rdrop-g", 0, report_seq=2, update_counter=100),
        _lower,
        _still_lower,
        report("rdrop-n", "rdrop-g", 0, report_seq=5, update_counter=100),
        report("rdrop-n", "rdrop-g", 1, report_seq=1, update_counter=7),  # another copy, own history
    ],
    rejected=[
        ("partition_reports", _lower, f"update_counter 40 is lower than 100 {_regression}"),
        ("partition_reports", _still_lower, f"update_counter 90 is lower than 100 {_regression}"),
    ],
)


def test_owning_counter_that_decreases_without_a_reset_is_rejected(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_COUNTER_REGRESSION)


REPORT_COUNTER_RESET = case(
    "rreset",
    cache_groups=[group("rreset-g"), group("rreset-mem", persistent=False)],
    nodes=[node("rreset-n")],
    partition_reports=[
        # persistent (null = true): a MOVING report in between is the reset that allows a lower counter
        report("rreset-n", "rreset-g", 0, report_seq=1, update_counter=100),
        report("rreset-n", "rreset-g", 0, report_seq=2, state="MOVING", update_counter=0, size=0, bytes=0),
        report("rreset-n", "rreset-g", 0, report_seq=3, update_counter=60),
        # in-memory group: a restart empties the copy, so a lower counter is legitimate
        report("rreset-n", "rreset-mem", 0, report_seq=1, update_counter=100),
        report("rreset-n", "rreset-mem", 0, report_seq=2, update_counter=30),
    ],
)


def test_owning_counter_may_decrease_after_a_reset_or_in_an_in_memory_group(outcome: Outcome) -> None:
    outcome.assert_case(REPORT_COUNTER_RESET)


# =====================================================================================================================
# The shared validation run
# =====================================================================================================================


@dataclass(frozen=True)
class Outcome:
    """What validate_inputs returned for the whole catalogue, collected once."""

    rejected: list[Row]
    valid: dict[str, list[Row]]
    schemas: dict[str, StructType]

    def assert_case(self, scenario: Case) -> None:
        """The scenario's rejected rows are exactly the expected ones, and its other rows are valid, unchanged."""
        actual = sorted(r for r in self.rejected if json.loads(r["row_json"]).get("case") == scenario.name)
        expected = sorted(
            Row(table_name=t, row_json=_spark_json(row, scenario.name), reason=reason, exchange_id=EXCHANGE_ID)
            for t, row, reason in scenario.rejected
        )
        assert_basic_rows_equality(actual, expected)
        for table in TABLES:
            names = {_owner_name(table, row) for row in scenario.valid(table)}
            actual_valid = sorted(
                (r for r in self.valid[table] if _owner_name(table, r.asDict()) in names), key=_sort_key
            )
            expected_valid = sorted((Row(**row) for row in scenario.valid(table)), key=_sort_key)
            assert_basic_rows_equality(actual_valid, expected_valid)


def _sort_key(row: Row) -> str:
    return json.dumps(row.asDict(), default=str, sort_keys=True)


def _raw_df(spark: SparkSession, table: str, rows: Iterable[tuple[Record, str]]) -> DataFrame:
    schema = StructType([*INPUT_TABLES[table].fields, StructField("case", StringType())])
    return spark.createDataFrame([(*row.values(), name) for row, name in rows], schema)


def _catalogue_rows(table: str) -> list[tuple[Record, str]]:
    return [(row, c.name) for c in CASES.values() for row in c.rows[table]]


@pytest.fixture(scope="module")
def catalogue(spark: SparkSession) -> dict[str, DataFrame]:
    """Every scenario's rows, as raw input tables with the extra ``case`` column."""
    for table in TABLES:  # scenarios must not collide: no identical row in two of them
        owners: dict[str, str] = {}
        for row, name in _catalogue_rows(table):
            content = json.dumps(row, default=str)
            assert owners.setdefault(content, name) == name, f"{table} row {content} appears in two scenarios"
    return {table: _raw_df(spark, table, _catalogue_rows(table)) for table in TABLES}


@pytest.fixture(scope="module")
def outcome(catalogue: dict[str, DataFrame]) -> Outcome:
    return _collect(validate_inputs(catalogue, exchange_id=EXCHANGE_ID))


def _collect(validated: Validated) -> Outcome:
    """Rejected rows and every valid table in ONE Spark action (a union with one typed struct column per table)."""
    no_row = {t: F.lit(None).cast(INPUT_TABLES[t]).alias(t) for t in TABLES}
    branches = [validated.rejected.select("*", *no_row.values())]
    for table, valid_df in validated.valid.items():
        rejected_columns = [F.lit(None).cast(f.dataType).alias(f.name) for f in REJECTED_ROWS.fields]
        row = F.struct(*valid_df.columns).alias(table)
        branches.append(valid_df.select(*rejected_columns, *[row if t == table else no_row[t] for t in TABLES]))
    rows = functools.reduce(DataFrame.union, branches).collect()
    return Outcome(
        rejected=[Row(**{f: r[f] for f in REJECTED_ROWS.fieldNames()}) for r in rows if r["table_name"] is not None],
        valid={t: [r[t] for r in rows if r[t] is not None] for t in TABLES},
        schemas={"rejected_rows": validated.rejected.schema, **{t: df.schema for t, df in validated.valid.items()}},
    )


def _maps_as_json(df: DataFrame) -> DataFrame:
    """chispa sorts rows by hashing every column, which Spark forbids for maps: compare maps as JSON."""
    return df.withColumns({f.name: F.to_json(f.name) for f in df.schema.fields if isinstance(f.dataType, MapType)})


def test_every_valid_row_of_the_catalogue_survives_unchanged_and_nothing_else(
    spark: SparkSession, outcome: Outcome
) -> None:
    for table in TABLES:
        expected = [tuple(row.values()) for c in CASES.values() for row in c.valid(table)]
        assert_df_equality(
            spark.createDataFrame(outcome.valid[table], INPUT_TABLES[table]),
            spark.createDataFrame(expected, INPUT_TABLES[table]),
            transforms=[_maps_as_json],
            ignore_row_order=True,
        )


def test_rejected_rows_are_exactly_the_expected_ones_with_the_rejected_rows_schema(
    spark: SparkSession, outcome: Outcome
) -> None:
    expected = [
        (table, _spark_json(row, c.name), reason, EXCHANGE_ID)
        for c in CASES.values()
        for table, row, reason in c.rejected
    ]
    assert_df_equality(
        spark.createDataFrame(outcome.rejected, REJECTED_ROWS),
        spark.createDataFrame(expected, REJECTED_ROWS),
        ignore_row_order=True,
    )


def test_validated_frames_have_the_spec_schemas(outcome: Outcome) -> None:
    assert outcome.schemas == {"rejected_rows": REJECTED_ROWS, **INPUT_TABLES}


# =====================================================================================================================
# Schemas, casts, strict mode, defaults
# =====================================================================================================================


def _tables(spark: SparkSession, **tables: list[Record] | DataFrame) -> dict[str, DataFrame]:
    """All four input tables (empty unless given), from records or as given."""
    return {
        t: rows
        if isinstance(rows, DataFrame)
        else spark.createDataFrame([tuple(r.values()) for r in rows], INPUT_TABLES[t])
        for t in TABLES
        for rows in [tables.get(t, [])]
    }


def test_missing_table_raises_input_schema_error_naming_it(spark: SparkSession) -> None:
    raw = _tables(spark)
    del raw["nodes"]
    with pytest.raises(InputSchemaError, match=r"missing input table\(s\): nodes"):
        validate_inputs(raw)


def test_missing_column_raises_input_schema_error_listing_expected_and_found(spark: SparkSession) -> None:
    raw = _tables(spark)
    raw["nodes"] = raw["nodes"].drop("capacity", "is_client")
    with pytest.raises(InputSchemaError) as error:
        validate_inputs(raw)
    message = str(error.value)
    assert "nodes: missing column(s) capacity double, is_client boolean" in message
    assert "Expected: node_id string, node_uuid string, node_order bigint" in message
    assert (
        "Found: node_id string, node_uuid string, node_order bigint, host string, attributes map<string,string>."
        in (message)
    )


def test_column_of_an_uncastable_type_raises_input_schema_error(spark: SparkSession) -> None:
    raw_df = spark.createDataFrame([], "group_name string, partitions boolean, backups int, mode string, "
                                       "affinity string, exclude_neighbors boolean, backup_filter string, "
                                       "loss_policy string, persistent boolean, partitioner string")  # fmt: skip
    with pytest.raises(InputSchemaError) as error:
        conform("cache_groups", raw_df)
    assert (
        "cache_groups: column type(s) that cannot be cast: partitions is boolean (expected int), "
        "backup_filter is string (expected array<string>)"
    ) in str(error.value)


def test_conform_casts_values_and_rejects_the_rows_whose_values_do_not_cast(spark: SparkSession) -> None:
    raw_df = spark.createDataFrame(
        [
            ("n1", "g", "3", "OWNING", 10.0, "5", 500, None, 1, "kept"),
            ("n1", "g", "abc", "OWNING", 10.0, "5", 500, None, 2, "text"),
            ("n1", "g", "4", "OWNING", 1.5, "x", 500, None, 3, "fraction"),
            ("n1", "g", "3000000000", "OWNING", 10.0, "5", 500, None, 4, "overflow"),
        ],
        "node_id string, group_name string, partition_id string, state string, update_counter double, size string, "
        "bytes int, wal_history_counter string, report_seq bigint, note string",
    )
    conformed_df, rejected_df = conform("partition_reports", raw_df)
    assert conformed_df.schema == INPUT_TABLES["partition_reports"]
    assert conformed_df.collect() == [Row("n1", "g", 3, "OWNING", 10, 5, 500, None, 1)]

    def row_json(partition: str, counter: float, size: str, seq: int, note: str) -> str:
        return json.dumps(
            {"node_id": "n1", "group_name": "g", "partition_id": partition, "state": "OWNING",
             "update_counter": counter, "size": size, "bytes": 500, "wal_history_counter": None, "report_seq": seq,
             "note": note},
            separators=(",", ":"),
        )  # fmt: skip

    assert_df_equality(
        rejected_df,
        spark.createDataFrame(
            [
                ("partition_reports", row_json("abc", 10.0, "5", 2, "text"), "partition_id: 'abc' is not an int", None),
                (
                    "partition_reports",
                    row_json("4", 1.5, "x", 3, "fraction"),
                    "update_counter: '1.5' is not a bigint; size: 'x' is not a bigint",
                    None,
                ),
                (
                    "partition_reports",
                    row_json("3000000000", 10.0, "5", 4, "overflow"),
                    "partition_id: '3000000000' is not an int",
                    None,
                ),
            ],
            REJECTED_ROWS,
        ),
        ignore_row_order=True,
    )


def test_strict_mode_raises_with_counts_and_first_reasons(spark: SparkSession) -> None:
    reports_df = spark.createDataFrame(
        [("n1", "g", "abc", "OWNING", 1, 1, 1, None, 1), ("n1", "g", "0", "OWNED", 1, 1, 1, None, 2)],
        "node_id string, group_name string, partition_id string, state string, update_counter bigint, size bigint, "
        "bytes bigint, wal_history_counter bigint, report_seq bigint",
    )
    raw = _tables(spark, cache_groups=[group("g")], nodes=[node("n1"), node(None)], partition_reports=reports_df)
    with pytest.raises(InvalidInputError) as error:
        validate_inputs(raw, exchange_id=3, strict=True)
    assert error.value.counts == {"nodes": 1, "partition_reports": 2}
    message = str(error.value)
    assert "strict validation: 3 input row(s) rejected (nodes: 1, partition_reports: 2)" in message
    assert "  nodes: node_id is null; it must be a unique consistent id" in message
    assert "  partition_reports: partition_id: 'abc' is not an int\n" in message  # and not also "partition_id is null"
    assert "  partition_reports: state 'OWNED' is not one of OWNING, MOVING, RENTING, EVICTED, LOST" in message


def test_strict_mode_accepts_clean_input_with_empty_events_and_reports(spark: SparkSession) -> None:
    raw = _tables(spark, cache_groups=[group("g")], nodes=[node("n1")])
    validated = validate_inputs(raw, strict=True)  # one Spark action: the strict check; raises nothing
    assert set(validated.valid) == set(TABLES)


def test_with_defaults_resolves_the_documented_null_meanings(spark: SparkSession) -> None:
    groups_df = _tables(
        spark, cache_groups=[group("r"), group("i", affinity="ignite"), group("h", partitioner="hazelcast")]
    )
    nodes_df = _tables(spark, nodes=[node("n", node_order=1), node("c", node_order=2, capacity=2.0, is_client=True)])
    resolved = (
        with_defaults("cache_groups", groups_df["cache_groups"])
        .select(
            "group_name",
            F.concat_ws(
                ",",
                *[
                    F.col(c).cast("string")
                    for c in ("mode", "affinity", "exclude_neighbors", "loss_policy", "persistent", "partitioner")
                ],
            ),
        )
        .union(
            with_defaults("nodes", nodes_df["nodes"]).select(
                "node_id", F.concat_ws(",", F.col("capacity").cast("string"), F.col("is_client").cast("string"))
            )
        )
        .collect()
    )
    assert dict(map(tuple, resolved)) == {
        "r": "PARTITIONED,rendezvous,false,READ_WRITE_SAFE,true,murmur3",
        "i": "PARTITIONED,ignite,false,READ_WRITE_SAFE,true,ignite",
        "h": "PARTITIONED,rendezvous,false,READ_WRITE_SAFE,true,hazelcast",
        "n": "1.0,false",
        "c": "2.0,true",
    }


# =====================================================================================================================
# Property: nothing dropped, nothing duplicated
# =====================================================================================================================

_names = st.sampled_from(["a", "b", "c", "", None])
_small_ints = st.sampled_from([-1, 0, 1, 2, 7, 8, 70_000, None])
_EVENT_TYPES_SAMPLE = ["NODE_JOINED", "NODE_FAILED", "CACHE_STARTED", "RESET_LOST_PARTITIONS", "BOOM", None]


@st.composite
def _random_tables(draw: st.DrawFn) -> dict[str, list[Record]]:
    """Mixes of good and bad rows: few distinct names, so duplicates and dangling references are common."""
    rows = st.lists
    return {
        "cache_groups": draw(rows(st.builds(
            group, _names, _small_ints, _small_ints,
            mode=st.sampled_from([None, "PARTITIONED", "REPLICATED", "x"]),
            persistent=st.sampled_from([None, True, False]),
        ), max_size=6)),
        "nodes": draw(rows(st.builds(
            node, _names, node_order=_small_ints, capacity=st.sampled_from([None, 1.0, 0.0, math.nan]),
            is_client=st.sampled_from([None, False, True]),
        ), max_size=6)),
        "topology_events": draw(rows(st.builds(
            event, _small_ints, st.sampled_from(_EVENT_TYPES_SAMPLE), _names, _names,
        ), max_size=8)),
        "partition_reports": draw(rows(st.builds(
            report, _names, _names, _small_ints,
            state=st.sampled_from(["OWNING", "MOVING", "EVICTED", "owning", None]),
            update_counter=_small_ints, report_seq=st.sampled_from([1, 2, 3, None]),
            wal_history_counter=_small_ints,
        ), max_size=30)),
    }  # fmt: skip


@pytest.mark.slow  # about a minute: `make spark-slow` (CI); the catalogue above holds Spark's validator to every rule
@settings(max_examples=max(3, settings.default.max_examples // 8))  # ci: 3 examples of up to ~50 rows each
@given(tables=_random_tables())
def test_every_input_row_is_either_valid_or_rejected_exactly_once(
    spark: SparkSession, tables: dict[str, list[Record]]
) -> None:
    validated = validate_inputs(_tables(spark, **tables), exchange_id=1)
    per_table = validated.rejected.select(
        "table_name", F.lit("rejected").alias("kind"), (F.length("reason") > 0).alias("explained")
    )
    for table, valid_df in validated.valid.items():
        per_table = per_table.union(valid_df.select(F.lit(table), F.lit("valid"), F.lit(True)))
    counts = per_table.groupBy("table_name").agg(F.count("*").alias("rows"), F.min("explained").alias("explained"))
    found = {r["table_name"]: (r["rows"], r["explained"]) for r in counts.collect()}
    expected = {t: (len(rows), True) for t, rows in tables.items() if rows}
    assert found == expected
