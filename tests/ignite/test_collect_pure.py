"""The Ignite collector's mapping without a cluster or Spark: snapshot + stored rows -> the rows to write."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from rebalancer.collecting import Collected, Stored, stored_of
from rebalancer.ignite.collect import Mapping, desired_rows
from rebalancer.ignite.read import (
    MACS,
    IgniteCopy,
    IgniteGroup,
    IgniteNode,
    IgniteSnapshot,
    IgniteVersionError,
    parse_affinity,
    parse_distribution,
    require_2x,
)

NOW = datetime(2026, 11, 28, tzinfo=UTC)
AFFINITY = ("RendezvousAffinityFunction [parts=4, exclNeighbors=false, exclNeighborsWarn=false, backupFilter=null, "
            "affinityBackupFilter=null, ignite=IgniteKernal [cfg=...], log=...]")
FILTERED = AFFINITY.replace("affinityBackupFilter=null",
                            "affinityBackupFilter=org.apache.ignite.cache.affinity.rendezvous."
                            "ClusterNodeAttributeAffinityBackupFilter@5e4c3a2")


def node(i: int, order: int | None = None, client: bool = False, **attrs: str) -> IgniteNode:
    return IgniteNode(f"0000000{i}-0000-0000-0000-000000000000", f"n{i}", order or i, client, "2.17.0",
                      {MACS: f"mac{i}", "java.version": "17", **attrs})


def group(name: str = "orders", affinity: str = AFFINITY, **kw: object) -> IgniteGroup:
    base = IgniteGroup(1, name, "PARTITIONED", 4, 1, affinity, None, "READ_WRITE_SAFE", "default", False)
    return replace(base, **kw)  # type: ignore[arg-type]


def copies(nodes: list[IgniteNode], counter: int = 10, name: str = "orders") -> tuple[IgniteCopy, ...]:
    """Each of 4 partitions on two of the nodes, round robin, the first primary."""
    out = []
    for p in range(4):
        for k in range(2):
            n = nodes[(p + k) % len(nodes)]
            out.append(IgniteCopy(name, p, n.node_uuid, "OWNING", k == 0, counter, counter // 2))
    return tuple(out)


def snapshot(nodes: list[IgniteNode], groups: list[IgniteGroup] | None = None, active: bool = True,
             baseline: tuple[str, ...] | None = None, cps: tuple[IgniteCopy, ...] | None = None) -> IgniteSnapshot:
    servers = [n for n in nodes if not n.is_client]
    return IgniteSnapshot("2.17.0", active, tuple(nodes), tuple(groups or [group()]), baseline,
                          copies(servers) if cps is None else cps)


def stored_after(*collected: Collected) -> Stored:
    """What the warehouse says once these collects were written (upserts on their keys, as collecting.write)."""
    nodes: dict[str, dict[str, object]] = {}
    groups: dict[str, dict[str, object]] = {}
    events, reports = [], []
    for c in collected:
        nodes |= {r["node_id"]: r for r in c.nodes}
        groups |= {r["group_name"]: r for r in c.cache_groups}
        events += c.topology_events
        reports += c.partition_reports
    return stored_of(list(nodes.values()), list(groups.values()), events, reports)


def kinds(c: Collected) -> list[tuple[str, str | None]]:
    return [(e["event_type"], e["node_id"] or e["group_name"]) for e in c.topology_events]


def test_the_affinity_text_gives_the_function_partitions_and_filters() -> None:
    plain = parse_affinity(AFFINITY)
    assert (plain.function, plain.partitions, plain.exclude_neighbors) == ("RendezvousAffinityFunction", 4, False)
    assert plain.backup_filter is None and plain.affinity_backup_filter is None
    filtered = parse_affinity(FILTERED.replace("exclNeighbors=false", "exclNeighbors=true"))
    assert filtered.exclude_neighbors and filtered.affinity_backup_filter == "ClusterNodeAttributeAffinityBackupFilter"


def test_the_distribution_output_gives_one_row_per_copy_with_its_group() -> None:
    text = """Control utility [ver. 2.17.0#20250209-sha1:d53d4540]
User: root
Command [CACHE] started
Arguments: --host 127.0.0.1 --port 49280 --cache distribution null
--------------------------------------------------------------------------------
[groupId,partition,nodeId,primary,state,updateCounter,partitionSize,nodeAddresses]
[next group: id=-1006302412, name=orders]
-1006302412,0,0c4e0a4b,P,OWNING,7,7,[127.0.0.1]
-1006302412,0,7e9a41cd,B,MOVING,7,0,[127.0.0.1]
[next group: id=98, name=b]
98,3,7e9a41cd,P,LOST,0,0,[127.0.0.1]
Command [CACHE] finished with code: 0
Control utility has completed execution at: 2026-11-28T03:53:46.303
Execution time: 491 ms
"""
    rows = parse_distribution(text)
    assert [(r["group_name"], r["partition"], r["node"], r["primary"], r["state"], r["update_counter"], r["size"])
            for r in rows] == [("orders", 0, "0c4e0a4b", True, "OWNING", 7, 7),
                               ("orders", 0, "7e9a41cd", False, "MOVING", 7, 0),
                               ("b", 3, "7e9a41cd", True, "LOST", 0, 0)]


def test_the_first_collect_writes_every_node_group_and_copy_then_nothing_again() -> None:
    nodes = [node(1), node(2), node(3), node(4, client=True)]
    first = desired_rows(snapshot(nodes), Stored(), Mapping(), NOW)
    rows = first.rows
    assert [r["node_id"] for r in rows.nodes] == ["n1", "n2", "n3", "n4"]
    assert rows.nodes[0]["host"] == "mac1" and rows.nodes[0]["attributes"] == {}  # system attributes not kept
    assert rows.nodes[3]["is_client"] and rows.nodes[0]["node_uuid"] == nodes[0].node_uuid
    (g,) = rows.cache_groups
    assert (g["affinity"], g["partitioner"], g["partitions"], g["backups"], g["persistent"]) == \
        ("ignite", "ignite", 4, 1, False)
    assert kinds(rows) == [("NODE_JOINED", "n1"), ("NODE_JOINED", "n2"), ("NODE_JOINED", "n3"),
                           ("NODE_JOINED", "n4"), ("CLUSTER_ACTIVATED", None)]
    assert len(rows.partition_reports) == 8 and {r["is_primary"] for r in rows.partition_reports} == {True, False}
    assert all(r["bytes"] == r["size"] * 1024 for r in rows.partition_reports)
    again = desired_rows(snapshot(nodes), stored_after(rows), Mapping(), NOW)
    assert again.rows.empty


def test_a_node_gone_leaves_and_a_new_one_joins_with_all_its_copies() -> None:
    three = [node(1), node(2), node(3)]
    first = desired_rows(snapshot(three), Stored(), Mapping(), NOW).rows
    after = [node(1), node(3), node(5, order=5)]
    moved = snapshot(after)
    rows = desired_rows(moved, stored_after(first), Mapping(), NOW).rows
    assert kinds(rows) == [("NODE_LEFT", "n2"), ("NODE_JOINED", "n5")]
    assert {r["node_id"] for r in rows.partition_reports if r["state"] != "EVICTED"} >= {"n5"}
    assert all(r["node_id"] != "n2" for r in rows.partition_reports)  # a gone node's copies leave with it
    assert [e["event_seq"] for e in rows.topology_events] == [5, 6]


def test_a_copy_gone_from_a_live_node_is_evicted_and_a_changed_one_reported() -> None:
    nodes = [node(1), node(2)]
    first = desired_rows(snapshot(nodes), Stored(), Mapping(), NOW).rows
    kept = [c for c in copies(nodes) if not (c.node_uuid == nodes[1].node_uuid and c.partition == 0)]
    kept = [replace(c, update_counter=11) if c.partition == 1 and c.primary else c for c in kept]
    rows = desired_rows(snapshot(nodes, cps=tuple(kept)), stored_after(first), Mapping(), NOW).rows
    assert sorted((r["node_id"], r["partition_id"], r["state"], r["update_counter"]) for r in rows.partition_reports) \
        == [("n2", 0, "EVICTED", 10), ("n2", 1, "OWNING", 11)]


def test_groups_the_engine_does_not_model_are_skipped_with_a_reason() -> None:
    groups = [group("plain"), group("zoned", FILTERED), group("other", AFFINITY.replace(
        "RendezvousAffinityFunction", "com.acme.MyAffinity")), group("filtered", node_filter="com.acme.OnlyBig@1"),
              group("local", mode="LOCAL"), group("ignite-sys-cache", mode="REPLICATED")]
    nodes = [node(1, zone="a"), node(2, zone="b")]
    out = desired_rows(snapshot(nodes, groups), Stored(), Mapping(), NOW)
    assert [g["group_name"] for g in out.rows.cache_groups] == ["plain"]
    assert set(out.skipped) == {"zoned", "other", "filtered", "local"}
    assert "[ignite.backup_filters]" in out.skipped["zoned"] and "MyAffinity" in out.skipped["other"]
    configured = desired_rows(snapshot(nodes, groups), Stored(), Mapping(backup_filters={"zoned": ["zone"]}), NOW)
    zoned = next(g for g in configured.rows.cache_groups if g["group_name"] == "zoned")
    assert zoned["backup_filter"] == ["zone"] and configured.rows.nodes[0]["attributes"] == {"zone": "a"}


def test_deactivation_and_activation_are_events_and_an_inactive_cluster_evicts_nothing() -> None:
    nodes = [node(1), node(2)]
    first = desired_rows(snapshot(nodes), Stored(), Mapping(), NOW).rows
    off = desired_rows(snapshot(nodes, active=False, cps=()), stored_after(first), Mapping(), NOW).rows
    assert kinds(off) == [("CLUSTER_DEACTIVATED", None)] and off.partition_reports == []
    on = desired_rows(snapshot(nodes), stored_after(first, off), Mapping(), NOW).rows
    assert kinds(on) == [("CLUSTER_ACTIVATED", None)]


def test_a_baseline_change_of_a_persistent_cluster_is_an_event() -> None:
    persistent = [group(persistent=True)]
    nodes = [node(1), node(2), node(3)]
    first = desired_rows(snapshot(nodes, persistent, baseline=("n1", "n2")), Stored(), Mapping(), NOW).rows
    assert [r["in_baseline"] for r in first.nodes] == [True, True, False]
    same = desired_rows(snapshot(nodes, persistent, baseline=("n1", "n2")), stored_after(first), Mapping(), NOW)
    assert same.rows.empty
    grown = desired_rows(snapshot(nodes, persistent, baseline=("n1", "n2", "n3")), stored_after(first), Mapping(),
                         NOW).rows
    assert kinds(grown) == [("BASELINE_CHANGED", None)]


def test_a_cluster_of_another_major_version_is_refused_in_one_sentence() -> None:
    require_2x(["2.17.0#20250209-sha1:d53d4540", "2.16.0"], "h:1")
    with pytest.raises(IgniteVersionError, match=r"^the cluster at h:1 runs Ignite 2.17.0, 3.0.0; the collector "
                                                 r"reads Ignite 2.x only$"):
        require_2x(["2.17.0#20250209-sha1:d53d4540", "3.0.0#x"], "h:1")
