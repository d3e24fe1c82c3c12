"""Storage: real Delta tables on disk, written and read through the delta-rs engine with the suite's Spark session.

The delta-spark engine cannot run here (no Delta jars), so it is covered by engine detection, its clear failure,
and its pure helpers (SQL text is checked by running it through Spark).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from rebalancer import tables
from rebalancer.config import AUTO_ENGINE, EngineSetting, StorageSettings
from rebalancer.session import wants_delta_jars
from rebalancer.storage import (
    ENGINES,
    ConcurrentWriteError,
    DuplicateKeyError,
    EngineUnavailableError,
    InvalidArgumentError,
    SchemaMismatchError,
    TableNotFoundError,
    UnknownTableError,
    VersionNotFoundError,
    Warehouse,
    WhereMismatchError,
    WhereValue,
    open_warehouse,
    resolve_engine,
)
from rebalancer.storage import engine as engine_module
from rebalancer.storage.base import (
    CLUSTER_DRIVER_REPLICAS,
    DRIVER_BYTES_PER_REPLICA,
    machine_memory_bytes,
    replicas_on_driver,
)
from rebalancer.storage.commits import retry_on_conflict
from rebalancer.storage.delta_log import local_directory
from rebalancer.storage.delta_spark import (
    SMALL_SESSION_ROWS,
    DeltaSparkWarehouse,
    is_delta_conflict,
    table_reference,
    view_sql,
    warehouse_uri,
)
from rebalancer.storage.driver_reader import file_may_match
from rebalancer.storage.engine import delta_classes_available, engine_reason, probe_delta_format
from rebalancer.storage.schemas import can_store
from rebalancer.storage.sql import merge_condition, sql_literal, where_sql
from tests.conftest import TEST_API_MODE, TEST_DRIVER_READER, TEST_ENGINE, TEST_STORAGE, delta_rs_only

UTC = dt.UTC
needs_driver_reader = pytest.mark.skipif(
    not TEST_DRIVER_READER, reason="needs the driver reader (this run has storage.driver_reader = false)"
)
without_delta_jars = pytest.mark.skipif(
    TEST_ENGINE != "delta-rs", reason="needs a session without the Delta jars (this run's session carries them)"
)
TOPOLOGY_KEYS = ["topology_major", "topology_minor", "node_id"]


# ---------------------------------------------------------------- helpers


def _open(spark: SparkSession, root: Path, retries: int = 5, **storage: bool) -> Warehouse:
    """The suite's engine (tests/conftest.py: delta-rs, or delta-spark under REBALANCER_TEST_ENGINE), with the
    suite's storage settings unless ``storage`` overrides them."""
    wh = open_warehouse(spark, StorageSettings(engine="auto", commit_retries=retries,
                                               **{**TEST_STORAGE, **storage}), root)
    assert wh.engine == TEST_ENGINE
    return wh


@pytest.fixture()
def wh(spark: SparkSession, warehouse_dir: Path) -> Warehouse:
    warehouse = _open(spark, warehouse_dir)
    warehouse.create_tables()
    return warehouse


def _topology(spark: SparkSession, major: int, nodes: list[str], minor: int = 0, client: bool = False) -> DataFrame:
    rows = [(major, minor, n, i, client) for i, n in enumerate(nodes)]
    return spark.createDataFrame(rows, tables.TOPOLOGY)


def _lost(spark: SparkSession, major: int, partitions: list[int]) -> DataFrame:
    rows = [(major, 0, "g", p, "READ_ONLY_SAFE", True, False) for p in partitions]
    return spark.createDataFrame(rows, tables.LOST_PARTITIONS)


def _sample(dtype: DataType, i: int) -> Any:
    """A value of ``dtype`` for row ``i``; row 2 is all nulls. Values probe edges (negatives, > 2^31, unicode)."""
    if i == 2:
        return None
    if isinstance(dtype, StringType):
        return f"s{i}-é'\\"
    if isinstance(dtype, IntegerType):
        return -7 if i == 0 else 2**31 - 1
    if isinstance(dtype, LongType):
        return -(2**40) if i == 0 else 2**62 + i
    if isinstance(dtype, DoubleType):
        return 0.25 if i == 0 else -1e300
    if isinstance(dtype, BooleanType):
        return i == 0
    if isinstance(dtype, TimestampType):
        return dt.datetime(2026, 1, 1, 12, 30, 15, 123456, tzinfo=UTC) + dt.timedelta(days=i)
    if isinstance(dtype, ArrayType):
        return [_sample(dtype.elementType, 0), None, _sample(dtype.elementType, 1)] if i == 0 else []
    if isinstance(dtype, MapType):
        return {"zone": _sample(dtype.valueType, 0), "rack": None} if i == 0 else {}
    raise AssertionError(f"no sample for {dtype}")


def _rows_for(schema: StructType) -> list[tuple[Any, ...]]:
    return [tuple(_sample(f.dataType, i) for f in schema.fields) for i in range(3)]


def _first(df: DataFrame) -> Row:
    row = df.first()
    assert row is not None, "expected at least one row"
    return row


def _rb_dirs(path: str) -> set[str]:
    return {d for d in os.listdir(path) if d.startswith("rb-")}


def _log_actions(path: str) -> list[dict[str, Any]]:
    actions: list[dict[str, Any]] = []
    for log_file in sorted(glob.glob(os.path.join(path, "_delta_log", "*.json"))):
        with open(log_file) as handle:
            actions.extend(json.loads(line) for line in handle if line.strip())
    return actions


def _referenced_dirs(path: str) -> set[str]:
    """Every staging directory any commit ever added a file from."""
    return {a["add"]["path"].split("/")[0] for a in _log_actions(path) if "add" in a}


# ---------------------------------------------------------------- engine choice


@without_delta_jars
def test_auto_engine_is_delta_rs_when_delta_jars_are_absent(spark: SparkSession, warehouse_dir: Path) -> None:
    assert not delta_classes_available(spark)
    assert resolve_engine(spark, StorageSettings()) == "delta-rs"
    wh = open_warehouse(spark, StorageSettings(), warehouse_dir)
    assert wh.engine == "delta-rs"
    assert wh.location == str(warehouse_dir.resolve())


def test_every_engine_the_settings_accept_has_one_registered_opener() -> None:
    assert list(ENGINES) == ["delta-rs", "delta-spark"]
    assert {*ENGINES, AUTO_ENGINE} == set(get_args(EngineSetting))


def test_sessions_rebalancer_builds_carry_delta_for_auto_and_the_cli_says_why_an_engine_was_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # auto (the default) and delta-spark get the fetched jars, so auto runs on delta-spark wherever they were fetched
    assert wants_delta_jars(StorageSettings()) and wants_delta_jars(StorageSettings(engine="delta-spark"))
    assert not wants_delta_jars(StorageSettings(engine="delta-rs"))
    assert engine_reason(StorageSettings(engine="delta-rs"), "delta-rs") == "storage.engine = 'delta-rs'"
    assert engine_reason(StorageSettings(), "delta-spark") == (
        "storage.engine = 'auto' and the Delta jars are in the Spark session"
    )
    monkeypatch.setattr(engine_module, "jars", lambda: [])
    assert engine_reason(StorageSettings(), "delta-rs") == (
        "storage.engine = 'auto' and the Delta jars are not in the Spark session (none were fetched here: "
        "`python -m rebalancer.delta_jars` fetches them)"
    )


def test_the_driver_holds_what_a_local_machine_s_memory_allows_and_a_cluster_s_driver_five_million() -> None:
    gib = 1 << 30
    # 24 GiB, a 4g heap and the 1 GiB left to the system: 19 GiB at 1,600 bytes a replica
    assert replicas_on_driver("local[*]", "4g", 24 * gib) == 19 * gib // DRIVER_BYTES_PER_REPLICA == 12_750_684
    assert replicas_on_driver("local", "4096m", 24 * gib) == replicas_on_driver("local[2]", "4g", 24 * gib)
    assert replicas_on_driver("local[4,2]", "4G", 16 * gib) == 11 * gib // DRIVER_BYTES_PER_REPLICA
    assert replicas_on_driver(" local[*] ", "1g", 2 * gib) == 0  # no memory left: every exchange in Spark
    assert replicas_on_driver("local[*]", "not a size", 3 * gib) == gib // DRIVER_BYTES_PER_REPLICA  # Spark's 1g
    for cluster in ("local-cluster[2,1,2048]", "spark://host:7077", "yarn", "k8s://https://api:443", ""):
        assert replicas_on_driver(cluster, "64g", 512 * gib) == CLUSTER_DRIVER_REPLICAS
    assert 0 < machine_memory_bytes() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_the_driver_replicas_setting_reaches_the_warehouse(spark: SparkSession, warehouse_dir: Path) -> None:
    assert open_warehouse(spark, StorageSettings(driver_replicas=7), warehouse_dir).driver_replicas == 7
    auto = open_warehouse(spark, StorageSettings(), warehouse_dir).driver_replicas
    master, memory = spark.conf.get("spark.master"), spark.conf.get("spark.driver.memory", "1g")
    assert auto == replicas_on_driver(str(master), str(memory), machine_memory_bytes())


@without_delta_jars
def test_connect_style_probe_reports_the_missing_delta_source(spark: SparkSession) -> None:
    assert probe_delta_format(spark) is False


@without_delta_jars
def test_explicit_delta_spark_without_jars_says_how_to_add_them(spark: SparkSession) -> None:
    with pytest.raises(EngineUnavailableError) as info:
        open_warehouse(spark, StorageSettings(engine="delta-spark"))
    message = str(info.value)
    assert "spark-submit --packages io.delta:delta-spark_2.13:4.4.0" in message
    assert "python -m rebalancer.delta_jars" in message
    assert "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension" in message
    assert "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog" in message


@without_delta_jars
@pytest.mark.parametrize("engine", ["auto", "delta-rs"])
def test_catalog_prefix_requires_delta_spark(spark: SparkSession, engine: str) -> None:
    with pytest.raises(EngineUnavailableError, match="catalog_prefix = 'main.rebalancer'"):
        open_warehouse(spark, StorageSettings(engine=engine, catalog_prefix="main.rebalancer"))  # type: ignore[arg-type]


# ---------------------------------------------------------------- creation, schemas, protocol


def test_create_tables_gives_every_declared_schema_to_spark_and_deltalake(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    wh = _open(spark, warehouse_dir)
    assert wh.create_tables(["nodes"]) == ["nodes"]
    created = wh.create_tables()
    assert sorted(created) == sorted(set(tables.SCHEMAS) - {"nodes"})
    assert wh.create_tables() == []  # idempotent
    for name, schema in tables.SCHEMAS.items():
        assert wh.exists(name)
        stored = StructType.fromJson(json.loads(DeltaTable(wh.path_of(name)).schema().to_json()))
        assert stored == schema, name
        assert wh.read(name).schema == schema, name
        assert DeltaTable(wh.path_of(name)).file_uris() == []
        assert wh.table_version(name) == 0
    assert wh.read("client_affinity").count() == 0


ROUND_TRIP_TABLES = ("nodes", "cache_groups", "topology_events", "exchanges")


def test_round_trip_tables_cover_every_column_type_of_the_contract() -> None:
    used = {f.dataType.simpleString() for schema in tables.SCHEMAS.values() for f in schema.fields}
    covered = {f.dataType.simpleString() for name in ROUND_TRIP_TABLES for f in tables.SCHEMAS[name].fields}
    assert used <= covered


@pytest.mark.parametrize("name", ROUND_TRIP_TABLES)
def test_round_trip_of_every_column_type(spark: SparkSession, wh: Warehouse, name: str) -> None:
    schema = tables.SCHEMAS[name]
    expected = spark.createDataFrame(_rows_for(schema), schema)  # edge values, empty containers, an all-null row
    wh.append(name, expected)
    actual = wh.read(name)
    assert actual.schema == schema
    # chispa cannot sort rows holding maps, so compare the collected rows order-free.
    assert sorted(map(repr, actual.collect())) == sorted(map(repr, expected.collect()))
    # Another reader (pyarrow over the committed files, as FIELD-NOTES recommends) sees the same rows.
    assert pads.dataset(DeltaTable(wh.path_of(name)).file_uris(), format="parquet").count_rows() == 3


def test_timestamps_are_stored_as_utc_instants(spark: SparkSession, wh: Warehouse) -> None:
    instant = dt.datetime(2026, 3, 29, 1, 30, 0, 7, tzinfo=UTC)
    events = spark.createDataFrame([(1, "NODE_JOINED", "n1", None, instant)], tables.TOPOLOGY_EVENTS)
    wh.append("topology_events", events)
    files = DeltaTable(wh.path_of("topology_events")).file_uris()
    column = pads.dataset(files, format="parquet").to_table(columns=["event_time"]).column("event_time")
    assert column.type == pa.timestamp("us", tz="UTC")
    assert column.to_pylist() == [instant]
    assert _first(wh.read("topology_events"))["event_time"].replace(tzinfo=UTC) == instant


@delta_rs_only
def test_timestamps_are_int64_micros_even_when_the_session_writes_int96(
    spark: SparkSession, wh: Warehouse
) -> None:
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key) or "TIMESTAMP_MICROS"
    spark.conf.set(key, "INT96")  # Spark's default, as in a session rebalancer did not build
    try:
        wh.append(
            "topology_events", spark.createDataFrame([(1, "NODE_JOINED", "n1", None, None)], tables.TOPOLOGY_EVENTS)
        )
    finally:
        spark.conf.set(key, previous)
    (path,) = DeltaTable(wh.path_of("topology_events")).file_uris()
    assert pq.read_metadata(path).schema.column(4).physical_type == "INT64"


def test_a_session_writing_int96_reads_back_the_same_instants_on_every_path(
    spark: SparkSession, wh: Warehouse
) -> None:
    """A session rebalancer did not build (a notebook's, a cluster's) writes Spark's default INT96 timestamps: on
    delta-spark they stay INT96 in the files, and Spark's reads, the driver's Arrow reads and the change feed all
    give the instant that was written, as microseconds in UTC."""
    instant = dt.datetime(2026, 3, 29, 1, 30, 0, 7, tzinfo=UTC)
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key) or "TIMESTAMP_MICROS"
    spark.conf.set(key, "INT96")
    try:
        wh.append("topology_events",
                  spark.createDataFrame([(1, "NODE_JOINED", "n1", None, instant)], tables.TOPOLOGY_EVENTS))
    finally:
        spark.conf.set(key, previous)
    (path,) = DeltaTable(wh.path_of("topology_events")).file_uris()
    assert pq.read_metadata(path).schema.column(4).physical_type == ("INT96" if wh.engine == "delta-spark" else "INT64")
    assert _first(wh.read("topology_events"))["event_time"].replace(tzinfo=UTC) == instant
    arrow = wh.read_arrow("topology_events").column("event_time")
    assert arrow.type == pa.timestamp("us", tz="UTC")
    assert arrow.to_pylist() == [instant]
    changed = wh.changes("topology_events", None).rows
    assert [r["event_time"].replace(tzinfo=UTC) for r in changed.collect()] == [instant]


def test_protocol_stays_reader_1_writer_2_without_deletion_vectors(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    wh.replace_where("topology", _topology(spark, 1, ["a"]), {"topology_major": 1})
    wh.merge("topology", _topology(spark, 1, ["a", "c"], client=True), TOPOLOGY_KEYS)
    for name in tables.SCHEMAS:
        path = wh.path_of(name)
        protocol = DeltaTable(path).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features
        actions = _log_actions(path)
        assert [a["protocol"] for a in actions if "protocol" in a] == [{"minReaderVersion": 1, "minWriterVersion": 2}]
        assert not any(a["add"].get("deletionVector") for a in actions if "add" in a)
        (metadata,) = [a["metaData"] for a in actions if "metaData" in a]  # no write changed the metadata
        assert metadata["configuration"] == {"delta.enableDeletionVectors": "false"}


# ---------------------------------------------------------------- reads


def test_empty_table_reads_as_empty_dataframe_with_schema(wh: Warehouse) -> None:
    df = wh.read("partition_map", version=0)
    assert df.schema == tables.PARTITION_MAP
    assert df.collect() == []
    assert wh.read_raw("partition_map").schema == tables.PARTITION_MAP


def test_time_travel_reads_an_old_version_after_later_writes(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    version = wh.table_version("topology")
    wh.replace_where("topology", _topology(spark, 1, ["c"]), {"topology_major": 1})
    wh.append("topology", _topology(spark, 2, ["d"]))
    assert wh.table_version("topology") == version + 2
    assert sorted(r.node_id for r in wh.read("topology", version=version).collect()) == ["a", "b"]
    assert sorted(r.node_id for r in wh.read("topology").collect()) == ["c", "d"]
    assert wh.read("topology", version=0).count() == 0
    with pytest.raises(VersionNotFoundError, match="no version 99; its latest version is 3"):
        wh.read("topology", version=99)


def test_read_raw_keeps_what_other_writers_stored_and_read_fits_it_to_the_contract(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    wh = _open(spark, warehouse_dir)
    # Written by someone else with delta-rs: an extra column, and partitions as smallint (narrower than int).
    foreign = pa.table(
        {
            "group_name": ["g1"],
            "partitions": pa.array([1024], pa.int16()),
            "backups": pa.array([1], pa.int32()),
            "backup_filter": pa.array([["zone"]], pa.list_(pa.string())),
            "owner_team": ["storage"],
        }
    )
    write_deltalake(wh.path_of("cache_groups"), foreign)
    raw = wh.read_raw("cache_groups")
    assert raw.schema["owner_team"].dataType == StringType()
    assert raw.schema["partitions"].dataType == ShortType()
    with pytest.raises(SchemaMismatchError, match="column mode is missing.*read_raw"):
        wh.read("cache_groups")  # declared columns the writer left out are a contract violation
    # Our writes keep the stored types: an int into the stored smallint would narrow, so it is refused.
    ours = spark.createDataFrame([("g2", 8, 0, None, None, None, [], None, None, None)], tables.CACHE_GROUPS)
    with pytest.raises(SchemaMismatchError, match="column partitions is int but the table stores smallint"):
        wh.append("cache_groups", ours)

    # A table with every declared column (node_order narrower) plus an extra one reads as declared.
    nodes = pa.table(
        {
            "node_id": ["n1"],
            "node_uuid": pa.array([None], pa.string()),
            "node_order": pa.array([3], pa.int32()),
            "host": ["h1"],
            "attributes": pa.array([[("zone", "z1")]], pa.map_(pa.string(), pa.string())),
            "capacity": [2.0],
            "is_client": [False],
            "owner_team": ["storage"],
        }
    )
    write_deltalake(wh.path_of("nodes"), nodes)
    declared = wh.read("nodes")
    assert declared.schema == tables.NODES
    assert _first(declared).asDict() == {
        "node_id": "n1",
        "node_uuid": None,
        "node_order": 3,
        "host": "h1",
        "attributes": {"zone": "z1"},
        "capacity": 2.0,
        "is_client": False,
    }
    # The extra column is filled with nulls by our writes.
    wh.append("nodes", wh.read_raw("nodes").drop("owner_team").withColumn("node_id", F.lit("n2")))
    assert sorted((r.node_id, r.owner_team) for r in wh.read_raw("nodes").collect()) == [
        ("n1", "storage"),
        ("n2", None),
    ]


def test_missing_and_unknown_tables_fail_clearly(spark: SparkSession, warehouse_dir: Path) -> None:
    wh = _open(spark, warehouse_dir)
    with pytest.raises(TableNotFoundError, match="table topology does not exist.*create_tables"):
        wh.read("topology")
    with pytest.raises(UnknownTableError, match="'topologies' is not a rebalancer table"):
        wh.create_tables(["topologies"])
    with pytest.raises(UnknownTableError, match="not a valid table name"):
        wh.path_of("../etc")
    assert not wh.exists("topology")


# ---------------------------------------------------------------- writes


def test_append_of_nothing_commits_nothing(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, []))
    assert wh.table_version("topology") == 0
    assert _rb_dirs(wh.path_of("topology")) == set()


@delta_rs_only
def test_writes_record_row_counts_and_integer_bounds(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 7, ["a", "b", "c"], minor=2).coalesce(1))
    (add,) = [a["add"] for a in _log_actions(wh.path_of("topology")) if "add" in a]
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"topology_major": 7, "topology_minor": 2, "node_order": 0}
    assert stats["maxValues"] == {"topology_major": 7, "topology_minor": 2, "node_order": 2}
    assert stats["nullCount"]["node_id"] == 0
    assert add["size"] == os.path.getsize(os.path.join(wh.path_of("topology"), add["path"]))


@delta_rs_only
def test_replace_where_twice_leaves_no_duplicates_in_one_commit_each(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a", "b"]).union(_topology(spark, 2, ["a", "b", "c"])).coalesce(1))
    before = wh.table_version("topology")
    for _ in range(2):
        wh.replace_where("topology", _topology(spark, 2, ["x", "y"]), {"topology_major": 2, "topology_minor": 0})
    assert wh.table_version("topology") == before + 2  # one atomic commit per call
    expected = _topology(spark, 1, ["a", "b"]).union(_topology(spark, 2, ["x", "y"]))
    assert_df_equality(wh.read("topology"), expected, ignore_row_order=True, ignore_nullable=True)
    # The first call re-wrote the mixed file (removing it and adding version 1's rows back) in the same commit.
    last = [a for a in _log_actions(wh.path_of("topology")) if "add" in a or "remove" in a][-3:]
    assert sum("remove" in a for a in last) == 1


@delta_rs_only
def test_replace_where_skips_files_whose_statistics_exclude_the_version(
    spark: SparkSession, wh: Warehouse
) -> None:
    wh.append("topology", _topology(spark, 1, ["a"]))
    wh.replace_where("topology", _topology(spark, 2, ["b"]), {"topology_major": 2})
    commit = json.loads(
        Path(wh.path_of("topology"), "_delta_log", f"{wh.table_version('topology'):020d}.json")
        .read_text()
        .split("\n")[0]
    )
    assert commit["commitInfo"]["rebalancerOperation"] == "replace_where `topology_major` = 2"
    assert not [a for a in _log_actions(wh.path_of("topology")) if "remove" in a]
    assert file_may_match({"min.topology_major": 1, "max.topology_major": 1}, {"topology_major": 2}) is False
    assert file_may_match({"min.topology_major": None}, {"topology_major": 2}) is True


def test_replace_where_with_empty_where_replaces_everything(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    wh.replace_where("topology", _topology(spark, 3, ["z"]), {})
    assert [r.node_id for r in wh.read("topology").collect()] == ["z"]


def test_replace_where_arrow_of_no_rows_empties_the_version_and_commits_nothing_where_it_held_none(
    spark: SparkSession, wh: Warehouse
) -> None:
    """An exchange's conflicts and losses are mostly empty: writing no rows removes what a version held (a crashed
    run's rows) and keeps the others; where the version held nothing, delta-spark makes no commit (Delta's two
    Spark jobs would add and remove nothing), and a where naming no column still fails."""
    wh.append("topology", _topology(spark, 1, ["a"]).union(_topology(spark, 2, ["b"])))
    nothing = pa.Table.from_pylist([], schema=to_arrow_schema(tables.TOPOLOGY))
    wh.replace_where_arrow("topology", nothing, {"topology_major": 2, "topology_minor": 0})
    assert [(r.topology_major, r.node_id) for r in wh.read("topology").collect()] == [(1, "a")]
    before = wh.table_version("topology")
    wh.replace_where_arrow("topology", nothing, {"topology_major": 3, "topology_minor": 0})
    assert [(r.topology_major, r.node_id) for r in wh.read("topology").collect()] == [(1, "a")]
    if TEST_ENGINE == "delta-spark":
        assert wh.table_version("topology") == before
    with pytest.raises(InvalidArgumentError, match="no_such_column"):
        wh.replace_where_arrow("topology", nothing, {"no_such_column": 3})


def test_insert_absent_inserts_only_new_keys_once_and_refuses_duplicate_keys(wh: Warehouse) -> None:
    def rows(*nodes: str) -> pa.Table:
        return pa.Table.from_pylist(
            [{"topology_major": 1, "topology_minor": 0, "node_id": n, "node_order": i, "is_client": False}
             for i, n in enumerate(nodes)], schema=to_arrow_schema(tables.TOPOLOGY))

    wh.insert_absent_arrow("topology", rows("a", "b"), TOPOLOGY_KEYS)
    version = wh.table_version("topology")
    wh.insert_absent_arrow("topology", rows("a", "b"), TOPOLOGY_KEYS)  # every key present: nothing is committed
    assert wh.table_version("topology") == version
    wh.insert_absent_arrow("topology", rows("b", "c"), TOPOLOGY_KEYS)
    assert sorted((r.node_id, r.node_order) for r in wh.read("topology").collect()) == [("a", 0), ("b", 1), ("c", 1)]
    with pytest.raises(DuplicateKeyError, match="2 rows for key"):
        wh.insert_absent_arrow("topology", rows("d", "d"), TOPOLOGY_KEYS)
    assert wh.table_version("topology") == version + 1


def test_replace_where_refuses_rows_outside_its_where(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a"]))
    with pytest.raises(WhereMismatchError, match="rows outside `topology_major` = 2"):
        wh.replace_where("topology", _topology(spark, 3, ["x"]), {"topology_major": 2})
    with pytest.raises(InvalidArgumentError, match="does not have: version"):
        wh.replace_where("topology", _topology(spark, 3, ["x"]), {"version": 3})
    with pytest.raises(InvalidArgumentError, match="node_id is string but the value 3 is a int"):
        wh.replace_where("topology", _topology(spark, 3, ["x"]), {"node_id": 3})
    assert wh.table_version("topology") == 1
    if TEST_ENGINE == "delta-rs":  # delta-spark leaves a refused write's files to VACUUM, as Delta does
        assert _rb_dirs(wh.path_of("topology")) == _referenced_dirs(wh.path_of("topology"))


def test_merge_upserts_on_keys(spark: SparkSession, wh: Warehouse) -> None:
    wh.append("topology", _topology(spark, 1, ["a", "b"]).union(_topology(spark, 2, ["a"])))
    update = spark.createDataFrame([(1, 0, "b", 9, True), (1, 0, "c", 10, False)], tables.TOPOLOGY)
    wh.merge("topology", update, TOPOLOGY_KEYS)
    expected = spark.createDataFrame(
        [(1, 0, "a", 0, False), (1, 0, "b", 9, True), (1, 0, "c", 10, False), (2, 0, "a", 0, False)], tables.TOPOLOGY
    )
    assert_df_equality(wh.read("topology"), expected, ignore_row_order=True, ignore_nullable=True)
    # insert_only keeps existing keys untouched and adds the absent ones.
    again = spark.createDataFrame([(1, 0, "b", 99, False), (3, 0, "d", 1, False)], tables.TOPOLOGY)
    wh.merge("topology", again, TOPOLOGY_KEYS, insert_only=True)
    rows = {(r.topology_major, r.node_id): r.node_order for r in wh.read("topology").collect()}
    assert rows == {(1, "a"): 0, (1, "b"): 9, (1, "c"): 10, (2, "a"): 0, (3, "d"): 1}


def test_merge_refuses_a_source_with_duplicate_keys(spark: SparkSession, wh: Warehouse) -> None:
    twice = spark.createDataFrame([(1, 0, "a", 1, False), (1, 0, "a", 2, False)], tables.TOPOLOGY)
    with pytest.raises(DuplicateKeyError, match="2 rows for key"):
        wh.merge("topology", twice, TOPOLOGY_KEYS)
    with pytest.raises(InvalidArgumentError, match="needs at least one key"):
        wh.merge("topology", twice, [])
    assert wh.table_version("topology") == 0
    assert _rb_dirs(wh.path_of("topology")) == set()


@pytest.mark.parametrize(
    ("value", "arrived"),
    [(7.9, "double"), ("7", "string"), (2**40, "bigint")],
    ids=["double-would-truncate", "numeric-string", "bigint-would-overflow"],
)
def test_a_bad_type_into_an_int_column_fails_loudly(
    spark: SparkSession, wh: Warehouse, value: Any, arrived: str
) -> None:
    df = spark.createDataFrame(_rows_for(tables.CACHE_GROUPS)[:1], tables.CACHE_GROUPS).withColumn(
        "partitions", F.lit(value)
    )
    with pytest.raises(SchemaMismatchError, match=f"column partitions is {arrived} but the table stores int"):
        wh.append("cache_groups", df)
    assert wh.table_version("cache_groups") == 0
    assert _rb_dirs(wh.path_of("cache_groups")) == set()


def test_lossless_widening_and_extra_columns_are_accepted(spark: SparkSession, wh: Warehouse) -> None:
    df = spark.createDataFrame(
        [(1, 0, "a", 5, False)],
        "topology_major int, topology_minor int, node_id string, node_order int, is_client boolean",
    ).withColumn("scratch", F.lit("dropped"))
    wh.append("topology", df.withColumn("is_client", F.lit(None)))  # untyped null into boolean
    row = _first(wh.read_raw("topology"))
    assert row.asDict() == {
        "topology_major": 1,
        "topology_minor": 0,
        "node_id": "a",
        "node_order": 5,
        "is_client": None,
    }
    with pytest.raises(SchemaMismatchError, match="column node_id \\(string\\) is missing"):
        wh.append("topology", df.drop("node_id"))


# ---------------------------------------------------------------- views


def test_views_follow_every_write_of_the_warehouse(spark: SparkSession, wh: Warehouse) -> None:
    wh.register_views()
    assert _first(spark.sql("SELECT count(*) AS n FROM partition_map"))["n"] == 0
    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    assert _first(spark.sql("SELECT count(*) AS n FROM topology"))["n"] == 2
    wh.replace_where("topology", _topology(spark, 1, ["c"]), {"topology_major": 1})
    assert [r.node_id for r in spark.sql("SELECT node_id FROM topology").collect()] == ["c"]
    wh.merge("topology", _topology(spark, 1, ["d"]), TOPOLOGY_KEYS)
    assert _first(spark.sql("SELECT count(*) AS n FROM topology WHERE topology_major = 1"))["n"] == 2
    with pytest.raises(TableNotFoundError):
        _open(spark, Path(wh.location).parent / "empty").register_views(["topology"])


# ---------------------------------------------------------------- concurrency


def _race_on_first_commits(wh: Warehouse, rival: Warehouse, times: int, monkeypatch: Any) -> list[int]:
    """Make a real rival writer commit a conflicting rewrite just before each of ``wh``'s first ``times`` commits."""
    calls: list[int] = []
    real_commit: Callable[..., None] = wh._commit

    def racing_commit(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) <= times:
            rows = _topology(rival.spark, 1, [f"rival{len(calls)}"])
            rival.replace_where("topology", rows, {"topology_major": 1})
        real_commit(*args, **kwargs)

    monkeypatch.setattr(wh, "_commit", racing_commit)
    return calls


@delta_rs_only
def test_a_lost_commit_race_is_replanned_and_retried(
    spark: SparkSession, warehouse_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh, rival = _open(spark, warehouse_dir), _open(spark, warehouse_dir)
    wh.create_tables(["topology"])
    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    calls = _race_on_first_commits(wh, rival, times=1, monkeypatch=monkeypatch)
    wh.replace_where("topology", _topology(spark, 1, ["mine"]), {"topology_major": 1})
    assert len(calls) == 2  # lost once to the rival, then re-planned against the rival's version and committed
    assert [r.node_id for r in wh.read("topology").collect()] == ["mine"]
    operations = [h.get("rebalancerOperation") for h in DeltaTable(wh.path_of("topology")).history()]
    assert operations[:2] == ["replace_where `topology_major` = 1"] * 2  # the rival's commit, then ours


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's guarded rewrites")
@needs_driver_reader
def test_delta_spark_never_loses_or_doubles_a_rewrite_a_rival_overtakes(
    spark: SparkSession, warehouse_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new version is written as a guarded append (docs/STORAGE.md). Here a rival rewrites the same version
    # between our look at the table and Delta's own snapshot: Delta skips our write (same transaction version),
    # which must be noticed and re-planned as a replace, never left silently unwritten nor appended twice.
    wh, rival = _open(spark, warehouse_dir), _open(spark, warehouse_dir)
    wh.create_tables(["topology"])
    wh.append("topology", _topology(spark, 1, ["old"]))
    real_save, saves = wh._save, []  # type: ignore[attr-defined]

    def overtaken_save(*args: Any, **kwargs: Any) -> None:
        saves.append(args[2])  # the save mode: append (fresh version) or overwrite (replaceWhere)
        if len(saves) == 1:
            rival.replace_where("topology", _topology(spark, 2, ["rival"]), {"topology_major": 2})
        real_save(*args, **kwargs)

    monkeypatch.setattr(wh, "_save", overtaken_save)
    wh.replace_where("topology", _topology(spark, 2, ["mine"]), {"topology_major": 2})
    assert saves == ["append", "overwrite"]  # skipped by Delta, noticed, re-planned against the rival's rows
    assert sorted((r.topology_major, r.node_id) for r in wh.read("topology").collect()) == [(1, "old"), (2, "mine")]
    with pytest.raises(WhereMismatchError):  # the append path checks its rows against the where too
        wh.replace_where("topology", _topology(spark, 4, ["stray"]), {"topology_major": 3})


def _succeeded_jobs(spark: SparkSession, group: str) -> int:
    tracker = spark.sparkContext.statusTracker()
    infos = (tracker.getJobInfo(i) for i in tracker.getJobIdsForGroup(group))
    return sum(1 for info in infos if info is not None and info.status == "SUCCEEDED")


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's commits prepared ahead")
@needs_driver_reader
def test_delta_spark_commits_prepared_ahead_run_their_write_alone(spark: SparkSession, warehouse_dir: Path) -> None:
    """A guarded commit runs two Spark jobs: Delta's state of the table (for the transaction ids), then the write.
    Within ``commits_ahead`` a background thread computes the named tables' states while the caller works, so
    their commits run the write alone; a table whose commit came first is not prepared after it (that would compute
    the state of a snapshot nobody commits from). Same rows either way."""
    if TEST_API_MODE == "connect":
        pytest.skip("job groups are a classic-session notion; Connect has tags")
    wh = _open(spark, warehouse_dir, driver_writer=False)  # Delta's own commits of driver rows
    others = ["ideal_assignment", "partition_map"]  # prepared before topology: the thread reaches it late
    wh.create_tables(["topology", "lost_partitions", *others])
    for name in others:  # a table with rows: one job for its state (two for a table only created)
        wh.append(name, spark.createDataFrame(_rows_for(tables.SCHEMAS[name])[:2], tables.SCHEMAS[name]))
    wh.replace_where("topology", _topology(spark, 1, ["a"]), {"topology_major": 1})
    wh.replace_where("lost_partitions", _lost(spark, 1, [0]), {"topology_major": 1})
    sc = spark.sparkContext
    group = f"prepared-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "test")
    try:
        wh.replace_where("topology", _topology(spark, 2, ["a"]), {"topology_major": 2})
        assert _succeeded_jobs(spark, group) == 2  # unprepared: the state, the write
        with wh.commits_ahead(["lost_partitions", *others, "topology"]):
            # topology's commit comes at once, while the thread computes the others' states: it computes its own
            # (or waits for the thread's, had the thread got there first)
            wh.replace_where("topology", _topology(spark, 3, ["a"]), {"topology_major": 3})
            deadline = time.monotonic() + 30
            while _succeeded_jobs(spark, group) < 2 + 2 + 3 and time.monotonic() < deadline:
                time.sleep(0.05)  # topology's two jobs and three states from the thread
            assert _succeeded_jobs(spark, group) == 2 + 2 + 3
            wh.replace_where("lost_partitions", _lost(spark, 3, [1]), {"topology_major": 3})
        assert _succeeded_jobs(spark, group) == 2 + 2 + 3 + 1  # its write alone; topology was not prepared again
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sorted(r.topology_major for r in wh.read("topology").collect()) == [1, 2, 3]
    assert sorted((r.topology_major, r.partition_id) for r in wh.read("lost_partitions").collect()) == [(1, 0), (3, 1)]


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's session for small work")
def test_delta_spark_commits_driver_rows_from_a_sibling_session_with_interpreted_projections(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    """Rows born on the driver are committed from a sibling of the caller's session that interprets Spark's
    projections (compiling one per task over Delta's wide log schema was most of a small commit): the sibling has
    the caller's own settings, the caller's session is left as it was, and the rows land as from the caller's.
    A merge of driver rows (catalog and remote warehouses insert absent keys that way) runs its SQL in the session
    that holds the rows' view."""
    if TEST_API_MODE == "connect":
        pytest.skip("Spark Connect has no sibling sessions: driver rows use the caller's session there")
    factory = "spark.sql.codegen.factoryMode"
    own_factory = spark.conf.get(factory, None)
    marker = f"spark.sql.rebalancer.test.{uuid.uuid4().hex}"
    spark.conf.set(marker, "the caller's")  # a setting made after the session began
    spark.conf.set(factory, "FALLBACK")  # Spark's default (the suite's session interprets everything)
    schema = f"rebalancer_{uuid.uuid4().hex[:12]}"
    spark.sql(f"CREATE SCHEMA {schema} LOCATION '{warehouse_dir.parent / 'schema'}'")
    spark.catalog.setCurrentDatabase(schema)  # the caller's USE: a one-part catalog_prefix resolves there
    try:
        wh = _open(spark, warehouse_dir, driver_writer=False)  # Delta's own commits of driver rows
        small = wh._frame(_topology(spark, 1, ["a"]).toArrow(), "topology").sparkSession
        assert spark.conf.get(factory) == "FALLBACK"
        assert small.catalog.currentDatabase() == schema
        assert small.catalog.currentCatalog() == spark.catalog.currentCatalog()
    finally:
        spark.catalog.setCurrentDatabase("default")
        spark.sql(f"DROP SCHEMA {schema} CASCADE")
        spark.conf.unset(marker)
        if own_factory is None:
            spark.conf.unset(factory)
        else:
            spark.conf.set(factory, own_factory)
    assert small is not spark
    assert isinstance(wh, DeltaSparkWarehouse)
    # more rows than SMALL_SESSION_ROWS (an exchange's large tables decided on the driver) compile in the caller's
    many = _topology(spark, 1, [f"n{i}" for i in range(SMALL_SESSION_ROWS + 1)]).toArrow()
    assert wh._frame(many, "topology").sparkSession is spark
    wh.create_tables(["topology"])
    assert small.conf.get(factory) == "NO_CODEGEN"
    assert small.conf.get(marker) == "the caller's"
    rows = _topology(spark, 1, ["a", "b"]).toArrow()
    wh.replace_where_arrow("topology", rows, {"topology_major": 1})
    wh.insert_absent_arrow("topology", _topology(spark, 2, ["a"]).toArrow(), TOPOLOGY_KEYS)
    wh.merge("topology", wh._frame(_topology(spark, 3, ["c"]).toArrow(), "topology"),
             TOPOLOGY_KEYS, insert_only=True)  # the path without a driver reader
    assert spark.conf.get(factory, None) == own_factory
    assert_df_equality(wh.read("topology"), _topology(spark, 1, ["a", "b"]).unionByName(_topology(spark, 2, ["a"]))
                       .unionByName(_topology(spark, 3, ["c"])), ignore_row_order=True, ignore_nullable=True)


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's driver reader")
def test_delta_spark_without_the_driver_reader_reads_and_rewrites_through_delta(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    """``storage.driver_reader = false``: a local directory is read and rewritten as remote storage is, by Delta
    alone: tables created by ``CREATE TABLE``, each rewrite Delta's ``replaceWhere`` (a new version's rows too,
    which the driver reader would have appended), versions from ``DESCRIBE HISTORY``."""
    wh = open_warehouse(spark, StorageSettings(engine="delta-spark", driver_reader=False), warehouse_dir)
    assert isinstance(wh, DeltaSparkWarehouse) and wh._driver_reader is None
    wh.create_tables(["topology"])
    for major, nodes in ((1, ["a"]), (1, ["a", "b"]), (2, ["c"])):
        wh.replace_where("topology", _topology(spark, major, nodes), {"topology_major": major})
    history = spark.sql(f"DESCRIBE HISTORY delta.`{wh.path_of('topology')}`").orderBy("version").collect()
    assert [(r.operation, r.operationParameters.get("mode")) for r in history] == [
        ("CREATE TABLE", None), ("WRITE", "Overwrite"), ("WRITE", "Overwrite"), ("WRITE", "Overwrite")]
    assert wh.table_version("topology") == 3
    assert sorted(wh.read_arrow("topology", where={"topology_major": 1}).column("node_id").to_pylist()) == ["a", "b"]
    with_reader = open_warehouse(spark, StorageSettings(engine="delta-spark"), warehouse_dir)
    with_reader.replace_where("topology", _topology(spark, 3, ["d"]), {"topology_major": 3})
    last = spark.sql(f"DESCRIBE HISTORY delta.`{wh.path_of('topology')}` LIMIT 1").collect()[0]
    assert (last.operation, last.operationParameters.get("mode")) == ("WRITE", "Append")  # a guarded append


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's catalog tables")
def test_delta_spark_catalog_tables_read_small_rows_versions_and_history_by_name(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Catalog tables (Unity Catalog's case) have no driver reader: small reads, a table's version and its time
    travel go through Delta (in the small session, as rows born on the driver are committed)."""
    schema = f"spark_catalog.rebalancer_{uuid.uuid4().hex[:12]}"
    spark.sql(f"CREATE SCHEMA {schema} LOCATION '{tmp_path / 'schema'}'")
    try:
        wh = open_warehouse(spark, StorageSettings(engine="delta-spark", catalog_prefix=schema))
        wh.create_tables(["topology"])
        for major, nodes in ((1, ["a"]), (2, ["a", "b"])):
            wh.replace_where_arrow("topology", _topology(spark, major, nodes).toArrow(), {"topology_major": major})
        newest = wh.table_version("topology")
        assert wh.read_arrow("topology", where={"topology_major": 2}).column("node_id").to_pylist() == ["a", "b"]
        assert sorted(wh.read_arrow("topology", version=newest - 1).column("topology_major").to_pylist()) == [1]
        with pytest.raises(VersionNotFoundError, match=f"no version 99; its latest version is {newest}"):
            wh.read_arrow("topology", version=99)
    finally:
        spark.sql(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's reads through delta-rs")
def test_delta_spark_reads_through_delta_a_table_delta_rs_cannot_read(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    # A user's input table with deletion vectors: delta-rs refuses it, so the driver reads fall back to Delta.
    wh = _open(spark, warehouse_dir)
    path = wh.path_of("site_nodes")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA "
              f"TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1), (2), (3)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 2")  # a deletion vector, not a rewritten file
    assert sorted(r.id for r in wh.read("site_nodes").collect()) == [1, 3]
    assert sorted(wh.read_arrow("site_nodes").column("id").to_pylist()) == [1, 3]
    assert wh.table_version("site_nodes") == 2


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's driver writer")
@needs_driver_reader
def test_delta_spark_commits_driver_rows_through_delta_rs_and_delta_writes_after_them(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    """With the driver writer (storage.driver_writer, the default), rows built on the driver are committed by
    delta-rs without a Spark job; Delta reads them, and a write by Delta to the same table (rows Spark computed)
    follows them as it follows its own. Without it, the same rows are committed by Delta."""
    if TEST_API_MODE == "connect":
        pytest.skip("job groups are a classic-session notion; Connect has tags")
    wh = _open(spark, warehouse_dir, driver_writer=True)
    wh.create_tables(["topology"])
    a, bc, d = (_topology(spark, major, nodes).toArrow() for major, nodes in [(1, ["a"]), (2, ["b", "c"]), (2, ["d"])])
    e_and_a = _topology(spark, 3, ["e"]).unionByName(_topology(spark, 1, ["a"])).toArrow()
    sc = spark.sparkContext
    group = f"driver-writer-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "test")
    try:
        wh.append_arrow("topology", a)
        wh.replace_where_arrow("topology", bc, {"topology_major": 2})
        wh.replace_where_arrow("topology", d, {"topology_major": 2})
        wh.insert_absent_arrow("topology", e_and_a, TOPOLOGY_KEYS)
        jobs = len(sc.statusTracker().getJobIdsForGroup(group))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert jobs == 0
    wh.replace_where("topology", _topology(spark, 4, ["f"]), {"topology_major": 4})  # Delta's commit
    wh.replace_where_arrow("topology", _topology(spark, 1, ["g"]).toArrow(), {"topology_major": 1})
    through_delta = spark.read.format("delta").load(wh.path_of("topology"))
    assert sorted((r.topology_major, r.node_id) for r in through_delta.collect()) == [
        (1, "g"), (2, "d"), (3, "e"), (4, "f")]
    newest, before = DeltaTable(wh.path_of("topology")).history()[:2]
    assert str(newest.get("clientVersion")).startswith("delta-rs")  # the driver writer's commit
    assert "Apache-Spark" in str(before.get("engineInfo"))  # Delta's, before it
    protocol = DeltaTable(wh.path_of("topology")).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)

    by_delta = _open(spark, warehouse_dir.parent / "by-delta", driver_writer=False)
    by_delta.create_tables(["topology"])
    by_delta.replace_where_arrow("topology", _topology(spark, 1, ["a"]).toArrow(), {"topology_major": 1})
    assert "Spark" in str(DeltaTable(by_delta.path_of("topology")).history()[0].get("engineInfo"))


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's driver writer")
@needs_driver_reader
def test_delta_spark_commits_through_delta_the_driver_rows_of_a_table_delta_rs_cannot_write(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    # A table with deletion vectors (made outside rebalancer): delta-rs refuses to write it before it writes a
    # file, and Delta commits the driver's rows instead.
    wh = _open(spark, warehouse_dir, driver_writer=True)
    path = wh.path_of("topology")
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in tables.TOPOLOGY.fields)
    spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING DELTA "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    wh.append_arrow("topology", _topology(spark, 1, ["a", "b"]).toArrow())
    wh.replace_where_arrow("topology", _topology(spark, 2, ["c"]).toArrow(), {"topology_major": 2})
    assert sorted((r.topology_major, r.node_id) for r in wh.read("topology").collect()) == [(1, "a"), (1, "b"),
                                                                                           (2, "c")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [h["operation"] for h in history[:2]] == ["WRITE", "WRITE"]  # newest first: both writes, then the create
    assert all("Apache-Spark" in str(h["engineInfo"]) for h in history)  # every commit Delta's, none delta-rs's


@pytest.mark.skipif(TEST_ENGINE != "delta-spark", reason="about the delta-spark engine's VACUUM settings")
def test_delta_spark_vacuums_at_once_and_gives_the_session_its_settings_back(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    """Vacuums of several tables at once (as ``rebalancer vacuum`` runs them) with Delta's retention check off and a
    small listing parallelism; afterwards the session's own values are back, whichever vacuum ended last."""
    wh = _open(spark, warehouse_dir)
    wh.create_tables(["topology", "lost_partitions"])
    for major in (1, 2):
        wh.replace_where("topology", _topology(spark, major, ["a"]), {"topology_major": major})
        wh.replace_where("lost_partitions", _lost(spark, major, [0]), {"topology_major": major})
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    spark.conf.set(listing, "7")
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.unset(check)
    wh.concurrent_commits = 2
    deleted = wh.apply_retention(["topology", "lost_partitions"], "topology_major < 2", 0)
    assert deleted > 0  # the files of version 1's rows, and of the rewrites that removed them
    assert [r.topology_major for r in wh.read("topology").collect()] == [2]
    assert spark.conf.get(listing) == "7" and spark.conf.get(check, None) in (None, "true")


def test_delta_spark_vacuum_settings_are_the_sessions_whichever_warehouse_ends_last(
    spark: SparkSession, warehouse_dir: Path
) -> None:
    """Two warehouses on one session vacuum at once and the first ends first: the second keeps Delta's retention
    check off until it ends, and then the session's own values come back (counted per warehouse, the first restored
    them under the second, and the second then left the check off for good). Settings only: no Delta jar needed."""
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    spark.conf.unset(check)
    spark.conf.set(listing, "7")
    first, second = (DeltaSparkWarehouse(spark, warehouse_dir) for _ in range(2))
    try:
        with contextlib.ExitStack() as first_running:
            first_running.enter_context(first._vacuum_settings())
            with second._vacuum_settings():
                first_running.close()
                assert (spark.conf.get(check), spark.conf.get(listing)) == ("false", "2")
        assert spark.conf.get(check, None) is None and spark.conf.get(listing) == "7"
    finally:
        spark.conf.unset(listing)


@delta_rs_only
def test_exhausted_retries_raise_concurrent_write_error_and_leave_no_files(
    spark: SparkSession, warehouse_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh, rival = _open(spark, warehouse_dir, retries=1), _open(spark, warehouse_dir)
    wh.create_tables(["topology"])
    wh.append("topology", _topology(spark, 1, ["a"]))
    _race_on_first_commits(wh, rival, times=99, monkeypatch=monkeypatch)
    with pytest.raises(ConcurrentWriteError, match="lost the commit race to other writers 2 times.*commit_retries"):
        wh.merge("topology", _topology(spark, 1, ["mine"]), TOPOLOGY_KEYS)
    assert [r.node_id for r in wh.read("topology").collect()] == ["rival2"]
    path = wh.path_of("topology")
    assert _rb_dirs(path) == _referenced_dirs(path)  # our staged files were deleted, nothing is orphaned


def test_concurrent_writers_on_one_file_end_with_every_write_exactly_once(
    spark: SparkSession, warehouse_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wh = _open(spark, warehouse_dir, retries=30)
    wh.create_tables(["topology"])
    # One file holds every version, so each writer must rewrite it: the writers really conflict.
    wh.append(
        "topology", spark.createDataFrame([(m, 0, "old", 0, False) for m in range(4)], tables.TOPOLOGY).coalesce(1)
    )
    writers = [_open(spark, warehouse_dir, retries=30) for _ in range(4)]
    # Hold every writer's first commit until all four have planned from the same version: one commit wins and the
    # three others must detect the conflict, re-plan and retry (the outcome otherwise depends on thread timing).
    # delta-spark's commit is inside Delta: its writers race as they come, and the rows must still be exact.
    barrier = threading.Barrier(len(writers), timeout=60)
    for writer in writers if TEST_ENGINE == "delta-rs" else []:
        real_commit = writer._commit
        first = [True]

        def gated(*args: Any, _real: Callable[..., None] = real_commit, _first: list[bool] = first, **kw: Any) -> None:
            if _first[0]:
                _first[0] = False
                barrier.wait()
            _real(*args, **kw)

        writer._commit = gated  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def write(major: int) -> None:
        try:
            if major == 3:
                writers[3].merge("topology", _topology(spark, 3, ["old", "m"], client=True), TOPOLOGY_KEYS)
            else:
                rows = _topology(spark, major, [f"new{major}"])
                writers[major].replace_where("topology", rows, {"topology_major": major})
        except BaseException as exc:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(m,)) for m in range(4)]
    with caplog.at_level("WARNING", logger="rebalancer.storage"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    if TEST_ENGINE == "delta-rs":
        assert sum("conflicted with another writer" in r.getMessage() for r in caplog.records) >= 3
    expected = spark.createDataFrame(
        [
            (0, 0, "new0", 0, False),
            (1, 0, "new1", 0, False),
            (2, 0, "new2", 0, False),
            (3, 0, "old", 0, True),
            (3, 0, "m", 1, True),
        ],
        tables.TOPOLOGY,
    )
    assert_df_equality(wh.read("topology"), expected, ignore_row_order=True, ignore_nullable=True)


# ---------------------------------------------------------------- pure helpers (shared with delta-spark)


@pytest.mark.parametrize(
    ("source", "target", "ok"),
    [
        (IntegerType(), LongType(), True),
        (ByteType(), IntegerType(), True),
        (ShortType(), DoubleType(), True),
        (FloatType(), DoubleType(), True),
        (NullType(), MapType(StringType(), StringType()), True),
        (DateType(), TimestampType(), True),
        (ArrayType(IntegerType(), False), ArrayType(LongType()), True),
        (IntegerType(), DecimalType(10, 0), True),
        (DecimalType(5, 2), DecimalType(7, 3), True),
        (LongType(), IntegerType(), False),
        (DoubleType(), IntegerType(), False),
        (LongType(), DoubleType(), False),
        (StringType(), IntegerType(), False),
        (IntegerType(), StringType(), False),
        (TimestampType(), DateType(), False),
        (ArrayType(LongType()), ArrayType(IntegerType()), False),
        (DecimalType(7, 3), DecimalType(5, 2), False),
    ],
)
def test_only_lossless_widening_is_implicit(source: DataType, target: DataType, ok: bool) -> None:
    assert can_store(source, target) is ok


def test_sql_text_for_delta_spark_runs_in_spark(spark: SparkSession, tmp_path: Path) -> None:
    where: dict[str, WhereValue] = {
        "node_id": "it's \\ é",
        "topology_major": 2**40,
        "is_client": None,
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    }
    assert where_sql({"topology_major": 5, "topology_minor": 0}) == "`topology_major` = 5 AND `topology_minor` = 0"
    assert sql_literal(2**40) == "1099511627776L"
    assert sql_literal(True) == "TRUE"
    rows = spark.createDataFrame(
        [
            ("it's \\ é", 2**40, None, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
            ("it's \\ é", 2**40, True, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
            ("other", 2**40, None, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
        ],
        "node_id string, topology_major bigint, is_client boolean, at timestamp",
    )
    assert rows.filter(where_sql(where)).count() == 1
    assert merge_condition(["a", "b"]) == "t.`a` = s.`a` AND t.`b` = s.`b`"
    # The view statement parses and casts every contract type (run here over a parquet directory).
    directory = str(tmp_path / "nodes")
    spark.createDataFrame(_rows_for(tables.NODES), tables.NODES).write.parquet(directory)
    spark.sql(view_sql("nodes_view", f"parquet.`{directory}`", tables.NODES))
    assert spark.table("nodes_view").schema == tables.NODES
    assert spark.table("nodes_view").count() == 3


def test_local_directory_of_paths_and_file_uris_and_none_for_remote_storage(tmp_path: Path) -> None:
    assert local_directory(tmp_path / "w") == str(tmp_path / "w")
    assert local_directory(f"file://{tmp_path}/my%20warehouse") == str(tmp_path / "my warehouse")
    assert local_directory("relative") == str(Path.cwd() / "relative")
    assert local_directory("s3://bucket/w") is None and local_directory("dbfs:/w") is None


def test_delta_spark_references_and_conflict_recognition() -> None:
    from delta.exceptions.base import ConcurrentAppendException

    assert table_reference("topology", "/w/topology") == "delta.`/w/topology`"
    assert table_reference("topology", None, "main.rb") == "`main`.`rb`.`topology`"
    assert warehouse_uri("s3://bucket/wh/") == "s3://bucket/wh"
    by_path = DeltaSparkWarehouse(None, "s3://bucket/wh", commit_retries=1)  # type: ignore[arg-type]
    assert by_path.path_of("topology") == "s3://bucket/wh/topology"
    by_name = DeltaSparkWarehouse(None, None, catalog_prefix="main.rb")  # type: ignore[arg-type]
    assert (by_name.path_of("topology"), by_name.location) == ("main.rb.topology", "main.rb")
    assert is_delta_conflict(ConcurrentAppendException(message="Files were added"))
    assert is_delta_conflict(RuntimeError("[DELTA_CONCURRENT_DELETE_READ] This transaction attempted to read ..."))
    assert not is_delta_conflict(RuntimeError("[DELTA_REPLACE_WHERE_MISMATCH] ..."))


def test_retry_on_conflict_retries_only_conflicts() -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("conflict")
        return "done"

    def conflict(exc: BaseException) -> bool:
        return "conflict" in str(exc)

    assert retry_on_conflict(flaky, table="t", retries=2, is_conflict=conflict, sleep=lambda s: None) == "done"
    attempts.clear()
    with pytest.raises(ConcurrentWriteError):
        retry_on_conflict(flaky, table="t", retries=1, is_conflict=conflict, sleep=lambda s: None)
    with pytest.raises(ValueError):
        retry_on_conflict(lambda: int("x"), table="t", retries=5, is_conflict=conflict, sleep=lambda s: None)


# ---------------------------------------------------------------- timing (excluded by default: pytest -m slow)


@pytest.mark.slow
def test_timing_one_million_rows(spark: SparkSession, warehouse_dir: Path) -> None:
    """The numbers in docs/STORAGE.md: ``pytest -m slow tests/test_storage.py -k million -s``."""
    import time

    def partition_map(rows: int, major: int, offset: int = 0) -> DataFrame:
        ids = spark.range(offset, offset + rows)
        return ids.select(
            F.lit(major).cast("bigint").alias("topology_major"),
            F.lit(0).alias("topology_minor"),
            F.concat(F.lit("g"), (F.col("id") % 16).cast("string")).alias("group_name"),
            (F.col("id") % 65536).cast("int").alias("partition_id"),
            F.concat(F.lit("node"), (F.col("id") % 100).cast("string")).alias("node_id"),
            F.lit("OWNING").alias("state"),
            F.col("id").alias("update_counter"),
            (F.col("id") * 3).alias("size"),
            (F.col("id") * 1024).alias("bytes"),
        )

    wh = _open(spark, warehouse_dir)
    wh.create_tables(["partition_map"])
    partition_map(100_000, 0).write.parquet(str(warehouse_dir / "warm-up"))  # JIT and Python workers, untimed
    steps: list[tuple[str, Callable[[], object]]] = [
        (
            "plain Spark parquet write of the same 1M rows (floor)",
            lambda: partition_map(1_000_000, 1).write.parquet(str(warehouse_dir / "plain")),
        ),
        ("append 1M rows", lambda: wh.append("partition_map", partition_map(1_000_000, 1))),
        (
            "read 1M rows, every column (noop sink)",
            lambda: wh.read("partition_map").write.format("noop").mode("overwrite").save(),
        ),
        ("read 1M rows, sum(bytes)", lambda: wh.read("partition_map").agg(F.sum("bytes")).first()),
        (
            "replace_where 100k rows of a new version (files pruned by stats)",
            lambda: wh.replace_where("partition_map", partition_map(100_000, 2), {"topology_major": 2}),
        ),
        (
            "replace_where the same 100k again (rewrites that version's files)",
            lambda: wh.replace_where("partition_map", partition_map(100_000, 2), {"topology_major": 2}),
        ),
        (
            "merge 100k rows (50k updates) into 1.1M",
            lambda: wh.merge("partition_map", partition_map(100_000, 1, 950_000), ["topology_major", "update_counter"]),
        ),
    ]
    for label, step in steps:
        started = time.perf_counter()
        step()
        print(f"{label}: {time.perf_counter() - started:.2f} s")
    assert wh.read("partition_map").count() == 1_150_000


def test_commit_each_runs_commits_at_once_with_the_callers_job_group_and_stops_at_the_first_error(
    spark: SparkSession,
) -> None:
    """Concurrent commits: each runs its Spark jobs under the caller's job group (so an exchange counts them),
    ``committed`` runs on the calling thread, and after an error the commits not started are not made."""
    from rebalancer.storage.commits import commit_each

    if TEST_API_MODE == "connect":
        pytest.skip("job groups are a classic-session notion; Connect has tags")
    sc = spark.sparkContext
    group = f"commit-each-{uuid.uuid4().hex}"
    threads: dict[str, int] = {}
    callbacks: list[tuple[str, int]] = []

    def commit(name: str) -> Callable[[], None]:
        def run() -> None:
            threads[name] = threading.get_ident()
            spark.range(3).count()
        return run

    sc.setJobGroup(group, "test")
    try:
        commit_each(spark, {n: commit(n) for n in "abcd"}, 3, lambda n: callbacks.append((n, threading.get_ident())))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sorted(n for n, _ in callbacks) == list("abcd")
    assert {t for _, t in callbacks} == {threading.get_ident()}
    assert threading.get_ident() not in threads.values()
    assert len(sc.statusTracker().getJobIdsForGroup(group)) >= 4  # every commit's job, under the caller's group

    started: list[str] = []
    made: list[str] = []

    def failing() -> None:
        raise RuntimeError("disk full")

    def slow(name: str) -> Callable[[], None]:
        def run() -> None:
            started.append(name)
            time.sleep(1.0)  # holds its worker while the failure is seen
            made.append(name)
        return run

    with pytest.raises(RuntimeError, match="disk full"):
        commit_each(spark, {"bad": failing, "first": slow("first"), "later": slow("later"), "last": slow("last")}, 2)
    # Every commit that started finished before the error was raised; "last" waited for a worker for a second and
    # was cancelled. ("later" may or may not have started: the failure's worker races the cancelling.)
    assert started and sorted(made) == sorted(started) and "last" not in started


@pytest.mark.parametrize("rows_hint", [None, 10**9], ids=["one-shared-job", "a-job-per-table"])
def test_replace_where_many_replaces_each_table_at_the_version_and_calls_back_after_each_commit(
    spark: SparkSession, wh: Warehouse, rows_hint: int | None
) -> None:
    """Flat tables share one staging job, a table with array columns gets its own; large writes take Spark's own
    Parquet writer per table; rows given as Arrow are written as such. Every path leaves the same rows and one
    commit per table (in any order: an engine may commit them concurrently)."""
    routing = tables.CLIENT_AFFINITY

    def mapping(major: int, primary: str) -> DataFrame:
        return spark.createDataFrame([(major, 0, 1, ["g"], 0, primary, ["b", "c"])], routing)

    wh.append("topology", _topology(spark, 1, ["a", "b"]))
    wh.append("client_affinity", mapping(1, "a"))
    wh.replace_where("topology", _topology(spark, 2, ["old"]), {"topology_major": 2, "topology_minor": 0})
    wh.append("lost_partitions", _lost(spark, 1, [0]))
    committed: list[str] = []
    wh.replace_where_many(
        {"topology": _topology(spark, 2, ["x", "y"]), "client_affinity": mapping(2, "x"),
         "lost_partitions": _lost(spark, 2, [3, 4]).toArrow()},
        {"topology_major": 2, "topology_minor": 0},
        committed=committed.append,
        rows_hint=rows_hint,
    )
    assert sorted(committed) == ["client_affinity", "lost_partitions", "topology"]
    # one commit each: created (0), first rows (1), these (2); topology also had the old rows of version 2
    assert {n: wh.table_version(n) for n in committed} == {"topology": 3, "client_affinity": 2, "lost_partitions": 2}
    expected = _topology(spark, 1, ["a", "b"]).union(_topology(spark, 2, ["x", "y"]))
    assert_df_equality(wh.read("topology"), expected, ignore_row_order=True, ignore_nullable=True)
    assert sorted((r.topology_major, r.partition_id) for r in wh.read("lost_partitions").collect()) == [
        (1, 0), (2, 3), (2, 4)
    ]
    rows = wh.read("client_affinity").collect()
    assert sorted((r.topology_major, r.primary_node, list(r.backup_nodes)) for r in rows) == [
        (1, "a", ["b", "c"]), (2, "x", ["b", "c"])
    ]


# ---------------------------------------------------------------- extra columns (collectors, docs/KAFKA.md)


def test_an_extra_column_is_added_once_as_metadata_and_old_rows_read_it_as_null(
        wh: Warehouse, warehouse_dir: Path) -> None:
    from pyspark.sql.types import IntegerType, StructField

    schema = tables.INPUT_TABLES["partition_reports"]
    arrow = to_arrow_schema(schema, timezone="UTC")
    old = {f.name: None for f in schema.fields} | {"node_id": "1", "group_name": "t", "partition_id": 0,
                                                    "state": "OWNING", "update_counter": 5, "report_seq": 1}
    wh.append_arrow("partition_reports", pa.Table.from_pylist([old], arrow))
    before = wh.table_version("partition_reports")
    column = StructField("replica_index", IntegerType())
    assert wh.add_columns("partition_reports", [column]) == ["replica_index"]
    assert wh.table_version("partition_reports") == before + 1
    assert wh.add_columns("partition_reports", [column]) == []  # idempotent: nothing committed
    assert wh.table_version("partition_reports") == before + 1
    rows = wh.read_raw("partition_reports").toArrow().to_pylist()
    assert [(r["update_counter"], r["replica_index"]) for r in rows] == [(5, None)]
    # a writer that does not know the column still writes (nulls); the declared read leaves it out
    wh.append_arrow("partition_reports", pa.Table.from_pylist([old | {"report_seq": 2}], arrow))
    assert wh.read_arrow("partition_reports").column_names == schema.names
    # and a writer that knows it keeps its values
    wider = arrow.append(pa.field("replica_index", pa.int32()))
    wh.append_arrow("partition_reports", pa.Table.from_pylist([old | {"report_seq": 3, "replica_index": 1}], wider))
    assert sorted(r["replica_index"] or -1 for r in wh.read_raw("partition_reports").toArrow().to_pylist()) == [
        -1, -1, 1]
    # the driver's read of the stored columns (what a collector compares with) gives the same rows
    assert sorted(r["replica_index"] or -1 for r in wh.read_stored_arrow("partition_reports").to_pylist()) == [
        -1, -1, 1]
    protocol = DeltaTable(str(warehouse_dir / "partition_reports")).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
