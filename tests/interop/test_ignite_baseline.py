"""Real Ignite 2.x with native persistence: placement over the baseline topology (SPEC section 4, "Baseline").

rebalancer's exchange does not implement the baseline yet (docs/INTEROP.md, "What is not covered"), so this
checks the affinity part of SPEC's rule against a real persistent cluster, through the pure client: the ideal
assignment is the ``ignite`` affinity over the baseline nodes, and a baseline node that is offline is removed
from the lists (no other node takes its place) until it comes back.
"""

from __future__ import annotations

from typing import Any

import pytest

from rebalancer.client import assign
from tests.interop import harness

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
