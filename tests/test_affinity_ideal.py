"""The ideal assignment Spark stage: exact rows, SPEC defaults, edge cases, and agreement with the pure client."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from rebalancer.affinity.assign import RankingMemo, assign_indexes
from rebalancer.affinity.ideal import IDEAL_ASSIGNMENT_STAGE, ideal_assignment, ideal_assignment_arrow
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.affinity.rendezvous import weight
from rebalancer.client.affinity import InvalidGroupSettingsError, assign
from rebalancer.config import AffinitySettings
from rebalancer.groups import GroupSettings
from rebalancer.tables import CACHE_GROUPS, IDEAL_ASSIGNMENT, NODES, VERSION_COLUMNS

UUID = "00000000-0000-0000-0000-00000000000{}".format


def node(node_id: str, order: int, **extra: Any) -> dict[str, Any]:
    row = {"node_id": node_id, "node_uuid": None, "node_order": order, "host": f"host-{node_id}",
           "attributes": None, "capacity": None, "is_client": False}
    row.update(extra)
    return row


def group(name: str, partitions: int, backups: int, **extra: Any) -> dict[str, Any]:
    row = {"group_name": name, "partitions": partitions, "backups": backups, "mode": None, "affinity": None,
           "exclude_neighbors": None, "backup_filter": None, "loss_policy": None, "persistent": None,
           "partitioner": None}
    row.update(extra)
    return row


def nodes_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([tuple(r[f.name] for f in NODES) for r in rows], NODES)


def groups_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([tuple(r[f.name] for f in CACHE_GROUPS) for r in rows], CACHE_GROUPS)


def expected_df(spark: SparkSession, rows: list[tuple[str, int, int, str]]) -> DataFrame:
    return spark.createDataFrame(rows, IDEAL_ASSIGNMENT_STAGE)


def test_stage_schema_is_the_ideal_assignment_table_without_version_columns() -> None:
    table = [(f.name, f.dataType) for f in IDEAL_ASSIGNMENT if f.name not in VERSION_COLUMNS]
    assert [(f.name, f.dataType) for f in IDEAL_ASSIGNMENT_STAGE] == table


def test_ignite_group_matches_java_vectors_and_skips_clients(spark: SparkSession) -> None:
    nodes = nodes_df(spark, [
        node("node0", 1, node_uuid=UUID(1)),
        node("node1", 2, node_uuid=UUID(2)),
        node("node2", 3, node_uuid=UUID(3)),
        node("thin-client", 4, node_uuid=UUID(4), is_client=True),
    ])
    groups = groups_df(spark, [group("orders", 3, 1, affinity="ignite")])
    got = ideal_assignment(nodes, groups, AffinitySettings())
    expected = expected_df(spark, [
        ("orders", 0, 0, "node2"), ("orders", 0, 1, "node1"),
        ("orders", 1, 0, "node2"), ("orders", 1, 1, "node0"),
        ("orders", 2, 0, "node0"), ("orders", 2, 1, "node1"),
    ])
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_null_mode_and_affinity_mean_partitioned_rendezvous(spark: SparkSession) -> None:
    ids = ["node0", "node1", "node2", "node3"]
    nodes = nodes_df(spark, [node(n, i) for i, n in enumerate(ids)])
    got = ideal_assignment(nodes, groups_df(spark, [group("g", 8, 1)]), AffinitySettings())
    rows = []
    for p in range(8):  # SPEC: weight descending (no ties among these weights)
        ranked = sorted(ids, key=lambda n, p=p: -weight(n, p))
        rows += [("g", p, 0, ranked[0]), ("g", p, 1, ranked[1])]
    assert_df_equality(got, expected_df(spark, rows), ignore_row_order=True, ignore_nullable=True)


def test_replicated_group_puts_every_server_on_every_partition(spark: SparkSession) -> None:
    nodes = nodes_df(spark, [node(f"n{i}", i) for i in range(5)])
    got = ideal_assignment(nodes, groups_df(spark, [group("r", 16, 0, mode="REPLICATED")]), AffinitySettings())
    counts = {(r.partition_id, r.replica_index) for r in got.collect()}
    assert counts == {(p, i) for p in range(16) for i in range(5)}


def test_no_server_nodes_gives_an_empty_result(spark: SparkSession) -> None:
    nodes = nodes_df(spark, [node("c", 1, is_client=True)])
    got = ideal_assignment(nodes, groups_df(spark, [group("g", 4, 1)]), AffinitySettings())
    assert got.schema == IDEAL_ASSIGNMENT_STAGE and got.count() == 0


def test_unsatisfiable_backup_filter_emits_only_the_replicas_it_placed(spark: SparkSession) -> None:
    # Two zones, three wanted replicas: every partition gets exactly one node per zone and no third row.
    nodes = nodes_df(spark, [node(f"n{i}", i, attributes={"zone": f"z{i % 2}"}) for i in range(4)])
    groups = groups_df(spark, [group("g", 6, 2, backup_filter=["zone"]), group("i", 6, 2, affinity="ignite",
                                                                             backup_filter=["zone"])])
    got = ideal_assignment(nodes, groups, AffinitySettings()).collect()
    assert sorted({r.replica_index for r in got}) == [0, 1]
    for name in ("g", "i"):
        for p in range(6):
            zones = sorted(int(r.node_id[1:]) % 2 for r in got if r.group_name == name and r.partition_id == p)
            assert zones == [0, 1], (name, p, zones)


def test_unknown_affinity_names_the_group(spark: SparkSession) -> None:
    nodes = nodes_df(spark, [node("a", 1)])
    with pytest.raises(InvalidGroupSettingsError, match="'bad'.*consistent-hash"):
        ideal_assignment(nodes, groups_df(spark, [group("bad", 4, 1, affinity="consistent-hash")]), AffinitySettings())


def test_batch_size_never_changes_the_result(spark: SparkSession) -> None:
    # Batches of 7 positions straddle group boundaries (5 + 9 + 3 partitions).
    nodes = nodes_df(spark, [node(f"n{i}", i, host=f"h{i % 3}") for i in range(7)])
    groups = groups_df(spark, [
        group("a", 5, 2, exclude_neighbors=True),
        group("b", 9, 1, affinity="ignite"),
        group("c", 3, 9, mode="REPLICATED"),
    ])
    small = ideal_assignment(nodes, groups, AffinitySettings(arrow_batch_rows=7))
    large = ideal_assignment(nodes, groups, AffinitySettings(arrow_batch_rows=4096))
    assert_df_equality(small, large, ignore_row_order=True)
    assert small.count() == 5 * 3 + 9 * 2 + 3 * 7


@st.composite
def cluster_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 8))
    ids = draw(st.lists(st.sampled_from(["n0", "n1", "n2", "n3", "Aa", "BB", "x", "yy", "zzz",
                                         "6f1c2a9e-9a58-4c5b-9d57-3f7a2c1e0b11"]),
                        min_size=n, max_size=n, unique=True))
    uuids = draw(st.lists(st.uuids().map(str), min_size=n, max_size=n, unique=True))
    orders = draw(st.permutations(list(range(n))))
    rows = []
    for i, node_id in enumerate(ids):
        rows.append(node(
            node_id, orders[i],
            node_uuid=uuids[i],
            host=draw(st.sampled_from(["h0", "h1", None])),
            attributes=draw(st.one_of(st.none(), st.fixed_dictionaries({"zone": st.sampled_from(["z0", "z1"])}))),
            capacity=draw(st.sampled_from([None, 1.0, 2.0])),
            is_client=draw(st.sampled_from([False, None, False, True])),
        ))
    return rows


# One Spark job per example: a third of the profile's examples keeps the file well under the time budget.
@settings(max_examples=max(3, settings.default.max_examples // 3))
@given(
    rows=cluster_rows(),
    backups=st.integers(0, 3),
    excl=st.booleans(),
    names=st.sampled_from([None, ["zone"]]),
    as_strings=st.booleans(),
)
def test_spark_stage_and_pure_client_agree(
    spark: SparkSession, rows: list[dict[str, Any]], backups: int, excl: bool, names: list[str] | None,
    as_strings: bool,
) -> None:
    configs = {
        "rdv": {"affinity": "rendezvous", "mode": "PARTITIONED"},
        "rdv-repl": {"affinity": None, "mode": "REPLICATED"},
        "ign": {"affinity": "ignite", "mode": None},
        "ign-repl": {"affinity": "ignite", "mode": "REPLICATED"},
    }
    partitions = 11
    group_rows = [group(name, partitions, backups, exclude_neighbors=excl, backup_filter=names, **cfg)
                  for name, cfg in configs.items()]
    affinity = AffinitySettings(ignite_ids_as_strings=as_strings, arrow_batch_rows=16)
    got = ideal_assignment(nodes_df(spark, rows), groups_df(spark, group_rows), affinity)
    on_driver = ideal_assignment_arrow(rows, group_rows, affinity).to_pylist()
    assert sorted(tuple(r) for r in got.collect()) == sorted(tuple(r.values()) for r in on_driver)
    spark_lists: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for r in got.collect():
        spark_lists.setdefault((r.group_name, r.partition_id), []).append((r.replica_index, r.node_id))
    for name, cfg in configs.items():
        expected = assign(rows, partitions, backups, cfg["affinity"], cfg["mode"], excl, names, as_strings)
        for p, want in enumerate(expected):
            have = [n for _, n in sorted(spark_lists.get((name, p), []))]
            assert have == want, f"group {name} partition {p}: spark {have} client {want}"


@given(
    rows=cluster_rows(),
    base=st.tuples(st.integers(0, 2), st.sampled_from(["rendezvous", "ignite"]),
                   st.sampled_from(["PARTITIONED", "REPLICATED"]), st.booleans(), st.sampled_from([(), ("zone",)])),
    order=st.randoms(use_true_random=False),
    as_strings=st.booleans(),
)
def test_a_ranking_memo_answers_every_group_as_assign_indexes_does(
    rows: list[dict[str, Any]], base: tuple[Any, ...], order: Any, as_strings: bool,
) -> None:
    """Groups whose settings place alike share one ranking (the first exchange of 256 equal groups ranks once):
    every answer is still exactly assign_indexes' for that group, whatever was asked before it, and read-only.
    Asked: a group, each of its variants that differs in one setting or in its partition ids, in any order."""
    backups, affinity, mode, excl, names = base
    g = GroupSettings(name="g", partitions=11, backups=backups, affinity=affinity, mode=mode, exclude_neighbors=excl,
                      backup_filter=names)
    variants = [g, replace(g, name="other", partitions=4), replace(g, backups=backups + 1),
                replace(g, affinity="ignite" if affinity == "rendezvous" else "rendezvous"),
                replace(g, mode="REPLICATED" if mode == "PARTITIONED" else "PARTITIONED"),
                replace(g, exclude_neighbors=not excl), replace(g, backup_filter=() if names else ("zone",))]
    asked = [(v, pids) for v in variants for pids in (np.arange(0, 6), np.arange(3, 9), np.arange(11))]
    order.shuffle(asked)
    nodes = NodeSet.from_rows([r for r in rows if not r["is_client"]])
    memo = RankingMemo(nodes, as_strings)
    for group, pids in asked:
        got = memo(pids, group)
        assert np.array_equal(got, assign_indexes(pids, nodes, group, as_strings)), (group, pids)
        assert not got.flags.writeable


@pytest.mark.parametrize("spread", [True, False])
def test_balanced_groups_are_placed_together_beside_the_others(spark: SparkSession, spread: bool) -> None:
    from rebalancer.client.affinity import GroupSettings, NodeSet, assign_balanced

    rows = [node(f"n{i}", i + 1, capacity=2.0 if i == 0 else None) for i in range(5)]
    group_rows = [group("a", 40, 1, affinity="balanced"), group("b", 40, 1, affinity="balanced"), group("r", 8, 1)]
    nodes = nodes_df(spark, rows + [node("c", 9, is_client=True)])
    groups = groups_df(spark, group_rows)
    got = ideal_assignment(nodes, groups, AffinitySettings(balanced_spread=spread))
    node_set = NodeSet.from_rows(rows)
    ids = node_set.node_ids
    matrices = assign_balanced([GroupSettings("a", 40, 1), GroupSettings("b", 40, 1)], node_set, spread=spread)
    want = [(g, p, i, ids[n]) for g, m in matrices.items() for p, row in enumerate(m) for i, n in enumerate(row)]
    want += [("r", p, i, n) for p, lst in enumerate(assign(node_set, 8, 1)) for i, n in enumerate(lst)]
    assert_df_equality(got, expected_df(spark, want), ignore_row_order=True, ignore_nullable=True)
    # the same rows on the driver, from the same functions
    on_driver = ideal_assignment_arrow(rows + [node("c", 9, is_client=True)], group_rows,
                                       AffinitySettings(balanced_spread=spread, arrow_batch_rows=3))
    assert sorted(map(tuple, (r.values() for r in on_driver.to_pylist()))) == sorted(want)
