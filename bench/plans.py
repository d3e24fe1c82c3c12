"""Migration plans without Spark: the benchmark suite's scenario changes, a large synthetic plan, random plans.

Contract: every function returns a :data:`rebalancer.planning.schedule.PLAN_INPUT_SCHEMA` table that
:func:`rebalancer.planning.schedule.schedule` accepts, and is a pure function of its arguments (same call, same
table). No Spark import: tests and ``bench/schedule.py`` build plans in plain Python with NumPy.

:func:`scenario_plan` rebuilds the plan the Spark pipeline commits for one change of ``bench/suite.py`` (and the
graceful scale-down of ``bench/migrations.py``), step by step as the kernel (:mod:`rebalancer.exchange.kernel`) and
:mod:`rebalancer.planning.plan` build it:

* the cluster is ``rebalancer generate``'s: nodes ``node0..node{N-1}``, groups ``group0..``, rendezvous affinity
  (:func:`rebalancer.client.affinity.assign_indexes`, the Spark stage's kernel), every ideal copy OWNING with equal
  counters; partition bytes as ``rebalancer/generate.py`` draws them: ``floor(mean_entries * (0.5 + u)) *
  avg_entry_bytes`` with ``u = pmod(xxhash64(seed, "size", group_name, partition_id), 1000003) / 1000003`` (Spark's
  ``xxhash64``, reproduced by :func:`_spark_unit_interval`), so the bytes are those of the suite's clusters;
* after the change, the owners of a partition are its copies on alive nodes; the serving primary is the ideal
  primary when it owns, else the first owner in the previous list (late affinity's temporary primary);
* per partition (planner): a ``COPY`` (FULL, by ``entries``) to every ideal node that does not own, by ideal
  ``replica_index``, with ``candidates`` = the owners by ``node_id`` and ``source_node`` the planner's rotation over
  that pool (``pool[(ordinal - 1 + p0) % len(pool)]``, ordinal over the pool's demands by group, partition and
  node, ``p0`` the pool's least partition id); a ``PROMOTE`` when the serving primary is not the ideal one; a
  ``DROP`` of every owner outside the ideal list, by ``node_id``. ``primary_node`` is the serving primary (for
  the graceful scale-down: the previous primary while it is alive, as Hazelcast's partition table has it when
  the migrations start, as ``bench/migrations.py`` does).

Every group of a scenario has the same partition count and backups, and the affinity does not salt the hash with
the group, so the layout is computed once and repeated per group; only the bytes differ per group.

:func:`synthetic_plan` is the shape of ``tests/test_schedule.py``'s synthetic plan (1-2 COPYs per partition from
1-3 owners to new nodes, a PROMOTE half of the time, a DROP half of the time), built with NumPy for millions of
steps. :func:`random_plan` draws small adversarial plans for property tests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.client.affinity import GroupSettings, assign_indexes
from rebalancer.planning.schedule import PLAN_INPUT_SCHEMA

__all__ = ["CHANGES", "SEED", "Change", "random_plan", "scenario_plan", "synthetic_plan"]

SEED = 20_261_121  # bench/suite.py's generate seed
DEFAULT_PARTITION_BYTES = 209_715_200  # conf/default.toml [generate] avg_partition_bytes (200 MiB)
HAZELCAST_PARTITION_BYTES = 205_000_000  # bench/conf/hazelcast.toml
ENTRY_BYTES = 1024  # [generate] avg_entry_bytes
JOINED, FAILED, LEFT, DRAINING = "NODE_JOINED", "NODE_FAILED", "NODE_LEFT", "NODE_DRAINING"


@dataclass(frozen=True)
class Change:
    """One scenario change: a generated cluster and the node event that changes it.

    Attributes:
        scenario: ``S``, ``M``, ``L``, ``XL``, ``XXL`` (bench/suite.py).
        change: the change's short name (``failure``, ``join``, ...).
        nodes: nodes after a join, before any other event (``node0..node{nodes-1}``).
        groups: cache groups.
        partitions: partitions per group.
        backups: backups per partition.
        event: ``NODE_JOINED`` (``node`` is new), ``NODE_FAILED`` / ``NODE_LEFT`` (``node`` and its copies are
            gone), ``NODE_DRAINING`` (``node`` leaves the placement but supplies its copies until they have moved).
        node: the node of the event.
        partition_bytes: mean bytes of a partition copy.
    """

    scenario: str
    change: str
    nodes: int
    groups: int
    partitions: int
    backups: int
    event: str
    node: str
    partition_bytes: int = DEFAULT_PARTITION_BYTES

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.change}"


CHANGES: tuple[Change, ...] = (
    Change("S", "join", 4, 1, 3, 1, JOINED, "node3"),
    Change("M", "scale-down", 10, 1, 20_000, 1, LEFT, "node9", HAZELCAST_PARTITION_BYTES),
    Change("M", "scale-up", 10, 1, 20_000, 1, JOINED, "node9", HAZELCAST_PARTITION_BYTES),
    Change("M", "crash", 10, 1, 20_000, 1, FAILED, "node9", HAZELCAST_PARTITION_BYTES),
    Change("M", "drain", 10, 1, 20_000, 1, DRAINING, "node9", HAZELCAST_PARTITION_BYTES),
    Change("L", "failure", 100, 64, 1_024, 2, FAILED, "node50"),
    Change("L", "join", 101, 64, 1_024, 2, JOINED, "node100"),
    Change("XL", "failure", 1_000, 256, 1_024, 2, FAILED, "node500"),
    Change("XXL", "failure", 1_000, 912, 1_024, 2, FAILED, "node500"),
)


# --- Spark's xxhash64, for generate.py's partition sizes --------------------------------------------------------

_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_MASK = (1 << 64) - 1
_SPARK_HASH_SEED = 42  # the seed of Spark's xxhash64 expression
_UNIT_MODULUS = 1_000_003  # generate.py's _unit_interval


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _xxh64(data: bytes, seed: int) -> int:
    """XXH64 of fewer than 32 bytes (unsigned), as Spark's ``XXH64.hashUnsafeBytes`` computes it."""
    if len(data) >= 32:
        raise ValueError(f"only inputs shorter than 32 bytes are needed here, got {len(data)}")
    h = (seed + _P5 + len(data)) & _MASK
    i = 0
    while i + 8 <= len(data):
        k = _rotl((int.from_bytes(data[i : i + 8], "little") * _P2) & _MASK, 31) * _P1 & _MASK
        h = (_rotl(h ^ k, 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= len(data):
        h = (_rotl(h ^ (int.from_bytes(data[i : i + 4], "little") * _P1 & _MASK), 23) * _P2 + _P3) & _MASK
        i += 4
    for b in data[i:]:
        h = _rotl(h ^ (b * _P5 & _MASK), 11) * _P1 & _MASK
    return _avalanche(h)


def _avalanche(h: int) -> int:
    h = (h ^ (h >> 33)) * _P2 & _MASK
    h = (h ^ (h >> 29)) * _P3 & _MASK
    return h ^ (h >> 32)


def _spark_unit_interval(seed: int, salt: str, group: str, partition_ids: np.ndarray) -> np.ndarray:
    """generate.py's ``_unit_interval``: ``pmod(xxhash64(seed, salt, group, pid), 1000003) / 1000003.0``.

    Spark chains the hash: each column's hash is the seed of the next; an int is hashed as 4 little-endian bytes.
    The group's prefix is hashed in Python, the partition ids (the last column) with NumPy ``uint64``.
    """
    h = _xxh64(seed.to_bytes(4, "little", signed=True), _SPARK_HASH_SEED)
    h = _xxh64(salt.encode(), h)
    h = _xxh64(group.encode(), h)
    with np.errstate(over="ignore"):
        x = np.uint64((h + _P5 + 4) & _MASK) ^ (partition_ids.astype(np.uint64) & np.uint64(0xFFFFFFFF)) * np.uint64(
            _P1
        )
        x = ((x << np.uint64(23)) | (x >> np.uint64(41))) * np.uint64(_P2) + np.uint64(_P3)
        x = (x ^ (x >> np.uint64(33))) * np.uint64(_P2)
        x = (x ^ (x >> np.uint64(29))) * np.uint64(_P3)
        x = x ^ (x >> np.uint64(32))
    return (x.view(np.int64) % _UNIT_MODULUS).astype(np.float64) / float(_UNIT_MODULUS)


def partition_bytes(change: Change, group: str, partition_ids: np.ndarray, seed: int = SEED) -> np.ndarray:
    """Bytes of each partition's copies in a ``rebalancer generate`` cluster (module docstring)."""
    mean_entries = change.partition_bytes // ENTRY_BYTES
    u = _spark_unit_interval(seed, "size", group, partition_ids)
    return np.floor(mean_entries * (0.5 + u)).astype(np.int64) * ENTRY_BYTES


# --- scenario plans ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PartitionSteps:
    """One group's plan for one partition: steps as (action, source, target, candidates) and its facts."""

    pid: int
    copies: list[tuple[str, tuple[str, ...]]]  # (target, candidates) in replica_index order
    promote: tuple[str, str] | None
    drops: list[str]
    primary: str
    owners: int
    replicas: int


def _layouts(change: Change) -> tuple[list[list[str]], list[list[str]], set[str]]:
    """Ideal lists before and after the change, and the nodes alive after it."""
    everyone = [f"node{i}" for i in range(change.nodes)]
    if change.event == JOINED:
        before_nodes, after_nodes, alive = [n for n in everyone if n != change.node], everyone, set(everyone)
    elif change.event in (FAILED, LEFT):
        before_nodes, after_nodes = everyone, [n for n in everyone if n != change.node]
        alive = set(after_nodes)
    elif change.event == DRAINING:
        before_nodes, after_nodes, alive = everyone, [n for n in everyone if n != change.node], set(everyone)
    else:
        raise ValueError(f"event: expected one of {[JOINED, FAILED, LEFT, DRAINING]}, got {change.event!r}")
    pids = np.arange(change.partitions)

    def lists(nodes: list[str]) -> list[list[str]]:
        matrix = assign_indexes(pids, NodeSet.of(nodes), GroupSettings("g", change.partitions, change.backups))
        return [[nodes[i] for i in row if i >= 0] for row in matrix.tolist()]

    return lists(before_nodes), lists(after_nodes), alive


def _group_template(change: Change) -> list[_PartitionSteps]:
    """The steps of every partition of one group that has any (the same in every group)."""
    before, after, alive = _layouts(change)
    out: list[_PartitionSteps] = []
    for pid, (old, ideal) in enumerate(zip(before, after, strict=True)):
        owners = [n for n in old if n in alive]
        if not owners or owners == ideal:
            continue
        serving = ideal[0] if ideal[0] in owners else owners[0]
        pool = tuple(sorted(owners))
        copies = [(n, pool) for n in ideal if n not in owners]
        promote = (serving, ideal[0]) if serving != ideal[0] else None
        drops = sorted(n for n in owners if n not in ideal)
        primary = old[0] if change.event == DRAINING and old[0] in alive else serving
        if copies or promote or drops:
            out.append(_PartitionSteps(pid, copies, promote, drops, primary, len(owners), len(ideal)))
    return out


def scenario_plan(change: Change, seed: int = SEED) -> pa.Table:
    """The plan the pipeline commits for ``change`` (module docstring), ``migration_id`` 1..n in step order.

    Args:
        change: one of :data:`CHANGES` (or any :class:`Change`).
        seed: the ``rebalancer generate`` seed that sizes the partitions.

    Returns:
        A :data:`PLAN_INPUT_SCHEMA` table, rows in ``(group_name, partition_id, step)`` order.
    """
    template = _group_template(change)
    groups = sorted(f"group{g}" for g in range(change.groups))  # string order, as the planner sorts
    pids = np.array([t.pid for t in template], dtype=np.int64)
    p0: dict[tuple[str, ...], int] = {}
    for t in template:
        for _, pool in t.copies:
            p0[pool] = min(p0.get(pool, t.pid), t.pid)
    ordinal: Counter[tuple[str, ...]] = Counter()
    cols: dict[str, list[object]] = {name: [] for name in PLAN_INPUT_SCHEMA.names}

    def add(group: str, t: _PartitionSteps, no: int, action: str, source: str, target: str | None,
            cands: tuple[str, ...] | None, nbytes: int) -> None:
        values = (len(cols["step"]) + 1, group, t.pid, no, action, source, target, list(cands) if cands else None,
                  t.primary, "entries" if action == "COPY" else None, nbytes, t.owners, t.replicas)
        for name, value in zip(PLAN_INPUT_SCHEMA.names, values, strict=True):
            cols[name].append(value)

    for group in groups:
        sizes = partition_bytes(change, group, pids, seed).tolist() if len(pids) else []
        for t, size in zip(template, sizes, strict=True):
            no = 0
            for target, pool in t.copies:  # the planner's rows are ordered by node_id within a pool's demands
                ordinal[pool] += 1
                source = pool[(ordinal[pool] - 1 + p0[pool]) % len(pool)]
                no += 1
                add(group, t, no, "COPY", source, target, pool, size)
            if t.promote:
                no += 1
                add(group, t, no, "PROMOTE", t.promote[0], t.promote[1], None, 0)
            for node in t.drops:
                no += 1
                add(group, t, no, "DROP", node, None, None, 0)
    return pa.table({name: pa.array(cols[name], type=f.type) for name, f in zip(
        PLAN_INPUT_SCHEMA.names, PLAN_INPUT_SCHEMA, strict=True)}, schema=PLAN_INPUT_SCHEMA)


# --- synthetic and random plans ---------------------------------------------------------------------------------


def synthetic_plan(steps: int, nodes: int, seed: int = 0) -> pa.Table:
    """``steps`` rows (>= 1) on ``nodes`` nodes (>= 5): per partition, 1-3 owners (candidates, the first is the
    primary), 1-2 COPYs from them to new nodes (1 MB to 2 GB, by entries or files), a PROMOTE of the first new node
    half of the time and a DROP of the last owner half of the time; owners of 3 replicas.
    """
    if nodes < 5 or steps < 1:
        raise ValueError(f"expected steps >= 1 and nodes >= 5, got {steps} and {nodes}")
    rng = np.random.default_rng(seed)
    parts = steps // 2 + 16
    while True:
        owners = rng.integers(1, 4, parts)
        n_copies = rng.integers(1, 3, parts)
        promote = rng.random(parts) < 0.5
        drop = rng.random(parts) < 0.5
        per_part = n_copies + promote + drop
        if per_part.sum() >= steps:
            break
        parts *= 2
    # exactly `steps` rows: the partitions needed, the last one cut after its first steps
    total_before = np.concatenate([[0], np.cumsum(per_part)])
    parts = int(np.searchsorted(total_before, steps))
    owners, n_copies, promote, drop = owners[:parts], n_copies[:parts], promote[:parts], drop[:parts]
    per_part = per_part[:parts].copy()
    per_part[-1] = steps - total_before[parts - 1]
    # five distinct nodes per partition: owners first, then the new nodes
    picked = np.argsort(rng.random((parts, nodes)), axis=1)[:, :5] if nodes <= 64 else _distinct(rng, parts, nodes)
    names = np.array([f"node{i:04d}" for i in range(nodes)], dtype=object)
    total = int(per_part.sum())
    part = np.repeat(np.arange(parts), per_part)
    first = np.concatenate([[0], np.cumsum(per_part)[:-1]])
    step_no = np.arange(total) - np.repeat(first, per_part) + 1
    k = step_no - 1  # 0-based step within the partition
    nc, pr = n_copies[part], promote[part]
    is_copy = k < nc
    is_promote = pr & (k == nc)
    action = np.where(is_copy, "COPY", np.where(is_promote, "PROMOTE", "DROP")).astype(object)
    own = owners[part]
    rows = np.arange(total)
    src_idx = np.where(is_copy, picked[part, k % own], np.where(is_promote, picked[part, 0], picked[part, own - 1]))
    tgt_idx = np.where(is_copy, picked[part, np.minimum(own + k, 4)], picked[part, own])
    cands = [list(names[picked[p, :o]]) for p, o in zip(part[is_copy].tolist(), own[is_copy].tolist(), strict=True)]
    cand_col: list[list[str] | None] = [None] * total
    for r, c in zip(rows[is_copy].tolist(), cands, strict=True):
        cand_col[r] = c
    transfer = np.where(is_copy, np.where(rng.random(total) < 0.5, "entries", "files"), None).astype(object)
    nbytes = np.where(is_copy, rng.integers(10**6, 2 * 10**9, total), 0)
    return pa.table(
        {
            "migration_id": pa.array(rows + 1, pa.int64()),
            "group_name": pa.array(["g"] * total, pa.string()),
            "partition_id": pa.array(part, pa.int32()),
            "step": pa.array(step_no, pa.int32()),
            "action": pa.array(action, pa.string()),
            "source_node": pa.array(names[src_idx], pa.string()),
            "target_node": pa.array(np.where(is_copy | is_promote, names[tgt_idx], None), pa.string()),
            "candidates": pa.array(cand_col, pa.list_(pa.string())),
            "primary_node": pa.array(names[picked[part, 0]], pa.string()),
            "transfer": pa.array(transfer, pa.string()),
            "bytes": pa.array(nbytes, pa.int64()),
            "owners": pa.array(own, pa.int32()),
            "replicas": pa.array(np.full(total, 3), pa.int32()),
        },
        schema=PLAN_INPUT_SCHEMA,
    )


def _distinct(rng: np.random.Generator, parts: int, nodes: int) -> np.ndarray:
    """``parts`` rows of five distinct node indices in ``0..nodes-1`` (rejection of the rows with a repeat)."""
    out = rng.integers(0, nodes, (parts, 5))
    while True:
        s = np.sort(out, axis=1)
        bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not bad.any():
            return out
        out[bad] = rng.integers(0, nodes, (int(bad.sum()), 5))


def random_plan(
    seed: int,
    nodes: int,
    partitions: int,
    *,
    max_steps: int = 4,
    skew: float = 0.0,
    planner_order: bool = True,
    one_class: bool = False,
) -> pa.Table:
    """A small random plan for property tests: every contract of the input, few nodes, varied shapes.

    Args:
        seed: NumPy seed; everything else is drawn from it.
        nodes: node count (>= 2).
        partitions: partition count (>= 1).
        max_steps: at most this many steps per partition.
        skew: 0 draws nodes uniformly; towards 1 the first nodes are drawn far more often (hot spots).
        planner_order: steps as the planner orders them (COPYs, then a PROMOTE, then DROPs); else any order.
        one_class: every partition has the same ``owners`` and ``replicas`` (one priority class).

    Returns:
        A :data:`PLAN_INPUT_SCHEMA` table; rows shuffled; every COPY's ``primary_node`` is one of its candidates
        or null (so that ``hazelcast`` always has a usable source).
    """
    if nodes < 2 or partitions < 1:
        raise ValueError(f"expected nodes >= 2 and partitions >= 1, got {nodes} and {partitions}")
    rng = np.random.default_rng(seed)
    weights = np.exp(-skew * 4 * np.arange(nodes) / nodes)
    weights /= weights.sum()
    names = [f"n{i}" for i in range(nodes)]
    rows: list[dict[str, object]] = []
    shared = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    for pid in range(partitions):
        group = f"g{int(rng.integers(0, 2))}"
        count = int(rng.integers(1, max_steps + 1))
        if planner_order:
            n_copy = int(rng.integers(0, count + 1))
            n_promote = int(rng.random() < 0.5) if count > n_copy else 0
            actions = ["COPY"] * n_copy + ["PROMOTE"] * n_promote + ["DROP"] * (count - n_copy - n_promote)
        else:
            actions = [str(a) for a in rng.choice(["COPY", "COPY", "PROMOTE", "DROP"], count)]
        owners, replicas = shared if one_class else (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        primary = names[int(rng.choice(nodes, p=weights))]
        for no, action in enumerate(actions, 1):
            pick = rng.choice(nodes, size=min(nodes, 4), replace=False, p=weights).tolist()
            row: dict[str, object] = {
                "group_name": group, "partition_id": pid, "step": no, "action": action, "source_node": names[pick[0]],
                "target_node": None, "candidates": None, "primary_node": None, "transfer": None, "bytes": 0,
                "owners": owners, "replicas": replicas,
            }
            if action == "COPY":
                target = names[pick[1]]
                cands = sorted({names[pick[0]], *(names[c] for c in pick[2 : 2 + int(rng.integers(0, 3))])})
                row |= {
                    "target_node": target,
                    "candidates": cands,
                    "primary_node": primary if primary in cands else (cands[0] if rng.random() < 0.7 else None),
                    "transfer": "entries" if rng.random() < 0.7 else "files",
                    "bytes": int(rng.choice([0, int(rng.integers(1, 10**6)), int(rng.integers(10**8, 2 * 10**9))],
                                            p=[0.05, 0.15, 0.8])),
                }
            elif action == "PROMOTE":
                row |= {"target_node": names[pick[1]] if rng.random() < 0.9 else names[pick[0]]}
            rows.append(row)
    order = rng.permutation(len(rows))
    return pa.Table.from_pylist(
        [{"migration_id": i + 1, **rows[j]} for i, j in enumerate(order.tolist())], schema=PLAN_INPUT_SCHEMA
    )
