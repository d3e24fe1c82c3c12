"""balanced-v2: golden vectors, evenness and movement properties (from scratch and continuing), constraints,
determinism (no Spark).

Property tests run under the suite's hypothesis profile: ``ci`` (25 examples per test, the default) or
``HYPOTHESIS_PROFILE=soak`` (1,000 per test, thousands in all), e.g.
``HYPOTHESIS_PROFILE=soak .venv/bin/python -m pytest -p no:cacheprovider tests/test_affinity_balanced.py``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import mmh3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.affinity.balanced import (
    BalancedPlacement,
    InvalidBalancedGroupError,
    PreviousPlacement,
    assign_balanced,
    collocation_key,
    group_seed,
    place_balanced,
    salted_keys,
)
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.affinity.rendezvous import assign_rendezvous
from rebalancer.groups import GroupSettings


# ---- helpers ---------------------------------------------------------------------------------------------------
def loads(placement: BalancedPlacement, groups: Sequence[GroupSettings], n: int) -> tuple[np.ndarray, np.ndarray]:
    """PARTITIONED replicas and primaries (all groups) per node index."""
    replicas = np.zeros(n, dtype=np.int64)
    primaries = np.zeros(n, dtype=np.int64)
    for g in groups:
        m = placement.matrices[g.name]
        if m.shape[1] == 0:
            continue
        primaries += np.bincount(m[:, 0], minlength=n)
        if not g.replicated:
            replicas += np.bincount(m[m >= 0], minlength=n)
    return replicas, primaries


def by_id(matrix: np.ndarray, nodes: NodeSet) -> list[list[str]]:
    return [[nodes.node_ids[i] for i in row if i >= 0] for row in matrix.tolist()]


def rendezvous_rows(group: GroupSettings, nodes: NodeSet, spread: bool) -> np.ndarray:
    """The plain (uncapped) rendezvous lists of a group, with the same hash inputs as balanced."""
    keys = salted_keys(group.name, group.partitions) if spread else np.arange(group.partitions)
    return assign_rendezvous(keys, nodes, group.backups, group.replicated, group.exclude_neighbors,
                             group.backup_filter)


def moved_copies(before: list[list[str]], after: list[list[str]]) -> tuple[int, list[int]]:
    """Copies created by the change (per partition: nodes in ``after`` not in ``before``), and the partitions."""
    total, rows = 0, []
    for p, (b, a) in enumerate(zip(before, after, strict=True)):
        new = len(set(a) - set(b))
        total += new
        if new:
            rows.append(p)
    return total, rows


# ---- strategies ------------------------------------------------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 12) -> NodeSet:
    n = draw(st.integers(min_nodes, max_nodes))
    ids = [f"node{i}" for i in draw(st.permutations(range(max_nodes + 4)))[:n]]
    hosts = [draw(st.sampled_from(["h0", "h1", "h2", "h3", "h4", None])) for _ in range(n)]
    zones = [{"zone": draw(st.sampled_from(["z0", "z1", "z2"]))} for _ in range(n)]
    kind = draw(st.sampled_from(["uniform", "weighted", "with-zero"]))
    if kind == "uniform":
        caps = [1.0] * n
    else:
        caps = [draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in range(n)]
        if kind == "with-zero" and n > 1:
            caps[draw(st.integers(0, n - 1))] = 0.0
    return NodeSet.of(ids, hosts=hosts, attributes=zones, capacities=caps)


@st.composite
def group_lists(draw: st.DrawFn) -> list[GroupSettings]:
    count = draw(st.integers(1, 4))
    groups = []
    for i in range(count):
        mode = draw(st.sampled_from(["PARTITIONED"] * 5 + ["REPLICATED"]))
        groups.append(
            GroupSettings(
                name=f"group{i}",
                partitions=draw(st.integers(1, 48)),
                backups=draw(st.integers(0, 3)),
                mode=mode,
                exclude_neighbors=draw(st.booleans()),
                backup_filter=("zone",) if draw(st.booleans()) else (),
            )
        )
    return groups


# ---- scalar reference: docs/AFFINITY.md "balanced-v2", step by step, one partition at a time -----------------
Lists = dict[str, list[list[str]]]


def reference_place(groups: Sequence[GroupSettings], nodes: NodeSet, spread: bool,
                    previous: Lists | None = None) -> Lists:
    """The documented algorithm transcribed literally (plain Python floats, dicts and sorts; no NumPy kernels);
    ``previous``: per group, the node ids of each partition's previous list (step 9)."""
    out: dict[str, list[list[str]]] = {}
    ordered = sorted(groups, key=lambda g: g.name)
    if spread:
        units = [(ordered, ordered)]
    else:
        classes: dict[tuple[object, ...], list[GroupSettings]] = {}
        for g in ordered:
            classes.setdefault(collocation_key(g), []).append(g)
        units = [([m[0]], m) for m in classes.values()]
    for unit, receivers in units:
        before = None
        if previous is not None:
            before = {}
            for g in unit:
                source = next((m.name for m in [g, *receivers] if m.name in previous), None)
                before[g.name] = previous[source] if source is not None else []
        placed = reference_unit(unit, nodes, spread, before)
        for g in receivers:
            out[g.name] = placed[g.name if spread else unit[0].name]
    return out


def reference_unit(unit: list[GroupSettings], nodes: NodeSet, spread: bool, before: Lists | None) -> Lists:
    """One unit of :func:`reference_place` (its groups share caps; lists by group name)."""
    order = sorted(range(len(nodes)), key=lambda i: nodes.node_ids[i])
    n = len(order)
    ids = [nodes.node_ids[i] for i in order]
    caps = [nodes.capacities[i] for i in order]
    hosts = [nodes.hosts[i] for i in order]
    uniform = all(c == 1.0 for c in caps)
    seeds = [mmh3.hash(i.encode("utf-8"), 0, signed=False) for i in ids]
    rows = [(g, p) for g in unit for p in range(g.partitions)]
    rank, key = [], []
    for g, p in rows:
        h = mmh3.hash(p.to_bytes(4, "little"), group_seed(g.name), signed=False) if spread else p
        w = [mmh3.hash(h.to_bytes(4, "little"), s, signed=False) for s in seeds]
        k = [0xFFFFFFFF - x if uniform else c / math.log((x + 0.5) * 2.0**-32) for x, c in zip(w, caps, strict=True)]
        rank.append(sorted(range(n), key=lambda j, k=k: (k[j], j)))
        key.append(k)

    def fclasses(g: GroupSettings) -> list[tuple[str | None, ...]] | None:
        return [nodes.attribute_tuple(i, g.backup_filter) for i in order] if g.backup_filter else None

    share, pshare = [0.0] * n, [0.0] * n
    total_cap = 0.0
    for c in caps:
        total_cap += c
    for g in unit:
        if not g.replicated:
            fc = fclasses(g)
            labels = fc if fc is not None else list(range(n))
            cls_order = list(dict.fromkeys(labels))
            weight = {lab: 0.0 for lab in cls_order}
            for j in range(n):
                weight[labels[j]] += caps[j]
            k_cls = len(cls_order)
            t = float(g.partitions * min(g.backups + 1, n, k_cls))
            lim = float(g.partitions)
            by = sorted(range(k_cls), key=lambda i: (-weight[cls_order[i]], i))
            wts = [weight[cls_order[i]] for i in by]
            alloc = {}
            for i in range(k_cls):
                rest = 0.0
                for x in reversed(wts[i:]):
                    rest += x
                remaining = t - i * lim
                if rest == 0.0 or remaining * wts[i] <= lim * rest:
                    for pos in range(i, k_cls):
                        alloc[cls_order[by[pos]]] = (remaining / (k_cls - i) if rest == 0.0
                                                     else remaining * wts[pos] / rest)
                    break
                alloc[cls_order[by[i]]] = lim
            size = {lab: labels.count(lab) for lab in cls_order}
            for j in range(n):
                lab = labels[j]
                share[j] += alloc[lab] * caps[j] / weight[lab] if weight[lab] > 0.0 else alloc[lab] / size[lab]
        for j in range(n):
            pshare[j] += g.partitions * caps[j] / total_cap if total_cap > 0.0 else g.partitions / n
    cap = [max(math.ceil(x), math.floor(x * (1 + 0.05))) for x in share]
    pcap = [max(math.ceil(x), math.floor(x * (1 + 0.10))) for x in pshare]
    load, pload = [0] * n, [0] * n
    lists: list[list[int]] = [[] for _ in rows]
    prim: list[int | None] = [None] * len(rows)

    def walk(members: list[int], goal: Callable[[int], int], ok: Callable[[int, int], bool],
             spare: Callable[[int], int], take: Callable[[int, int], None]) -> None:
        for level in range(n):
            active = [r for r in members if goal(r) > 0]
            if not active:
                return
            room = [spare(c) for c in range(n)]
            bids: dict[int, list[tuple[float, int]]] = {}
            for r in active:
                c = rank[r][level]
                if ok(r, c):
                    bids.setdefault(c, []).append((key[r][c], r))
            for c, b in bids.items():
                for _, r in sorted(b)[: max(room[c], 0)]:
                    take(r, c)

    part = [r for r, (g, _) in enumerate(rows) if not g.replicated]
    repl = [r for r, (g, _) in enumerate(rows) if g.replicated]

    def need(r: int) -> int:
        g = rows[r][0]
        fc = fclasses(g)
        return min(g.backups + 1, n, len(set(fc)) if fc is not None else n)

    def passes_rules(r: int, c: int, others: list[int]) -> bool:
        """Pass A's rules for column c against the row's ``others``."""
        g = rows[r][0]
        if g.exclude_neighbors and hosts[c] in [hosts[x] for x in others]:
            return False
        fc = fclasses(g)
        return fc is None or fc[c] not in [fc[x] for x in others]

    def pull() -> None:  # steps 9b and 9d
        pload = [0] * n
        for r in part:
            if lists[r]:
                pload[lists[r][0]] += 1
        for r in repl:
            if prim[r] is not None:
                pload[prim[r]] += 1  # type: ignore[index]
        for b in [c for c in range(n) if load[c] < share[c] * 0.5]:
            for bound in (cap, [math.floor(x) for x in share]):
                if load[b] >= math.floor(share[b]):
                    break
                for r in sorted((r for r in part if lists[r] and b not in lists[r]), key=lambda r: (key[r][b], r)):
                    if load[b] >= math.floor(share[b]):
                        break
                    best = None
                    for j, c in enumerate(lists[r]):
                        if load[c] > bound[c] and (j > 0 or pload[b] < pcap[b]) and passes_rules(
                                r, b, lists[r][:j] + lists[r][j + 1:]) and (
                                best is None or load[c] - share[c] >= load[lists[r][best]] - share[lists[r][best]]):
                            best = j
                    if best is not None:
                        if best == 0:
                            pload[lists[r][0]] -= 1
                            pload[b] += 1
                        load[lists[r][best]] -= 1
                        lists[r][best] = b
                        load[b] += 1

    if before is not None:
        col = {ids[j]: j for j in range(n)}
        # 9a keep
        for r, (g, p) in enumerate(rows):
            old = before[g.name][p] if p < len(before[g.name]) else []
            old_cols = [col[x] for x in old if x in col]
            if g.replicated:
                if old_cols:
                    prim[r] = old_cols[0]
                continue
            fc = fclasses(g)
            for c in old_cols:
                if len(lists[r]) < need(r) and c not in lists[r] and (
                        fc is None or fc[c] not in [fc[x] for x in lists[r]]):
                    lists[r].append(c)
                    load[c] += 1
        pull()  # 9b
        for c in [c for c in range(n) if load[c] > cap[c]]:  # 9c shed
            pairs = sorted(((j == 0, -key[r][c], r, j) for r in part for j, x in enumerate(lists[r]) if x == c))
            for _, _, r, j in pairs[: load[c] - cap[c]]:
                del lists[r][j]
                load[c] -= 1
        for r in part:
            if lists[r]:
                prim[r] = lists[r][0]
        for r in part + repl:
            if prim[r] is not None:
                pload[prim[r]] += 1

    def give_primary(r: int, c: int, counts_replica: bool) -> None:
        prim[r] = c
        pload[c] += 1
        if counts_replica:
            lists[r].append(c)
            load[c] += 1

    for members, both in ((part, True), (repl, False)):
        t = 0
        while any(prim[r] is None for r in members):
            walk(members, lambda r: int(prim[r] is None), lambda r, c: True,
                 lambda c, t=t, both=both: min(pcap[c] + t - pload[c], cap[c] + t - load[c]) if both
                 else pcap[c] + t - pload[c],
                 lambda r, c, both=both: give_primary(r, c, both))
            t += 1

    def admissible(r: int, c: int, use_hosts: bool) -> bool:
        g = rows[r][0]
        if c in lists[r]:
            return False
        if use_hosts and g.exclude_neighbors and hosts[c] in [hosts[x] for x in lists[r]]:
            return False
        fc = fclasses(g)
        return fc is None or fc[c] not in [fc[x] for x in lists[r]]

    def add(r: int, c: int) -> None:
        lists[r].append(c)
        load[c] += 1

    def goal_a(r: int) -> int:
        g = rows[r][0]
        want = min(need(r), len(set(hosts))) if g.exclude_neighbors else need(r)
        return want - len(lists[r])

    walk(part, goal_a, lambda r, c: admissible(r, c, True), lambda c: cap[c] - load[c], add)
    fill = [r for r in part if rows[r][0].exclude_neighbors]
    walk(fill, lambda r: need(r) - len(lists[r]), lambda r, c: admissible(r, c, False),
         lambda c: cap[c] - load[c], add)
    for p_ in [r for r in part if len(lists[r]) < need(r)]:
        for c in rank[p_]:
            if len(lists[p_]) >= need(p_):
                break
            if load[c] < cap[c] or not admissible(p_, c, False):
                continue
            moved = False
            for q in part:
                if q == p_ or c not in lists[q][1:]:
                    continue
                for d in rank[q]:
                    if load[d] >= cap[d] or d in lists[q]:
                        continue
                    others = [x for x in lists[q] if x != c]
                    g = rows[q][0]
                    if g.exclude_neighbors and hosts[d] in [hosts[x] for x in others]:
                        continue
                    fc = fclasses(g)
                    if fc is not None and fc[d] in [fc[x] for x in others]:
                        continue
                    lists[q][lists[q].index(c)] = d
                    load[d] += 1
                    lists[p_].append(c)
                    moved = True
                    break
                if moved:
                    break
    t = 1
    while any(len(lists[r]) < need(r) for r in part):
        short = [r for r in part if len(lists[r]) < need(r)]
        walk(short, lambda r: need(r) - len(lists[r]), lambda r, c: admissible(r, c, False),
             lambda c, t=t: cap[c] + t - load[c], add)
        t += 1
    pull()  # 9d
    # 9e primaries: hand over above pcap, take below half the share (counted again: a pull may replace a primary)
    for r in part:
        prim[r] = lists[r][0]
    pload = [0] * n
    for r in part + repl:
        pload[prim[r]] += 1  # type: ignore[index]

    def others(r: int) -> list[int]:
        return [c for c in rank[r] if c != prim[r]] if rows[r][0].replicated else lists[r][1:]

    def swap(r: int, d: int) -> None:
        old = prim[r]
        assert old is not None
        if not rows[r][0].replicated:
            j = lists[r].index(d)
            lists[r][0], lists[r][j] = d, old
        prim[r] = d
        pload[old] -= 1
        pload[d] += 1

    for c in [c for c in range(n) if pload[c] > pcap[c]]:
        for r in sorted((r for r in part + repl if prim[r] == c), key=lambda r: (-key[r][c], r)):
            if pload[c] <= pcap[c]:
                break
            to = next((d for d in others(r) if pload[d] < pcap[d]), None)
            if to is not None:
                swap(r, to)
    for b in [c for c in range(n) if pload[c] < pshare[c] * 0.5]:
        for r in sorted((r for r in part + repl if prim[r] != b and b in others(r)), key=lambda r: (key[r][b], r)):
            if pload[b] >= math.floor(pshare[b]):
                break
            p = prim[r]
            assert p is not None
            if pload[p] > math.floor(pshare[p]):
                swap(r, b)
    out: dict[str, list[list[str]]] = {}
    for g in unit:
        first = rows.index((g, 0)) if g.partitions else 0
        lists_of = ([prim[r]] + [c for c in rank[r] if c != prim[r]] if g.replicated else lists[r]
                    for r in range(first, first + g.partitions))
        out[g.name] = [[ids[c] for c in cols] for cols in lists_of]
    return out


@given(nodes=clusters(max_nodes=8), groups=group_lists(), spread=st.booleans())
def test_kernel_equals_the_documented_algorithm(nodes: NodeSet, groups: list[GroupSettings], spread: bool) -> None:
    expected = reference_place(groups, nodes, spread)
    matrices = assign_balanced(groups, nodes, spread=spread)
    for g in groups:
        assert by_id(matrices[g.name], nodes) == expected[g.name], g


# ---- golden vectors: other clients check themselves against these ---------------------------------------------
GOLDEN_NODES = NodeSet.of([f"node{i}" for i in range(5)])


def test_golden_hash_inputs() -> None:
    assert group_seed("group0") == 1713770047 == mmh3.hash(b"group0", 0, signed=False)
    assert salted_keys("group0", 4).tolist() == [3220000057, 197717929, 3528017349, 1207828502]
    assert salted_keys("group0", 4).tolist() == [
        mmh3.hash(p.to_bytes(4, "little"), 1713770047, signed=False) for p in range(4)
    ]


def test_golden_collocated_assignment() -> None:
    g = GroupSettings("group0", 12, 1)
    placement = place_balanced([g], GOLDEN_NODES, spread=False)
    assert by_id(placement.matrices["group0"], GOLDEN_NODES) == GOLDEN_COLLOCATED
    assert placement.replica_cap.tolist() == [5, 5, 5, 5, 5]
    assert placement.primary_cap.tolist() == [3, 3, 3, 3, 3]


def test_golden_spread_assignment() -> None:
    groups = [GroupSettings("group0", 6, 1), GroupSettings("group1", 6, 1)]
    matrices = assign_balanced(groups, GOLDEN_NODES, spread=True)
    assert by_id(matrices["group0"], GOLDEN_NODES) == GOLDEN_SPREAD_0
    assert by_id(matrices["group1"], GOLDEN_NODES) == GOLDEN_SPREAD_1


def test_golden_continued_assignments() -> None:
    g = GroupSettings("group0", 12, 1)
    previous = PreviousPlacement.from_lists({"group0": GOLDEN_COLLOCATED})
    failed = NodeSet.of(["node0", "node1", "node3", "node4"])
    after = place_balanced([g], failed, spread=False, previous=previous)
    assert by_id(after.matrices["group0"], failed) == GOLDEN_AFTER_FAILURE
    assert (after.pulled, after.shed) == (0, 0)
    joined = NodeSet.of([f"node{i}" for i in range(6)])
    after = place_balanced([g], joined, spread=False, previous=previous)
    assert by_id(after.matrices["group0"], joined) == GOLDEN_AFTER_JOIN
    assert (after.pulled, after.shed) == (4, 0)


def test_golden_weighted_assignment() -> None:
    nodes = NodeSet.of(["a", "b", "c", "d"], capacities=[1.0, 2.0, 1.0, 0.5])
    placement = place_balanced([GroupSettings("g", 9, 1)], nodes, spread=False)
    assert by_id(placement.matrices["g"], nodes) == GOLDEN_WEIGHTED
    assert placement.replica_cap.tolist() == [4, 8, 4, 2]


# ---- structure: balanced is rendezvous wherever no cap turned a partition away ---------------------------------
@given(nodes=clusters(), groups=group_lists(), spread=st.booleans())
def test_partitions_never_turned_away_get_their_rendezvous_list(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool
) -> None:
    placement = place_balanced(groups, nodes, spread=spread)
    for g in groups:
        plain = rendezvous_rows(g, nodes, spread)
        mine = placement.matrices[g.name]
        assert mine.shape == plain.shape
        calm = ~placement.turned_away[g.name]
        assert np.array_equal(mine[calm], plain[calm]), g


# ---- evenness --------------------------------------------------------------------------------------------------
@given(nodes=clusters(), groups=group_lists(), spread=st.booleans())
def test_no_node_above_its_cap_unless_overflow(nodes: NodeSet, groups: list[GroupSettings], spread: bool) -> None:
    placement = place_balanced(groups, nodes, spread=spread)
    replicas, primaries = loads(placement, groups, len(nodes))
    if placement.overflow == 0:
        assert (replicas <= placement.replica_cap).all(), (replicas, placement.replica_cap)
    else:
        assert replicas.sum() - np.minimum(replicas, placement.replica_cap).sum() <= placement.overflow
    if placement.primary_overflow == 0:
        assert (primaries <= placement.primary_cap).all(), (primaries, placement.primary_cap)
    # The cap formula, max(ceil(share), floor(share * (1 + slack))) per unit: spread has one unit; collocating sums
    # one cap per group, each at most share * (1 + slack) + 1.
    share, pshare = placement.replica_share, placement.primary_share
    if spread:
        assert (placement.replica_cap == np.maximum(np.ceil(share), np.floor(share * 1.05))).all()
        assert (placement.primary_cap == np.maximum(np.ceil(pshare), np.floor(pshare * 1.10))).all()
    else:
        assert (placement.replica_cap <= share * 1.05 + len(groups)).all()
        assert (placement.primary_cap <= pshare * 1.10 + len(groups)).all()


@given(nodes=clusters(min_nodes=2, max_nodes=16), partitions=st.integers(1, 200), backups=st.integers(0, 3))
def test_single_group_without_rules_never_overflows_when_caps_allow(
    nodes: NodeSet, partitions: int, backups: int
) -> None:
    """The proved case (docs/AFFINITY.md): no rules and the caps without the r - 1 largest still hold T."""
    g = GroupSettings("g", partitions, backups)
    placement = place_balanced([g], nodes, spread=False)
    r = min(backups + 1, len(nodes))
    caps = np.sort(placement.replica_cap)
    if caps[: len(caps) - (r - 1)].sum() >= partitions * r:
        assert placement.overflow == 0
        replicas, _ = loads(placement, [g], len(nodes))
        assert (replicas <= placement.replica_cap).all()
    if np.minimum(placement.primary_cap, placement.replica_cap).sum() >= partitions:
        assert placement.primary_overflow == 0


def test_evenness_targets_on_a_large_cluster() -> None:
    """40 nodes, 16 groups x 256 partitions, 2 backups, spread: replicas within 5 %, primaries within 10 %."""
    nodes = NodeSet.of([f"node{i}" for i in range(40)])
    groups = [GroupSettings(f"group{i}", 256, 2) for i in range(16)]
    placement = place_balanced(groups, nodes, spread=True)
    replicas, primaries = loads(placement, groups, 40)
    assert replicas.max() / replicas.mean() <= 1.05
    assert primaries.max() / primaries.mean() <= 1.10
    assert replicas.min() > 0
    assert placement.overflow == placement.primary_overflow == 0


# ---- movement --------------------------------------------------------------------------------------------------
def _change(nodes: NodeSet, rng: random.Random, join: bool) -> tuple[NodeSet, str]:
    ids = list(nodes.node_ids)
    if join:
        new = f"joiner{rng.randrange(1000)}"
        return NodeSet.of(ids + [new], hosts=list(nodes.hosts) + [f"h{rng.randrange(5)}"],
                          attributes=list(nodes.attributes or [None] * len(ids)) + [{"zone": "z1"}],
                          capacities=list(nodes.capacities) + [1.0]), new
    gone = rng.randrange(len(ids))
    keep = [i for i in range(len(ids)) if i != gone]
    return NodeSet.of([ids[i] for i in keep], hosts=[nodes.hosts[i] for i in keep],
                      attributes=[(nodes.attributes or [None] * len(ids))[i] for i in keep],
                      capacities=[nodes.capacities[i] for i in keep]), ids[gone]


@given(nodes=clusters(min_nodes=2), groups=group_lists(), spread=st.booleans(), join=st.booleans(),
       seed=st.integers(0, 2**16))
def test_copies_move_between_staying_nodes_only_in_partitions_turned_away(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, join: bool, seed: int
) -> None:
    """After one failure or join, a partition never turned away (before nor after) moves exactly the copies
    rendezvous moves: with no neighbour/filter rules only the failed node's copy, or copies to the joiner."""
    after_nodes, changed = _change(nodes, random.Random(seed), join)
    before = place_balanced(groups, nodes, spread=spread)
    after = place_balanced(groups, after_nodes, spread=spread)
    for g in groups:
        old = by_id(before.matrices[g.name], nodes)
        new = by_id(after.matrices[g.name], after_nodes)
        plain_old = by_id(rendezvous_rows(g, nodes, spread), nodes)
        plain_new = by_id(rendezvous_rows(g, after_nodes, spread), after_nodes)
        for p in range(g.partitions):
            if before.turned_away[g.name][p] or after.turned_away[g.name][p]:
                continue
            created = set(new[p]) - set(old[p])
            assert created == set(plain_new[p]) - set(plain_old[p])
            if not g.exclude_neighbors and not g.backup_filter:
                # unconstrained: the joiner's copy, or one copy replacing the failed node's (if lists keep their length)
                replaced = changed in old[p] and len(new[p]) == len(old[p])
                assert created <= {changed} if join else len(created) == int(replaced)


def test_movement_bounds_on_a_large_cluster() -> None:
    """40 nodes, 16 x 256, 2 backups, spread: a failure moves <= 5 % more copies than the failed node held,
    a join <= 10 % more than the joiner's fair share."""
    ids = [f"node{i}" for i in range(40)]
    groups = [GroupSettings(f"group{i}", 256, 2) for i in range(16)]
    full = place_balanced(groups, NodeSet.of(ids), spread=True)
    failed = NodeSet.of([i for i in ids if i != "node20"])
    after = place_balanced(groups, failed, spread=True)
    held = sum(int((full.matrices[g.name] == 20).sum()) for g in groups)
    moved = sum(moved_copies(by_id(full.matrices[g.name], NodeSet.of(ids)),
                             by_id(after.matrices[g.name], failed))[0] for g in groups)
    assert moved <= 1.05 * held, (moved, held)
    joined = NodeSet.of(ids + ["node40"])
    grown = place_balanced(groups, joined, spread=True)
    fair = 16 * 256 * 3 / 41
    moved = sum(moved_copies(by_id(full.matrices[g.name], NodeSet.of(ids)),
                             by_id(grown.matrices[g.name], joined))[0] for g in groups)
    assert moved <= 1.10 * fair, (moved, fair)


# ---- determinism and collocation -------------------------------------------------------------------------------
@given(nodes=clusters(), groups=group_lists(), spread=st.booleans(), seed=st.integers(0, 2**16))
def test_independent_of_node_and_group_order(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, seed: int
) -> None:
    rng = random.Random(seed)
    order = list(range(len(nodes)))
    rng.shuffle(order)
    shuffled = NodeSet.of([nodes.node_ids[i] for i in order], hosts=[nodes.hosts[i] for i in order],
                          attributes=[(nodes.attributes or [None] * len(nodes))[i] for i in order],
                          capacities=[nodes.capacities[i] for i in order])
    regrouped = list(groups)
    rng.shuffle(regrouped)
    a = assign_balanced(groups, nodes, spread=spread)
    b = assign_balanced(regrouped, shuffled, spread=spread)
    for g in groups:
        assert by_id(a[g.name], nodes) == by_id(b[g.name], shuffled)


@given(nodes=clusters(), partitions=st.integers(1, 64), backups=st.integers(0, 2))
def test_collocate_gives_equal_groups_one_placement(nodes: NodeSet, partitions: int, backups: int) -> None:
    groups = [GroupSettings(name, partitions, backups) for name in ("orders", "payments", "users")]
    other = GroupSettings("other", partitions + 1, backups)
    matrices = assign_balanced(groups + [other], nodes, spread=False)
    assert np.array_equal(matrices["orders"], matrices["payments"])
    assert np.array_equal(matrices["orders"], matrices["users"])


def test_spread_places_equal_groups_independently() -> None:
    nodes = NodeSet.of([f"node{i}" for i in range(10)])
    groups = [GroupSettings(f"group{i}", 64, 1) for i in range(2)]
    matrices = assign_balanced(groups, nodes, spread=True)
    assert not np.array_equal(matrices["group0"], matrices["group1"])


# ---- constraints -----------------------------------------------------------------------------------------------
@given(nodes=clusters(), groups=group_lists(), spread=st.booleans())
def test_backup_filter_is_hard_and_lists_are_as_long_as_rendezvous(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool
) -> None:
    placement = place_balanced(groups, nodes, spread=spread)
    for g in groups:
        mine = placement.matrices[g.name]
        plain = rendezvous_rows(g, nodes, spread)
        assert ((mine >= 0).sum(axis=1) == (plain >= 0).sum(axis=1)).all()
        for row in mine.tolist():
            real = [i for i in row if i >= 0]
            assert len(set(real)) == len(real)
            if g.backup_filter and not g.replicated:
                tuples = [nodes.attribute_tuple(i, g.backup_filter) for i in real]
                assert len(set(tuples)) == len(tuples)


@given(nodes=clusters(min_nodes=2), partitions=st.integers(1, 48), backups=st.integers(1, 3))
def test_neighbours_share_a_partition_only_when_every_other_host_is_full(
    nodes: NodeSet, partitions: int, backups: int
) -> None:
    g = GroupSettings("g", partitions, backups, exclude_neighbors=True)
    placement = place_balanced([g], nodes, spread=False)
    replicas, _ = loads(placement, [g], len(nodes))
    for row in placement.matrices["g"].tolist():
        hosts = [nodes.hosts[i] for i in row]
        if len(set(hosts)) == len(hosts):
            continue
        free = [i for i in range(len(nodes)) if nodes.hosts[i] not in hosts]
        # full when the walk placed the row; a later pull (step 9d) frees one slot on the node it takes from
        assert all(replicas[i] >= placement.replica_cap[i] - placement.pulled for i in free), (row, free)


# ---- capacities, modes, edges ----------------------------------------------------------------------------------
def test_capacity_weighted_shares_and_water_filling() -> None:
    nodes = NodeSet.of(["big", "small1", "small2"], capacities=[10.0, 1.0, 1.0])
    placement = place_balanced([GroupSettings("g", 100, 1)], nodes, spread=False)
    # "big" cannot hold two replicas of one partition: it takes 100, the others share the other 100.
    assert placement.replica_share.tolist() == [100.0, 50.0, 50.0]
    assert placement.replica_cap.tolist() == [105, 52, 52]
    replicas, _ = loads(placement, [GroupSettings("g", 100, 1)], 3)
    assert (replicas <= placement.replica_cap).all() and replicas.sum() == 200


def test_filter_classes_are_water_filled() -> None:
    zones = ["a", "a", "a", "a", "b"]
    nodes = NodeSet.of([f"n{i}" for i in range(5)], attributes=[{"zone": z} for z in zones])
    g = GroupSettings("g", 40, 1, backup_filter=("zone",))
    placement = place_balanced([g], nodes, spread=False)
    # one replica per zone: the lone node of zone b holds every partition, the four of zone a 10 each
    assert placement.replica_share.tolist() == [10.0, 10.0, 10.0, 10.0, 40.0]
    replicas, _ = loads(placement, [g], 5)
    assert replicas.tolist() == [10, 10, 10, 10, 40]


def test_zero_capacity_node_holds_nothing_when_others_can() -> None:
    nodes = NodeSet.of([f"n{i}" for i in range(6)], capacities=[1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    g = GroupSettings("g", 50, 1)
    replicas, primaries = loads(place_balanced([g], nodes, spread=False), [g], 6)
    assert replicas[5] == 0 and primaries[5] == 0


@given(nodes=clusters(), partitions=st.integers(1, 40))
def test_replicated_lists_every_node_and_balances_primaries(nodes: NodeSet, partitions: int) -> None:
    g = GroupSettings("r", partitions, 0, mode="REPLICATED")
    placement = place_balanced([g], nodes, spread=False)
    m = placement.matrices["r"]
    assert m.shape == (partitions, len(nodes))
    assert (np.sort(m, axis=1) == np.arange(len(nodes))).all()
    if placement.primary_overflow == 0:
        assert (np.bincount(m[:, 0], minlength=len(nodes)) <= placement.primary_cap).all()


def test_edges() -> None:
    assert assign_balanced([GroupSettings("g", 3, 1)], NodeSet.of([]), spread=True)["g"].shape == (3, 0)
    assert assign_balanced([GroupSettings("g", 0, 1)], NodeSet.of(["a"]), spread=False)["g"].shape == (0, 1)
    assert assign_balanced([GroupSettings("g", 4, 2)], NodeSet.of(["a"]), spread=False)["g"].tolist() == [[0]] * 4
    with pytest.raises(InvalidBalancedGroupError, match="repeated: g"):
        assign_balanced([GroupSettings("g", 1, 0), GroupSettings("g", 2, 0)], NodeSet.of(["a"]), spread=True)
    with pytest.raises(InvalidBalancedGroupError, match="mode"):
        assign_balanced([GroupSettings("g", 1, 0, mode="SHARDED")], NodeSet.of(["a"]), spread=True)
    with pytest.raises(InvalidBalancedGroupError, match="backups"):
        assign_balanced([GroupSettings("g", 1, -1)], NodeSet.of(["a"]), spread=True)
    assert math.isclose(float(place_balanced([GroupSettings("g", 7, 1)], NodeSet.of(["a", "b", "c"]),
                                              spread=False).replica_share.sum()), 14.0)


# 5 nodes node0..node4, one group of 12 partitions, 1 backup, collocated: caps 5 replicas / 3 primaries per node;
# partitions 3 of 12 were turned away (their rendezvous lists differ); node0, with one primary of a share of 2.4,
# took the primary of partition 2 (step 9e).
GOLDEN_COLLOCATED = [
    ["node3", "node0"], ["node3", "node4"], ["node0", "node4"], ["node1", "node2"], ["node2", "node4"],
    ["node3", "node2"], ["node2", "node0"], ["node1", "node0"], ["node4", "node2"], ["node1", "node3"],
    ["node0", "node1"], ["node4", "node3"],
]
# The same nodes, groups group0 and group1 of 6 partitions, 1 backup, spread.
GOLDEN_SPREAD_0 = [
    ["node1", "node3"], ["node0", "node4"], ["node1", "node0"], ["node4", "node1"], ["node4", "node2"],
    ["node3", "node0"],
]
GOLDEN_SPREAD_1 = [
    ["node2", "node3"], ["node1", "node4"], ["node3", "node2"], ["node0", "node4"], ["node2", "node0"],
    ["node3", "node2"],
]
# GOLDEN_COLLOCATED continued (step 9) after node2 fails: node2's five copies are replaced, nothing else moves.
GOLDEN_AFTER_FAILURE = [
    ["node3", "node0"], ["node3", "node4"], ["node0", "node4"], ["node1", "node0"], ["node4", "node3"],
    ["node3", "node1"], ["node0", "node4"], ["node1", "node0"], ["node4", "node1"], ["node1", "node3"],
    ["node0", "node1"], ["node4", "node3"],
]
# GOLDEN_COLLOCATED continued after node5 joins: node5 holds nothing, so it pulls floor(24 / 6) = 4 replicas.
GOLDEN_AFTER_JOIN = [
    ["node5", "node0"], ["node3", "node5"], ["node0", "node4"], ["node1", "node2"], ["node2", "node4"],
    ["node3", "node2"], ["node2", "node5"], ["node1", "node0"], ["node4", "node5"], ["node1", "node3"],
    ["node0", "node1"], ["node4", "node3"],
]
# Capacities a 1.0, b 2.0, c 1.0, d 0.5; 9 partitions, 1 backup: shares 4 / 8 / 4 / 2.
GOLDEN_WEIGHTED = [
    ["b", "d"], ["b", "a"], ["b", "c"], ["a", "b"], ["c", "b"], ["b", "c"], ["d", "b"], ["c", "a"], ["a", "b"],
]


@given(nodes=clusters(min_nodes=2, max_nodes=8), groups=group_lists(), spread=st.booleans(), join=st.booleans(),
       seed=st.integers(0, 2**16))
def test_continuing_kernel_equals_the_documented_algorithm(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, join: bool, seed: int
) -> None:
    """Step 9 after one failure or join: the kernel continuing from the previous lists equals the reference."""
    rng = random.Random(seed)
    after_nodes, _ = _change(nodes, rng, join)
    before = {g.name: by_id(assign_balanced(groups, nodes, spread=spread)[g.name], nodes) for g in groups}
    expected = reference_place(groups, after_nodes, spread, previous=before)
    matrices = assign_balanced(groups, after_nodes, spread=spread, previous=PreviousPlacement.from_lists(before))
    for g in groups:
        assert by_id(matrices[g.name], after_nodes) == expected[g.name], g


@given(nodes=clusters(min_nodes=1, max_nodes=8), groups=group_lists(), spread=st.booleans(),
       seed=st.integers(0, 2**16))
def test_continuing_from_any_lists_equals_the_documented_algorithm(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, seed: int
) -> None:
    """Step 9 from arbitrary previous lists (unknown nodes, repeats, too long or short, missing groups, filter
    clashes, overloaded nodes): the kernel equals the reference."""
    rng = random.Random(seed)
    pool = list(nodes.node_ids) + ["gone1", "gone2"]
    previous = {g.name: [[rng.choice(pool) for _ in range(rng.randrange(0, 5))]
                         for _ in range(rng.randrange(0, g.partitions + 3))]
                for g in groups if rng.random() < 0.8}
    expected = reference_place(groups, nodes, spread, previous=previous)
    matrices = assign_balanced(groups, nodes, spread=spread, previous=PreviousPlacement.from_lists(previous))
    for g in groups:
        assert by_id(matrices[g.name], nodes) == expected[g.name], g


# ---- continuing (step 9): movement and evenness after a change ---------------------------------------------------
def _continue(groups: list[GroupSettings], nodes: NodeSet, after_nodes: NodeSet, spread: bool
              ) -> tuple[BalancedPlacement, BalancedPlacement, int, int]:
    """The placement before and the continued one after, the copies created (between the two) and the copies the
    change created outside the changed node (a copy created on a node that stays, for a partition it did not
    hold, while no replica of that partition left a departed node)."""
    before = place_balanced(groups, nodes, spread=spread)
    after = place_balanced(groups, after_nodes, spread=spread, previous=PreviousPlacement.of(before.matrices, nodes))
    created = unforced = 0
    departed = set(nodes.node_ids) - set(after_nodes.node_ids)
    joined = set(after_nodes.node_ids) - set(nodes.node_ids)
    for g in groups:
        if g.replicated:
            continue
        old, new = by_id(before.matrices[g.name], nodes), by_id(after.matrices[g.name], after_nodes)
        for a, b in zip(old, new, strict=True):
            fresh = set(b) - set(a)
            created += len(fresh)
            lost = len(set(a) & departed)
            unforced += max(0, len(fresh - joined) - lost)
    return before, after, created, unforced


@given(nodes=clusters(min_nodes=2), groups=group_lists(), spread=st.booleans(), seed=st.integers(0, 2**16))
def test_a_failure_moves_only_the_failed_nodes_copies(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, seed: int
) -> None:
    """Continuing after one failure: each partition gets back at most the copies it lost; a copy moves between two
    nodes that both stay only through a pull or a shed (nodes far below their share, or over their cap, which a
    failure causes only after an overflow or through rounding on tiny clusters) or a repair (step 7), counted in
    the placement."""
    after_nodes, _ = _change(nodes, random.Random(seed), join=False)
    before, after, _, unforced = _continue(groups, nodes, after_nodes, spread)
    assert unforced <= after.pulled + after.shed + after.repaired, (unforced, after.pulled, after.shed)
    if before.overflow == 0 and all(c == 1.0 for c in nodes.capacities) and not any(
            g.exclude_neighbors or g.backup_filter for g in groups):
        assert after.shed == 0


@given(nodes=clusters(min_nodes=1), groups=group_lists(), spread=st.booleans(), seed=st.integers(0, 2**16))
def test_a_join_moves_copies_to_the_joiner_and_sheds_only_over_caps(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, seed: int
) -> None:
    """Continuing after one join: the joiner pulls at most its share rounded down, plus what the walk places in
    empty slots (copies shed by nodes over their lowered caps, or partitions that can now have more replicas); a
    copy moves between two nodes that both stay only through a shed, a repair or a pull by a node that was
    already far below its share."""
    after_nodes, joiner = _change(nodes, random.Random(seed), join=True)
    before, after, _, unforced = _continue(groups, nodes, after_nodes, spread)
    assert unforced <= after.shed + after.repaired + after.pulled, (unforced, after.shed)
    j = after_nodes.node_ids.index(joiner)
    replicas, _ = loads(after, groups, len(after_nodes))
    old, _ = loads(before, groups, len(nodes))
    filled = int(replicas.sum() - old.sum()) + after.shed
    assert replicas[j] <= math.floor(after.replica_share[j]) + filled + after.overflow


@given(nodes=clusters(min_nodes=2), groups=group_lists(), spread=st.booleans(), join=st.booleans(),
       seed=st.integers(0, 2**16))
def test_continued_placements_keep_the_caps(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, join: bool, seed: int
) -> None:
    after_nodes, _ = _change(nodes, random.Random(seed), join)
    _, after, _, _ = _continue(groups, nodes, after_nodes, spread)
    replicas, primaries = loads(after, groups, len(after_nodes))
    assert replicas.sum() - np.minimum(replicas, after.replica_cap).sum() <= after.overflow
    if after.primary_overflow == 0:
        assert (primaries <= after.primary_cap).all(), (primaries, after.primary_cap)


def test_continued_movement_bounds_on_a_large_cluster() -> None:
    """40 nodes, 16 x 256, 2 backups, spread, continuing: a failure moves exactly the failed node's copies, a join
    the joiner's share rounded down, and both keep replicas within 1.05 and primaries within 1.10 of the mean."""
    ids = [f"node{i}" for i in range(40)]
    groups = [GroupSettings(f"group{i}", 256, 2) for i in range(16)]
    before, after, created, unforced = _continue(groups, NodeSet.of(ids), NodeSet.of(ids[:20] + ids[21:]), True)
    held = sum(int((m == 20).sum()) for m in before.matrices.values())
    assert (created, unforced) == (held, 0)
    replicas, primaries = loads(after, groups, 39)
    assert replicas.max() / replicas.mean() <= 1.05 and primaries.max() / primaries.mean() <= 1.10
    _, after, created, unforced = _continue(groups, NodeSet.of(ids), NodeSet.of(ids + ["node40"]), True)
    assert (created, unforced) == (math.floor(16 * 256 * 3 / 41), 0)
    replicas, primaries = loads(after, groups, 41)
    assert replicas.max() / replicas.mean() <= 1.05 and primaries.max() / primaries.mean() <= 1.10


@given(nodes=clusters(), groups=group_lists(), spread=st.booleans(), join=st.booleans(), seed=st.integers(0, 2**16))
def test_continuing_from_itself_changes_nothing(
    nodes: NodeSet, groups: list[GroupSettings], spread: bool, join: bool, seed: int
) -> None:
    """A placement is a fixpoint of step 9 (no overflow): an exchange that re-places balanced groups without a
    change (or recomputes settled partitions) gets the same lists."""
    after_nodes, _ = _change(nodes, random.Random(seed), join) if len(nodes) > 1 else (nodes, "")
    _, first, _, _ = _continue(groups, nodes, after_nodes, spread)
    again = place_balanced(groups, after_nodes, spread=spread,
                           previous=PreviousPlacement.of(first.matrices, after_nodes))
    if first.overflow == 0 and first.primary_overflow == 0:
        for g in groups:
            assert np.array_equal(again.matrices[g.name], first.matrices[g.name]), g
        assert (again.pulled, again.shed, again.repaired) == (0, 0, 0)
