"""Balanced affinity "balanced-v2": rendezvous ranking with bounded loads, continued from the previous placement
(SPEC section 4, docs/AFFINITY.md).

Contract:
- A whole-placement function, not a per-partition one: :func:`place_balanced` takes every group that is placed
  together and the candidate nodes, and returns one ``int32`` matrix per group (partitions x replicas of indexes
  into ``nodes``, column 0 the primary, -1 = slot the backup filter leaves empty), the shape
  ``rebalancer.client.affinity.assign_indexes`` returns.
- Groups are :class:`~rebalancer.groups.GroupSettings` (partitions >= 0 here; ``affinity``, ``loss_policy``,
  ``persistent`` and ``partitioner`` are not read).
- Deterministic: the result depends on the node set, the groups' settings and the previous placement only, not
  on the order nodes or groups are given in (columns are ranked in node_id order, groups in name order).
- ``spread=False`` (collocate, as Ignite): groups with equal (partitions, backups, mode, exclude_neighbors,
  backup_filter) form one *unit*, get identical placements, and each unit is balanced on its own. The ranking is
  exactly the rendezvous-mmh3-v1 ranking. ``spread=True``: all groups form one unit, balanced together; each
  group's partitions are salted with the group name, so equal groups are placed independently.
- Evenness (proved in docs/AFFINITY.md): every node holds at most ``replica_cap`` PARTITIONED replicas and at most
  ``primary_cap`` primaries, where cap = max(ceil(share), floor(share * (1 + slack))) with slack 0.05 for replicas
  and 0.10 for primaries, share = the node's capacity-weighted fair share (water-filled where a node or a backup
  filter class cannot take more than one replica of a partition). The only exceptions are the *overflow*
  counted in :class:`BalancedPlacement`: a partition whose every admissible node is full, after a repair step
  failed to free one by moving another partition's backup to a node with room. A node under half its share pulls
  replicas (and primaries) up to its share where a node above its own share can give one.
- Movement: placed from scratch, a partition that no full node turned away gets exactly its rendezvous replica
  set. Given the ``previous`` placement (the last committed ideal assignment), the placement *continues* from it
  (docs step 9): every replica on a node that is still a candidate stays unless its node is over its cap or a node
  holding under half its share pulls it; only empty slots are walked. So a failure moves exactly the failed node's
  copies, and a join moves about the joiner's share, each from a node above its own share.
- Constraints as rendezvous: ``exclude_neighbors`` (soft: filled ignoring hosts when short) and
  ``backup_filter`` (hard: slots stay empty). REPLICATED groups: every node holds every partition; only their
  primaries are balanced.

NumPy and the standard library only (``rebalancer.client`` may call it without Spark).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.affinity.rendezvous import (
    RankedNodes,
    Workspace,
    batch_size,
    ranked_nodes,
    rendezvous_weights,
    select_replicas,
)
from rebalancer.groups import GroupSettings
from rebalancer.hashing import murmur3_32, murmur3_32_u32_block
from rebalancer.vocabulary import MODES

__all__ = [
    "BALANCED_MODES",
    "PRIMARY_SLACK",
    "REPLICA_SLACK",
    "BalancedPlacement",
    "InvalidBalancedGroupError",
    "PULL_BELOW",
    "PreviousPlacement",
    "assign_balanced",
    "collocation_key",
    "group_seed",
    "place_balanced",
    "salted_keys",
]

IntMatrix = npt.NDArray[np.int32]
REPLICA_SLACK = 0.05  # replicas per node <= floor(share * 1.05) (or ceil(share) when that is larger)
PRIMARY_SLACK = 0.10  # primaries per node <= floor(share * 1.10) (or ceil(share))
BALANCED_MODES = MODES
# Continuing a placement: a node holding fewer than PULL_BELOW x its share (replicas, or primaries) - one that just
# joined, or whose capacity or the groups grew - pulls up to floor(share) from nodes above their own share. Nodes
# the from-scratch walk leaves below their share stay as they are, so a failure pulls nothing.
PULL_BELOW = 0.5
# Width of the first ranking window: the replicas plus two turn-aways; rows that walk further are re-ranked
# with a 4x wider window (up to every node).
_EXTRA_WINDOW = 2
_TWO_POW_MINUS_32 = 2.0**-32


class InvalidBalancedGroupError(ValueError):
    """A group handed to the balanced affinity breaks its contract; the message names the group and the value."""


def _check(groups: Sequence[GroupSettings]) -> None:
    """The settings every placed group must have (partitions and backups >= 0, a known mode) and unique names.

    Raises:
        InvalidBalancedGroupError: names the group and the value.
    """
    for g in groups:
        if not isinstance(g.name, str) or not g.name:
            raise InvalidBalancedGroupError(f"group name must be a non-empty string, got {g.name!r}")
        if g.partitions < 0:
            raise InvalidBalancedGroupError(f"group {g.name!r}: partitions must be >= 0, got {g.partitions}")
        if g.backups < 0:
            raise InvalidBalancedGroupError(f"group {g.name!r}: backups must be >= 0, got {g.backups}")
        if g.mode not in BALANCED_MODES:
            raise InvalidBalancedGroupError(
                f"group {g.name!r}: mode {g.mode!r} is not one of {', '.join(BALANCED_MODES)}"
            )
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        dup = sorted({x for x in names if names.count(x) > 1})
        raise InvalidBalancedGroupError(f"group names must be unique; repeated: {', '.join(dup)}")


def collocation_key(g: GroupSettings) -> tuple[int, int, str, bool, tuple[str, ...]]:
    """Groups with equal keys get identical placements when not spread (the settings a REPLICATED group ignores
    count as equal)."""
    backups = 0 if g.replicated else g.backups
    excl = g.exclude_neighbors and not g.replicated
    names = () if g.replicated else g.backup_filter
    return (g.partitions, backups, g.mode, excl, names)


@dataclass(frozen=True)
class BalancedPlacement:
    """Result of :func:`place_balanced`; per-node arrays are indexed like ``nodes`` (NodeSet order). A unit's own
    placement (:func:`_place_unit`) is one too, its per-node arrays in column order.

    Attributes:
        matrices: group name -> ``int32`` matrix partitions x replicas (indexes into ``nodes``, -1 = empty slot).
        replica_share: fair share of PARTITIONED replicas per node (summed over units).
        replica_cap: the bound on PARTITIONED replicas per node (summed over units).
        primary_share: fair share of primaries per node (all groups).
        primary_cap: the bound on primaries per node.
        turned_away: group name -> per partition, whether a full node turned it away at least once, or step 9
            pulled, shed or handed over one of its replicas (its list may then differ from the rendezvous list;
            placed from scratch, the others' lists equal it).
        overflow: replicas beyond a cap at the end, summed over nodes (a partition whose every admissible node
            was full, or whose primary every node's primary cap turned away; 0 in the proved cases).
        primary_overflow: primaries beyond a cap at the end (every replica of the partition was at its cap when
            it was placed or handed over).
        pulled: replicas moved to nodes that held under half their share (steps 9b and 9d).
        shed: continuing only: replicas dropped by nodes over their cap (step 9c), placed again by the walk.
        repaired: backups the repair step moved to another node to make room for a short partition (step 7).
    """

    matrices: dict[str, IntMatrix]
    replica_share: npt.NDArray[np.float64]
    replica_cap: npt.NDArray[np.int64]
    primary_share: npt.NDArray[np.float64]
    primary_cap: npt.NDArray[np.int64]
    turned_away: dict[str, npt.NDArray[np.bool_]]
    overflow: int
    primary_overflow: int
    pulled: int = 0
    shed: int = 0
    repaired: int = 0


@dataclass(frozen=True)
class PreviousPlacement:
    """The placement a new one continues from (docs/AFFINITY.md step 9): usually the last committed ideal
    assignment of the balanced groups.

    Attributes:
        node_ids: the ids the matrices index (any order; nodes no longer candidates are simply gone).
        matrices: group name -> ``int32`` matrix partitions x replicas of indexes into ``node_ids``, column 0 the
            primary, -1 = empty slot. A group missing here (or partitions beyond its rows) starts empty.
    """

    node_ids: tuple[str, ...]
    matrices: Mapping[str, IntMatrix]

    @classmethod
    def from_lists(cls, lists: Mapping[str, Sequence[Sequence[str]]]) -> PreviousPlacement:
        """From per-group lists of node ids per partition (primary first), as routing maps hold them."""
        ids: dict[str, int] = {}
        matrices: dict[str, IntMatrix] = {}
        for name, rows in lists.items():
            width = max((len(r) for r in rows), default=0)
            m = np.full((len(rows), width), -1, dtype=np.int32)
            for p, row in enumerate(rows):
                for j, node in enumerate(row):
                    m[p, j] = ids.setdefault(node, len(ids))
            matrices[name] = m
        return cls(tuple(ids), matrices)

    @classmethod
    def of(cls, matrices: Mapping[str, IntMatrix], nodes: NodeSet) -> PreviousPlacement:
        """From matrices of indexes into ``nodes`` (what :func:`place_balanced` returned for them)."""
        return cls(tuple(nodes.node_ids), matrices)

    def columns(self, group: str, partitions: int, nodes: NodeSet, cols: RankedNodes) -> IntMatrix:
        """The group's previous rows as columns of ``cols`` (-1 where the node is not a candidate now), cut or
        padded with empty rows to ``partitions``."""
        m = self.matrices.get(group)
        if m is None or m.size == 0:
            return np.full((partitions, 1), -1, dtype=np.int32)
        where = {node: i for i, node in enumerate(nodes.node_ids)}
        column_of_index = np.empty(len(nodes), dtype=np.int32)
        column_of_index[cols.perm] = np.arange(cols.perm.size, dtype=np.int32)
        to_column = np.array([column_of_index[where[x]] if x in where else -1 for x in self.node_ids] + [-1],
                             dtype=np.int32)
        rows = np.full((partitions, m.shape[1]), -1, dtype=np.int32)
        k = min(partitions, m.shape[0])
        rows[:k] = to_column[np.where(m[:k] >= 0, m[:k], len(self.node_ids))]
        return rows


# ---------------------------------------------------------------------------------------------------------------
# Hash inputs
# ---------------------------------------------------------------------------------------------------------------
def group_seed(group_name: str) -> int:
    """``mmh3(utf8(group_name), seed=0)`` as unsigned 32-bit: the salt of a group's partitions when spread."""
    return murmur3_32(group_name.encode("utf-8"), 0)


def salted_keys(group_name: str, partitions: int) -> npt.NDArray[np.uint32]:
    """Hash inputs of a spread group's partitions: ``mmh3(p as 4-byte LE, seed=group_seed(name))`` (unsigned)."""
    return murmur3_32_u32_block(np.arange(partitions, dtype=np.uint32), np.uint32(group_seed(group_name)))


# ---------------------------------------------------------------------------------------------------------------
# Node columns: node_id order, the tie rule of the ranking (the rendezvous ranking's own columns: RankedNodes)
# ---------------------------------------------------------------------------------------------------------------
def _filter_classes(nodes: NodeSet, cols: RankedNodes, names: tuple[str, ...]) -> npt.NDArray[np.int32]:
    return nodes.filter_classes(names)[cols.perm]


# ---------------------------------------------------------------------------------------------------------------
# Fair shares and caps
# ---------------------------------------------------------------------------------------------------------------
def _seq_sum(values: npt.NDArray[np.float64]) -> float:
    """Left-to-right IEEE double sum (the order other clients reproduce; ``np.sum`` is pairwise)."""
    return float(np.cumsum(values)[-1]) if values.size else 0.0


def _water_fill(weights: npt.NDArray[np.float64], total: float, limit: float) -> npt.NDArray[np.float64]:
    """Split ``total`` over classes in proportion to ``weights``, no class above ``limit`` (IEEE double).

    Classes in order of weight descending, ties by position; ``rest[i]`` = sum of the weights from position ``i``
    to the end, accumulated from the end. The first ``i`` classes are saturated at ``limit`` for the smallest ``i``
    with ``(total - i * limit) * w[i] <= limit * rest[i]``; the others get ``(total - i * limit) * w / rest[i]``,
    or an equal part of it when ``rest[i]`` is 0. Requires ``total <= limit * len(weights)``.
    """
    k = weights.size
    order = np.lexsort((np.arange(k), -weights))
    w = weights[order]
    rest = np.cumsum(w[::-1])[::-1]
    remaining = total - np.arange(k) * limit
    fits = (rest == 0.0) | (remaining * w <= limit * rest)
    i = int(np.argmax(fits))  # fits[k - 1] always holds: remaining <= limit there
    out_sorted = np.full(k, limit, dtype=np.float64)
    if rest[i] == 0.0:
        out_sorted[i:] = remaining[i] / (k - i)
    else:
        out_sorted[i:] = remaining[i] * w[i:] / rest[i]
    out = np.empty(k, dtype=np.float64)
    out[order] = out_sorted
    return out


def _replica_share(
    partitions: int, backups: int, names: tuple[str, ...], nodes: NodeSet, cols: RankedNodes
) -> npt.NDArray[np.float64]:
    """Fair share of one PARTITIONED group's replicas per column (docs/AFFINITY.md, balanced-v2 step 4)."""
    n = cols.perm.size
    caps = cols.capacities
    # Classes that hold at most one replica of a partition: the filter's, else every node on its own.
    cls = _filter_classes(nodes, cols, names) if names else np.arange(n, dtype=np.int32)
    # Dense class numbers in order of first column, so class order is node_id order.
    _, first, dense = np.unique(cls, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    dense = rank[dense]
    k = first.size
    weights = np.asarray(np.bincount(dense, weights=caps, minlength=k), dtype=np.float64)  # sequential, column order
    size = np.bincount(dense, minlength=k)
    total = float(partitions * min(backups + 1, n, k))
    alloc = _water_fill(weights, total, float(partitions))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(weights[dense] > 0.0, alloc[dense] * caps / weights[dense], alloc[dense] / size[dense])
    return np.asarray(share, dtype=np.float64)


def _primary_share(partitions: int, cols: RankedNodes) -> npt.NDArray[np.float64]:
    """Fair share of one group's primaries per column: partitions * capacity / total capacity."""
    caps = cols.capacities
    total = _seq_sum(caps)
    if total == 0.0:
        return np.full(caps.size, partitions / caps.size)
    return np.asarray(partitions * caps / total, dtype=np.float64)


def _cap(share: npt.NDArray[np.float64], slack: float) -> npt.NDArray[np.int64]:
    return np.maximum(np.ceil(share), np.floor(share * (1.0 + slack))).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
# Ranking windows
# ---------------------------------------------------------------------------------------------------------------
class _Ranking:
    """The best columns per row (rendezvous order), in windows widened on demand.

    ``at(rows, k)`` returns each row's k-th ranked column and its key (smaller key = better rank; uint32 ``~weight``
    for uniform capacities, else float64 ``capacity / ln(u)``). Rows are re-ranked with a 4x wider window (up to
    all columns) the first time they ask beyond their window.
    """

    def __init__(self, hkeys: npt.NDArray[np.uint32], cols: RankedNodes, width: int) -> None:
        self.hkeys, self.cols, self.n = hkeys, cols, cols.perm.size
        rows = hkeys.size
        self.width = np.full(rows, min(width, self.n), dtype=np.int64)
        cand, keys = self._rank(np.arange(rows), int(self.width[0]) if rows else 0)
        self.cand, self.keys = [cand], [keys]  # tiers: tier t holds rows whose windows were widened t times
        self.tier = np.zeros(rows, dtype=np.int8)
        self.slot: list[npt.NDArray[np.int64]] = [np.arange(rows)]

    def _keys(self, hk: npt.NDArray[np.uint32], ws: Workspace) -> np.ndarray:
        w = rendezvous_weights(hk, self.cols.seeds, ws)
        if self.cols.uniform:
            return np.invert(w, out=w)
        u = ws.get("score", np.float64, hk.size)
        np.copyto(u, w, casting="safe")
        u += 0.5
        u *= _TWO_POW_MINUS_32
        np.log(u, out=u)
        return np.divide(self.cols.capacities[None, :], u, out=u)

    def _rank(self, rows: npt.NDArray[np.intp], width: int) -> tuple[npt.NDArray[np.int32], np.ndarray]:
        dtype = np.uint32 if self.cols.uniform else np.float64
        cand = np.empty((rows.size, width), dtype=np.int32)
        keys = np.empty((rows.size, width), dtype=dtype)
        if rows.size == 0 or width == 0:
            return cand, keys
        step = batch_size(self.n)
        ws = Workspace(min(step, rows.size), self.n)
        for start in range(0, rows.size, step):
            k = self._keys(self.hkeys[rows[start : start + step]], ws)
            c = select_replicas(k, width)
            cand[start : start + step] = c
            keys[start : start + step] = np.take_along_axis(k, c, axis=1)
        return cand, keys

    def _widen(self, rows: npt.NDArray[np.intp]) -> None:
        new_width = min(self.n, int(self.width[rows].max()) * 4)
        cand, keys = self._rank(rows, new_width)
        tier = len(self.cand)
        self.cand.append(cand)
        self.keys.append(keys)
        slot = np.full(self.hkeys.size, -1, dtype=np.int64)
        slot[rows] = np.arange(rows.size)
        self.slot.append(slot)
        self.tier[rows] = tier
        self.width[rows] = new_width

    def column(self, rows: npt.NDArray[np.intp], c: int) -> np.ndarray:
        """The key of column ``c`` for each of ``rows`` (smaller = ranked higher)."""
        ws = Workspace(rows.size, 1)
        w = rendezvous_weights(self.hkeys[rows], self.cols.seeds[c : c + 1], ws)
        if self.cols.uniform:
            return np.invert(w[:, 0])
        u = (w[:, 0].astype(np.float64) + 0.5) * _TWO_POW_MINUS_32
        return np.asarray(self.cols.capacities[c] / np.log(u), dtype=np.float64)

    def full(self, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int32], np.ndarray]:
        """The whole ranking of ``rows`` (columns and keys), best first."""
        return self._rank(rows, self.n)

    def at(self, rows: npt.NDArray[np.intp], k: int) -> tuple[npt.NDArray[np.int32], np.ndarray]:
        short = rows[self.width[rows] <= k]
        if short.size:
            self._widen(short)
        cand = np.empty(rows.size, dtype=np.int32)
        keys = np.empty(rows.size, dtype=self.keys[0].dtype)
        tiers = self.tier[rows]
        for t in np.unique(tiers).tolist():
            sel = tiers == t
            pos = self.slot[t][rows[sel]]
            cand[sel] = self.cand[t][pos, k]
            keys[sel] = self.keys[t][pos, k]
        return cand, keys


# ---------------------------------------------------------------------------------------------------------------
# The level walk
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Unit:
    """Rows placed together: one collocation class, or every group when spread."""

    groups: list[GroupSettings]  # groups whose rows are in the unit (one per class when collocating)
    offsets: list[int]  # first row of each group
    hkeys: npt.NDArray[np.uint32]


def _accept(
    rows: npt.NDArray[np.intp],
    cand: npt.NDArray[np.int32],
    keys: np.ndarray,
    spare: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Which proposals (row -> column) a level accepts: all, where a column has room for all of its proposals;
    else the ``spare`` best by key (ascending), ties by row (ascending)."""
    n = spare.size
    wanted = np.bincount(cand, minlength=n)
    contested = wanted > spare
    ok = ~contested[cand]
    hot = np.flatnonzero(~ok)
    if hot.size:
        order = np.lexsort((rows[hot], keys[hot], cand[hot]))
        c = cand[hot][order]
        first = np.searchsorted(c, c, side="left")
        within = np.arange(c.size) - first
        ok[hot[order[within < spare[c]]]] = True
    return ok


class _Walk:
    """State of the replica walk of one unit: accepted columns per row, loads per column."""

    def __init__(self, ranking: _Ranking, need: npt.NDArray[np.int64], width: int, n: int) -> None:
        self.ranking, self.need, self.n = ranking, need, n
        rows = need.size
        self.acc = np.full((rows, max(width, 1)), -1, dtype=np.int32)
        self.acc_key = np.zeros((rows, max(width, 1)), dtype=ranking.keys[0].dtype)
        self.count = np.zeros(rows, dtype=np.int64)
        self.load = np.zeros(n, dtype=np.int64)
        self.turned = np.zeros(rows, dtype=bool)

    def run(
        self,
        rows: npt.NDArray[np.intp],
        goal: npt.NDArray[np.int64],
        rules: list[tuple[npt.NDArray[np.intp], tuple[npt.NDArray[np.int32], ...]]],
        cap: npt.NDArray[np.int64],
    ) -> None:
        """Walk the ranking level by level for ``rows`` until each holds ``goal[row]`` columns or the ranking ends.

        ``rules``: (rows, class arrays) pairs; a proposal is admissible when its classes differ from every
        accepted column's; columns the row already holds are skipped. ``cap``: the bound per column.
        """
        rule_of = np.full(self.need.size, -1, dtype=np.int64)
        for i, (members, _) in enumerate(rules):
            rule_of[members] = i
        active = rows[self.count[rows] < goal[rows]]
        for k in range(self.n):
            if active.size == 0:
                return
            cand, keys = self.ranking.at(active, k)
            ok = ~(self.acc[active] == cand[:, None]).any(axis=1)
            rid = rule_of[active]
            for i, (_, classes) in enumerate(rules):
                sel = np.flatnonzero(rid == i)
                if sel.size == 0 or not classes:
                    continue
                held = self.acc[active[sel]]
                for cls in classes:
                    ext = np.append(cls, np.int32(-1))  # -1 (empty slot) maps to a class no node has
                    clash = (ext[held] == cls[cand[sel]][:, None]).any(axis=1)
                    ok[sel[clash]] = False
            p_rows, p_cand, p_keys = active[ok], cand[ok], keys[ok]
            took = _accept(p_rows, p_cand, p_keys, cap - self.load)
            self.turned[p_rows[~took]] = True
            t_rows, t_cand = p_rows[took], p_cand[took]
            slot = self.count[t_rows]
            self.acc[t_rows, slot] = t_cand
            self.acc_key[t_rows, slot] = p_keys[took]
            self.count[t_rows] += 1
            self.load += np.bincount(t_cand, minlength=self.n)
            active = active[self.count[active] < goal[active]]


def _classes_count(cls: npt.NDArray[np.int32]) -> int:
    return int(np.unique(cls).size)


def _repair(
    walk: _Walk,
    short: npt.NDArray[np.intp],
    rules: list[tuple[tuple[npt.NDArray[np.int32], ...], npt.NDArray[np.int32] | None]],
    rule_of: npt.NDArray[np.int64],
    cap: npt.NDArray[np.int64],
) -> int:
    """Fill rows that every admissible column turned away by moving another row's backup (docs step 7, repair).

    For each short row p in row order, while it is short: for each full column c in p's ranking order that p may
    take (filter rule), for each row q != p holding c as a backup, in row order: the first column d in q's ranking
    order with room that q does not hold and may take instead of c (under q's pass-A rules: hosts if
    exclude_neighbors, filter) receives q's copy (in the same list position) and p takes c. Without such a
    (c, q, d), p is left to the overflow rounds. ``rules[rule_of[row]]`` = (the row's pass-A class arrays, its
    filter classes or None).
    """
    acc, ranking = walk.acc, walk.ranking
    moved = 0
    for p in short.tolist():
        fp = rules[rule_of[p]][1]
        order, keys = ranking.full(np.array([p]))
        for c, key in zip(order[0].tolist(), keys[0].tolist(), strict=True):
            if walk.count[p] >= walk.need[p]:
                break
            held = acc[p, : walk.count[p]]
            if c in held or walk.load[c] < cap[c] or (fp is not None and fp[c] in fp[held]):
                continue
            qs = np.flatnonzero((acc[:, 1:] == c).any(axis=1))
            qs = qs[qs != p]
            if qs.size == 0:
                continue
            q_order, q_keys = ranking.full(qs)
            q_held = acc[qs]
            ok = (walk.load[q_order] < cap[q_order]) & ~(q_order[:, :, None] == q_held[:, None, :]).any(axis=2)
            for i in np.flatnonzero(ok.any(axis=1)).tolist():  # q's own rules (pass A's): q never gets worse
                others = q_held[i][(q_held[i] >= 0) & (q_held[i] != c)]
                for cls in rules[rule_of[qs[i]]][0]:
                    ok[i] &= ~np.isin(cls[q_order[i]], cls[others])
            movable = np.flatnonzero(ok.any(axis=1))
            if movable.size == 0:
                continue
            i = int(movable[0])
            j = int(np.argmax(ok[i]))
            q, d = int(qs[i]), int(q_order[i, j])
            slot = int(np.flatnonzero(acc[q] == c)[0])
            acc[q, slot], walk.acc_key[q, slot] = d, q_keys[i, j]
            walk.load[d] += 1
            acc[p, walk.count[p]], walk.acc_key[p, walk.count[p]] = c, key
            walk.count[p] += 1
            walk.turned[[p, q]] = True
            moved += 1
    return moved


# ---------------------------------------------------------------------------------------------------------------
# Continuing a previous placement (docs step 9)
# ---------------------------------------------------------------------------------------------------------------
_Rule = tuple[npt.NDArray[np.intp], tuple[npt.NDArray[np.int32], ...]]


def _rule_index(rules: list[_Rule], rows: int) -> npt.NDArray[np.int64]:
    rule_of = np.full(rows, -1, dtype=np.int64)
    for i, (members, _) in enumerate(rules):
        rule_of[members] = i
    return rule_of


def _keep(walk: _Walk, kept: IntMatrix, filters: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.int32] | None]]
          ) -> None:
    """Step 9a: each PARTITIONED row keeps its previous columns that are still candidates, in their previous order
    (so the first surviving one is the primary), skipping repeats and a column whose filter class an earlier kept
    column has, up to ``need``."""
    for members, fcls in filters:
        acc, count = walk.acc[members], walk.count[members]
        need = walk.need[members]
        for j in range(kept.shape[1]):
            c = kept[members, j]
            ok = (c >= 0) & (count < need) & ~(acc == c[:, None]).any(axis=1)
            if fcls is not None:
                ext = np.append(fcls, np.int32(-1))
                ok &= ~(ext[acc] == fcls[np.maximum(c, 0)][:, None]).any(axis=1)
            acc[ok, count[ok]] = c[ok]
            count[ok] += 1
        walk.acc[members], walk.count[members] = acc, count
    held = walk.acc[walk.acc >= 0]
    walk.load[:] = np.bincount(held, minlength=walk.n)


def _admits(classes: tuple[npt.NDArray[np.int32], ...], b: int, others: npt.NDArray[np.int32]) -> bool:
    return all(int(cls[b]) not in cls[others].tolist() for cls in classes)


def _pull_replicas(
    walk: _Walk, part_rows: npt.NDArray[np.intp], share: npt.NDArray[np.float64], cap: npt.NDArray[np.int64],
    rules: list[_Rule], pload: npt.NDArray[np.int64], pcap: npt.NDArray[np.int64],
) -> int:
    """Step 9b: each column b (column order) holding fewer than ``PULL_BELOW * share`` replicas takes rows'
    replicas until it holds ``floor(share)``: first from columns over their cap, then from columns above
    ``floor(share)``; rows in b's ranking order (key ascending, ties by row); b must be admissible in the row
    without the replica it replaces (the row's pass-A rules), and replaces a primary only while b holds fewer
    primaries than its ``pcap`` (b then is the primary; ``pload`` counts); the replaced one is, among the row's eligible
    columns, the one with the largest ``load - share``, ties the later slot. Returns the replicas moved."""
    load, acc, count = walk.load, walk.acc, walk.count
    floor_share = np.floor(share).astype(np.int64)
    rule_of = _rule_index(rules, acc.shape[0])
    moved = 0
    for b in np.flatnonzero(load < share * PULL_BELOW).tolist():
        for bound in (cap, floor_share):
            if load[b] >= floor_share[b]:
                break
            rows = part_rows[count[part_rows] > 0]
            held = acc[rows]
            valid = held >= 0
            rows = rows[~(held == b).any(axis=1) & (valid & (load[np.maximum(held, 0)] > bound[np.maximum(held, 0)])
                                                    ).any(axis=1)]
            if rows.size == 0:
                continue
            keys = walk.ranking.column(rows, b)
            for r in rows[np.lexsort((rows, keys))].tolist():
                if load[b] >= floor_share[b]:
                    break
                slots = acc[r, : count[r]]
                classes = rules[rule_of[r]][1]
                best, best_gap = -1, 0.0
                for j, c in enumerate(slots.tolist()):
                    if load[c] <= bound[c] or (j == 0 and pload[b] >= pcap[b]) or not _admits(
                            classes, b, np.delete(slots, j)):
                        continue
                    gap = float(load[c]) - float(share[c])
                    if best < 0 or gap >= best_gap:
                        best, best_gap = j, gap
                if best < 0:
                    continue
                load[slots[best]] -= 1
                if best == 0:
                    pload[slots[best]] -= 1
                    pload[b] += 1
                acc[r, best] = b
                load[b] += 1
                walk.turned[r] = True
                moved += 1
    return moved


def _desc(keys: np.ndarray) -> np.ndarray:
    """Keys whose ascending order is ``keys`` descending."""
    return np.iinfo(keys.dtype).max - keys if keys.dtype.kind == "u" else -keys


def _shed(walk: _Walk, part_rows: npt.NDArray[np.intp], cap: npt.NDArray[np.int64]) -> int:
    """Step 9c: each column c over its cap (column order) drops replicas until it is at its cap: backups before
    primaries, then the worst ranked first (key descending), ties by row. The row's later columns move up one slot
    (a dropped primary hands over to the next). Returns the replicas dropped."""
    acc, count, load = walk.acc, walk.count, walk.load
    dropped = 0
    for c in np.flatnonzero(load > cap).tolist():
        sub = acc[part_rows]
        r_idx, slot = np.nonzero(sub == c)
        rows = part_rows[r_idx]
        keys = walk.ranking.column(rows, c)
        order = np.lexsort((rows, _desc(keys), slot == 0))
        for i in order[: int(load[c] - cap[c])].tolist():
            r, j = int(rows[i]), int(slot[i])
            acc[r, j : count[r] - 1] = acc[r, j + 1 : count[r]].copy()
            acc[r, count[r] - 1] = -1
            count[r] -= 1
            load[c] -= 1
            walk.turned[r] = True
            dropped += 1
    return dropped


def _fix_primaries(
    ranking: _Ranking, prim: npt.NDArray[np.int64], backups: Callable[[int], list[int]],
    holds_backup: Callable[[npt.NDArray[np.intp], int], npt.NDArray[np.bool_]],
    swap: Callable[[int, int], None], pshare: npt.NDArray[np.float64], pcap: npt.NDArray[np.int64],
    pload: npt.NDArray[np.int64],
) -> None:
    """Step 9e, primaries: a column over ``pcap`` (column order) hands its primaries, worst ranked first (ties by
    row), to the first other replica of the row (list order; REPLICATED: ranking order) below its ``pcap``; then a
    column holding fewer than ``PULL_BELOW * pshare`` primaries (column order) takes the primary of rows it
    holds a backup of, in its ranking order, whose primary's column holds more than ``floor(pshare)``, until it
    holds ``floor(pshare)``. ``prim``: row -> primary column (-1 = no row)."""
    rows_all = np.flatnonzero(prim >= 0)
    for c in np.flatnonzero(pload > pcap).tolist():
        rows = rows_all[prim[rows_all] == c]
        keys = ranking.column(rows, c)
        for r in rows[np.lexsort((rows, _desc(keys)))].tolist():
            if pload[c] <= pcap[c]:
                break
            to = next((d for d in backups(r) if pload[d] < pcap[d]), -1)
            if to >= 0:
                swap(r, to)
    floor_p = np.floor(pshare).astype(np.int64)
    for b in np.flatnonzero(pload < pshare * PULL_BELOW).tolist():
        rows = rows_all[pload[prim[rows_all]] > floor_p[prim[rows_all]]]
        rows = rows[holds_backup(rows, b)]
        keys = ranking.column(rows, b)
        for r in rows[np.lexsort((rows, keys))].tolist():
            if pload[b] >= floor_p[b]:
                break
            p = int(prim[r])
            if pload[p] > floor_p[p]:
                swap(r, b)


def _primaries(
    ranking: _Ranking,
    rows: npt.NDArray[np.intp],
    caps: list[npt.NDArray[np.int64]],
    loads: list[npt.NDArray[np.int64]],
) -> tuple[np.ndarray, np.ndarray, npt.NDArray[np.bool_], int]:
    """Primary of each of ``rows``: level walk over the ranking; a column takes a primary while it is below every
    bound in ``caps`` (each counted in the matching ``loads``, which are updated). Rows the bounds leave without
    a primary walk again in rounds t = 1, 2, ... with every bound raised by t.

    Returns (primary column per row, key at it, whether a full column turned the row away, rows placed in a
    round t >= 1).
    """
    n = ranking.n
    turned = np.zeros(rows.size, dtype=bool)
    prim = np.full(rows.size, -1, dtype=np.int32)
    pkey = np.zeros(rows.size, dtype=ranking.keys[0].dtype)
    todo = np.arange(rows.size)
    late = 0
    for extra in range(rows.size + 1):
        if extra == 1:
            late = int(todo.size)
        active = todo
        for j in range(n):
            if active.size == 0:
                break
            cand, keys = ranking.at(rows[active], j)
            spare = np.minimum.reduce([c + extra - ld for c, ld in zip(caps, loads, strict=True)])
            took = _accept(rows[active], cand, keys, spare)
            turned[active[~took]] = True
            prim[active[took]] = cand[took]
            pkey[active[took]] = keys[took]
            got = np.bincount(cand[took], minlength=n)
            for ld in loads:
                ld += got
            active = active[~took]
        todo = todo[prim[todo] < 0]
        if todo.size == 0:
            break
    return prim, pkey, turned, late


def _place_unit(unit: _Unit, nodes: NodeSet, cols: RankedNodes, slack: tuple[float, float],
                kept: IntMatrix | None) -> BalancedPlacement:
    """Place one unit (docs/AFFINITY.md, "balanced", steps 3 to 9); ``kept``: the unit's previous rows as columns
    (rows x any width, -1 = none), or None to place from scratch. The per-node arrays of the result are in column
    order."""
    n = cols.perm.size
    part_groups = [(g, o) for g, o in zip(unit.groups, unit.offsets, strict=True) if not g.replicated]
    repl_groups = [(g, o) for g, o in zip(unit.groups, unit.offsets, strict=True) if g.replicated]
    rows = unit.hkeys.size
    r_max = max([min(g.backups + 1, n) for g, _ in part_groups], default=1)
    ranking = _Ranking(unit.hkeys, cols, r_max + _EXTRA_WINDOW)

    # ---- shares and caps
    share = np.zeros(n, dtype=np.float64)
    pshare = np.zeros(n, dtype=np.float64)
    memo: dict[tuple[int, int, tuple[str, ...]], npt.NDArray[np.float64]] = {}
    for g in sorted(unit.groups, key=lambda g: g.name):
        if not g.replicated:
            key = (g.partitions, g.backups, g.backup_filter)
            if key not in memo:
                memo[key] = _replica_share(g.partitions, g.backups, g.backup_filter, nodes, cols)
            share += memo[key]
        pshare += _primary_share(g.partitions, cols)
    cap, pcap = _cap(share, slack[0]), _cap(pshare, slack[1])

    # ---- per-row goals and rules
    need = np.zeros(rows, dtype=np.int64)
    goal_a = np.zeros(rows, dtype=np.int64)
    rules_a: list[tuple[npt.NDArray[np.intp], tuple[npt.NDArray[np.int32], ...]]] = []
    rules_b: list[tuple[npt.NDArray[np.intp], tuple[npt.NDArray[np.int32], ...]]] = []
    filters: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.int32] | None]] = []
    fill_rows: list[npt.NDArray[np.intp]] = []
    for g, o in part_groups:
        members = np.arange(o, o + g.partitions)
        fcls = _filter_classes(nodes, cols, g.backup_filter) if g.backup_filter else None
        want = min(g.backups + 1, n)
        if fcls is not None:
            want = min(want, _classes_count(fcls))
        need[members] = want
        goal_a[members] = min(want, _classes_count(cols.hosts)) if g.exclude_neighbors else want
        classes_a: tuple[npt.NDArray[np.int32], ...] = ()
        if g.exclude_neighbors:
            classes_a += (cols.hosts,)
            fill_rows.append(members)
        if fcls is not None:
            classes_a += (fcls,)
        rules_a.append((members, classes_a))
        rules_b.append((members, () if fcls is None else (fcls,)))
        filters.append((members, fcls))
    part_rows = np.flatnonzero(need > 0)
    repl_rows = [np.arange(o, o + g.partitions) for g, o in repl_groups]
    repl = np.concatenate(repl_rows) if repl_rows else np.zeros(0, dtype=np.intp)

    walk = _Walk(ranking, need, r_max, n)
    rprim = np.full(repl.size, -1, dtype=np.int32)

    def primaries_now() -> npt.NDArray[np.int64]:
        held = part_rows[walk.count[part_rows] > 0]
        return np.asarray(np.bincount(walk.acc[held, 0], minlength=n) + np.bincount(rprim[rprim >= 0], minlength=n))

    pload = np.zeros(n, dtype=np.int64)
    pulled = shed = 0
    # ---- step 9a-c: continuing: keep the previous replicas, pull to nodes far below their share, shed over caps
    if kept is not None:
        _keep(walk, kept, filters)
        if repl.size:
            k = kept[repl]
            alive = k >= 0
            first = k[np.arange(repl.size), np.argmax(alive, axis=1)]
            rprim = np.where(alive.any(axis=1), first, -1).astype(np.int32)
        pulled = _pull_replicas(walk, part_rows, share, cap, rules_a, primaries_now(), pcap)
        shed = _shed(walk, part_rows, cap)
        pload = primaries_now()

    # ---- step 4: primaries of rows holding nothing (PARTITIONED rows under both bounds, then REPLICATED rows under
    # the primary bound); from scratch that is every row
    empty = part_rows[walk.count[part_rows] == 0]
    prim, pkey, turned, _ = _primaries(ranking, empty, [pcap, cap], [pload, walk.load])
    walk.turned[empty] = turned
    walk.acc[empty, 0] = prim
    walk.acc_key[empty, 0] = pkey
    walk.count[empty] = 1
    todo = np.flatnonzero(rprim < 0)
    rprim_todo, _, rturned, _ = _primaries(ranking, repl[todo], [pcap], [pload])
    rprim[todo] = rprim_todo
    walk.turned[repl[todo]] = rturned

    # ---- step 5: the other replicas: pass A (all rules), fill (filter only), overflow rounds (caps + t)
    walk.run(part_rows, goal_a, rules_a, cap)
    if fill_rows:
        walk.run(np.concatenate(fill_rows), need, rules_b, cap)
    # Repair: a row still short takes a full column from a row that can move that backup to a column with room.
    short = part_rows[walk.count[part_rows] < need[part_rows]]
    repaired = 0
    if short.size:
        rule_of = np.full(rows, -1, dtype=np.int64)
        for i, (members, _) in enumerate(rules_a):
            rule_of[members] = i
        repaired = _repair(walk, short, [(a[1], f[1]) for a, f in zip(rules_a, filters, strict=True)], rule_of, cap)
    # Overflow rounds: rows still short walk again (hosts ignored) with every cap raised by 1, 2, ...
    extra = 0
    while (short := part_rows[walk.count[part_rows] < need[part_rows]]).size:
        extra += 1
        walk.run(short, need, rules_b, cap + extra)

    # ---- step 9d: nodes the walk left far below their share pull (from scratch: the low tail of the ranking), so
    # that a later change finds none
    pulled += _pull_replicas(walk, part_rows, share, cap, rules_a, primaries_now(), pcap)

    # ---- step 9e: primaries over pcap hand over, nodes far below their primary share take some
    pload = primaries_now()
    if True:
        is_repl = np.zeros(rows, dtype=bool)
        is_repl[repl] = True
        repl_pos = np.full(rows, -1, dtype=np.int64)
        repl_pos[repl] = np.arange(repl.size)
        prim_all = np.full(rows, -1, dtype=np.int64)
        prim_all[part_rows] = walk.acc[part_rows, 0]
        prim_all[repl] = rprim

        def backups(r: int) -> list[int]:
            if is_repl[r]:
                order = ranking.full(np.array([r]))[0][0].tolist()
                return [c for c in order if c != prim_all[r]]
            return walk.acc[r, 1 : walk.count[r]].tolist()

        def holds_backup(rs: npt.NDArray[np.intp], b: int) -> npt.NDArray[np.bool_]:
            return np.asarray(is_repl[rs] | (walk.acc[rs, 1:] == b).any(axis=1))

        def swap(r: int, d: int) -> None:
            old = int(prim_all[r])
            if is_repl[r]:
                rprim[repl_pos[r]] = d
            else:
                j = int(np.flatnonzero(walk.acc[r] == d)[0])
                walk.acc[r, 0], walk.acc[r, j] = d, old
            prim_all[r] = d
            pload[old] -= 1
            pload[d] += 1
            walk.turned[r] = True

        _fix_primaries(ranking, prim_all, backups, holds_backup, swap, pshare, pcap, pload)

    # ---- step 6: assemble (columns -> NodeSet indexes)
    matrices: dict[str, IntMatrix] = {}
    for g, o in part_groups:
        acc = walk.acc[o : o + g.partitions, : min(g.backups + 1, n)]
        matrices[g.name] = np.where(acc >= 0, cols.perm[np.maximum(acc, 0)], -1).astype(np.int32)
    repl_at = np.full(rows, -1, dtype=np.int64)
    repl_at[repl] = np.arange(repl.size)
    for (g, _), members in zip(repl_groups, repl_rows, strict=True):
        order = ranking.full(members)[0]
        first = rprim[repl_at[members]]
        rest = order[order != first[:, None]].reshape(members.size, n - 1)
        matrices[g.name] = cols.perm[np.concatenate([first[:, None], rest], axis=1)].astype(np.int32)
    return BalancedPlacement(
        matrices=matrices,
        replica_share=share,
        replica_cap=cap,
        primary_share=pshare,
        primary_cap=pcap,
        turned_away={g.name: walk.turned[o : o + g.partitions] for g, o in zip(unit.groups, unit.offsets, strict=True)},
        overflow=int(np.maximum(walk.load - cap, 0).sum()),
        primary_overflow=int(np.maximum(primaries_now() - pcap, 0).sum()),
        pulled=pulled,
        shed=shed,
        repaired=repaired,
    )


# ---------------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------------
def _units(groups: Sequence[GroupSettings], spread: bool) -> list[tuple[_Unit, list[GroupSettings]]]:
    """Units in a canonical order, each with the groups that receive its placement."""
    ordered = sorted(groups, key=lambda g: g.name)
    if spread:
        offsets = np.cumsum([0] + [g.partitions for g in ordered])[:-1].tolist()
        hkeys = np.concatenate([salted_keys(g.name, g.partitions) for g in ordered]) if ordered else (
            np.zeros(0, dtype=np.uint32))
        return [(_Unit(ordered, offsets, hkeys), ordered)]
    classes: dict[tuple[int, int, str, bool, tuple[str, ...]], list[GroupSettings]] = {}
    for g in ordered:
        classes.setdefault(collocation_key(g), []).append(g)
    units = []
    for members in classes.values():
        head = members[0]
        units.append((_Unit([head], [0], np.arange(head.partitions, dtype=np.uint32)), members))
    return units


def place_balanced(
    groups: Iterable[GroupSettings],
    nodes: NodeSet,
    *,
    spread: bool,
    replica_slack: float = REPLICA_SLACK,
    primary_slack: float = PRIMARY_SLACK,
    previous: PreviousPlacement | None = None,
) -> BalancedPlacement:
    """The balanced-v2 placement of ``groups`` on ``nodes``, with its shares, caps and counters.

    Args:
        groups: every group placed together (names unique); their order does not matter.
        nodes: the candidate (alive server) nodes; their order does not matter.
        spread: True = balance all groups together, each group salted by its name; False = collocate groups with
            equal (partitions, backups, mode, exclude_neighbors, backup_filter) as Ignite does, and balance each
            such class on its own.
        replica_slack: caps are max(ceil(share), floor(share * (1 + slack))); larger slack = fewer full nodes,
            hence fewer partitions turned away and fewer copies moved on a change (docs/AFFINITY.md).
        primary_slack: the same for primaries.
        previous: the placement to continue from (docs step 9; the exchange passes the last committed ideal
            assignment): replicas on nodes that are still candidates stay where the caps and the pull rule let
            them. None places from scratch.

    Returns:
        The placement; ``matrices[name]`` is ``int32`` partitions x replicas, replicas = min(backups + 1, nodes)
        (all nodes for REPLICATED), column 0 the primary, the other replicas in ranking order, -1 where the
        backup filter leaves a slot empty.

    Raises:
        InvalidBalancedGroupError: two groups share a name; a group without a name, with negative partitions or
            backups, or a mode outside :data:`BALANCED_MODES`.
        ValueError: a negative slack.
    """
    groups = list(groups)
    _check(groups)
    if replica_slack < 0 or primary_slack < 0:
        raise ValueError(f"slacks must be >= 0, got {replica_slack} and {primary_slack}")
    n = len(nodes)
    zeros_f, zeros_i = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
    if n == 0:
        empty = {g.name: np.full((g.partitions, 0), -1, dtype=np.int32) for g in groups}
        none = {g.name: np.zeros(g.partitions, dtype=bool) for g in groups}
        return BalancedPlacement(empty, zeros_f, zeros_i, zeros_f, zeros_i, none, 0, 0, 0, 0)
    cols = ranked_nodes(nodes)  # the rendezvous ranking's own columns (and its cache on the node set)
    share, cap, pshare, pcap = zeros_f.copy(), zeros_i.copy(), zeros_f.copy(), zeros_i.copy()
    matrices: dict[str, IntMatrix] = {}
    turned: dict[str, npt.NDArray[np.bool_]] = {}
    over = pover = pulled = shed = repaired = 0
    for unit, receivers in _units(groups, spread):
        kept = None if previous is None else _previous_rows(previous, unit, receivers, nodes, cols)
        res = _place_unit(unit, nodes, cols, (replica_slack, primary_slack), kept)
        for g in receivers:
            source = g.name if g.name in res.matrices else unit.groups[0].name
            matrices[g.name] = res.matrices[source].copy()
            turned[g.name] = res.turned_away[source].copy()
        # per-node figures in NodeSet order; a collocated class counts once per member group
        times = len(receivers) if not spread else 1
        share[cols.perm] += res.replica_share * times
        cap[cols.perm] += res.replica_cap * times
        pshare[cols.perm] += res.primary_share * times
        pcap[cols.perm] += res.primary_cap * times
        over += res.overflow * times
        pover += res.primary_overflow * times
        pulled += res.pulled * times
        shed += res.shed * times
        repaired += res.repaired * times
    return BalancedPlacement(matrices, share, cap, pshare, pcap, turned, over, pover, pulled, shed, repaired)


def _previous_rows(previous: PreviousPlacement, unit: _Unit, receivers: list[GroupSettings], nodes: NodeSet,
                   cols: RankedNodes) -> IntMatrix:
    """A unit's previous rows as columns: each group's own (collocated: the first receiver by name that has one)."""
    parts = []
    for g in unit.groups:
        source = next((m.name for m in [g, *receivers] if m.name in previous.matrices), g.name)
        parts.append(previous.columns(source, g.partitions, nodes, cols))
    width = max((p.shape[1] for p in parts), default=1)
    kept = np.full((unit.hkeys.size, width), -1, dtype=np.int32)
    for g, o, part in zip(unit.groups, unit.offsets, parts, strict=True):
        kept[o : o + g.partitions, : part.shape[1]] = part
    return kept


def assign_balanced(groups: Iterable[GroupSettings], nodes: NodeSet, *, spread: bool,
                    previous: PreviousPlacement | None = None) -> dict[str, IntMatrix]:
    """The balanced-v2 replica matrices of ``groups`` (see :func:`place_balanced`, which also returns the caps).

    Args:
        groups: every group placed together; order does not matter.
        nodes: the candidate (alive server) nodes; order does not matter.
        spread: balance all groups together (True) or collocate equal groups (False).
        previous: the placement to continue from (see :func:`place_balanced`), or None.

    Returns:
        group name -> ``int32`` matrix partitions x replicas of indexes into ``nodes``, column 0 the primary.

    Raises:
        InvalidBalancedGroupError: as :func:`place_balanced`.
    """
    return place_balanced(groups, nodes, spread=spread, previous=previous).matrices
