"""The Kafka executor's pure part (rebalancer.kafka.execute): plan rows -> moves, waves under a cap, the dry-run file.

No Kafka and no Spark: plan and ideal tables are built by hand as Arrow tables with the columns the executor reads.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.kafka.execute import (
    ExecuteError,
    Move,
    dry_run_json,
    in_flight_per_broker,
    is_done,
    moves_of,
    next_wave,
    plan_version_of,
)

PLAN_SCHEMA = pa.schema([
    ("topology_major", pa.int64()), ("topology_minor", pa.int32()), ("group_name", pa.string()),
    ("partition_id", pa.int32()), ("step", pa.int32()), ("action", pa.string()), ("source_node", pa.string()),
    ("target_node", pa.string()), ("wave", pa.int32()), ("est_start_s", pa.float64()), ("est_end_s", pa.float64()),
])
IDEAL_SCHEMA = pa.schema([
    ("group_name", pa.string()), ("partition_id", pa.int32()), ("replica_index", pa.int32()), ("node_id", pa.string()),
])


def plan_table(*steps: tuple[str, int, int, str, str | None, str | None, float]) -> pa.Table:
    """Rows ``(topic, partition, step, action, source, target, est_start_s)`` of version (3, 0)."""
    rows = [{"topology_major": 3, "topology_minor": 0, "group_name": t, "partition_id": p, "step": s, "action": a,
             "source_node": src, "target_node": dst, "wave": 0, "est_start_s": start, "est_end_s": start + 1.0}
            for t, p, s, a, src, dst, start in steps]
    return pa.Table.from_pylist(rows, schema=PLAN_SCHEMA)


def ideal_table(lists: dict[tuple[str, int], list[str]]) -> pa.Table:
    rows = [{"group_name": t, "partition_id": p, "replica_index": i, "node_id": n}
            for (t, p), nodes in lists.items() for i, n in enumerate(nodes)]
    return pa.Table.from_pylist(rows, schema=IDEAL_SCHEMA)


def move(topic: str, partition: int, touches: set[int], start_s: float = 0.0) -> Move:
    return Move(topic, partition, tuple(sorted(touches)), (), (), False, frozenset(touches), start_s)


# ---------------------------------------------------------------- moves_of


def test_a_failure_copies_to_a_surviving_broker() -> None:
    # broker 3 failed: t-0 [3, 1] lost its leader copy; 1 was promoted by Kafka, a copy goes to 2
    plan = plan_table(("t", 0, 0, "COPY", "1", "2", 0.0))
    ideal = ideal_table({("t", 0): ["1", "2"], ("t", 1): ["2", "1"]})
    assert moves_of(plan, ideal) == [
        Move("t", 0, (1, 2), adds=(2,), removes=(), promote=False, touches=frozenset({1, 2}), start_s=0.0),
    ]


def test_a_join_copies_to_the_new_broker_and_drops_the_old_copy() -> None:
    plan = plan_table(("t", 5, 0, "COPY", "2", "4", 1.5), ("t", 5, 1, "DROP", "3", None, 4.0))
    ideal = ideal_table({("t", 5): ["2", "4"]})
    [joined] = moves_of(plan, ideal)
    assert joined == Move("t", 5, (2, 4), adds=(4,), removes=(3,), promote=False, touches=frozenset({2, 3, 4}),
                          start_s=1.5)
    assert joined.key == ("t", 5) and joined.label == "t-5"


def test_a_drain_copies_promotes_and_drops() -> None:
    # broker 1 drains: the leader copy moves to 3 (new leader 2, first in the ideal list), the copy on 1 is dropped
    plan = plan_table(("orders", 0, 2, "DROP", "1", None, 6.0), ("orders", 0, 0, "COPY", "1", "3", 2.0),
                      ("orders", 0, 1, "PROMOTE", None, "2", 5.0))
    ideal = ideal_table({("orders", 0): ["2", "3"]})
    assert moves_of(plan, ideal) == [
        Move("orders", 0, (2, 3), adds=(3,), removes=(1,), promote=True, touches=frozenset({1, 2, 3}), start_s=2.0),
    ]


def test_the_target_list_follows_replica_index_not_row_order() -> None:
    ideal = pa.Table.from_pylist([
        {"group_name": "t", "partition_id": 0, "replica_index": 2, "node_id": "5"},
        {"group_name": "t", "partition_id": 0, "replica_index": 0, "node_id": "7"},
        {"group_name": "t", "partition_id": 0, "replica_index": 1, "node_id": "6"},
    ], schema=IDEAL_SCHEMA)
    [only] = moves_of(plan_table(("t", 0, 0, "PROMOTE", None, "7", 0.0)), ideal)
    assert only.replicas == (7, 6, 5) and only.promote and only.adds == () and only.touches == frozenset({7})


def test_moves_are_in_plan_order_then_topic_then_partition() -> None:
    plan = plan_table(
        ("b", 1, 0, "COPY", "1", "2", 3.0),
        ("a", 9, 0, "COPY", "1", "2", 3.0),
        ("a", 2, 0, "COPY", "1", "2", 3.0),
        ("z", 0, 0, "COPY", "1", "2", 9.0), ("z", 0, 1, "DROP", "3", None, 0.5),  # its earliest step comes first
        ("c", 0, 0, "COPY", "1", "2", 1.0),
    )
    ideal = ideal_table({k: ["1", "2"] for k in [("a", 2), ("a", 9), ("b", 1), ("c", 0), ("z", 0), ("unplanned", 0)]})
    assert [m.label for m in moves_of(plan, ideal)] == ["z-0", "c-0", "a-2", "a-9", "b-1"]


def test_a_planned_partition_without_ideal_list_is_one_sentence() -> None:
    with pytest.raises(ExecuteError) as raised:
        moves_of(plan_table(("t", 3, 0, "COPY", "1", "2", 0.0)), ideal_table({("t", 0): ["1", "2"]}))
    assert "t-3" in str(raised.value)
    assert_one_sentence(str(raised.value))


def test_a_node_that_is_not_a_broker_id_is_one_sentence() -> None:
    with pytest.raises(ExecuteError) as raised:
        moves_of(plan_table(("t", 0, 0, "COPY", "1", "node-b", 0.0)), ideal_table({("t", 0): ["1", "node-b"]}))
    assert "node-b" in str(raised.value)
    assert_one_sentence(str(raised.value))


def test_an_empty_plan_has_no_moves_and_no_version() -> None:
    assert moves_of(plan_table(), ideal_table({("t", 0): ["1"]})) == []
    assert plan_version_of(plan_table()) is None
    assert plan_version_of(plan_table(("t", 0, 0, "COPY", "1", "2", 0.0))) == (3, 0)


# ---------------------------------------------------------------- is_done


def test_done_means_the_target_set_and_a_leader_in_it() -> None:
    target = Move("t", 0, (2, 3), (3,), (1,), False, frozenset({1, 2, 3}), 0.0)
    assert is_done(target, [3, 2], leader=3, reassigning=False)  # no promote: order and leader as Kafka left them
    assert not is_done(target, [2, 3], leader=2, reassigning=True)
    assert not is_done(target, [1, 2], leader=2, reassigning=False)
    assert not is_done(target, [2, 3], leader=-1, reassigning=False)  # no leader: the preferred one must be elected
    promoted = Move("t", 0, (2, 3), (3,), (1,), True, frozenset({1, 2, 3}), 0.0)
    assert not is_done(promoted, [2, 3], leader=3, reassigning=False)
    assert is_done(promoted, [2, 3], leader=2, reassigning=False)


# ---------------------------------------------------------------- next_wave


def test_next_wave_skips_what_does_not_fit_and_takes_later_moves_that_do() -> None:
    a, b, c, d = move("t", 0, {1, 2}), move("t", 1, {1, 3}), move("t", 2, {3, 4}), move("t", 3, {2, 4})
    assert next_wave([a, b, c, d], [], cap=1) == [a, c]
    assert next_wave([b, c, d], [a], cap=1) == [c]
    assert next_wave([a, b, c, d], [], cap=2) == [a, b, c, d]
    with pytest.raises(ValueError):
        next_wave([a], [], cap=0)


def test_resumed_moves_over_the_cap_only_block_their_brokers() -> None:
    resumed = [move("t", i, {1, 2}) for i in range(3)]  # an earlier run with a larger cap
    fresh = [move("u", 0, {1, 5}), move("u", 1, {5, 6})]
    assert next_wave(fresh, resumed, cap=2) == [fresh[1]]
    assert in_flight_per_broker(resumed) == {1: 3, 2: 3}


moves_strategy = st.lists(
    st.tuples(st.frozensets(st.integers(1, 6), min_size=0, max_size=4), st.booleans()),
    min_size=0, max_size=25,
)


@given(moves_strategy, st.integers(1, 5))
def test_next_wave_keeps_every_broker_within_the_cap_and_is_greedy(spec: list[Any], cap: int) -> None:
    moves = [move("t", i, set(touches)) for i, (touches, _) in enumerate(spec)]
    # in flight: the moves marked so, as long as they fit the cap (what an earlier wave of this run left)
    in_flight = next_wave([m for m, (_, flying) in zip(moves, spec, strict=True) if flying], [], cap)
    pending = [m for m in moves if m not in in_flight]
    chosen = next_wave(pending, in_flight, cap)

    assert [m for m in pending if m in chosen] == chosen  # a subsequence of pending, in its order
    counts = Counter(b for m in [*in_flight, *chosen] for b in m.touches)
    assert all(n <= cap for n in counts.values())
    load = Counter(b for m in in_flight for b in m.touches)
    for m in pending:  # maximal greedy: every skipped move would have exceeded the cap where it stood
        if m in chosen:
            load.update(m.touches)
        else:
            assert any(load[b] + 1 > cap for b in m.touches)


# ---------------------------------------------------------------- dry_run_json


def test_dry_run_json_is_kafka_reassign_partitions_format() -> None:
    moves = [Move("orders", 3, (2, 4, 1), (4,), (3,), True, frozenset({1, 2, 3, 4}), 0.0),
             Move("_audit", 0, (5,), (5,), (1,), False, frozenset({1, 5}), 1.0)]
    assert dry_run_json(moves) == {
        "version": 1,
        "partitions": [
            {"topic": "orders", "partition": 3, "replicas": [2, 4, 1], "log_dirs": ["any", "any", "any"]},
            {"topic": "_audit", "partition": 0, "replicas": [5], "log_dirs": ["any"]},
        ],
    }


# ---------------------------------------------------------------- packaging


def test_the_module_imports_without_kafka_python() -> None:
    code = ("import sys; sys.modules['kafka'] = None; import rebalancer.kafka.execute as e; "
            "assert 'kafka.admin' not in sys.modules; print(e.Move.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Move"


def assert_one_sentence(message: str) -> None:
    assert message and "\n" not in message and ". " not in message.rstrip("."), message


def test_forget_moves_drop_only_replicas_on_brokers_that_are_down_from_partitions_the_plan_leaves_alone() -> None:
    from rebalancer.kafka.execute import forget_moves

    ideal = {("t", 0): (1, 2), ("t", 1): (2, 1), ("t", 2): (1, 2), ("t", 3): (1, 2), ("t", 4): (2, 1)}
    current = {
        ("t", 0): (1, 2, 3),     # 3 died: forgotten
        ("t", 1): (2, 1),        # already its ideal list
        ("t", 2): (1, 2, 3, 4),  # a reassignment to a dead broker still in flight: replaced
        ("t", 3): (1, 3),        # 2 must receive data: that is the plan's COPY, not a forget
        ("t", 4): (2, 1, 5),     # 5 is alive: moving it off is the plan's business
    }
    moves = forget_moves(ideal, current, alive={1, 2, 5}, moved={("t", 3)})
    assert [(m.partition, m.replicas, m.removes, m.touches, m.adds) for m in moves] == [
        (0, (1, 2), (3,), frozenset(), ()),
        (2, (1, 2), (3, 4), frozenset(), ()),
    ]
