"""The Ignite scenarios replayed through rebalancer (tests/interop/test_ignite_exchange.py, docs/INTEROP.md)."""

from __future__ import annotations

from typing import Any

NODES = {f"n{i}": {"host": f"host{i}", "attributes": {"zone": f"z{i % 2}"}} for i in range(1, 6)}

# Join, client join, crash and graceful leave under one cache with a backup: temporary primaries, MOVING copies,
# the late-affinity switch after each manual rebalance, and the stable assignment at the end.
JOIN_FAIL_LEAVE: dict[str, Any] = {
    "caches": {"c1": {"partitions": 32, "backups": 1}},
    "nodes": {**NODES, "client1": {}},
    "steps": [
        {"op": "start", "node": "n1"}, {"op": "start", "node": "n2"}, {"op": "start", "node": "n3"},
        {"op": "start_cache", "cache": "c1"}, {"op": "put", "cache": "c1", "keys": 300},
        {"op": "start", "node": "n4"}, {"op": "rebalance"},
        {"op": "client", "node": "client1"},
        {"op": "kill", "node": "n2"}, {"op": "rebalance"},
        {"op": "stop", "node": "n1"}, {"op": "rebalance"},
    ],
}

# Partitions without backups lost by a crash, under the three loss policies, then reset; a cache stopped.
LOSS: dict[str, Any] = {
    "caches": {
        "safe": {"partitions": 16, "backups": 0, "loss_policy": "READ_WRITE_SAFE"},
        "ro": {"partitions": 16, "backups": 0, "loss_policy": "READ_ONLY_SAFE"},
        "ign": {"partitions": 16, "backups": 0, "loss_policy": "IGNORE"},
    },
    "nodes": NODES,
    "steps": [
        {"op": "start", "node": "n1"}, {"op": "start", "node": "n2"}, {"op": "start", "node": "n3"},
        {"op": "start_cache", "cache": "safe"}, {"op": "start_cache", "cache": "ro"},
        {"op": "start_cache", "cache": "ign"},
        {"op": "put", "cache": "safe", "keys": 200}, {"op": "put", "cache": "ro", "keys": 200},
        {"op": "put", "cache": "ign", "keys": 200},
        {"op": "kill", "node": "n2"},
        {"op": "reset_lost", "cache": "safe"}, {"op": "reset_lost", "cache": "ro"},
        {"op": "stop_cache", "cache": "ign"},
    ],
}
