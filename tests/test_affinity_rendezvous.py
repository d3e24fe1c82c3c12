"""rendezvous-mmh3-v1: golden values, the vectorised engine against a scalar walk, and rendezvous properties."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.affinity.nodeset import InvalidNodeSetError, NodeSet
from rebalancer.affinity.rendezvous import (
    ClassConstraint,
    assign_rendezvous,
    node_seed,
    node_seeds,
    rendezvous_weights,
    select_replicas,
    weight,
)
from rebalancer.hashing import murmur3_32_u32_block


# ---- scalar reference: the SPEC text, one partition at a time ------------------------------------------------
def reference_ranking(p: int, nodes: NodeSet) -> list[int]:
    ids = nodes.node_ids
    w = np.array([weight(i, p) for i in ids], dtype=np.float64)
    if nodes.uniform_capacity:
        return sorted(range(len(ids)), key=lambda i: (-w[i], ids[i]))
    score = np.array(nodes.capacities) / -np.log((w + 0.5) / 2**32)
    return sorted(range(len(ids)), key=lambda i: (-score[i], ids[i]))


def reference_assign(
    p: int, nodes: NodeSet, backups: int, replicated: bool, excl: bool, names: Sequence[str]
) -> list[int]:
    ranking = reference_ranking(p, nodes)
    if replicated or not ranking:
        return ranking
    want = min(backups + 1, len(ranking))

    def host_ok(c: int, chosen: list[int]) -> bool:
        return all(nodes.hosts[c] != nodes.hosts[a] for a in chosen)

    def filter_ok(c: int, chosen: list[int]) -> bool:
        return all(nodes.attribute_tuple(c, names) != nodes.attribute_tuple(a, names) for a in chosen)

    chosen = [ranking[0]]
    for c in ranking[1:]:
        if len(chosen) < want and (not excl or host_ok(c, chosen)) and (not names or filter_ok(c, chosen)):
            chosen.append(c)
    if excl:
        for c in ranking[1:]:
            if len(chosen) < want and c not in chosen and (not names or filter_ok(c, chosen)):
                chosen.append(c)
    return chosen


def rows_of(matrix: np.ndarray) -> list[list[int]]:
    return [[int(i) for i in row if i >= 0] for row in matrix]


# ---- strategies -------------------------------------------------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 9, weighted: bool | None = None) -> NodeSet:
    n = draw(st.integers(0, max_nodes))
    ids = draw(st.lists(st.text("abcnode0123", min_size=1, max_size=6), min_size=n, max_size=n, unique=True))
    hosts = draw(st.lists(st.sampled_from(["h0", "h1", "h2", None]), min_size=n, max_size=n))
    attrs = draw(
        st.lists(
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {}, optional={"zone": st.sampled_from(["z0", "z1", "z2"]), "rack": st.sampled_from(["r0", "r1"])}
                ),
            ),
            min_size=n,
            max_size=n,
        )
    )
    use_weights = draw(st.booleans()) if weighted is None else weighted
    caps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), min_size=n, max_size=n)) if use_weights else None
    return NodeSet.of(ids, hosts=hosts, attributes=attrs, capacities=caps)


filters = st.sampled_from([(), ("zone",), ("zone", "rack"), ("missing",)])
partition_ids = st.lists(st.integers(0, 65535), min_size=1, max_size=40).map(np.array)


# ---- golden values (SPEC section 4): any refactor must reproduce these byte for byte ---------------------------
def test_node_seed_matches_spec_golden_value() -> None:
    assert node_seed("node0") == 2405097624


@pytest.mark.parametrize(
    ("node_id", "partition", "expected"),
    [("node0", 0, 3117978555), ("node0", 1, 974481511), ("node1", 1023, 2265627342)],
)
def test_weight_matches_spec_golden_value(node_id: str, partition: int, expected: int) -> None:
    assert weight(node_id, partition) == expected


def test_weight_matrix_is_murmur3_of_the_partition_seeded_by_node() -> None:
    pids = np.array([0, 1, 2, 1023, 65535, 2**32 - 1], dtype=np.int64)
    seeds = node_seeds(["node0", "node1", "x", "ünï"])
    expected = murmur3_32_u32_block(pids[:, None], seeds[None, :])
    np.testing.assert_array_equal(rendezvous_weights(pids, seeds), expected)
    assert rendezvous_weights(np.array([1023]), node_seeds(["node1"]))[0, 0] == 2265627342


def test_primary_is_the_node_with_the_highest_weight() -> None:
    nodes = NodeSet.of(["node0", "node1", "node2", "node3"])
    got = assign_rendezvous(np.arange(64), nodes, backups=1)
    for p in range(64):
        weights = [weight(i, p) for i in nodes.node_ids]
        assert got[p, 0] == int(np.argmax(weights)), f"partition {p}: weights {weights}, got {got[p]}"


# ---- scenarios --------------------------------------------------------------------------------------------------
def test_no_nodes_gives_empty_rows() -> None:
    got = assign_rendezvous(np.arange(3), NodeSet.of([]), backups=2)
    assert got.shape == (3, 0)


def test_single_node_holds_every_partition_alone() -> None:
    got = assign_rendezvous(np.arange(5), NodeSet.of(["only"]), backups=3)
    assert got.tolist() == [[0]] * 5


def test_replicated_lists_every_node_in_ranking_order() -> None:
    nodes = NodeSet.of([f"n{i}" for i in range(6)], hosts=["h"] * 6)
    got = assign_rendezvous(np.arange(20), nodes, backups=0, replicated=True, exclude_neighbors=True)
    assert rows_of(got) == [reference_ranking(p, nodes) for p in range(20)]


def test_exclude_neighbors_puts_backups_on_other_hosts() -> None:
    nodes = NodeSet.of([f"n{i}" for i in range(8)], hosts=[f"h{i // 2}" for i in range(8)])
    got = assign_rendezvous(np.arange(200), nodes, backups=2, exclude_neighbors=True)
    for row in got:
        assert len({nodes.hosts[i] for i in row}) == 3, [nodes.node_ids[i] for i in row]


def test_exclude_neighbors_fills_from_the_ranking_when_hosts_run_out() -> None:
    # Two hosts, three replicas: pass 1 finds one node per host, the fill adds the best remaining node.
    nodes = NodeSet.of(["a", "b", "c", "d"], hosts=["h0", "h0", "h1", "h1"])
    got = assign_rendezvous(np.arange(100), nodes, backups=2, exclude_neighbors=True)
    for p, row in enumerate(got):
        ranking = reference_ranking(p, nodes)
        first_other_host = next(i for i in ranking if nodes.hosts[i] != nodes.hosts[ranking[0]])
        rest = [i for i in ranking if i not in (ranking[0], first_other_host)]
        assert row.tolist() == [ranking[0], first_other_host, rest[0]], f"partition {p}, ranking {ranking}"


def test_fill_after_exclude_neighbors_still_applies_the_backup_filter() -> None:
    # One host, so every backup comes from the fill; zones z0, z0, z1: at most two distinct zones.
    nodes = NodeSet.of(
        ["a", "b", "c"], hosts=["h", "h", "h"], attributes=[{"zone": "z0"}, {"zone": "z0"}, {"zone": "z1"}]
    )
    got = assign_rendezvous(np.arange(50), nodes, backups=2, exclude_neighbors=True, backup_filter=["zone"])
    for row in got:
        kept = [i for i in row if i >= 0]
        assert len(kept) == 2 and {nodes.attributes[i]["zone"] for i in kept} == {"z0", "z1"}  # type: ignore[index]
        assert row[2] == -1


def test_backup_filter_treats_missing_attributes_as_equal() -> None:
    nodes = NodeSet.of(["a", "b", "c"], attributes=[None, {}, {"zone": "z1"}])
    got = assign_rendezvous(np.arange(30), nodes, backups=2, backup_filter=["zone"])
    for row in got:
        kept = {nodes.node_ids[i] for i in row if i >= 0}
        assert "c" in kept and len(kept) == 2, kept  # a and b (both null zone) never share a partition


def test_weighted_ranking_gives_bigger_nodes_more_primaries() -> None:
    nodes = NodeSet.of(["small", "big"], capacities=[1.0, 3.0])
    primaries = np.bincount(assign_rendezvous(np.arange(4000), nodes, backups=0)[:, 0], minlength=2)
    assert 2700 < primaries[1] < 3300, primaries  # expected share 3/4


def test_zero_capacity_node_ranks_last() -> None:
    nodes = NodeSet.of(["a", "b", "c"], capacities=[0.0, 1.0, 2.0])
    got = assign_rendezvous(np.arange(100), nodes, backups=2)
    assert (got[:, 2] == 0).all()


def test_capacity_none_means_one() -> None:
    assert NodeSet.of(["a"], capacities=[None]).capacities == (1.0,)


@pytest.mark.parametrize("capacity", [-1.0, float("nan"), float("inf")])
def test_invalid_capacity_is_rejected_with_the_node_named(capacity: float) -> None:
    with pytest.raises(InvalidNodeSetError, match="'a'"):
        NodeSet.of(["a"], capacities=[capacity])


def test_duplicate_node_ids_are_rejected() -> None:
    with pytest.raises(InvalidNodeSetError, match="more than once"):
        NodeSet.of(["a", "a"])


def test_negative_backups_are_rejected() -> None:
    with pytest.raises(ValueError, match="backups"):
        assign_rendezvous(np.arange(2), NodeSet.of(["a"]), backups=-1)


def test_large_cluster_matches_reference_on_sampled_partitions() -> None:
    # 300 nodes on 100 hosts in 3 zones: exercises batching and the candidate window at a realistic size.
    n = 300
    nodes = NodeSet.of(
        [f"node{i}" for i in range(n)],
        hosts=[f"h{i % 100}" for i in range(n)],
        attributes=[{"zone": f"z{i % 3}"} for i in range(n)],
    )
    pids = np.arange(0, 65536, 997)
    for excl, names in [(False, ()), (True, ()), (False, ("zone",)), (True, ("zone",))]:
        got = rows_of(assign_rendezvous(pids, nodes, 3, exclude_neighbors=excl, backup_filter=names))
        assert got == [reference_assign(int(p), nodes, 3, False, excl, names) for p in pids], (excl, names)


# ---- the selection engine on crafted keys (ties, overwrite-value collisions, window widening) -----------------
def test_engine_breaks_ties_by_lower_column_and_survives_max_value_keys() -> None:
    keys = np.array([[7, 3, 3, 0xFFFFFFFF, 3], [0xFFFFFFFF] * 5, [5, 0xFFFFFFFF, 0xFFFFFFFF, 1, 0xFFFFFFFF]], np.uint32)
    before = keys.copy()
    got = select_replicas(keys, 4)
    assert got.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3], [3, 0, 1, 2]]
    np.testing.assert_array_equal(keys, before)  # keys are restored


@given(
    keys=st.lists(st.lists(st.integers(0, 5), min_size=30, max_size=30), min_size=1, max_size=8),
    classes=st.lists(st.integers(0, 3), min_size=30, max_size=30),
    replicas=st.integers(1, 6),
)
def test_engine_walk_equals_sequential_walk_even_when_the_window_must_widen(
    keys: list[list[int]], classes: list[int], replicas: int
) -> None:
    # Few distinct classes among 30 nodes: rows often need more than the first window to finish.
    matrix = np.array(keys, dtype=np.int64)
    cls = np.array(classes, dtype=np.int32)
    got = select_replicas(matrix, replicas, ClassConstraint((cls,)), ClassConstraint(()))
    for row, out in zip(matrix, got, strict=True):
        ranking = list(np.argsort(row, kind="stable"))
        chosen = [ranking[0]]
        for c in ranking[1:]:
            if len(chosen) < replicas and cls[c] not in {cls[a] for a in chosen}:
                chosen.append(c)
        for c in ranking[1:]:
            if len(chosen) < replicas and c not in chosen:
                chosen.append(c)
        assert out.tolist() == chosen


# ---- properties -------------------------------------------------------------------------------------------------
@given(nodes=clusters(), pids=partition_ids, backups=st.integers(0, 4), replicated=st.booleans(),
       excl=st.booleans(), names=filters)
def test_kernel_equals_the_scalar_spec_walk(
    nodes: NodeSet, pids: np.ndarray, backups: int, replicated: bool, excl: bool, names: tuple[str, ...]
) -> None:
    got = rows_of(assign_rendezvous(pids, nodes, backups, replicated, excl, names))
    assert got == [reference_assign(int(p), nodes, backups, replicated, excl, names) for p in pids]


@given(nodes=clusters(), pids=partition_ids, backups=st.integers(0, 4), excl=st.booleans())
def test_replicas_are_distinct_and_min_of_backups_plus_one_and_nodes(
    nodes: NodeSet, pids: np.ndarray, backups: int, excl: bool
) -> None:
    got = assign_rendezvous(pids, nodes, backups, exclude_neighbors=excl)
    assert got.shape == (len(pids), min(backups + 1, len(nodes)))
    for row in got:
        assert len(set(row.tolist())) == len(row) and (row >= 0).all()


@given(nodes=clusters(), pids=partition_ids, backups=st.integers(1, 3), names=filters)
def test_neighbour_and_filter_constraints_hold_whenever_satisfiable(
    nodes: NodeSet, pids: np.ndarray, backups: int, names: tuple[str, ...]
) -> None:
    want = min(backups + 1, len(nodes))
    got = assign_rendezvous(pids, nodes, backups, exclude_neighbors=True, backup_filter=names)
    for row in got:
        kept = [int(i) for i in row if i >= 0]
        tuples = [nodes.attribute_tuple(i, names) for i in kept]
        assert not names or len(set(tuples)) == len(tuples), f"filter violated: {tuples}"
        distinct_hosts = len(set(nodes.hosts))
        if not names and distinct_hosts >= want:
            assert len({nodes.hosts[i] for i in kept}) == want, f"hosts repeat although {distinct_hosts} exist"
        if names and len({nodes.attribute_tuple(i, names) for i in range(len(nodes))}) >= want:
            assert len(kept) == want


@given(nodes=clusters(weighted=False), pids=partition_ids, backups=st.integers(0, 3), data=st.data())
def test_removing_a_node_changes_only_partitions_that_held_it(
    nodes: NodeSet, pids: np.ndarray, backups: int, data: st.DataObject
) -> None:
    if len(nodes) < 2:
        return
    gone = data.draw(st.integers(0, len(nodes) - 1))
    keep = [i for i in range(len(nodes)) if i != gone]
    smaller = NodeSet.of([nodes.node_ids[i] for i in keep])
    before = rows_of(assign_rendezvous(pids, nodes, backups))
    after = rows_of(assign_rendezvous(pids, smaller, backups))
    for p, old, new in zip(pids, before, after, strict=True):
        if gone not in old:
            assert [keep[i] for i in new] == old, f"partition {p} moved although it did not hold the node"


@given(nodes=clusters(weighted=False), pids=partition_ids, backups=st.integers(0, 3))
def test_adding_a_node_changes_only_partitions_that_now_include_it(
    nodes: NodeSet, pids: np.ndarray, backups: int
) -> None:
    bigger = NodeSet.of([*nodes.node_ids, "newcomer!"])
    before = rows_of(assign_rendezvous(pids, nodes, backups))
    after = rows_of(assign_rendezvous(pids, bigger, backups))
    for p, old, new in zip(pids, before, after, strict=True):
        if len(nodes) not in new:
            assert new == old, f"partition {p} moved although the newcomer is not in {new}"


@given(nodes=clusters(), pids=partition_ids, backups=st.integers(0, 3), excl=st.booleans(), names=filters,
       data=st.data())
def test_node_order_in_the_input_never_changes_the_assignment(
    nodes: NodeSet, pids: np.ndarray, backups: int, excl: bool, names: tuple[str, ...], data: st.DataObject
) -> None:
    order = data.draw(st.permutations(list(range(len(nodes)))))
    shuffled = NodeSet.of(
        [nodes.node_ids[i] for i in order],
        hosts=[nodes.hosts[i] for i in order],
        attributes=None if nodes.attributes is None else [nodes.attributes[i] for i in order],
        capacities=[nodes.capacities[i] for i in order],
    )
    before = [[nodes.node_ids[i] for i in row] for row in rows_of(assign_rendezvous(pids, nodes, backups,
                                                                                   exclude_neighbors=excl,
                                                                                   backup_filter=names))]
    after = [[shuffled.node_ids[i] for i in row] for row in rows_of(assign_rendezvous(pids, shuffled, backups,
                                                                                     exclude_neighbors=excl,
                                                                                     backup_filter=names))]
    assert after == before


@given(
    keys=st.lists(st.lists(st.integers(0, 9), min_size=60, max_size=60), min_size=1, max_size=6),
    replicas=st.integers(17, 59),
)
def test_engine_wide_windows_equal_a_stable_sort_despite_ties(keys: list[list[int]], replicas: int) -> None:
    # Windows above the argmin limit take the argpartition path; heavy ties straddle its boundary.
    matrix = np.array(keys, dtype=np.uint32)
    expected = np.argsort(matrix, axis=1, kind="stable")[:, :replicas]
    np.testing.assert_array_equal(select_replicas(matrix, replicas), expected)
