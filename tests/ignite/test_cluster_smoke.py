"""The live Ignite 2.17 harness (tests/ignite/cluster.py) against the public interfaces a collector reads.

Three server nodes, one cache of 64 partitions with one backup, 1,000 keys, then a crash: the harness's dumps must
be self-consistent, and what the thin client's SQL system views and the control utility report must be what the
harness says Ignite holds. A second cluster checks that ``diverge`` makes one copy's update counter differ, as the
control utility's ``idle_verify`` sees it, and that a refused command leaves the JVM serving.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyignite import Client
from pyignite.datatypes import IntObject

from tests.ignite.cluster import IgniteCluster
from tests.interop.harness import HarnessError, missing_tools

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools())),
]

KEYS = 1000
# One copy in `--cache distribution null`: group id, partition, node id (8 hex), P/B, state, counter, size, addresses.
DISTRIBUTION_ROW = re.compile(r"^(-?\d+),(\d+),([0-9a-f]{8}),([PB]),(\w+),(\d+),(\d+),")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[IgniteCluster]:
    with IgniteCluster(tmp_path / "ignite") as live:
        yield live


def sql(cluster: IgniteCluster, query: str, *args: Any) -> list[list[Any]]:
    """Rows of a query over the thin client of the first live node (pyignite; system views in schema SYS)."""
    client = Client()
    client.connect(*cluster.host_port())
    try:
        return [list(row) for row in client.sql(query, query_args=list(args) or None)]
    finally:
        client.close()


def control(cluster: IgniteCluster, *args: str) -> str:
    """Run the control utility against the cluster; its stdout, asserting exit code 0."""
    done = subprocess.run([*cluster.control_command(), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def assert_sane(dump: dict[str, Any], alive: set[str], copies: int) -> None:
    """Ideal = serving assignment over live nodes only, each partition's copies OWNING with equal counters, and the
    primaries' sizes add up to the keys."""
    assert {n["name"] for n in dump["nodes"] if n["alive"]} == alive
    group = dump["groups"]["c1"]
    assert group["late"] == group["ideal"], "settled: the serving assignment is the ideal one"
    assert len(group["late"]) == 64
    local = {node: {row[0]: row for row in rows} for node, rows in group["local"].items()}
    primaries = 0
    for part, owners in enumerate(group["late"]):
        assert len(owners) == copies and set(owners) <= alive, (part, owners)
        rows = [local[node][part] for node in owners]
        assert {r[1] for r in rows} == {"OWNING"}, (part, rows)
        assert len({(r[2], r[3]) for r in rows}) == 1, f"copies of {part} differ in counter or size: {rows}"
        primaries += rows[0][3]
    assert primaries == KEYS
    assert sum(len(rows) for rows in local.values()) == 64 * copies, "no surplus copies left behind"
    assert dump["lost"] == {"c1": []}


def test_three_nodes_a_crash_and_what_the_public_interfaces_say(cluster: IgniteCluster) -> None:
    for name, zone in [("n1", "a"), ("n2", "b"), ("n3", "c")]:
        cluster.step({"op": "start", "node": name, "attributes": {"zone": zone}})
    cluster.step({"op": "start_cache", "name": "c1", "partitions": 64, "backups": 1})
    dump = cluster.step({"op": "put", "cache": "c1", "keys": KEYS})
    assert dump["topology_version"][0] == 3 and dump["cluster_state"] == "ACTIVE"
    assert len(set(cluster.thin_ports.values())) == 3
    assert_sane(dump, {"n1", "n2", "n3"}, copies=2)

    # SQL system views over the thin client: every node's rows, from whichever node answers.
    by_uuid = {n["node_id"]: n["consistent_id"] for n in dump["nodes"]}
    nodes = sql(cluster, "SELECT NODE_ID, CONSISTENT_ID, NODE_ORDER, IS_CLIENT FROM SYS.NODES")
    assert sorted((str(r[0]), r[1]) for r in nodes) == sorted(by_uuid.items())
    group_id = dump["groups"]["c1"]["group_id"]
    # pyignite sends a Python int as a long, which the view's INT column refuses as a filter: say it is an int.
    states = sql(cluster, "SELECT NODE_ID, PARTITION_ID, STATE, IS_PRIMARY FROM SYS.PARTITION_STATES "
                          "WHERE CACHE_GROUP_ID = ?", (group_id, IntObject))
    seen = sorted((r[1], by_uuid[str(r[0])], r[2], r[3]) for r in states)
    expected = sorted((p, node, "OWNING", i == 0)
                      for p, owners in enumerate(dump["groups"]["c1"]["late"]) for i, node in enumerate(owners))
    assert seen == expected
    zones = sql(cluster, "SELECT VALUE FROM SYS.NODE_ATTRIBUTES WHERE NODE_ID = ? AND NAME = 'zone'",
                uuid.UUID(dump["nodes"][0]["node_id"]))  # NODE_ID filters need a UUID, not a string
    assert zones == [["a"]]

    # The control utility: counter and size of every copy, node ids shortened to 8 hex characters.
    copies = [m.groups() for line in control(cluster, "--cache", "distribution", "null").splitlines()
              if (m := DISTRIBUTION_ROW.match(line)) and int(m.group(1)) == group_id]
    short = {node_id[:8]: cid for node_id, cid in by_uuid.items()}
    truth = {(row[0], node): (row[2], row[3]) for node, part_rows in dump["groups"]["c1"]["local"].items()
             for row in part_rows}
    assert len(copies) == 128
    assert {(int(c[1]), short[c[2]]): (int(c[5]), int(c[6])) for c in copies} == truth

    dump = cluster.step({"op": "kill", "node": "n3"})
    assert dump["topology_version"][0] == 4
    assert_sane(dump, {"n1", "n2"}, copies=2)
    assert len(sql(cluster, "SELECT NODE_ID FROM SYS.NODES")) == 2


def test_a_diverged_copy_shows_in_idle_verify(cluster: IgniteCluster) -> None:
    for name in ("n1", "n2"):
        cluster.step({"op": "start", "node": name})
    cluster.step({"op": "start_cache", "name": "c1", "partitions": 8, "backups": 1})
    dump = cluster.step({"op": "put", "cache": "c1", "keys": 100})
    assert "no conflicts have been found" in control(cluster, "--cache", "idle_verify")

    backup = dump["groups"]["c1"]["late"][3][1]
    dump = cluster.step({"op": "diverge", "cache": "c1", "partition": 3, "node": backup, "delta": 5})
    moved = dump["diverged"]
    assert moved["counter_after"] == moved["counter_before"] + 5 and moved["size_after"] == moved["size_before"]
    counters = {node: {r[0]: r[2] for r in rows}[3] for node, rows in dump["groups"]["c1"]["local"].items()}
    assert counters[backup] == max(counters.values()) == min(counters.values()) + 5

    report = control(cluster, "--cache", "idle_verify")  # exit code 0 even with conflicts
    assert "counterConflicts=1, hashConflicts=0" in report
    assert f"consistentId={backup}, updateCntr={moved['counter_after']}" in report

    with pytest.raises(HarnessError, match="unknown op"):
        cluster.step({"op": "no-such-op"})
    assert cluster.step({"op": "dump"})["groups"]["c1"]["local"][backup]
