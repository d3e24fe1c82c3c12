"""The scheduler's event loop: one greedy list schedule of a plan under the fluid cost model, simulated exactly.

:mod:`rebalancer.planning.schedule` decodes a plan, builds the candidate orders and calls :func:`run` once per
candidate; this module is only the loop (the model and its rules are in that module's docstring, "Implementation").

The loop is one function, written in the part of Python that numba compiles: NumPy arrays whose sizes are known
before it starts (:func:`_layout`), integer codes, inner functions that change arrays but rebind nothing.
:func:`run` executes it as plain Python for plans under :data:`COMPILED_FROM_STEPS` steps (no compile, no import of
numba; the arrays are lists there, which CPython indexes faster) and compiled by numba from that size (a plan of a
million steps: seconds instead of minutes). Both run the same statements in the same order and return the same
schedule, bit for bit (tests/test_schedule_loop.py). numba is optional: without it every plan runs in Python.
Compiling takes minutes once; numba caches the result (``make compiled`` does it, :func:`compile_ahead`).
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["A_COPY", "A_DROP", "A_PROMOTE", "COMPILED_FROM_STEPS", "LoopInput", "compile_ahead",
           "compile_for_every_plan", "dense_codes", "run", "runs_compiled"]

A_COPY, A_PROMOTE, A_DROP = 0, 1, 2  # action codes of the loop's input
_EVENT_EPS = 1e-9  # events closer than this are one instant

COMPILED_FROM_STEPS = 20_000
"""Plans with at least this many steps run compiled (when numba is installed). Below it the Python loop is faster
than loading the compiled one from numba's cache (about a second in a new process), let alone compiling it; once
loaded, the compiled loop is faster at every size (:func:`compile_for_every_plan`)."""

_EVERY_PLAN: list[bool] = []  # True once compile_for_every_plan ran in this process


@dataclass(frozen=True)
class LoopInput:
    """What one simulation reads: the plan as arrays indexed by row, one candidate's order and sources, the model."""

    action: ArrayLike  # action codes (0 COPY, 1 PROMOTE, 2 DROP)
    tgt: ArrayLike  # node index; -1 for a DROP
    src: ArrayLike  # node index
    nxt: ArrayLike  # row of the partition's next step, -1 for the last
    rank: ArrayLike  # dispatch priority, a permutation of 0..n-1 (0 first)
    pool_node: ArrayLike  # the nodes each COPY may read from: pool_node[pool_start[i]:pool_start[i + 1]]
    pool_start: ArrayLike
    nbytes: ArrayLike  # bytes a COPY moves
    stream: ArrayLike  # a COPY's stream rate
    solo: ArrayLike  # duration alone (what a COPY adds to its source's bound work)
    first: ArrayLike  # rows of step 1
    work: ArrayLike  # per node: bound work so far (used when `balanced`)
    limit: ArrayLike  # per direction: inbound limits of the nodes, then outbound (2 * nn; used when `lookahead`)
    balanced: bool  # a COPY reads from the open pool member with the least work (else the first open one)
    lookahead: bool  # direction-aware admission (else slots only)
    nn: int  # nodes
    cap: int  # max_parallel_per_node
    bw: float  # node_bandwidth_bytes_per_s
    overhead: float  # overhead_s
    ready_at: ArrayLike | None = None  # per row, the earliest instant it may start (None: 0 for every row)


def run(
    x: LoopInput, horizon: float = math.inf, compiled: bool | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Simulate one list schedule.

    Args:
        x: the plan, the candidate and the model.
        horizon: give up, with an infinite makespan, once the simulated time passes this.
        compiled: run the numba-compiled loop (True), the Python one (False), or decide (None:
            :func:`runs_compiled`).

    Returns:
        ``(start, end, chosen, makespan)``: per row its start and end (float64) and the node it read from (int64:
        the chosen source of a COPY, ``src`` for the others), and the makespan (inf when the horizon was passed).

    Raises:
        RuntimeError: steps were left waiting with no step running (a bug of the loop, never of the input).
    """
    n = np.size(x.action)
    if compiled is None:
        compiled = runs_compiled(n)
    rank = np.asarray(x.rank, dtype=np.int64)
    x = _by_rank(x, rank)
    ready_at = np.zeros(n) if x.ready_at is None else np.asarray(x.ready_at, dtype=np.float64)
    # One type per argument (int64 or float64 arrays, bool, int, float): numba compiles once per signature.
    arrays = [np.array(a, dtype=np.float64 if np.asarray(a).dtype.kind == "f" else np.int64) for a in (
        x.action, x.tgt, x.src, x.nxt, x.pool_node, x.pool_start, x.nbytes, x.stream, x.solo, x.first, x.work,
        x.limit, ready_at, *_layout(x))]  # copies: the loop adds to `work`
    # A freed node's waiting pairs are found by walking its list of them while it has at most `walk_words` entries
    # per word of partner bits, else by scanning the bits (`pairs_to_look_at`); both find the same pairs. Compiled,
    # a word is one sequential read and a list entry a few scattered ones (its pair's arrays): always scan (a
    # 3,000-node plan of a million steps, `hazelcast` order: 13.2 s of CPU walking lists of up to 3 entries per
    # word, 6.5-7.1 s scanning). As Python a scan costs an interpreted iteration per bit: walk up to 3 per word.
    walk_words = 0 if compiled else 3
    scalars = (bool(x.balanced), bool(x.lookahead), int(x.nn), int(x.cap), float(x.bw), float(x.overhead),
               float(horizon), walk_words)
    if compiled:
        loop = _compiled_loop()
        if loop is None:
            raise RuntimeError("the compiled scheduler loop needs numba: pip install numba")
        result = loop(*arrays, *scalars)
    else:
        result = _python_loop(*(a.tolist() for a in arrays), *scalars)
    if result[4]:
        raise RuntimeError("scheduler bug: steps were left waiting with no step running")
    start, end, chosen = (np.asarray(result[k], dtype=np.float64 if k < 2 else np.int64)[rank] for k in range(3))
    return start, end, chosen, float(result[3])


def _by_rank(x: LoopInput, rank: np.ndarray) -> LoopInput:
    """``x`` with its rows renumbered in dispatch order (row ``rank[i]`` is row i of ``x``). The loop dispatches by
    row number then, and the rows it works on at a time lie close together in memory (the million-step plan of
    docs/PLANNING.md, `portfolio`: medians of 12.1 and 12.7 s of CPU against 13.6 and 13.7 s, alternating). The
    numbering decides only the order of one instant's events (ordered by row on equal times), which the loop
    handles as one batch: it changes at most the rounding of sums of stream rates, which the admission limits
    allow for (`_RATE_TOLERANCE` in schedule.py); every suite plan and the synthetic one schedule as before."""
    n = len(rank)
    row = np.empty(n, dtype=np.int64)
    row[rank] = np.arange(n, dtype=np.int64)
    nxt = np.asarray(x.nxt, dtype=np.int64)[row]
    pool_start = np.asarray(x.pool_start, dtype=np.int64)
    sizes = np.diff(pool_start)[row]
    new_start = _offsets(sizes)
    pool_rows = np.repeat(pool_start[row] - new_start[:-1], sizes) + np.arange(new_start[-1])
    return dataclasses.replace(
        x, action=np.asarray(x.action)[row], tgt=np.asarray(x.tgt)[row], src=np.asarray(x.src)[row],
        nxt=np.where(nxt >= 0, rank[np.maximum(nxt, 0)], -1), rank=np.arange(n, dtype=np.int64),
        pool_node=np.asarray(x.pool_node)[pool_rows], pool_start=new_start, nbytes=np.asarray(x.nbytes)[row],
        stream=np.asarray(x.stream)[row], solo=np.asarray(x.solo)[row],
        first=np.sort(rank[np.asarray(x.first, dtype=np.int64)]),
        ready_at=None if x.ready_at is None else np.asarray(x.ready_at, dtype=np.float64)[row])


def _layout(x: LoopInput) -> tuple[np.ndarray, ...]:
    """The loop's fixed-size storage, laid out before it runs (every list the loop appends to has a bound known
    from the plan, so it is a slice of one flat list).

    Blocked steps wait per *pair* of nodes: a COPY in the pair of its target and each node it may read from (key
    ``(s * nn + t) * 2``), a PROMOTE or a DROP in the unordered pair of the nodes it touches (key
    ``(u * nn + w) * 2 + 1``, u <= w); pairs are numbered in key order. Returns, as int64 arrays in the order of
    ``_loop``'s parameters: each pool entry's pair; each PROMOTE's or DROP's pair (-1 for a COPY); each pair's two
    nodes and whether it is a slot pair; ``heap_start`` (each pair's slice of the waiting entries: a step waits at
    most once, in each of its pairs); ``pairs_start`` (each node's slice of the list of its pairs); ``in_start`` /
    ``out_start`` (each node's slice of its running transfers, at most its cap); and the five arrays of
    :func:`_partners`.
    """
    action, nn = np.asarray(x.action), x.nn
    n = len(action)
    tgt, src = np.asarray(x.tgt, dtype=np.int64), np.asarray(x.src, dtype=np.int64)
    pool_node = np.asarray(x.pool_node, dtype=np.int64)
    pool_start = np.asarray(x.pool_start, dtype=np.int64)
    pool_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(pool_start))
    copy_keys = (pool_node * nn + tgt[pool_rows]) << 1
    others = np.flatnonzero(action != A_COPY)
    u = src[others]
    w = np.where(action[others] == A_PROMOTE, tgt[others], u)
    slot_keys = ((np.minimum(u, w) * nn + np.maximum(u, w)) << 1) | 1
    pair_keys, codes = dense_codes(np.concatenate([copy_keys, slot_keys]))
    pool_pair = codes[: len(copy_keys)]
    row_pair = np.full(n, -1, dtype=np.int64)
    row_pair[others] = codes[len(copy_keys) :]
    pair_u, pair_w = (pair_keys >> 1) // nn, (pair_keys >> 1) % nn
    entries = np.bincount(np.concatenate([pool_pair, row_pair[others]]), minlength=len(pair_keys))
    listings = np.bincount(pair_u, minlength=nn) + np.bincount(pair_w[pair_w != pair_u], minlength=nn)
    copies = action == A_COPY
    cap = min(x.cap, max(n, 1))
    inbound = np.minimum(np.bincount(tgt[copies], minlength=nn), cap)
    outbound = np.minimum(np.bincount(pool_node, minlength=nn), cap)
    return (pool_pair, row_pair, pair_u, pair_w, pair_keys & 1, *(_offsets(c) for c in
            (entries, listings, inbound, outbound)), *_partners(pair_u, pair_w, pair_keys & 1, nn))


def _partners(pair_u: np.ndarray, pair_w: np.ndarray, pair_slot: np.ndarray, nn: int) -> tuple[np.ndarray, ...]:
    """Each node's pairs by partner, to look a pair up from its two nodes in constant time: relation 0 the COPY pairs
    the node sends in, 1 those it receives in, 2 its slot pairs. In the layout of the loop's ``holding`` (word
    ``(rel * nn + v) * words + w // 32``, bit ``w % 32``): ``bits`` marks v's partners w in relation ``rel``,
    ``before`` counts v's partners in that relation in the words before, over every (rel, v) before too; ``pair``
    lists the pairs in that order. So v's pair with w is ``pair[before[word] + (partners in the word below w)]``.
    ``at_u`` / ``at_w``: each pair's two places in ``pair`` (in its first node's list, in its second's; -1 for a slot
    pair of one node, listed once)."""
    copy = np.flatnonzero(pair_slot == 0)
    slot = np.flatnonzero(pair_slot == 1)
    other = slot[pair_u[slot] != pair_w[slot]]
    owner = np.concatenate([pair_u[copy], nn + pair_w[copy], 2 * nn + pair_u[slot], 2 * nn + pair_w[other]])
    partner = np.concatenate([pair_w[copy], pair_u[copy], pair_w[slot], pair_u[other]])
    pair = np.concatenate([copy, copy, slot, other])
    order = np.argsort(owner * nn + partner, kind="stable")
    words = (nn + 31) >> 5
    word = owner * words + (partner >> 5)
    # (owner, partner) is unique, so a word's bits add up exactly, also in float64 (below 2 ** 32)
    bits = np.bincount(word, weights=np.left_shift(1, partner & 31).astype(np.float64), minlength=3 * nn * words)
    before = _offsets(np.bincount(word, minlength=3 * nn * words))[:-1]
    place = np.empty(len(order), dtype=np.int64)  # where each (owner, partner) went
    place[order] = np.arange(len(order), dtype=np.int64)
    at_u = np.full(len(pair_u), -1, dtype=np.int64)
    at_w = np.full(len(pair_u), -1, dtype=np.int64)
    ends = np.cumsum([len(copy), len(copy), len(slot), len(other)])
    at_u[copy], at_w[copy] = place[: ends[0]], place[ends[0] : ends[1]]
    at_u[slot], at_w[other] = place[ends[1] : ends[2]], place[ends[2] :]
    return before, bits.astype(np.int64), pair[order], at_u, at_w


def dense_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an int64 array, ascending, and each element's index among them (what
    ``np.unique(keys, return_inverse=True)`` returns, by one sort: several times faster on millions of keys)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    new = np.ones(len(keys), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    codes = np.empty(len(keys), dtype=np.int64)
    codes[order] = np.cumsum(new) - 1
    return ordered[new], codes


def _offsets(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def runs_compiled(steps: int) -> bool:
    """Whether :func:`run` runs a plan of ``steps`` steps compiled when not told: with numba installed, from
    :data:`COMPILED_FROM_STEPS` steps, or at every size after :func:`compile_for_every_plan`."""
    return (steps >= COMPILED_FROM_STEPS or bool(_EVERY_PLAN)) and _compiled_loop() is not None


def compile_for_every_plan() -> bool:
    """:func:`compile_ahead`, then every later plan of this process runs compiled, whatever its size: for a process
    that schedules many plans (what-if's large sweeps), where loading the compiled loop once (half a second from
    numba's cache; a minute or two once without it) costs less than the Python loop over them (measured 12 times
    slower on the XL cluster's failure plans of 256-1,024 steps: docs/PLANNING.md, "Speed"). False without numba."""
    if _EVERY_PLAN:
        return True
    if not compile_ahead():
        return False
    _EVERY_PLAN.append(True)
    return True


def compile_ahead() -> bool:
    """Compile the loop now (about a minute, once: numba caches the machine code beside this module, or in its user
    cache where that is read-only), so that the first large plan does not wait for it. False without numba."""
    if _compiled_loop() is None:
        return False
    one_copy = LoopInput(action=[A_COPY], tgt=[1], src=[0], nxt=[-1], rank=[0], pool_node=[0], pool_start=[0, 1],
                         nbytes=[1.0], stream=[1.0], solo=[1.0], first=[0], work=[0.0, 0.0], limit=[1.0] * 4,
                         balanced=True, lookahead=True, nn=2, cap=1, bw=1.0, overhead=0.0)
    run(one_copy, compiled=True)
    return True


_COMPILED: list[object] = []


def _compiled_loop():  # a numba dispatcher, or None without numba
    """The loop compiled by numba (cached on disk by numba, compiled once per installation), or None."""
    if not _COMPILED:
        try:
            import numba
        except ImportError:
            _COMPILED.append(None)
        else:
            _COMPILED.append(numba.njit(cache=True)(_loop))
    return _COMPILED[0]


# Counters of the loop's growing lists, kept in one small array so that the loop's inner functions can change them.
_N_EVENTS, _N_FREED, _N_FRONT, _NODE_STAMP = range(4)


def _loop(action, tgt, src, nxt, pool_node, pool_start, nbytes, stream, solo, first, work, limit, ready_at, pool_pair,
          row_pair, pair_u, pair_w, pair_slot, heap_start, pairs_start, in_start, out_start, partner_before,
          partner_bits, partner_pair, pair_at_u, pair_at_w, balanced, lookahead, nn, cap, bw, overhead, horizon,
          walk_words):
    """The event loop (schedule's module docstring, "Implementation"; storage laid out by :func:`_layout`).
    Returns start, end, chosen, makespan and whether steps were left waiting (a bug).

    Every list is a NumPy array of a size known in advance with its length in ``count`` (numba compiles inner
    functions over arrays as fast as inline code; over Python lists it does not)."""
    n = len(action)
    start = np.zeros(n)
    end = np.zeros(n)
    chosen = np.empty(n, dtype=np.int64)
    for i in range(n):
        chosen[i] = src[i]
    if n == 0:
        return start, end, chosen, 0.0, False
    npairs = len(pair_u)
    count = np.zeros(4, dtype=np.int64)
    busy = np.zeros(nn, dtype=np.int64)  # running steps touching the node
    c_in = np.zeros(nn)  # committed stream rate of the COPYs into the node (direction-aware admission) ...
    c_out = np.zeros(nn)
    k_in = np.zeros(nn, dtype=np.int64)  # ... and their count: a direction with none committed always admits one
    k_out = np.zeros(nn, dtype=np.int64)
    sending = np.zeros(nn, dtype=np.int64)  # running COPYs reading from the node
    assigned = np.zeros(nn)  # bytes the node was picked to send so far
    # Transfers in their transfer phase: into node v moving[in_start[v]:][:n_in[v]], out of it
    # moving[out_at + out_start[v]:][:n_out[v]].
    n_in = np.zeros(nn, dtype=np.int64)
    n_out = np.zeros(nn, dtype=np.int64)
    out_at = in_start[nn]
    moving = np.zeros(out_at + out_start[nn], dtype=np.int64)
    left = np.zeros(n)  # bytes left at `since`
    rate = np.zeros(n)
    since = np.zeros(n)
    started = np.zeros(n, dtype=np.bool_)  # a waiting entry of a started row is void
    committed = np.zeros(n, dtype=np.bool_)  # counted in c_in / c_out
    # The nodes with a free slot, and of those the ones whose inbound / outbound direction admits a COPY; also as
    # bits (bit v % 32 of open_bits[kind * words + v // 32], kind 0 inbound, 1 outbound, 2 slot) for `scan`.
    open_flags = np.ones(3 * nn, dtype=np.bool_)  # open_flags[kind * nn + v]
    words = (nn + 31) >> 5
    open_bits = np.zeros(3 * words, dtype=np.int64)
    for v in range(nn):
        for kind in range(3):
            open_bits[kind * words + (v >> 5)] |= 1 << (v & 31)
    # Blocked ready steps wait by rank in one heap per pair of nodes (`_layout`): heaps[heap_start[p]:][:heap_len
    # [p]]. A pair only holds steps while one of its nodes is closed, so when a node opens only its pairs are looked
    # at. A node's pairs that hold steps are listed lazily in pairs_of[pairs_start[v]:][:pairs_n[v]]: a pair leaves
    # the list when it is next read after its heap emptied (`listed[p]`: bit 1 while in its first node's list, bit
    # 2 in its second's).
    heap_len = np.zeros(npairs, dtype=np.int64)
    pairs_of = np.zeros(pairs_start[nn], dtype=np.int64)
    pairs_n = np.zeros(nn, dtype=np.int64)
    listed = np.zeros(npairs, dtype=np.int64)
    # The same as bits, by the pair's two nodes, for `scan`: bit w % 32 of holding[(relation * nn + v) * words +
    # w // 32] is set while v's pair with w in that relation (`_partners`) holds steps (heap_len > 0).
    holding = np.zeros(3 * nn * words, dtype=np.int64)
    # Events: one per row and kind (0 overhead end, 1 transfer end, 2 direction release, 3 the row's `ready_at`: it
    # becomes ready), id kind * n + row, in a heap ordered by (time, kind, row) that moves an event when its time
    # changes (`event_at`: its position).
    event_heap = np.zeros(4 * n, dtype=np.int64)
    heap_time = np.zeros(4 * n)
    event_at = np.full(4 * n, -1, dtype=np.int64)
    # Scratch lists of one instant / one dispatch.
    batch = np.zeros(4 * n, dtype=np.int64)
    freed = np.zeros(nn, dtype=np.int64)
    node_mark = np.zeros(nn, dtype=np.int64)  # == count[_NODE_STAMP]: freed in this instant
    ready = np.zeros(n, dtype=np.int64)
    entering = np.zeros(n, dtype=np.int64)
    rerate = np.zeros(3 * n, dtype=np.int64)  # transfers to re-rate: twice each running one at most, and the entering
    reshares = np.zeros(2 * nn, dtype=np.int64)  # 2 * node + outward, in first-touched order ...
    reshare_count = np.zeros(2 * nn, dtype=np.int64)  # ... with the largest count it changed from or to
    # Each pair's best waiting rank (its heap's top) at its places in its nodes' lists of partners (`_partners`), so
    # that a node's scan reads its own slice of memory, not every pair's heap (a pair's top may have started: the
    # frontier checks it before it starts anything).
    pair_head = np.zeros(len(partner_pair), dtype=np.int64)
    # The pairs' heaps of waiting steps, then the ready steps' heap (`fresh`), then the heap of pairs to dispatch
    # from (`frontier`), in one array the inner functions close over (as `moving` holds what were two arrays and
    # `open_flags` three): numba counts the references to an array passed as an argument, atomically, at every call; a
    # profile of the million-step plan had 12% of the loop's samples on those counts, 5% after.
    fresh = heap_start[npairs]
    frontier = fresh + n
    heaps = np.zeros(frontier + 2 * npairs + 1, dtype=np.int64)  # a pair is in the frontier twice at most
    base = npairs + 1  # a frontier entry is rank * base + pair + 1 (pair -1: the ready steps), ordered as (rank, pair)

    def heap_push(first_slot, size, value):
        """Push ``value`` on the min-heap heaps[first_slot:first_slot + size]; returns the new size."""
        k = size
        while k > 0:
            parent = (k - 1) >> 1
            above = heaps[first_slot + parent]
            if above <= value:
                break
            heaps[first_slot + k] = above
            k = parent
        heaps[first_slot + k] = value
        return size + 1

    def heap_pop(first_slot, size):
        """Pop the top of the min-heap heaps[first_slot:first_slot + size] (the caller shrinks the size)."""
        top = heaps[first_slot]
        size -= 1
        if size > 0:
            value = heaps[first_slot + size]
            k = 0
            while True:
                c = 2 * k + 1
                if c >= size:
                    break
                if c + 1 < size and heaps[first_slot + c + 1] < heaps[first_slot + c]:
                    c += 1
                if heaps[first_slot + c] >= value:
                    break
                heaps[first_slot + k] = heaps[first_slot + c]
                k = c
            heaps[first_slot + k] = value
        return top

    def event_move(frm, to):
        event_heap[to] = event_heap[frm]
        heap_time[to] = heap_time[frm]
        event_at[event_heap[to]] = to

    def event_sift(k):
        """Move the event at heap position k up or down to its place. The heap holds each event's time beside its
        id (`heap_time`), so that comparisons read the heap's few live entries, not arrays of every row."""
        e = event_heap[k]
        te = heap_time[k]
        size = count[_N_EVENTS]
        while k > 0:
            parent = (k - 1) >> 1
            if te < heap_time[parent] or (te == heap_time[parent] and e < event_heap[parent]):
                event_move(parent, k)
                k = parent
            else:
                break
        while True:
            c = 2 * k + 1
            if c >= size:
                break
            if c + 1 < size and (heap_time[c + 1] < heap_time[c]
                                 or (heap_time[c + 1] == heap_time[c] and event_heap[c + 1] < event_heap[c])):
                c += 1
            if heap_time[c] < te or (heap_time[c] == te and event_heap[c] < e):
                event_move(c, k)
                k = c
            else:
                break
        event_heap[k] = e
        heap_time[k] = te
        event_at[e] = k

    def event_set(e, time):
        """Schedule event e at ``time`` (moving it if it is scheduled)."""
        if event_at[e] < 0:
            event_at[e] = count[_N_EVENTS]
            event_heap[count[_N_EVENTS]] = e
            count[_N_EVENTS] += 1
        heap_time[event_at[e]] = time
        event_sift(event_at[e])

    def event_drop(e):
        k = event_at[e]
        if k < 0:
            return
        event_at[e] = -1
        count[_N_EVENTS] -= 1
        size = count[_N_EVENTS]
        if k < size:
            event_move(size, k)
            event_sift(k)

    def set_open(kind, v, value):
        if open_flags[kind * nn + v] != value:
            open_flags[kind * nn + v] = value
            if value:
                open_bits[kind * words + (v >> 5)] |= 1 << (v & 31)
            else:
                open_bits[kind * words + (v >> 5)] &= ~(1 << (v & 31))

    def refresh(v):
        free = busy[v] < cap
        set_open(0, v, free and (k_in[v] == 0 or c_in[v] < limit[v]))
        set_open(1, v, free and (k_out[v] == 0 or c_out[v] < limit[nn + v]))
        set_open(2, v, free)

    def enlist(v, p, bit):
        if not listed[p] & bit:
            pairs_of[pairs_start[v] + pairs_n[v]] = p
            pairs_n[v] += 1
            listed[p] |= bit

    def flip(relation, v, w, on):
        k = (relation * nn + v) * words + (w >> 5)
        if on:
            holding[k] |= 1 << (w & 31)
        else:
            holding[k] &= ~(1 << (w & 31))

    def mark(p, on):
        """Set or clear the pair's bits in `holding` (it holds steps from now on / no longer)."""
        u = pair_u[p]
        w = pair_w[p]
        if pair_slot[p]:
            flip(2, u, w, on)
            flip(2, w, u, on)
        else:
            flip(0, u, w, on)
            flip(1, w, u, on)

    def show_head(p):
        """Copy a pair's best waiting rank to its places in its nodes' lists (`pair_head`)."""
        top = heaps[heap_start[p]]
        pair_head[pair_at_u[p]] = top
        if pair_at_w[p] >= 0:
            pair_head[pair_at_w[p]] = top

    def wait_in(p, r):
        if heap_len[p] == 0:
            enlist(pair_u[p], p, 1)
            if pair_w[p] != pair_u[p]:
                enlist(pair_w[p], p, 2)
            mark(p, True)
        if heap_start[p] + heap_len[p] >= heap_start[p + 1]:
            raise RuntimeError("scheduler bug: a step waited twice")
        heap_len[p] = heap_push(heap_start[p], heap_len[p], r)
        if heaps[heap_start[p]] == r:
            show_head(p)

    def wait(i):
        if action[i] == A_COPY:
            for q in range(pool_start[i], pool_start[i + 1]):
                wait_in(pool_pair[q], i)
        else:
            wait_in(row_pair[i], i)

    def try_start(i, t):
        """Start row i at t if every node it touches admits it (a COPY from its best open pool member), else make it
        wait."""
        if action[i] == A_COPY:
            u = tgt[i]
            w = -1
            if open_flags[u]:
                best_work, best_sending, best_assigned = 0.0, 0, 0.0
                for q in range(pool_start[i], pool_start[i + 1]):
                    c = pool_node[q]
                    if open_flags[nn + c]:
                        if not balanced:
                            w = c
                            break
                        if (w < 0 or work[c] < best_work
                                or (work[c] == best_work and (sending[c] < best_sending
                                    or (sending[c] == best_sending and assigned[c] < best_assigned)))):
                            w, best_work, best_sending, best_assigned = c, work[c], sending[c], assigned[c]
            fits = w >= 0
        else:
            u = src[i]
            w = tgt[i] if action[i] == A_PROMOTE else u
            fits = open_flags[2 * nn + u] and open_flags[2 * nn + w]
        if not fits:
            wait(i)
            return
        if action[i] == A_COPY:  # u is the target, w the source
            c_in[u] += stream[i]
            c_out[w] += stream[i]
            k_in[u] += 1
            k_out[w] += 1
            committed[i] = True
            sending[w] += 1
            assigned[w] += nbytes[i]
            if balanced:
                work[w] += solo[i]
            chosen[i] = w
        busy[u] += 1
        refresh(u)
        if w != u:
            busy[w] += 1
            refresh(w)
        started[i] = True
        start[i] = t
        event_set(i, t + overhead)

    def take(p):
        """Pop the best-ranked entry of a pair's heap."""
        top = heap_pop(heap_start[p], heap_len[p])
        heap_len[p] -= 1
        if heap_len[p] == 0:
            mark(p, False)
        else:
            show_head(p)
        return top

    def head(p):
        """Rank of the first waiting step of a pair that has not started, -1 when it holds none."""
        while heap_len[p] > 0 and started[heaps[heap_start[p]]]:
            take(p)
        return heaps[heap_start[p]] if heap_len[p] > 0 else -1

    def is_open(p):
        if pair_slot[p]:
            return open_flags[2 * nn + pair_u[p]] and open_flags[2 * nn + pair_w[p]]
        return open_flags[nn + pair_u[p]] and open_flags[pair_w[p]]

    def offer(r, p):
        """Put pair p with its best waiting rank r on the frontier (`dispatch`)."""
        count[_N_FRONT] = heap_push(frontier, count[_N_FRONT], r * base + p + 1)

    def scan(relation, v, kind):
        """Offer v's pairs in ``relation`` (`_partners`) that hold steps and whose other node is open (``kind``
        of `open_bits`), a word of 32 partners at a time."""
        row = (relation * nn + v) * words
        for k in range(words):
            both = holding[row + k] & open_bits[kind * words + k]
            while both != 0:
                low = both & -both  # the lowest partner left in the word ...
                both ^= low
                # ... is v's partner number `before` + (v's partners below it in the word): a population count
                below = partner_bits[row + k] & (low - 1)
                below -= (below >> 1) & 0x55555555
                below = (below & 0x33333333) + ((below >> 2) & 0x33333333)
                below = (((below + (below >> 4)) & 0x0F0F0F0F) * 0x01010101 & 0xFFFFFFFF) >> 24
                place = partner_before[row + k] + below
                offer(pair_head[place], partner_pair[place])

    def pairs_to_look_at(v):
        """Offer v's open pairs that hold steps (v has a free slot): walking v's list of pairs, dropping the
        pairs that hold none, or scanning the bits of its partners when the list is longer than `walk_words`
        entries per word (see :func:`run`)."""
        first_slot = pairs_start[v]
        m = pairs_n[v]
        if m > walk_words * words:
            if open_flags[nn + v]:
                scan(0, v, 0)
            if open_flags[v]:
                scan(1, v, 1)
            scan(2, v, 2)
            return
        kept = 0
        for q in range(m):
            p = pairs_of[first_slot + q]
            if heap_len[p] > 0:
                pairs_of[first_slot + kept] = p
                kept += 1
                if is_open(p):
                    offer(heaps[heap_start[p]], p)
            else:  # its heap emptied: it leaves v's list
                if pair_u[p] == v:
                    listed[p] &= 2
                if pair_w[p] == v:
                    listed[p] &= 1
        pairs_n[v] = kept

    def dispatch(t, n_freed, n_ready):
        count[_N_FRONT] = 0
        for q in range(n_freed):
            v = freed[q]
            if open_flags[2 * nn + v] and pairs_n[v] > 0:
                pairs_to_look_at(v)
        n_fresh = 0
        for q in range(n_ready):
            n_fresh = heap_push(fresh, n_fresh, ready[q])
        n_front = count[_N_FRONT]
        if n_fresh > 0:
            n_front = heap_push(frontier, n_front, heaps[fresh] * base)
        while n_front > 0:
            code = heap_pop(frontier, n_front)
            n_front -= 1
            r = code // base
            p = code - r * base - 1
            if p < 0:  # the best ready step
                i = heap_pop(fresh, n_fresh)
                n_fresh -= 1
            else:
                if heap_len[p] == 0 or not is_open(p):
                    continue  # a node of the pair closed again: none of its steps fits now
                r2 = head(p)
                if r2 != r:
                    if r2 >= 0:
                        n_front = heap_push(frontier, n_front, r2 * base + p + 1)
                    continue
                i = take(p)  # both nodes open: it starts
            try_start(i, t)
            if p < 0:
                if n_fresh > 0:
                    n_front = heap_push(frontier, n_front, heaps[fresh] * base)
            elif heap_len[p] > 0 and is_open(p):
                r2 = head(p)
                if r2 >= 0:
                    n_front = heap_push(frontier, n_front, r2 * base + p + 1)

    def free(v):
        if node_mark[v] != count[_NODE_STAMP]:
            node_mark[v] = count[_NODE_STAMP]
            freed[count[_N_FREED]] = v
            count[_N_FREED] += 1

    def release(j):
        """j's transfer ends within overhead_s: it stops counting against its directions (lookahead)."""
        committed[j] = False
        g = tgt[j]
        s = chosen[j]
        c_in[g] -= stream[j]
        c_out[s] -= stream[j]
        k_in[g] -= 1
        k_out[s] -= 1
        refresh(g)
        refresh(s)
        free(g)
        free(s)

    def retime(j, t, new):
        """Settle j's progress at t and go on at rate ``new``."""
        old = rate[j]
        if new == old:
            return
        rest = max(left[j] - old * (t - since[j]), 0.0)
        left[j] = rest
        since[j] = t
        rate[j] = new
        finish = t + rest / new
        event_set(n + j, finish)
        event_drop(2 * n + j)
        if lookahead and committed[j]:
            if finish - overhead <= t:
                release(j)
            else:
                event_set(2 * n + j, finish - overhead)

    def fair_rate(j):
        a = n_out[chosen[j]]
        b = n_in[tgt[j]]
        return min(stream[j], bw / (a if a > b else b))

    def touch(v, outward, size, n_reshares):
        """A transfer count of v changed from or to ``size``: v's direction is re-rated (``reshare``)."""
        d = 2 * v + (1 if outward else 0)
        if reshare_count[d] == 0:
            reshares[n_reshares] = d
            n_reshares += 1
        if size > reshare_count[d]:
            reshare_count[d] = size
        return n_reshares

    def reshare(d, n_rerate):
        """The transfer count of direction d (2 * node + outward) changed, from or to ``reshare_count[d]`` at most:
        list for re-rating its transfers faster than ``bw / count`` (the others run at their stream rate either
        way). Returns the new length of `rerate`."""
        v = d >> 1
        share = bw / reshare_count[d]
        reshare_count[d] = 0
        first_slot = out_at + out_start[v] if d & 1 else in_start[v]
        for q in range(n_out[v] if d & 1 else n_in[v]):
            j = moving[first_slot + q]
            if stream[j] > share:
                rerate[n_rerate] = j
                n_rerate += 1
        return n_rerate

    def remove(first_slot, size, j):
        """Remove j from moving[first_slot:first_slot + size] (the caller shrinks the size)."""
        for q in range(first_slot, first_slot + size):
            if moving[q] == j:
                moving[q] = moving[first_slot + size - 1]
                return

    n_ready = 0
    for q in range(len(first)):
        if ready_at[first[q]] > 0.0:
            event_set(3 * n + first[q], ready_at[first[q]])
        else:
            ready[n_ready] = first[q]
            n_ready += 1
    dispatch(0.0, 0, n_ready)
    last = 0.0
    while count[_N_EVENTS] > 0:
        t = heap_time[0]
        if t > horizon:
            return start, end, chosen, math.inf, False
        instant = t + _EVENT_EPS
        n_batch = 0
        while count[_N_EVENTS] > 0 and heap_time[0] <= instant:
            batch[n_batch] = event_heap[0]
            n_batch += 1
            event_drop(event_heap[0])
        count[_NODE_STAMP] += 1
        count[_N_FREED] = 0
        n_ready = 0
        n_entering = 0
        n_reshares = 0
        for q in range(n_batch):
            kind = batch[q] // n
            i = batch[q] - kind * n
            if kind == 3:  # its `ready_at`: it is ready
                ready[n_ready] = i
                n_ready += 1
                continue
            if kind == 2:
                if committed[i]:
                    release(i)
                continue
            a = action[i]
            if a == A_COPY and (kind == 1 or nbytes[i] > 0):
                s = chosen[i]
                g = tgt[i]
                if kind == 0:  # overhead over: the transfer starts
                    moving[out_at + out_start[s] + n_out[s]] = i
                    moving[in_start[g] + n_in[g]] = i
                    n_out[s] += 1
                    n_in[g] += 1
                    left[i] = nbytes[i]
                    since[i] = t
                    rate[i] = 0.0
                    n_reshares = touch(s, True, n_out[s], n_reshares)
                    n_reshares = touch(g, False, n_in[g], n_reshares)
                    entering[n_entering] = i
                    n_entering += 1
                    continue
                n_reshares = touch(s, True, n_out[s], n_reshares)  # transfer over
                n_reshares = touch(g, False, n_in[g], n_reshares)
                remove(out_at + out_start[s], n_out[s], i)
                remove(in_start[g], n_in[g], i)
                n_out[s] -= 1
                n_in[g] -= 1
                event_drop(2 * n + i)
            end[i] = t
            last = t
            if a == A_COPY:
                s = chosen[i]
                g = tgt[i]
                busy[s] -= 1
                busy[g] -= 1
                sending[s] -= 1
                if committed[i]:
                    release(i)  # (refreshes and frees both nodes)
                else:
                    refresh(s)
                    refresh(g)
                    free(s)
                    free(g)
            else:
                u = src[i]
                w = tgt[i]
                busy[u] -= 1
                refresh(u)
                free(u)
                if a == A_PROMOTE and w != u:
                    busy[w] -= 1
                    refresh(w)
                    free(w)
            if nxt[i] >= 0:
                if ready_at[nxt[i]] > instant:
                    event_set(3 * n + nxt[i], ready_at[nxt[i]])
                else:
                    ready[n_ready] = nxt[i]
                    n_ready += 1
        n_rerate = 0
        for q in range(n_reshares):
            n_rerate = reshare(reshares[q], n_rerate)
        for q in range(n_entering):  # an entering transfer no reshare listed runs at its stream rate
            rerate[n_rerate] = entering[q]
            n_rerate += 1
        for q in range(n_rerate):  # (a transfer listed twice is re-rated once: the second time its rate is set)
            retime(rerate[q], t, fair_rate(rerate[q]))
        dispatch(t, count[_N_FREED], n_ready)
    stuck = False
    for p in range(npairs):
        if head(p) >= 0:
            stuck = True
    return start, end, chosen, last, stuck


class _ListArrays:
    """The part of NumPy the loop calls, backed by Python lists: the loop run as plain Python (:func:`run`) reads
    and writes single elements, which CPython does several times faster on a list than on an array."""

    int64, bool_ = int, bool

    @staticmethod
    def zeros(size: int, dtype: type = float) -> list:
        return [dtype(0)] * size

    @staticmethod
    def empty(size: int, dtype: type = float) -> list:
        return [dtype(0)] * size

    @staticmethod
    def ones(size: int, dtype: type = float) -> list:
        return [dtype(1)] * size

    @staticmethod
    def full(size: int, value: object, dtype: type = float) -> list:
        return [dtype(value)] * size

    @staticmethod
    def arange(size: int) -> list:
        return list(range(size))


_python_loop = types.FunctionType(_loop.__code__, {**globals(), "np": _ListArrays}, "_loop")
