"""Real Ignite 2.x with native persistence: placement over the baseline topology (SPEC section 4, "Baseline").

Against a real persistent cluster (activated with four nodes; one killed, one stopped, the first restarted):
through the pure client, the ideal assignment is the ``ignite`` affinity over the baseline nodes, and a baseline
node that is offline is removed from the lists (no other node takes its place) until it comes back; and the same
run replayed through rebalancer's exchange (persistent group, ``[baseline] auto_adjust = false``) places over the
same baseline at every step, plans no copy for an offline baseline node, and loses the same partitions.
"""

from __future__ import annotations

from typing import Any

import pytest

from rebalancer.client import assign
from tests.interop import harness
from tests.interop.ignite_replay import StepResult, ours_at, replay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(harness.missing_tools() is not None, reason=str(harness.missing_tools())),
]

NODES = ["n1", "n2", "n3", "n4"]
SCRIPT: dict[str, Any] = {
    "persistence": True,
    "caches": {"p1": {"partitions": 64, "backups": 1}},
    "nodes": {n: {} for n in NODES},
    "steps": [*({"op": "start", "node": n} for n in NODES), {"op": "activate"},
              {"op": "start_cache", "cache": "p1"}, {"op": "put", "cache": "p1", "keys": 300},
              {"op": "kill", "node": "n3"}, {"op": "stop", "node": "n4"}, {"op": "start", "node": "n3"}],
}


@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return harness.once_per_session(tmp_path_factory.getbasetemp(), "ignite-baseline",
                                    lambda work: harness.run_ignite(SCRIPT, work))


def test_offline_baseline_nodes_are_removed_not_replaced(baseline_run: dict[str, Any]) -> None:
    over_baseline = assign(NODES, 64, 1, affinity="ignite")  # the baseline is the four nodes of the activation
    checked = 0
    for step in baseline_run["steps"]:
        alive = {n["node_id"] for n in step.get("nodes", []) if not n["is_client"]}
        for row in step.get("affinity", {}).get("p1", []):
            expected = [[n for n in nodes if n in alive] for nodes in over_baseline]
            assert row["ideal"] == expected, (step["step"], row["version"])
            checked += 1
    assert checked >= 4, checked
    lost = [s["lost"]["p1"] for s in baseline_run["steps"] if "p1" in s.get("lost", {})]
    assert any(lost), "with n3 and n4 offline some partition has no baseline owner left: Ignite marks it lost"


@pytest.fixture(scope="session")
def baseline_replay(spark: Any, baseline_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
                    ) -> list[StepResult]:
    path = tmp_path_factory.mktemp("ignite-baseline-replay") / "warehouse"
    return replay(spark, path, SCRIPT, baseline_run, persistent=True, baseline={"auto_adjust": False})


def test_our_exchange_places_over_the_baseline_as_ignite_does(baseline_run: dict[str, Any],
                                                              baseline_replay: list[StepResult]) -> None:
    warehouse = baseline_run["warehouse"]
    compared = offline_steps = 0
    for step, ours in zip(baseline_run["steps"], baseline_replay, strict=True):
        theirs = step.get("affinity", {}).get("p1", [])
        if not ours.versions or not theirs:
            continue
        version = ours.versions[-1]
        mine = ours_at(warehouse, "p1", version, 64)
        alive = {n["node_id"] for n in step.get("nodes", []) if not n["is_client"]}
        # our ideal lists name the offline baseline nodes too (SPEC); their alive part is Ignite's ideal
        assert [[n for n in nodes if n in alive] for nodes in mine["ideal"]] == theirs[-1]["ideal"], (
            step["step"], version)
        assert mine["lost"] == sorted(step.get("lost", {}).get("p1", [])), (step["step"], version)
        copies = [r for r in warehouse.read_arrow("migration_plan").to_pylist()
                  if (r["topology_major"], r["topology_minor"]) == version and r["action"] == "COPY"]
        # nothing is copied to stand in for an offline baseline node: a COPY only goes to a partition's own
        # (alive) baseline owner - the restarted n3, whose persisted copies the replay reports after the exchange
        strays = [r for r in copies if r["target_node"] not in theirs[-1]["ideal"][r["partition_id"]]]
        assert strays == [], f"{step['step']}: copies to nodes outside the baseline lists: {strays[:3]}"
        if step["step"]["op"] in ("kill", "stop"):
            offline_steps += 1
            assert copies == [], f"{step['step']}: a node left and data was copied: {copies[:3]}"
        compared += 1
    assert compared >= 4 and offline_steps >= 2, (compared, offline_steps)
