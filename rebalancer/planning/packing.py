"""Packed schedules: every step placed, in priority order, at the earliest instant its slots and lanes are free, then
improved by forward-backward passes (the *packed* candidate of ``portfolio``, and the exact pass's compaction).

:mod:`rebalancer.planning.schedule` calls :func:`pack` with a decoded plan; :mod:`rebalancer.planning.optimum` calls
:func:`serial_schedule` to close the gaps of a solver's grid. Pure NumPy and Python: no Spark, no storage.

Lanes
    A list schedule starts steps only at events, in one order; it cannot keep an instant free for a step that will
    fit there, nor move a step into a gap that opens behind it. Here each step takes the earliest instant where it
    fits among the steps placed before it (the *serial schedule generation scheme*, in continuous time), so steps
    fill the gaps and a node's transfers end at staggered instants. The fluid model's rates depend on everything
    that runs beside a transfer, which a placement cannot know, so each direction of each node gets *lanes*: it
    never carries more than ``lanes`` transfers at once, and each transfer's planned duration is its overhead plus
    its bytes at ``min(stream, bw / lanes)`` of both its directions, the slowest rate it can get under those lanes.
    A step also holds a slot on every node it touches for its planned duration, and starts after its partition's
    previous step ends. Replayed by the cost model from the same starts, no transfer is slower than planned, so
    every step ends no later than planned and every slot and lane is free when the plan says it is (induction over
    time): the replay (the event loop with each row's ``ready_at``) is a legal schedule no longer than the plan.

    A direction's *base* lanes are ``floor(bw / fastest stream that may use it)`` (6 entry transfers at the defaults,
    at most the cap): no transfer there is slower than its stream. One lane more fills the link (7 entry transfers:
    2.5 GB/s against 2.4) at the cost of every transfer there running at ``bw / 7``: worth it where the link, not
    the slots, holds the node back (:func:`_extra_lanes`).

Forward-backward improvement
    A schedule's steps, latest end first, placed in reversed time (the overhead at a step's end, a partition's
    steps last to first) pack to the right; placed again forwards in the order they start there, they pack to the
    left. Each such round keeps the best schedule so far, and often shortens it (Valls, Ballestin and Quintanilla,
    "Justification and RCPSP: A technique that pays", EJOR 2005).

Sources
    The placement reads every COPY from one fixed node. :func:`balanced_sources` moves single COPYs between the
    members of their pools while that lowers the busiest node's time (its slots, its inbound or outbound link),
    starting from the linear program's rounding (:mod:`rebalancer.planning.sources`), which balances shares by
    count and can leave a node a few transfers over its share.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from rebalancer.planning.event_loop import A_COPY, A_PROMOTE

__all__ = ["Steps", "balanced_sources", "forward_backward", "lanes_without_slowing", "pack", "serial_schedule",
           "slot_nodes"]

_EPS = 1e-9  # instants closer than this are one (as in the event loop)


@dataclass(frozen=True)
class Steps:
    """A plan with its sources fixed, as :func:`serial_schedule` places it: arrays indexed by row.

    ``node`` / ``other``: the nodes a step holds a slot on (:func:`slot_nodes`). ``moving``: a COPY with bytes (it holds
    a lane of its target's inbound and its source's outbound direction from ``overhead`` after its start to its end).
    ``length``: the planned duration. ``nxt``: the row of the partition's next step, -1 for the last. ``lanes``: per
    direction, every node's inbound one then every node's outbound one.
    """

    node: np.ndarray
    other: np.ndarray
    moving: np.ndarray
    length: np.ndarray
    nxt: np.ndarray
    lanes: np.ndarray
    nn: int
    cap: int
    overhead: float


def slot_nodes(
    action: np.ndarray, src: np.ndarray, tgt: np.ndarray, source: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the two nodes a step holds a slot on (:class:`Steps`' ``node`` and ``other``): a COPY its target and
    ``source``, a PROMOTE its old and new primary, a DROP its node twice."""
    is_copy = action == A_COPY
    return np.where(is_copy, tgt, src), np.where(is_copy, source, np.where(action == A_PROMOTE, tgt, src))


class _Profile:
    """How many placed steps hold a resource over time: a step function, ``use[k]`` from ``at[k]`` to ``at[k + 1]``;
    the resource is full where ``most`` hold it. Its full stretches are also kept merged (``full_from[r]`` to
    ``full_to[r]``, sorted), so that a search jumps from one to the next instead of walking every step placed."""

    __slots__ = ("at", "full_from", "full_to", "most", "use")

    def __init__(self, most: int) -> None:
        self.at = [-math.inf, math.inf]
        self.use = [0, 0]
        self.most = most
        self.full_from: list[float] = []
        self.full_to: list[float] = []

    def earliest(self, lo: float, span: float) -> float:
        """The earliest x >= lo such that the resource is not full anywhere in [x, x + span) (instants closer than
        ``_EPS`` are one): a window that meets a full stretch moves to that stretch's end (the stretches passed are
        what the pass's cost grows with, ``PACK_UP_TO_WORK`` in the scheduler)."""
        full_from, full_to = self.full_from, self.full_to
        x = lo
        r = bisect.bisect_right(full_to, x + _EPS)
        while r < len(full_from) and full_from[r] < x + span - _EPS:
            if full_to[r] - full_from[r] > _EPS:  # (a sliver where two steps meet in float arithmetic is no stretch)
                x = full_to[r]
            r += 1
        return x

    def _split(self, x: float) -> int:
        k = bisect.bisect_right(self.at, x) - 1
        if self.at[k] != x:
            k += 1
            self.at.insert(k, x)
            self.use.insert(k, self.use[k - 1])
        return k

    def hold(self, lo: float, hi: float) -> None:
        i = self._split(lo)
        j = self._split(hi)
        use, most = self.use, self.most
        for k in range(i, j):
            use[k] += 1
            if use[k] == most:
                self._fill(self.at[k], self.at[k + 1])

    def _fill(self, lo: float, hi: float) -> None:
        """[lo, hi) became full: merged into the full stretches it touches."""
        full_from, full_to = self.full_from, self.full_to
        r = bisect.bisect_left(full_to, lo)  # the first stretch ending at or after lo
        if r < len(full_from) and full_from[r] <= lo:  # it reaches lo: extend it
            full_to[r] = max(full_to[r], hi)
        else:
            full_from.insert(r, lo)
            full_to.insert(r, hi)
        if r + 1 < len(full_from) and full_from[r + 1] <= full_to[r]:  # it now reaches the next one: merge
            full_to[r] = full_to[r + 1]
            del full_from[r + 1], full_to[r + 1]


def serial_schedule(steps: Steps, key: np.ndarray, backward: bool = False,
                    not_before: np.ndarray | None = None) -> np.ndarray:
    """Start times: the rows by ``key`` (then row; a row never before its partition's previous step, or with
    ``backward`` its next one), each at the earliest instant from that step's end (0 for the first; never before
    ``not_before`` where given) where every node it touches has fewer than ``cap`` steps placed over its length, and
    each of its directions fewer than its lanes over its transfer. ``backward`` places in reversed time: a transfer
    holds its lanes from its start to ``overhead`` before its end, and the returned instants are reversed starts (a
    step's start in forward time is the makespan minus its reversed start minus its length)."""
    n, nn = len(steps.length), steps.nn
    length = steps.length.tolist()
    node, other, moving = steps.node.tolist(), steps.other.tolist(), steps.moving.tolist()
    lanes = steps.lanes.tolist()
    cap, lead = steps.cap, steps.overhead
    following = steps.nxt.tolist()
    if backward:  # a partition's steps last to first
        following = [-1] * n
        for i, j in enumerate(steps.nxt.tolist()):
            if j >= 0:
                following[j] = i
    has_before = [False] * n
    for j in following:
        if j >= 0:
            has_before[j] = True
    keys = np.asarray(key, dtype=np.float64).tolist()
    eligible = [(keys[i], i) for i in range(n) if not has_before[i]]
    heapq.heapify(eligible)
    # slots of every node, then inbound lanes, then outbound lanes
    profiles = [_Profile(cap) for _ in range(nn)] + [_Profile(most) for most in lanes]
    ready = [0.0] * n if not_before is None else np.asarray(not_before, dtype=np.float64).tolist()
    start = np.zeros(n)
    while eligible:
        _, i = heapq.heappop(eligible)
        d, u, w = length[i], node[i], other[i]
        windows = [(profiles[u], 0.0, d)]
        if w != u:
            windows.append((profiles[w], 0.0, d))
        if moving[i]:
            lo, hi = (0.0, d - lead) if backward else (lead, d)
            windows.append((profiles[nn + u], lo, hi))
            windows.append((profiles[2 * nn + w], lo, hi))
        t = ready[i]
        settled = 0  # windows in a row that fit at t: all of them, and t is the earliest instant
        k = 0
        while settled < len(windows):
            profile, lo, hi = windows[k]
            x = profile.earliest(t + lo, hi - lo) - lo
            if x > t + _EPS:
                t, settled = x, 1
            else:
                settled += 1
            k = (k + 1) % len(windows)
        for profile, lo, hi in windows:
            profile.hold(t + lo, t + hi)
        start[i] = t
        j = following[i]
        if j >= 0:
            ready[j] = max(ready[j], t + d)
            heapq.heappush(eligible, (keys[j], j))
    return start


def forward_backward(steps: Steps, key: np.ndarray, rounds: int) -> tuple[np.ndarray, float]:
    """The shortest of :func:`serial_schedule` by ``key`` and ``rounds`` forward-backward rounds from it (module
    docstring): the starts and the planned makespan."""
    length = steps.length
    start = serial_schedule(steps, key)
    best, best_span = start, float((start + length).max(initial=0.0))
    for _ in range(rounds):
        back = serial_schedule(steps, -(start + length), backward=True)
        mirrored = float((back + length).max(initial=0.0)) - (back + length)  # forward starts, packed right
        start = serial_schedule(steps, mirrored)
        span = float((start + length).max(initial=0.0))
        if span < best_span - _EPS:
            best, best_span = start, span
    return best, best_span


def lanes_without_slowing(tgt: np.ndarray, pool_node: np.ndarray, pool_start: np.ndarray, moving: np.ndarray,
                          stream: np.ndarray, nn: int, cap: int, bw: float) -> np.ndarray:
    """Per direction (inbound of every node, then outbound), ``floor(bw / fastest stream)`` of the transfers that
    may use it (an outbound one: every COPY whose pool holds the node), at least 1 and at most ``cap`` (``cap``
    with none): the most that run at once without slowing any (the *base* lanes here, the exact pass's direction
    limits).
    """
    rows = np.repeat(np.arange(len(tgt)), np.diff(pool_start))
    sends = moving[rows]
    fastest = np.zeros(2 * nn)
    np.maximum.at(fastest, tgt[moving], stream[moving])
    np.maximum.at(fastest, nn + pool_node[sends], stream[rows[sends]])
    with np.errstate(divide="ignore"):
        most = np.floor(bw / fastest * (1 + 1e-12))
    return np.clip(np.where(fastest > 0, most, cap), 1, cap).astype(np.int64)


def _planned_lengths(tgt: np.ndarray, source: np.ndarray, moving: np.ndarray, nbytes: np.ndarray, stream: np.ndarray,
                     lanes: np.ndarray, nn: int, bw: float, overhead: float) -> np.ndarray:
    """Each step's planned duration under ``lanes``: its overhead, and a transfer's bytes at ``min(stream, bw /
    lanes)`` of both its directions (module docstring, "Lanes")."""
    rate = np.minimum(stream, bw / np.maximum(lanes[np.maximum(tgt, 0)], lanes[nn + source]))
    return overhead + np.where(moving, nbytes / np.where(moving, rate, 1.0), 0.0)


def _node_times(steps: Steps, nbytes: np.ndarray, source: np.ndarray, tgt: np.ndarray, bw: float) -> np.ndarray:
    """Per node, the longest of its slot time (planned lengths over ``cap``) and its two links' times at the rate
    its lanes allow (``min(bw, lanes * slowest planned rate)``, from the end of a first overhead)."""
    nn, moving = steps.nn, steps.moving
    slot = np.bincount(steps.node, weights=steps.length, minlength=nn)
    slot += np.bincount(steps.other[steps.other != steps.node], weights=steps.length[steps.other != steps.node],
                        minlength=nn)
    rate = np.where(moving, nbytes / np.maximum(steps.length - steps.overhead, 1e-300), 0.0)
    link = np.zeros(2 * nn)
    for offset, nodes in ((0, tgt), (nn, source)):
        carried = np.bincount(nodes[moving], weights=nbytes[moving], minlength=nn)
        slowest = np.full(nn, np.inf)
        np.minimum.at(slowest, nodes[moving], rate[moving])
        speed = np.minimum(bw, steps.lanes[offset : offset + nn] * np.where(np.isfinite(slowest), slowest, bw))
        link[offset : offset + nn] = np.where(carried > 0, steps.overhead + carried / speed, 0.0)
    return np.maximum(slot / steps.cap, np.maximum(link[:nn], link[nn:]))


def _extra_lanes(steps: Steps, nbytes: np.ndarray, source: np.ndarray, tgt: np.ndarray, stream: np.ndarray,
                 bw: float) -> np.ndarray:
    """Lanes with one more on the directions whose link holds their node back: greedily, the direction whose extra
    lane shortens its node's time most without lengthening any node past the longest (the extra lane slows every
    transfer there, and so their other nodes' slots), while that node is within 3% of the longest."""
    lanes = steps.lanes.copy()
    nn, moving = steps.nn, steps.moving
    base = lanes.copy()

    def with_lanes(trial: np.ndarray) -> Steps:
        lengths = _planned_lengths(tgt, source, moving, nbytes, stream, trial, nn, bw, steps.overhead)
        return replace(steps, lanes=trial, length=lengths)

    used = np.zeros(2 * nn, dtype=bool)
    used[tgt[moving]] = True
    used[nn + source[moving]] = True
    times = _node_times(steps, nbytes, source, tgt, bw)
    while True:
        longest = float(times.max(initial=0.0))
        best, best_gain = -1, 0.0
        for d in np.flatnonzero(used & (lanes == base) & (base < steps.cap)).tolist():
            v = d % nn
            if times[v] < 0.97 * longest:
                continue
            trial = lanes.copy()
            trial[d] += 1
            new = _node_times(with_lanes(trial), nbytes, source, tgt, bw)
            gain = times[v] - new[v]
            if gain > best_gain + _EPS and new.max() <= longest + _EPS:
                best, best_gain = d, gain
        if best < 0:
            return lanes
        lanes[best] += 1
        times = _node_times(with_lanes(lanes), nbytes, source, tgt, bw)


def balanced_sources(action: np.ndarray, src: np.ndarray, tgt: np.ndarray, pool_node: np.ndarray,
                     pool_start: np.ndarray, source: np.ndarray, nbytes: np.ndarray, solo: np.ndarray, nn: int,
                     cap: int, bw: float) -> np.ndarray:
    """``source`` (per row, the node a COPY reads from) with single COPYs moved to another member of their pool while
    that lowers the node times, longest first (a node's time: its slot time over ``cap``, its inbound or outbound
    bytes over ``bw``). Each round takes the longest node that can give a COPY to another member of its pool and
    leave both below its own time, and moves the COPY that leaves the two nodes' longer time least. Every step holds
    a slot on its nodes for its solo time ``solo``. (Over the rate of the base lanes instead of ``bw``, the sources
    packed into the same or longer schedules over the L cluster's failures: docs/PLANNING.md.)"""
    source = source.copy()
    is_copy = action == A_COPY
    flexible = np.flatnonzero(is_copy & (np.diff(pool_start) > 1))
    if len(flexible) == 0:
        return source
    moving = is_copy & (nbytes > 0)
    sent = np.where(moving, nbytes, 0.0)
    inbound = np.bincount(tgt[moving], weights=nbytes[moving], minlength=nn)
    outbound = np.bincount(source[moving], weights=nbytes[moving], minlength=nn)
    node, other = slot_nodes(action, src, tgt, source)
    slot = np.bincount(node, weights=solo, minlength=nn)
    slot += np.bincount(other[other != node], weights=solo[other != node], minlength=nn)

    entry_row = np.repeat(np.arange(len(source)), np.diff(pool_start))  # every (COPY, pool member) pair
    movable = np.isin(entry_row, flexible)
    times = np.maximum(np.maximum(inbound, outbound) / bw, slot / cap)
    for _ in range(4 * len(flexible)):  # a bound only: each move lowers the sorted node times
        for v in np.argsort(-times, kind="stable").tolist():  # the longest node that can give a COPY away
            pairs = np.flatnonzero(movable & (source[entry_row] == v) & (pool_node != v))
            rows, to = entry_row[pairs], pool_node[pairs]
            left = np.maximum(np.maximum(inbound[v], outbound[v] - sent[rows]) / bw, (slot[v] - solo[rows]) / cap)
            taken = np.maximum(np.maximum(inbound[to], outbound[to] + sent[rows]) / bw, (slot[to] + solo[rows]) / cap)
            moved = np.maximum(left, taken)
            if len(moved) and moved.min() < times[v] - _EPS:
                k = int(np.argmin(moved))
                i, w = int(rows[k]), int(to[k])
                break
        else:
            break
        source[i] = w
        for x, sign in ((v, -1.0), (w, 1.0)):
            outbound[x] += sign * sent[i]
            slot[x] += sign * solo[i]
            times[x] = max(inbound[x] / bw, outbound[x] / bw, slot[x] / cap)
    return source


def pack(action: np.ndarray, src: np.ndarray, tgt: np.ndarray, nxt: np.ndarray, pool_node: np.ndarray,
         pool_start: np.ndarray, source: np.ndarray, nbytes: np.ndarray, stream: np.ndarray, key: np.ndarray, nn: int,
         cap: int, bw: float, overhead: float, rounds: int) -> tuple[np.ndarray, float]:
    """The packed schedule of a plan whose COPYs read from ``source`` (module docstring): with the base lanes and
    with :func:`_extra_lanes`, each by :func:`serial_schedule` from ``key`` and ``rounds`` forward-backward rounds,
    the shorter. Returns the planned starts and makespan (the replay's makespan is at most that)."""
    moving = (action == A_COPY) & (nbytes > 0)
    node, other = slot_nodes(action, src, tgt, source)
    lanes = lanes_without_slowing(tgt, pool_node, pool_start, moving, stream, nn, cap, bw)
    plain = Steps(node=node, other=other, moving=moving, nxt=nxt, lanes=lanes, nn=nn, cap=cap, overhead=overhead,
                  length=_planned_lengths(tgt, source, moving, nbytes, stream, lanes, nn, bw, overhead))
    best = forward_backward(plain, key, rounds)
    more = _extra_lanes(plain, nbytes, source, tgt, stream, bw)
    if (more != lanes).any():
        wide = replace(plain, lanes=more,
                       length=_planned_lengths(tgt, source, moving, nbytes, stream, more, nn, bw, overhead))
        found = forward_backward(wide, key, rounds)
        if found[1] < best[1] - _EPS:
            best = found
    return best
