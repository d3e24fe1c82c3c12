"""Migration scheduler: start time, end time and wave of every step of a migration plan (SPEC 4 "Migrations").

:func:`schedule` takes the rows of a migration plan (one row per step, :data:`PLAN_INPUT_SCHEMA`) and returns the
same rows, in the same order, with the COPY source chosen and ``wave``, ``est_start_s`` and ``est_end_s`` filled in
(:data:`SCHEDULED_SCHEMA`). :func:`lower_bound` gives a makespan no schedule of the plan can beat under the cost
model; :func:`makespan` reads a schedule's makespan. Pure NumPy and pyarrow: no Spark.

Input rows
    A partition is ``(group_name, partition_id)``; its steps are numbered ``step`` = 1..k (no gap, no duplicate).
    ``action`` is ``COPY``, ``PROMOTE`` or ``DROP``. ``source_node`` is, for a COPY, the planner's default
    supplier; for a PROMOTE the old primary; for a DROP the node that drops its copy. ``target_node`` is the node
    receiving data (COPY) or the new primary (PROMOTE), null for a DROP. A COPY lists in ``candidates`` every node
    that may supply it (non-empty, containing ``source_node``, different from the target), moves ``bytes`` by
    ``transfer`` = ``entries`` or ``files``. ``owners`` / ``replicas`` are the partition's OWNING copies when
    planned and its target copy count. ``primary_node`` (may be null) is the partition's current primary.

Cost model (fluid, simulated event by event; parameters in :class:`CostModel`)
    * Precedence: a step can start once the previous step of its partition has ended; step 1 is ready at t = 0.
    * Slots: a step *touches* nodes: a COPY its source and its target, a PROMOTE the old and the new primary, a
      DROP its node. At any instant at most ``max_parallel_per_node`` running steps touch any node; a ready step
      starts only if every node it touches has a free slot, and holds its slots until it ends.
    * Duration: every step first spends ``overhead_s`` (holding its slots). A PROMOTE or a DROP then ends. A COPY
      then transfers ``bytes``; while it transfers its rate is
      ``min(stream, bw / n_out(source), bw / n_in(target))``, where ``stream`` is ``entry_stream_bytes_per_s``
      (``entries``: FULL rebalance by entries or HISTORICAL replay) or ``file_stream_bytes_per_s`` (``files``),
      ``bw`` is ``node_bandwidth_bytes_per_s`` (each node, each direction: full duplex) and ``n_out`` / ``n_in``
      count the transfers in their transfer phase sending from that source / receiving at that target. Rates
      change only when a transfer starts or ends, so between two events every transfer moves at a constant rate
      and the simulation is exact (up to floating point). A COPY of 0 bytes ends after its overhead.
    * Waves: ``wave`` is the dense rank (1, 2, ...) of the distinct start times rounded to 1e-9 s: wave k is the
      k-th instant at which some steps start.

Policies (:data:`POLICIES`)
    ``ours``
        Greedy list scheduling: at every event, every ready step that fits starts, in this priority order:
        (1) partitions under-replicated (``owners < replicas``) or with one owner (``owners <= 1``) first; (2) fewer
        ``owners`` first; (3) steps without a transfer (PROMOTE, DROP) before COPYs; (4) larger *bottleneck load*
        first; (5) larger estimated duration first; (6) ``(group_name, partition_id, step)`` ascending. A step's
        estimated duration is ``overhead_s + bytes / r``, with ``r = min(stream, bw)`` its rate alone. The static
        *load* of a node is the sum of the estimated durations of the steps touching it, where a COPY counts in
        full on its target and for ``1/k`` on each of its ``k`` usable candidates (its source is not chosen yet).
        The bottleneck load of a step is the largest load among the nodes it touches; for a COPY,
        ``max(load(target), min over candidates of load)`` (it can send from its least loaded candidate).
        Rule (3): a PROMOTE or DROP holds a slot only for ``overhead_s`` and moves no bytes, so starting it first
        costs a transfer little and unlocks its partition's next step; ranked after the COPYs, such steps pile up
        at the end (measured: a 9 -> 10 scale-up took 18% over the lower bound at cap 10, 1.5% with the rule).
        Rule (4) is the classic "longest remaining work on the bottleneck first": a busy node's queue is started
        early so that it does not idle at the end while others wait on it. A COPY's source is picked when it
        starts, among its candidates with a free slot (the target excluded): the least *bound work* (its pinned
        load, the estimated durations of the steps that must touch it whatever the sources, plus those of the COPYs
        it was already picked for: this balances every node's total work, and keeps a node that must also drop
        many copies, such as a leaving one, from being every partition's supplier), then the fewest running COPYs
        sending from it (overhead phase included), then the fewest bytes assigned to send, then ``node_id``.
    ``hazelcast``
        Hazelcast's migration scheduler as a baseline: a COPY always reads from ``primary_node`` (``source_node``
        when null), whatever the candidates; first-fit in ``(group_name, partition_id, step)`` order (at every
        event the ready steps are scanned in that order and each one that fits starts); same slots and rates.
    ``serial``
        One step at a time in ``(group_name, partition_id, step)`` order, from ``source_node`` as given; each runs
        alone, so a COPY moves at ``min(stream, bw)``. Its makespan is the sum of the estimated durations.

    ``ours`` and ``hazelcast`` never take longer than ``serial``. Let W(t) be the serial time still owed by the
    unfinished steps (remaining overhead plus remaining bytes at each one's solo rate). Some step always runs (when
    none runs every slot is free, so any ready step starts). If one is in its overhead W falls at rate >= 1; else
    take the node where the largest count m of transfers meets (as sender or receiver): each of those m transfers
    has ``n_out, n_in <= m``, so it moves at least ``min(stream, bw/m) >= min(stream, bw)/m``, and together they
    lower W at rate >= 1. So the makespan is at most W(0), the serial makespan.

Lower bound (:func:`lower_bound`)
    The maximum of (a) every node's bytes received / bw; (b) every node's bytes sent (by the scheduled
    ``source_node``) / bw; (c) for every node, the sum over the steps touching it of ``overhead_s + bytes / r``
    divided by ``max_parallel_per_node``; (d) for every partition, the sum over its steps of ``overhead_s + bytes /
    r``, with ``r = min(stream, bw)``. Each bounds any schedule of the plan (with these sources) under the model:
    (a) and (b) because the transfers at one node share ``bw`` per direction (``n`` of them each get at most
    ``bw / n``); (c) because a step holds one of the node's slots for at least its solo duration (its rate never
    exceeds ``r``) and at most ``max_parallel_per_node`` slots exist; (d) because a partition's steps run one after
    the other, each for at least its solo duration. (The issue wrote ``bytes / stream``; ``bytes / min(stream, bw)``
    is never smaller and equally valid.)

Implementation
    An event queue holds overhead ends and transfer ends (lazily invalidated when a transfer's rate changes).
    Events less than 1e-9 s apart are processed as one instant, so symmetric transfers end together despite
    rounding. After an event only the transfers sharing a sender or a receiver with a transfer that started or
    ended can change rate; their rates are recomputed together with NumPy. A ready step that does not fit waits
    in a heap, ordered by priority, per pair of nodes it would touch (its node twice for a one-node step; a COPY in
    the pair of its target with each candidate). A pair holds waiting steps only while one of its nodes is full, so
    when a node frees a slot only its pairs with a partner that is not full, and the newly ready steps, are looked
    at, merged in priority order; a pair is left as soon as one of its nodes is full again. This starts exactly
    the steps the full scan in priority order would start, and every waiting step taken out starts: none is
    rescanned. Measured on 2 cores: 10,000 steps on 10 nodes in 0.3 s, 100,000 steps on 1,000 nodes in 4-5 s.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "PLAN_INPUT_SCHEMA",
    "POLICIES",
    "SCHEDULED_SCHEMA",
    "CostModel",
    "ScheduleInputError",
    "lower_bound",
    "makespan",
    "schedule",
]

POLICIES = ("ours", "hazelcast", "serial")

COPY, PROMOTE, DROP = "COPY", "PROMOTE", "DROP"
ENTRIES, FILES = "entries", "files"

PLAN_INPUT_SCHEMA = pa.schema(
    [
        ("migration_id", pa.int64()),
        ("group_name", pa.string()),
        ("partition_id", pa.int32()),
        ("step", pa.int32()),
        ("action", pa.string()),
        ("source_node", pa.string()),
        ("target_node", pa.string()),
        ("candidates", pa.list_(pa.string())),
        ("primary_node", pa.string()),
        ("transfer", pa.string()),
        ("bytes", pa.int64()),
        ("owners", pa.int32()),
        ("replicas", pa.int32()),
    ]
)
_SCHEDULE_FIELDS = [
    pa.field("wave", pa.int32()),
    pa.field("est_start_s", pa.float64()),
    pa.field("est_end_s", pa.float64()),
]
SCHEDULED_SCHEMA = pa.schema([*PLAN_INPUT_SCHEMA, *_SCHEDULE_FIELDS])

_LOWER_BOUND_COLUMNS = ("group_name", "partition_id", "action", "source_node", "target_node", "transfer", "bytes")
_A_COPY, _A_PROMOTE, _A_DROP = 0, 1, 2
_ACTION_CODES = {COPY: _A_COPY, PROMOTE: _A_PROMOTE, DROP: _A_DROP}
_EVENT_EPS = 1e-9  # events closer than this are one instant
_WAVE_DECIMALS = 9


class ScheduleInputError(ValueError):
    """A plan, a policy or a cost model the scheduler cannot use; the message says what was expected and got."""


@dataclass(frozen=True)
class CostModel:
    """Parameters of the scheduler's cost model (see the module docstring).

    Attributes:
        max_parallel_per_node: at most this many running migration steps touch any node.
        node_bandwidth_bytes_per_s: bandwidth of each node in each direction (default 20 Gbps full duplex).
        entry_stream_bytes_per_s: top rate of one entry-based transfer (FULL by entries, HISTORICAL replay).
        file_stream_bytes_per_s: top rate of one file-based transfer (FULL by files).
        overhead_s: fixed cost of every step (COPY, PROMOTE, DROP), during which it holds its slots.
    """

    max_parallel_per_node: int = 10
    node_bandwidth_bytes_per_s: float = 2.5e9
    entry_stream_bytes_per_s: float = 4.0e8
    file_stream_bytes_per_s: float = 1.25e9
    overhead_s: float = 0.1

    def __post_init__(self) -> None:
        cap = self.max_parallel_per_node
        if isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 1:
            raise ScheduleInputError(f"max_parallel_per_node: expected an integer >= 1, got {cap!r}")
        rates = ("node_bandwidth_bytes_per_s", "entry_stream_bytes_per_s", "file_stream_bytes_per_s")
        for name in (*rates, "overhead_s"):
            value = getattr(self, name)
            floor = "> 0" if name in rates else ">= 0"
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float | np.number)
                or not np.isfinite(value)
                or (value <= 0 if name in rates else value < 0)
            ):
                raise ScheduleInputError(f"{name}: expected a finite number {floor}, got {value!r}")


@dataclass
class _Plan:
    """A validated plan decoded into arrays indexed by input row (node ids as indices into ``nodes``)."""

    n: int
    nodes: list[str]
    order: np.ndarray  # row indices in (group_name, partition_id, step) order
    action: np.ndarray  # int8 action code
    src: np.ndarray  # int64 node index
    tgt: np.ndarray  # int64 node index, -1 when null
    primary: np.ndarray  # int64 node index, -1 when null
    candidates: list[tuple[int, ...]]  # per row: candidate node indices (empty unless COPY), ascending
    nbytes: np.ndarray  # float64, 0 unless COPY
    stream: np.ndarray  # float64 stream rate of a COPY (entries or files), 0 otherwise
    owners: np.ndarray  # int64
    replicas: np.ndarray  # int64
    nxt: np.ndarray  # int64 row of the next step of the partition, -1 for the last


def schedule(plan: pa.Table, model: CostModel, policy: str = "ours") -> pa.Table:
    """Schedule the steps of a migration plan under the cost model.

    Args:
        plan: one row per step with at least the columns of :data:`PLAN_INPUT_SCHEMA` (castable to those types);
            other columns are kept as they are.
        model: the cost model.
        policy: ``"ours"``, ``"hazelcast"`` or ``"serial"`` (module docstring).

    Returns:
        ``plan``'s rows in the same order with ``source_node`` set to each COPY's chosen source (other rows keep
        theirs) and ``wave`` (int32), ``est_start_s`` and ``est_end_s`` (float64) filled in: replaced where the
        columns exist, appended in that order otherwise.

    Raises:
        ScheduleInputError: (a ``ValueError``) the policy is unknown, required columns are missing or not castable,
            or the rows break the input contract (null keys, unknown action, gaps in ``step``, a COPY with no
            usable source, ...). The message lists what was expected and what arrived.
    """
    if policy not in POLICIES:
        raise ScheduleInputError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
    if not isinstance(model, CostModel):
        raise ScheduleInputError(f"model: expected a CostModel, got {type(model).__name__}")
    p = _decode(plan, PLAN_INPUT_SCHEMA.names, model)
    if policy == "serial":
        start, end, chosen = _serial(p, model)
    else:
        if policy == "ours":
            sources = [tuple(c for c in cands if c != p.tgt[i]) for i, cands in enumerate(p.candidates)]
            rank, source_cost = _ours_rank(p, model, sources)
        else:
            source_cost = None
            sources = [
                (int(p.primary[i]) if p.primary[i] >= 0 else int(p.src[i]),) if a == _A_COPY else ()
                for i, a in enumerate(p.action.tolist())
            ]
            rank = np.empty(p.n, dtype=np.int64)
            rank[p.order] = np.arange(p.n, dtype=np.int64)
        _check_sources(p, sources, policy)
        start, end, chosen = _simulate(p, model, rank, sources, source_cost)
    return _with_schedule(plan, p, start, end, chosen)


def makespan(scheduled: pa.Table) -> float:
    """The largest ``est_end_s`` of a scheduled plan, 0.0 for an empty plan.

    Raises:
        ScheduleInputError: ``est_end_s`` is missing.
    """
    if "est_end_s" not in scheduled.column_names:
        raise ScheduleInputError(f"expected a scheduled plan with column est_end_s, got {scheduled.column_names}")
    if scheduled.num_rows == 0:
        return 0.0
    top = pc.max(scheduled.column("est_end_s")).as_py()
    return 0.0 if top is None else float(top)


def lower_bound(scheduled: pa.Table, model: CostModel) -> float:
    """A makespan no schedule of this plan (with its ``source_node`` choices) can beat under ``model``.

    The maximum of the per-node receive and send volumes over the bandwidth, the per-node slot work over
    ``max_parallel_per_node`` and the per-partition chains of solo durations (module docstring, "Lower bound").

    Args:
        scheduled: a plan as returned by :func:`schedule` (any plan with the columns ``group_name``,
            ``partition_id``, ``action``, ``source_node``, ``target_node``, ``transfer`` and ``bytes`` will do).
        model: the cost model.

    Returns:
        The bound in seconds; 0.0 for an empty plan.

    Raises:
        ScheduleInputError: columns are missing or rows break the input contract.
    """
    missing = [c for c in _LOWER_BOUND_COLUMNS if c not in scheduled.column_names]
    if missing:
        raise ScheduleInputError(
            f"lower_bound: missing columns {missing}; expected at least {list(_LOWER_BOUND_COLUMNS)}, "
            f"got {scheduled.column_names}"
        )
    if scheduled.num_rows == 0:
        return 0.0
    cols = _cast_columns(scheduled, _LOWER_BOUND_COLUMNS)
    action = _actions(cols["action"])
    is_copy = action == _A_COPY
    nbytes = np.where(is_copy, cols["bytes"].fill_null(0).to_numpy().astype(np.float64), 0.0)
    stream = _streams(cols["transfer"], is_copy, model)
    solo = model.overhead_s + np.divide(
        nbytes, np.minimum(stream, model.node_bandwidth_bytes_per_s), out=np.zeros_like(nbytes), where=is_copy
    )
    nodes, (src, tgt) = _node_indices([cols["source_node"], cols["target_node"]])
    if (src < 0).any():
        raise ScheduleInputError("lower_bound: source_node must not be null")
    nn = max(len(nodes), 1)
    bw = model.node_bandwidth_bytes_per_s
    received = np.bincount(tgt[is_copy], weights=nbytes[is_copy], minlength=nn) / bw
    sent = np.bincount(src[is_copy], weights=nbytes[is_copy], minlength=nn) / bw
    second = np.where((action != _A_DROP) & (tgt != src), tgt, -1)  # DROP touches its node only
    slot_work = np.bincount(src, weights=solo, minlength=nn)
    has_second = second >= 0
    slot_work += np.bincount(second[has_second], weights=solo[has_second], minlength=nn)
    part = _partition_codes(cols["group_name"], cols["partition_id"])
    chains = np.bincount(part, weights=solo)
    return float(max(received.max(), sent.max(), slot_work.max() / model.max_parallel_per_node, chains.max(), 0.0))


# --- decoding -------------------------------------------------------------------------------------------------


def _cast_columns(table: pa.Table, names: tuple[str, ...] | list[str]) -> dict[str, pa.Array]:
    """The named columns as single arrays cast to :data:`PLAN_INPUT_SCHEMA` types."""
    out: dict[str, pa.Array] = {}
    bad: list[str] = []
    for name in names:
        want = PLAN_INPUT_SCHEMA.field(name).type
        col = table.column(name)
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if arr.type != want:
            try:
                arr = arr.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad.append(f"{name}: expected {want}, got {col.type}")
                continue
        out[name] = arr
    if bad:
        raise ScheduleInputError(f"columns with types that cannot be cast: {bad}")
    return out


def _node_indices(columns: list[pa.Array]) -> tuple[list[str], list[np.ndarray]]:
    """Sorted distinct node ids over ``columns`` (nulls skipped) and each column as indices (-1 for null)."""
    distinct: set[str] = set()
    for c in columns:
        if len(c):
            distinct.update(v for v in pc.unique(c).to_pylist() if v is not None)
    nodes = sorted(distinct)
    value_set = pa.array(nodes, type=pa.string())
    return nodes, [
        pc.index_in(c, value_set=value_set).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        for c in columns
    ]


def _actions(column: pa.Array) -> np.ndarray:
    """Action codes (0 COPY, 1 PROMOTE, 2 DROP); unknown or null actions raise."""
    known = pa.array(list(_ACTION_CODES), type=pa.string())
    codes = pc.index_in(column, value_set=known)
    if codes.null_count:
        bad = sorted({str(v) for v in pc.filter(column, pc.is_null(codes)).to_pylist()})
        raise ScheduleInputError(f"action: expected one of {list(_ACTION_CODES)}, got {bad}")
    return codes.to_numpy().astype(np.int8)


def _streams(transfer: pa.Array, is_copy: np.ndarray, model: CostModel) -> np.ndarray:
    """Stream rate per row: entry or file rate for a COPY, 0 otherwise; a COPY's transfer must be known."""
    kinds = pa.array([ENTRIES, FILES], type=pa.string())
    codes = pc.index_in(transfer, value_set=kinds).fill_null(-1).to_numpy(zero_copy_only=False)
    bad_rows = is_copy & (codes < 0)
    if bad_rows.any():
        got = sorted({str(v) for v in np.asarray(transfer.to_pylist(), dtype=object)[bad_rows]})
        raise ScheduleInputError(f"transfer of a COPY: expected one of {[ENTRIES, FILES]}, got {got}")
    rates = np.array([model.entry_stream_bytes_per_s, model.file_stream_bytes_per_s])
    return np.where(is_copy, rates[np.maximum(codes, 0)], 0.0)


def _partition_codes(group: pa.Array, pid: pa.Array) -> np.ndarray:
    """Dense codes of ``(group_name, partition_id)`` in ascending order."""
    g_codes = _group_codes(group)
    pids = pid.to_numpy(zero_copy_only=False).astype(np.int64)
    keys = np.stack([g_codes, pids], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    return np.asarray(inverse, dtype=np.int64).reshape(-1)


def _group_codes(group: pa.Array) -> np.ndarray:
    """Codes of ``group_name`` in ascending string order."""
    names = sorted(v for v in pc.unique(group).to_pylist() if v is not None)
    return pc.index_in(group, value_set=pa.array(names, type=pa.string())).to_numpy().astype(np.int64)


def _decode(plan: pa.Table, names: list[str], model: CostModel) -> _Plan:
    """Validate ``plan`` against the input contract and decode it (see :func:`schedule` for the errors)."""
    missing = [c for c in names if c not in plan.column_names]
    if missing:
        raise ScheduleInputError(f"plan lacks columns {missing}; expected at least {names}, got {plan.column_names}")
    cols = _cast_columns(plan, names)
    n = plan.num_rows
    for name in ("migration_id", "group_name", "partition_id", "step", "action", "source_node", "owners", "replicas"):
        if cols[name].null_count:
            raise ScheduleInputError(f"{name}: expected no nulls, got {cols[name].null_count} null(s)")
    action = _actions(cols["action"])
    is_copy = action == _A_COPY

    cand = cols["candidates"]
    lengths = pc.list_value_length(cand).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    nodes, (src, tgt, primary, flat_idx) = _node_indices(
        [cols["source_node"], cols["target_node"], cols["primary_node"], cand.flatten()]
    )

    needs_target = action != _A_DROP
    if (needs_target & (tgt < 0)).any():
        rows = np.flatnonzero(needs_target & (tgt < 0))[:5].tolist()
        raise ScheduleInputError(f"target_node: expected a node for every COPY and PROMOTE, got null at rows {rows}")
    nbytes_col = cols["bytes"].fill_null(-1).to_numpy().astype(np.int64)
    if (is_copy & (nbytes_col < 0)).any():
        rows = np.flatnonzero(is_copy & (nbytes_col < 0))[:5].tolist()
        raise ScheduleInputError(f"bytes: expected an integer >= 0 for every COPY, got null or negative at rows {rows}")
    stream = _streams(cols["transfer"], is_copy, model)

    splits = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    flat_list = flat_idx.tolist()
    candidates: list[tuple[int, ...]] = []
    src_l, tgt_l = src.tolist(), tgt.tolist()
    for i, copy in enumerate(is_copy.tolist()):
        if not copy:
            candidates.append(())
            continue
        got = sorted({c for c in flat_list[splits[i] : splits[i + 1]] if c >= 0})
        if not got or src_l[i] not in got:
            raise ScheduleInputError(
                f"row {i}: a COPY's candidates must be non-empty and contain source_node "
                f"{nodes[src_l[i]]!r}; got {[nodes[c] for c in got]}"
            )
        if src_l[i] == tgt_l[i]:
            raise ScheduleInputError(
                f"row {i}: a COPY's source_node must differ from its target_node; got {nodes[src_l[i]]!r} for both"
            )
        candidates.append(tuple(got))

    part = _partition_codes(cols["group_name"], cols["partition_id"])
    step = cols["step"].to_numpy().astype(np.int64)
    order = np.lexsort((step, part)) if n else np.zeros(0, dtype=np.int64)
    sp, ss = part[order], step[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sp[1:] != sp[:-1]
    expected = np.where(first, 1, np.concatenate([[0], ss[:-1] + 1]) if n else ss)
    if n and (ss != expected).any():
        k = int(np.flatnonzero(ss != expected)[0])
        row = int(order[k])
        group = cols["group_name"][row].as_py()
        pid = cols["partition_id"][row].as_py()
        steps = ss[sp == sp[k]].tolist()
        raise ScheduleInputError(
            f"partition ({group!r}, {pid}): steps must be 1..k without gaps or duplicates, got {steps}"
        )
    nxt = np.full(n, -1, dtype=np.int64)
    if n > 1:
        same = sp[1:] == sp[:-1]
        nxt[order[:-1][same]] = order[1:][same]
    return _Plan(
        n=n,
        nodes=nodes,
        order=order.astype(np.int64),
        action=action,
        src=src,
        tgt=tgt,
        primary=primary,
        candidates=candidates,
        nbytes=np.where(is_copy, np.maximum(nbytes_col, 0), 0).astype(np.float64),
        stream=stream,
        owners=cols["owners"].to_numpy().astype(np.int64),
        replicas=cols["replicas"].to_numpy().astype(np.int64),
        nxt=nxt,
    )


def _solo_durations(p: _Plan, model: CostModel) -> np.ndarray:
    """Each step's duration when it runs alone: ``overhead_s + bytes / min(stream, bw)`` (COPY), else overhead."""
    is_copy = p.action == _A_COPY
    rate = np.minimum(p.stream, model.node_bandwidth_bytes_per_s)
    moving = np.divide(p.nbytes, rate, out=np.zeros(p.n), where=is_copy)
    return model.overhead_s + moving


def _check_sources(p: _Plan, sources: list[tuple[int, ...]], policy: str) -> None:
    """Every COPY needs a source other than its target."""
    for i, a in enumerate(p.action.tolist()):
        if a == _A_COPY and not [s for s in sources[i] if s != p.tgt[i]]:
            raise ScheduleInputError(
                f"row {i}: policy {policy!r} has no usable source for the COPY to {p.nodes[p.tgt[i]]!r}: expected "
                f"a supplier other than the target, got {[p.nodes[s] for s in sources[i]]}"
            )


def _ours_rank(p: _Plan, model: CostModel, sources: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Dispatch rank of every row under ``ours`` (0 = first; module docstring, rules (1)-(6)), and every node's
    *pinned load*: the estimated durations of the steps that must touch it whatever the sources chosen."""
    n, nn = p.n, len(p.nodes)
    solo = _solo_durations(p, model)
    is_copy = p.action == _A_COPY
    is_drop = p.action == _A_DROP
    load = np.zeros(nn)
    # targets: a COPY's receiver, a PROMOTE's new primary (counted once when it is also the old one)
    on_tgt = ~is_drop & ~((p.action == _A_PROMOTE) & (p.tgt == p.src))
    load += np.bincount(p.tgt[on_tgt], weights=solo[on_tgt], minlength=nn)
    not_copy = ~is_copy
    load += np.bincount(p.src[not_copy], weights=solo[not_copy], minlength=nn)
    pinned = load.copy()
    lengths = np.array([len(s) for s in sources], dtype=np.int64)
    flat = np.fromiter((c for s in sources for c in s), dtype=np.int64, count=int(lengths.sum()))
    owner_row = np.repeat(np.arange(n), lengths)
    if len(flat):
        load += np.bincount(flat, weights=(solo / np.maximum(lengths, 1))[owner_row], minlength=nn)

    bottleneck = load[p.src].copy()  # DROP
    promote = p.action == _A_PROMOTE
    bottleneck[promote] = np.maximum(load[p.src[promote]], load[p.tgt[promote]])
    if is_copy.any():
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        least = np.minimum.reduceat(load[flat], starts[is_copy]) if len(flat) else np.zeros(0)
        bottleneck[is_copy] = np.maximum(load[p.tgt[is_copy]], least)

    urgent = (p.owners < p.replicas) | (p.owners <= 1)
    position = np.empty(n, dtype=np.int64)
    position[p.order] = np.arange(n, dtype=np.int64)
    by_priority = np.lexsort((position, -solo, -bottleneck, is_copy.astype(np.int8), p.owners,
                              (~urgent).astype(np.int8)))
    rank = np.empty(n, dtype=np.int64)
    rank[by_priority] = np.arange(n, dtype=np.int64)
    return rank, pinned


def _serial(p: _Plan, model: CostModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``serial``: one step after the other in ``(group_name, partition_id, step)`` order, each alone."""
    solo = _solo_durations(p, model)[p.order]
    ends = np.cumsum(solo)
    starts = np.concatenate([[0.0], ends[:-1]])
    start, end = np.empty(p.n), np.empty(p.n)
    start[p.order], end[p.order] = starts, ends
    return start, end, p.src.copy()


def _simulate(
    p: _Plan,
    model: CostModel,
    rank: np.ndarray,
    sources: list[tuple[int, ...]],
    source_cost: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy list scheduling under the fluid cost model (``ours`` and ``hazelcast``).

    Args:
        p: the decoded plan.
        model: the cost model.
        rank: dispatch priority of every row (a permutation of ``0..n-1``, 0 first).
        sources: per row, the nodes a COPY may read from (ascending node index = ascending ``node_id``); a COPY
            reads from the one with a free slot that has the least work (``source_cost``, when given), then the
            fewest running COPYs sending from it, then the fewest bytes assigned, then the lowest index.
        source_cost: per node, the work already bound to it (``ours``: its pinned load); a COPY that reads from
            a node adds its estimated duration to it, so the sources balance every node's total work.

    Returns:
        Start times, end times and the node index each row reads from (``source_node`` for PROMOTE and DROP).
    """
    n, nn = p.n, len(p.nodes)
    chosen = p.src.copy()
    if n == 0:
        return np.zeros(0), np.zeros(0), chosen
    cap = model.max_parallel_per_node
    bw = model.node_bandwidth_bytes_per_s
    overhead = model.overhead_s

    action = p.action.tolist()
    tgt = p.tgt.tolist()
    src = p.src.tolist()
    nxt = p.nxt.tolist()
    rank_l = rank.tolist()
    nbytes = p.nbytes.tolist()
    touched: list[tuple[int, ...]] = [
        () if a == _A_COPY else ((s,) if a == _A_DROP or g == s else (s, g))
        for a, s, g in zip(action, src, tgt, strict=True)
    ]
    chosen_l = src[:]

    busy = [0] * nn  # running steps touching the node
    sending = [0] * nn  # running COPYs reading from the node (overhead phase included)
    assigned = [0.0] * nn  # bytes assigned to the node as a sender so far
    work = source_cost.tolist() if source_cost is not None else [0.0] * nn  # work bound to the node so far
    solo_l = _solo_durations(p, model).tolist()
    n_out = np.zeros(nn, dtype=np.int64)  # transfers in their transfer phase per sender
    n_in = np.zeros(nn, dtype=np.int64)  # ... per receiver
    out_set: list[set[int]] = [set() for _ in range(nn)]
    in_set: list[set[int]] = [set() for _ in range(nn)]
    sender = np.zeros(n, dtype=np.int64)
    receiver = p.tgt
    stream = p.stream
    remaining = np.zeros(n)
    rate = np.zeros(n)
    since = np.zeros(n)
    version = [0] * n
    start = [0.0] * n
    end = [0.0] * n

    events: list[tuple[float, int, int, int]] = []  # (time, 0 overhead end | 1 transfer end, row, version)
    # Blocked ready steps wait in one heap per node pair {u, w} they would touch (u == w for a one-node step), as
    # (rank, row, epoch); a COPY waits in the pair of its target with each candidate. A pair can only hold steps
    # while u or w is full, so when a node frees a slot only its pairs with a partner that is not full are looked at.
    waiting: dict[int, list[tuple[int, int, int]]] = {}
    partners: list[set[int]] = [set() for _ in range(nn)]
    epoch = [0] * n  # bumped when a row starts: its other waiting entries are void
    push, pop = heapq.heappush, heapq.heappop

    def wait(i: int, pairs: list[tuple[int, int]]) -> None:
        entry = (rank_l[i], i, epoch[i])
        for u, w in pairs:
            key = u * nn + w if u <= w else w * nn + u
            heap = waiting.get(key)
            if heap is None:
                waiting[key] = [entry]
                partners[u].add(w)
                partners[w].add(u)
            else:
                push(heap, entry)

    def try_start(i: int, t: float) -> bool:
        if action[i] == _A_COPY:
            g = tgt[i]
            best, best_key = -1, (0.0, 0, 0.0)
            for c in sources[i]:
                if busy[c] < cap:
                    key = (work[c], sending[c], assigned[c])
                    if best < 0 or key < best_key:
                        best, best_key = c, key
            if best < 0 or busy[g] >= cap:
                wait(i, [(c, g) for c in sources[i]])
                return False
            busy[g] += 1
            busy[best] += 1
            sending[best] += 1
            assigned[best] += nbytes[i]
            work[best] += solo_l[i]
            chosen_l[i] = best
        else:
            nodes = touched[i]
            for v in nodes:
                if busy[v] >= cap:
                    wait(i, [(nodes[0], nodes[-1])])
                    return False
            for v in nodes:
                busy[v] += 1
        epoch[i] += 1
        start[i] = t
        push(events, (t + overhead, 0, i, 0))
        return True

    def head(key: int) -> int:
        """Rank of the first live entry of a pair's heap; drops the pair (-1) when it holds none."""
        heap = waiting[key]
        while heap and heap[0][2] != epoch[heap[0][1]]:
            pop(heap)
        if heap:
            return heap[0][0]
        del waiting[key]
        u, w = divmod(key, nn)
        partners[u].discard(w)
        partners[w].discard(u)
        return -1

    def dispatch(t: float, freed: set[int], ready: list[int]) -> None:
        fresh = [(rank_l[i], i) for i in ready]
        heapq.heapify(fresh)
        frontier: list[tuple[int, int]] = [(fresh[0][0], -1)] if fresh else []
        seen: set[int] = set()
        for v in freed:
            if busy[v] >= cap:
                continue
            for w in list(partners[v]):
                if busy[w] < cap:
                    key = v * nn + w if v <= w else w * nn + v
                    if key not in seen:
                        seen.add(key)
                        r = head(key)
                        if r >= 0:
                            frontier.append((r, key))
        heapq.heapify(frontier)
        while frontier:
            r, key = pop(frontier)
            if key < 0:
                try_start(pop(fresh)[1], t)
                if fresh:
                    push(frontier, (fresh[0][0], -1))
                continue
            u, w = divmod(key, nn)
            if busy[u] >= cap or busy[w] >= cap or key not in waiting:
                continue  # a node of the pair is full again: none of its steps fits now
            r2 = head(key)
            if r2 < 0:
                continue
            if r2 != r:
                push(frontier, (r2, key))
                continue
            started = try_start(pop(waiting[key])[1], t)
            assert started, "a waiting step whose nodes are not full must fit"
            if busy[u] < cap and busy[w] < cap:
                r2 = head(key)
                if r2 >= 0:
                    push(frontier, (r2, key))

    is_first = np.ones(n, dtype=bool)
    is_first[p.nxt[p.nxt >= 0]] = False
    dispatch(0.0, set(), np.flatnonzero(is_first).tolist())

    while events:
        t, kind, i, ver = pop(events)
        if kind and ver != version[i]:
            continue
        batch = [(kind, i)]
        limit = t + _EVENT_EPS
        while events and events[0][0] <= limit:
            _, kind, i, ver = pop(events)
            if kind and ver != version[i]:
                continue
            batch.append((kind, i))
        freed: set[int] = set()
        ready: list[int] = []
        senders: set[int] = set()
        receivers: set[int] = set()
        for kind, i in batch:
            if kind == 0 and action[i] == _A_COPY and nbytes[i] > 0:
                s, g = chosen_l[i], tgt[i]  # overhead over: the transfer starts
                sender[i] = s
                n_out[s] += 1
                n_in[g] += 1
                out_set[s].add(i)
                in_set[g].add(i)
                remaining[i] = nbytes[i]
                rate[i] = 0.0
                since[i] = t
                senders.add(s)
                receivers.add(g)
                continue
            if kind == 1:  # transfer over
                s, g = chosen_l[i], tgt[i]
                n_out[s] -= 1
                n_in[g] -= 1
                out_set[s].discard(i)
                in_set[g].discard(i)
                version[i] += 1
                senders.add(s)
                receivers.add(g)
            end[i] = t
            if action[i] == _A_COPY:
                s, g = chosen_l[i], tgt[i]
                busy[s] -= 1
                busy[g] -= 1
                sending[s] -= 1
                freed.add(s)
                freed.add(g)
            else:
                for v in touched[i]:
                    busy[v] -= 1
                    freed.add(v)
            if nxt[i] >= 0:
                ready.append(nxt[i])
        if senders or receivers:
            affected: set[int] = set()
            for s in senders:
                affected |= out_set[s]
            for g in receivers:
                affected |= in_set[g]
            if affected:
                ids = np.fromiter(affected, dtype=np.int64, count=len(affected))
                new = np.minimum(stream[ids], bw / np.maximum(n_out[sender[ids]], n_in[receiver[ids]]))
                old = rate[ids]
                changed = new != old
                if changed.any():
                    ids, new, old = ids[changed], new[changed], old[changed]
                    left = np.maximum(remaining[ids] - old * (t - since[ids]), 0.0)
                    remaining[ids] = left
                    since[ids] = t
                    rate[ids] = new
                    for j, f in zip(ids.tolist(), (t + left / new).tolist(), strict=True):
                        version[j] += 1
                        push(events, (f, 1, j, version[j]))
        dispatch(t, freed, ready)

    return np.asarray(start), np.asarray(end), np.asarray(chosen_l, dtype=np.int64)


def _with_schedule(plan: pa.Table, p: _Plan, start: np.ndarray, end: np.ndarray, chosen: np.ndarray) -> pa.Table:
    """``plan`` with the chosen sources, waves and times (columns replaced in place or appended)."""
    if p.n:
        _, dense = np.unique(np.round(start, _WAVE_DECIMALS), return_inverse=True)
        wave = np.asarray(dense, dtype=np.int64).reshape(-1) + 1
    else:
        wave = np.zeros(0, dtype=np.int64)
    source_field = plan.schema.field("source_node")
    node_ids = pa.array(p.nodes, type=pa.string())
    sources = pc.take(node_ids, pa.array(chosen, type=pa.int64())) if p.n else pa.array([], type=pa.string())
    out = plan.set_column(plan.schema.get_field_index("source_node"), source_field, sources.cast(source_field.type))
    values = {
        "wave": pa.array(wave.astype(np.int32), type=pa.int32()),
        "est_start_s": pa.array(np.asarray(start, dtype=np.float64), type=pa.float64()),
        "est_end_s": pa.array(np.asarray(end, dtype=np.float64), type=pa.float64()),
    }
    for f in _SCHEDULE_FIELDS:
        idx = out.schema.get_field_index(f.name)
        out = out.append_column(f, values[f.name]) if idx < 0 else out.set_column(idx, f, values[f.name])
    return out
