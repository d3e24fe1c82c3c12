"""Scenario tests of the pure exchange stages (fullmap, counters, lost, late_affinity, demands).

Each scenario builds tiny stage frames by hand and compares the stage outputs with exact expected frames. The
helper :func:`run_stages` calls the stages in the order the orchestrator must use (docs/EXCHANGE.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.exchange import counters, demands, fullmap, late_affinity, lost
from rebalancer.exchange.fullmap import MAP_SCHEMA, REPORT_SCHEMA

GROUPS_DDL = "group_name string, partitions int, loss_policy string"
NODES_DDL = "node_id string, node_order bigint, is_client boolean"
IDEAL_DDL = "group_name string, partition_id int, replica_index int, node_id string"
NAMES_DDL = "group_name string"
PARTS_DDL = "group_name string, partition_id int"

OW, MV, RT, EV, LS = "OWNING", "MOVING", "RENTING", "EVICTED", "LOST"
RWS, ROS, IGN = "READ_WRITE_SAFE", "READ_ONLY_SAFE", "IGNORE"


def same(actual: DataFrame, expected: DataFrame) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def map_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, MAP_SCHEMA)


def owning(group: str, partition: int, nodes: list[str], counter: int, size: int, nbytes: int) -> list[tuple]:
    return [(group, partition, n, OW, counter, size, nbytes) for n in nodes]


def lists_of(spark: SparkSession, lists: dict[tuple[str, int], list[str]]) -> DataFrame:
    rows = [(g, p, i, n) for (g, p), nodes in lists.items() for i, n in enumerate(nodes)]
    return spark.createDataFrame(rows, IDEAL_DDL)


def assignment_of(spark: SparkSession, lists: dict[tuple[str, int], tuple[list[str], bool]]) -> DataFrame:
    rows = [(g, p, i, n, temp) for (g, p), (nodes, temp) in lists.items() for i, n in enumerate(nodes)]
    return spark.createDataFrame(rows, late_affinity.AFFINITY_SCHEMA)


def nodes_of(spark: SparkSession, names: list[str], clients: tuple[str, ...] = ()) -> DataFrame:
    """Alive nodes; node_order is the number in the name (n1 -> 1), clients get 100+."""
    rows = [(n, int(n[1:]) if n[0] == "n" else 100 + i, n in clients) for i, n in enumerate(names)]
    return spark.createDataFrame(rows, NODES_DDL)


def names_of(spark: SparkSession, names: tuple[str, ...] | list[str]) -> DataFrame:
    return spark.createDataFrame([(n,) for n in names], NAMES_DDL)


def reports_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, REPORT_SCHEMA)


def demands_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    """Rows (id, group, partition, step, source, target, mode, from, to, bytes) -> DEMANDS_SCHEMA."""
    full = [(i, g, p, s, "COPY", src, dst, mode, f, t, b, None, None, None, None, None)
            for i, g, p, s, src, dst, mode, f, t, b
            in rows]
    return spark.createDataFrame(full, demands.DEMANDS_SCHEMA)


def conflicts_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, counters.CONFLICTS_SCHEMA)


def lost_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, lost.LOST_SCHEMA)


@dataclass
class Outputs:
    """What one exchange's stages produce (the final map checkpointed, as if written and read back)."""

    map: DataFrame
    conflicts: DataFrame
    lost: DataFrame
    assignment: DataFrame
    demands: DataFrame


def run_stages(
    spark: SparkSession,
    *,
    prev_map: DataFrame,
    reports: DataFrame,
    nodes: DataFrame,
    groups: DataFrame,
    ideal: DataFrame,
    prev_assignment: DataFrame,
    prev_max_report_seq: int | None,
    prev_lost: DataFrame | None = None,
    reset_groups: tuple[str, ...] = (),
    new_groups: tuple[str, ...] = (),
    history_threshold: int = 500,
) -> Outputs:
    """The stages in the orchestrator's order (docs/EXCHANGE.md, "Call order")."""
    prev_owned = prev_map.where(F.col("state") == OW).select("group_name", "partition_id").distinct()
    prev_lost = prev_lost if prev_lost is not None else spark.createDataFrame([], PARTS_DDL)
    reset_df, new_df = names_of(spark, reset_groups), names_of(spark, new_groups)
    map_df = fullmap.base_map(prev_map, reports, nodes, groups, prev_max_report_seq)
    map_df = lost.apply_reset(map_df, reset_df)
    conflicts_df = counters.find_counter_conflicts(map_df)
    map_df = counters.apply_counter_resets(map_df)
    lost_df = lost.find_lost(map_df, prev_owned, prev_lost, groups, reset_df, new_df)
    # The orchestrator materializes the map here and at the end (docs/EXCHANGE.md); localCheckpoint stands in.
    map_df = lost.apply_loss_decisions(
        map_df, lost_df, ideal, new_df, reset_df, groups, prev_map.select("group_name", "partition_id")
    ).localCheckpoint()
    assignment_df = late_affinity.late_affinity(ideal, prev_assignment, map_df, nodes)
    map_df = late_affinity.surplus_to_renting(map_df, assignment_df, ideal)
    map_df = demands.add_moving_targets(map_df, ideal).localCheckpoint()
    demands_df = demands.rebalance_demands(ideal, map_df, fullmap.latest_reports(reports), history_threshold)
    return Outputs(map=map_df, conflicts=conflicts_df, lost=lost_df, assignment=assignment_df, demands=demands_df)


# ---------------------------------------------------------------- Ignite's late affinity example


def test_node_joins_old_owner_serves_as_temporary_primary_until_switch(spark: SparkSession) -> None:
    """3 nodes, 3 partitions, 1 backup; node 4 joins as p0's new primary and p1's new backup."""
    groups = spark.createDataFrame([("g", 3, None)], GROUPS_DDL)
    nodes = nodes_of(spark, ["n1", "n2", "n3", "n4"])
    prev_map = map_of(
        spark,
        owning("g", 0, ["n1", "n2"], 10, 100, 1000)
        + owning("g", 1, ["n2", "n3"], 10, 100, 1000)
        + owning("g", 2, ["n3", "n1"], 10, 100, 1000),
    )
    old_reports = [("n1", "g", 0, OW, 10, 100, 1000, None, 6)]  # consumed by the previous version: ignored
    prev_assignment = assignment_of(
        spark, {("g", 0): (["n1", "n2"], False), ("g", 1): (["n2", "n3"], False), ("g", 2): (["n3", "n1"], False)}
    )
    ideal = lists_of(spark, {("g", 0): ["n4", "n1"], ("g", 1): ["n2", "n4"], ("g", 2): ["n3", "n1"]})

    joined = run_stages(
        spark, prev_map=prev_map, reports=reports_of(spark, old_reports), nodes=nodes, groups=groups, ideal=ideal,
        prev_assignment=prev_assignment, prev_max_report_seq=6,
    )

    same(
        joined.assignment,
        assignment_of(
            spark, {("g", 0): (["n1", "n4"], True), ("g", 1): (["n2", "n4"], False), ("g", 2): (["n3", "n1"], False)}
        ),
    )
    same(
        joined.map,
        map_of(spark, prev_map.collect() + [("g", 0, "n4", MV, 0, 0, 0), ("g", 1, "n4", MV, 0, 0, 0)]),
    )
    # p0's pool is [n1, n2] (p0 offset 0 -> n1), p1's is [n2, n3] (offset 1 -> n3): not always the primary.
    same(
        joined.demands,
        demands_of(
            spark,
            [(1, "g", 0, 1, "n1", "n4", "FULL", 0, 10, 1000), (2, "g", 1, 1, "n3", "n4", "FULL", 0, 10, 1000)],
        ),
    )
    same(late_affinity.switch_due(ideal, joined.assignment, joined.map),
         spark.createDataFrame([(False, 1)], late_affinity.SWITCH_SCHEMA))

    # Node 4 reports both partitions OWNING: the switch is due; the switch exchange installs the ideal assignment
    # and the copies outside it (n2's p0, n3's p1) start renting.
    reports = reports_of(
        spark, [*old_reports, ("n4", "g", 0, OW, 10, 100, 1000, 0, 7), ("n4", "g", 1, OW, 10, 100, 1000, 0, 8)]
    )
    current_map = fullmap.base_map(joined.map, reports, nodes, groups, 6)
    same(late_affinity.switch_due(ideal, joined.assignment, current_map),
         spark.createDataFrame([(True, 0)], late_affinity.SWITCH_SCHEMA))
    # Given the committed map, partitions with a loading (MOVING) ideal copy wait too, temporary or not: p1 here.
    not_temporary = joined.assignment.where("not is_temporary")
    same(late_affinity.switch_due(ideal, not_temporary, joined.map, joined.map),
         spark.createDataFrame([(False, 2)], late_affinity.SWITCH_SCHEMA))
    same(late_affinity.switch_due(ideal, not_temporary, current_map, joined.map),
         spark.createDataFrame([(True, 0)], late_affinity.SWITCH_SCHEMA))

    switched = run_stages(
        spark, prev_map=joined.map, reports=reports, nodes=nodes, groups=groups, ideal=ideal,
        prev_assignment=joined.assignment, prev_max_report_seq=6,
    )
    same(
        switched.assignment,
        assignment_of(
            spark, {("g", 0): (["n4", "n1"], False), ("g", 1): (["n2", "n4"], False), ("g", 2): (["n3", "n1"], False)}
        ),
    )
    same(
        switched.map,
        map_of(
            spark,
            owning("g", 0, ["n1", "n4"], 10, 100, 1000)
            + [("g", 0, "n2", RT, 10, 100, 1000)]
            + owning("g", 1, ["n2", "n4"], 10, 100, 1000)
            + [("g", 1, "n3", RT, 10, 100, 1000)]
            + owning("g", 2, ["n3", "n1"], 10, 100, 1000),
        ),
    )
    assert switched.demands.count() == 0


def test_primary_failure_promotes_owning_backup_else_oldest_owner(spark: SparkSession) -> None:
    """n1 (primary of every partition) fails; the ideal primaries hold no data for p0 and p1."""
    groups = spark.createDataFrame([("g", 3, None)], GROUPS_DDL)
    prev_map = map_of(
        spark,
        owning("g", 0, ["n1", "n2"], 10, 100, 1000)
        + owning("g", 1, ["n1", "n2", "n4"], 10, 100, 1000)
        + [("g", 1, "n3", MV, 4, 40, 400)]
        + owning("g", 2, ["n1", "n4"], 10, 100, 1000),
    )
    prev_assignment = assignment_of(
        spark, {("g", 0): (["n1", "n2"], False), ("g", 1): (["n1", "n3"], False), ("g", 2): (["n1", "n4"], False)}
    )
    ideal = lists_of(spark, {("g", 0): ["n3", "n2"], ("g", 1): ["n3", "n4"], ("g", 2): ["n4", "n2"]})

    out = run_stages(
        spark, prev_map=prev_map, reports=reports_of(spark, []), nodes=nodes_of(spark, ["n2", "n3", "n4"]),
        groups=groups, ideal=ideal, prev_assignment=prev_assignment, prev_max_report_seq=None,
    )

    same(
        out.assignment,
        assignment_of(
            spark,
            {
                ("g", 0): (["n2", "n3"], True),  # C's backup n2 owns: T = n2
                ("g", 1): (["n2", "n3", "n4"], True),  # C's backup n3 is MOVING: lowest node_order owner n2
                ("g", 2): (["n4", "n2"], False),  # the ideal primary owns
            },
        ),
    )


# ---------------------------------------------------------------- lost partitions


def test_two_failures_lose_a_partition_under_each_policy_then_reset(spark: SparkSession) -> None:
    """p0 lives on n1 and n2, which both fail; p1 survives on n3. Then n1 returns with data and two groups reset."""
    groups = spark.createDataFrame([("g_rws", 2, None), ("g_ros", 2, ROS), ("g_ign", 2, IGN)], GROUPS_DDL)
    names = ["g_rws", "g_ros", "g_ign"]
    prev_map = map_of(
        spark,
        [
            row
            for g in names
            for row in owning(g, 0, ["n1", "n2"], 5, 50, 500) + owning(g, 1, ["n3", "n1"], 7, 70, 700)
        ]
        + [("g_rws", 0, "n3", MV, 3, 30, 300)],
    )
    prev_assignment = assignment_of(
        spark, {(g, p): (nodes, False) for g in names for p, nodes in ((0, ["n1", "n2"]), (1, ["n3", "n1"]))}
    )
    ideal = lists_of(spark, {(g, p): nodes for g in names for p, nodes in ((0, ["n4", "n3"]), (1, ["n3", "n4"]))})
    common = {"groups": groups, "ideal": ideal, "prev_max_report_seq": 100}

    # Exchange A: n1 and n2 fail.
    a = run_stages(
        spark, prev_map=prev_map, reports=reports_of(spark, []), nodes=nodes_of(spark, ["n3", "n4"]),
        prev_assignment=prev_assignment, **common,
    )
    same(
        a.lost,
        lost_of(
            spark, [("g_rws", 0, RWS, False, False), ("g_ros", 0, ROS, False, False), ("g_ign", 0, IGN, True, True)]
        ),
    )
    survivors = [row for g in names for row in owning(g, 1, ["n3"], 7, 70, 700) + [(g, 1, "n4", MV, 0, 0, 0)]]
    same(
        a.map,
        map_of(
            spark,
            survivors
            + [
                ("g_rws", 0, "n3", LS, 0, 30, 300),  # a MOVING copy marked LOST loses its counter
                ("g_rws", 0, "n4", LS, 0, 0, 0),  # placeholder on an ideal node holding nothing
                ("g_ros", 0, "n3", LS, 0, 0, 0),
                ("g_ros", 0, "n4", LS, 0, 0, 0),
                ("g_ign", 0, "n3", OW, 0, 0, 0),  # IGNORE: recreated empty on the ideal nodes
                ("g_ign", 0, "n4", OW, 0, 0, 0),
            ],
        ),
    )
    same(lost.write_blocked_groups(a.lost), names_of(spark, ["g_ros"]))
    same(
        a.demands,  # the lost partitions have no owner, hence no demand
        demands_of(
            spark,
            [(i + 1, g, 1, 1, "n3", "n4", "FULL", 0, 7, 700) for i, g in enumerate(["g_ign", "g_ros", "g_rws"])],
        ),
    )

    # Exchange B: n1 returns with its p0 copies OWNING, and g_rws and g_ign are reset (RESET_LOST_PARTITIONS).
    # g_ros is not reset: LOST is sticky, n1's copy is marked LOST (counter kept for a later reset). In g_rws the
    # LOST copies become OWNING, n1's has the highest counter and keeps owning, the others reset to MOVING.
    returning = reports_of(
        spark, [("n1", "g_rws", 0, OW, 5, 50, 500, 0, 101), ("n1", "g_ros", 0, OW, 5, 50, 500, 0, 102)]
    )
    b = run_stages(
        spark, prev_map=a.map, reports=returning, nodes=nodes_of(spark, ["n1", "n3", "n4"]),
        prev_assignment=a.assignment, prev_lost=a.lost, reset_groups=("g_rws", "g_ign"), **common,
    )
    same(
        b.conflicts,
        conflicts_of(
            spark, [("g_rws", 0, "n3", 0, 5, 30, "RESET_TO_MOVING"), ("g_rws", 0, "n4", 0, 5, 0, "RESET_TO_MOVING")]
        ),
    )
    same(b.lost, lost_of(spark, [("g_ros", 0, ROS, False, False)]))
    same(
        b.map.where("partition_id = 0 and group_name != 'g_ign'"),
        map_of(
            spark,
            [
                ("g_rws", 0, "n1", OW, 5, 50, 500),
                ("g_rws", 0, "n3", MV, 0, 30, 300),
                ("g_rws", 0, "n4", MV, 0, 0, 0),
                ("g_ros", 0, "n1", LS, 5, 50, 500),
                ("g_ros", 0, "n3", LS, 0, 0, 0),
                ("g_ros", 0, "n4", LS, 0, 0, 0),
            ],
        ),
    )
    same(
        b.assignment.where("partition_id = 0 and group_name = 'g_rws'"),
        assignment_of(spark, {("g_rws", 0): (["n1", "n4", "n3"], True)}),  # no C node owns: oldest owner n1
    )
    same(
        b.demands,
        demands_of(
            spark,
            [
                (1, "g_ign", 1, 1, "n3", "n4", "FULL", 0, 7, 700),
                (2, "g_ros", 1, 1, "n3", "n4", "FULL", 0, 7, 700),
                (3, "g_rws", 0, 1, "n1", "n4", "FULL", 0, 5, 500),
                (4, "g_rws", 0, 2, "n1", "n3", "FULL", 0, 5, 500),
                (5, "g_rws", 1, 1, "n3", "n4", "FULL", 0, 7, 700),
            ],
        ),
    )


def test_new_group_starts_empty_owning_and_reset_recreates_partition_without_copies(spark: SparkSession) -> None:
    """gn is created in this exchange; gr is reset while its p0 has no copy left anywhere."""
    groups = spark.createDataFrame([("gn", 2, None), ("gr", 2, None)], GROUPS_DDL)
    ideal = lists_of(spark, {(g, 0): ["n1", "n2"] for g in ("gn", "gr")} | {(g, 1): ["n2", "n1"] for g in ("gn", "gr")})
    reports = reports_of(
        spark,
        [
            ("n2", "gn", 0, MV, 3, 3, 30, None, 1),  # nobody owns gn p0: recreated, this copy replaced
            ("n1", "gn", 1, OW, 3, 3, 30, None, 2),  # gn p1 is owned: kept
        ],
    )
    prev_map = map_of(spark, [("gr", 1, "n1", LS, 4, 4, 40)])
    prev_lost = spark.createDataFrame([("gr", 0), ("gr", 1)], PARTS_DDL)

    out = run_stages(
        spark, prev_map=prev_map, reports=reports, nodes=nodes_of(spark, ["n1", "n2"]), groups=groups, ideal=ideal,
        prev_assignment=spark.createDataFrame([], late_affinity.AFFINITY_SCHEMA), prev_max_report_seq=None,
        prev_lost=prev_lost, reset_groups=("gr",), new_groups=("gn",),
    )

    same(out.lost, lost_of(spark, []))
    same(
        out.map,
        map_of(
            spark,
            [
                ("gn", 0, "n1", OW, 0, 0, 0),
                ("gn", 0, "n2", OW, 0, 0, 0),
                ("gn", 1, "n1", OW, 3, 3, 30),
                ("gn", 1, "n2", MV, 0, 0, 0),
                ("gr", 0, "n1", OW, 0, 0, 0),
                ("gr", 0, "n2", OW, 0, 0, 0),
                ("gr", 1, "n1", OW, 4, 4, 40),
                ("gr", 1, "n2", MV, 0, 0, 0),
            ],
        ),
    )
    # First exchange (no previous assignment): n1 owns gn p1 but the ideal primary n2 does not.
    same(
        out.assignment.where("partition_id = 1"),
        assignment_of(spark, {("gn", 1): (["n1", "n2"], True), ("gr", 1): (["n1", "n2"], True)}),
    )


# ---------------------------------------------------------------- counters and rebalance mode


def test_size_mismatch_is_a_warning_and_lagging_owner_resets_to_moving(spark: SparkSession) -> None:
    map_df = map_of(
        spark,
        [
            ("g", 0, "n1", OW, 10, 100, 1000),
            ("g", 0, "n2", OW, 10, 101, 1010),
            ("g", 0, "n3", OW, 8, 90, 900),
            ("g", 0, "n4", MV, 2, 20, 200),
            ("g", 1, "n1", OW, 10, 100, 1000),
            ("g", 1, "n2", OW, 10, 100, 1000),
        ],
    )
    conflicts_df = counters.find_counter_conflicts(map_df)
    same(
        conflicts_df,
        conflicts_of(
            spark,
            [
                ("g", 0, "n3", 8, 10, 90, "RESET_TO_MOVING"),
                ("g", 0, "n1", 10, 10, 100, "SIZE_MISMATCH"),
                ("g", 0, "n2", 10, 10, 101, "SIZE_MISMATCH"),
            ],
        ),
    )
    same(
        counters.apply_counter_resets(map_df).where("state != 'OWNING'"),
        map_of(spark, [("g", 0, "n3", MV, 8, 90, 900), ("g", 0, "n4", MV, 2, 20, 200)]),
    )


def test_lagging_replica_historical_when_history_covers_it_else_full(spark: SparkSession) -> None:
    """n2 (n3 for p5) restarts behind; which owner can replay its WAL decides HISTORICAL or FULL (threshold 500)."""
    groups = spark.createDataFrame([("g", 6, None)], GROUPS_DDL)
    nodes = nodes_of(spark, ["n1", "n2", "n3"])
    lagging = [("n2", "g", p, OW, 900, 1990, 19900, 0, 10 + p) for p in range(4)]
    reports = reports_of(
        spark,
        lagging
        + [
            ("n1", "g", 0, OW, 1000, 2000, 20000, 100, 1),  # history from 100 covers c = 900
            ("n1", "g", 1, OW, 1000, 2000, 20000, 100, 1),
            ("n1", "g", 1, OW, 1000, 2000, 20000, 950, 2),  # latest report: history starts after 900
            ("n1", "g", 2, OW, 1000, 2000, 20000, None, 3),  # no history
            ("n1", "g", 3, OW, 1000, 400, 4000, 0, 4),  # 400 entries <= threshold
            ("n1", "g", 4, OW, 5000, 2000, 20000, 0, 5),  # 4900 updates behind >= 2000 entries
            ("n2", "g", 4, OW, 100, 1990, 19900, 0, 14),
            ("n1", "g", 5, OW, 1000, 2000, 20000, 100, 6),  # eligible
            ("n2", "g", 5, OW, 1000, 2000, 20000, 950, 7),  # max counter, not eligible
            ("n3", "g", 5, OW, 900, 1990, 19900, 0, 8),
        ],
    )
    ideal = lists_of(spark, {("g", p): ["n1", "n2"] for p in range(5)} | {("g", 5): ["n3", "n1"]})

    out = run_stages(
        spark, prev_map=map_of(spark, []), reports=reports, nodes=nodes, groups=groups, ideal=ideal,
        prev_assignment=spark.createDataFrame([], late_affinity.AFFINITY_SCHEMA), prev_max_report_seq=None,
    )

    same(
        out.conflicts,
        conflicts_of(
            spark,
            [("g", p, "n2", 900, 1000, 1990, "RESET_TO_MOVING") for p in range(4)]
            + [("g", 4, "n2", 100, 5000, 1990, "RESET_TO_MOVING"), ("g", 5, "n3", 900, 1000, 1990, "RESET_TO_MOVING")],
        ),
    )
    same(
        out.demands,
        demands_of(
            spark,
            [
                (1, "g", 0, 1, "n1", "n2", "HISTORICAL", 900, 1000, 1000),  # 20000 bytes * 100 / 2000 entries
                (2, "g", 1, 1, "n1", "n2", "FULL", 0, 1000, 20000),
                (3, "g", 2, 1, "n1", "n2", "FULL", 0, 1000, 20000),
                (4, "g", 3, 1, "n1", "n2", "FULL", 0, 1000, 4000),
                (5, "g", 4, 1, "n1", "n2", "FULL", 0, 5000, 20000),
                (6, "g", 5, 1, "n1", "n3", "HISTORICAL", 900, 1000, 1000),  # only n1 is eligible
            ],
        ),
    )


def test_suppliers_round_robin_over_candidates(spark: SparkSession) -> None:
    """Six partitions owned by n1, n2, n3 at the same counter, all needed on n4: each owner supplies two."""
    map_df = map_of(spark, [row for p in range(6) for row in owning("g", p, ["n1", "n2", "n3"], 10, 10, 100)])
    ideal = lists_of(spark, {("g", p): ["n4"] for p in range(6)})
    reports = reports_of(spark, [])
    sources = [
        (r.partition_id, r.source_node)
        for r in demands.rebalance_demands(ideal, map_df, reports, 500).orderBy("partition_id").collect()
    ]
    assert sources == [(0, "n1"), (1, "n2"), (2, "n3"), (3, "n1"), (4, "n2"), (5, "n3")]


# ---------------------------------------------------------------- full map


def test_evicted_leaves_the_map_and_stale_reports_are_ignored(spark: SparkSession) -> None:
    groups = spark.createDataFrame([("g", 2, None)], GROUPS_DDL)
    nodes = nodes_of(spark, ["n1", "n2", "n3", "c1"], clients=("c1",))
    prev_map = map_of(
        spark,
        [
            ("g", 0, "n1", OW, 10, 100, 1000),
            ("g", 0, "n2", RT, 10, 100, 1000),
            ("g", 1, "n3", OW, 20, 200, 2000),
            ("g", 1, "n9", OW, 20, 200, 2000),  # n9 is gone
            ("gx", 0, "n1", OW, 1, 1, 10),  # gx was stopped
            ("g", 5, "n1", OW, 1, 1, 10),  # beyond g's partitions
        ],
    )
    reports = reports_of(
        spark,
        [
            ("n2", "g", 0, EV, 10, 0, 0, None, 11),  # eviction finished: leaves the map
            ("n1", "g", 0, MV, 3, 3, 30, None, 5),  # stale (<= previous max_report_seq 10)
            ("n3", "g", 1, OW, 21, 210, 2100, None, 12),
            ("n3", "g", 1, OW, 22, 220, 2200, None, 13),  # latest per copy wins
            ("c1", "g", 0, OW, 99, 1, 1, None, 14),  # clients hold no data
            ("n9", "g", 0, OW, 99, 1, 1, None, 15),  # dead node
            ("n2", "g", 1, MV, 0, 0, 0, None, 16),  # a new copy
        ],
    )
    expected = [("g", 0, "n1", OW, 10, 100, 1000), ("g", 1, "n3", OW, 22, 220, 2200), ("g", 1, "n2", MV, 0, 0, 0)]
    same(fullmap.base_map(prev_map, reports, nodes, groups, 10), map_of(spark, expected))
    # Without a previous max every report counts: the seq-5 report is then n1's latest.
    same(
        fullmap.base_map(prev_map, reports, nodes, groups, None),
        map_of(spark, [("g", 0, "n1", MV, 3, 3, 30), *expected[1:]]),
    )


# ---------------------------------------------------------------- properties

NODE_IDS = ["n1", "n2", "n3", "n4", "n5"]
STATES = [None, OW, OW, MV, RT, LS]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Several small groups over up to 5 nodes: previous map, reports, previous assignment, alive set."""
    alive = draw(st.lists(st.sampled_from(NODE_IDS), min_size=1, max_size=5, unique=True))
    groups, prev_map, reports, prev_assign, prev_lost, ideal = [], [], [], [], [], []
    seq = 100
    for gi in range(draw(st.integers(2, 8))):
        g = f"g{gi}"
        partitions = draw(st.integers(1, 3))
        replicas = min(draw(st.integers(1, 3)), len(alive))
        groups.append((g, partitions, draw(st.sampled_from([None, RWS, ROS, IGN]))))
        for p in range(partitions):
            for n in NODE_IDS:
                state = draw(st.sampled_from(STATES))
                if state:
                    prev_map.append((g, p, n, state, draw(st.integers(0, 3)), 5, 50))
                if draw(st.integers(0, 3)) == 0:
                    seq += 1
                    state = draw(st.sampled_from([OW, MV, RT, EV, LS]))
                    reports.append((n, g, p, state, draw(st.integers(0, 3)), 5, 50, None, seq))
            current = draw(st.lists(st.sampled_from(NODE_IDS), min_size=1, max_size=3, unique=True))
            prev_assign += [(g, p, i, n, False) for i, n in enumerate(current)]
            ideal += [(g, p, i, alive[(p + gi + i) % len(alive)]) for i in range(replicas)]
            if draw(st.booleans()) and draw(st.booleans()):
                prev_lost.append((g, p))
    return {"alive": alive, "groups": groups, "prev_map": prev_map, "reports": reports,
            "prev_assign": prev_assign, "prev_lost": prev_lost, "ideal": ideal}


def _expected_owned(s: dict[str, Any]) -> set[tuple[str, int]]:
    """Partitions with an alive OWNING copy after the base map (the counter rule keeps the max-counter owners)."""
    copies = {(g, p, n): st_ for g, p, n, st_, *_ in s["prev_map"] if n in s["alive"]}
    for n, g, p, state, *_rest, seq in sorted(s["reports"], key=lambda r: r[-1]):
        if n in s["alive"] and seq > 100:
            copies[(g, p, n)] = state
    return {(g, p) for (g, p, _n), state in copies.items() if state == OW}


@settings(max_examples=max(3, settings.default.max_examples // 8))  # each example holds up to 8 groups
@given(s=scenarios())
def test_property_owned_partitions_get_owning_primary_and_lost_iff_no_owner(
    spark: SparkSession, s: dict[str, Any]
) -> None:
    out = run_stages(
        spark,
        prev_map=map_of(spark, s["prev_map"]),
        reports=reports_of(spark, s["reports"]),
        nodes=nodes_of(spark, s["alive"]),
        groups=spark.createDataFrame(s["groups"], GROUPS_DDL),
        ideal=spark.createDataFrame(s["ideal"], IDEAL_DDL),
        prev_assignment=spark.createDataFrame(s["prev_assign"], late_affinity.AFFINITY_SCHEMA),
        prev_max_report_seq=100,
        prev_lost=spark.createDataFrame(s["prev_lost"], PARTS_DDL),
    )
    final_map = {(r.group_name, r.partition_id, r.node_id): r.state for r in out.map.collect()}
    assignment = out.assignment.collect()
    lost_rows = {(r.group_name, r.partition_id): r.loss_policy for r in out.lost.collect()}

    # Every partition with an OWNING copy is served by an OWNING primary; every partition is assigned.
    primaries = {(r.group_name, r.partition_id): r.node_id for r in assignment if r.replica_index == 0}
    owned_final = {(g, p) for (g, p, _n), state in final_map.items() if state == OW}
    for part in owned_final:
        assert final_map.get((*part, primaries.get(part))) == OW, (part, primaries.get(part), final_map)
    assert set(primaries) == {(g, p) for g, p, *_ in s["ideal"]}
    indices: dict[tuple[str, int], list[int]] = {}
    for r in assignment:
        indices.setdefault((r.group_name, r.partition_id), []).append(r.replica_index)
    assert all(sorted(v) == list(range(len(v))) for v in indices.values()), indices

    # Lost iff owned before and no alive owner now, or lost before (no reset here).
    existing = {(g, p) for g, n_parts, _ in s["groups"] for p in range(n_parts)}
    prev_owned = {(g, p) for g, p, _n, state, *_ in s["prev_map"] if state == OW}
    expected_lost = ((prev_owned - _expected_owned(s)) | set(s["prev_lost"])) & existing
    assert set(lost_rows) == expected_lost
    # Non-IGNORE lost partitions have no owner; IGNORE ones are owned on every ideal node.
    for (g, p), policy in lost_rows.items():
        ideal_nodes = [n for g2, p2, _i, n in s["ideal"] if (g2, p2) == (g, p)]
        if policy == IGN:
            assert (g, p) not in _expected_owned(s) or (g, p) in owned_final
            if (g, p) not in _expected_owned(s):
                assert all(final_map[(g, p, n)] == OW for n in ideal_nodes)
        else:
            assert (g, p) not in owned_final
            assert all(final_map[(g, p, n)] == LS for n in ideal_nodes)


@pytest.mark.parametrize("stage", ["base_map", "late_affinity"])
def test_missing_columns_are_named(spark: SparkSession, stage: str) -> None:
    bad = spark.createDataFrame([("g",)], "group_name string")
    with pytest.raises(fullmap.StageInputError, match="lacks columns"):
        if stage == "base_map":
            fullmap.base_map(bad, reports_of(spark, []), nodes_of(spark, ["n1"]), bad, None)
        else:
            late_affinity.late_affinity(bad, bad, map_of(spark, []), nodes_of(spark, ["n1"]))
