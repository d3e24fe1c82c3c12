"""rebalancer against a real Apache Kafka 4.4 cluster (KRaft, loopback): collect, adopt, plan, execute, until stable.

Each scenario that changes the cluster for good (a broker killed, added, drained) starts its own cluster (about
15 s); the others share one. Every warehouse is the suite's engine (delta-rs, or delta-spark in the storage tier).
Records are produced with acks=all before each change and read back, offsets and values, after the plan has run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rebalancer.inputs import latest_version
from rebalancer.kafka.admin import KafkaUnreachableError
from rebalancer.kafka.collect import CollectError
from rebalancer.kafka.drive import collect_cluster, execute_plan, planned_moves, run
from rebalancer.kafka.execute import ExecuteError
from rebalancer.pipeline import run_exchange
from rebalancer.producers import append_event
from rebalancer.tables import INPUT_TABLES, version_where
from tests.kafka.cluster import KafkaCluster, missing_tools
from tests.kafka.live import (
    ReassignmentSampler,
    create_topics,
    describe,
    ideal_lists,
    plan_rows,
    produce,
    records,
    wait_fenced,
    wait_until,
    wait_until_every_topic_in_sync,
    wait_until_in_sync,
    warehouse,
)

UNCLEAN_ELECTION = 1  # ElectionType.UNCLEAN of the ElectLeaders request
pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three brokers in racks a, b, c, shared by the tests that do not change the brokers."""
    with KafkaCluster(tmp_path_factory.mktemp("kafka-steady"), brokers=3, racks=["a", "b", "c"]) as cluster:
        yield cluster.start()


def _own(tmp_path: Path, brokers: int, racks: list[str | None] | None = None) -> KafkaCluster:
    return KafkaCluster(tmp_path / "kafka", brokers=brokers, racks=racks).start()


def _adopt(spark: Any, cluster: KafkaCluster, tmp_path: Path) -> tuple[Any, Any]:
    wh, settings = warehouse(spark, tmp_path / "warehouse")
    collect_cluster(wh, settings, cluster.bootstrap)
    summaries = run_exchange(spark, wh, settings)
    assert [s.migrations for s in summaries] == [0], "adopting a healthy cluster plans nothing"
    return wh, settings


def _versions(wh: Any) -> dict[str, int]:
    return {name: wh.table_version(name) for name in INPUT_TABLES}


# ---------------------------------------------------------------- adopting


def test_a_healthy_cluster_is_adopted_as_it_is_and_a_second_collect_writes_nothing(
        spark: Any, steady: KafkaCluster, tmp_path: Path) -> None:
    create_topics(steady, {"adopt-orders": (12, 2), "adopt-audit": (6, 3)})
    produce(steady, "adopt-orders", 600)
    wh, settings = warehouse(spark, tmp_path / "warehouse")
    first = collect_cluster(wh, settings, steady.bootstrap)
    assert first.appended["nodes"] == 3 and first.appended["topology_events"] == 3
    versions = _versions(wh)
    again = collect_cluster(wh, settings, steady.bootstrap)
    assert not again.changed and _versions(wh) == versions, "an unchanged cluster: nothing appended"
    summaries = run_exchange(spark, wh, settings)
    assert [(s.exchange_type, s.migrations, s.lost_partitions) for s in summaries] == [("ALL", 0, 0)]
    version = latest_version(wh)
    assert version is not None
    kafka = describe(steady, ["adopt-orders", "adopt-audit"])
    theirs = {(t, p): s["replicas"] for t, parts in kafka.items() for p, s in parts.items()}
    ours = ideal_lists(wh, version)
    assert {k: ours[k] for k in theirs} == theirs, "the ideal assignment is Kafka's own, preferred leader first"
    owning = {(r["group_name"], r["partition_id"], r["node_id"]) for r in
              wh.read_arrow("partition_map", where=version_where(version)).to_pylist() if r["state"] == "OWNING"}
    assert owning >= {(t, p, str(b)) for (t, p), bs in theirs.items() for b in bs}
    groups = {r["group_name"]: r for r in wh.read_arrow("cache_groups").to_pylist()}
    assert (groups["adopt-orders"]["backups"], groups["adopt-audit"]["backups"]) == (1, 2)
    assert groups["adopt-orders"]["backup_filter"] == ["zone"], "racks are zones: replicas kept in distinct racks"
    nodes = {r["node_id"]: r for r in wh.read_arrow("nodes").to_pylist()}
    assert {n: dict(r["attributes"])["zone"] for n, r in nodes.items()} == {"1": "a", "2": "b", "3": "c"}
    counters = {(r["group_name"], r["partition_id"]): r["update_counter"] for r in
                wh.read_arrow("partition_reports").to_pylist() if r["group_name"] == "adopt-orders"}
    assert sum(counters.values()) == 600, "each partition's counter is its high watermark"


def test_topics_created_and_grown_while_watched_are_adopted_too_and_nothing_is_rejected(
        spark: Any, steady: KafkaCluster, tmp_path: Path) -> None:
    from kafka.admin import NewPartitions

    from tests.kafka.live import admin

    create_topics(steady, {"grown-first": (4, 2)})
    wh, settings = _adopt(spark, steady, tmp_path)
    create_topics(steady, {"grown-later": (6, 2)})
    client = admin(steady)
    client.create_partitions({"grown-first": NewPartitions(total_count=8)})
    client.close()
    wait_until_in_sync(steady, {"grown-first": 8})
    wait_until_every_topic_in_sync(steady)  # the cluster is shared: it is collected whole
    collect_cluster(wh, settings, steady.bootstrap)
    summaries = run_exchange(spark, wh, settings)
    assert summaries and all(s.migrations == 0 for s in summaries), [(s.exchange_type, s.migrations)
                                                                       for s in summaries]
    version = latest_version(wh)
    assert version is not None
    kafka = describe(steady, ["grown-first", "grown-later"])
    theirs = {(t, p): s["replicas"] for t, parts in kafka.items() for p, s in parts.items()}
    ours = ideal_lists(wh, version)
    assert {k: ours.get(k) for k in theirs} == theirs, "new topics and partitions keep the placement Kafka gave"
    rows = [r["partitions"] for r in wh.read_arrow("cache_groups").to_pylist() if r["group_name"] == "grown-first"]
    assert rows == [8], "the topic's row is replaced, not appended beside the old one"
    assert wh.read_arrow("rejected_rows").num_rows == 0


def test_dry_run_prints_the_reassignment_json_kafka_reads(spark: Any, steady: KafkaCluster, tmp_path: Path) -> None:
    create_topics(steady, {"dry-run": (4, 2)})
    wh, settings = _adopt(spark, steady, tmp_path)
    assert planned_moves(wh).as_reassignment_json() == {"version": 1, "partitions": []}


def test_what_if_names_the_copies_each_broker_would_cost_and_explain_reads_a_collected_partition(
        spark: Any, steady: KafkaCluster, tmp_path: Path) -> None:
    from rebalancer.explain import describe as describe_answer
    from rebalancer.explain import explain
    from rebalancer.what_if import what_if

    create_topics(steady, {"whatif-pairs": (12, 2)})
    wh, settings = _adopt(spark, steady, tmp_path)
    run = what_if(spark, wh, settings, sweeps=["nodes"])
    by_broker = {r["label"]: r for r in run.rows.to_pylist()}
    kafka = describe(steady)
    for broker in (1, 2, 3):
        # a partition of 2 replicas that loses one gets a copy on the third broker (the only rack left);
        # one of 3 replicas on 3 brokers cannot be re-created anywhere
        expected = sum(broker in s["replicas"] for parts in kafka.values() for s in parts.values()
                       if len(s["replicas"]) == 2)
        row = by_broker[f"node {broker}"]
        assert (row["copies"], row["lost_partitions"]) == (expected, 0), (broker, row)
    answer = explain(wh, settings, "whatif-pairs", 3)
    lines = describe_answer(answer)
    replicas = kafka["whatif-pairs"][3]["replicas"]
    assert any(f"{replicas[0]}" in line and "OWNING" in line for line in lines), lines


def test_the_cli_collects_adopts_and_finds_the_cluster_stable(spark: Any, steady: KafkaCluster, tmp_path: Path,
                                                              capsys: Any) -> None:
    from tests.test_cli import run as cli

    create_topics(steady, {"cli-topic": (3, 2)})
    w = str(tmp_path / "w")
    code, out, err = cli(capsys, "--warehouse", w, "kafka", "collect", "--bootstrap", steady.bootstrap)
    assert code == 1 and "there is no warehouse at" in err  # only init and generate create one
    assert cli(capsys, "--warehouse", w, "init")[0] == 0
    code, out, err = cli(capsys, "--warehouse", w, "kafka", "collect", "--bootstrap", steady.bootstrap)
    assert code == 0, err
    assert "3 brokers" in out and "appended 3 nodes" in out, out
    code, out, err = cli(capsys, "--warehouse", w, "kafka", "collect", "--bootstrap", steady.bootstrap)
    assert code == 0 and "appended nothing (unchanged)" in out, out
    code, out, err = cli(capsys, "--warehouse", w, "kafka", "run", "--bootstrap", steady.bootstrap, "--until-stable")
    assert code == 0, err
    assert "stable: nothing left to move" in out, out
    code, out, _ = cli(capsys, "--warehouse", w, "kafka", "execute", "--dry-run")
    assert code == 0 and '"partitions": []' in out, out


# ---------------------------------------------------------------- bad input


def test_an_unreachable_cluster_is_one_sentence_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    wh, settings = warehouse(spark, tmp_path / "warehouse")
    with pytest.raises(KafkaUnreachableError) as raised:
        collect_cluster(wh, settings.with_overrides(kafka={"client_timeout_s": 3.0}), "127.0.0.1:1")
    assert "127.0.0.1:1" in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "warehouse").exists()


def test_a_broker_without_a_rack_among_racked_ones_is_refused_before_anything_is_written(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 3, ["a", "b", None]) as cluster:
        wh, settings = warehouse(spark, tmp_path / "warehouse")
        wh.create_tables(list(INPUT_TABLES))
        before = _versions(wh)
        with pytest.raises(CollectError, match=r"^broker 3 has no rack .* nothing was collected$"):
            collect_cluster(wh, settings, cluster.bootstrap)
        assert _versions(wh) == before


def test_a_topic_deleted_between_collect_and_execute_is_one_sentence_and_nothing_moves(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 3) as cluster:
        create_topics(cluster, {"kept": (6, 2), "deleted": (6, 2)})
        wh, settings = _adopt(spark, cluster, tmp_path)
        cluster.kill(3)
        wait_fenced(cluster, 3)
        collect_cluster(wh, settings, cluster.bootstrap)
        run_exchange(spark, wh, settings)
        planned = planned_moves(wh)
        assert {m.topic for m in planned.moves} == {"kept", "deleted"}
        from tests.kafka.live import admin

        client = admin(cluster)
        client.delete_topics(["deleted"])
        client.close()
        wait_until(lambda: "deleted" not in describe(cluster), 30, "topic deleted")
        before = describe(cluster, ["kept"])
        with pytest.raises(ExecuteError, match="deleted") as raised:
            execute_plan(wh, settings, cluster.bootstrap, planned)
        assert "\n" not in str(raised.value)
        assert describe(cluster, ["kept"]) == before


# ---------------------------------------------------------------- changes, planned and executed


def test_a_broker_killed_for_good_has_exactly_its_replicas_recreated_elsewhere_in_other_racks(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 4, ["a", "b", "a", "b"]) as cluster:
        create_topics(cluster, {"orders": (16, 2)})
        produce(cluster, "orders", 2000)
        before = records(cluster, "orders")
        wh, settings = _adopt(spark, cluster, tmp_path)
        held = {p for p, s in describe(cluster, ["orders"])["orders"].items() if 4 in s["replicas"]}
        cluster.kill(4)
        wait_fenced(cluster, 4)
        collect_cluster(wh, settings, cluster.bootstrap)
        (summary,) = run_exchange(spark, wh, settings)
        assert summary.lost_partitions == 0
        version = latest_version(wh)
        assert version is not None
        copies = [r for r in plan_rows(wh, version) if r["action"] == "COPY"]
        assert sorted(r["partition_id"] for r in copies) == sorted(held), "exactly the dead broker's replicas"
        racks = {1: "a", 2: "b", 3: "a", 4: "b"}
        isr_low: dict[int, int] = {}

        def sample(_in_flight: dict[int, int]) -> None:
            for p, s in describe(cluster, ["orders"])["orders"].items():
                isr_low[p] = min(isr_low.get(p, 9), len(s["isr"]))

        in_flight: list[dict[int, int]] = []
        with ReassignmentSampler(cluster) as kafka_saw:
            result, _ = execute_plan(wh, settings, cluster.bootstrap,
                                     on_poll=lambda seen: (in_flight.append(dict(seen)), sample(seen)))
        assert result.finished + result.already_done == len(held)
        assert max((max(s.values(), default=0) for s in in_flight), default=0) <= 2, "the per-broker cap"
        assert result.max_in_flight_per_broker <= 2
        assert kafka_saw.samples, "list_partition_reassignments was sampled during the execution"
        assert kafka_saw.most_per_broker() <= 2, "Kafka itself never listed more than the cap on one broker"
        after = describe(cluster, ["orders"])["orders"]
        for p, s in after.items():
            assert 4 not in s["replicas"] and len(s["replicas"]) == 2, (p, s)
            assert len({racks[b] for b in s["replicas"]}) == 2, f"partition {p} has both replicas in one rack: {s}"
            assert sorted(s["isr"]) == sorted(s["replicas"]), (p, s)
        assert min(isr_low.values(), default=1) >= 1, "no partition ever lost its last in-sync replica"
        assert records(cluster, "orders") == before, "every record, with its offset"
        rounds = run(spark, wh, settings, cluster.bootstrap, until_stable=True)
        assert rounds[-1].stable and len(rounds) <= 2


def test_a_new_broker_receives_its_fair_share_and_nothing_else_moves(spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 3) as cluster:
        create_topics(cluster, {"events": (24, 2)})
        produce(cluster, "events", 1200)
        before = records(cluster, "events")
        wh, settings = _adopt(spark, cluster, tmp_path)
        old = describe(cluster, ["events"])["events"]
        new = cluster.add_broker()
        rounds = run(spark, wh, settings, cluster.bootstrap, until_stable=True)
        assert rounds[-1].stable
        after = describe(cluster, ["events"])["events"]
        share = 24 * 2 / 4
        on_new = sum(new in s["replicas"] for s in after.values())
        assert int(share) - 1 <= on_new <= int(share) + 1, (on_new, share)
        for p, s in after.items():
            assert set(s["replicas"]) <= set(old[p]["replicas"]) | {new}, f"partition {p} moved between old brokers"
            assert len(s["replicas"]) == 2
        moved = sum(set(s["replicas"]) != set(old[p]["replicas"]) for p, s in after.items())
        assert moved == on_new, "only moves onto the new broker"
        assert records(cluster, "events") == before


def test_a_drained_broker_is_emptied_while_it_serves_and_its_shutdown_plans_nothing(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 3) as cluster:
        create_topics(cluster, {"logs": (12, 2)})
        produce(cluster, "logs", 600)
        before = records(cluster, "logs")
        wh, settings = _adopt(spark, cluster, tmp_path)
        append_event(spark, wh, "NODE_DRAINING", node_id="3")
        rounds = run(spark, wh, settings, cluster.bootstrap, until_stable=True)
        assert rounds[-1].stable
        assert all(s.lost_partitions == 0 for r in rounds for s in r.exchanges)
        after = describe(cluster, ["logs"])["logs"]
        assert all(3 not in s["replicas"] and len(s["replicas"]) == 2 for s in after.values()), after
        cluster.stop(3)
        wait_fenced(cluster, 3)
        result = collect_cluster(wh, settings, cluster.bootstrap)
        assert result.appended["topology_events"] == 1
        events = wh.read_arrow("topology_events").to_pylist()
        assert max(events, key=lambda e: e["event_seq"])["event_type"] == "NODE_LEFT"
        assert [s.migrations for s in run_exchange(spark, wh, settings)] == [0]
        assert records(cluster, "logs") == before


def test_a_skewed_cluster_is_adopted_as_it_is_and_evened_when_the_operator_asks(spark: Any, tmp_path: Path) -> None:
    from kafka.admin import NewTopic

    from tests.kafka.live import admin

    with _own(tmp_path, 3) as cluster:
        client = admin(cluster)  # every replica on brokers 1 and 2: broker 3 holds nothing
        client.create_topics([NewTopic("skewed", replica_assignments={p: [1, 2] if p % 2 else [2, 1]
                                                                      for p in range(12)})])
        client.close()
        wait_until_in_sync(cluster, {"skewed": 12})
        produce(cluster, "skewed", 600)
        before = records(cluster, "skewed")
        wh, settings = _adopt(spark, cluster, tmp_path)  # adopted as it is: no step
        append_event(spark, wh, "BASELINE_CHANGED")
        rounds = run(spark, wh, settings, cluster.bootstrap, until_stable=True)
        assert rounds[-1].stable
        after = describe(cluster, ["skewed"])["skewed"]
        held = {b: sum(b in s["replicas"] for s in after.values()) for b in (1, 2, 3)}
        assert held == {1: 8, 2: 8, 3: 8}, held
        assert all(set(s["replicas"]) <= {1, 2, 3} and len(s["replicas"]) == 2 for s in after.values())
        assert records(cluster, "skewed") == before


def test_a_stopped_broker_is_a_failure_until_its_operator_unregisters_it_then_a_leave(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 4) as cluster:
        create_topics(cluster, {"retire": (4, 2)})
        wh, settings = _adopt(spark, cluster, tmp_path)
        cluster.stop(4)  # a controlled shutdown: registered, fenced
        cluster.stop(3)
        wait_fenced(cluster, 4)
        wait_fenced(cluster, 3)
        cluster.unregister(3)  # decommissioned by its operator
        result = collect_cluster(wh, settings, cluster.bootstrap)
        assert result.appended["topology_events"] == 2
        events = sorted(wh.read_arrow("topology_events").to_pylist(), key=lambda e: e["event_seq"])[-2:]
        assert [(e["event_type"], e["node_id"]) for e in events] == [("NODE_LEFT", "3"), ("NODE_FAILED", "4")]


def test_a_partition_whose_every_in_sync_replica_died_is_lost(spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 3) as cluster:
        create_topics(cluster, {"fragile": (6, 2)})
        wh, settings = _adopt(spark, cluster, tmp_path)
        kafka = describe(cluster, ["fragile"])["fragile"]
        cluster.kill(1)
        cluster.kill(2)
        wait_fenced(cluster, 1)
        wait_fenced(cluster, 2)
        collect_cluster(wh, settings, cluster.bootstrap)
        (summary,) = run_exchange(spark, wh, settings)
        version = latest_version(wh)
        assert version is not None
        lost = {r["partition_id"] for r in wh.read_arrow("lost_partitions", where=version_where(version)).to_pylist()}
        assert lost == {p for p, s in kafka.items() if set(s["replicas"]) == {1, 2}}
        assert lost == {p for p, s in describe(cluster, ["fragile"])["fragile"].items() if s["leader"] < 0}
        assert summary.lost_partitions == len(lost)


def test_a_broker_killed_during_an_execution_is_planned_around_and_the_execution_finishes(
        spark: Any, tmp_path: Path) -> None:
    with _own(tmp_path, 4) as cluster:
        create_topics(cluster, {"payments": (8, 3)})
        produce(cluster, "payments", 1000)
        before = records(cluster, "payments")
        wh, settings = _adopt(spark, cluster, tmp_path)
        cluster.kill(4)
        wait_fenced(cluster, 4)
        collect_cluster(wh, settings, cluster.bootstrap)
        run_exchange(spark, wh, settings)
        planned = planned_moves(wh)
        onto_3 = [m for m in planned.moves if 3 in m.adds]
        assert onto_3, "some copy goes to broker 3"
        cluster.kill(3)  # still registered: Kafka accepts the moves onto it, and they never finish
        with pytest.raises(ExecuteError, match="still in flight") as raised:
            execute_plan(wh, settings.with_overrides(kafka={"execute_timeout_s": 15.0}), cluster.bootstrap, planned)
        assert "\n" not in str(raised.value)
        wait_fenced(cluster, 3)
        rounds = run(spark, wh, settings, cluster.bootstrap, until_stable=True)
        assert rounds[-1].stable
        events = wh.read_arrow("topology_events").to_pylist()
        failed = [e["node_id"] for e in events if e["event_type"] == "NODE_FAILED"]
        assert sorted(failed) == ["3", "4"]
        replanned = rounds[0].executed
        assert replanned is not None and replanned.submitted >= len(onto_3), "the stuck moves were re-targeted"
        after = describe(cluster, ["payments"])["payments"]
        assert all(sorted(s["replicas"]) == [1, 2] and sorted(s["isr"]) == [1, 2] for s in after.values()), after
        assert records(cluster, "payments") == before


def test_an_unclean_election_after_a_loss_moves_the_counter_back_and_the_loss_stays_until_reset(
        spark: Any, tmp_path: Path) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

    from tests.kafka.live import admin

    with _own(tmp_path, 3) as cluster:
        client = admin(cluster)
        client.create_topics([NewTopic("risky", replica_assignments={0: [1, 2]})])
        client.close()
        wait_until(lambda: describe(cluster, ["risky"])["risky"][0]["leader"] == 1, 30, "risky has its leader")
        produce(cluster, "risky", 100)
        wh, settings = _adopt(spark, cluster, tmp_path)
        cluster.kill(2)  # the follower first: broker 1 alone in the ISR
        wait_fenced(cluster, 2)
        wait_until(lambda: describe(cluster, ["risky"])["risky"][0]["isr"] == [1], 30, "ISR shrunk to broker 1")
        produce(cluster, "risky", 100)  # acknowledged by broker 1 alone
        collect_cluster(wh, settings, cluster.bootstrap)
        run_exchange(spark, wh, settings)
        cluster.kill(1)  # every in-sync replica is gone
        wait_fenced(cluster, 1)
        collect_cluster(wh, settings, cluster.bootstrap)
        (lost,) = run_exchange(spark, wh, settings)
        assert lost.lost_partitions == 1
        cluster.restart(2)  # out of sync: Kafka elects it only uncleanly
        client = admin(cluster)
        client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "risky",
                                             configs={"unclean.leader.election.enable": "true"})])
        client.close()

        def elected() -> bool:
            c = admin(cluster)
            try:
                c.elect_leaders(UNCLEAN_ELECTION, {"risky": [0]}, raise_errors=False)
            finally:
                c.close()
            return bool(describe(cluster, ["risky"])["risky"][0]["leader"] == 2)

        wait_until(elected, 60, "unclean election of 2")
        collect_cluster(wh, settings, cluster.bootstrap)
        run_exchange(spark, wh, settings)
        version = latest_version(wh)
        assert version is not None
        newest = {}
        for r in sorted(wh.read_arrow("partition_reports").to_pylist(), key=lambda r: r["report_seq"]):
            if r["group_name"] == "risky":
                newest[r["node_id"]] = r["update_counter"]
        assert newest == {"1": 200, "2": 100}, "broker 2 came back with 100 records: acknowledged writes are gone"
        still = wh.read_arrow("lost_partitions", where=version_where(version)).to_pylist()
        assert [r["group_name"] for r in still] == ["risky"], "lost stays lost until it is reset"
        append_event(spark, wh, "RESET_LOST_PARTITIONS", group_name="risky")
        run_exchange(spark, wh, settings)
        version = latest_version(wh)
        assert version is not None
        assert wh.read_arrow("lost_partitions", where=version_where(version)).num_rows == 0
        owned = [(r["node_id"], r["update_counter"]) for r in
                 wh.read_arrow("partition_map", where=version_where(version)).to_pylist() if r["state"] == "OWNING"]
        assert owned == [("2", 100)], "reset: the surviving copy owns, its counter 100 where the map held 200"
        assert len(records(cluster, "risky")) == 100


def test_the_walkthrough_notebooks_kafka_section_adopts_and_drives_a_reachable_cluster(
        steady: KafkaCluster, tmp_path: Path, monkeypatch: Any) -> None:
    import os

    import nbformat
    from nbclient import NotebookClient

    from tests.test_notebook import NOTEBOOK

    create_topics(steady, {"notebook": (6, 2)})
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("REBALANCER_WAREHOUSE", str(tmp_path / "w"))
    monkeypatch.setenv("REBALANCER_KAFKA_BOOTSTRAP", steady.bootstrap)
    for name, value in (("NODES", "4"), ("GROUPS", "1"), ("PARTITIONS", "16"), ("BACKUPS", "1")):
        monkeypatch.setenv(f"WALKTHROUGH_{name}", value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(NOTEBOOK.parent.parent),
                                                                   os.environ.get("PYTHONPATH")])))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    kafka = next(c for c in nb.cells if c.cell_type == "code" and "drive_kafka(" in c.source)
    text = "".join(o.get("text", "") for o in kafka.outputs)
    assert "adopted: [(" in text and ", 0)]" in text, text
    assert "kafka rounds: 1, stable: True" in text, text
