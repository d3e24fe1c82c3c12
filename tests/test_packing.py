"""Packed schedules (``rebalancer.planning.packing``), pure: no Spark.

The serial placement is checked against the rules it promises, read here from its placements (slots, lanes and a
partition's order at every instant, and no step placeable earlier among the steps placed before it), forwards and in
reversed time; the forward-backward rounds never lengthen its schedule; the balancing of sources never lengthens the
longest node. That the replayed schedule is a legal one under the cost model, with the cost model's times, is
checked with the scheduler's other passes in tests/test_schedule_optimum.py.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer.planning import packing
from rebalancer.planning.event_loop import A_COPY, A_DROP, A_PROMOTE

EXAMPLES = 2_000 if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "soak" else 200
OVERHEAD = 0.1
EPS = 1e-9


@st.composite
def step_sets(draw: st.DrawFn) -> packing.Steps:
    """Random steps on 2-5 nodes: COPYs (some of zero bytes), PROMOTEs and DROPs, in chains of 1-3 per partition,
    caps 1-4, 1-3 lanes per direction."""
    nn = draw(st.integers(2, 5))
    cap = draw(st.integers(1, 4))
    parts = draw(st.integers(1, 8))
    node, other, moving, length, nxt = [], [], [], [], []
    for _ in range(parts):
        chain = draw(st.integers(1, 3))
        for k in range(chain):
            kind = draw(st.sampled_from([A_COPY, A_COPY, A_PROMOTE, A_DROP]))
            u = draw(st.integers(0, nn - 1))
            w = u if kind == A_DROP else draw(st.integers(0, nn - 1).filter(lambda x, u=u: x != u))
            carries = kind == A_COPY and draw(st.booleans())
            node.append(u)
            other.append(w)
            moving.append(carries)
            length.append(OVERHEAD + (draw(st.integers(1, 30)) / 10 if carries else 0.0))
            nxt.append(len(node) if k < chain - 1 else -1)
    lanes = np.array([draw(st.integers(1, 3)) for _ in range(2 * nn)], dtype=np.int64)
    return packing.Steps(node=np.array(node), other=np.array(other), moving=np.array(moving),
                         length=np.array(length), nxt=np.array(nxt), lanes=lanes, nn=nn, cap=cap, overhead=OVERHEAD)


def holds(steps: packing.Steps, start: np.ndarray, backward: bool) -> list[tuple[int, float, float, int]]:
    """Every (resource, from, to, limit) a placed step holds: its nodes' slots (0..nn-1), its target's inbound lanes
    (nn + node) and its source's outbound lanes (2 nn + node)."""
    nn, out = steps.nn, []
    for i, t in enumerate(start.tolist()):
        d = float(steps.length[i])
        for v in {int(steps.node[i]), int(steps.other[i])}:
            out.append((v, t, t + d, steps.cap))
        if steps.moving[i]:
            lo, hi = (t, t + d - steps.overhead) if backward else (t + steps.overhead, t + d)
            out.append((nn + int(steps.node[i]), lo, hi, int(steps.lanes[steps.node[i]])))
            out.append((2 * nn + int(steps.other[i]), lo, hi, int(steps.lanes[nn + steps.other[i]])))
    return out


def most_at_once(held: list[tuple[int, float, float, int]], resource: int) -> int:
    """The most holds of ``resource`` that overlap at an instant (at the start of one of them)."""
    spans = [(a, b) for r, a, b, _ in held if r == resource and b - a > EPS]
    return max((sum(1 for a2, b2 in spans if a2 <= a + EPS < b2 - EPS) for a, _ in spans), default=0)


def before(steps: packing.Steps, backward: bool) -> dict[int, int]:
    """The step each step must follow: its partition's previous one (forwards) or next one (backwards)."""
    out = {}
    for i, j in enumerate(steps.nxt.tolist()):
        if j >= 0:
            if backward:
                out[i] = j
            else:
                out[j] = i
    return out


@given(step_sets(), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_step_is_placed_legally_and_as_early_as_the_steps_before_it_allow(
    steps: packing.Steps, backward: bool, held_back: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    key = rng.permutation(len(steps.length)).astype(np.float64)
    # forwards, some steps may be held back to an instant (the exact pass's hint: a step never before its grid start)
    not_before = rng.integers(0, 30, len(key)) / 10 * (rng.random(len(key)) < 0.5) if held_back else None
    start = packing.serial_schedule(steps, key, backward=backward, not_before=None if backward else not_before)
    held = holds(steps, start, backward)
    for resource in range(3 * steps.nn):
        limits = {m for r, _, _, m in held if r == resource}
        if limits:
            assert most_at_once(held, resource) <= min(limits), resource
    after = before(steps, backward)
    for j, i in after.items():
        assert start[j] >= start[i] + steps.length[i] - EPS, (i, j)
    floor = np.zeros(len(key)) if backward or not_before is None else not_before
    assert (start >= floor - EPS).all()
    # No step fits earlier among the steps placed before it: every instant from its predecessor's end (0 for the
    # first) to its start where it could start (that one, or where a hold of an earlier step ends, less the offset
    # of the step's own hold of that resource) breaks a limit.
    order = placement_order(steps, key, after)
    for k, i in enumerate(order):
        others = holds(subset(steps, order[:k]), start[order[:k]], backward)
        ready = max(start[after[i]] + steps.length[after[i]] if i in after else 0.0, float(floor[i]))
        mine = holds(subset(steps, [i]), np.zeros(1), backward)  # offsets of i's holds from its start
        instants = {ready} | {b - a0 for _, _, b, _ in others for _, a0, _, _ in mine}
        for t in sorted(x for x in instants if ready - EPS <= x < start[i] - 1e-7):
            shifted = [(r, a + t, b + t, m) for r, a, b, m in mine]
            assert any(breaks(others, h) for h in shifted), (i, t, start[i])


def subset(steps: packing.Steps, rows: list[int]) -> packing.Steps:
    """The steps ``rows`` alone (no order between them)."""
    return packing.Steps(node=steps.node[rows], other=steps.other[rows], moving=steps.moving[rows],
                         length=steps.length[rows], nxt=np.full(len(rows), -1), lanes=steps.lanes, nn=steps.nn,
                         cap=steps.cap, overhead=steps.overhead)


def breaks(held: list[tuple[int, float, float, int]], hold: tuple[int, float, float, int]) -> bool:
    """``hold`` added to ``held`` puts more than its limit on its resource at some instant."""
    resource, lo, hi, most = hold
    if hi - lo <= EPS:
        return False
    spans = [(a, b) for r, a, b, _ in held if r == resource and b - a > EPS and a < hi - EPS and b > lo + EPS]
    return any(1 + sum(1 for a2, b2 in spans if a2 <= x + EPS < b2 - EPS) > most
               for x in [lo] + [a for a, _ in spans if a > lo])


def placement_order(steps: packing.Steps, key: np.ndarray, after: dict[int, int]) -> list[int]:
    """The order the steps are placed in: the smallest (key, row) among those whose predecessor is placed."""
    following = {i: j for j, i in after.items()}
    eligible = sorted((key[i], i) for i in range(len(key)) if i not in after)
    order = []
    while eligible:
        _, i = eligible.pop(0)
        order.append(i)
        if i in following:
            eligible = sorted([*eligible, (key[following[i]], following[i])])
    return order


@given(step_sets(), st.integers(0, 2**31 - 1), st.integers(0, 4))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_forward_backward_rounds_never_lengthen_the_schedule_and_stay_legal(
    steps: packing.Steps, seed: int, rounds: int
) -> None:
    key = np.random.default_rng(seed).permutation(len(steps.length)).astype(np.float64)
    first = packing.serial_schedule(steps, key)
    start, span = packing.forward_backward(steps, key, rounds)
    assert span <= float((first + steps.length).max()) + EPS
    assert span == float((start + steps.length).max())
    held = holds(steps, start, backward=False)
    for resource in range(3 * steps.nn):
        limits = {m for r, _, _, m in held if r == resource}
        if limits:
            assert most_at_once(held, resource) <= min(limits)
    for j, i in before(steps, backward=False).items():
        assert start[j] >= start[i] + steps.length[i] - EPS
    again, _ = packing.forward_backward(steps, key, rounds)
    assert np.array_equal(start, again)
