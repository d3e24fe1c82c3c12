"""Golden tests of the migration planner stage, the Spark scheduling wrapper, and partition versions and stamps."""

from __future__ import annotations

from typing import Any

import mmh3
import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from rebalancer.exchange import fullmap
from rebalancer.exchange.fullmap import MAP_SCHEMA, REPORT_SCHEMA
from rebalancer.planning import planner, versions
from rebalancer.planning.schedule import CostModel
from tests.test_exchange_stages import assignment_of, lists_of

OW, MV, RT = "OWNING", "MOVING", "RENTING"
GB = 10**9


def map_of(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, MAP_SCHEMA)


def no_reports(spark: SparkSession) -> DataFrame:
    return fullmap.latest_reports(spark.createDataFrame([], REPORT_SCHEMA))


def columns(df_or_schema: DataFrame | StructType) -> list[tuple[str, str]]:
    schema = df_or_schema if isinstance(df_or_schema, StructType) else df_or_schema.schema
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def plan_rows(plan_df: DataFrame) -> list[tuple[Any, ...]]:
    columns = ["migration_id", "partition_id", "step", "action", "source_node", "target_node", "rebalance_mode",
               "bytes", "transfer", "chunks", "candidates", "primary_node", "owners", "replicas"]
    return [tuple(r) for r in plan_df.orderBy("migration_id").select(*columns).collect()]


def join_scenario(spark: SparkSession) -> tuple[DataFrame, DataFrame, DataFrame]:
    """n4 joins a cluster of n1..n3 (1 backup): the final map and assignments an exchange hands the planner.

    p0: ideal [n1, n4]; n1 owns (primary stays), n2 owned the old backup, n4 is empty.
    p1: ideal [n4, n2]; n1 (old primary) and n2 own, so n1 serves as temporary primary [n1, n4, n2].
    p2: lost: no owner, only LOST marks; nothing can be planned.
    p3: ideal [n2, n3], both own: steady.
    """
    ideal = lists_of(spark, {("g", 0): ["n1", "n4"], ("g", 1): ["n4", "n2"], ("g", 2): ["n3", "n4"],
                             ("g", 3): ["n2", "n3"]})
    assignment = assignment_of(spark, {("g", 0): (["n1", "n4"], False), ("g", 1): (["n1", "n4", "n2"], True),
                                       ("g", 2): (["n3", "n4"], False), ("g", 3): (["n2", "n3"], False)})
    map_df = map_of(spark, [
        ("g", 0, "n1", OW, 10, 100, 2 * GB), ("g", 0, "n2", OW, 10, 100, 2 * GB), ("g", 0, "n4", MV, 0, 0, 0),
        ("g", 1, "n1", OW, 7, 70, GB), ("g", 1, "n2", OW, 7, 70, GB), ("g", 1, "n4", MV, 0, 0, 0),
        ("g", 2, "n3", "LOST", 5, 50, GB), ("g", 2, "n4", MV, 0, 0, 0),
        ("g", 3, "n2", OW, 3, 30, GB), ("g", 3, "n3", OW, 3, 30, GB),
    ])
    return ideal, assignment, map_df


def test_join_plans_copy_then_promote_then_drop_only_for_data_bearing_partitions(spark: SparkSession) -> None:
    ideal, assignment, map_df = join_scenario(spark)
    plan = planner.plan_migrations(ideal, assignment, map_df, no_reports(spark), history_threshold=500)
    # p0 has one pool {n1, n2} with one demand (ordinal 1, p0 offset 0): the first member, n1.
    # p1's pool {n1, n2}: its own class (same members, next ordinal 2 with p0 = 0): n2.
    assert plan_rows(plan) == [
        (1, 0, 1, "COPY", "n1", "n4", "FULL", 2 * GB, "entries", None, ["n1", "n2"], "n1", 2, 2),
        (2, 0, 2, "DROP", "n2", None, None, 0, None, None, None, "n1", 2, 2),
        (3, 1, 1, "COPY", "n2", "n4", "FULL", GB, "entries", None, ["n1", "n2"], "n1", 2, 2),
        (4, 1, 2, "PROMOTE", "n1", "n4", None, 0, None, None, None, "n1", 2, 2),
        (5, 1, 3, "DROP", "n1", None, None, 0, None, None, None, "n1", 2, 2),
    ]
    assert columns(plan) == columns(planner.PLAN_SCHEMA)


def test_file_transfers_count_page_aligned_chunks(spark: SparkSession) -> None:
    ideal, assignment, map_df = join_scenario(spark)
    plan = planner.plan_migrations(ideal, assignment, map_df, no_reports(spark), history_threshold=500,
                                   full_rebalance="files", file_chunk_bytes=4 * 2**20)
    copies = {(r.partition_id, r.transfer, r.chunks) for r in plan.where("action = 'COPY'").collect()}
    # 2e9 / 4 MiB = 476.8 -> 477 chunks; 1e9 / 4 MiB = 238.4 -> 239.
    assert copies == {(0, "files", 477), (1, "files", 239)}


def test_renting_surplus_after_the_switch_is_dropped_and_nothing_else(spark: SparkSession) -> None:
    """After the LATE_AFFINITY_SWITCH the assignment is ideal, every ideal node owns, the old copy is RENTING."""
    ideal = lists_of(spark, {("g", 0): ["n4", "n2"]})
    assignment = assignment_of(spark, {("g", 0): (["n4", "n2"], False)})
    map_df = map_of(spark, [("g", 0, "n1", RT, 7, 70, GB), ("g", 0, "n2", OW, 7, 70, GB),
                            ("g", 0, "n4", OW, 7, 70, GB)])
    plan = planner.plan_migrations(ideal, assignment, map_df, no_reports(spark), history_threshold=500)
    assert plan_rows(plan) == [(1, 0, 1, "DROP", "n1", None, None, 0, None, None, None, "n4", 2, 2)]


def test_historical_copy_streams_entries_even_when_full_rebalance_uses_files(spark: SparkSession) -> None:
    """A MOVING copy at counter 900 of 1,000, the owner's WAL reaching back to 800: HISTORICAL, by entries."""
    ideal = lists_of(spark, {("g", 0): ["n1", "n2"]})
    assignment = assignment_of(spark, {("g", 0): (["n1", "n2"], False)})
    map_df = map_of(spark, [("g", 0, "n1", OW, 1000, 1000, GB), ("g", 0, "n2", MV, 900, 900, GB)])
    reports = fullmap.latest_reports(spark.createDataFrame(
        [("n1", "g", 0, OW, 1000, 1000, GB, 800, 1), ("n2", "g", 0, MV, 900, 900, GB, None, 2)], REPORT_SCHEMA
    ))
    plan = planner.plan_migrations(ideal, assignment, map_df, reports, history_threshold=500,
                                   full_rebalance="files")
    (row,) = plan.collect()
    assert (row.action, row.rebalance_mode, row.transfer, row.chunks, row.from_counter, row.to_counter) == (
        "COPY", "HISTORICAL", "entries", None, 900, 1000
    )


def test_schedule_plan_fills_waves_times_and_bound_in_one_task(spark: SparkSession) -> None:
    ideal, assignment, map_df = join_scenario(spark)
    plan = planner.plan_migrations(ideal, assignment, map_df, no_reports(spark), history_threshold=500)
    model = CostModel(max_parallel_per_node=10, overhead_s=0.1, entry_stream_bytes_per_s=GB)
    scheduled = planner.schedule_plan(plan, model, "ours")
    assert columns(scheduled) == columns(planner.SCHEDULED_PLAN_SCHEMA)
    rows = {r.migration_id: r for r in scheduled.collect()}
    # p0 copies 2 GB at 1 GB/s and p1 copies 1 GB, in parallel (n4 receives both: 2.5e9 B/s in, no NIC limit).
    assert rows[1].est_start_s == 0.0 and rows[3].est_start_s == 0.0
    assert rows[3].est_end_s == pytest.approx(1.1)
    assert rows[1].est_end_s == pytest.approx(2.1)
    assert rows[4].est_start_s == pytest.approx(1.1)  # PROMOTE right after p1's COPY
    assert rows[5].est_end_s == pytest.approx(1.3)
    assert rows[2].est_end_s == pytest.approx(2.2)
    assert [rows[i].wave for i in (1, 3, 4, 5, 2)] == [1, 1, 2, 3, 4]
    bounds = [r.plan_lower_bound_s for r in rows.values()]
    assert bounds == pytest.approx([2.2] * 5)  # p0's chain: 0.1 + 2 s + 0.1


def test_schedule_plan_of_an_empty_plan_is_empty(spark: SparkSession) -> None:
    empty = spark.createDataFrame([], planner.PLAN_SCHEMA)
    assert planner.schedule_plan(empty, CostModel()).count() == 0


# ---------------------------------------------------------------- versions and stamps


def test_group_stamp_is_mmh3_x64_128_of_big_endian_versions() -> None:
    expected = mmh3.hash64(b"\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00", seed=0, signed=True)[0]
    assert versions.group_stamp(np.array([1, 2, 0])) == expected
    # Pinned values: any refactor must reproduce them byte for byte.
    assert versions.group_stamp(np.array([1, 1, 1])) == mmh3.hash64(b"\x00\x00\x00\x01" * 3, seed=0)[0]
    assert versions.group_stamp(np.array([-1])) == mmh3.hash64(b"\xff\xff\xff\xff", seed=0)[0]


def test_partition_versions_count_changes_of_replica_set_or_primary(spark: SparkSession) -> None:
    prev_assignment = assignment_of(spark, {("g", 0): (["n1", "n2"], False), ("g", 1): (["n1", "n2"], False),
                                            ("g", 2): (["n1", "n2"], False)})
    prev_versions = spark.createDataFrame([("g", 0, 4), ("g", 1, 4), ("g", 2, 4)], versions.VERSIONS_SCHEMA)
    now = assignment_of(spark, {
        ("g", 0): (["n1", "n2"], False),  # unchanged
        ("g", 1): (["n2", "n1"], False),  # same set, new primary
        ("g", 2): (["n1", "n2", "n3"], True),  # a node added
        ("g", 3): (["n3", "n1"], False),  # new partition: 0 + 1
    })
    out = versions.partition_versions(prev_versions, prev_assignment, now)
    assert {tuple(r) for r in out.collect()} == {("g", 0, 4), ("g", 1, 5), ("g", 2, 5), ("g", 3, 1)}


def test_partition_stamps_hash_every_partition_of_the_group_missing_ones_as_zero(spark: SparkSession) -> None:
    versions_df = spark.createDataFrame([("a", 0, 1), ("a", 2, 3), ("b", 0, 2)], versions.VERSIONS_SCHEMA)
    groups = spark.createDataFrame([("a", 3), ("b", 1), ("c", 2)], "group_name string, partitions int")
    stamps = {r.group_name: r.stamp for r in versions.partition_stamps(versions_df, groups).collect()}
    assert stamps == {
        "a": mmh3.hash64(bytes([0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3]), seed=0)[0],
        "b": mmh3.hash64(bytes([0, 0, 0, 2]), seed=0)[0],
        "c": mmh3.hash64(bytes(8), seed=0)[0],
    }
