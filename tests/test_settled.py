"""Golden tests of the settled-partition split (rebalancer.exchange.settled).

That carrying settled partitions over gives exactly the rows of a full recomputation is checked on random
histories by tests/test_exchange_properties.py; these tests pin which partitions count as settled and why.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from rebalancer.exchange import settled
from rebalancer.exchange.fullmap import MAP_SCHEMA

IDEAL = "group_name string, partition_id int, replica_index int, node_id string"
ASSIGNMENT = IDEAL + ", is_temporary boolean"
PARTS = "group_name string, partition_id int"


def _ideal_rows(lists: dict[tuple[str, int], list[str]]) -> list[tuple[str, int, int, str]]:
    return [(g, p, i, n) for (g, p), nodes in lists.items() for i, n in enumerate(nodes)]


def test_a_failed_node_unsettles_only_its_partitions_and_those_already_in_flux(spark: SparkSession) -> None:
    # node n4 failed; group h is reset in this exchange.
    ideal = {
        ("g", 0): ["n1", "n2"],  # settled
        ("g", 1): ["n2", "n3"],  # its copy on n4 is gone, n3 is new: unsettled
        ("g", 2): ["n3", "n1"],  # settled
        ("g", 3): ["n1", "n2"],  # n2 still MOVING
        ("g", 4): ["n1", "n2"],  # had a counter conflict
        ("g", 5): ["n1", "n2"],  # a new report arrived
        ("g", 6): ["n1", "n2"],  # served by a temporary primary
        ("g", 7): ["n1", "n2"],  # served in another order
        ("g", 8): ["n1", "n2"],  # was lost, no copy left
        ("h", 0): ["n1", "n2"],  # its group is reset
    }
    prev_map = [
        (g, p, n, "MOVING" if (p, n) == (3, "n2") else "OWNING", 7, 5, 50)
        for (g, p), nodes in ideal.items() if (g, p) not in {("g", 1), ("g", 8)} for n in nodes
    ] + [("g", 1, "n2", "OWNING", 7, 5, 50), ("g", 1, "n4", "OWNING", 7, 5, 50)]
    prev_assignment = [
        (g, p, i, n, False) for g, p, i, n in _ideal_rows({**ideal, ("g", 1): ["n2", "n4"]})
        if (g, p) not in {("g", 6), ("g", 7)}
    ] + [
        ("g", 6, 0, "n2", True), ("g", 6, 1, "n1", True), ("g", 6, 2, "n2", True),
        ("g", 7, 0, "n2", False), ("g", 7, 1, "n1", False),
    ]
    unsettled = settled.unsettled_partitions(
        spark.createDataFrame(_ideal_rows(ideal), IDEAL),
        spark.createDataFrame(prev_map, MAP_SCHEMA),
        spark.createDataFrame(prev_assignment, ASSIGNMENT),
        spark.createDataFrame([("g", 8)], PARTS),
        spark.createDataFrame([("g", 4)], PARTS),
        spark.createDataFrame([("g", 5)], PARTS),
        spark.createDataFrame([("g",)], "group_name string"),
    )
    assert {tuple(r) for r in unsettled.collect()} == {
        ("g", 1), ("g", 3), ("g", 4), ("g", 5), ("g", 6), ("g", 7), ("g", 8), ("h", 0)
    }


def test_carried_rows_are_the_settled_partitions_of_running_groups_in_range(spark: SparkSession) -> None:
    prev = spark.createDataFrame(
        [("g", 0, 0, "n1"), ("g", 1, 0, "n1"), ("g", 2, 0, "n1"), ("h", 0, 0, "n1"), ("s", 0, 0, "n1")], IDEAL
    )
    groups = spark.createDataFrame([("g", 2), ("h", 4)], "group_name string, partitions int")  # g shrank to 2
    rows = settled.carried(
        prev,
        spark.createDataFrame([("g", 1)], PARTS),
        groups,
        spark.createDataFrame([("g",)], "group_name string"),  # h restarted, s stopped: neither carries
    )
    assert [tuple(r) for r in rows.collect()] == [("g", 0, 0, "n1")]
