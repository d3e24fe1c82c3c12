"""Ideal assignment of one group's partitions: the single place where a group's settings select a kernel.

Contract: for the same alive server nodes and group settings, :func:`assign` returns exactly the node lists that
the exchange writes to ``ideal_assignment`` (a property test checks this). The exchange kernel, the Spark stage
``rebalancer.affinity.ideal`` and the pure client all go through :func:`assign_indexes`, which takes the group's
:class:`~rebalancer.groups.GroupSettings` (SPEC section 2's null defaults already applied by
:meth:`~rebalancer.groups.GroupSettings.from_row`).

No pyspark import: this module runs in any Python process with NumPy and mmh3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rebalancer.affinity.ignite import assign_ignite
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.affinity.rendezvous import assign_rendezvous
from rebalancer.groups import GroupSettings, InvalidGroupSettingsError, normalise_affinity, normalise_mode
from rebalancer.vocabulary import AFFINITIES, BALANCED, IGNITE_AFFINITY, MAX_PARTITIONS, MODES

__all__ = [
    "AFFINITIES",
    "MODES",
    "InvalidGroupSettingsError",
    "RankingMemo",
    "assign",
    "assign_indexes",
    "normalise_affinity",
    "normalise_mode",
    "placement_key",
]


def assign_indexes(
    partition_ids: npt.ArrayLike,
    nodes: NodeSet,
    group: GroupSettings,
    ids_as_strings: bool = False,
) -> npt.NDArray[np.int32]:
    """Replica matrix of a group's partitions: indexes into ``nodes``, column 0 the primary, -1 = empty slot.

    Args:
        partition_ids: 1-D partition ids (``group.partitions`` is not read: any ids may be placed).
        nodes: alive server nodes (their order does not change the result).
        group: the group's settings: ``backups`` (>= 0; ignored for REPLICATED), ``affinity`` (``rendezvous`` or
            ``ignite``), ``mode``, ``exclude_neighbors`` and ``backup_filter``.
        ids_as_strings: ignite affinity only: hash UUID-shaped consistent ids as strings.

    Returns:
        ``int32`` matrix len(partition_ids) x replicas.

    Raises:
        InvalidGroupSettingsError: unknown affinity or mode, the ``balanced`` affinity (it places every balanced
            group together), or negative backups.
    """
    backups = _checked_backups(group.backups)
    kind = normalise_affinity(group.affinity)
    replicated = normalise_mode(group.mode) == "REPLICATED"
    if kind == BALANCED:
        raise InvalidGroupSettingsError(
            "the balanced affinity places every balanced group of a cluster together, not one group on its own: "
            "call rebalancer.client.affinity.assign_balanced(groups, nodes, spread=...)"
        )
    if kind == IGNITE_AFFINITY:
        return assign_ignite(partition_ids, nodes, backups, replicated, group.exclude_neighbors,
                             group.backup_filter, ids_as_strings)
    return assign_rendezvous(partition_ids, nodes, backups, replicated, group.exclude_neighbors, group.backup_filter)


def placement_key(group: GroupSettings) -> tuple[str, str, int, bool, tuple[str, ...]]:
    """What :func:`assign_indexes` reads of a group's settings: groups with equal keys get equal matrices for the
    same nodes and partition ids. Neither rendezvous nor Ignite's affinity reads a group's name or its partition
    count (so Ignite collocates such groups); the settings a REPLICATED group ignores count as equal."""
    replicated = normalise_mode(group.mode) == "REPLICATED"
    return (normalise_affinity(group.affinity), normalise_mode(group.mode), 0 if replicated else group.backups,
            group.exclude_neighbors and not replicated, () if replicated else tuple(group.backup_filter))


class RankingMemo:
    """:func:`assign_indexes` over one node set, each distinct ranking computed once.

    Groups of equal :func:`placement_key` share their matrices for equal partition ids: a cluster's groups are
    usually alike (the XL benchmark's 256 groups all are), and ranking a partition over every node is most of
    the work of deciding a whole cluster. The matrices returned are read-only, as they may be shared.
    """

    def __init__(self, nodes: NodeSet, ids_as_strings: bool = False) -> None:
        self.nodes, self.ids_as_strings = nodes, ids_as_strings
        self._matrices: dict[tuple[Any, ...], npt.NDArray[np.int32]] = {}

    def __call__(self, partition_ids: npt.ArrayLike, group: GroupSettings) -> npt.NDArray[np.int32]:
        ids = np.ascontiguousarray(partition_ids, dtype=np.int64)
        key = (placement_key(group), ids.tobytes())
        matrix = self._matrices.get(key)
        if matrix is None:
            matrix = assign_indexes(ids, self.nodes, group, self.ids_as_strings)
            matrix.flags.writeable = False
            self._matrices[key] = matrix
        return matrix


def _checked_backups(backups: int) -> int:
    if backups is None or backups < 0:
        raise InvalidGroupSettingsError(f"backups must be an int >= 0, got {backups!r}")
    return backups


def _node_set(nodes: NodeSet | Sequence[str] | Sequence[Mapping[str, Any]]) -> NodeSet:
    if isinstance(nodes, NodeSet):
        return nodes
    items = list(nodes)
    node_ids = [item for item in items if isinstance(item, str)]
    if len(node_ids) == len(items):
        return NodeSet.of(node_ids)
    return NodeSet.from_rows(items)


def assign(
    nodes: NodeSet | Sequence[str] | Sequence[Mapping[str, Any]],
    partitions: int,
    backups: int,
    affinity: str | None = "rendezvous",
    mode: str | None = "PARTITIONED",
    exclude_neighbors: bool | None = False,
    backup_filter: Sequence[str] | None = (),
    ids_as_strings: bool = False,
) -> list[list[str]]:
    """Ideal assignment of partitions ``0 .. partitions-1``: the node ids of each partition, primary first.

    Args:
        nodes: a :class:`NodeSet`; or node ids (kept in the order given, no hosts/attributes, capacity 1.0); or
            rows of the ``nodes`` table as mappings (``is_client`` rows are skipped, as the Spark stage does).
        partitions: partition count (1 .. 65536).
        backups: backups per partition (>= 0; ignored for REPLICATED).
        affinity: ``rendezvous`` | ``ignite`` | None (= rendezvous).
        mode: ``PARTITIONED`` | ``REPLICATED`` | None (= PARTITIONED).
        exclude_neighbors: keep replicas on distinct hosts where possible.
        backup_filter: attribute names replicas must differ in.
        ids_as_strings: ignite affinity only: hash UUID-shaped consistent ids as strings.

    Returns:
        One list per partition; empty lists when there are no nodes. A list is shorter than
        min(backups + 1, nodes) only when ``backup_filter`` cannot be satisfied.

    Raises:
        InvalidGroupSettingsError: invalid partitions, backups, affinity or mode.
        rebalancer.affinity.nodeset.InvalidNodeSetError: invalid nodes (duplicate ids, bad capacity, ...).
    """
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidGroupSettingsError(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions!r}")
    node_set = _node_set(nodes)
    group = GroupSettings(
        name="",
        partitions=partitions,
        backups=_checked_backups(backups),
        affinity=normalise_affinity(affinity),
        mode=normalise_mode(mode),
        exclude_neighbors=bool(exclude_neighbors),
        backup_filter=tuple(backup_filter or ()),
    )
    matrix = assign_indexes(np.arange(partitions), node_set, group, ids_as_strings)
    ids = node_set.node_ids
    return [[ids[i] for i in row if i >= 0] for row in matrix.tolist()]
