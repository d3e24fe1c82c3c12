"""Ideal assignment of one group's partitions: the single place where a group's settings select a kernel.

Contract: for the same alive server nodes and group settings, :func:`assign` returns exactly the node lists that
the exchange writes to ``ideal_assignment`` (a property test checks this). The exchange kernel, the Spark stage
``rebalancer.affinity.ideal`` and the pure client all go through :func:`assign_indexes`, which applies SPEC section
2's null defaults (``mode``, ``affinity``, ``exclude_neighbors``, ``backup_filter``).

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
from rebalancer.vocabulary import AFFINITIES, BALANCED, MAX_PARTITIONS, MODES

__all__ = [
    "AFFINITIES",
    "MODES",
    "InvalidGroupSettingsError",
    "assign",
    "assign_indexes",
    "normalise_affinity",
    "normalise_mode",
]



class InvalidGroupSettingsError(ValueError):
    """A cache group's affinity settings are outside the contract; the message names the value and what is allowed."""


def normalise_affinity(value: str | None) -> str:
    """SPEC default: null affinity = ``rendezvous``. Raises :class:`InvalidGroupSettingsError` for other values."""
    if value is None:
        return "rendezvous"
    if value not in AFFINITIES:
        raise InvalidGroupSettingsError(f"affinity {value!r} is not one of {', '.join(AFFINITIES)} (or null)")
    return value


def normalise_mode(value: str | None) -> str:
    """SPEC default: null mode = ``PARTITIONED``. Raises :class:`InvalidGroupSettingsError` for other values."""
    if value is None:
        return "PARTITIONED"
    if value not in MODES:
        raise InvalidGroupSettingsError(f"mode {value!r} is not one of {', '.join(MODES)} (or null)")
    return value


def assign_indexes(
    partition_ids: npt.ArrayLike,
    nodes: NodeSet,
    backups: int,
    affinity: str | None = "rendezvous",
    mode: str | None = "PARTITIONED",
    exclude_neighbors: bool | None = False,
    backup_filter: Sequence[str] | None = (),
    ids_as_strings: bool = False,
) -> npt.NDArray[np.int32]:
    """Replica matrix of a group's partitions: indexes into ``nodes``, column 0 the primary, -1 = empty slot.

    Args:
        partition_ids: 1-D partition ids.
        nodes: alive server nodes (their order does not change the result).
        backups: backups per partition (>= 0; ignored for REPLICATED).
        affinity: ``rendezvous`` | ``ignite`` | None (= rendezvous).
        mode: ``PARTITIONED`` | ``REPLICATED`` | None (= PARTITIONED).
        exclude_neighbors: keep replicas on distinct hosts where possible (None = false).
        backup_filter: attribute names replicas must differ in (None = none).
        ids_as_strings: ignite affinity only: hash UUID-shaped consistent ids as strings.

    Returns:
        ``int32`` matrix len(partition_ids) x replicas.

    Raises:
        InvalidGroupSettingsError: unknown affinity or mode, or negative backups.
    """
    if backups is None or backups < 0:
        raise InvalidGroupSettingsError(f"backups must be an int >= 0, got {backups!r}")
    kind = normalise_affinity(affinity)
    replicated = normalise_mode(mode) == "REPLICATED"
    excl = bool(exclude_neighbors)
    names = tuple(backup_filter or ())
    if kind == BALANCED:
        raise InvalidGroupSettingsError(
            "the balanced affinity places every balanced group of a cluster together, not one group on its own: "
            "call rebalancer.client.affinity.assign_balanced(groups, nodes, spread=...)"
        )
    if kind == "ignite":
        return assign_ignite(partition_ids, nodes, backups, replicated, excl, names, ids_as_strings)
    return assign_rendezvous(partition_ids, nodes, backups, replicated, excl, names)


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
    matrix = assign_indexes(
        np.arange(partitions), node_set, backups, affinity, mode, exclude_neighbors, backup_filter, ids_as_strings
    )
    ids = node_set.node_ids
    return [[ids[i] for i in row if i >= 0] for row in matrix.tolist()]
