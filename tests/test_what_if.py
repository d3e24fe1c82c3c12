"""``rebalancer what-if``: every scenario's figures equal what a real exchange of the same events commits.

Generated warehouses (5 servers in 3 zones, 2 groups x 32 partitions, 1 backup): a steady one; one in the middle
of a rebalance (node4 failed, its plan not carried out), where the unfinished plan's partitions are recomputed too
and node4 can join again; and a persistent one (``auto_adjust = false``: the baseline keeps the failed node4's
places empty). Each scenario is then run for real on a copy of the warehouse, and the figures are computed from the
committed tables with Spark SQL (not with what-if's code).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from rebalancer.config import Settings
from rebalancer.operations import generate_into
from rebalancer.pipeline import run_exchange
from rebalancer.producers import append_event
from rebalancer.storage import open_warehouse
from rebalancer.what_if import FIGURES, Scenario, ScenarioError, parse_scenario, sweep, what_if

PERSISTENT = {"baseline": {"auto_adjust": False}}  # the baseline keeps offline nodes: their places stay empty


def _settings(path: Path, **overrides: Any) -> Settings:
    return Settings().with_overrides(storage={"warehouse": str(path), "engine": "delta-rs"}, **overrides)


@pytest.fixture(scope="module")
def steady(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("what-if") / "steady"
    settings = _settings(path)
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=5, groups=2, partitions=32, backups=1, seed=7)
    run_exchange(spark, wh, settings)
    return path


@pytest.fixture(scope="module")
def rebalancing(spark: Any, steady: Path) -> Path:
    path = steady.parent / "rebalancing"
    shutil.copytree(steady, path)
    settings = _settings(path)
    wh = open_warehouse(spark, settings.storage)
    append_event(spark, wh, "NODE_FAILED", node_id="node4")
    [summary] = run_exchange(spark, wh, settings)
    assert summary.migrations > 0  # the plan is committed, not carried out: those partitions stay unsettled
    return path


def committed_figures(spark: Any, path: Path, scenario: Scenario, copy_to: Path, **overrides: Any) -> dict[str, Any]:
    """Run ``scenario`` for real on a copy of the warehouse; its figures from the committed tables."""
    shutil.copytree(path, copy_to)
    settings = _settings(copy_to, **overrides)
    wh = open_warehouse(spark, settings.storage)
    for kind, subject in scenario.events:
        node, group = (None, subject) if kind in ("CACHE_STARTED", "CACHE_STOPPED", "RESET_LOST_PARTITIONS") \
            else (subject, None)
        append_event(spark, wh, kind, node_id=node, group_name=group)
    [summary] = run_exchange(spark, wh, settings)
    version = f"topology_major = {summary.topology_major} AND topology_minor = {summary.topology_minor}"
    for name in ("partition_map", "ideal_assignment", "migration_plan", "topology", "cache_groups"):
        wh.read(name).createOrReplaceTempView(f"wi_{name}")
    [[copies]] = spark.sql(f"SELECT count(*) FROM wi_migration_plan WHERE {version} AND action = 'COPY'").collect()
    [[without_backup]] = spark.sql(f"""
        SELECT count(*) FROM (
          SELECT m.group_name, m.partition_id FROM wi_partition_map m JOIN wi_cache_groups g USING (group_name)
          WHERE {version.replace('topology', 'm.topology')} AND m.state = 'OWNING'
            AND (g.backups >= 1 OR g.mode = 'REPLICATED')
          GROUP BY m.group_name, m.partition_id HAVING count(*) = 1)""").collect()
    [[most, mean]] = spark.sql(f"""
        SELECT max(n), avg(n) FROM (
          SELECT t.node_id, count(i.node_id) AS n
          FROM (SELECT node_id FROM wi_topology WHERE {version} AND NOT is_client) t
          LEFT JOIN (SELECT node_id FROM wi_ideal_assignment WHERE {version}) i ON i.node_id = t.node_id
          GROUP BY t.node_id)""").collect()
    by_policy = sorted((r[0], r[1]) for r in wh.read("lost_partitions").where(version)
                       .groupBy("loss_policy").count().collect())
    return {
        "lost_by_policy": by_policy,
        "lost_partitions": summary.lost_partitions, "partitions_without_backup": without_backup, "copies": copies,
        "bytes_to_move": summary.bytes_to_move, "makespan_s": summary.makespan_s,
        "makespan_lower_bound_s": summary.makespan_lower_bound_s, "max_replicas_per_node": most,
        "mean_replicas_per_node": float(mean),
    }


def assert_agrees(spark: Any, path: Path, run: Any, tmp_path: Path, **overrides: Any) -> None:
    rows = run.rows.to_pylist()
    assert rows
    for i, row in enumerate(rows):
        expected = committed_figures(spark, path, parse_scenario(row["scenario"]), tmp_path / f"real-{i}",
                                     **overrides)
        assert {k: row[k] for k in (*FIGURES, "lost_by_policy")} == expected, row["scenario"]


def test_every_single_failure_and_every_zone_agree_with_real_exchanges(spark: Any, steady: Path,
                                                                          tmp_path: Path) -> None:
    settings = _settings(steady)
    wh = open_warehouse(spark, settings.storage)
    exchanges_before = wh.read("exchanges").count()
    run = what_if(spark, wh, settings, [parse_scenario("NODE_FAILED node0; NODE_FAILED node1")],
                  sweeps=["nodes", "zone"])
    assert run.base == (5, 0)
    assert [r["label"] for r in run.rows.to_pylist()].count("custom") == 1
    # zone2 holds node2 alone: the same events as "node node2", evaluated once under the first label
    assert sorted(r["label"] for r in run.rows.to_pylist() if r["label"] != "custom") == [
        "node node0", "node node1", "node node2", "node node3", "node node4", "zone zone0", "zone zone1"]
    # worst first: the scenarios that lose partitions lead
    lost = [r["lost_partitions"] for r in run.rows.to_pylist()]
    assert lost == sorted(lost, reverse=True) and lost[0] > 0 and lost[-1] == 0
    # nothing committed, the rows kept under the run's id
    assert wh.read("exchanges").count() == exchanges_before
    stored = wh.read("what_if").where(f"run_id = '{run.run_id}'").count()
    assert stored == run.rows.num_rows == 8
    assert_agrees(spark, steady, run, tmp_path)


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_scenarios_in_the_middle_of_a_rebalance_agree_with_real_exchanges(spark: Any, rebalancing: Path,
                                                                          tmp_path: Path, path: str) -> None:
    """Unfinished plan steps, a node that joins again, two more failures, a baseline event and a deactivation
    (which plans no movement). A sweep this small is evaluated on the driver; with ``driver_replicas = 0`` in one
    Spark pass: both agree with the real exchanges."""
    settings = _settings(rebalancing)
    wh = open_warehouse(spark, settings.storage)
    if path == "spark":
        wh.driver_replicas = 0
    scenarios = [parse_scenario(s) for s in (
        "NODE_FAILED node0", "NODE_FAILED node2; NODE_FAILED node3", "NODE_JOINED node4", "BASELINE_CHANGED",
        "CLUSTER_DEACTIVATED",
    )]
    run = what_if(spark, wh, settings, scenarios)
    assert run.base == (6, 0) and run.rows.num_rows == 5
    if run.spark_jobs is not None:  # counted on classic sessions: the Spark pass is one job or more, the driver none
        assert (run.spark_jobs > 0) == (path == "spark")
    recomputed = {r["scenario"]: r["recomputed_partitions"] for r in run.rows.to_pylist()}
    assert 0 < recomputed["NODE_FAILED node0"] < 64  # the failed node's partitions and the unfinished plan's
    assert_agrees(spark, rebalancing, run, tmp_path)


def test_a_persistent_cluster_with_an_offline_baseline_node_agrees_and_ships_its_placements_once(
    spark: Any, steady: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[baseline] auto_adjust = false`` and node4 failed: every scenario places the persistent groups over the
    baseline with node4's places empty. Its figures agree with real exchanges, and the scenarios share the
    baseline's matrices instead of shipping one placement per group each."""
    from rebalancer import what_if as module

    path = tmp_path / "persistent"
    shutil.copytree(steady, path)
    settings = _settings(path, **PERSISTENT)
    wh = open_warehouse(spark, settings.storage)
    append_event(spark, wh, "NODE_FAILED", node_id="node4")
    run_exchange(spark, wh, settings)
    pools: list[Any] = []

    class Recorded(module._Pool):  # the driver's pools of shared values (never shipped themselves)
        def __init__(self) -> None:
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(module, "_Pool", Recorded)
    run = what_if(spark, wh, settings, [parse_scenario(s) for s in (
        "NODE_FAILED node0", "NODE_FAILED node2; NODE_FAILED node3", "NODE_JOINED node4")])
    assert run.rows.num_rows == 3
    node_lists, matrices = pools
    # the failures list the baseline with node4: one node list and one matrix, shared by the two groups (placed
    # alike: the affinity does not salt with the group), where each scenario shipped two
    assert node_lists.values == [("node0", "node1", "node2", "node3", "node4")]
    assert len(matrices.values) == 1
    assert_agrees(spark, path, run, tmp_path, **PERSISTENT)


def test_a_server_holding_no_copy_fails_and_nothing_moves(spark: Any, tmp_path: Path) -> None:
    """A scenario that recomputes no partition still gets its row (the committed version's figures)."""
    path = tmp_path / "sparse"
    settings = _settings(path)
    wh = open_warehouse(spark, settings.storage)
    generate_into(spark, wh, settings, nodes=6, groups=1, partitions=2, backups=1, seed=7)
    run_exchange(spark, wh, settings)
    run = what_if(spark, wh, settings)
    rows = run.rows.to_pylist()
    assert len(rows) == 6
    idle = [r for r in rows if r["recomputed_partitions"] == 0]
    assert idle and all(r["copies"] == 0 and r["makespan_s"] == 0.0 for r in idle)
    expected = committed_figures(spark, path, parse_scenario(idle[0]["scenario"]), tmp_path / "real")
    assert {k: idle[0][k] for k in (*FIGURES, "lost_by_policy")} == expected


def test_a_scenario_an_exchange_would_reject_is_an_error_naming_it(spark: Any, rebalancing: Path) -> None:
    settings = _settings(rebalancing)
    wh = open_warehouse(spark, settings.storage)
    with pytest.raises(ScenarioError, match=r"scenario 'NODE_FAILED node4'.*not alive"):
        what_if(spark, wh, settings, [parse_scenario("NODE_FAILED node4")])
    with pytest.raises(ScenarioError, match="2 exchanges, not one"):
        what_if(spark, wh, settings, [parse_scenario("NODE_FAILED node1; BASELINE_CHANGED")])


# ---- without Spark ----


def test_scenario_text_round_trips_and_bad_text_says_why() -> None:
    s = parse_scenario(" node_failed node3 ;NODE_FAILED node7; CLUSTER_DEACTIVATED ")
    assert s.text == "NODE_FAILED node3; NODE_FAILED node7; CLUSTER_DEACTIVATED"
    assert parse_scenario("CACHE_STOPPED g1").events == (("CACHE_STOPPED", "g1"),)
    for bad, why in (("NODE_EXPLODED n1", "unknown event type"), ("NODE_FAILED", "takes a node id"),
                     ("BASELINE_CHANGED n1", "takes no argument"), (" ; ", "empty scenario")):
        with pytest.raises(ScenarioError, match=why):
            parse_scenario(bad)


def test_sweeps_fail_every_node_host_and_attribute_value() -> None:
    rows = {"a": {"host": "h1", "attributes": {"zone": "z1"}}, "b": {"host": "h1", "attributes": {"zone": "z2"}},
            "c": {"host": "h2", "attributes": None}}
    assert [s.text for s in sweep("nodes", ["a", "b", "c"], rows)] == [
        "NODE_FAILED a", "NODE_FAILED b", "NODE_FAILED c"]
    assert [(s.label, s.text) for s in sweep("hosts", ["a", "b", "c"], rows)] == [
        ("host h1", "NODE_FAILED a; NODE_FAILED b"), ("host h2", "NODE_FAILED c")]
    assert [(s.label, s.text) for s in sweep("zone", ["a", "b", "c"], rows)] == [
        ("zone z1", "NODE_FAILED a"), ("zone z2", "NODE_FAILED b")]
    with pytest.raises(ScenarioError, match="rack"):
        sweep("rack", ["a", "b", "c"], rows)


def test_cli_and_job_sweep_nodes_and_zones_and_print_the_worst_first(spark: Any, steady: Path, tmp_path: Path,
                                                                     capsys: Any) -> None:
    import runpy

    from rebalancer.cli import main

    w = tmp_path / "w"
    shutil.copytree(steady, w)
    earlier = open_warehouse(spark, _settings(w).storage).read_arrow("what_if")  # other tests' runs on `steady`

    def cli(*argv: str) -> tuple[int, str, str]:
        try:
            main(["--warehouse", str(w), *argv])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = cli("what-if", "--sweep", "nodes", "--sweep", "zone", "--top", "3")
    assert code == 0, err
    assert "what if, against version 5.0: 7 scenarios, worst first" in out
    assert "3 of 7 scenarios shown (4 more not shown; --top N); " in out and "nothing committed" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("lost"))
    assert lines[header + 1].split()[0] == "6" and "NODE_FAILED node1;" in lines[header + 1]  # zone1 loses most
    code, out, err = cli("what-if", "--scenario", "NODE_FAILD node1")
    assert code == 1 and err.count("error:") == 1 and "unknown event type 'NODE_FAILD'" in err
    code, out, err = cli("what-if", "--scenario", "NODE_JOINED node1")
    assert code == 1 and "scenario 'NODE_JOINED node1': NODE_JOINED for node 'node1', which is already alive" in err

    job = runpy.run_path(str(Path(__file__).parent.parent / "jobs" / "what_if.py"))
    job["main"](["--warehouse", str(w), "--scenario", "NODE_FAILED node0; NODE_FAILED node3"])
    assert "1 scenarios, worst first" in capsys.readouterr().out
    stored = open_warehouse(spark, _settings(w).storage).read_arrow("what_if")
    assert stored.num_rows == earlier.num_rows + 7 + 1
    assert len(set(stored.column("run_id").to_pylist()) - set(earlier.column("run_id").to_pylist())) == 2


@pytest.mark.parametrize("threshold", [1, 10**9])
def test_a_large_sweep_schedules_with_the_compiled_loop(spark: Any, steady: Path, threshold: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep evaluated on the driver that recomputes at least ``COMPILED_SCHEDULER_FROM_PARTITIONS`` partitions asks
    for the compiled loop for every plan (the loader itself, and that it changes no schedule, are held in
    tests/test_schedule_loop.py, after ``make compiled``); a smaller sweep leaves the loop to decide by plan size."""
    from rebalancer import what_if as module

    asked: list[bool] = []
    monkeypatch.setattr(module, "COMPILED_SCHEDULER_FROM_PARTITIONS", threshold)
    monkeypatch.setattr(module, "compile_for_every_plan", lambda: asked.append(True) or True)
    settings = _settings(steady)
    run = what_if(spark, open_warehouse(spark, settings.storage), settings, [parse_scenario("NODE_FAILED node0")],
                  write=False)
    assert run.rows.num_rows == 1
    assert bool(asked) == (threshold == 1)
