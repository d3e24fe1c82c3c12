"""The exchange kernel: every per-partition decision of one exchange, for a batch of partitions, in NumPy.

One pure function, :func:`decide`, answers for each partition of a batch the questions the partition map exchange
asks (SPEC section 4): which copies own, which are reset or lost, who serves, what must move. It does no I/O and
imports no Spark; the pipeline applies it to Arrow batches of the partitions that can change (one shuffle by
partition), and the property tests call it directly.

Input (:data:`INPUT_SCHEMA`, one Arrow table, rows in any order): tagged rows of the partitions to decide.

- ``PARTITION``: one marker row per partition to decide (only marked partitions are decided; other rows of
  unmarked partitions are an input error);
- ``MAP``: the previous committed ``partition_map`` rows of the partition, on every node (alive or not);
- ``REPORT``: the valid reports this exchange consumes (each newer than every report applied to its copy before,
  which the input validation guarantees); the newest per copy wins;
- ``ASSIGNMENT``: the previous committed ``affinity_assignment`` rows;
- ``LOST``: present when the partition is in the previous ``lost_partitions``;
- ``VERSION``: the previous ``partition_version``.

The exchange-wide facts (alive servers with their join order, the running groups with their settings, the groups
started or reset in this exchange, the rebalance threshold) come in a :class:`KernelContext`.

Decisions, in this order, per partition (docs/EXCHANGE.md has the reasons):

1. **Full map**: previous copies on alive servers, each replaced by the newest consumed report of the copy;
   reports of nodes that are not alive do not apply (validation rejects them); EVICTED copies leave.
2. **Reset**: in a group reset by ``RESET_LOST_PARTITIONS``, LOST copies become OWNING.
3. **Counters**: with M the highest counter among OWNING copies, OWNING copies below M become MOVING
   (``RESET_TO_MOVING``); when the copies at M differ in size, each gets a ``SIZE_MISMATCH`` warning.
4. **Loss**: lost when an OWNING copy existed in the previous map and none is left now; a READ_*_SAFE loss stays
   listed until its group is reset; an IGNORE loss is listed only in the version of the loss. Never for a group
   started now.
5. **Loss decisions**: copies of a READ_*_SAFE lost partition become LOST (a MOVING one with counter 0) and its
   ideal nodes without a copy get empty LOST placeholders; a partition without owners that is IGNORE, of a group
   started or reset now, or that had no copy at all in the previous map is created empty (OWNING, counter 0) on
   its ideal nodes.
6. **Late affinity**: when the ideal primary owns (or nobody owns) the ideal list serves; otherwise a temporary
   primary T (the current primary if it owns, else the first owning current backup, else the owner with the
   lowest ``node_order``) serves first, followed by the ideal list without T.
7. **Surplus and targets**: when the ideal list serves and every ideal node owns, copies outside it become
   RENTING; every ideal node without a copy gets a MOVING row (a RENTING copy on an ideal node restarts MOVING).
8. **Plan steps** (partitions with an owner): COPY to each ideal node that does not own (HISTORICAL when an owner
   at M can replay the demander's gap from its WAL, else FULL), PROMOTE when the serving primary is not the ideal
   one, DROP of every copy outside the ideal list. The supplier is chosen from the pool globally
   (:mod:`rebalancer.planning.plan`); the kernel returns the pool with each member's size and bytes.
9. **Partition version**: +1 when the serving set of nodes or the primary changed.

The kernel then checks its own output (:func:`check_invariants`): replaying each partition's steps never lowers
its OWNING copies below min(current, target) and ends with exactly the ideal nodes owning, and every partition
that has an owner is served by exactly one primary that owns. A violation raises :class:`KernelInvariantError`
with the partition's map before, its plan and its map after.

Vectorised over the batch: partitions and copies are rows of NumPy arrays sorted by (partition, node id); the
only Python loops run over groups (the affinity call) and over distinct nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.affinity.assign import RankingMemo
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.groups import GroupSettings
from rebalancer.vocabulary import (
    COPY,
    DROP,
    EVICTED,
    FULL,
    HISTORICAL,
    IGNORE,
    LOST,
    MAX_PARTITIONS,
    MOVING,
    OWNING,
    PROMOTE,
    RENTING,
    RESET_TO_MOVING,
    SIZE_MISMATCH,
    STATES,
)

__all__ = [
    "ASSIGNMENT",
    "DECISION_SCHEMAS",
    "INPUT_SCHEMA",
    "LOST_ROW",
    "MAP",
    "PARTITION",
    "REPORT",
    "VERSION",
    "Decisions",
    "KernelContext",
    "KernelInputError",
    "KernelInvariantError",
    "check_invariants",
    "decide",
]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]

# ---- input row kinds ----
PARTITION, MAP, REPORT, ASSIGNMENT, LOST_ROW, VERSION = 0, 1, 2, 3, 4, 5

INPUT_SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("group_name", pa.string()),
        ("partition_id", pa.int32()),
        ("node_id", pa.string()),
        ("state", pa.string()),
        ("update_counter", pa.int64()),
        ("size", pa.int64()),
        ("bytes", pa.int64()),
        ("wal_history_counter", pa.int64()),
        ("report_seq", pa.int64()),
        ("replica_index", pa.int32()),
        ("is_temporary", pa.bool_()),
        ("partition_version", pa.int64()),
    ]
)

_KEY = [("group_name", pa.string()), ("partition_id", pa.int32())]
#: The schema of each table of :class:`Decisions` (SPEC tables without version columns, plus the kernel's extras).
DECISION_SCHEMAS: dict[str, pa.Schema] = {
    "partition_map": pa.schema(
        [*_KEY, ("node_id", pa.string()), ("state", pa.string()), ("update_counter", pa.int64()),
         ("size", pa.int64()), ("bytes", pa.int64()), ("wal_history_counter", pa.int64())]
    ),
    "counter_conflicts": pa.schema(
        [*_KEY, ("node_id", pa.string()), ("update_counter", pa.int64()), ("max_update_counter", pa.int64()),
         ("size", pa.int64()), ("action", pa.string())]
    ),
    "lost_partitions": pa.schema(
        [*_KEY, ("loss_policy", pa.string()), ("read_allowed", pa.bool_()), ("write_allowed", pa.bool_())]
    ),
    "ideal_assignment": pa.schema([*_KEY, ("replica_index", pa.int32()), ("node_id", pa.string())]),
    "affinity_assignment": pa.schema(
        [*_KEY, ("replica_index", pa.int32()), ("node_id", pa.string()), ("is_temporary", pa.bool_())]
    ),
    "partition_versions": pa.schema([*_KEY, ("partition_version", pa.int64())]),
    # Unfinished plan steps: rebalancer.planning.plan picks each COPY's supplier from its pool and sets bytes.
    "steps": pa.schema(
        [*_KEY, ("step", pa.int32()), ("action", pa.string()), ("source_node", pa.string()),
         ("target_node", pa.string()), ("rebalance_mode", pa.string()), ("from_counter", pa.int64()),
         ("to_counter", pa.int64()), ("pool", pa.list_(pa.string())), ("pool_sizes", pa.list_(pa.int64())),
         ("pool_bytes", pa.list_(pa.int64())), ("primary_node", pa.string()), ("owners", pa.int32()),
         ("replicas", pa.int32())]
    ),
    # One row per decided partition: what the late affinity switch and the settled/unsettled split need.
    "partitions": pa.schema(
        [*_KEY, ("switch_waiting", pa.bool_()), ("switch_ready", pa.bool_()), ("has_owner", pa.bool_()),
         ("stable", pa.bool_()), ("temporary", pa.bool_())]
    ),
}


class KernelInputError(ValueError):
    """The kernel's input breaks its contract (unknown group, unmarked partition, bad state); says which row."""


class KernelInvariantError(AssertionError):
    """A decision broke the safety invariant; the message shows the partition before, its plan and after."""


@dataclass(frozen=True)
class KernelContext:
    """Exchange-wide facts shared by every batch.

    Attributes:
        nodes: the alive server nodes (the affinity candidates; only their copies and reports count).
        node_orders: ``node_order`` of every alive node (the temporary primary's last tie-break).
        groups: the running groups' settings by name (:meth:`rebalancer.groups.GroupSettings.from_row`).
        started: the groups that start in this exchange (first exchange, or ``CACHE_STARTED``).
        reset: the groups reset by ``RESET_LOST_PARTITIONS`` in this exchange.
        history_threshold: ``rebalance.history_threshold``: a supplier must hold more entries for HISTORICAL.
        ids_as_strings: ``affinity.ignite_ids_as_strings``.
        placements: a group's replica matrix decided outside the kernel, used instead of its affinity function:
            row = partition id, indexes into ``nodes``, column 0 the primary, -1 = empty slot (the shape of
            :func:`rebalancer.affinity.assign.assign_indexes`). Placing toward another system's layout.
        listed: a group's ideal lists as ``ideal_assignment`` shows them when they name nodes that are not alive
            (a persistent group over a baseline with offline nodes): node ids and a matrix of indexes into them
            (row = partition id, -1 = none). Only the table shows them; every decision uses ``placements``,
            which then holds that matrix onto ``nodes`` (:func:`rebalancer.stages.placement.placed_onto`).
    """

    nodes: NodeSet
    node_orders: Mapping[str, int]
    groups: Mapping[str, GroupSettings]
    started: frozenset[str] = frozenset()
    reset: frozenset[str] = frozenset()
    history_threshold: int = 500
    ids_as_strings: bool = False
    placements: Mapping[str, npt.NDArray[np.int32]] = field(default_factory=dict)
    listed: Mapping[str, tuple[tuple[str, ...], npt.NDArray[np.int32]]] = field(default_factory=dict)
    _cache: dict[str, object] = field(default_factory=dict, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class Decisions:
    """Everything the kernel decided for a batch, one Arrow table per output (schemas: :data:`DECISION_SCHEMAS`)."""

    partition_map: pa.Table
    counter_conflicts: pa.Table
    lost_partitions: pa.Table
    ideal_assignment: pa.Table
    affinity_assignment: pa.Table
    partition_versions: pa.Table
    steps: pa.Table
    partitions: pa.Table

    def tables(self) -> dict[str, pa.Table]:
        """The tables by name, in :data:`DECISION_SCHEMAS` order."""
        return {name: getattr(self, name) for name in DECISION_SCHEMAS}


# ---- state codes (index into STATES) and their alphabetical rank (the old tie-break "state ascending") ----
_S_OWNING, _S_MOVING, _S_RENTING, _S_EVICTED, _S_LOST = (STATES.index(s) for s in (OWNING, MOVING, RENTING,
                                                                                    EVICTED, LOST))
_STATE_ALPHA = np.argsort(np.argsort(np.array(STATES)))  # code -> rank of its name in alphabetical order
_STATE_NAMES = pa.array(STATES, pa.string())
_NO = -1  # "none" in index arrays


# =====================================================================================================================
# Small vectorised helpers over rows sorted by partition
# =====================================================================================================================


def _seg_any(q: I64, mask: B, n: int) -> B:
    """Per partition: whether any row of it has ``mask``."""
    return np.bincount(q[mask], minlength=n) > 0


def _seg_count(q: I64, mask: B, n: int) -> I64:
    return np.bincount(q[mask], minlength=n).astype(np.int64)


def _seg_max(q: I64, values: I64, mask: B, n: int, empty: int = _NO) -> I64:
    """Per partition: the largest ``values`` among rows with ``mask`` (``empty`` where there is none)."""
    out = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(out, q[mask], values[mask])
    out[out == np.iinfo(np.int64).min] = empty
    return out


def _seg_min(q: I64, values: I64, mask: B, n: int, empty: int = _NO) -> I64:
    out = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, q[mask], values[mask])
    out[out == np.iinfo(np.int64).max] = empty
    return out


def _rank_in_segment(q: I64) -> I64:
    """0-based position of each row inside its run of equal ``q`` (rows sorted by ``q``)."""
    n = q.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.r_[0, np.flatnonzero(q[1:] != q[:-1]) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, n]))
    return np.arange(n, dtype=np.int64) - first


def _first_of_runs(keys: I64) -> B:
    """True on the first row of each run of equal ``keys`` (rows sorted by key)."""
    out = np.ones(keys.size, dtype=bool)
    out[1:] = keys[1:] != keys[:-1]
    return out


def _unique(values: I64) -> I64:
    """The sorted distinct keys by one sort: NumPy 2.4's ``np.unique`` without ``return_*`` first builds a hash
    table, 60x slower on XL's 786,432 keys (0.75 s against 0.012 s)."""
    ordered = np.sort(values)
    return ordered[_first_of_runs(ordered)]


def _lookup(sorted_keys: I64, keys: I64) -> I64:
    """Index of each of ``keys`` in the unique sorted array ``sorted_keys``, or -1."""
    if sorted_keys.size == 0:
        return np.full(keys.size, _NO, dtype=np.int64)
    pos = np.searchsorted(sorted_keys, keys)
    pos_c = np.minimum(pos, sorted_keys.size - 1)
    return np.where(sorted_keys[pos_c] == keys, pos_c, _NO).astype(np.int64)


def _int(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> I64:
    if column.null_count:
        column = pc.fill_null(column, fill)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


# =====================================================================================================================
# Decoding the input
# =====================================================================================================================


@dataclass
class _Nodes:
    """The node dictionary of a batch: alive servers first (codes = NodeSet indexes), then other nodes seen."""

    ids: pa.Array  # string, code -> node id
    alive: int  # codes < alive are alive servers
    rank: I64  # code -> rank of the id in string order (ties broken by node id, as Spark sorts strings)
    order: I64  # code -> node_order (alive nodes; int64 max otherwise)

    def encode(self, column: pa.ChunkedArray | pa.Array) -> I64:
        codes = pc.index_in(column, value_set=self.ids)
        return _int(codes, _NO)


def _node_dictionary(ctx: KernelContext, column: pa.ChunkedArray) -> _Nodes:
    alive_ids = ctx._cache.get("alive_ids")
    if alive_ids is None:
        alive_ids = pa.array(ctx.nodes.node_ids, pa.string())
        ctx._cache["alive_ids"] = alive_ids
    assert isinstance(alive_ids, pa.Array)
    present = pc.unique(pc.drop_null(column)) if len(column) else pa.array([], pa.string())
    extra = pc.filter(present, pc.invert(pc.is_in(present, value_set=alive_ids))) if len(present) else present
    ids = pa.concat_arrays([alive_ids, extra.cast(pa.string())]) if len(extra) else alive_ids
    rank = np.empty(len(ids), dtype=np.int64)
    rank[np.asarray(pc.sort_indices(ids).to_numpy(), dtype=np.int64)] = np.arange(len(ids), dtype=np.int64)
    order = np.full(len(ids), np.iinfo(np.int64).max, dtype=np.int64)
    for i, node_id in enumerate(ctx.nodes.node_ids):
        order[i] = int(ctx.node_orders.get(node_id, np.iinfo(np.int64).max))
    return _Nodes(ids=ids, alive=len(alive_ids), rank=rank, order=order)


@dataclass
class _Batch:
    """The partitions of a batch (sorted by group name, partition id) and their per-partition facts."""

    n: int
    group_names: list[str]  # group code -> name, in string order
    group: I64  # per partition: group code
    pid: I64  # per partition: partition id
    settings: list[GroupSettings]  # group code -> settings
    prev_lost: B
    prev_version: I64  # -1: none

    def of_group(self, attribute: str) -> npt.NDArray[np.generic]:
        values = np.array([getattr(s, attribute) for s in self.settings])
        return values[self.group] if self.n else values[:0]

    def in_groups(self, names: frozenset[str]) -> B:
        """Per partition: whether its group is one of ``names``."""
        member = np.array([g in names for g in self.group_names], dtype=bool)
        return member[self.group] if self.n else member[:0]


def _partition_codes(table: pa.Table, ctx: KernelContext) -> tuple[_Batch, I64]:
    """The batch's partitions from the marker rows, and each input row's partition index."""
    kind = _int(table.column("kind"))
    names = table.column("group_name")
    group_names = sorted(str(g) for g in pc.unique(pc.drop_null(names)).to_pylist())
    unknown = [g for g in group_names if g not in ctx.groups]
    if unknown:
        raise KernelInputError(f"rows of groups {unknown[:5]} that are not running in this exchange")
    row_group = _int(pc.index_in(names, value_set=pa.array(group_names, pa.string())), _NO)
    pid = _int(table.column("partition_id"), _NO)
    if (row_group < 0).any() or (pid < 0).any():
        raise KernelInputError("every input row needs a group_name and a partition_id >= 0")
    row_key = row_group * MAX_PARTITIONS + pid
    marked = _unique(row_key[kind == PARTITION])
    q = _lookup(marked, row_key)
    if (q < 0).any():
        bad = int(np.flatnonzero(q < 0)[0])
        raise KernelInputError(
            f"a row of group {group_names[row_group[bad]]!r} partition {pid[bad]} has no PARTITION marker row"
        )
    settings = [ctx.groups[g] for g in group_names]
    group = marked // MAX_PARTITIONS
    part = marked % MAX_PARTITIONS
    size = np.array([s.partitions for s in settings], dtype=np.int64)
    if marked.size and (part >= size[group]).any():
        i = int(np.flatnonzero(part >= size[group])[0])
        raise KernelInputError(
            f"partition {part[i]} of group {group_names[group[i]]!r} is outside 0..{size[group[i]] - 1}"
        )
    n = marked.size
    prev_lost = _seg_any(q, kind == LOST_ROW, n)
    prev_version = _seg_max(q, _int(table.column("partition_version"), 0), kind == VERSION, n)
    batch = _Batch(n, group_names, group, part, settings, prev_lost, prev_version)
    return batch, q


def _state_codes(column: pa.ChunkedArray) -> I64:
    codes = _int(pc.index_in(column, value_set=_STATE_NAMES), _NO)
    return codes


# =====================================================================================================================
# The decision
# =====================================================================================================================


@dataclass
class _Copies:
    """Copy rows sorted by (partition, node id rank): the map as it is being decided."""

    q: I64
    node: I64
    state: I64
    counter: I64
    size: I64
    nbytes: I64
    wal: I64
    has_wal: B

    def take(self, index: npt.NDArray[np.integer] | B) -> _Copies:
        return _Copies(*(getattr(self, f)[index] for f in _COPY_FIELDS))


_COPY_FIELDS = ("q", "node", "state", "counter", "size", "nbytes", "wal", "has_wal")


def _concat(parts: Sequence[_Copies]) -> _Copies:
    return _Copies(*(np.concatenate([getattr(p, f) for p in parts]) for f in _COPY_FIELDS))


def _sorted(c: _Copies, nodes: _Nodes) -> _Copies:
    order = np.lexsort((nodes.rank[c.node], c.q))
    return c.take(order)


def _rows_of(table: pa.Table, kind: I64, which: int, q: I64, nodes: _Nodes) -> _Copies:
    mask = kind == which
    sub = table.filter(pa.array(mask))
    wal = sub.column("wal_history_counter")
    return _Copies(
        q=q[mask],
        node=nodes.encode(sub.column("node_id")),
        state=_state_codes(sub.column("state")),
        counter=_int(sub.column("update_counter")),
        size=_int(sub.column("size")),
        nbytes=_int(sub.column("bytes")),
        wal=_int(wal),
        has_wal=np.asarray(pc.is_valid(wal).to_numpy(zero_copy_only=False), dtype=bool),
    )


def _base_map(table: pa.Table, kind: I64, q: I64, nodes: _Nodes) -> tuple[_Copies, _Copies]:
    """Step 1: the previous map on alive servers overridden by the newest report per copy; and the previous map."""
    prev = _rows_of(table, kind, MAP, q, nodes)
    reports = _rows_of(table, kind, REPORT, q, nodes)
    seq = _int(table.filter(pa.array(kind == REPORT)).column("report_seq"), -1)
    for name, rows in (("MAP", prev), ("REPORT", reports)):
        if (rows.node < 0).any() or (rows.state < 0).any():
            raise KernelInputError(f"a {name} row has no node_id or a state outside {', '.join(STATES)}")
    alive_prev = prev.take(prev.node < nodes.alive)
    alive_rep = reports.take(reports.node < nodes.alive)
    seq = seq[reports.node < nodes.alive]
    both = _concat([alive_rep, alive_prev])
    source = np.r_[np.zeros(alive_rep.q.size, np.int64), np.ones(alive_prev.q.size, np.int64)]
    seq_all = np.r_[seq, np.zeros(alive_prev.q.size, np.int64)]
    # Newest first: reports before the previous row, then report_seq, counter, size, bytes descending, state name
    # ascending (equal seqs for one copy are rejected by validation; the rest only makes the choice total).
    order = np.lexsort((
        _STATE_ALPHA[both.state], -both.nbytes, -both.size, -both.counter, -seq_all, source,
        nodes.rank[both.node], both.q,
    ))
    chosen = both.take(order)
    copy_key = chosen.q * len(nodes.ids) + nodes.rank[chosen.node]
    chosen = chosen.take(_first_of_runs(copy_key))
    return chosen.take(chosen.state != _S_EVICTED), prev


@dataclass
class _Ideal:
    """Ideal rows sorted by (partition, replica_index)."""

    q: I64
    replica: I64
    node: I64
    count: I64  # per partition
    primary: I64  # per partition: node code or -1


def _ideal(batch: _Batch, ctx: KernelContext) -> _Ideal:
    qs: list[I64] = []
    replicas: list[I64] = []
    nodes: list[I64] = []
    all_q = np.arange(batch.n, dtype=np.int64)
    ranking = RankingMemo(ctx.nodes, ctx.ids_as_strings)
    for g, settings in enumerate(batch.settings):
        members = all_q[batch.group == g]
        if members.size == 0 or len(ctx.nodes) == 0:
            continue
        placed = ctx.placements.get(settings.name)
        matrix = placed[batch.pid[members]] if placed is not None else ranking(batch.pid[members], settings)
        row, col = np.nonzero(matrix >= 0)  # row-major: (partition, replica) order
        qs.append(members[row])
        replicas.append(col.astype(np.int64))
        nodes.append(matrix[row, col].astype(np.int64))
    q = np.concatenate(qs) if qs else np.zeros(0, np.int64)
    replica = np.concatenate(replicas) if replicas else np.zeros(0, np.int64)
    node = np.concatenate(nodes) if nodes else np.zeros(0, np.int64)
    order = np.lexsort((replica, q))
    q, replica, node = q[order], replica[order], node[order]
    primary = np.full(batch.n, _NO, dtype=np.int64)
    primary[q[replica == 0]] = node[replica == 0]
    return _Ideal(q, replica, node, np.bincount(q, minlength=batch.n).astype(np.int64), primary)


@dataclass
class _Slots:
    """Copies and ideal slots merged on (partition, node), sorted by (partition, node id rank)."""

    copies: _Copies  # copy fields (undefined where not is_copy)
    is_copy: B
    is_ideal: B
    replica: I64  # ideal replica_index, -1 when not ideal


def _slots(copies: _Copies, ideal: _Ideal, nodes: _Nodes) -> _Slots:
    nn = len(nodes.ids)
    copy_key = copies.q * nn + nodes.rank[copies.node]
    ideal_key = ideal.q * nn + nodes.rank[ideal.node]
    keys = _unique(np.concatenate([copy_key, ideal_key]))  # np.union1d: np.unique's slow path
    n = keys.size
    ci = _lookup(copy_key, keys) if copy_key.size else np.full(n, _NO, np.int64)
    ii_sorted = np.argsort(ideal_key, kind="stable")
    ii = _lookup(ideal_key[ii_sorted], keys)
    is_copy, is_ideal = ci >= 0, ii >= 0
    safe_ci = np.where(is_copy, ci, 0)
    if copies.q.size:
        filled = copies.take(safe_ci)
    else:
        zeros = np.zeros(n, np.int64)
        filled = _Copies(zeros, zeros, zeros, zeros, zeros, zeros, zeros, np.zeros(n, bool))
    q = keys // nn
    rank_to_code = np.argsort(nodes.rank)
    node = rank_to_code[keys % nn]
    filled.q, filled.node = q, node
    ideal_pos = ii_sorted[np.where(is_ideal, ii, 0)] if ideal_key.size else np.zeros(n, np.int64)
    replica = np.where(is_ideal, ideal.replica[ideal_pos] if ideal.replica.size else 0, _NO)
    return _Slots(filled, is_copy, is_ideal, replica)


def _prev_assignment(table: pa.Table, kind: I64, q: I64, nodes: _Nodes) -> tuple[I64, I64, I64, B]:
    """The previous assignment rows: partition, replica_index, node code, is_temporary (sorted by partition, index)."""
    mask = kind == ASSIGNMENT
    sub = table.filter(pa.array(mask))
    aq, rep, node = q[mask], _int(sub.column("replica_index"), _NO), nodes.encode(sub.column("node_id"))
    temp = np.asarray(pc.fill_null(sub.column("is_temporary"), False).to_numpy(zero_copy_only=False), dtype=bool)
    order = np.lexsort((rep, aq))
    return aq[order], rep[order], node[order], temp[order]


def decide(table: pa.Table, ctx: KernelContext) -> Decisions:
    """Decide every marked partition of ``table`` (module docstring).

    Args:
        table: tagged input rows (:data:`INPUT_SCHEMA`; extra columns are ignored), in any order.
        ctx: the exchange-wide facts.

    Returns:
        The decisions, one table per output, rows sorted by (group_name, partition_id, ...).

    Raises:
        KernelInputError: the input breaks the contract (the message names the row).
        KernelInvariantError: a decision broke the safety invariant (never expected; the message shows the
            partition's map before, its plan and its map after).
    """
    if table.schema != INPUT_SCHEMA:
        missing = [name for name in INPUT_SCHEMA.names if name not in table.column_names]
        if missing:
            raise KernelInputError(
                f"the kernel's input lacks columns {missing}; expected {INPUT_SCHEMA.names}, got {table.column_names}"
            )
        table = table.select(INPUT_SCHEMA.names).cast(INPUT_SCHEMA)
    batch, q = _partition_codes(table, ctx)
    kind = _int(table.column("kind"))
    nodes = _node_dictionary(ctx, table.column("node_id"))
    n = batch.n
    started, reset = batch.in_groups(ctx.started), batch.in_groups(ctx.reset)
    policy = batch.of_group("loss_policy").astype(object)
    ignore = policy == IGNORE

    # 1. full map; 2. reset
    copies, prev = _base_map(table, kind, q, nodes)
    copies = _sorted(copies, nodes)
    copies.state = np.where(reset[copies.q] & (copies.state == _S_LOST), _S_OWNING, copies.state)
    prev_owned = _seg_any(prev.q, prev.state == _S_OWNING, n)
    had_copy = _seg_any(prev.q, np.ones(prev.q.size, bool), n)

    # 3. counters
    owning = copies.state == _S_OWNING
    top = _seg_max(copies.q, copies.counter, owning, n)
    below = owning & (copies.counter < top[copies.q])
    at_top = owning & (copies.counter == top[copies.q])
    mismatch = at_top & (
        _seg_min(copies.q, copies.size, at_top, n)[copies.q] != _seg_max(copies.q, copies.size, at_top, n)[copies.q]
    )
    conflict_rows = copies.take(below | mismatch)
    conflict_top = top[conflict_rows.q]
    conflict_action = np.where(below[below | mismatch], RESET_TO_MOVING, SIZE_MISMATCH)
    copies.state = np.where(below, _S_MOVING, copies.state)

    # the ideal lists, and the switch flags on the map as the nodes report it (after the counter rule only)
    ideal = _ideal(batch, ctx)
    slots_now = _slots(copies, ideal, nodes)
    owns_now = slots_now.is_copy & (slots_now.copies.state == _S_OWNING)
    has_owner = _seg_any(copies.q, copies.state == _S_OWNING, n)
    switch_ready = (ideal.count > 0) & (_seg_count(slots_now.copies.q, owns_now & slots_now.is_ideal, n) == ideal.count)
    a_q, a_rep, a_node, a_temp = _prev_assignment(table, kind, q, nodes)
    prev_moving = prev.take(prev.state == _S_MOVING)
    prev_moving_ideal = _lookup(
        np.sort(ideal.q * len(nodes.ids) + nodes.rank[ideal.node]),
        prev_moving.q * len(nodes.ids) + nodes.rank[np.maximum(prev_moving.node, 0)],
    ) >= 0
    switch_waiting = _seg_any(a_q, a_temp, n) | _seg_any(prev_moving.q, prev_moving_ideal & (prev_moving.node >= 0), n)

    # 4. loss
    owned = has_owner
    newly_lost = prev_owned & ~owned
    sticky = batch.prev_lost & ~reset & ~ignore
    lost = (newly_lost | sticky) & ~started
    safe_lost = lost & ~ignore
    recreate = ~owned & ~safe_lost & (ignore | started | reset | ~had_copy)

    # 5. loss decisions over copies and ideal slots
    s = slots_now
    c = s.copies
    sq = c.q
    fresh = s.is_ideal & recreate[sq]
    keep = s.is_copy | (s.is_ideal & (safe_lost[sq] | recreate[sq]))
    empty = fresh | (~s.is_copy & safe_lost[sq])
    state = np.where(fresh, _S_OWNING, np.where(safe_lost[sq], _S_LOST, c.state))
    counter = np.where(empty | (safe_lost[sq] & s.is_copy & (c.state == _S_MOVING)), 0, c.counter)
    size = np.where(empty, 0, c.size)
    nbytes = np.where(empty, 0, c.nbytes)
    has_wal = np.where(empty, False, c.has_wal & s.is_copy)
    c.state, c.counter, c.size, c.nbytes, c.has_wal = state, counter, size, nbytes, has_wal
    in_map = keep.copy()

    # 6. late affinity
    owner = in_map & (c.state == _S_OWNING)
    owners = _seg_count(sq, owner, n)
    primary_owns = _seg_any(sq, owner & s.is_ideal & (s.replica == 0), n)
    temporary = (owners > 0) & (ideal.count > 0) & ~primary_owns
    current_index = np.full(sq.size, np.iinfo(np.int64).max, dtype=np.int64)
    a_key = a_q * len(nodes.ids) + nodes.rank[np.maximum(a_node, 0)]
    a_order = np.argsort(a_key, kind="stable")
    slot_key = sq * len(nodes.ids) + nodes.rank[c.node]
    pos = _lookup(a_key[a_order], slot_key) if a_key.size else np.full(sq.size, _NO, np.int64)
    found = pos >= 0
    current_index[found] = a_rep[a_order][pos[found]]
    candidates = np.flatnonzero(owner & temporary[sq])
    t_node = np.full(n, _NO, dtype=np.int64)
    if candidates.size:
        cand_order = np.lexsort((
            nodes.rank[c.node[candidates]], nodes.order[c.node[candidates]], current_index[candidates],
            sq[candidates],
        ))
        ranked = candidates[cand_order]
        first = ranked[_first_of_runs(sq[ranked])]
        t_node[sq[first]] = c.node[first]
    assignment = _late_assignment(ideal, temporary, t_node)

    # 7. surplus copies RENTING, MOVING targets
    all_own = (ideal.count > 0) & (_seg_count(sq, owner & s.is_ideal, n) == ideal.count)
    settled = ~temporary & (ideal.count > 0)
    surplus = in_map & ~s.is_ideal & np.isin(c.state, (_S_OWNING, _S_MOVING)) & settled[sq] & all_own[sq]
    c.state = np.where(surplus, _S_RENTING, c.state)
    refill = s.is_ideal & (~in_map | (c.state == _S_RENTING))
    c.state = np.where(refill, _S_MOVING, c.state)
    for values in (c.counter, c.size, c.nbytes):
        values[refill] = 0
    c.has_wal = np.where(refill, False, c.has_wal)
    in_map = in_map | s.is_ideal
    final = c.take(in_map)
    final_ideal, final_replica = s.is_ideal[in_map], s.replica[in_map]

    # 8. plan steps; 9. versions
    steps = _plan_steps(batch, final, final_ideal, final_replica, ideal, assignment, nodes, ctx.history_threshold)
    versions = _versions(batch, assignment, a_q, a_node, a_rep)

    stable = (
        settled & ~lost & (_seg_count(conflict_rows.q, np.ones(conflict_rows.q.size, bool), n) == 0)
        & (_seg_count(final.q, final_ideal & (final.state == _S_OWNING), n) == ideal.count)
        & (_seg_count(final.q, np.ones(final.q.size, bool), n) == ideal.count)
    )
    bad = _violations(
        _Facts(
            n=n, map_q=final.q, map_node=final.node, map_owning=final.state == _S_OWNING,
            ideal_q=ideal.q, ideal_node=ideal.node,
            primary_q=assignment.q[assignment.replica == 0], primary_node=assignment.node[assignment.replica == 0],
            step_q=steps.q, step=steps.step, step_action=steps.action, step_source=steps.source,
            step_target=steps.target,
        ),
        len(nodes.ids),
    )
    decisions = Decisions(
        partition_map=_map_table(batch, final, nodes),
        counter_conflicts=_conflicts_table(batch, conflict_rows, conflict_top, conflict_action, nodes),
        lost_partitions=_lost_table(batch, lost, policy),
        ideal_assignment=_ideal_table(batch, ideal, nodes, ctx),
        affinity_assignment=_assignment_table(batch, assignment, nodes),
        partition_versions=versions,
        steps=_steps_table(batch, steps, nodes),
        partitions=_partitions_table(batch, switch_waiting, switch_ready, has_owner, stable, temporary),
    )
    if bad.size:
        q_bad = int(bad[0])
        raise KernelInvariantError(_describe((batch.group_names[batch.group[q_bad]], int(batch.pid[q_bad])),
                                             decisions))
    return decisions


@dataclass
class _Assignment:
    """Serving assignment rows sorted by (partition, replica_index)."""

    q: I64
    replica: I64
    node: I64
    temporary: B  # per row


def _late_assignment(ideal: _Ideal, temporary: B, t_node: I64) -> _Assignment:
    """T followed by the ideal list without T for temporary partitions; the ideal list otherwise."""
    q, rep, node = ideal.q, ideal.replica, ideal.node
    temp_row = temporary[q]
    t_of_row = t_node[q]
    is_t = temp_row & (node == t_of_row)
    t_index = np.full(temporary.size, np.iinfo(np.int64).max, dtype=np.int64)
    t_index[q[is_t]] = rep[is_t]
    shifted = np.where(temp_row & (rep < t_index[q]), rep + 1, rep)
    keep = ~is_t
    heads = np.flatnonzero(temporary)
    out_q = np.r_[q[keep], heads]
    out_rep = np.r_[shifted[keep], np.zeros(heads.size, np.int64)]
    out_node = np.r_[node[keep], t_node[heads]]
    order = np.lexsort((out_rep, out_q))
    out_q, out_rep, out_node = out_q[order], out_rep[order], out_node[order]
    return _Assignment(out_q, out_rep, out_node, temporary[out_q])


@dataclass
class _Steps:
    """Unfinished plan steps sorted by (partition, step)."""

    q: I64
    step: I64
    action: npt.NDArray[np.object_]
    source: I64  # node code or -1 (COPY: chosen later)
    target: I64  # node code or -1
    historical: B
    from_counter: I64
    to_counter: I64
    pool_start: I64  # COPY: the row's pool is pool_*[pool_start:pool_end]; empty for PROMOTE and DROP
    pool_end: I64
    pool_node: I64
    pool_size: I64
    pool_bytes: I64
    primary: I64  # per row: serving primary of the partition, or -1
    owners: I64
    replicas: I64


def _plan_steps(
    batch: _Batch, final: _Copies, is_ideal: B, replica: I64, ideal: _Ideal, assignment: _Assignment, nodes: _Nodes,
    threshold: int,
) -> _Steps:
    n = batch.n
    fq = final.q
    owning = final.state == _S_OWNING
    owners = _seg_count(fq, owning, n)
    top = _seg_max(fq, final.counter, owning, n)
    bearing = owners > 0
    # demands: ideal nodes without an OWNING copy, by (replica_index, node id)
    demand = np.flatnonzero(is_ideal & ~owning & bearing[fq])
    demand = demand[np.lexsort((nodes.rank[final.node[demand]], replica[demand], fq[demand]))]
    d_q = fq[demand]
    d_c = np.where(final.state[demand] == _S_MOVING, final.counter[demand], 0)
    d_m = top[d_q]
    # pools: owners at the top counter, by node id (final is sorted by partition, node id rank)
    pool_rows = np.flatnonzero(owning & (final.counter == top[fq]))
    p_q = fq[pool_rows]
    p_start = np.searchsorted(p_q, np.arange(n), side="left")
    p_end = np.searchsorted(p_q, np.arange(n), side="right")
    k = (p_end - p_start)[d_q]
    # demand x pool member pairs, to test eligibility for HISTORICAL per demand
    pair_d = np.repeat(np.arange(demand.size), k)
    pair_m = pool_rows[np.repeat(p_start[d_q], k) + _rank_in_segment(pair_d)] if pair_d.size else pair_d
    c_, m_ = d_c[pair_d], d_m[pair_d]
    eligible = (
        (c_ > 0) & (c_ < m_) & final.has_wal[pair_m] & (final.wal[pair_m] <= c_)
        & (final.size[pair_m] > threshold) & ((m_ - c_) < final.size[pair_m])
    )
    historical = np.bincount(pair_d[eligible], minlength=demand.size) > 0
    in_pool = np.where(historical[pair_d], eligible, True)
    pool_d, pool_m = pair_d[in_pool], pair_m[in_pool]
    pool_offsets = np.r_[0, np.cumsum(np.bincount(pool_d, minlength=demand.size))].astype(np.int64)

    primary = np.full(n, _NO, dtype=np.int64)
    primary[assignment.q[assignment.replica == 0]] = assignment.node[assignment.replica == 0]
    copies_per = np.bincount(d_q, minlength=n).astype(np.int64)
    promote = bearing & (primary >= 0) & (primary != ideal.primary)
    drop = np.flatnonzero(~is_ideal & bearing[fq])  # sorted by partition, node id
    drop_q = fq[drop]

    pq = np.flatnonzero(promote)
    q_all = np.r_[d_q, pq, drop_q]
    step = np.r_[
        _rank_in_segment(d_q) + 1,
        copies_per[pq] + 1,
        copies_per[drop_q] + promote[drop_q] + _rank_in_segment(drop_q) + 1,
    ]
    action = np.r_[np.full(d_q.size, COPY, object), np.full(pq.size, PROMOTE, object), np.full(drop_q.size, DROP,
                                                                                              object)]
    source = np.r_[np.full(d_q.size, _NO), primary[pq], final.node[drop]]
    target = np.r_[final.node[demand], ideal.primary[pq], np.full(drop_q.size, _NO)]
    hist = np.r_[historical, np.zeros(pq.size + drop_q.size, bool)]
    from_counter = np.r_[np.where(historical, d_c, 0), np.full(pq.size + drop_q.size, _NO)]
    to_counter = np.r_[d_m, np.full(pq.size + drop_q.size, _NO)]
    none = np.zeros(pq.size + drop_q.size, np.int64)
    starts, ends = np.r_[pool_offsets[:-1], none], np.r_[pool_offsets[1:], none]
    # Rows in (partition, step) order; the pool arrays stay in demand order, addressed by (start, end).
    order = np.lexsort((step, q_all))
    return _Steps(
        q=q_all[order], step=step[order], action=action[order], source=source[order], target=target[order],
        historical=hist[order], from_counter=from_counter[order], to_counter=to_counter[order],
        pool_start=starts[order], pool_end=ends[order],
        pool_node=final.node[pool_m], pool_size=final.size[pool_m], pool_bytes=final.nbytes[pool_m],
        primary=primary[q_all[order]], owners=owners[q_all[order]], replicas=ideal.count[q_all[order]],
    )


def _versions(batch: _Batch, a: _Assignment, prev_q: I64, prev_node: I64, prev_rep: I64) -> pa.Table:
    """Step 9: +1 when the set of serving nodes or the primary changed (from 0 for a partition assigned anew)."""
    n = batch.n
    assigned = np.bincount(a.q, minlength=n) > 0
    now_count = np.bincount(a.q, minlength=n)
    prev_count = np.bincount(prev_q, minlength=n)
    now_primary = np.full(n, _NO, np.int64)
    now_primary[a.q[a.replica == 0]] = a.node[a.replica == 0]
    prev_primary = np.full(n, _NO, np.int64)
    prev_primary[prev_q[prev_rep == 0]] = prev_node[prev_rep == 0]
    same_count = (now_count == prev_count) & (prev_count > 0)
    now_keys = np.sort(a.q * (1 << 32) + a.node)
    prev_keys = np.sort(prev_q * (1 << 32) + prev_node)
    now_sel = now_keys[same_count[now_keys >> 32]]
    prev_sel = prev_keys[same_count[prev_keys >> 32]]
    differs = np.zeros(n, bool)
    mismatch = now_sel != prev_sel
    differs[(now_sel >> 32)[mismatch]] = True
    changed = ~same_count | differs | (now_primary != prev_primary)
    version = np.maximum(batch.prev_version, 0) + changed
    idx = np.flatnonzero(assigned)
    return _keyed(batch, idx, {"partition_version": pa.array(version[idx], pa.int64())}, "partition_versions")


# =====================================================================================================================
# Encoding the output
# =====================================================================================================================


def _keyed(batch: _Batch, q: I64, columns: dict[str, pa.Array], name: str) -> pa.Table:
    group_names = pa.array(batch.group_names, pa.string())
    data = {
        "group_name": group_names.take(pa.array(batch.group[q], pa.int64())) if q.size else pa.array([], pa.string()),
        "partition_id": pa.array(batch.pid[q], pa.int32()),
        **columns,
    }
    return pa.table(data, schema=DECISION_SCHEMAS[name])


def _node_array(nodes: _Nodes, codes: I64) -> pa.Array:
    mask = codes < 0
    return nodes.ids.take(pa.array(np.maximum(codes, 0), pa.int64(), mask=mask)) if codes.size else pa.array(
        [], pa.string())


def _state_array(codes: I64) -> pa.Array:
    return _STATE_NAMES.take(pa.array(codes, pa.int64())) if codes.size else pa.array([], pa.string())


def _map_table(batch: _Batch, c: _Copies, nodes: _Nodes) -> pa.Table:
    return _keyed(batch, c.q, {
        "node_id": _node_array(nodes, c.node),
        "state": _state_array(c.state),
        "update_counter": pa.array(c.counter, pa.int64()),
        "size": pa.array(c.size, pa.int64()),
        "bytes": pa.array(c.nbytes, pa.int64()),
        "wal_history_counter": pa.array(c.wal, pa.int64(), mask=~c.has_wal),
    }, "partition_map")


def _conflicts_table(batch: _Batch, c: _Copies, top: I64, action: npt.NDArray[np.str_], nodes: _Nodes) -> pa.Table:
    return _keyed(batch, c.q, {
        "node_id": _node_array(nodes, c.node),
        "update_counter": pa.array(c.counter, pa.int64()),
        "max_update_counter": pa.array(top, pa.int64()),
        "size": pa.array(c.size, pa.int64()),
        "action": pa.array(action.tolist(), pa.string()),
    }, "counter_conflicts")


def _lost_table(batch: _Batch, lost: B, policy: npt.NDArray[np.object_]) -> pa.Table:
    q = np.flatnonzero(lost)
    allowed = policy[q] == IGNORE
    return _keyed(batch, q, {
        "loss_policy": pa.array(policy[q].tolist(), pa.string()),
        "read_allowed": pa.array(allowed, pa.bool_()),
        "write_allowed": pa.array(allowed, pa.bool_()),
    }, "lost_partitions")


def _ideal_table(batch: _Batch, ideal: _Ideal, nodes: _Nodes, ctx: KernelContext) -> pa.Table:
    listed = [g for g, name in enumerate(batch.group_names) if name in ctx.listed]
    keep = ~np.isin(batch.group[ideal.q], listed) if listed else np.ones(ideal.q.size, dtype=bool)
    table = _keyed(batch, ideal.q[keep], {
        "replica_index": pa.array(ideal.replica[keep], pa.int32()),
        "node_id": _node_array(nodes, ideal.node[keep]),
    }, "ideal_assignment")
    parts = [table]
    for g in listed:  # the group's lists as placed, offline nodes included
        ids, matrix = ctx.listed[batch.group_names[g]]
        members = np.flatnonzero(batch.group == g)
        rows = matrix[batch.pid[members]]
        row, col = np.nonzero(rows >= 0)
        parts.append(_keyed(batch, members[row], {
            "replica_index": pa.array(col, pa.int32()),
            "node_id": pa.array(ids, pa.string()).take(pa.array(rows[row, col], pa.int64())),
        }, "ideal_assignment"))
    return pa.concat_tables(parts) if len(parts) > 1 else table


def _assignment_table(batch: _Batch, a: _Assignment, nodes: _Nodes) -> pa.Table:
    return _keyed(batch, a.q, {
        "replica_index": pa.array(a.replica, pa.int32()),
        "node_id": _node_array(nodes, a.node),
        "is_temporary": pa.array(a.temporary, pa.bool_()),
    }, "affinity_assignment")


def _steps_table(batch: _Batch, st: _Steps, nodes: _Nodes) -> pa.Table:
    lengths = st.pool_end - st.pool_start
    take = (np.repeat(st.pool_start, lengths) + _rank_in_segment(np.repeat(np.arange(st.q.size), lengths))
            if lengths.sum() else np.zeros(0, np.int64))
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32), pa.int32())
    is_copy = st.action == COPY

    def lists(values: pa.Array) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, values, mask=pa.array(~is_copy))

    mode = np.full(st.q.size, None, dtype=object)
    mode[is_copy] = np.where(st.historical[is_copy], HISTORICAL, FULL)
    return _keyed(batch, st.q, {
        "step": pa.array(st.step, pa.int32()),
        "action": pa.array(st.action.tolist(), pa.string()),
        "source_node": _node_array(nodes, st.source),
        "target_node": _node_array(nodes, st.target),
        "rebalance_mode": pa.array(mode.tolist(), pa.string()),
        "from_counter": pa.array(st.from_counter, pa.int64(), mask=~is_copy),
        "to_counter": pa.array(st.to_counter, pa.int64(), mask=~is_copy),
        "pool": lists(_node_array(nodes, st.pool_node[take])),
        "pool_sizes": lists(pa.array(st.pool_size[take], pa.int64())),
        "pool_bytes": lists(pa.array(st.pool_bytes[take], pa.int64())),
        "primary_node": _node_array(nodes, st.primary),
        "owners": pa.array(st.owners, pa.int32()),
        "replicas": pa.array(st.replicas, pa.int32()),
    }, "steps")


def _partitions_table(batch: _Batch, waiting: B, ready: B, has_owner: B, stable: B, temporary: B) -> pa.Table:
    q = np.arange(batch.n, dtype=np.int64)
    return _keyed(batch, q, {
        "switch_waiting": pa.array(waiting, pa.bool_()),
        "switch_ready": pa.array(ready, pa.bool_()),
        "has_owner": pa.array(has_owner, pa.bool_()),
        "stable": pa.array(stable, pa.bool_()),
        "temporary": pa.array(temporary, pa.bool_()),
    }, "partitions")


# =====================================================================================================================
# The invariant
# =====================================================================================================================


@dataclass
class _Facts:
    """What the invariant reads, as integer codes: partitions ``q`` and nodes, rows sorted as decided."""

    n: int  # partitions
    map_q: I64
    map_node: I64
    map_owning: B
    ideal_q: I64
    ideal_node: I64
    primary_q: I64  # rows of affinity_assignment with replica_index 0
    primary_node: I64
    step_q: I64  # plan rows in (partition, step) order
    step: I64
    step_action: npt.NDArray[np.object_]
    step_source: I64
    step_target: I64


def check_invariants(d: Decisions) -> None:
    """Raise :class:`KernelInvariantError` unless the decisions are safe (module docstring).

    For every partition with plan steps, replaying them in ``step`` order from the decided map: steps are numbered
    1..k; a COPY goes to an ideal node that does not own yet, a DROP removes a copy outside the ideal list; the
    OWNING copies never fall below min(current, target); and at the end exactly the ideal nodes hold a copy, all
    OWNING. For every partition with an owner: exactly one replica 0 in ``affinity_assignment``, and its copy owns.
    """
    tables = (d.partition_map, d.steps, d.affinity_assignment, d.ideal_assignment)
    groups = pa.array(sorted(set().union(*(pc.unique(t.column("group_name")).to_pylist() for t in tables))),
                      pa.string())
    nodes = pa.array(sorted(set().union(*(pc.unique(pc.drop_null(t.column(c))).to_pylist() for t, c in (
        (d.partition_map, "node_id"), (d.affinity_assignment, "node_id"), (d.ideal_assignment, "node_id"),
        (d.steps, "source_node"), (d.steps, "target_node"))))), pa.string())
    keys = {}
    for name, t in (("map", d.partition_map), ("steps", d.steps), ("assignment", d.affinity_assignment),
                    ("ideal", d.ideal_assignment)):
        keys[name] = _int(pc.index_in(t.column("group_name"), value_set=groups)) * MAX_PARTITIONS + _int(
            t.column("partition_id"))
    parts = _unique(np.concatenate(list(keys.values())))

    def q(name: str) -> I64:
        return np.searchsorted(parts, keys[name]).astype(np.int64)

    def node(t: pa.Table, column: str) -> I64:
        return _int(pc.index_in(t.column(column), value_set=nodes), _NO)

    a = d.affinity_assignment
    primary = np.asarray(pc.equal(a.column("replica_index"), 0).to_numpy(zero_copy_only=False), bool)
    st = d.steps
    order = np.lexsort((_int(st.column("step")), q("steps")))
    facts = _Facts(
        n=parts.size,
        map_q=q("map"), map_node=node(d.partition_map, "node_id"),
        map_owning=np.asarray(pc.equal(d.partition_map.column("state"), OWNING).to_numpy(zero_copy_only=False), bool),
        ideal_q=q("ideal"), ideal_node=node(d.ideal_assignment, "node_id"),
        primary_q=q("assignment")[primary], primary_node=node(a, "node_id")[primary],
        step_q=q("steps")[order], step=_int(st.column("step"))[order],
        step_action=np.asarray(st.column("action").to_numpy(zero_copy_only=False), object)[order],
        step_source=node(st, "source_node")[order], step_target=node(st, "target_node")[order],
    )
    bad = _violations(facts, max(len(nodes), 1))
    if bad.size:
        key = int(parts[bad[0]])
        raise KernelInvariantError(_describe((groups[key // MAX_PARTITIONS].as_py(), key % MAX_PARTITIONS), d))


def _violations(f: _Facts, nn: int) -> I64:
    """The partitions (sorted indexes) whose decisions break the invariant; vectorised over the batch."""
    n = f.n
    wrong = np.zeros(n, bool)
    m_key = f.map_q * nn + f.map_node
    owning_keys = _unique(m_key[f.map_owning])
    held_keys = _unique(m_key)
    ideal_keys = _unique(f.ideal_q * nn + f.ideal_node)
    has_owner = _seg_any(f.map_q, f.map_owning, n)
    primaries = np.bincount(f.primary_q, minlength=n)
    wrong |= has_owner & (primaries != 1)
    primary_owns = _lookup(owning_keys, f.primary_q * nn + f.primary_node) >= 0
    wrong |= has_owner & ~_seg_any(f.primary_q, primary_owns, n)
    if f.step_q.size:
        sq = f.step_q
        is_copy, is_drop = f.step_action == COPY, f.step_action == DROP
        dst_key, src_key = sq * nn + f.step_target, sq * nn + f.step_source
        row_bad = f.step != _rank_in_segment(sq) + 1
        row_bad |= is_copy & ((f.step_target < 0) | (_lookup(owning_keys, dst_key) >= 0)
                              | (_lookup(ideal_keys, dst_key) < 0))
        row_bad |= is_drop & ((_lookup(held_keys, src_key) < 0) | (_lookup(ideal_keys, src_key) >= 0))
        owners0 = np.bincount(f.map_q[f.map_owning], minlength=n)
        target = np.bincount(ideal_keys // nn, minlength=n)
        delta = np.where(is_copy, 1, np.where(is_drop & (_lookup(owning_keys, src_key) >= 0), -1, 0))
        run = np.cumsum(delta)
        first = np.r_[0, np.flatnonzero(sq[1:] != sq[:-1]) + 1]
        start = np.repeat(np.r_[0, run][first], np.diff(np.r_[first, sq.size]))
        row_bad |= owners0[sq] + run - start < np.minimum(owners0, target)[sq]
        dropped, drops = np.unique(src_key[is_drop], return_counts=True)
        if dropped.size:
            row_bad |= is_drop & (drops[np.maximum(_lookup(dropped, src_key), 0)] > 1)
        wrong |= _seg_any(sq, row_bad, n)
        # End state: every ideal node owns (owned before or copied to once), every non-ideal copy dropped once.
        planned = np.bincount(sq, minlength=n) > 0
        ideal_owning = np.bincount(owning_keys[_lookup(ideal_keys, owning_keys) >= 0] // nn, minlength=n)
        extra = np.bincount(held_keys[_lookup(ideal_keys, held_keys) < 0] // nn, minlength=n)
        copied = np.bincount(sq[is_copy], minlength=n)
        wrong |= planned & ((ideal_owning + copied != target) | (np.bincount(sq[is_drop], minlength=n) != extra))
    return np.flatnonzero(wrong).astype(np.int64)


def _describe(part: tuple[str, int], d: Decisions) -> str:
    g, p = part

    def rows(t: pa.Table, columns: Sequence[str]) -> str:
        sel = t.filter(pc.and_(pc.equal(t.column("group_name"), g), pc.equal(t.column("partition_id"), p)))
        return "; ".join(
            " ".join(f"{k}={v}" for k, v in r.items()) for r in sel.select(list(columns)).to_pylist()
        ) or "none"

    before = rows(d.partition_map, ["node_id", "state", "update_counter"])
    plan = rows(d.steps.sort_by("step"), ["step", "action", "source_node", "target_node"])
    after = rows(d.ideal_assignment, ["replica_index", "node_id"])
    return (
        f"the exchange's decisions for group {g!r} partition {p} break the safety invariant: a step would lower "
        "the OWNING copies below min(current, target), the plan would not end with exactly the ideal nodes owning, "
        "or a partition with an owner is not served by exactly one owning primary.\n"
        f"  before (decided map): {before}\n"
        f"  plan: {plan}\n"
        f"  after (ideal nodes, all OWNING): {after}\n"
        f"  serving: {rows(d.affinity_assignment, ['replica_index', 'node_id', 'is_temporary'])}"
    )
