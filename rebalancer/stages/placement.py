"""Placements decided on the driver before the kernel runs: balanced groups, groups over a baseline or around
draining nodes, and a collected cluster's own placement adopted (docs/EXCHANGE.md "Baseline, activation, drain")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rebalancer.affinity.assign import RankingMemo
from rebalancer.affinity.balanced import PreviousPlacement, assign_balanced
from rebalancer.affinity.ideal import previous_placement
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.config import Settings
from rebalancer.exchange.events import ExchangeStep, placement_servers
from rebalancer.exchange.kernel import KernelContext
from rebalancer.groups import GroupSettings
from rebalancer.stages.previous import Previous
from rebalancer.storage import Warehouse
from rebalancer.tables import REPLICA_INDEX
from rebalancer.vocabulary import BALANCED, MOVING, OWNING

__all__ = ["Placements", "kernel_context", "placed_onto", "place", "placement_changed"]

Matrix = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Placements:
    """The replica matrices of one exchange decided outside the kernel (``KernelContext.placements`` and
    ``listed``), and the previous placements the balanced groups continued from."""

    matrices: dict[str, Matrix]
    listed: dict[str, tuple[tuple[str, ...], Matrix]]
    continued_from: tuple[PreviousPlacement, ...] = ()


def kernel_context(alive: NodeSet, node_orders: Mapping[str, int], groups: Mapping[str, GroupSettings],
                   started: frozenset[str], reset: frozenset[str], placements: Placements,
                   settings: Settings) -> KernelContext:
    """The exchange-wide facts the kernel decides with (an exchange's, or a what-if scenario's)."""
    return KernelContext(
        nodes=alive,
        node_orders=node_orders,
        groups=groups,
        started=started,
        reset=reset,
        history_threshold=settings.rebalance.history_threshold,
        ids_as_strings=settings.affinity.ignite_ids_as_strings,
        placements=placements.matrices,
        listed=placements.listed,
    )


def place(step: ExchangeStep, previous: Previous, groups: Mapping[str, GroupSettings], alive: NodeSet,
          node_rows: Mapping[str, Mapping[str, object]], settings: Settings, warehouse: Warehouse) -> Placements:
    """Replica matrices (indexes into ``alive``) decided on the driver instead of in the kernel: balanced groups
    (placed together), and every group whose candidates are not the alive servers - draining nodes leave the
    placement while they still serve, and persistent groups are placed over the baseline, where an offline node
    keeps its place but gets no copy. Also the lists ``ideal_assignment`` shows for groups whose placement names
    offline nodes (``KernelContext.listed``)."""
    everyone = frozenset(alive.node_ids)
    by_kind = {persistent: candidates(step, persistent, node_rows)
               for persistent in {s.persistent for s in groups.values()}}
    chosen_for = {name: by_kind[s.persistent] for name, s in groups.items()}
    out: dict[str, Matrix] = {}
    listed: dict[str, tuple[tuple[str, ...], Matrix]] = {}
    placed_before: dict[str, int] = {}  # balanced group -> how many of its partitions the previous ideal placed
    continued: list[PreviousPlacement] = []
    for chosen in sorted(set(chosen_for.values()), key=sorted):
        members = {g: s for g, s in groups.items() if chosen_for[g] == chosen}
        nodes = alive if chosen == everyone else NodeSet.from_rows([node_rows[n] for n in sorted(chosen)])
        before = _balanced_previous(previous, members)
        if before is not None:
            continued.append(before)
            placed_before.update((g, m.shape[0]) for g, m in before.matrices.items())
        placed = _balanced(members, nodes, settings.affinity.balanced_spread, before)
        if chosen != everyone:
            ranking = RankingMemo(nodes, settings.affinity.ignite_ids_as_strings)
            for g, s in members.items():
                if g not in placed:
                    placed[g] = ranking(np.arange(s.partitions), s)
            if not chosen <= everyone:
                listed.update((g, (tuple(nodes.node_ids), m)) for g, m in placed.items())
            placed = {g: placed_onto(m, nodes.node_ids, alive.node_ids) for g, m in placed.items()}
        out.update(placed)
    out.update(_adopted(warehouse, out, groups, alive, placed_before))
    return Placements(out, listed, tuple(continued))


def candidates(step: ExchangeStep, persistent: bool, node_rows: Mapping[str, object]) -> frozenset[str]:
    """The nodes a group is placed over: the alive servers not draining, or for a persistent group the
    baseline (which may name offline nodes) when one is set."""
    cluster = step.cluster
    if persistent and cluster.baseline is not None:
        return frozenset(n for n in cluster.baseline if n in node_rows)
    return placement_servers(step.alive, cluster.draining)


def placement_changed(placements: Placements, alive: NodeSet, carried: Sequence[str]) -> set[tuple[str, int]]:
    """The partitions of carried balanced groups whose placement is not the previous ideal list. A placement
    ``balanced`` made is its own continuation when the servers stay, so this is empty for it; a placement
    adopted from a live cluster's reports need not be: where it is skewed, the first exchange after it evens it,
    and every partition it moves is recomputed (carried rows keep the previous lists)."""
    where = {n: i for i, n in enumerate(alive.node_ids)}
    changed: set[tuple[str, int]] = set()
    for before in placements.continued_from:
        to_alive = np.array([where.get(n, -1) for n in before.node_ids] + [-1], dtype=np.int32)
        for g in carried:
            now, then = placements.matrices.get(g), before.matrices.get(g)
            if now is None or then is None:
                continue
            width = max(now.shape[1], then.shape[1])
            old = np.full((now.shape[0], width), -1, dtype=np.int32)
            k = min(now.shape[0], then.shape[0])
            old[:k, : then.shape[1]] = to_alive[np.where(then[:k] >= 0, then[:k], len(before.node_ids))]
            old = np.take_along_axis(old, np.argsort(old < 0, axis=1, kind="stable"), axis=1)
            new = np.full_like(old, -1)
            new[:, : now.shape[1]] = np.take_along_axis(now, np.argsort(now < 0, axis=1, kind="stable"), axis=1)
            changed |= {(g, int(p)) for p in np.flatnonzero((old != new).any(axis=1))}
    return changed


def placed_onto(matrix: Matrix, nodes: Sequence[str], alive: Sequence[str]) -> Matrix:
    """A matrix of indexes into ``nodes`` (node ids) as indexes into ``alive``: a node that is not alive leaves its
    slot, and each row's alive nodes move up in order (so column 0 is the first alive one: the ideal primary). A
    group's placement is this of its ``KernelContext.listed`` matrix whenever it has one."""
    where = {n: i for i, n in enumerate(alive)}
    to_alive = np.array([where.get(n, -1) for n in nodes] + [-1], dtype=np.int32)
    mapped = to_alive[np.where(matrix >= 0, matrix, len(nodes))]
    order = np.argsort(mapped < 0, axis=1, kind="stable")
    return np.take_along_axis(mapped, order, axis=1)


def _balanced(groups: Mapping[str, GroupSettings], nodes: NodeSet, spread: bool,
              previous: PreviousPlacement | None) -> dict[str, Matrix]:
    """The replica matrices of the running ``balanced`` groups, placed together (the placement is a function of
    every balanced group, not of one partition), continuing from ``previous``."""
    balanced = [s for s in groups.values() if s.affinity == BALANCED]
    return dict(assign_balanced(balanced, nodes, spread=spread, previous=previous)) if balanced and len(nodes) \
        else {}


def _balanced_previous(previous: Previous, groups: Mapping[str, GroupSettings]) -> PreviousPlacement | None:
    """The balanced groups' ideal assignment at the previous version: their new placement continues from it
    (docs/AFFINITY.md step 9), so a change moves what it must and little more."""
    names = [g for g, s in groups.items() if s.affinity == BALANCED]
    if previous.committed is None or not names:
        return None
    return previous_placement(previous.of_groups("ideal_assignment", names))


def _adopted(warehouse: Warehouse, placed: Mapping[str, Matrix], groups: Mapping[str, GroupSettings],
             alive: NodeSet, placed_before: Mapping[str, int]) -> dict[str, Matrix]:
    """A collected cluster's own placement, adopted where the engine has none yet (docs/KAFKA.md "Adopting a
    running cluster"): for each balanced group, every partition beyond the previous ideal's (all of them on the
    first exchange, of a group started since, and a group's added partitions) whose copies on alive nodes the
    reports place (``replica_index``, the extra column collectors write; OWNING or MOVING copies, latest report
    per copy) keeps those nodes in that order; the others keep the placement decided. So an exchange plans
    nothing for partitions the cluster placed itself, and later ones continue from them."""
    names = [g for g, s in groups.items() if s.affinity == BALANCED and g in placed
             and placed_before.get(g, 0) < s.partitions]
    if not names or REPLICA_INDEX not in warehouse.read_raw("partition_reports").columns:
        return {}
    where = {n: i for i, n in enumerate(alive.node_ids)}
    lists: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for r in warehouse.latest_reports(names).to_pylist():
        if r[REPLICA_INDEX] is not None and r["state"] in (OWNING, MOVING) and r["node_id"] in where:
            lists.setdefault((r["group_name"], r["partition_id"]), []).append((r[REPLICA_INDEX], where[r["node_id"]]))
    adopted: dict[str, Matrix] = {}
    for (group, pid), copies in sorted(lists.items()):
        matrix = adopted.get(group)
        if matrix is None:
            matrix = adopted[group] = np.array(placed[group], copy=True)
        if placed_before.get(group, 0) <= pid < matrix.shape[0]:
            nodes = [i for _, i in sorted(copies)][: matrix.shape[1]]
            matrix[pid] = nodes + [-1] * (matrix.shape[1] - len(nodes))
    return adopted
