"""Ignite affinity, ``ignite`` (SPEC section 4, exact): Apache Ignite 2.x ``RendezvousAffinityFunction``, bit for bit.

Transcribed behaviour (from Ignite 2.x ``RendezvousAffinityFunction.assignPartition`` / ``replicatedAssign`` and
``ClusterNodeAttributeAffinityBackupFilter``; code not copied):

- Node hash: ``consistentId.hashCode()``. The consistent id is a ``java.lang.String`` (``String.hashCode`` over
  UTF-16 code units) unless its text is a canonical UUID (8-4-4-4-12 hex digits, any case) and
  ``ids_as_strings`` is false: then it is a ``java.util.UUID`` (``UUID.hashCode``), as Ignite generates for
  persistent nodes.
- Per partition p and node: ``mix = WangMix64((hash & 0xFFFFFFFF) | (p << 32))``; nodes sorted by ``mix``
  ascending as signed ``long`` (smallest = primary), ties by the runtime ``node_uuid`` with ``UUID.compareTo``
  (most significant 64 bits compared as signed long, then the least significant ones). Ignite's lazy selection
  sort and its full sort produce the same order for a total order, so only the order matters.
  Decision (Ignite cannot have it): nodes without a ``node_uuid`` tie after nodes with one, among themselves by
  ``node_id``. Ties need two consistent ids with equal ``hashCode`` (e.g. "Aa" and "BB").
- replicas = min(backups + 1, nodes); with a single node every partition gets that node.
- PARTITIONED walk, primary = first: with ``exclude_neighbors`` a node is accepted when no accepted node shares its
  host (Ignite groups neighbours by MAC addresses; here ``host`` plays that role, nulls forming one group) *and*,
  when ``backup_filter`` is set, the filter below accepts it (Ignite 2.18 tests the filters first, then the
  neighbourhood; older 2.x sources ignored the filter under exclNeighbors, and real Ignite 2.18.0 was measured to
  apply both: docs/INTEROP.md). If the list is then short, Ignite walks the ranking again from the second node and
  appends every node not yet in the list until it is full, ignoring the filter as well (it logs the one-time
  ``exclNeighborsWarn`` warning "excludeNeighbors property is ignored because topology has no enough nodes to
  assign backups"; the assignment is what matters here).
- Without ``exclude_neighbors``, a non-empty ``backup_filter`` is ``ClusterNodeAttributeAffinityBackupFilter`` as
  of 2.11+: a candidate is rejected when some accepted node has equal values (``Objects.equals``: null equals null)
  for *all* listed attributes. There is no refill: a partition may get fewer backups (-1 slots here).
- REPLICATED (Ignite sets backups to ``Integer.MAX_VALUE``, which selects ``replicatedAssign``): the primary is the
  first by the ranking, followed by all other nodes in the order of the affinity topology snapshot, not by rank.
  ``GridAffinityAssignmentCache.calculate`` sorts that snapshot with ``NodeOrderComparator``, which in Ignite 2.x
  (unless ``IGNITE_USE_LEGACY_NODE_COMPARATOR`` is set, not supported here) compares *consistent ids* with
  ``Comparable.compareTo``: ``String.compareTo`` (UTF-16 code units, then length) or ``UUID.compareTo`` (signed).
  Decision (Ignite would throw ``ClassCastException``): with both UUID and String ids, UUIDs come first.
  Neither exclude_neighbors nor the filter applies. So no result depends on the order of the :class:`NodeSet`.

The ranking and the constrained walk run on the vectorised engine of :mod:`rebalancer.affinity.rendezvous`.
NumPy only.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rebalancer.affinity.nodeset import InvalidNodeSetError, NodeSet
from rebalancer.affinity.rendezvous import ClassConstraint, Workspace, batch_size, select_replicas
from rebalancer.hashing import java_string_hash, java_uuid_hash

__all__ = ["assign_ignite", "consistent_id_hash", "ignite_mix", "is_uuid_text"]

_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_uuid_text(text: str) -> bool:
    """True when ``text`` is a canonical UUID string (what ``UUID.toString`` prints, any letter case)."""
    return _UUID_TEXT.fullmatch(text) is not None


def consistent_id_hash(node_id: str, ids_as_strings: bool = False) -> int:
    """Java ``hashCode`` (signed 32-bit) of a consistent id: ``UUID.hashCode`` for UUID text, else ``String``'s.

    Args:
        node_id: the consistent id as text.
        ids_as_strings: hash every id as a ``java.lang.String`` (for clusters whose consistent ids are strings
            that merely look like UUIDs).
    """
    if not ids_as_strings and is_uuid_text(node_id):
        return java_uuid_hash(node_id)
    return java_string_hash(node_id)


def ignite_mix(
    partition_ids: npt.ArrayLike, node_hashes: npt.ArrayLike, workspace: Workspace | None = None
) -> npt.NDArray[np.int64]:
    """Matrix ``M[i, j] = WangMix64((node_hashes[j] & 0xFFFFFFFF) | (partition_ids[i] << 32))`` as signed int64.

    Equal to ``rebalancer.hashing.wang_mix64`` of the packed keys (a test pins this). Each shift-and-add step of
    Wang's mix is a multiplication modulo 2^64 (``~k + (k << 21) == k * (2^21 - 1) - 1``, ``k + (k << 3) +
    (k << 8) == k * 265``, ...), so it runs as 7 in-place passes instead of ~20 allocating ones.

    Args:
        partition_ids: 1-D partition ids (0 .. 2^31-1).
        node_hashes: Java ``hashCode`` per node (signed or unsigned 32-bit).
        workspace: buffers to compute in (the result is then a view of one of them); None allocates.

    Returns:
        int64 matrix partitions x nodes.
    """
    hi = np.asarray(partition_ids, dtype=np.int64).astype(np.uint64) << np.uint64(32)
    lo = np.asarray(node_hashes, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    ws = workspace or Workspace(hi.size, lo.size)
    k = ws.get("keys", np.uint64, hi.size)
    t = ws.get("scratch", np.uint64, hi.size)
    np.bitwise_or(hi[:, None], lo[None, :], out=k)
    with np.errstate(over="ignore"):
        k *= np.uint64(0x1FFFFF)
        k -= np.uint64(1)
        np.right_shift(k, np.uint64(24), out=t)
        k ^= t
        k *= np.uint64(265)
        np.right_shift(k, np.uint64(14), out=t)
        k ^= t
        k *= np.uint64(21)
        np.right_shift(k, np.uint64(28), out=t)
        k ^= t
        k *= np.uint64(0x80000001)
    return k.view(np.int64)


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _consistent_id_key(node_id: str, ids_as_strings: bool) -> tuple[int, int, int, bytes]:
    """``NodeOrderComparator`` order: ``UUID.compareTo`` for UUID ids, ``String.compareTo`` for the others.

    UTF-16BE bytes compare like Java's code-unit-by-code-unit ``String.compareTo`` (shorter prefix first).
    """
    if not ids_as_strings and is_uuid_text(node_id):
        value = uuid.UUID(node_id).int
        return (0, _signed64(value >> 64), _signed64(value & ((1 << 64) - 1)), b"")
    return (1, 0, 0, node_id.encode("utf-16-be"))


def _tie_key(nodes: NodeSet, index: int) -> tuple[int, int, int, str]:
    """``UUID.compareTo`` order on node_uuid (signed msb, then signed lsb); nodes without one last, by node_id."""
    text = nodes.uuid_of(index)
    if text is None:
        return (1, 0, 0, nodes.node_ids[index])
    try:
        value = uuid.UUID(text).int
    except ValueError:
        raise InvalidNodeSetError(
            f"node {nodes.node_ids[index]!r}: node_uuid {text!r} is not a UUID (the ignite affinity compares them)"
        ) from None
    return (0, _signed64(value >> 64), _signed64(value & ((1 << 64) - 1)), nodes.node_ids[index])


@dataclass(frozen=True)
class _Prepared:
    """Per node set: columns in tie order, their consistent-id hashes, and the topology snapshot order."""

    perm: npt.NDArray[np.intp]  # column -> index into the NodeSet
    hashes: npt.NDArray[np.int64]
    topology: npt.NDArray[np.int32]  # NodeSet indexes sorted by consistent id


def _preparer(ids_as_strings: bool) -> Callable[[NodeSet], _Prepared]:
    def prepare(nodes: NodeSet) -> _Prepared:
        perm = np.array(sorted(range(len(nodes)), key=lambda i: _tie_key(nodes, i)), dtype=np.intp)
        hashes = np.array([consistent_id_hash(nodes.node_ids[i], ids_as_strings) for i in perm], dtype=np.int64)
        topology = sorted(range(len(nodes)), key=lambda i: _consistent_id_key(nodes.node_ids[i], ids_as_strings))
        return _Prepared(perm=perm, hashes=hashes, topology=np.array(topology, dtype=np.int32))

    return prepare


def assign_ignite(
    partition_ids: npt.ArrayLike,
    nodes: NodeSet,
    backups: int,
    replicated: bool = False,
    exclude_neighbors: bool = False,
    backup_filter: Sequence[str] = (),
    ids_as_strings: bool = False,
) -> npt.NDArray[np.int32]:
    """Ideal assignment of ``partition_ids`` exactly as Ignite 2.x ``RendezvousAffinityFunction`` computes it.

    Args:
        partition_ids: 1-D partition ids (0 .. 65535 in practice; at most 2^31-1).
        nodes: the affinity topology (alive server nodes); their order does not matter.
        backups: ``CacheConfiguration.backups`` (>= 0); ignored when ``replicated``.
        replicated: REPLICATED cache: primary by rank, then every other node in consistent-id order.
        exclude_neighbors: ``excludeNeighbors``; combined with ``backup_filter`` when both are set (Ignite 2.18).
        backup_filter: attribute names of a ``ClusterNodeAttributeAffinityBackupFilter``; empty = no filter.
        ids_as_strings: hash UUID-shaped consistent ids as strings too.

    Returns:
        ``int32`` matrix len(partition_ids) x replicas of indexes into ``nodes`` (column 0 the primary), -1 in
        slots the backup filter left empty. replicas = min(backups + 1, len(nodes)), or len(nodes) when
        replicated.

    Raises:
        ValueError: negative backups or partition ids outside 0 .. 2^31-1.
        InvalidNodeSetError: a node_uuid is not UUID text.
    """
    if backups < 0:
        raise ValueError(f"backups must be >= 0, got {backups}")
    pids = np.asarray(partition_ids, dtype=np.int64).reshape(-1)
    if pids.size and (pids.min() < 0 or pids.max() > 0x7FFFFFFF):
        raise ValueError("partition ids must be in 0 .. 2^31-1 (a Java int)")
    n = len(nodes)
    replicas = n if replicated else min(backups + 1, n)
    out = np.full((pids.size, replicas), -1, dtype=np.int32)
    if n == 0 or pids.size == 0:
        return out
    prep: _Prepared = nodes.derived(f"ignite:strings={ids_as_strings}", _preparer(ids_as_strings))

    constraint: ClassConstraint | None = None
    fill: ClassConstraint | None = None
    if not replicated:
        if exclude_neighbors:
            classes = [nodes.host_classes()[prep.perm]]
            if backup_filter:
                classes.append(nodes.filter_classes(tuple(backup_filter))[prep.perm])
            constraint = ClassConstraint(tuple(classes))
            fill = ClassConstraint(())  # second pass: any node not yet chosen, in rank order, filter ignored
        elif backup_filter:
            constraint = ClassConstraint((nodes.filter_classes(tuple(backup_filter))[prep.perm],))

    step = batch_size(n)
    ws = Workspace(min(step, pids.size), n)
    for start in range(0, pids.size, step):
        keys = ignite_mix(pids[start : start + step], prep.hashes, ws)
        if replicated:
            primary = prep.perm[keys.argmin(axis=1)].astype(np.int32)  # first occurrence = tie order
            rows = primary.size
            others = np.broadcast_to(prep.topology, (rows, n))
            rest = others[others != primary[:, None]].reshape(rows, n - 1)
            out[start : start + rows, 0] = primary
            out[start : start + rows, 1:] = rest
        else:
            cols = select_replicas(keys, replicas, constraint, fill)
            out[start : start + step] = np.where(cols >= 0, prep.perm[np.maximum(cols, 0)], -1)
    return out
