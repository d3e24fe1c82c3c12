"""A live Apache Ignite 2.17 cluster collected by `rebalancer ignite collect`, then exchanged (docs/IGNITE.md).

Each scenario drives a real cluster (tests/ignite/cluster.py: server nodes in one JVM, thin-client ports on
loopback) one step at a time; after every step the collector reads the cluster through its public interfaces only
(thin-client SQL views and the control utility), the exchange runs on what it wrote, and what the engine committed
must be what Ignite holds at that moment, read from Ignite's internals by the harness: the ideal assignment bit
for bit, the serving assignment (temporary primaries included), every copy's state (MOVING, OWNING, RENTING, LOST)
and the lost partitions, per group.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ignite.cluster import IgniteCluster
from tests.ignite.live import Collector, control_prefix, differences
from tests.interop.harness import missing_tools

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools())),
]

DOC_SQL = re.findall(r"```sql\n(.*?)```", (Path(__file__).resolve().parents[2] / "docs" / "IGNITE.md").read_text(),
                     re.S)
ZONES = {"n1": "a", "n2": "b", "n3": "a", "n4": "b", "n5": "c"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[IgniteCluster]:
    with IgniteCluster(tmp_path / "ignite") as live:
        yield live


def start(cluster: IgniteCluster, *nodes: str) -> dict[str, Any]:
    dump: dict[str, Any] = {}
    for n in nodes:
        dump = cluster.step({"op": "start", "node": n, "attributes": {"zone": ZONES[n]}})
    return dump


def agree(collector: Collector, dump: dict[str, Any]) -> None:
    """Collect, exchange, and hold the engine's newest version against Ignite's dump of the same moment."""
    collector.round()
    assert differences(dump, collector.warehouse) == {}


def test_a_steady_cluster_is_collected_as_ignite_places_it_and_an_unchanged_one_writes_nothing(
        spark: Any, cluster: IgniteCluster, tmp_path: Path) -> None:
    start(cluster, "n1", "n2", "n3")
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 64, "backups": 1})
    cluster.step({"op": "start_cache", "name": "zoned", "partitions": 32, "backups": 1, "exclude_neighbors": True})
    cluster.step({"op": "start_cache", "name": "everywhere", "partitions": 16, "mode": "REPLICATED"})
    dump = cluster.step({"op": "put", "cache": "orders", "keys": 500})
    collector = Collector(spark, cluster, tmp_path / "w")
    first, summaries = collector.round()
    assert first.servers == 3 and first.groups == 3 and summaries
    assert differences(dump, collector.warehouse) == {}
    again, more = collector.round()
    assert not again.changed and more == []


def test_a_join_shows_moving_copies_and_temporary_primaries_then_the_switch(
        spark: Any, cluster: IgniteCluster, tmp_path: Path) -> None:
    start(cluster, "n1", "n2", "n3")
    # rebalanced only on demand: the MOVING copies and the temporary primaries stay visible until `rebalance`
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 64, "backups": 1, "rebalance_delay": -1})
    dump = cluster.step({"op": "put", "cache": "orders", "keys": 500})
    collector = Collector(spark, cluster, tmp_path / "w")
    agree(collector, dump)
    joined = start(cluster, "n4")
    late, ideal = joined["groups"]["orders"]["late"], joined["groups"]["orders"]["ideal"]
    assert late != ideal  # Ignite serves from the old owners while n4 fills
    agree(collector, joined)
    moving = [p for p, state, _c, _s in joined["groups"]["orders"]["local"]["n4"] if state == "MOVING"]
    assert moving
    switched = cluster.step({"op": "rebalance"})
    agree(collector, switched)
    assert switched["groups"]["orders"]["late"] == switched["groups"]["orders"]["ideal"]


@pytest.mark.parametrize("persistent", [False, True], ids=["in-memory", "persistent"])
def test_a_killed_node_promotes_backups_then_its_copies_are_rebuilt(
        spark: Any, cluster: IgniteCluster, tmp_path: Path, persistent: bool) -> None:
    for n in ("n1", "n2", "n3", "n4"):
        cluster.step({"op": "start", "node": n, "persistence": persistent, "attributes": {"zone": ZONES[n]}})
    if persistent:
        cluster.step({"op": "activate"})
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 64, "backups": 1, "rebalance_delay": -1})
    dump = cluster.step({"op": "put", "cache": "orders", "keys": 500})
    # a persistent cluster keeps its baseline (Ignite's default there): the killed node's copies wait for it
    collector = Collector(spark, cluster, tmp_path / "w", {"baseline": {"auto_adjust": not persistent}})
    agree(collector, dump)
    killed = cluster.step({"op": "kill", "node": "n2"})
    agree(collector, killed)
    agree(collector, cluster.step({"op": "rebalance"}))


@pytest.mark.parametrize("policy", ["READ_WRITE_SAFE", "READ_ONLY_SAFE", "IGNORE"])
def test_without_backups_a_kill_loses_partitions_under_each_loss_policy_and_a_reset_restores_them(
        spark: Any, cluster: IgniteCluster, tmp_path: Path, policy: str) -> None:
    start(cluster, "n1", "n2", "n3")
    cluster.step({"op": "start_cache", "name": "single", "partitions": 32, "backups": 0, "loss_policy": policy})
    dump = cluster.step({"op": "put", "cache": "single", "keys": 300})
    collector = Collector(spark, cluster, tmp_path / "w")
    agree(collector, dump)
    killed = cluster.step({"op": "kill", "node": "n2"})
    if policy != "IGNORE":
        assert killed["lost"]["single"]
    agree(collector, killed)
    if policy != "IGNORE":
        agree(collector, cluster.step({"op": "reset_lost", "caches": ["single"]}))


def test_a_baseline_node_that_stops_and_returns_moves_nothing_in_a_persistent_cluster(
        spark: Any, cluster: IgniteCluster, tmp_path: Path) -> None:
    for n in ("n1", "n2", "n3"):
        cluster.step({"op": "start", "node": n, "persistence": True, "attributes": {"zone": ZONES[n]}})
    cluster.step({"op": "activate"})
    cluster.step({"op": "start_cache", "name": "ledger", "partitions": 32, "backups": 1})
    dump = cluster.step({"op": "put", "cache": "ledger", "keys": 300})
    collector = Collector(spark, cluster, tmp_path / "w", {"baseline": {"auto_adjust": False}})
    first, _ = collector.round()
    assert differences(dump, collector.warehouse) == {}
    groups = collector.warehouse.read_arrow("cache_groups").to_pylist()
    assert [g["persistent"] for g in groups] == [True]
    stopped = cluster.step({"op": "stop", "node": "n3"})
    agree(collector, stopped)
    plan = collector.warehouse.read_arrow("migration_plan").num_rows
    assert plan == 0  # a baseline node away: its copies wait for it, nothing is copied elsewhere
    back = cluster.step({"op": "start", "node": "n3", "persistence": True, "attributes": {"zone": "a"}})
    agree(collector, back)
    agree(collector, cluster.step({"op": "rebalance"}))


def idle_verify_conflicts(cluster: IgniteCluster) -> dict[tuple[str, int], dict[str, int]]:
    """Ignite's own ``control.sh --cache idle_verify``: its update counter conflicts as (group, partition) ->
    consistent id -> counter (its exit code is 0 with or without conflicts: the text says)."""
    out = subprocess.run([*cluster.control_command(), "--cache", "idle_verify"], capture_output=True, text=True,
                         timeout=120).stdout
    conflicts: dict[tuple[str, int], dict[str, int]] = {}
    section = out.split("Update counter conflicts:", 1)[1].split("Hash conflicts:", 1)[0] if \
        "Update counter conflicts:" in out else ""
    key: tuple[str, int] | None = None
    for line in section.splitlines():
        head = re.search(r"grpName=([^,]+), partId=(\d+)", line)
        if line.startswith("Conflict partition:") and head:
            key = (head.group(1), int(head.group(2)))
        elif line.startswith("Partition instances:") and key is not None:
            conflicts[key] = {m.group(1): int(m.group(2))
                              for m in re.finditer(r"consistentId=([^,]+), updateCntr=(\d+)", line)}
    assert ("no conflicts have been found" in out) == (not conflicts), out
    return conflicts


@pytest.mark.parametrize("persistent", [False, True], ids=["in-memory", "persistent"])
def test_a_diverged_copy_is_a_counter_conflict_the_collect_and_idle_verify_report_alike(
        spark: Any, cluster: IgniteCluster, tmp_path: Path, persistent: bool) -> None:
    for n in ("n1", "n2", "n3"):
        cluster.step({"op": "start", "node": n, "persistence": persistent, "attributes": {"zone": ZONES[n]}})
    if persistent:
        cluster.step({"op": "activate"})
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 16, "backups": 1})
    dump = cluster.step({"op": "put", "cache": "orders", "keys": 200})
    collector = Collector(spark, cluster, tmp_path / "w", {"baseline": {"auto_adjust": not persistent}})
    first, _ = collector.round()
    assert first.conflicts == () and idle_verify_conflicts(cluster) == {}
    assert differences(dump, collector.warehouse) == {}
    backup = dump["groups"]["orders"]["ideal"][3][1]
    name = next(n["name"] for n in dump["nodes"] if n["consistent_id"] == backup)
    cluster.step({"op": "diverge", "cache": "orders", "partition": 3, "node": name, "delta": 3, "mode": "counter"})
    seen = collector.collect()
    assert seen.appended["partition_reports"] == 1
    assert {(c.group, c.partition): c.counters for c in seen.conflicts} == idle_verify_conflicts(cluster) != {}
    # Ignite's next exchange (a node joins) raises the lower counter to the highest (sizes agree): the conflict is
    # gone on both sides, and the engine's version agrees with Ignite's copies
    joined = cluster.step({"op": "start", "node": "n4", "persistence": persistent, "attributes": {"zone": "b"}})
    after, _ = collector.round()
    assert after.conflicts == () and idle_verify_conflicts(cluster) == {}
    assert differences(joined, collector.warehouse) == {}


def test_what_if_on_a_collected_cluster_foretells_what_ignite_reports_when_its_worst_node_dies(
        spark: Any, cluster: IgniteCluster, tmp_path: Path) -> None:
    from rebalancer.explain import describe, explain
    from rebalancer.what_if import what_if

    start(cluster, "n1", "n2", "n3", "n4")
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 64, "backups": 1, "rebalance_delay": -1})
    cluster.step({"op": "start_cache", "name": "scratch", "partitions": 32, "backups": 0, "rebalance_delay": -1})
    cluster.step({"op": "put", "cache": "orders", "keys": 400})
    dump = cluster.step({"op": "put", "cache": "scratch", "keys": 200})
    collector = Collector(spark, cluster, tmp_path / "w")
    agree(collector, dump)
    run = what_if(spark, collector.warehouse, collector.settings, sweeps=["nodes"])
    worst = run.rows.to_pylist()[0]
    victim_id = worst["scenario"].split()[-1]
    victim = next(n["name"] for n in dump["nodes"] if n["consistent_id"] == victim_id)
    killed = cluster.step({"op": "kill", "node": victim})
    lost = sum(len(p) for p in killed["lost"].values())
    moving = sum(1 for g in killed["groups"].values() for rows in g["local"].values() for _p, state, _c, _s in rows
                 if state == "MOVING")
    assert (worst["lost_partitions"], worst["copies"]) == (lost, moving) and lost > 0 and moving > 0
    agree(collector, killed)
    # explain names the real cause of a collected MOVING copy and of a lost partition
    local = killed["groups"]["orders"]["local"]
    node, p = next((n["consistent_id"], r[0]) for n in killed["nodes"] if n["alive"] for r in local[n["name"]]
                   if r[1] == "MOVING")
    moving_why = " ".join(describe(explain(collector.warehouse, collector.settings, "orders", p, node=node)))
    assert "MOVING" in moving_why and "COPY" in moving_why, moving_why
    lost_p = killed["lost"]["scratch"][0]
    lost_why = " ".join(describe(explain(collector.warehouse, collector.settings, "scratch", lost_p)))
    assert "lost" in lost_why.lower() and "READ_WRITE_SAFE" in lost_why, lost_why
    # docs/IGNITE.md's ready SQL runs on the collected cluster and answers what the dump says
    collector.warehouse.register_views()
    one_owner, primaries, changes, conflicts = [spark.sql(q).collect() for q in DOC_SQL]
    owners: dict[tuple[str, int], int] = {}
    for g, group in killed["groups"].items():
        for rows in group["local"].values():
            for p, state, _c, _s in rows:
                owners[(g, p)] = owners.get((g, p), 0) + (state == "OWNING")
    assert {(r.group_name, r.partition_id) for r in one_owner} == {k for k, n in owners.items() if n == 1} != set()
    served = sum(1 for g in killed["groups"].values() for nodes in g["late"] if nodes)
    assert sum(r.primaries for r in primaries) == served and changes and conflicts == []


def test_a_group_the_engine_cannot_read_is_skipped_with_a_rejected_row_until_its_filter_is_named(
        spark: Any, cluster: IgniteCluster, tmp_path: Path) -> None:
    start(cluster, "n1", "n2", "n3", "n4")
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 32, "backups": 1})
    dump = cluster.step({"op": "start_cache", "name": "zoned", "partitions": 32, "backups": 1,
                         "backup_filter": ["zone"]})
    blind = Collector(spark, cluster, tmp_path / "blind")
    result, _ = blind.round()
    assert set(result.skipped) == {"zoned"} and "[ignite.backup_filters]" in result.skipped["zoned"]
    rejected = blind.warehouse.read_arrow("rejected_rows").to_pylist()
    assert [(r["table_name"], r["reason"]) for r in rejected] == [("cache_groups", result.skipped["zoned"])]
    assert differences(dump, blind.warehouse, ["orders"]) == {}
    again, _ = blind.round()  # recorded once
    assert blind.warehouse.read_arrow("rejected_rows").num_rows == 1 and not again.changed
    named = Collector(spark, cluster, tmp_path / "named", {"ignite": {"backup_filters": {"zoned": ["zone"]}}})
    result, _ = named.round()
    assert result.skipped == {}
    assert differences(dump, named.warehouse) == {}


def test_the_cli_collects_a_live_cluster_and_says_in_one_sentence_when_it_cannot(
        cluster: IgniteCluster, tmp_path: Path) -> None:
    import json
    import os
    import sys

    start(cluster, "n1", "n2")
    cluster.step({"op": "start_cache", "name": "orders", "partitions": 16, "backups": 1})
    host, port = cluster.host_port()
    conf = tmp_path / "ignite.toml"
    conf.write_text(f"[ignite]\ncontrol = {json.dumps(control_prefix(cluster))}\n")
    cli = [sys.executable, "-m", "rebalancer.entry", "--warehouse", str(tmp_path / "w"), "--conf", str(conf)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([*cli, "init"], capture_output=True, text=True, timeout=300, env=env, check=True)
    done = subprocess.run([*cli, "ignite", "collect", "--host", host, "--port", str(port)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 servers, 0 clients, 1 cache groups, 16 partitions; appended" in done.stdout, done.stdout
    # the spark-submit entry on the same warehouse: the cluster did not change, nothing is written
    job = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "jobs" / "ignite.py"), "collect",
                          "--host", host, "--port", str(port), "--warehouse", str(tmp_path / "w"), "--conf", str(conf)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert job.returncode == 0 and "appended nothing (unchanged)" in job.stdout, job.stdout + job.stderr[-2000:]
    refused = subprocess.run([*cli, "ignite", "collect", "--port", "1"], capture_output=True, text=True,
                             timeout=300, env=env)
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "no Ignite node answered the thin-client protocol at 127.0.0.1:1" in refused.stderr
