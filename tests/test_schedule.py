"""Scenario and property tests of the migration scheduler (``rebalancer.planning.schedule``): pure, no Spark.

Golden scenarios build a few plan rows by hand; every expected time is worked out in the comment beside it from the
cost model (module docstring of ``schedule``): a step takes ``overhead_s``, then a COPY moves its bytes at
``min(stream, bw / n_out(source), bw / n_in(target))``. Defaults: entries 4e8 B/s, files 1.25e9 B/s, bw 2.5e9 B/s,
overhead 0.1 s, 10 slots per node.

Property tests schedule random small plans (2-8 nodes, 1-30 partitions of 1-4 steps, random bytes, caps 1-4) with
every policy and check the invariants listed in :func:`test_schedule_invariants_on_random_plans`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from bench.plans import FAILED, Change, scenario_plan
from bench.sweep import CLUSTERS
from rebalancer.planning import schedule as scheduler
from rebalancer.planning.event_loop import A_COPY
from rebalancer.planning.schedule import (
    PLAN_INPUT_SCHEMA,
    POLICIES,
    SCHEDULED_SCHEMA,
    CostModel,
    ScheduleInputError,
    lower_bound,
    makespan,
    schedule,
)

DEFAULT = CostModel()


def step(
    action: str,
    node: str,
    target: str | None = None,
    *,
    group: str = "g",
    pid: int = 0,
    no: int = 1,
    candidates: list[str] | None = None,
    primary: str | None = None,
    transfer: str | None = None,
    nbytes: int = 0,
    owners: int = 2,
    replicas: int = 2,
) -> dict[str, Any]:
    """One plan row; a COPY defaults to candidates ``[node]`` and transfer ``entries``."""
    is_copy = action == "COPY"
    return {
        "group_name": group,
        "partition_id": pid,
        "step": no,
        "action": action,
        "source_node": node,
        "target_node": target,
        "candidates": (candidates or [node]) if is_copy else None,
        "primary_node": primary,
        "transfer": (transfer or "entries") if is_copy else None,
        "bytes": nbytes,
        "owners": owners,
        "replicas": replicas,
    }


def plan_of(*rows: dict[str, Any]) -> pa.Table:
    """The rows as a plan table, ``migration_id`` 1..n in row order."""
    return pa.Table.from_pylist([{"migration_id": i + 1, **r} for i, r in enumerate(rows)], schema=PLAN_INPUT_SCHEMA)


def col(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist()


# --- golden scenarios -----------------------------------------------------------------------------------------


def test_one_copy_by_entries_takes_overhead_plus_bytes_over_entry_stream() -> None:
    # 0.1 s overhead, then 1e9 B at min(4e8, 2.5e9 / 1, 2.5e9 / 1) = 4e8 B/s: 2.5 s. Ends at 2.6.
    out = schedule(plan_of(step("COPY", "a", "b", nbytes=10**9)), DEFAULT)
    assert out.schema == SCHEDULED_SCHEMA
    assert col(out, "est_start_s") == [0.0]
    assert col(out, "est_end_s") == [pytest.approx(2.6)]
    assert col(out, "wave") == [1]
    assert col(out, "source_node") == ["a"]
    assert makespan(out) == pytest.approx(2.6)


def test_copy_by_files_uses_the_file_stream() -> None:
    # 0.1 + 2.5e9 / 1.25e9 = 2.1
    out = schedule(plan_of(step("COPY", "a", "b", transfer="files", nbytes=2_500_000_000)), DEFAULT)
    assert col(out, "est_end_s") == [pytest.approx(2.1)]


def test_two_copies_out_of_one_source_with_one_slot_run_one_after_the_other() -> None:
    # Node a has one slot: p0 (first by (group, partition)) runs 0 -> 0.1 + 1e9 / 4e8 = 2.6, then p1 2.6 -> 5.2.
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=10**9),
        step("COPY", "a", "c", pid=1, nbytes=10**9),
    )
    for policy in POLICIES:
        out = schedule(plan, CostModel(max_parallel_per_node=1), policy)
        assert col(out, "est_start_s") == [0.0, pytest.approx(2.6)], policy
        assert col(out, "est_end_s") == [pytest.approx(2.6), pytest.approx(5.2)], policy
        assert col(out, "wave") == [1, 2], policy


def test_two_transfers_sharing_a_sender_split_its_bandwidth_then_the_survivor_speeds_up() -> None:
    # bw 2e8 B/s (below the 4e8 entry stream). Both start at 0, transfer from 0.1 at
    # min(4e8, 2e8 / n_out(a) = 1e8, 2e8 / 1) = 1e8 B/s. The 1e8 B one ends at 0.1 + 1 = 1.1; the other has then
    # 1e8 B left and alone gets min(4e8, 2e8, 2e8) = 2e8 B/s: 0.5 s more, ends at 1.6.
    model = CostModel(node_bandwidth_bytes_per_s=2e8)
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=10**8),
        step("COPY", "a", "c", pid=1, nbytes=2 * 10**8),
    )
    out = schedule(plan, model)
    assert col(out, "est_start_s") == [0.0, 0.0]
    assert col(out, "est_end_s") == [pytest.approx(1.1), pytest.approx(1.6)]
    # Lower bound: a sends 3e8 B at 2e8 B/s = 1.5 s, and no byte moves before the first overhead ends: 0.1 + 1.5 =
    # 1.6 (the largest term; c receives 0.1 + 1.0, chains 0.6 and 1.1). The schedule meets it.
    assert lower_bound(out, model) == pytest.approx(1.6)
    # serial: each alone at min(4e8, 2e8): 0.1 + 0.5 = 0.6, then 0.1 + 1.0 = 1.1, ends at 1.7.
    assert makespan(schedule(plan, model, "serial")) == pytest.approx(1.7)


def test_two_transfers_into_one_receiver_split_its_bandwidth() -> None:
    # Symmetric on the receiving side: a -> c and b -> c, bw 2e8: each 1e8 B/s, 1e8 B each: both end at 1.1.
    model = CostModel(node_bandwidth_bytes_per_s=2e8)
    plan = plan_of(
        step("COPY", "a", "c", pid=0, nbytes=10**8),
        step("COPY", "b", "c", pid=1, nbytes=10**8),
    )
    out = schedule(plan, model)
    assert col(out, "est_end_s") == [pytest.approx(1.1), pytest.approx(1.1)]
    assert col(out, "wave") == [1, 1]


def test_promote_and_drop_follow_the_copy_of_their_partition_in_step_order() -> None:
    # Rows given out of order (DROP, COPY, PROMOTE); steps run 1, 2, 3:
    # COPY 4e8 B: 0 -> 0.1 + 1.0 = 1.1; PROMOTE a -> b: 1.1 -> 1.2; DROP a: 1.2 -> 1.3.
    plan = plan_of(
        step("DROP", "a", no=3),
        step("COPY", "a", "b", no=1, nbytes=4 * 10**8),
        step("PROMOTE", "a", "b", no=2),
    )
    out = schedule(plan, DEFAULT)
    assert col(out, "action") == ["DROP", "COPY", "PROMOTE"]  # input row order kept
    assert col(out, "est_start_s") == [pytest.approx(1.2), 0.0, pytest.approx(1.1)]
    assert col(out, "est_end_s") == [pytest.approx(1.3), pytest.approx(1.1), pytest.approx(1.2)]
    assert col(out, "wave") == [3, 1, 2]
    assert col(out, "migration_id") == [1, 2, 3]


def test_hazelcast_reads_from_the_primary_while_portfolio_spreads_over_candidates() -> None:
    # Two COPYs (to c and d) may read from a or b; a is the primary. bw 4e8.
    # portfolio: p0 takes a (both idle, same bytes: lowest node_id), p1 takes b (a already sends one): each alone at
    #   min(4e8, 4e8, 4e8) = 4e8 B/s, 4e8 B: both end at 0.1 + 1.0 = 1.1.
    # hazelcast: both from a: min(4e8, 4e8 / 2, 4e8) = 2e8 B/s: both end at 0.1 + 2.0 = 2.1.
    model = CostModel(node_bandwidth_bytes_per_s=4e8)
    plan = plan_of(
        step("COPY", "a", "c", pid=0, candidates=["a", "b"], primary="a", nbytes=4 * 10**8),
        step("COPY", "a", "d", pid=1, candidates=["b", "a"], primary="a", nbytes=4 * 10**8),
    )
    portfolio = schedule(plan, model, "portfolio")
    hazelcast = schedule(plan, model, "hazelcast")
    assert col(portfolio, "source_node") == ["a", "b"]
    assert col(portfolio, "est_end_s") == [pytest.approx(1.1), pytest.approx(1.1)]
    assert col(hazelcast, "source_node") == ["a", "a"]
    assert col(hazelcast, "est_end_s") == [pytest.approx(2.1), pytest.approx(2.1)]


def test_hazelcast_falls_back_to_source_node_without_a_primary() -> None:
    plan = plan_of(step("COPY", "b", "c", candidates=["a", "b"], nbytes=1000))
    assert col(schedule(plan, DEFAULT, "hazelcast"), "source_node") == ["b"]


def test_portfolio_picks_the_candidate_with_fewer_bytes_assigned_when_both_are_idle() -> None:
    # One slot per node. Priority (rule 3): node loads a 1.1 + 0.6/2 + 0.2/2 = 1.5, b 0.3 + 0.1 = 0.4, c 1.1 + 0.2
    # = 1.3, d 0.6; bottlenecks p0 max(c, a) = 1.5, p3 max(c, min(a, b)) = 1.3, p2 max(d, min(a, b)) = 0.6.
    # t = 0: p0 takes a and c (0 -> 0.1 + 4e8 / 4e8 = 1.1); p3 waits for c; p2 reads from b (a is full):
    # 0 -> 0.1 + 2e8 / 4e8 = 0.6. t = 1.1: p3 starts; a and b are idle and send nothing, a has 4e8 B assigned
    # and b 2e8 B: b. It ends at 1.1 + 0.1 + 4e7 / 4e8 = 1.3.
    plan = plan_of(
        step("COPY", "a", "c", pid=0, nbytes=4 * 10**8),
        step("COPY", "a", "d", pid=2, candidates=["a", "b"], nbytes=2 * 10**8),
        step("COPY", "a", "c", pid=3, candidates=["a", "b"], nbytes=4 * 10**7),
    )
    out = schedule(plan, CostModel(max_parallel_per_node=1), "portfolio")
    assert col(out, "source_node") == ["a", "b", "b"]
    assert col(out, "est_start_s") == [0.0, 0.0, pytest.approx(1.1)]
    assert col(out, "est_end_s") == [pytest.approx(1.1), pytest.approx(0.6), pytest.approx(1.3)]


def test_portfolio_prefers_a_candidate_sending_nothing_over_one_with_fewer_bytes_assigned() -> None:
    # p0: a -> c, 1.2e9 B by entries: 0 -> 0.1 + 3.0 = 3.1. p1 step 1: b -> d, 2.5e9 B by files: 0 -> 0.1 + 2.0 =
    # 2.1. p1 step 2 (to e, from a or b) is ready at 2.1: a sends one COPY (1.2e9 B assigned), b none (2.5e9 B
    # assigned): fewest running COPYs first, so b. 4e8 B: 2.1 -> 2.1 + 0.1 + 1.0 = 3.2.
    plan = plan_of(
        step("COPY", "a", "c", pid=0, nbytes=1_200_000_000),
        step("COPY", "b", "d", pid=1, transfer="files", nbytes=2_500_000_000),
        step("COPY", "a", "e", pid=1, no=2, candidates=["a", "b"], nbytes=4 * 10**8),
    )
    out = schedule(plan, DEFAULT)
    assert col(out, "source_node") == ["a", "b", "b"]
    assert col(out, "est_start_s") == [0.0, 0.0, pytest.approx(2.1)]
    assert col(out, "est_end_s") == [pytest.approx(3.1), pytest.approx(2.1), pytest.approx(3.2)]


def test_every_waiting_step_that_fits_starts_when_slots_free() -> None:
    # Two slots per node. p0 and p1 (a -> b, a -> c: 0 -> 1.1) fill a. p2 and p3 (a -> d, 4e7 B) wait for a; when
    # p0 and p1 end at 1.1, a and d have two free slots each: both start at 1.1 (end 1.1 + 0.1 + 0.1 = 1.3).
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=4 * 10**8),
        step("COPY", "a", "c", pid=1, nbytes=4 * 10**8),
        step("COPY", "a", "d", pid=2, nbytes=4 * 10**7),
        step("COPY", "a", "d", pid=3, nbytes=4 * 10**7),
    )
    for policy in ("portfolio", "hazelcast"):
        out = schedule(plan, CostModel(max_parallel_per_node=2), policy)
        assert col(out, "est_start_s") == [0.0, 0.0, pytest.approx(1.1), pytest.approx(1.1)], policy
        assert col(out, "est_end_s")[2:] == [pytest.approx(1.3), pytest.approx(1.3)], policy


def test_serial_runs_every_step_alone_in_partition_order() -> None:
    # Order (g, 0, 1), (g, 1, 1), (g, 1, 2) whatever the row order:
    # COPY 4e8 B entries: 0 -> 1.1; COPY 1.25e9 B files: 1.1 -> 1.1 + 0.1 + 1.0 = 2.2; DROP: 2.2 -> 2.3.
    # The two COPYs could overlap (distinct nodes) but serial never does.
    plan = plan_of(
        step("DROP", "c", pid=1, no=2),
        step("COPY", "a", "b", pid=0, nbytes=4 * 10**8),
        step("COPY", "c", "d", pid=1, transfer="files", nbytes=1_250_000_000),
    )
    out = schedule(plan, DEFAULT, "serial")
    assert col(out, "est_start_s") == [pytest.approx(2.2), 0.0, pytest.approx(1.1)]
    assert col(out, "est_end_s") == [pytest.approx(2.3), pytest.approx(1.1), pytest.approx(2.2)]
    assert col(out, "wave") == [3, 1, 2]
    assert makespan(out) == pytest.approx(1.1 + 1.1 + 0.1)
    # portfolio overlaps the two COPYs: max(1.1, 1.1 + 0.1) = 1.2
    assert makespan(schedule(plan, DEFAULT)) == pytest.approx(1.2)


def test_waves_are_dense_ranks_of_distinct_start_times() -> None:
    # One slot per node; steps without a transfer go first. p2 DROP a: 0 -> 0.1, so p0's COPY a -> b (4e8 B)
    # waits for a: 0.1 -> 1.2. p1 DROP c: 0 -> 0.1, then PROMOTE c -> d: 0.1 -> 0.2. Starts 0.1, 0, 0.1, 0:
    # waves 2, 1, 2, 1.
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=4 * 10**8),
        step("DROP", "c", pid=1, no=1),
        step("PROMOTE", "c", "d", pid=1, no=2),
        step("DROP", "a", pid=2),
    )
    out = schedule(plan, CostModel(max_parallel_per_node=1))
    assert col(out, "est_start_s") == [pytest.approx(0.1), 0.0, pytest.approx(0.1), 0.0]
    assert col(out, "wave") == [2, 1, 2, 1]


def test_portfolio_reads_from_the_candidate_with_the_least_bound_work() -> None:
    # a must also drop two copies (0.2 s of pinned work), b nothing: the COPY reads from b, though a comes first
    # by node_id and both are idle.
    plan = plan_of(
        step("COPY", "a", "c", pid=0, candidates=["a", "b"], nbytes=4 * 10**8),
        step("DROP", "a", pid=1),
        step("DROP", "a", pid=2),
    )
    assert col(schedule(plan, DEFAULT, "portfolio"), "source_node") == ["b", "a", "a"]


def test_short_steps_start_before_transfers_on_a_full_node() -> None:
    # One slot on b, which receives a COPY and is the new primary of another partition. The PROMOTE (0.1 s) goes
    # first and unlocks its partition's DROP; the COPY follows: 0.1 -> 1.2 (0.1 + 4e8 B at 4e8 B/s).
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=4 * 10**8),
        step("PROMOTE", "c", "b", pid=1, no=1),
        step("DROP", "c", pid=1, no=2),
    )
    out = schedule(plan, CostModel(max_parallel_per_node=1), "portfolio")
    assert col(out, "est_start_s") == [pytest.approx(0.1), 0.0, pytest.approx(0.1)]
    assert col(out, "est_end_s") == [pytest.approx(1.2), pytest.approx(0.1), pytest.approx(0.2)]


def test_urgent_partitions_go_first_then_fewer_owners() -> None:
    # One slot on a; three COPYs out of a. p0 has 3 owners of 3 (not urgent), p1 2 of 3 (under-
    # replicated), p2 1 of 1 (one owner). Order: p2 (urgent, 1 owner), p1 (urgent, 2 owners), p0.
    plan = plan_of(
        step("COPY", "a", "b", pid=0, nbytes=4 * 10**8, owners=3, replicas=3),
        step("COPY", "a", "c", pid=1, nbytes=4 * 10**8, owners=2, replicas=3),
        step("COPY", "a", "d", pid=2, nbytes=4 * 10**8, owners=1, replicas=1),
    )
    out = schedule(plan, CostModel(max_parallel_per_node=1))
    assert col(out, "est_start_s") == [pytest.approx(2.2), pytest.approx(1.1), 0.0]
    # hazelcast ignores urgency: (group, partition) order.
    hz = schedule(plan, CostModel(max_parallel_per_node=1), "hazelcast")
    assert col(hz, "est_start_s") == [0.0, pytest.approx(1.1), pytest.approx(2.2)]


def test_extra_columns_pass_through_and_existing_schedule_columns_are_replaced_in_place() -> None:
    base = plan_of(step("COPY", "a", "b", nbytes=4 * 10**8), step("DROP", "c", pid=1))
    plan = (
        base.add_column(0, "topology_major", pa.array([7, 7], pa.int64()))
        .append_column("wave", pa.array([None, None], pa.int64()))
        .append_column("note", pa.array(["x", None], pa.string()))
    )
    out = schedule(plan, DEFAULT)
    assert out.column_names == [
        "topology_major",
        *PLAN_INPUT_SCHEMA.names,
        "wave",
        "note",
        "est_start_s",
        "est_end_s",
    ]
    assert out.schema.field("wave").type == pa.int32()
    assert col(out, "topology_major") == [7, 7]
    assert col(out, "note") == ["x", None]
    assert col(out, "wave") == [1, 1]
    assert col(out, "est_end_s") == [pytest.approx(1.1), pytest.approx(0.1)]


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_plan(policy: str) -> None:
    out = schedule(plan_of(), DEFAULT, policy)
    assert out.num_rows == 0
    assert out.schema == SCHEDULED_SCHEMA
    assert makespan(out) == 0.0
    assert lower_bound(out, DEFAULT) == 0.0


def test_lower_bound_takes_the_largest_of_its_four_terms() -> None:
    model = CostModel(max_parallel_per_node=1)
    # Partition chain p0: 0.1 + 4e8 / 4e8 + 0.1 + 0.1 = 1.3 (COPY a -> b, PROMOTE a -> b, DROP a).
    # Node a: touched by all three and by p1 (COPY a -> c, 0.1 + 1.0): slot work 1.3 + 1.1 = 2.4 over 1 slot.
    # Sent by a: 8e8 B / 2.5e9 = 0.32. The bound is 2.4.
    plan = plan_of(
        step("COPY", "a", "b", nbytes=4 * 10**8),
        step("PROMOTE", "a", "b", no=2),
        step("DROP", "a", no=3),
        step("COPY", "a", "c", pid=1, nbytes=4 * 10**8),
    )
    out = schedule(plan, model)
    assert lower_bound(out, model) == pytest.approx(2.4)
    assert makespan(out) == pytest.approx(2.4)  # a is busy all the time: the bound is met
    # With 10 slots the chain p0 (1.3) is the largest term.
    assert lower_bound(out, DEFAULT) == pytest.approx(1.3)


# --- errors ---------------------------------------------------------------------------------------------------


def test_missing_columns_are_listed_with_what_was_expected() -> None:
    plan = plan_of(step("DROP", "a")).drop_columns(["owners", "transfer"])
    with pytest.raises(ValueError, match=r"lacks columns \['transfer', 'owners'\]; expected at least") as err:
        schedule(plan, DEFAULT)
    assert isinstance(err.value, ScheduleInputError)
    assert "got ['migration_id'" in str(err.value)


def test_unknown_policy() -> None:
    with pytest.raises(ValueError,
                       match=r"unknown policy 'fifo'; expected one of \['portfolio', 'hazelcast', 'serial'\]"):
        schedule(plan_of(), DEFAULT, "fifo")


def test_copy_without_usable_source() -> None:
    # hazelcast would read from the primary, which is the target itself.
    plan = plan_of(step("COPY", "a", "b", candidates=["a"], primary="b", nbytes=1))
    with pytest.raises(ValueError, match="no usable source for the COPY to 'b'"):
        schedule(plan, DEFAULT, "hazelcast")
    # candidates must name a supplier (the source_node among them)
    empty = plan_of(step("COPY", "a", "b", nbytes=1)).set_column(7, "candidates", pa.array([[]], pa.list_(pa.string())))
    with pytest.raises(ValueError, match="candidates must be non-empty and contain source_node 'a'; got \\[\\]"):
        schedule(empty, DEFAULT)
    # ... found by a binary search over the sorted (row, node) keys: neighbours on both sides are not a match
    others = plan_of(step("COPY", "b", "d", candidates=["a", "c"], nbytes=1), step("COPY", "a", "d", nbytes=1, no=2))
    with pytest.raises(ValueError, match=r"row 0: .*contain source_node 'b'; got \['a', 'c'\]"):
        schedule(others, DEFAULT)
    with pytest.raises(ValueError, match="source_node must differ from its target_node"):
        schedule(plan_of(step("COPY", "a", "a", nbytes=1)), DEFAULT)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([step("MOVE", "a")], r"action: expected one of \['COPY', 'PROMOTE', 'DROP'\], got \['MOVE'\]"),
        ([step("DROP", "a", no=2)], r"steps must be 1..k without gaps or duplicates, got \[2\]"),
        ([step("DROP", "a"), step("DROP", "b")], r"got \[1, 1\]"),
        ([step("PROMOTE", "a")], "target_node: expected a node for every COPY and PROMOTE"),
        ([{**step("COPY", "a", "b"), "transfer": "rsync"}], r"expected one of \['entries', 'files'\], got \['rsync'\]"),
        ([{**step("COPY", "a", "b"), "bytes": None}], "bytes: expected an integer >= 0 for every COPY"),
        ([{**step("DROP", "a"), "owners": None}], "owners: expected no nulls"),
    ],
)
def test_rows_breaking_the_input_contract(rows: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ScheduleInputError, match=message):
        schedule(plan_of(*rows), DEFAULT)


def test_uncastable_column_type() -> None:
    plan = plan_of(step("DROP", "a"))
    plan = plan.set_column(plan.schema.get_field_index("bytes"), "bytes", pa.array([[1]], pa.list_(pa.int64())))
    with pytest.raises(ScheduleInputError, match=r"bytes: expected int64, got list<item: int64>"):
        schedule(plan, DEFAULT)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_parallel_per_node": 0},
        {"max_parallel_per_node": 1.5},
        {"node_bandwidth_bytes_per_s": 0},
        {"overhead_s": -1},
    ],
)
def test_cost_model_rejects_impossible_parameters(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="expected"):
        CostModel(**kwargs)


# --- properties -----------------------------------------------------------------------------------------------


@st.composite
def random_plans(draw: st.DrawFn) -> tuple[pa.Table, CostModel]:
    """A random plan (rows shuffled) and cost model; see the module docstring for the ranges."""
    nodes = [f"n{i}" for i in range(draw(st.integers(2, 8)))]
    rows: list[dict[str, Any]] = []
    for pid in range(draw(st.integers(1, 30))):
        group = draw(st.sampled_from(["g0", "g1"]))
        owners, replicas = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        for no in range(1, draw(st.integers(1, 4)) + 1):
            action = draw(st.sampled_from(["COPY", "COPY", "PROMOTE", "DROP"]))
            node = draw(st.sampled_from(nodes))
            if action == "COPY":
                target = draw(st.sampled_from(nodes).filter(lambda n, node=node: n != node))
                others = [n for n in nodes if n not in (node, target)]
                cands = sorted({node, *draw(st.lists(st.sampled_from(others), max_size=3) if others else st.just([]))})
                primary = draw(st.none() | st.sampled_from(cands))
                nbytes = draw(st.integers(0, 2 * 10**9))
                transfer = draw(st.sampled_from(["entries", "files"]))
                row = step(action, node, target, candidates=cands, primary=primary, transfer=transfer, nbytes=nbytes)
            elif action == "PROMOTE":
                row = step(action, node, draw(st.sampled_from(nodes)))
            else:
                row = step(action, node)
            rows.append(
                {**row, "group_name": group, "partition_id": pid, "step": no, "owners": owners, "replicas": replicas}
            )
    order = draw(st.permutations(range(len(rows))))
    model = CostModel(
        max_parallel_per_node=draw(st.integers(1, 4)),
        node_bandwidth_bytes_per_s=draw(st.sampled_from([2e8, 1e9, 2.5e9])),
        overhead_s=draw(st.sampled_from([0.01, 0.1, 0.5])),
    )
    return plan_of(*[rows[i] for i in order]), model


def touched(action: str, source: str, target: str | None) -> set[str]:
    return {source} if action == "DROP" else {source, str(target)}


def check_invariants(plan: pa.Table, out: pa.Table, model: CostModel, policy: str, listed: bool = True) -> None:
    """``listed``: the schedule is a list schedule (no ready step that fits is left waiting); ``portfolio``'s packed
    and exact passes are not, and tests/test_schedule_optimum.py checks them against the fluid model instead."""
    rows = out.to_pylist()
    given_rows = plan.to_pylist()
    n = len(rows)
    assert out.num_rows == plan.num_rows
    # same rows, same order; only source_node (COPY) and the schedule columns change
    for r, g in zip(rows, given_rows, strict=True):
        assert {k: v for k, v in r.items() if k != "source_node" and k in g} == {
            k: v for k, v in g.items() if k != "source_node"
        }
        if r["action"] != "COPY":
            assert r["source_node"] == g["source_node"]
    starts = np.array([r["est_start_s"] for r in rows], dtype=float)
    ends = np.array([r["est_end_s"] for r in rows], dtype=float)
    assert np.isfinite(starts).all() and np.isfinite(ends).all()
    assert (starts >= 0).all()
    assert (ends >= starts + model.overhead_s - 1e-9).all()
    # waves: dense ranks of the distinct start times
    distinct = sorted(set(np.round(starts, 9).tolist()))
    assert [r["wave"] for r in rows] == [distinct.index(s) + 1 for s in np.round(starts, 9).tolist()]
    # partitions: steps in order, never overlapping
    by_part: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_part[(r["group_name"], r["partition_id"])].append(i)
    for idx in by_part.values():
        idx.sort(key=lambda i: rows[i]["step"])
        for a, b in zip(idx, idx[1:], strict=False):
            assert ends[a] <= starts[b], (rows[a], rows[b])
    # sources
    for r, g in zip(rows, given_rows, strict=True):
        if r["action"] != "COPY":
            continue
        if policy == "portfolio":
            assert r["source_node"] in g["candidates"] and r["source_node"] != r["target_node"]
        elif policy == "hazelcast":
            assert r["source_node"] == (g["primary_node"] or g["source_node"])
        else:
            assert r["source_node"] == g["source_node"]
    # slots: at every start instant, running steps (start <= t < end) touching any node <= cap
    nodes_of = [touched(r["action"], r["source_node"], r["target_node"]) for r in rows]
    for t in sorted(set(starts.tolist())):
        load: dict[str, int] = defaultdict(int)
        for i in range(n):
            if starts[i] <= t < ends[i]:
                for v in nodes_of[i]:
                    load[v] += 1
        assert max(load.values(), default=0) <= model.max_parallel_per_node, (t, dict(load))
    if policy == "serial":
        order = sorted(range(n), key=lambda i: (rows[i]["group_name"], rows[i]["partition_id"], rows[i]["step"]))
        for a, b in zip(order, order[1:], strict=False):
            assert ends[a] == starts[b]
        return
    if not listed:
        return
    # greedy: at every instant, no ready step that would fit is left waiting. Under portfolio a COPY may also wait while
    # a COPY runs into its target or out of one of its candidates (direction-aware admission, or the candidate
    # schedule that reads from the primary only), never when all of them are idle.
    previous = {idx[k]: idx[k - 1] for idx in by_part.values() for k in range(1, len(idx))}
    cap = model.max_parallel_per_node
    for t in sorted(set(starts.tolist()) | set(ends.tolist())):
        load: dict[str, int] = defaultdict(int)
        receiving: dict[str, int] = defaultdict(int)
        sending: dict[str, int] = defaultdict(int)
        for i in range(n):
            if starts[i] <= t < ends[i]:
                for v in nodes_of[i]:
                    load[v] += 1
                if rows[i]["action"] == "COPY":
                    receiving[rows[i]["target_node"]] += 1
                    sending[rows[i]["source_node"]] += 1
        for i in range(n):
            if starts[i] <= t or (i in previous and ends[previous[i]] > t):
                continue
            r, g = rows[i], given_rows[i]
            if r["action"] == "COPY":
                pool = g["candidates"] if policy == "portfolio" else [g["primary_node"] or g["source_node"]]
                free = [c for c in pool if c != r["target_node"] and load[c] < cap]
                fits = load[r["target_node"]] < cap and bool(free)
                if policy == "portfolio":
                    others = [c for c in pool if c != r["target_node"]]
                    fits = (fits and not receiving[r["target_node"]] and len(free) == len(others)
                            and not any(sending[c] for c in others))
            else:
                fits = all(load[v] < cap for v in nodes_of[i])
            assert not fits, f"step {r} ready and fitting at t={t} but started at {starts[i]}"


@given(random_plans(), st.sampled_from(POLICIES))
@settings(deadline=None)
def test_schedule_invariants_on_random_plans(plan_model: tuple[pa.Table, CostModel], policy: str) -> None:
    """Every step is scheduled once, after its overhead, in partition step order, within the slots, greedily (unless
    ``portfolio`` kept its packed or exact pass); the makespan is at least the lower bound and, for portfolio and
    hazelcast, at most serial's; sources follow the policy; the result is deterministic. The bound ``portfolio``
    reports (computed from the plan, for its passes) is the scheduled plan's, bit for bit: ``schedule_plan`` takes it
    instead of computing it again."""
    plan, model = plan_model
    out, stats = scheduler.schedule_with_stats(plan, model, policy)
    note(f"{model}, policy {policy}, {stats}")
    check_invariants(plan, out, model, policy, listed=stats.chosen not in ("packed", "solver"))
    span = makespan(out)
    bound = lower_bound(out, model)
    assert span >= bound - 1e-6
    assert stats.lower_bound_s is None or stats.lower_bound_s == bound
    if policy != "serial":
        assert span <= makespan(schedule(plan, model, "serial")) + 1e-6
    assert schedule(plan, model, policy).equals(out)


def test_a_packed_schedule_is_not_a_list_schedule_and_is_checked_as_one_that_is_not() -> None:
    # Found by the property test above: at one slot per node the packed pass's plan ends at the bound, 0.035 s
    # against 0.040 s for every list schedule, because it holds back the PROMOTE on n0 from 0.01 s, when n0 frees,
    # to 0.025 s, so that the COPY out of n0 starts at 0.015 s. Every invariant holds but the list schedule's (no
    # ready step that fits is left waiting).
    rows = [step("COPY", "n0", "n1", pid=0, candidates=["n0"], transfer="entries"),
            step("COPY", "n1", "n2", pid=0, no=2, candidates=["n1"], transfer="entries"), step("DROP", "n0", pid=1),
            step("COPY", "n0", "n1", pid=2, candidates=["n0", "n2"], transfer="entries", nbytes=1_000_000),
            step("PROMOTE", "n0", "n0", pid=3)]
    plan = plan_of(*[{**r, "owners": 2, "replicas": 1} for r in rows])
    model = CostModel(max_parallel_per_node=1, node_bandwidth_bytes_per_s=2e8, overhead_s=0.01)
    out, stats = scheduler.schedule_with_stats(plan, model)
    assert stats.chosen == "packed"
    check_invariants(plan, out, model, "portfolio", listed=False)
    with pytest.raises(AssertionError, match="ready and fitting"):
        check_invariants(plan, out, model, "portfolio", listed=True)


# --- portfolio's candidates -----------------------------------------------------------------------------------


def test_a_direction_limit_holds_one_direction_of_a_node_and_not_the_other() -> None:
    # Node a receives three COPYs (from x, y, z) and sends three (to u, v, w), 4e7 bytes each. Its inbound limit is
    # one entry stream, its outbound one unlimited: the three outbound transfers run together, while an inbound one
    # starts only once the one before is within overhead_s of its end (0.1 + 0.1 s: the next starts at 0.1).
    rows = [step("COPY", s, "a", pid=k, nbytes=40_000_000) for k, s in enumerate("xyz")]
    rows += [step("COPY", "a", t, pid=3 + k, nbytes=40_000_000) for k, t in enumerate("uvw")]
    p = scheduler._decode(plan_of(*rows), PLAN_INPUT_SCHEMA.names, DEFAULT)
    solo = scheduler._solo_durations(p, DEFAULT)
    a = p.nodes.index("a")
    limits = np.full(2 * len(p.nodes), np.inf)
    limits[a] = DEFAULT.entry_stream_bytes_per_s
    run = scheduler._simulate(p, DEFAULT, scheduler._Candidate(np.arange(p.n), p.pool_node, p.pool_start,
                                                                np.zeros(len(p.nodes)), limits), solo)
    inbound = np.sort(run.start[p.tgt == a])
    outbound = run.start[p.tgt != a]
    assert inbound == pytest.approx([0.0, 0.1, 0.2])
    assert outbound == pytest.approx([0.0, 0.0, 0.0])


def test_a_step_waits_for_its_ready_instant_and_for_its_partition() -> None:
    # The event loop's `ready_at` (the packed pass replays its plan with it). x -> a (4e7 bytes: 0.2 s) ready at
    # 0.5 starts then though every slot is free; y -> b at 0 starts at 0; partition 2's PROMOTE (ready at 0.05)
    # waits for its COPY to end (0.2 s) and its DROP, ready at 1.0, starts at 1.0 after the PROMOTE's 0.1 s.
    rows = [step("COPY", "x", "a", pid=0, nbytes=40_000_000), step("COPY", "y", "b", pid=1, nbytes=40_000_000)]
    rows += [step("COPY", "z", "c", pid=2, nbytes=40_000_000), step("PROMOTE", "z", "c", pid=2, no=2),
             step("DROP", "z", pid=2, no=3)]
    p = scheduler._decode(plan_of(*rows), PLAN_INPUT_SCHEMA.names, DEFAULT)
    solo = scheduler._solo_durations(p, DEFAULT)
    ready = np.zeros(p.n)
    ready[(p.tgt == p.nodes.index("a"))] = 0.5
    ready[p.action == scheduler.A_PROMOTE] = 0.05
    ready[p.action == scheduler.A_DROP] = 1.0
    cand = scheduler._Candidate(np.arange(p.n), p.pool_node, p.pool_start, ready_at=ready)
    run = scheduler._simulate(p, DEFAULT, cand, solo)
    start = dict(zip(p.rows.tolist(), run.start.tolist(), strict=True))
    assert [start[k] for k in range(5)] == pytest.approx([0.5, 0.0, 0.0, 0.2, 1.0])
    assert run.makespan == pytest.approx(1.1)
    unready = scheduler._simulate(p, DEFAULT, dataclasses.replace(cand, ready_at=np.zeros(p.n)), solo)
    plain = scheduler._simulate(p, DEFAULT, dataclasses.replace(cand, ready_at=None), solo)
    assert np.array_equal(unready.start, plain.start) and np.array_equal(unready.end, plain.end)


@given(random_plans(), st.sampled_from([0.0, 0.1, 0.3, 1.0]))
@settings(deadline=None)
def test_a_tail_longest_first_moves_only_the_last_copies_into_each_node(
    plan_model: tuple[pa.Table, CostModel], fraction: float
) -> None:
    """``_tail_longest_first``: a permutation; PROMOTEs and DROPs keep their places; the COPYs into a node of one
    priority class (urgency, owners) keep the set of places they held, the first ``1 - fraction`` of them their own,
    and the rest hold theirs longest first."""
    plan, model = plan_model
    p = scheduler._decode(plan, PLAN_INPUT_SCHEMA.names, model)
    solo = scheduler._solo_durations(p, model)
    rank = np.random.default_rng(p.n).permutation(p.n)
    out = scheduler._tail_longest_first(p, rank, solo, fraction)
    assert sorted(out.tolist()) == list(range(p.n))
    is_copy = p.action == A_COPY
    assert (out[~is_copy] == rank[~is_copy]).all()
    urgent = (p.owners < p.replicas) | (p.owners <= 1)
    for v, u, owners in {(int(a), bool(b), int(c)) for a, b, c in zip(p.tgt[is_copy], urgent[is_copy],
                                                                      p.owners[is_copy], strict=True)}:
        rows = np.flatnonzero(is_copy & (p.tgt == v) & (urgent == u) & (p.owners == owners))
        rows = rows[np.argsort(rank[rows])]
        assert sorted(out[rows].tolist()) == rank[rows].tolist()
        kept = len(rows) - int(np.ceil(len(rows) * fraction))
        assert (out[rows[:kept]] == rank[rows[:kept]]).all()
        tail = rows[kept:]
        in_place_order = tail[np.argsort(out[tail])]
        assert (np.diff(solo[in_place_order]) <= 0).all()


@pytest.mark.parametrize(
    ("size", "node", "most"),
    # The three failures over 3% of the bound before the tails and *paced* (1.041, 1.040, 1.097); node85 stays
    # above, at 1.044 since the packed pass (1.061 before; docs/PLANNING.md, "Every failure").
    [("XL", 445, 1.03), ("L", 89, 1.03), ("L", 85, 1.045)],
)
def test_the_worst_single_failures_of_the_suite_clusters_against_the_bound(size: str, node: int, most: float) -> None:
    nodes, groups, partitions, backups, nbytes = CLUSTERS[size]
    plan = scenario_plan(Change(size, f"failure of node{node}", nodes, groups, partitions, backups, FAILED,
                                f"node{node}", nbytes))
    out = schedule(plan, DEFAULT, "portfolio")
    assert makespan(out) <= most * lower_bound(out, DEFAULT)


# --- size -----------------------------------------------------------------------------------------------------


def synthetic_plan(steps: int, nodes: int, seed: int = 0) -> pa.Table:
    """About ``steps`` rows: per partition 1-2 COPYs from 1-3 owners to new nodes, a PROMOTE and a DROP or not."""
    rng = np.random.default_rng(seed)
    names = [f"node{i:04d}" for i in range(nodes)]
    rows: list[dict[str, Any]] = []
    pid = 0
    while len(rows) < steps:
        owners = int(rng.integers(1, 4))
        picked = [names[i] for i in rng.choice(nodes, size=min(owners + 2, nodes), replace=False)]
        own, new = picked[:owners], picked[owners:]
        part: list[dict[str, Any]] = []
        for j in range(min(int(rng.integers(1, 3)), len(new))):
            transfer = str(rng.choice(["entries", "files"]))
            nbytes = int(rng.integers(10**6, 2 * 10**9))
            part.append(
                step(
                    "COPY", own[j % len(own)], new[j], candidates=own, primary=own[0], transfer=transfer, nbytes=nbytes
                )
            )
        if new and rng.random() < 0.5:
            part.append(step("PROMOTE", own[0], new[0]))
        if rng.random() < 0.5:
            part.append(step("DROP", own[-1]))
        rows += [{**r, "partition_id": pid, "step": k, "owners": owners, "replicas": 3} for k, r in enumerate(part, 1)]
        pid += 1
    return plan_of(*rows)


@pytest.mark.slow
def test_ten_thousand_steps_on_ten_nodes() -> None:
    plan = synthetic_plan(10_000, 10)
    for policy in POLICIES:
        began = time.perf_counter()
        out = schedule(plan, DEFAULT, policy)
        took = time.perf_counter() - began
        print(
            f"{policy}: {plan.num_rows} steps in {took:.2f} s, makespan {makespan(out):.1f} s, "
            f"lower bound {lower_bound(out, DEFAULT):.1f} s"
        )
        assert out.num_rows == plan.num_rows
