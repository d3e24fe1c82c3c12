"""Client routing: the client_affinity stage, the rebalancer-routing-v1 export and the Spark-free RoutingMap.

Scenarios: groups with identical routing share one mapping while a different node order, partition count or
partitioner gets its own; a temporary primary (late affinity) is what clients route to, not the ideal primary;
export -> JSON file -> RoutingMap round-trips; versions compare by major then minor; the client never imports
pyspark; and, as a property, the exported map routes every partition of random assignments to replica 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.affinity.partitioners import partition_of
from rebalancer.client.routing import (
    NoRouteError,
    RoutingFormatError,
    RoutingMap,
    UnknownGroupError,
)
from rebalancer.exchange import routing
from rebalancer.exchange.routing import (
    CLIENT_AFFINITY_STAGE,
    RoutingExportError,
    client_affinity,
    export_rows_to_json,
    resolve_partitioner,
)
from rebalancer.groups import GroupSettings

ASSIGNMENT_DDL = "group_name string, partition_id int, replica_index int, node_id string, is_temporary boolean"
GROUPS_DDL = "group_name string, partitions int, backups int, affinity string, partitioner string"

# group -> one ordered node list per partition id (the late assignment: element 0 serves as primary)
Layout = Mapping[str, Sequence[Sequence[str]]]


def assignment_df(
    spark: SparkSession, layout: Layout, temporary: frozenset[tuple[str, int]] = frozenset()
) -> DataFrame:
    rows = [
        (group, pid, idx, node, (group, pid) in temporary)
        for group, partitions in layout.items()
        for pid, nodes in enumerate(partitions)
        for idx, node in enumerate(nodes)
    ]
    return spark.createDataFrame(rows, ASSIGNMENT_DDL)


def groups_df(spark: SparkSession, groups: Sequence[tuple[str, int, str | None, str | None]]) -> DataFrame:
    """``(group_name, partitions, affinity, partitioner)`` rows as ``cache_groups`` (backups 1)."""
    return spark.createDataFrame([(g, p, 1, a, k) for g, p, a, k in groups], GROUPS_DDL)


def routed(assignment: DataFrame, groups: DataFrame) -> DataFrame:
    """The exchange's three routing steps: digests (Spark), fold (driver), the lead groups' rows (Spark)."""
    mappings = routing.fold(routing.routing_digests(assignment).toArrow().to_pylist(),
                            [GroupSettings.from_row(r.asDict()) for r in groups.collect()])
    return client_affinity(assignment, mappings)


def routed_on_driver(assignment: DataFrame, groups: DataFrame) -> DataFrame:
    """The same on the driver, as small exchanges route (:func:`routing.client_affinity_arrow`)."""
    rows = routing.client_affinity_arrow(assignment.toArrow(),
                                         [GroupSettings.from_row(r.asDict()) for r in groups.collect()])
    return assignment.sparkSession.createDataFrame(rows)


@pytest.fixture(params=["spark", "driver"])
def route(request: pytest.FixtureRequest) -> Any:
    """Routing as large exchanges run it (Spark) and as small ones do (the driver): the same rows."""
    return routed if request.param == "spark" else routed_on_driver


def key_in_partition(partition_id: int, partitions: int, partitioner: str = "murmur3") -> str:
    """The first ``key-<i>`` that ``partitioner`` sends to ``partition_id``."""
    for i in range(100_000):
        key = f"key-{i}"
        if partition_of(key, partitions, partitioner) == partition_id:
            return key
    raise AssertionError(f"no key found for partition {partition_id} of {partitions}")


# ---- the stage ----------------------------------------------------------------------------------------------

SHARED = [["n1", "n2"], ["n2", "n3"]]
LAYOUT: dict[str, list[list[str]]] = {
    "orders": SHARED,
    "payments": SHARED,  # identical to orders: folded into one mapping
    "users": [["n2", "n1"], ["n2", "n3"]],  # same nodes, other primary for partition 0
    "events": [*SHARED, ["n3", "n1"]],  # same first partitions, but 3 partitions
    "audit": SHARED,  # identical nodes, but keys hash with hazelcast
}
GROUPS = [
    ("orders", 2, None, None),
    ("payments", 2, "rendezvous", "murmur3"),  # explicit murmur3 == the null default of rendezvous
    ("users", 2, None, None),
    ("events", 3, None, None),
    ("audit", 2, None, "hazelcast"),
    ("stopped", 8, None, None),  # no assignment: not routed
]


def test_identical_groups_share_one_mapping_and_different_ones_do_not(spark: SparkSession, route: Any) -> None:
    actual_df = route(assignment_df(spark, LAYOUT), groups_df(spark, GROUPS))

    # mapping ids are dense, ordered by each mapping's smallest group name: audit, events, orders+payments, users
    expected_df = spark.createDataFrame(
        [
            (0, ["audit"], 0, "n1", ["n2"]),
            (0, ["audit"], 1, "n2", ["n3"]),
            (1, ["events"], 0, "n1", ["n2"]),
            (1, ["events"], 1, "n2", ["n3"]),
            (1, ["events"], 2, "n3", ["n1"]),
            (2, ["orders", "payments"], 0, "n1", ["n2"]),
            (2, ["orders", "payments"], 1, "n2", ["n3"]),
            (3, ["users"], 0, "n2", ["n1"]),
            (3, ["users"], 1, "n2", ["n3"]),
        ],
        CLIENT_AFFINITY_STAGE,
    )
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)
    assert actual_df.schema.fieldNames() == CLIENT_AFFINITY_STAGE.fieldNames()


def test_null_partitioner_of_the_ignite_affinity_is_ignite_so_it_does_not_fold_with_murmur3(
    spark: SparkSession, route: Any
) -> None:
    layout = {"a": SHARED, "b": SHARED, "c": SHARED}
    groups = [("a", 2, "ignite", None), ("b", 2, "ignite", "IGNITE"), ("c", 2, "rendezvous", None)]

    rows = route(assignment_df(spark, layout), groups_df(spark, groups)).collect()

    assert sorted({(r.mapping_id, tuple(r.group_names)) for r in rows}) == [(0, ("a", "b")), (1, ("c",))]
    assert resolve_partitioner(None, "ignite") == "ignite"
    assert resolve_partitioner(None, None) == "murmur3"
    assert resolve_partitioner("Hazelcast", "ignite") == "hazelcast"


def test_one_hash_family_colliding_never_folds_different_mappings(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every xxhash64 is 0, so that family cannot tell the groups apart (same row count and settings); the other
    # family must, so c keeps its own mapping while the identical a and b share one, and no key of c misroutes.
    monkeypatch.setattr(routing.F, "xxhash64", lambda *cols: F.lit(0).cast("long"))
    layout = {"a": SHARED, "b": SHARED, "c": [["n3", "n1"], ["n2", "n3"]]}
    groups = [(g, 2, None, None) for g in layout]

    rows = routed(assignment_df(spark, layout), groups_df(spark, groups)).collect()

    mappings = {tuple(r.group_names): r.mapping_id for r in rows}
    assert mappings == {("a", "b"): 0, ("c",): 1}
    primary_c0 = [r.primary_node for r in rows if r.group_names == ["c"] and r.partition_id == 0]
    assert primary_c0 == ["n3"]


def test_a_temporary_primary_is_what_clients_route_to_not_the_ideal_primary(spark: SparkSession, route: Any) -> None:
    # Ideal partition 0 of "orders" is [n1, n2], but n1 just joined and holds no data yet: late affinity keeps
    # the owner n3 as temporary primary, followed by the ideal nodes ([n3, n1, n2], is_temporary).
    ideal = {"orders": [["n1", "n2"], ["n2", "n1"]]}
    late = {"orders": [["n3", "n1", "n2"], ["n2", "n1"]]}
    late_df = assignment_df(spark, late, temporary=frozenset({("orders", 0)}))

    actual_df = route(late_df, groups_df(spark, [("orders", 2, None, None)]))

    expected_df = spark.createDataFrame(
        [(0, ["orders"], 0, "n3", ["n1", "n2"]), (0, ["orders"], 1, "n2", ["n1"])], CLIENT_AFFINITY_STAGE
    )
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)

    doc = export_rows_to_json(actual_df.collect(), [{"group_name": "orders", "partitions": 2}], (3, 1))
    key = key_in_partition(0, 2)
    assert RoutingMap.from_dict(doc).primary("orders", key) == "n3"
    assert ideal["orders"][0][0] == "n1"


# ---- export and the client ----------------------------------------------------------------------------------


def test_export_round_trips_through_a_json_file_into_routing_map(spark: SparkSession, tmp_path: Path) -> None:
    rows = routed(assignment_df(spark, LAYOUT), groups_df(spark, GROUPS)).collect()
    group_rows = groups_df(spark, GROUPS).collect()

    doc = export_rows_to_json(rows, group_rows, (7, 2))
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    routing_map = RoutingMap.load(path)

    assert doc == {
        "format": "rebalancer-routing-v1",
        "topology_major": 7,
        "topology_minor": 2,
        "mappings": [
            {"mapping_id": 0, "group_names": ["audit"], "partitions": 2, "partitioner": "hazelcast",
             "nodes": [["n1", "n2"], ["n2", "n3"]]},
            {"mapping_id": 1, "group_names": ["events"], "partitions": 3, "partitioner": "murmur3",
             "nodes": [["n1", "n2"], ["n2", "n3"], ["n3", "n1"]]},
            {"mapping_id": 2, "group_names": ["orders", "payments"], "partitions": 2, "partitioner": "murmur3",
             "nodes": [["n1", "n2"], ["n2", "n3"]]},
            {"mapping_id": 3, "group_names": ["users"], "partitions": 2, "partitioner": "murmur3",
             "nodes": [["n2", "n1"], ["n2", "n3"]]},
        ],
    }  # fmt: skip
    assert routing_map.to_dict() == doc
    assert routing_map.version == (7, 2)
    assert routing_map.groups() == ["audit", "events", "orders", "payments", "users"]
    for group, layout in LAYOUT.items():
        partitions, partitioner = (2, "hazelcast") if group == "audit" else (len(layout), "murmur3")
        for key in ("alice", "bob", 42, b"\x00\x01"):
            if partitioner == "hazelcast" and isinstance(key, bytes):
                continue
            pid = partition_of(key, partitions, partitioner)
            assert routing_map.partition(group, key) == pid
            assert routing_map.nodes(group, key) == layout[pid]
            assert routing_map.primary(group, key) == layout[pid][0]

    saved = tmp_path / "saved.json"
    routing_map.save(saved)
    assert RoutingMap.load(saved).to_dict() == doc


def test_export_gives_a_partition_without_rows_no_nodes_and_the_client_says_so() -> None:
    rows = [{"mapping_id": 0, "group_names": ["g"], "partition_id": 1, "primary_node": "n1", "backup_nodes": []}]
    doc = export_rows_to_json(rows, [{"group_name": "g", "partitions": 2}], (1, 0))

    assert doc["mappings"][0]["nodes"] == [[], ["n1"]]
    routing_map = RoutingMap.from_dict(doc)
    assert routing_map.partition_nodes("g", 0) == []
    with pytest.raises(NoRouteError, match="partition 0 of group 'g'"):
        routing_map.primary("g", key_in_partition(0, 2))


@pytest.mark.parametrize(
    ("rows", "groups", "message"),
    [
        ([{"mapping_id": 0, "group_names": ["g"], "partition_id": 0, "primary_node": "n1"}], [],
         r"groups \['g'\] have no cache_groups row"),
        ([{"mapping_id": 0, "group_names": ["g", "h"], "partition_id": 0, "primary_node": "n1"}],
         [{"group_name": "g", "partitions": 1}, {"group_name": "h", "partitions": 2}],
         "disagree on partitions/partitioner"),
        ([{"mapping_id": 0, "group_names": ["g"], "partition_id": 5, "primary_node": "n1"}],
         [{"group_name": "g", "partitions": 2}], r"partition ids \[5\] outside 0..1"),
        ([{"mapping_id": 0, "group_names": ["g"], "partition_id": 0, "primary_node": "n1"},
          {"mapping_id": 1, "group_names": ["g"], "partition_id": 0, "primary_node": "n1"}],
         [{"group_name": "g", "partitions": 1}], "group 'g' is in mappings 0 and 1"),
    ],
)  # fmt: skip
def test_export_rejects_inconsistent_rows(
    rows: list[dict[str, Any]], groups: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(RoutingExportError, match=message):
        export_rows_to_json(rows, groups, (1, 0))


def _doc(**mapping: Any) -> dict[str, Any]:
    base = {"mapping_id": 0, "group_names": ["g"], "partitions": 2, "partitioner": "murmur3",
            "nodes": [["n1"], ["n2"]]}  # fmt: skip
    return {"format": "rebalancer-routing-v1", "topology_major": 4, "topology_minor": 0,
            "mappings": [{**base, **mapping}]}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({**_doc(), "format": "rebalancer-routing-v2"}, "format: expected 'rebalancer-routing-v1'"),
        ({**_doc(), "topology_minor": "0"}, "topology_minor: expected an integer"),
        (_doc(nodes=[["n1"]]), r"mappings\[0\].nodes: expected one node list per partition \(2\), got 1"),
        (_doc(partitioner="crc32"), r"mappings\[0\].partitioner: expected one of"),
        (_doc(partitions=0), r"mappings\[0\].partitions: expected 1..65536"),
        (_doc(group_names=[]), "must name at least one group"),
    ],
)
def test_routing_map_rejects_invalid_documents(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(RoutingFormatError, match=message):
        RoutingMap.from_dict(doc)


def test_routing_map_ignores_unknown_fields_for_forward_compatibility() -> None:
    doc = _doc(extra="x")
    doc["generated_by"] = "a newer exporter"
    assert RoutingMap.from_dict(doc).primary("g", key_in_partition(1, 2)) == "n2"


def test_int_keys_hash_as_the_java_type_the_caller_names() -> None:
    nodes = [[f"n{p}"] for p in range(271)]
    routing_map = RoutingMap.from_dict(_doc(partitions=271, partitioner="hazelcast", nodes=nodes))

    assert routing_map.partition("g", 42) == 175  # java.lang.Integer 42 on default Hazelcast
    assert routing_map.partition("g", 42, int_type="long") == 145  # java.lang.Long 42
    assert routing_map.primary("g", 42, int_type="long") == "n145"
    assert routing_map.nodes("g", 42) == ["n175"]


def test_an_unknown_group_is_a_key_error_that_lists_the_known_groups() -> None:
    routing_map = RoutingMap.from_dict(_doc(group_names=["orders", "users"]))

    with pytest.raises(KeyError) as caught:
        routing_map.primary("payments", "k")

    assert isinstance(caught.value, UnknownGroupError)
    assert str(caught.value) == "unknown cache group 'payments'; the routing map knows: orders, users"


@pytest.mark.parametrize(
    ("major", "minor", "newer"),
    [(5, 3, True), (6, 0, True), (5, 2, False), (5, 1, False), (4, 9, False), (0, 0, False)],
)
def test_is_newer_orders_versions_by_major_then_minor(major: int, minor: int, newer: bool) -> None:
    routing_map = RoutingMap.from_dict({**_doc(), "topology_major": 5, "topology_minor": 2})
    assert routing_map.is_newer(major, minor) is newer


def test_the_python_example_in_docs_routing_md_runs() -> None:
    text = (Path(__file__).parents[1] / "docs" / "ROUTING.md").read_text(encoding="utf-8")
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "RoutingMap" in example
    exec(compile(example, "docs/ROUTING.md", "exec"), {})


def test_the_client_does_not_import_pyspark() -> None:
    code = (
        "import sys\n"
        "from rebalancer.client.routing import RoutingMap\n"
        "loaded = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith(('pyspark.', 'py4j')))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1]
    )
    assert result.stdout.strip() == "", f"client imported: {result.stdout.strip()}"


# ---- property: the exported map routes every partition to the assignment's replica 0 ----------------------

NODES = ["n0", "n1", "n2", "n3", "n4"]
SETTINGS = [(None, None), ("rendezvous", "murmur3"), ("ignite", None), (None, "hazelcast"), (None, "ignite")]


Cluster = tuple[dict[str, list[list[str]]], dict[str, tuple[int, str | None, str | None]], frozenset[tuple[str, int]]]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """Up to 5 groups (layout, settings, temporary partitions); some copy an earlier group's whole mapping."""
    layout: dict[str, list[list[str]]] = {}
    settings_of: dict[str, tuple[int, str | None, str | None]] = {}
    for i in range(draw(st.integers(1, 5))):
        name = f"g{i}"
        if layout and draw(st.booleans()):
            source = draw(st.sampled_from(sorted(layout)))
            layout[name], settings_of[name] = layout[source], settings_of[source]
            continue
        partitions = draw(st.integers(1, 4))
        affinity, partitioner = draw(st.sampled_from(SETTINGS))
        layout[name] = [draw(st.permutations(NODES))[: draw(st.integers(1, 3))] for _ in range(partitions)]
        settings_of[name] = (partitions, affinity, partitioner)
    temporary = frozenset((g, p) for g, parts in layout.items() for p in range(len(parts)) if draw(st.booleans()))
    return layout, settings_of, temporary


def _partitioner(settings_of: Mapping[str, tuple[int, str | None, str | None]], group: str) -> str:
    _, affinity, partitioner = settings_of[group]
    return resolve_partitioner(partitioner, affinity)


@settings(max_examples=max(6, settings.default.max_examples // 4))  # each example is one Spark run
@given(cluster=clusters())
def test_property_the_client_primary_is_replica_0_for_every_group_and_partition(
    spark: SparkSession, route: Any, cluster: Cluster
) -> None:
    layout, settings_of, temporary = cluster
    groups = [(g, p, a, k) for g, (p, a, k) in settings_of.items()]
    group_rows = [{"group_name": g, "partitions": p, "affinity": a, "partitioner": k} for g, p, a, k in groups]

    rows = route(assignment_df(spark, layout, temporary), groups_df(spark, groups)).collect()
    routing_map = RoutingMap.from_dict(export_rows_to_json(rows, group_rows, (1, 0)))

    assert routing_map.groups() == sorted(layout)
    for group, parts in layout.items():
        for pid, nodes in enumerate(parts):
            assert routing_map.partition_nodes(group, pid) == nodes, (group, pid)
        for key in ("k0", "k1", 7, 123456789):
            pid = partition_of(key, len(parts), _partitioner(settings_of, group))
            assert routing_map.primary(group, key) == parts[pid][0], (group, key, pid)
    # groups share a mapping exactly when partitions, resolved partitioner and every node list are equal
    for a in layout:
        for b in layout:
            same = (layout[a], _partitioner(settings_of, a)) == (layout[b], _partitioner(settings_of, b))
            assert (routing_map.route(a).mapping_id == routing_map.route(b).mapping_id) is same, (a, b)
