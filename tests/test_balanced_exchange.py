"""The ``balanced`` affinity in the exchange: balanced groups placed together, as the Spark-free client places them;
a failure continues from the previous placement, plans exactly the failed node's copies and keeps every node within
its cap."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rebalancer.client.affinity import (
    GroupSettings,
    InvalidGroupSettingsError,
    NodeSet,
    PreviousPlacement,
    assign,
    place_balanced,
)
from tests.exchange_scenarios import Cluster, force_spark_paths

BALANCED_GROUPS = [GroupSettings("a", 48, 1), GroupSettings("b", 48, 1), GroupSettings("c", 20, 2)]
SERVERS = [f"n{i}" for i in range(6)]


def _node_set(c: Cluster, alive: list[str]) -> NodeSet:
    rows = [r.asDict() for r in c.warehouse.read("nodes").collect() if r.node_id in alive]
    return NodeSet.from_rows(rows)


def _ideal(c: Cluster, version: tuple[int, int]) -> dict[str, list[list[str]]]:
    lists: dict[str, dict[int, list[tuple[int, str]]]] = {}
    for g, p, i, n in c.rows("ideal_assignment", version, "group_name", "partition_id", "replica_index", "node_id"):
        lists.setdefault(g, {}).setdefault(p, []).append((i, n))
    return {g: [[n for _, n in sorted(parts[p])] for p in sorted(parts)] for g, parts in lists.items()}


def _client_lists(nodes: NodeSet, spread: bool, previous: dict[str, list[list[str]]] | None = None
                  ) -> tuple[dict[str, list[list[str]]], Any]:
    placed = place_balanced(BALANCED_GROUPS, nodes, spread=spread,
                            previous=None if previous is None else PreviousPlacement.from_lists(previous))
    ids = nodes.node_ids
    lists = {g: [[ids[i] for i in row if i >= 0] for row in m] for g, m in placed.matrices.items()}
    return lists, placed


@pytest.mark.parametrize("spread", [True, False])
def test_balanced_groups_follow_the_client_through_a_failure(spark: Any, tmp_path: Path, spread: bool) -> None:
    c = Cluster.create(spark, tmp_path / "w", affinity={"balanced_spread": spread})
    for g in BALANCED_GROUPS:
        c.group(g.name, g.partitions, g.backups, affinity="balanced")
    c.group("r", 16, 1)  # a rendezvous group beside them keeps its own placement
    c.join(*SERVERS)
    [first] = c.exchange()
    v1 = (first.topology_major, first.topology_minor)
    before, _ = _client_lists(_node_set(c, SERVERS), spread)
    ideal = _ideal(c, v1)
    assert {g: ideal[g] for g in before} == before
    assert ideal["r"] == assign(_node_set(c, SERVERS), 16, 1)

    c.event("NODE_FAILED", "n2")
    [failed] = c.exchange()
    v2 = (failed.topology_major, failed.topology_minor)
    survivors = [n for n in SERVERS if n != "n2"]
    nodes = _node_set(c, survivors)
    after, placed = _client_lists(nodes, spread, previous=before)
    ideal = _ideal(c, v2)
    assert {g: ideal[g] for g in after} == after
    # every survivor within its cap of replicas and primaries (the algorithm's bound, docs/AFFINITY.md)
    replicas = Counter(n for g in after for row in after[g] for n in row)
    primaries = Counter(row[0] for g in after for row in after[g])
    for i, n in enumerate(nodes.node_ids):
        assert replicas[n] <= placed.replica_cap[i] and primaries[n] <= placed.primary_cap[i], n
    assert placed.overflow == 0 and placed.primary_overflow == 0
    # the plan copies exactly the replicas of the new placement whose node held no copy (every copy of v1 OWNING)
    plan = {(g, p, t) for g, p, a, t in c.rows("migration_plan", v2, "group_name", "partition_id", "action",
                                                 "target_node") if a == "COPY"}
    needed = {(g, p, n) for g in after for p, row in enumerate(after[g]) for n in row
              if n not in before[g][p] or n == "n2"}
    assert {k for k in plan if k[0] in after} == needed
    # ... which are exactly as many as the failed node held: no copy moves between two nodes that stay
    assert len(needed) == sum(row.count("n2") for g in before for row in before[g])


def test_a_balanced_group_cannot_be_placed_on_its_own() -> None:
    with pytest.raises(InvalidGroupSettingsError, match="assign_balanced"):
        assign(["n1", "n2", "n3"], 8, 1, affinity="balanced")


# ---------------------------------------------------------------- adopting a collected cluster (docs/KAFKA.md)


def _collected(c: Cluster, lists: dict[int, list[str]]) -> None:
    """Reports as a collector of a live cluster writes them: one OWNING copy per listed node, with its place in the
    cluster's own replica list in the extra ``replica_index`` column."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from rebalancer.tables import COLLECTED_COLUMNS, PARTITION_REPORTS, REPLICA_INDEX

    c.warehouse.add_columns("partition_reports", COLLECTED_COLUMNS["partition_reports"])
    rows = [{"node_id": n, "group_name": "k", "partition_id": p, "state": "OWNING", "update_counter": 7, "size": 7,
             "bytes": 70, "wal_history_counter": None, "report_seq": 1, REPLICA_INDEX: i}
            for p, nodes in lists.items() for i, n in enumerate(nodes)]
    schema = to_arrow_schema(PARTITION_REPORTS, timezone="UTC").append(pa.field(REPLICA_INDEX, pa.int32()))
    c.warehouse.append_arrow("partition_reports", pa.Table.from_pylist(rows, schema=schema))


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_a_collected_cluster_is_adopted_as_it_is_and_a_skew_is_evened_by_the_next_exchange(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path == "spark":
        force_spark_paths(monkeypatch)
    c = Cluster.create(spark, tmp_path / "w")
    c.group("k", 12, 1, affinity="balanced")
    c.join("1", "2", "3")
    # skewed as a cluster may be: every partition on brokers 1 and 2, broker 3 empty; primaries by Kafka's order
    skewed = {p: (["1", "2"] if p % 2 else ["2", "1"]) for p in range(12)}
    _collected(c, skewed)
    [adopted] = c.exchange()
    v1 = (adopted.topology_major, adopted.topology_minor)
    assert adopted.migrations == 0, "the first exchange adopts the cluster as it is"
    assert _ideal(c, v1)["k"] == [skewed[p] for p in range(12)]
    c.event("BASELINE_CHANGED")  # an operator's explicit "place over these servers again"
    [evened] = c.exchange()
    v2 = (evened.topology_major, evened.topology_minor)
    after = _ideal(c, v2)["k"]
    replicas = Counter(n for row in after for n in row)
    assert replicas == {"1": 8, "2": 8, "3": 8}, replicas
    moved = {p for p, row in enumerate(after) if set(row) != set(skewed[p])}
    assert len(moved) == 8 and all("3" in after[p] for p in moved), "only moves onto the empty broker"
    copies = {(p, t) for _, p, a, t in c.rows("migration_plan", v2, "group_name", "partition_id", "action",
                                              "target_node") if a == "COPY"}
    assert copies == {(p, "3") for p in moved}
