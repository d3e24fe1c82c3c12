"""Which partitions an exchange recomputes, and why; every other partition is settled and carried over.

Recomputed: those the previous version left unstable (with plan steps, lost, or in conflict), those with new
reports, those with a copy on a node that left, those whose ideal list gains a node that joined, those of a
balanced group whose placement moves, and every partition of a group started, reset or changed. Everything, when
there is no previous version, when a server's placement facts changed, on activation, or when the baseline or the
draining nodes change. docs/EXCHANGE.md, "Settled partitions", argues why carrying the rest is what recomputing
would give, and a property test checks it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.affinity.assign import RankingMemo
from rebalancer.affinity.ideal import ideal_assignment
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange.events import ClusterState, ExchangeStep, NodeInfo, placement_servers
from rebalancer.groups import GroupSettings
from rebalancer.inputs import Reports
from rebalancer.stages import paths
from rebalancer.stages.placement import Placements, placement_changed
from rebalancer.stages.previous import Previous, changed_rows, key_pairs
from rebalancer.storage.sql import sql_literal
from rebalancer.vocabulary import BALANCED, PARTITION_KEY, REPLICATED

__all__ = ["Scope", "ScopeFacts", "decide_scope"]
#: The placement facts of a node: a change of one of them on a server alive before and now recomputes everything.
NODE_PLACEMENT_COLUMNS = ("node_uuid", "node_order", "host", "attributes", "capacity", "is_client")


@dataclass(frozen=True)
class Scope:
    """The partitions an exchange recomputes: all, or every partition of ``groups`` plus ``keys``
    (``(group_name, partition_id)``, of running groups not in ``groups``, in range)."""

    everything: bool
    groups: frozenset[str] = frozenset()
    keys: frozenset[tuple[str, int]] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.everything or self.groups or self.keys)

    def touched_groups(self, running: frozenset[str]) -> frozenset[str]:
        if self.everything:
            return running
        return (self.groups | {g for g, _ in self.keys}) & running

    def whole_groups(self, running: Sequence[str]) -> list[str]:
        """The running groups recomputed whole, sorted."""
        return sorted(running) if self.everything else sorted(self.groups & set(running))

    def single_keys(self) -> list[tuple[str, int]]:
        """The partitions recomputed one by one (not in a whole group), sorted."""
        return sorted(k for k in self.keys if k[0] not in self.groups)

    def count(self, partitions: Mapping[str, int]) -> int:
        if self.everything:
            return sum(partitions.values())
        return sum(partitions.get(g, 0) for g in self.groups) + sum(1 for g, _ in self.keys if g not in self.groups)


@dataclass(frozen=True)
class ScopeFacts:
    """What the scope reads besides the step and the previous version: this run's input rows."""

    node_rows: Mapping[str, Mapping[str, Any]]
    group_rows: Mapping[str, Mapping[str, Any]]
    nodes: pa.Table
    groups: pa.Table
    versions: Mapping[str, int]


def decide_scope(spark: SparkSession, step: ExchangeStep, previous: Previous, facts: ScopeFacts,
                 groups: Mapping[str, GroupSettings], placements: Placements, alive: NodeSet,
                 reports: Reports | None, settings: Settings, carry: bool = True) -> Scope:
    """The :class:`Scope` of ``step`` after ``previous`` (module docstring); ``carry=False`` recomputes all."""
    prev = previous.committed
    if prev is None or not carry or _nodes_changed(previous, step, facts) or step.activated or (
            _placing(prev.state.alive, prev.state.cluster) != _placing(step.alive, step.cluster)):
        # activation validates counters across every report; a drain or a baseline change moves placements
        return Scope(everything=True)
    before = prev.state
    servers_before = {n for n, i in before.alive.items() if not i.is_client}
    servers_now = {n for n, i in step.alive.items() if not i.is_client}
    departed, joined = sorted(servers_before - servers_now), sorted(servers_now - servers_before)
    full = set(step.new_groups) | set(step.reset_groups) | {g for g in step.groups if g not in before.groups}
    changed_settings = _groups_changed(previous, facts, step.groups & before.groups)
    full |= changed_settings
    balanced = {g for g in step.groups if groups[g].affinity == BALANCED}
    if balanced and (servers_before != servers_now or step.groups != before.groups or changed_settings):
        full |= balanced  # placed together: one group's partitions can take room another's needed
    carried_balanced = sorted(g for g in step.groups & before.groups if g not in full and g in balanced)
    keys = placement_changed(placements, alive, carried_balanced) if carried_balanced else set()
    for g in step.groups & before.groups:
        s = groups[g]
        if s.mode == REPLICATED and servers_before != servers_now:
            full.add(g)
        if min(s.backups + 1, len(servers_before)) != min(s.backups + 1, len(servers_now)):
            full.add(g)
    keys |= previous.unstable_keys()
    sources: list[DataFrame] = []
    carried = sorted(step.groups - full)
    # Small clusters answer on the driver (Arrow and the client's affinity): a Spark job costs more than the work.
    carried_partitions = sum(groups[g].partitions for g in carried)
    copies_on_driver = carried_partitions * (1 + max((groups[g].backups for g in carried), default=0)) \
        <= previous.warehouse.driver_replicas
    ranks_on_driver = carried_partitions * len(servers_now) <= paths.DRIVER_RANKINGS
    if reports is not None:
        if reports.keys is not None:
            keys |= key_pairs(reports.keys)
        else:
            sources.append(reports.valid.select(*PARTITION_KEY))
    if departed and carried and copies_on_driver:
        copies = previous.arrow("partition_map")
        copies = copies.filter(pc.and_(pc.is_in(copies.column("node_id"), pa.array(departed, pa.string())),
                                       pc.is_in(copies.column("group_name"), pa.array(carried, pa.string()))))
        keys |= key_pairs(copies)
    elif departed and carried:
        sources.append(previous.frame("partition_map")
                       .where(F.expr(f"node_id IN ({_sql_list(departed)}) AND group_name IN ({_sql_list(carried)})"))
                       .select(*PARTITION_KEY))
    if joined and carried and ranks_on_driver:
        nodes = NodeSet.from_rows([facts.node_rows[n] for n in step.alive if n in servers_now])
        joined_codes = [nodes.node_ids.index(n) for n in joined]
        ranking = RankingMemo(nodes, settings.affinity.ignite_ids_as_strings)
        for g in carried:
            pids = np.arange(groups[g].partitions, dtype=np.int64)
            matrix = ranking(pids, groups[g])
            keys |= {(g, int(p)) for p in pids[np.isin(matrix, joined_codes).any(axis=1)]}
    elif joined and carried:
        nodes_df = spark.createDataFrame(
            pa.Table.from_pylist([dict(facts.node_rows[n]) for n in sorted(servers_now)], schema=facts.nodes.schema))
        groups_df = spark.createDataFrame(facts.groups).where(F.expr(f"group_name IN ({_sql_list(carried)})"))
        sources.append(ideal_assignment(nodes_df, groups_df, settings.affinity)
                       .where(F.col("node_id").isin(joined)).select(*PARTITION_KEY))
    if sources:
        keys |= key_pairs(functools.reduce(DataFrame.unionByName, sources).distinct().toArrow())
    keys = {(g, p) for g, p in keys if g in groups and g not in full and 0 <= p < groups[g].partitions}
    return Scope(everything=False, groups=frozenset(full & set(groups)), keys=frozenset(keys))


def _nodes_changed(previous: Previous, step: ExchangeStep, facts: ScopeFacts) -> bool:
    """Whether a server alive before and now changed what placement reads (host, attributes, capacity, ...)."""
    prev = previous.committed
    assert prev is not None
    if prev.input_versions.get("nodes") == facts.versions["nodes"]:
        return False
    old = previous.consumed("nodes")
    if old is None:
        return True
    staying = {n: facts.node_rows[n] for n in step.alive if n in prev.state.alive}
    old_rows = [r for r in old.to_pylist() if r["node_id"] in staying]
    kept = {r["node_id"] for r in old_rows}
    return bool(changed_rows(old_rows, {n: r for n, r in staying.items() if n in kept}, "node_id",
                             NODE_PLACEMENT_COLUMNS))


def _groups_changed(previous: Previous, facts: ScopeFacts, names: frozenset[str]) -> set[str]:
    """The groups of ``names`` whose ``cache_groups`` row changed since the previous version consumed it."""
    prev = previous.committed
    assert prev is not None
    if prev.input_versions.get("cache_groups") == facts.versions["cache_groups"]:
        return set()
    old = previous.consumed("cache_groups")
    if old is None:
        return set(names)
    return changed_rows(old.to_pylist(), {g: facts.group_rows[g] for g in names}, "group_name")


def _placing(alive: Mapping[str, NodeInfo], cluster: ClusterState) -> tuple[frozenset[str] | None, frozenset[str],
                                                                           bool]:
    """What of the cluster state decides placements and plans beyond the alive servers: a baseline that is not
    simply the alive servers (auto-adjust makes it so after every node event), the draining nodes, activity."""
    servers = placement_servers(alive, cluster.draining)
    baseline = None if cluster.baseline is None or cluster.baseline == servers else cluster.baseline
    return baseline, cluster.draining, cluster.active


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join(sql_literal(v) for v in values)
