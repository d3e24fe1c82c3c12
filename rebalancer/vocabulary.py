"""The engine's vocabulary, declared once: copy states, plan actions, event and exchange types, group settings.

Every module that names one of these concepts imports it from here (SPEC sections 2-4 give the values). Plain
Python, no imports beyond the standard library: the pure client, the kernel and the Spark stages all share it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AFFINITIES",
    "ALL",
    "BACKUP_FILTER_DEFAULT",
    "BASELINE_CHANGED",
    "CACHE_CHANGE",
    "CACHE_EVENTS",
    "CACHE_STARTED",
    "CACHE_STOPPED",
    "CLUSTER_ACTIVATED",
    "CLUSTER_DEACTIVATED",
    "CLUSTER_EVENTS",
    "COPY",
    "COPY_KEY",
    "DEFAULT_PARTITIONER",
    "DROP",
    "ENTRIES",
    "EVENT_TYPES",
    "EVICTED",
    "EXCHANGE_TYPES",
    "FILES",
    "FULL",
    "GROUP_EVENTS",
    "HISTORICAL",
    "IDEAL_COLUMNS",
    "IGNORE",
    "LATE_AFFINITY_SWITCH",
    "LOSS_POLICIES",
    "LOST",
    "MAX_PARTITIONS",
    "MODES",
    "MOVING",
    "NODE_DRAINING",
    "NODE_EVENTS",
    "NODE_FAILED",
    "NODE_JOINED",
    "NODE_LEFT",
    "NONE",
    "OWNING",
    "PARTITIONED",
    "PARTITIONERS",
    "PARTITION_KEY",
    "PROMOTE",
    "READ_ONLY_SAFE",
    "READ_WRITE_SAFE",
    "REBALANCE_MODES",
    "RENDEZVOUS",
    "RENTING",
    "REPLICATED",
    "RESET_LOST",
    "RESET_LOST_PARTITIONS",
    "RESET_TO_MOVING",
    "SIZE_MISMATCH",
    "STATES",
    "ACTIONS",
]

# ---- partition copy states (partition_reports.state, partition_map.state) ----
OWNING: Final = "OWNING"
MOVING: Final = "MOVING"
RENTING: Final = "RENTING"
EVICTED: Final = "EVICTED"
LOST: Final = "LOST"
STATES: Final = (OWNING, MOVING, RENTING, EVICTED, LOST)

# ---- migration_plan.action, rebalance_mode and transfer ----
COPY: Final = "COPY"
PROMOTE: Final = "PROMOTE"
DROP: Final = "DROP"
ACTIONS: Final = (COPY, PROMOTE, DROP)
HISTORICAL: Final = "HISTORICAL"
FULL: Final = "FULL"
REBALANCE_MODES: Final = (HISTORICAL, FULL)
ENTRIES: Final = "entries"
FILES: Final = "files"

# ---- counter_conflicts.action ----
RESET_TO_MOVING: Final = "RESET_TO_MOVING"
SIZE_MISMATCH: Final = "SIZE_MISMATCH"

# ---- topology_events.event_type ----
NODE_JOINED: Final = "NODE_JOINED"
NODE_LEFT: Final = "NODE_LEFT"
NODE_FAILED: Final = "NODE_FAILED"
NODE_DRAINING: Final = "NODE_DRAINING"
NODE_EVENTS: Final = (NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING)
CACHE_STARTED: Final = "CACHE_STARTED"
CACHE_STOPPED: Final = "CACHE_STOPPED"
RESET_LOST_PARTITIONS: Final = "RESET_LOST_PARTITIONS"
CACHE_EVENTS: Final = (CACHE_STARTED, CACHE_STOPPED)
GROUP_EVENTS: Final = (CACHE_STARTED, CACHE_STOPPED, RESET_LOST_PARTITIONS)
BASELINE_CHANGED: Final = "BASELINE_CHANGED"
CLUSTER_ACTIVATED: Final = "CLUSTER_ACTIVATED"
CLUSTER_DEACTIVATED: Final = "CLUSTER_DEACTIVATED"
CLUSTER_EVENTS: Final = (BASELINE_CHANGED, CLUSTER_ACTIVATED, CLUSTER_DEACTIVATED)  # no node_id, no group_name
EVENT_TYPES: Final = NODE_EVENTS + GROUP_EVENTS + CLUSTER_EVENTS

# ---- exchanges.exchange_type ----
ALL: Final = "ALL"
NONE: Final = "NONE"
LATE_AFFINITY_SWITCH: Final = "LATE_AFFINITY_SWITCH"
CACHE_CHANGE: Final = "CACHE_CHANGE"
RESET_LOST: Final = "RESET_LOST"
EXCHANGE_TYPES: Final = (ALL, NONE, LATE_AFFINITY_SWITCH, CACHE_CHANGE, RESET_LOST)

# ---- cache_groups settings ----
READ_WRITE_SAFE: Final = "READ_WRITE_SAFE"
READ_ONLY_SAFE: Final = "READ_ONLY_SAFE"
IGNORE: Final = "IGNORE"
LOSS_POLICIES: Final = (READ_ONLY_SAFE, READ_WRITE_SAFE, IGNORE)
PARTITIONED: Final = "PARTITIONED"
REPLICATED: Final = "REPLICATED"
MODES: Final = (PARTITIONED, REPLICATED)
RENDEZVOUS: Final = "rendezvous"  # rendezvous-mmh3-v1, one group at a time (rebalancer.affinity.rendezvous)
BALANCED: Final = "balanced"  # places every balanced group together (rebalancer.affinity.balanced)
IGNITE_AFFINITY: Final = "ignite"  # Ignite's RendezvousAffinityFunction, bit for bit (rebalancer.affinity.ignite)
AFFINITIES: Final = (RENDEZVOUS, IGNITE_AFFINITY, BALANCED)
PARTITIONERS: Final = ("murmur3", "ignite", "hazelcast")
DEFAULT_PARTITIONER: Final = "murmur3"  # of a group whose affinity is not ignite (SPEC section 2)
BACKUP_FILTER_DEFAULT: Final[tuple[str, ...]] = ()
MAX_PARTITIONS: Final = 65536  # SPEC section 2: cache_groups.partitions is 1..65536

# ---- key columns ----
PARTITION_KEY: Final = ("group_name", "partition_id")
COPY_KEY: Final = ("group_name", "partition_id", "node_id")
IDEAL_COLUMNS: Final = ("group_name", "partition_id", "replica_index", "node_id")
