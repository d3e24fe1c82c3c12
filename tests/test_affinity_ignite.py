"""Ignite affinity: bit-exact with Apache Ignite 2.x RendezvousAffinityFunction.

The reference below transcribes Ignite's ``assignPartition`` / ``replicatedAssign`` and
``ClusterNodeAttributeAffinityBackupFilter.apply`` statement by statement (scalar Python, Java ``long`` wrap-around
emulated with masks), independently of the vectorised kernel.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.affinity.ignite import assign_ignite, consistent_id_hash, ignite_mix, is_uuid_text
from rebalancer.affinity.nodeset import InvalidNodeSetError, NodeSet
from rebalancer.hashing import java_string_hash, wang_mix64

M64 = (1 << 64) - 1
UUID = "00000000-0000-0000-0000-{:012x}".format


# ---- Java transcription ---------------------------------------------------------------------------------------
def java_long(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def java_hash(key0: int, key1: int) -> int:
    """RendezvousAffinityFunction.hash(int key0, int key1), with >>> as a shift of the unsigned 64-bit pattern."""
    key = (key0 & 0xFFFFFFFF) | ((key1 & 0xFFFFFFFF) << 32)
    key = ((~key) + (key << 21)) & M64
    key ^= key >> 24
    key = (key + (key << 3) + (key << 8)) & M64
    key ^= key >> 14
    key = (key + (key << 2) + (key << 4)) & M64
    key ^= key >> 28
    key = (key + (key << 31)) & M64
    return java_long(key)


def uuid_compare_key(text: str) -> tuple[int, int]:
    value = uuid.UUID(text).int
    return java_long(value >> 64), java_long(value & M64)


def consistent_id_compare_key(node_id: str, as_strings: bool) -> tuple[int, tuple[int, ...]]:
    """Comparable.compareTo of consistent ids: UUID (signed halves) or String (UTF-16 code units, then length)."""
    if not as_strings and is_uuid_text(node_id):
        return (0, uuid_compare_key(node_id))
    units = node_id.encode("utf-16-le")
    return (1, tuple(units[i] | units[i + 1] << 8 for i in range(0, len(units), 2)))


def reference_ignite(
    part: int, nodes: NodeSet, backups: int, replicated: bool, excl: bool, names: Sequence[str], as_strings: bool
) -> list[int]:
    topology = list(range(len(nodes)))
    if len(topology) <= 1:  # `if (nodes.size() <= 1) return nodes;`
        return topology
    hashed = [(java_hash(consistent_id_hash(nodes.node_ids[i], as_strings), part), i) for i in topology]
    # HashComparator: hash ascending, then node.id().compareTo (every node here has a UUID)
    hashed.sort(key=lambda t: (t[0], uuid_compare_key(nodes.uuid_of(t[1]))))  # type: ignore[arg-type]
    sorted_nodes = [i for _, i in hashed]
    primary_and_backups = len(topology) if replicated else min(backups + 1, len(topology))
    if replicated:  # replicatedAssign: primary, then the snapshot sorted by NodeOrderComparator (consistent ids)
        snapshot = sorted(topology, key=lambda i: consistent_id_compare_key(nodes.node_ids[i], as_strings))
        return [sorted_nodes[0]] + [i for i in snapshot if i != sorted_nodes[0]]
    res = [sorted_nodes[0]]
    all_neighbors = {nodes.hosts[sorted_nodes[0]]}  # neighborhoodCache groups nodes by MACs (host here)

    def backup_filter_apply(candidate: int, previously_selected: list[int]) -> bool:
        for node in previously_selected:
            if all(nodes.attribute_tuple(candidate, [a]) == nodes.attribute_tuple(node, [a]) for a in names):
                return False
        return True

    if backups > 0:  # Ignite 2.18: the filter first, then (with exclNeighbors) the neighbourhood
        for node in sorted_nodes[1:]:
            if len(res) >= primary_and_backups:
                break
            if names and not backup_filter_apply(node, res):
                continue
            if excl:
                if nodes.hosts[node] not in all_neighbors:
                    res.append(node)
                    all_neighbors.add(nodes.hosts[node])
            else:
                res.append(node)
    if len(res) < primary_and_backups and len(topology) >= primary_and_backups and excl:
        for node in sorted_nodes[1:]:
            if len(res) >= primary_and_backups:
                break
            if node not in res:
                res.append(node)
    return res


def ids(nodes: NodeSet, matrix: np.ndarray) -> list[list[str]]:
    return [[nodes.node_ids[i] for i in row if i >= 0] for row in matrix]


def three_nodes() -> NodeSet:
    return NodeSet.of(
        ["node0", "node1", "node2"], node_uuids=[UUID(i) for i in (1, 2, 3)]
    )


# ---- vectors from a Java transcription (issue "Affinity functions") ----------------------------------------------
@pytest.mark.parametrize(
    ("partition", "expected"),
    [
        (0, ["node2", "node1"]),
        (1, ["node2", "node0"]),
        (2, ["node0", "node1"]),
        (5, ["node0", "node2"]),
        (7, ["node2", "node0"]),
        (1023, ["node1", "node0"]),
    ],
)
def test_three_node_vectors_with_one_backup(partition: int, expected: list[str]) -> None:
    nodes = three_nodes()
    assert ids(nodes, assign_ignite(np.array([partition]), nodes, backups=1)) == [expected]


def test_three_node_primary_counts_over_1024_partitions() -> None:
    got = assign_ignite(np.arange(1024), three_nodes(), backups=1)
    assert np.bincount(got[:, 0]).tolist() == [348, 334, 342]


def test_wang_mix_of_zero_key() -> None:
    assert int(wang_mix64(np.int64(0))) == 8633297058295171728
    assert java_hash(0, 0) == 8633297058295171728


def test_vectorised_mix_equals_java_hash() -> None:
    hashes = [0, -1, 1, java_string_hash("node0"), -(2**31), 2**31 - 1]
    parts = [0, 1, 1023, 65535, 2**31 - 1]
    got = ignite_mix(np.array(parts), np.array(hashes))
    assert got.tolist() == [[java_hash(h, p) for h in hashes] for p in parts]


# ---- consistent id hashing ----------------------------------------------------------------------------------------
def test_uuid_shaped_consistent_id_is_hashed_as_java_uuid() -> None:
    text = "7f3e5a1c-0b2d-4c6e-8f90-a1b2c3d4e5f6"
    value = uuid.UUID(text).int
    hilo = (value >> 64) ^ (value & M64)
    expected = java_long((hilo >> 32) ^ hilo) & 0xFFFFFFFF
    expected = expected - (1 << 32) if expected >> 31 else expected
    assert is_uuid_text(text) and is_uuid_text(text.upper())
    assert consistent_id_hash(text) == expected
    assert consistent_id_hash(text, ids_as_strings=True) == java_string_hash(text)


@pytest.mark.parametrize(
    "text", ["node0", "7f3e5a1c0b2d4c6e8f90a1b2c3d4e5f6", "{7f3e5a1c-0b2d-4c6e-8f90-a1b2c3d4e5f6}"]
)
def test_non_canonical_text_is_hashed_as_a_string(text: str) -> None:
    assert consistent_id_hash(text) == java_string_hash(text)


def test_ids_as_strings_changes_the_assignment_of_uuid_ids() -> None:
    node_ids = [str(uuid.UUID(int=(i + 1) * 0x0123456789ABCDEF0123456789ABCDEF)) for i in range(5)]
    nodes = NodeSet.of(node_ids, node_uuids=node_ids)
    as_uuid = assign_ignite(np.arange(64), nodes, 1)
    as_text = assign_ignite(np.arange(64), nodes, 1, ids_as_strings=True)
    assert as_uuid.tolist() == [reference_ignite(p, nodes, 1, False, False, (), False) for p in range(64)]
    assert as_text.tolist() == [reference_ignite(p, nodes, 1, False, False, (), True) for p in range(64)]
    assert as_uuid.tolist() != as_text.tolist()


# ---- ties: equal String.hashCode, broken by UUID.compareTo (signed) ------------------------------------------------
def test_equal_hash_codes_tie_break_on_signed_uuid_order() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    # msb 0x8000... is negative as a Java long, so "Aa" sorts first although its UUID is larger unsigned.
    nodes = NodeSet.of(["BB", "Aa"], node_uuids=[UUID(1), "80000000-0000-0000-0000-000000000000"])
    got = assign_ignite(np.arange(16), nodes, backups=1)
    assert ids(nodes, got) == [["Aa", "BB"]] * 16


def test_equal_hash_codes_without_uuids_tie_break_on_node_id() -> None:
    nodes = NodeSet.of(["BB", "Aa"])
    assert ids(nodes, assign_ignite(np.arange(4), nodes, backups=1)) == [["Aa", "BB"]] * 4


def test_unparsable_node_uuid_is_rejected_with_the_node_named() -> None:
    with pytest.raises(InvalidNodeSetError, match="'a'"):
        assign_ignite(np.arange(2), NodeSet.of(["a", "b"], node_uuids=["not-a-uuid", None]), 1)


# ---- exclNeighbors, backup filter, REPLICATED --------------------------------------------------------------------
def test_exclude_neighbors_refills_with_neighbours_when_hosts_run_out() -> None:
    # 2 hosts, 3 replicas: the second pass appends the best remaining node (exclNeighborsWarn case).
    nodes = NodeSet.of(
        [f"n{i}" for i in range(4)],
        node_uuids=[UUID(i) for i in range(4)],
        hosts=["h0", "h0", "h1", "h1"],
    )
    got = assign_ignite(np.arange(128), nodes, backups=2, exclude_neighbors=True)
    for p, row in enumerate(got):
        assert len({nodes.hosts[i] for i in row[:2]}) == 2
        assert row.tolist() == reference_ignite(p, nodes, 2, False, True, (), False)


def test_exclude_neighbors_refill_ignores_the_backup_filter() -> None:
    nodes = NodeSet.of(
        ["a", "b", "c"],
        node_uuids=[UUID(i) for i in range(3)],
        hosts=["h0", "h1", "h2"],
        attributes=[{"zone": "z"}] * 3,
    )
    got = assign_ignite(np.arange(32), nodes, backups=2, exclude_neighbors=True, backup_filter=["zone"])
    assert (got >= 0).all()  # the filter alone would have allowed a single replica; the refill ignores it


def test_exclude_neighbors_applies_the_backup_filter_too() -> None:
    # Measured on real Ignite 2.18.0 (tests/interop/test_ignite_affinity.py, cache "both", 200 partitions): the
    # first pass needs the filter *and* another host. Partition 3: primary zeta (host1, z0); node0 (host0, z0)
    # ranks before Aa (host0, z1) but shares zeta's zone, so Ignite takes Aa.
    nodes = NodeSet.of(
        ["node0", "Aa", "alpha-7", "zeta"],
        node_uuids=[UUID(i) for i in range(1, 5)],
        hosts=["host0", "host0", "host1", "host1"],
        attributes=[{"zone": "z0"}, {"zone": "z1"}, {"zone": "z2"}, {"zone": "z0"}],
    )
    got = assign_ignite([3], nodes, backups=1, exclude_neighbors=True, backup_filter=["zone"])
    assert ids(nodes, got) == [["zeta", "Aa"]]
    plain = assign_ignite([3], nodes, backups=1, exclude_neighbors=True)
    assert ids(nodes, plain) == [["zeta", "node0"]]


def test_backup_filter_discards_backups_it_cannot_place() -> None:
    nodes = NodeSet.of(
        ["a", "b", "c", "d"],
        node_uuids=[UUID(i) for i in range(4)],
        attributes=[{"zone": "z0"}, {"zone": "z0"}, {"zone": "z1"}, {"zone": "z1"}],
    )
    got = assign_ignite(np.arange(64), nodes, backups=2, backup_filter=["zone"])
    assert (got[:, 2] == -1).all()
    for row in got:
        assert {nodes.attributes[i]["zone"] for i in row[:2]} == {"z0", "z1"}  # type: ignore[index]


def test_backup_filter_2_11_semantics_null_matches_null() -> None:
    # Both lack the attribute: equal (Objects.equals(null, null)), so they are never primary and backup together.
    nodes = NodeSet.of(["a", "b"], node_uuids=[UUID(1), UUID(2)])
    got = assign_ignite(np.arange(16), nodes, backups=1, backup_filter=["AVAILABILITY_ZONE"])
    assert (got[:, 1] == -1).all()


def test_replicated_is_primary_then_others_in_consistent_id_order_not_join_order() -> None:
    # NodeOrderComparator (non-legacy) sorts the affinity snapshot by consistentId, whatever the join order.
    rows = [
        {"node_id": "zeta", "node_uuid": UUID(1), "node_order": 1},
        {"node_id": "alpha", "node_uuid": UUID(2), "node_order": 3},
        {"node_id": "mid", "node_uuid": UUID(3), "node_order": 2},
        {"node_id": "client", "node_order": 0, "is_client": True},
    ]
    nodes = NodeSet.from_rows(rows)
    assert nodes.node_ids == ("zeta", "mid", "alpha")  # join order, clients dropped
    got = ids(nodes, assign_ignite(np.arange(64), nodes, backups=0, replicated=True))
    primaries = set()
    for p, row in enumerate(got):
        primary = nodes.node_ids[reference_ignite(p, nodes, 0, False, False, (), False)[0]]
        primaries.add(primary)
        assert row == [primary] + [n for n in ("alpha", "mid", "zeta") if n != primary]
    assert primaries == {"alpha", "mid", "zeta"}


def test_replicated_orders_uuid_ids_signed_and_string_ids_by_utf16_units() -> None:
    negative, positive = "80000000-0000-0000-0000-000000000000", "7fffffff-ffff-ffff-ffff-ffffffffffff"
    uuids = NodeSet.of([positive, negative], node_uuids=[UUID(1), UUID(2)])
    for row in ids(uuids, assign_ignite(np.arange(8), uuids, 0, replicated=True)):
        assert row[1:] == [n for n in (negative, positive) if n != row[0]]
    # U+FFFF is one code unit 0xFFFF; U+10000 is the surrogate pair D800 DC00: Java puts U+10000 first.
    texts = NodeSet.of(["\uffff", "\U00010000", "a"])
    for row in ids(texts, assign_ignite(np.arange(8), texts, 0, replicated=True)):
        assert row[1:] == [n for n in ("a", "\U00010000", "\uffff") if n != row[0]]


def test_single_node_and_no_nodes() -> None:
    one = NodeSet.of(["solo"], node_uuids=["00000000-0000-0000-0000-000000000001"])
    assert assign_ignite(np.arange(3), one, backups=2).tolist() == [[0]] * 3
    assert assign_ignite(np.arange(3), NodeSet.of([]), backups=2).shape == (3, 0)


# ---- the kernel equals the transcription on random clusters -------------------------------------------------------
@st.composite
def ignite_clusters(draw: st.DrawFn) -> NodeSet:
    n = draw(st.integers(0, 9))
    pool = ["Aa", "BB", "AaAa", "BBBB", "AaBB", "node0", "node1", "x"]  # equal String.hashCode pairs on purpose
    node_ids = draw(
        st.lists(
            st.one_of(st.sampled_from(pool), st.uuids().map(str), st.text("abz01", min_size=1, max_size=5)),
            min_size=n, max_size=n, unique=True,
        )
    )
    uuids = draw(st.lists(st.uuids().map(str), min_size=n, max_size=n, unique=True))
    hosts = draw(st.lists(st.sampled_from(["h0", "h1", "h2", None]), min_size=n, max_size=n))
    attrs = draw(
        st.lists(
            st.one_of(st.none(), st.fixed_dictionaries({}, optional={"zone": st.sampled_from(["z0", "z1"]),
                                                                     "rack": st.sampled_from(["r0", "r1"])})),
            min_size=n, max_size=n,
        )
    )
    return NodeSet.of(node_ids, node_uuids=uuids, hosts=hosts, attributes=attrs)


@given(
    nodes=ignite_clusters(),
    pids=st.lists(st.integers(0, 65535), min_size=1, max_size=40).map(np.array),
    backups=st.integers(0, 4),
    replicated=st.booleans(),
    excl=st.booleans(),
    names=st.sampled_from([(), ("zone",), ("zone", "rack")]),
    as_strings=st.booleans(),
)
def test_kernel_equals_java_transcription(
    nodes: NodeSet, pids: np.ndarray, backups: int, replicated: bool, excl: bool, names: tuple[str, ...],
    as_strings: bool,
) -> None:
    got = assign_ignite(pids, nodes, backups, replicated, excl, names, as_strings)
    expected = [reference_ignite(int(p), nodes, backups, replicated, excl, names, as_strings) for p in pids]
    assert [[int(i) for i in row if i >= 0] for row in got] == expected


@given(nodes=ignite_clusters(), pids=st.lists(st.integers(0, 65535), min_size=1, max_size=40).map(np.array),
       backups=st.integers(0, 3), replicated=st.booleans(), excl=st.booleans(), data=st.data())
def test_node_order_in_the_input_never_changes_the_assignment(
    nodes: NodeSet, pids: np.ndarray, backups: int, replicated: bool, excl: bool, data: st.DataObject
) -> None:
    order = data.draw(st.permutations(list(range(len(nodes)))))
    shuffled = NodeSet.of(
        [nodes.node_ids[i] for i in order], node_uuids=[nodes.uuid_of(i) for i in order],
        hosts=[nodes.hosts[i] for i in order],
    )
    before = ids(nodes, assign_ignite(pids, nodes, backups, replicated, excl))
    after = ids(shuffled, assign_ignite(pids, shuffled, backups, replicated, excl))
    assert after == before


@given(nodes=ignite_clusters(), pids=st.lists(st.integers(0, 65535), min_size=1, max_size=40).map(np.array),
       backups=st.integers(0, 3), data=st.data())
def test_removing_a_node_changes_only_partitions_that_held_it(
    nodes: NodeSet, pids: np.ndarray, backups: int, data: st.DataObject
) -> None:
    if len(nodes) < 2:
        return
    gone = data.draw(st.integers(0, len(nodes) - 1))
    keep = [i for i in range(len(nodes)) if i != gone]
    smaller = NodeSet.of([nodes.node_ids[i] for i in keep], node_uuids=[nodes.uuid_of(i) for i in keep])
    before = assign_ignite(pids, nodes, backups).tolist()
    after = assign_ignite(pids, smaller, backups).tolist()
    for old, new in zip(before, after, strict=True):
        if gone not in old:
            assert [keep[i] for i in new] == old
