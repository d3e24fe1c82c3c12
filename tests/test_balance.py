"""``rebalancer balance``: per-node loads against capacity-weighted shares, and what ``balanced`` would move; exact
figures on small clusters built by hand, the CLI end to end (generate with ``--affinity``, exchange, balance)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rebalancer.balance import evaluate
from rebalancer.cli import main
from rebalancer.client.affinity import GroupSettings, NodeSet, assign, place_balanced
from rebalancer.tables import NODES
from tests.exchange_scenarios import Cluster


def _cluster(spark: Any, path: Path, capacities: dict[str, float], affinity: str | None) -> Cluster:
    c = Cluster.create(spark, path)
    c.group("g", 12, 1, affinity=affinity)
    c.group("r", 4, 0, mode="REPLICATED", affinity=affinity)
    rows = [(n, None, i + 1, f"h-{n}", {}, cap, False) for i, (n, cap) in enumerate(capacities.items())]
    c.warehouse.append("nodes", spark.createDataFrame(rows, NODES))
    for n in capacities:
        c.event("NODE_JOINED", node=n)
    c.exchange()
    return c


def test_loads_are_held_against_capacity_weighted_shares(spark: Any, tmp_path: Path) -> None:
    capacities = {"n1": 1.0, "n2": 1.0, "n3": 2.0}
    c = _cluster(spark, tmp_path / "w", capacities, None)
    report = evaluate(c.warehouse)
    rows = [{"node_id": n, "node_uuid": None, "node_order": i + 1, "host": f"h-{n}", "attributes": {},
             "capacity": cap} for i, (n, cap) in enumerate(capacities.items())]
    nodes = NodeSet.from_rows(rows)
    lists = assign(nodes, 12, 1)
    replicas = Counter(n for row in lists for n in row)  # the REPLICATED group counts for primaries only
    primaries = Counter(row[0] for row in lists) + Counter(row[0] for row in assign(nodes, 4, 0, mode="REPLICATED"))
    by_node = {n.node_id: n for n in report.nodes}
    for n, cap in capacities.items():
        assert by_node[n].replicas == replicas[n]
        assert by_node[n].replica_share == pytest.approx(24 * cap / 4)
        assert by_node[n].primaries == primaries[n]
        assert by_node[n].primary_share == pytest.approx(16 * cap / 4)
        assert by_node[n].bytes == 0  # a new group starts empty
    assert report.replica_ratio == pytest.approx(max(replicas[n] / (6 * cap) for n, cap in capacities.items()))
    assert [n.node_id for n in report.nodes][0] == max(capacities, key=lambda n: replicas[n] / capacities[n])
    # what balanced would move: its copies on nodes the current ideal does not name
    placed = place_balanced([GroupSettings("g", 12, 1), GroupSettings("r", 4, 0, "REPLICATED")], nodes, spread=True)
    ids = nodes.node_ids
    current = {("g", p, n) for p, row in enumerate(lists) for n in row}
    current |= {("r", p, n) for p in range(4) for n in ids}
    wanted = {(g, p, ids[i]) for g, m in placed.matrices.items() for p, row in enumerate(m) for i in row if i >= 0}
    assert report.balanced_copies == len(wanted - current)


def test_a_cluster_on_balanced_has_nothing_to_move(spark: Any, tmp_path: Path) -> None:
    c = _cluster(spark, tmp_path / "w", {"n1": 1.0, "n2": 1.0, "n3": 1.0, "n4": 1.0}, "balanced")
    report = evaluate(c.warehouse)
    assert report.balanced_copies == 0
    assert report.balanced_replica_ratio == pytest.approx(report.replica_ratio)
    assert report.idle_servers == 0


def test_nothing_committed_is_one_sentence(spark: Any, tmp_path: Path) -> None:
    c = Cluster.create(spark, tmp_path / "w")
    with pytest.raises(LookupError, match="no exchange has been committed yet"):
        evaluate(c.warehouse)
    c.group("g", 4, 0)
    c.join("n1")
    c.exchange()
    with pytest.raises(LookupError, match="9.9 is not a committed version"):
        evaluate(c.warehouse, (9, 9))


def test_cli_generate_balanced_then_balance(spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main(["--warehouse", w, *argv])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = run("generate", "--affinity", "fair")
    assert code == 2 and "must be one of rendezvous, ignite, balanced" in err
    run("generate", "--nodes", "6", "--groups", "3", "--partitions", "64", "--affinity", "balanced")
    assert run("exchange")[0] == 0
    code, out, _ = run("balance", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["balanced"]["copies"] == 0 and result["idle_servers"] == 0
    assert result["replica_ratio"] <= 1.05 + 1e-9 and len(result["nodes"]) == 6
    code, out, _ = run("balance", "--top", "2")
    assert code == 0 and "most loaded / share: replicas" in out and "would place 0 copies elsewhere" in out


def test_an_old_version_is_weighed_with_the_capacities_it_was_computed_from(spark: Any, tmp_path: Path) -> None:
    c = _cluster(spark, tmp_path / "w", {"n1": 1.0, "n2": 1.0, "n3": 2.0}, None)
    before = evaluate(c.warehouse, (3, 0))
    nodes = c.warehouse.read_arrow("nodes")  # since 3.0 n3's capacity went back to 1 (no exchange since)
    c.warehouse.replace_where_arrow("nodes", nodes.set_column(nodes.schema.get_field_index("capacity"), "capacity",
                                                              pa.array([1.0] * nodes.num_rows)), {})
    after = evaluate(c.warehouse, (3, 0))
    assert after == before
    assert {n.node_id: n.capacity for n in after.nodes} == {"n1": 1.0, "n2": 1.0, "n3": 2.0}
