"""Synthetic clusters: steady (every ideal replica OWNING, consistent copies) and deterministic for a seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from rebalancer.config import GenerateSettings, Settings
from rebalancer.generate import generate_cluster
from rebalancer.operations import generate_into
from rebalancer.pipeline import run_exchange
from rebalancer.storage import open_warehouse
from rebalancer.tables import INPUT_TABLES, OUTPUT_TABLES


@pytest.fixture(scope="module")
def cluster(spark: Any) -> Any:
    return generate_cluster(spark, nodes=5, groups=2, partitions=64, backups=1, seed=7)


def test_tables_have_exactly_the_spec_schemas(spark: Any, cluster: Any) -> None:
    for name, df in cluster.as_tables(spark).items():
        got = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
        assert got == [(f.name, f.dataType.simpleString()) for f in INPUT_TABLES[name].fields], name


def test_every_ideal_replica_is_one_owning_report(cluster: Any) -> None:
    reports = cluster.partition_reports
    assert reports.count() == 2 * 64 * 2
    assert reports.where(F.col("state") != "OWNING").count() == 0
    per_partition = reports.groupBy("group_name", "partition_id").agg(
        F.countDistinct("node_id").alias("copies"),
        F.countDistinct("update_counter", "size", "bytes").alias("versions"),
    )
    assert per_partition.where((F.col("copies") != 2) | (F.col("versions") != 1)).count() == 0


def test_counters_sizes_and_history_are_consistent(cluster: Any) -> None:
    bad = cluster.partition_reports.where(
        (F.col("size") < 0)
        | (F.col("update_counter") < F.col("size"))
        | (F.col("wal_history_counter") > F.col("update_counter"))
        | (F.col("bytes") != F.col("size") * 1024)
    )
    assert bad.count() == 0
    mean_bytes = cluster.partition_reports.agg(F.avg("bytes")).first()[0]
    assert 0.8 * 200 * 2**20 < mean_bytes < 1.2 * 200 * 2**20


def test_nodes_have_hosts_zones_and_join_events(spark: Any, cluster: Any) -> None:
    nodes = cluster.as_tables(spark)["nodes"].orderBy("node_order").collect()
    assert [n.node_id for n in nodes] == [f"node{i}" for i in range(5)]
    assert [n.attributes["zone"] for n in nodes] == ["zone0", "zone1", "zone2", "zone0", "zone1"]
    assert len({n.host for n in nodes}) == 5
    events = cluster.as_tables(spark)["topology_events"].orderBy("event_seq").collect()
    assert [(e.event_seq, e.event_type, e.node_id) for e in events] == [
        (i + 1, "NODE_JOINED", f"node{i}") for i in range(5)
    ]


def test_same_seed_gives_the_same_cluster_and_another_seed_does_not(spark: Any, cluster: Any) -> None:
    again = generate_cluster(spark, nodes=5, groups=2, partitions=64, backups=1, seed=7)
    def comparable(df: Any) -> Any:  # maps cannot be sorted by chispa; compare their JSON
        return df.withColumn("attributes", F.to_json("attributes")) if "attributes" in df.columns else df

    for name, df in cluster.as_tables(spark).items():
        assert_df_equality(comparable(df), comparable(again.as_tables(spark)[name]), ignore_row_order=True)
    other = generate_cluster(spark, nodes=5, groups=2, partitions=64, backups=1, seed=8)
    sizes = [r.size for r in cluster.partition_reports.orderBy("group_name", "partition_id", "node_id").collect()]
    other_sizes = [r.size for r in other.partition_reports.orderBy("group_name", "partition_id", "node_id").collect()]
    assert sizes != other_sizes


def test_hosts_group_neighbours(spark: Any) -> None:
    c = generate_cluster(spark, 6, 1, 8, 1, seed=1, settings=GenerateSettings(nodes_per_host=2, zones=2))
    hosts = [r["host"] for r in sorted(c.dimensions["nodes"].to_pylist(), key=lambda r: r["node_order"])]
    assert hosts == ["host0", "host0", "host1", "host1", "host2", "host2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1, 8, 1), "--nodes"),
        ((1, 0, 8, 1), "--groups"),
        ((1, 1, 0, 1), "--partitions"),
        ((1, 1, 8, -1), "--backups"),
    ],
)
def test_bad_sizes_are_refused(spark: Any, args: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_cluster(spark, *args, seed=0)


def test_generating_into_a_used_warehouse_replaces_its_inputs_and_empties_its_outputs(
    spark: Any, tmp_path: Path
) -> None:
    settings = Settings().with_overrides(storage={"warehouse": str(tmp_path / "w"), "engine": "auto"})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=4, groups=1, partitions=8, backups=1, seed=1)
    run_exchange(spark, wh, settings)
    assert all(wh.read(name).count() > 0 for name in ("partition_map", "exchanges", "client_affinity"))

    counts = generate_into(spark, wh, settings, nodes=3, groups=2, partitions=4, backups=0, seed=2)

    # (the counts come from one job over the written tables: each must land on its own table)
    assert counts == {"nodes": 3, "cache_groups": 2, "topology_events": 3, "partition_reports": 8}
    assert {name: wh.read(name).count() for name in counts} == counts
    assert {name: wh.read(name).count() for name in OUTPUT_TABLES} == dict.fromkeys(OUTPUT_TABLES, 0)
    assert sorted(r.node_id for r in wh.read("nodes").collect()) == ["node0", "node1", "node2"]


@pytest.mark.parametrize("seed", [4, 2**31 + 5])  # an int literal in Spark's hash, and a bigint one
def test_a_cluster_built_on_the_driver_has_the_rows_spark_builds(spark: Any, tmp_path: Path, seed: int) -> None:
    """Up to the warehouse's ``driver_replicas`` the reports are built with NumPy and everything is written from the
    driver; beyond, Spark builds and writes the frames: the same rows either way, and the same counts."""
    written = {}
    for name, on_driver in (("driver", "auto"), ("spark", 0)):
        settings = Settings().with_overrides(storage={"warehouse": str(tmp_path / name), "engine": "auto",
                                                      "driver_replicas": on_driver})
        wh = open_warehouse(spark, settings.storage)
        counts = generate_into(spark, wh, settings, nodes=6, groups=2, partitions=32, backups=2, seed=seed)
        assert counts == {"nodes": 6, "cache_groups": 2, "topology_events": 6, "partition_reports": 192}
        written[name] = {table: sorted(map(repr, wh.read_arrow(table).to_pylist())) for table in INPUT_TABLES}
    assert written["driver"] == written["spark"]


def test_spark_s_xxhash64_is_reproduced_bit_for_bit(spark: Any) -> None:
    """What the driver builds sizes from: literals of every kind and length (an int, a bigint, strings of 0 to 70
    UTF-8 bytes, across XXH64's 32-byte stripes) and an int column, against Spark's own xxhash64."""
    import random

    import numpy as np

    from rebalancer.hashing import spark_xxhash64, spark_xxhash64_ints

    rng = random.Random(3)
    rows = [(rng.choice([0, 7, -5, 2**31 - 1, 2**31, 2**40 + 3, -(2**45)]),
             "".join(rng.choice("abz09é-") for _ in range(rng.randint(0, 70))), rng.randint(0, 2**31 - 1))
            for _ in range(400)]
    df = spark.createDataFrame(rows, "seed long, text string, p int")
    got = df.select(F.xxhash64("text").alias("text_only"), F.xxhash64("text", "p").alias("with_p")).collect()
    assert [g.text_only for g in got] == [spark_xxhash64([t]) for _, t, _ in rows]
    chained = spark_xxhash64_ints([p for _, _, p in rows], [spark_xxhash64([t]) for _, t, _ in rows])
    assert np.array_equal(chained, np.array([g.with_p for g in got], np.int64))
    literals = spark.range(1).select(*(F.xxhash64(F.lit(s), F.lit(t), F.lit(p)) for s, t, p in rows[:40])).first()
    assert list(literals) == [spark_xxhash64([s, t, p]) for s, t, p in rows[:40]]


def test_validating_a_generated_warehouse_finds_nothing_and_a_bad_report_is_still_rejected(
        spark: Any, tmp_path: Path) -> None:
    """The driver's verdicts clear a valid warehouse without Spark's validator; one bad row sends it to Spark, which
    rejects that row with its reason."""
    import json

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from rebalancer.operations import validate_warehouse
    from rebalancer.tables import PARTITION_REPORTS

    settings = Settings().with_overrides(storage={"warehouse": str(tmp_path / "w"), "engine": "auto"})
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=3, groups=1, partitions=8, backups=1, seed=5)
    assert validate_warehouse(wh) == 0 and wh.read("rejected_rows").count() == 0
    bad = pa.Table.from_pylist([{"node_id": "node0", "group_name": "group0", "partition_id": 0, "state": "OWNING",
                                 "update_counter": 5, "size": -1, "bytes": 10, "wal_history_counter": 1,
                                 "report_seq": 9}], schema=to_arrow_schema(PARTITION_REPORTS, timezone="UTC"))
    wh.append_arrow("partition_reports", bad)
    assert validate_warehouse(wh) == 1
    rejected = wh.read("rejected_rows").collect()
    assert [(r.table_name, json.loads(r.row_json)["size"]) for r in rejected] == [("partition_reports", -1)]
