"""``rebalancer explain``: an answer for every partition of the exchange scenarios, agreeing with the tables, and the
reasons each scenario is about (temporary primary, lagging counters, HISTORICAL and FULL, losses, size mismatch, a
node's cap)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rebalancer.affinity.assign import assign_indexes
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.explain import ExplainError, _candidates, explain
from rebalancer.groups import GroupSettings
from tests.exchange_scenarios import Cluster
from tests.test_exchange_job import equal_counters_different_sizes, lagging_replicas
from tests.test_exchange_job import steady_three_nodes as steady


def every_answer_agrees_with_the_tables(c: Cluster, version: tuple[int, int]) -> dict[tuple[str, int], Any]:
    """explain() for every partition of every running group at ``version``, checked against the tables."""
    answers = {}
    keys = sorted(c.rows("partition_versions", version, "group_name", "partition_id"))
    assert keys
    for g, p in keys:
        e = explain(c.warehouse, c.settings, g, p, version)
        assert e["version"] == list(version)
        ideal = {(n, i) for gg, pp, n, i in c.rows("ideal_assignment", version, "group_name", "partition_id",
                                                   "node_id", "replica_index") if (gg, pp) == (g, p)}
        assert {(x["node"], x["replica_index"]) for x in e["candidates"] if x["taken"]} == ideal
        assert all(x["reason"] for x in e["candidates"])
        ranks = [x["rank"] for x in e["candidates"] if x["rank"] is not None]
        assert ranks == list(range(1, len(ranks) + 1))
        copies = {(n, s) for gg, pp, n, s in c.rows("partition_map", version, "group_name", "partition_id",
                                                    "node_id", "state") if (gg, pp) == (g, p)}
        assert {(x["node"], x["state"]) for x in e["copies"]} == copies
        assert all(x["reason"] for x in e["copies"])
        steps = {(s, a, src, dst) for gg, pp, s, a, src, dst in c.rows(
            "migration_plan", version, "group_name", "partition_id", "step", "action", "source_node", "target_node")
            if (gg, pp) == (g, p)}
        assert {(x["step"], x["action"], x["source"], x["target"]) for x in e["plan"]} == steps
        assert all(x["why"] and x["waited_for"] for x in e["plan"])
        primary = {n for gg, pp, i, n in c.rows("affinity_assignment", version, "group_name", "partition_id",
                                                "replica_index", "node_id") if (gg, pp, i) == (g, p, 0)}
        assert ({e["serving"]["primary"]} if e["serving"]["primary"] else set()) == primary
        lost = {(gg, pp) for gg, pp in c.rows("lost_partitions", version, "group_name", "partition_id")}
        assert (e["lost"] is not None) == ((g, p) in lost)
        json.dumps(e)  # --json prints it as it is
        answers[(g, p)] = e
    return answers


def test_a_join_explains_the_temporary_primary_and_what_the_switch_waits_for(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    c.exchange()
    answers = every_answer_agrees_with_the_tables(c, (4, 0))
    p3 = answers[("g", 3)]
    assert p3["serving"]["temporary"] and "n2 serves temporarily: the ideal primary n4 does not own yet (MOVING)" \
        in p3["serving"]["reason"]
    assert p3["serving"]["switch_waits_for"] == [{"node": "n4", "state": "MOVING"}]
    [n4] = [x for x in p3["copies"] if x["node"] == "n4"]
    assert n4["reason"].startswith("new ideal node") and n4["copy_planned"]
    assert [x["node"] for x in p3["candidates"] if x["taken"]] == ["n4", "n2"]
    assert [x["reason"] for x in p3["candidates"]][-1].startswith("not needed: the list had its 2 replicas")
    copy = next(s for s in p3["plan"] if s["action"] == "COPY")
    assert "FULL: the target holds no data" in copy["why"] and copy["waited_for"] == "nothing: it starts at once"
    promote = next(s for s in p3["plan"] if s["action"] == "PROMOTE")
    assert promote["waited_for"].startswith("step 1 of this partition")
    # --node keeps what involves that node; the latest version is the default
    only = explain(c.warehouse, c.settings, "g", 3, node="n1")
    assert {x["node"] for x in only["candidates"]} == {"n1"} and only["version"] == [4, 0]
    assert all("n1" in (s["source"], s["target"]) for s in only["plan"])


def test_lagging_copies_explain_historical_and_full(spark: Any, tmp_path: Path) -> None:
    c = lagging_replicas(spark, tmp_path / "w")
    c.exchange()
    answers = every_answer_agrees_with_the_tables(c, (3, 0))
    n1 = next(x for x in answers[("g", 0)]["copies"] if x["node"] == "n1")
    assert n1["reason"] == "counter 950 behind the highest 1000 by 50: reset to MOVING and rebalanced"
    [historical] = answers[("g", 0)]["plan"]
    assert historical["rebalance_mode"] == "HISTORICAL" and "replays 50 updates" in historical["why"]
    [full] = answers[("g", 1)]["plan"]
    assert "FULL: no supplier's WAL history reaches back to the target's counter 950" in full["why"]


def test_losses_and_size_mismatches_say_why(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w", partitions=3, groups={"rw": "READ_WRITE_SAFE", "ig": "IGNORE"})
    c.event("NODE_FAILED", node="n2")
    c.event("NODE_FAILED", node="n3")
    c.exchange()
    answers = every_answer_agrees_with_the_tables(c, (5, 0))
    lost = answers[("rw", 2)]
    assert lost["lost"]["loss_policy"] == "READ_WRITE_SAFE" and "reads are not allowed" in lost["lost"]["reason"]
    assert "under READ_WRITE_SAFE it stays LOST until RESET_LOST_PARTITIONS" in lost["copies"][0]["reason"]
    assert answers[("ig", 2)]["lost"]["read_allowed"] is True

    m = equal_counters_different_sizes(spark, tmp_path / "m")
    m.exchange()
    mismatch = every_answer_agrees_with_the_tables(m, (3, 0))[("g", 0)]
    assert all("SIZE_MISMATCH" in x["reason"] for x in mismatch["copies"])


def test_a_step_that_waits_for_a_node_at_its_cap_names_it(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w", partitions=4, migration={"max_parallel_per_node": 1})
    c.event("NODE_FAILED", node="n2")
    c.exchange()
    answers = every_answer_agrees_with_the_tables(c, (4, 0))
    waited = [s["waited_for"] for e in answers.values() for s in e["plan"]]
    assert any(w.startswith("a slot on n1: 1 migrations (its cap) ran there until") for w in waited), waited


def test_bad_questions_get_one_sentence(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w", partitions=4)
    with pytest.raises(ExplainError, match="group 'nope' was not running at version 3.0"):
        explain(c.warehouse, c.settings, "nope", 0)
    with pytest.raises(ExplainError, match="partitions 0..3, not 9"):
        explain(c.warehouse, c.settings, "g", 9)
    with pytest.raises(ExplainError, match=r"version 7.0 is not committed \(the latest is 3.0\)"):
        explain(c.warehouse, c.settings, "g", 0, (7, 0))


def test_cli_explain_prints_and_answers_json(spark: Any, tmp_path: Path, capsys: Any) -> None:
    from rebalancer.cli import main

    c = steady(spark, tmp_path / "w", partitions=4)
    c.join("n4")
    c.exchange()
    def cli(*argv: str) -> str:
        with pytest.raises(SystemExit) as done:
            main(["--warehouse", str(tmp_path / "w"), "explain", *argv])
        assert done.value.code in (0, None)
        return str(capsys.readouterr().out)

    out = cli("--group", "g", "--partition", "3")
    assert "g partition 3 at version 4.0" in out and "n2 serves temporarily" in out and "waited for:" in out
    answer = json.loads(cli("--group", "g", "--partition", "3", "--version", "3.0", "--json"))
    assert answer["version"] == [3, 0] and answer["plan"] == [] and not answer["serving"]["temporary"]


# ---- without Spark: the skip reasons of the placement walk ----


def test_neighbours_and_the_backup_filter_are_named() -> None:
    rows = [{"node_id": f"n{i}", "node_uuid": None, "node_order": i, "host": f"h{i // 2}",
             "attributes": {"zone": f"z{i % 2}"}, "capacity": 1.0, "is_client": False} for i in range(6)]
    nodes = {r["node_id"]: r for r in rows}
    node_set = NodeSet.from_rows(rows)
    exchange = {"draining_nodes": [], "baseline_nodes": None}
    for settings_row, words in (({"exclude_neighbors": True, "backup_filter": None}, "neighbour: same host"),
                                ({"exclude_neighbors": False, "backup_filter": ["zone"]}, "backup filter: zone =")):
        g = GroupSettings.from_row({"group_name": "g", "partitions": 32, "backups": 1, "mode": "PARTITIONED",
                                    "affinity": "rendezvous", "persistent": True, **settings_row})
        seen = False
        for p in range(32):
            matrix = assign_indexes(np.array([p]), node_set, g)
            ideal = [{"partition_id": p, "node_id": node_set.node_ids[i], "replica_index": k}
                     for k, i in enumerate(matrix[0]) if i >= 0]
            answer = _candidates(g, ideal, rows, nodes, exchange, Settings())
            assert [x["node"] for x in answer if x["taken"]] == [r["node_id"] for r in ideal]
            seen |= any(x["reason"].startswith(words) for x in answer)
        assert seen, words


def test_unequal_capacities_rank_by_the_weighted_score() -> None:
    rows = [{"node_id": f"n{i}", "node_uuid": None, "node_order": i, "host": f"h{i}", "attributes": None,
             "capacity": [1.0, 2.0, 0.5, 4.0][i], "is_client": False} for i in range(4)]
    nodes = {r["node_id"]: r for r in rows}
    node_set = NodeSet.from_rows(rows)
    g = GroupSettings.from_row({"group_name": "g", "partitions": 16, "backups": 1, "mode": "PARTITIONED",
                                "affinity": "rendezvous", "persistent": True, "exclude_neighbors": False,
                                "backup_filter": None})
    for p in range(16):
        matrix = assign_indexes(np.array([p]), node_set, g)
        ideal = [{"partition_id": p, "node_id": node_set.node_ids[i], "replica_index": k}
                 for k, i in enumerate(matrix[0])]
        answer = _candidates(g, ideal, rows, nodes, {"draining_nodes": [], "baseline_nodes": None}, Settings())
        scores = [x["score"] for x in answer]
        assert scores == sorted(scores, reverse=True)  # the rank is the score's order
        assert [x["node"] for x in answer[:2]] == [r["node_id"] for r in ideal]
        assert "capacity-weighted score" in answer[-1]["reason"]


def test_an_old_version_is_explained_with_the_nodes_and_groups_it_was_computed_from(spark: Any, tmp_path: Path) -> None:
    c = steady(spark, tmp_path / "w", partitions=4)
    before = [explain(c.warehouse, c.settings, "g", p, (3, 0)) for p in range(4)]
    # Since 3.0 every node moved to one host and the group gained a backup (no exchange has run since).
    nodes = c.warehouse.read_arrow("nodes")
    c.warehouse.replace_where_arrow("nodes", nodes.set_column(nodes.schema.get_field_index("host"), "host",
                                                              pa.array(["h-same"] * nodes.num_rows)), {})
    groups = c.warehouse.read_arrow("cache_groups")
    c.warehouse.replace_where_arrow("cache_groups", groups.set_column(
        groups.schema.get_field_index("backups"), "backups", pa.array([2] * groups.num_rows, pa.int32())), {})
    assert [explain(c.warehouse, c.settings, "g", p, (3, 0)) for p in range(4)] == before
