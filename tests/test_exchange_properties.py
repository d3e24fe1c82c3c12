"""Property tests of the partition map exchange on random clusters and random event sequences.

Each example builds a small steady cluster (2-5 servers ``n1..``, 1-2 groups ``g0``/``g1`` of 2-6 partitions with
0-2 backups and a random loss policy; every ideal replica reports OWNING at counter 10 before the first exchange),
then applies 1-4 random steps, running the exchange after a step when the example says so (one step in three, and
always after the last one; skipped when no event or report is new), so some steps are merged into one run:

- ``fail``: an alive server fails or leaves (never the last one);
- ``join``: a new server joins;
- ``client``: a client joins (a ``NONE`` exchange when nothing else is pending);
- ``own``: MOVING copies of the committed map report OWNING at the partition's maximum OWNING counter (all of
  them, or a subset picked by a bit mask), which can make a late affinity switch due;
- ``reset``: ``RESET_LOST_PARTITIONS`` for a group;
- ``cache``: ``CACHE_STOPPED`` for a running group, or ``CACHE_STARTED`` for a stopped one (it restarts empty);
- ``twin``: one round of the twin (it executes the committed plan and runs the exchanges that become due);
- ``twin_fail``: the same, with an alive server failing once the steps of the first waves have finished;
- ``drain``: an alive server that is not draining starts draining (``NODE_DRAINING``; it stays alive and serving
  while it leaves every placement; a later ``fail`` step may make it leave);
- ``state``: ``CLUSTER_DEACTIVATED`` (an active cluster), ``CLUSTER_ACTIVATED`` (an inactive one) or
  ``BASELINE_CHANGED``; an inactive cluster is activated before the final twin run.

After the steps, with no more events, the twin runs until stable: it must converge unless partitions are lost
(they wait for a reset).

Then every committed version is checked (rows read back from the warehouse; a failure prints the offending rows):

(a) a partition with an OWNING copy on an alive server has exactly one replica 0 row in ``affinity_assignment``,
    and that primary's copy is OWNING;
(b) for the SAFE policies (null, ``READ_WRITE_SAFE``, ``READ_ONLY_SAFE``) a partition is in ``lost_partitions``
    iff no alive server owns it; an ``IGNORE`` partition always has an alive owner, and when it is newly listed
    every ideal node holds an empty (counter 0) OWNING copy; for every policy the listed set follows the history
    rule: listed before, its group not reset now and not IGNORE (an IGNORE loss is listed only in its loss
    version), or newly lost (every previous owner is gone and no OWNING report consumed now comes from an alive
    server);
(c) ``client_affinity`` routes every assigned partition of every group to the ``affinity_assignment`` replica 0
    node, with the other replicas as backups in ``replica_index`` order;
(d) exchanges ordered by ``exchange_id`` have strictly increasing ``(major, minor)``;
(e) no duplicate keys per version in ``affinity_assignment``, ``partition_map``, ``ideal_assignment``,
    ``lost_partitions``, ``client_affinity`` and ``topology``;
(f) the migration plan (:func:`check_plan`): only partitions with an owner have steps, numbered 1..n; applied in
    order they never lower the OWNING copies below min(current, target) and end with exactly the ideal nodes
    holding the data; steps of one partition never overlap in time; no node runs more than the cap at once;

and, beside the issue's list: the map and the assignment only name alive servers; ``ideal_assignment`` equals
:func:`rebalancer.client.affinity.assign` over the alive servers; the first version is steady (ideal, not
temporary, all OWNING); an OWNING report that a version consumes (``report_seq`` up to its ``max_report_seq``)
from an alive server shows as an OWNING (or RENTING) copy in that version's map.

Every exchange the test runs itself (not the twin's) after the first is also run a second time on a copy of the
warehouse with ``carry_settled=False`` and in Spark (``driver_replicas = 0``): carrying the settled
partitions over (``rebalancer.pipeline``, docs/EXCHANGE.md "Settled partitions") and deciding these small clusters
on the driver must give exactly the rows of recomputing every partition in Spark's ``mapInArrow``, in every
versioned table.

Each example runs 2-5 real exchanges of several seconds each, so the default run is capped at 2 examples
(``EXAMPLES`` below). Longer runs: ``HYPOTHESIS_PROFILE=soak .venv/bin/python -m pytest
tests/test_exchange_properties.py`` uses the soak profile's ``max_examples`` (1000: hours), and
``EXCHANGE_PROPERTY_EXAMPLES=N`` sets any count (e.g. 30 for a run of about half an hour).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st

from rebalancer.affinity.nodeset import NodeSet
from rebalancer.client.affinity import assign
from rebalancer.pipeline import VERSIONED_TABLES
from tests.exchange_scenarios import Cluster

if os.environ.get("EXCHANGE_PROPERTY_EXAMPLES"):
    EXAMPLES = int(os.environ["EXCHANGE_PROPERTY_EXAMPLES"])
elif os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    EXAMPLES = 2
else:
    EXAMPLES = settings.default.max_examples

SAFE = (None, "READ_WRITE_SAFE", "READ_ONLY_SAFE")
COUNTER, SIZE = 10, 5

Version = tuple[int, int]
Part = tuple[str, int]

groups_st = st.lists(
    st.tuples(st.integers(2, 6), st.integers(0, 2), st.sampled_from([*SAFE, "IGNORE"])), min_size=1, max_size=2
)
step_st = st.one_of(
    st.tuples(st.just("fail"), st.integers(0, 4), st.sampled_from(["NODE_FAILED", "NODE_LEFT"])),
    st.tuples(st.just("own"), st.integers(0, 255)),  # mask 0 = every MOVING copy
    st.tuples(st.just("join")),
    st.tuples(st.just("client")),
    st.tuples(st.just("reset"), st.integers(0, 1)),
    st.tuples(st.just("cache"), st.integers(0, 1)),  # stop a running group, or start a stopped one again
    st.tuples(st.just("twin")),  # one twin round: executes the committed plan, runs the exchanges it makes due
    st.tuples(st.just("twin_fail"), st.integers(0, 4), st.integers(1, 3)),  # ... with a server failing at a wave
    st.tuples(st.just("drain"), st.integers(0, 4)),
    st.tuples(st.just("state"), st.booleans()),  # toggle activity, or change the baseline
)
# (step, run the exchange after it): one step in three, so most examples make 2-3 runs and some steps merge
steps_st = st.lists(st.tuples(step_st, st.sampled_from([False, False, True])), min_size=1, max_size=4)

_example = itertools.count()


@settings(max_examples=EXAMPLES)
@given(servers=st.integers(2, 5), groups=groups_st, steps=steps_st)
def test_exchange_invariants_hold_on_random_clusters_and_events(
    spark: Any, tmp_path: Path, servers: int, groups: list[tuple[int, int, str | None]],
    steps: list[tuple[tuple[Any, ...], bool]],
) -> None:
    c = Cluster.create(spark, tmp_path / f"w{next(_example)}")
    spec = {f"g{i}": g for i, g in enumerate(groups)}
    alive = [f"n{i}" for i in range(1, servers + 1)]
    for name, (partitions, backups, policy) in spec.items():
        c.group(name, partitions, backups, loss_policy=policy)
    c.join(*alive)
    c.report([
        (node, name, p, "OWNING", COUNTER, SIZE, None)
        for name, (partitions, backups, _) in spec.items()
        for p, nodes in enumerate(assign(NodeSet.of(alive), partitions, backups))
        for node in nodes
    ])
    committed: list[Version] = []
    run(c, committed)
    assert len(committed) == 1
    new_servers, clients = itertools.count(servers + 1), itertools.count(1)
    running = set(spec)  # groups the events leave running
    draining: set[str] = set()
    active = True
    pending = False  # new events or reports since the last run (a run without any would repeat the last one)
    for i, (step, exchange_after) in enumerate(steps):
        kind = step[0]
        if kind == "fail" and len(alive) > 1:
            node = alive.pop(step[1] % len(alive))
            c.event(step[2], node=node)
            draining.discard(node)
            pending = True
        elif kind == "state":
            if step[1]:
                c.event("CLUSTER_DEACTIVATED" if active else "CLUSTER_ACTIVATED")
                active = not active
            else:
                c.event("BASELINE_CHANGED")
            pending = True
        elif kind == "drain" and len(set(alive) - draining) > 1:
            node = sorted(set(alive) - draining)[step[1] % len(set(alive) - draining)]
            c.event("NODE_DRAINING", node=node)
            draining.add(node)
            pending = True
        elif kind == "join":
            alive.append(f"n{next(new_servers)}")
            c.join(alive[-1])
            pending = True
        elif kind == "client":
            c.join(f"c{next(clients)}", client=True)
            pending = True
        elif kind == "own":
            pending = report_owning(c, committed[-1], set(alive), step[1]) or pending
        elif kind == "reset":
            c.event("RESET_LOST_PARTITIONS", group=f"g{step[1] % len(spec)}")
            pending = True
        elif kind == "cache":
            group = f"g{step[1] % len(spec)}"
            c.event("CACHE_STOPPED" if group in running else "CACHE_STARTED", group=group)
            running ^= {group}
            pending = True
        elif kind == "twin" or (kind == "twin_fail" and len(alive) > 1):
            fail = None
            if kind == "twin_fail":
                fail = alive.pop(step[1] % len(alive))
            twin(c, committed, fail_node=fail, at_wave=step[2] if fail else None)
            pending = False
        if pending and (exchange_after or i == len(steps) - 1):
            run(c, committed)
            pending = False
    if not active:  # an inactive cluster moves no data: activate it before asking the twin to converge
        c.event("CLUSTER_ACTIVATED")
        run(c, committed)
    # no more events: the twin converges (unless partitions are lost: they wait for a reset)
    result = twin(c, committed, until_stable=True)
    status = result.stability
    assert status is not None and (status.stable or status.lost_partitions > 0), (
        f"the twin did not converge: {status}; rounds {result.rounds}")
    check_committed_versions(c, spec)


def twin(c: Cluster, committed: list[Version], **kwargs: Any) -> Any:
    """Run the twin; record the versions its exchanges commit."""
    result = c.twin(**kwargs)
    for r in result.rounds:
        note(f"twin round on {r.version}: copies={r.copies} drops={r.drops} failed={r.failed_node}")
        committed.extend((s.topology_major, s.topology_minor) for s in r.exchanges)
    return result


def run(c: Cluster, committed: list[Version]) -> None:
    """Run the exchange; after the first version, also check it against a full recomputation (below)."""
    reference = Path(f"{c.settings.storage.warehouse}-full{next(_example)}")
    if committed:
        shutil.copytree(c.settings.storage.warehouse, reference)
    summaries = c.exchange()
    if committed:
        check_same_as_full_recomputation(c, reference, summaries)
    for s in summaries:
        note(f"exchange {s.exchange_id}: {s.topology_major}.{s.topology_minor} {s.exchange_type} "
             f"events={s.merged_event_seqs} lost={s.lost_partitions} moving={s.moving_copies} "
             f"temporary={s.temporary_primaries}")
        committed.append((s.topology_major, s.topology_minor))


def check_same_as_full_recomputation(c: Cluster, reference: Path, summaries: list[Any]) -> None:
    """The versions just committed (settled partitions carried over, decided on the driver) equal a run that
    recomputes every partition in Spark.

    ``reference`` is a copy of the warehouse taken before the run; the same exchange runs there with
    ``carry_settled=False`` and the kernel in Spark, and every versioned table must have exactly the same rows at
    every new version.
    """
    full = Cluster.create(c.spark, reference)
    full.warehouse.driver_replicas = 0  # this warehouse's exchanges in Spark
    full_summaries = full.exchange(carry_settled=False)
    counts = ("exchange_type", "topology_major", "topology_minor", "partitions", "lost_partitions",
              "moving_copies", "temporary_primaries", "counter_conflicts", "migrations", "bytes_to_move")
    assert [[getattr(s, n) for n in counts] for s in summaries] == [
        [getattr(s, n) for n in counts] for s in full_summaries
    ]
    for s in summaries:
        version = (s.topology_major, s.topology_minor)
        for name in VERSIONED_TABLES:
            carried, recomputed = table_rows(c, name, version), table_rows(full, name, version)
            assert carried == recomputed, (
                f"{name} at {version}: only carried {sorted(carried - recomputed)[:10]}, "
                f"only recomputed {sorted(recomputed - carried)[:10]}"
            )
    shutil.rmtree(reference, ignore_errors=True)


def table_rows(c: Cluster, name: str, version: Version) -> set[tuple[Any, ...]]:
    """Rows of a table at a version, hashable (arrays as tuples, maps as sorted item tuples)."""
    def frozen(value: Any) -> Any:
        if isinstance(value, list):
            return tuple(frozen(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, frozen(v)) for k, v in value.items()))
        return value

    return {tuple(frozen(v) for v in row) for row in c.table(name, version).collect()}


def report_owning(c: Cluster, version: Version, alive: set[str], mask: int) -> bool:
    """MOVING copies of the committed map on alive servers report OWNING at their partition's max OWNING counter.

    Returns whether anything was reported.
    """
    rows = c.table("partition_map", version).collect()
    best: dict[Part, tuple[int, int]] = {}
    for r in rows:
        if r.state == "OWNING":
            key = (r.group_name, r.partition_id)
            best[key] = max(best.get(key, (-1, 0)), (r.update_counter, r.size))
    moving = sorted(
        (r.node_id, r.group_name, r.partition_id) for r in rows
        if r.state == "MOVING" and r.node_id in alive and (r.group_name, r.partition_id) in best
    )
    chosen = [m for i, m in enumerate(moving) if mask == 0 or mask >> (i % 8) & 1]
    note(f"own at {version}: {chosen}")
    if chosen:
        c.report([(n, g, p, "OWNING", *best[(g, p)], None) for n, g, p in chosen])
    return bool(chosen)


def by_version(c: Cluster, name: str) -> dict[Version, list[Any]]:
    out: dict[Version, list[Any]] = defaultdict(list)
    for r in c.warehouse.read(name).collect():
        out[(r.topology_major, r.topology_minor)].append(r)
    return out


def duplicates(rows: Iterable[Any], *key: str) -> list[Any]:
    groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in key)].append(r)
    return [r for rs in groups.values() if len(rs) > 1 for r in rs]


def check_committed_versions(c: Cluster, spec: dict[str, tuple[int, int, str | None]]) -> None:
    exchanges = sorted(c.warehouse.read("exchanges").collect(), key=lambda r: r.exchange_id)
    tables = {name: by_version(c, name) for name in (
        "topology", "ideal_assignment", "affinity_assignment", "partition_map", "lost_partitions", "client_affinity")}
    reports = c.warehouse.read("partition_reports").collect()
    plans = by_version(c, "migration_plan")
    resets = {r.event_seq: r.group_name for r in c.warehouse.read("topology_events").collect()
              if r.event_type == "RESET_LOST_PARTITIONS"}

    # (d) versions strictly increase in commit order
    versions = [(r.topology_major, r.topology_minor) for r in exchanges]
    assert all(a < b for a, b in itertools.pairwise(versions)), f"versions by exchange_id: {exchanges}"

    prev: dict[str, Any] | None = None
    for ex in exchanges:
        v = (ex.topology_major, ex.topology_minor)
        topology, ideal, assignment, pmap, lost_rows, client = (tables[n].get(v, []) for n in (
            "topology", "ideal_assignment", "affinity_assignment", "partition_map", "lost_partitions",
            "client_affinity"))
        ctx = f"version {v} ({ex.exchange_type}, events {ex.merged_event_seqs})"
        running = {g: spec[g] for g in ex.running_groups}
        parts = [(g, p) for g, (n, _, _) in running.items() for p in range(n)]

        # (e) unique keys
        for rows, key in ((assignment, ("group_name", "partition_id", "replica_index")),
                          (pmap, ("group_name", "partition_id", "node_id")),
                          (ideal, ("group_name", "partition_id", "replica_index")),
                          (lost_rows, ("group_name", "partition_id")),
                          (client, ("mapping_id", "partition_id")),
                          (topology, ("node_id",))):
            dup = duplicates(rows, *key)
            assert not dup, f"{ctx}: duplicate {key} rows: {dup}"

        servers = {r.node_id for r in topology if not r.is_client}
        stray = [r for r in [*pmap, *assignment] if r.node_id not in servers]
        assert not stray, f"{ctx}: rows on nodes that are not alive servers {sorted(servers)}: {stray}"

        candidates = servers - set(ex.draining_nodes or [])  # draining servers serve but leave the placement
        if ex.cluster_active is False:
            assert not plans.get(v), f"{ctx}: an inactive cluster planned data movement: {plans.get(v)}"
        expected_ideal = {
            (g, p, i, node)
            for g, (n, backups, _) in running.items()
            for p, nodes in enumerate(assign(NodeSet.of(sorted(candidates)), n, backups))
            for i, node in enumerate(nodes)
        }
        actual_ideal = {(r.group_name, r.partition_id, r.replica_index, r.node_id) for r in ideal}
        assert actual_ideal == expected_ideal, (
            f"{ctx}: ideal_assignment differs from assign() over {sorted(candidates)}: "
            f"extra {sorted(actual_ideal - expected_ideal)}, missing {sorted(expected_ideal - actual_ideal)}")
        ideal_nodes: dict[Part, list[str]] = defaultdict(list)
        for g, p, _, node in sorted(expected_ideal):
            ideal_nodes[(g, p)].append(node)

        copies: dict[Part, dict[str, Any]] = defaultdict(dict)
        for r in pmap:
            copies[(r.group_name, r.partition_id)][r.node_id] = r
        owners = {k: {n for n, r in cs.items() if r.state == "OWNING"} for k, cs in copies.items()}
        replicas: dict[Part, list[Any]] = defaultdict(list)
        for r in sorted(assignment, key=lambda r: r.replica_index):
            replicas[(r.group_name, r.partition_id)].append(r)

        if prev is None:  # steady start
            first = {(r.group_name, r.partition_id, r.replica_index, r.node_id, r.is_temporary) for r in assignment}
            assert first == {(*k, False) for k in expected_ideal}, f"{ctx}: first assignment not ideal: {assignment}"
            assert all(r.state == "OWNING" for r in pmap), f"{ctx}: first map not all OWNING: {pmap}"

        # (a) an owned partition has one primary, and the primary owns
        for key in parts:
            if not owners.get(key):
                continue
            primaries = [r for r in replicas[key] if r.replica_index == 0]
            assert len(primaries) == 1, f"{ctx}: {key} is owned by {sorted(owners[key])} but has primaries " \
                                        f"{primaries}; map {list(copies[key].values())}"
            assert primaries[0].node_id in owners[key], (
                f"{ctx}: {key} primary {primaries[0].node_id} does not own; map {list(copies[key].values())}, "
                f"assignment {replicas[key]}")

        # (b) lost partitions
        listed = {(r.group_name, r.partition_id): r for r in lost_rows}
        assert set(listed) <= set(parts), f"{ctx}: lost rows outside running partitions: {lost_rows}"
        for key in parts:
            policy = running[key[0]][2]
            if policy in SAFE:
                assert (key in listed) == (not owners.get(key)), (
                    f"{ctx}: {key} ({policy}) listed={key in listed} but owners={sorted(owners.get(key, ()))}; "
                    f"map {list(copies[key].values())}; lost row {listed.get(key)}")
            else:
                assert owners.get(key), f"{ctx}: IGNORE {key} has no owner: {list(copies[key].values())}"
        consumed_from = prev["max_report_seq"] if prev else None
        consumed = [r for r in reports if (consumed_from is None or r.report_seq > consumed_from)
                    and (ex.max_report_seq is not None and r.report_seq <= ex.max_report_seq)]
        if prev is None:
            assert not listed, f"{ctx}: lost partitions at the first version: {lost_rows}"
        else:
            reset_groups = {resets[s] for s in ex.merged_event_seqs if s in resets}
            reported = {(r.group_name, r.partition_id) for r in consumed
                        if r.state == "OWNING" and r.node_id in servers}
            newly = {k for k in parts if prev["owners"].get(k) and not prev["owners"][k] & servers
                     and k not in reported}
            # SPEC: an IGNORE loss is listed only in the version where it was lost, never sticky
            expected = {k for k in prev["listed"] if k[0] not in reset_groups and k in parts
                        and running[k[0]][2] != "IGNORE"} | newly
            assert set(listed) == expected, (
                f"{ctx}: lost {sorted(listed)}, expected {sorted(expected)} (previous {sorted(prev['listed'])}, "
                f"newly lost {sorted(newly)}, reset {sorted(reset_groups)}); rows: "
                + "; ".join(f"{k}: {list(copies[k].values())}" for k in sorted(set(listed) ^ expected)))
            for key in set(listed) - set(prev["listed"]):
                if running[key[0]][2] == "IGNORE":
                    bad = [n for n in ideal_nodes[key] if n not in copies[key]
                           or copies[key][n].state != "OWNING" or copies[key][n].update_counter != 0]
                    assert not bad, f"{ctx}: newly lost IGNORE {key} not recreated empty on ideal nodes {bad}: " \
                                    f"{list(copies[key].values())}"

        # consumed OWNING reports from alive servers show in the map
        latest: dict[tuple[str, str, int], Any] = {}
        for r in sorted(consumed, key=lambda r: r.report_seq):
            latest[(r.node_id, r.group_name, r.partition_id)] = r
        for (node, g, p), r in latest.items():
            if r.state == "OWNING" and node in servers and g in running:
                copy = copies[(g, p)].get(node)
                assert copy is not None and copy.state in ("OWNING", "RENTING"), (
                    f"{ctx}: consumed report {r} (max_report_seq {consumed_from} -> {ex.max_report_seq}) "
                    f"but the map has {copy}; partition map {list(copies[(g, p)].values())}")

        # (c) client routing follows the late assignment
        routed: dict[Part, list[Any]] = defaultdict(list)
        for r in client:
            for g in r.group_names:
                routed[(g, r.partition_id)].append(r)
        expected_routes = {k: (rs[0].node_id, [r.node_id for r in rs[1:]])
                           for k, rs in replicas.items() if rs and rs[0].replica_index == 0}
        actual_routes = {k: (rs[0].primary_node, list(rs[0].backup_nodes or [])) for k, rs in routed.items()}
        assert all(len(rs) == 1 for rs in routed.values()), f"{ctx}: a partition routed twice: {client}"
        assert actual_routes == expected_routes, (
            f"{ctx}: client routes differ from affinity_assignment: "
            + "; ".join(f"{k}: client {actual_routes.get(k)} vs assignment {replicas.get(k)}"
                        for k in sorted(set(actual_routes) | set(expected_routes))
                        if actual_routes.get(k) != expected_routes.get(k)))

        # (f) the migration plan (issue: migration plans)
        if ex.cluster_active is not False:  # an inactive version's plan is empty (checked above)
            check_plan(ctx, plans.get(v, []), owners, ideal_nodes, copies,
                       cap=c.settings.migration.max_parallel_per_node)

        prev = {"owners": owners, "listed": set(listed), "max_report_seq": ex.max_report_seq}


def check_plan(ctx: str, plan: list[Any], owners: dict[Part, set[str]], ideal_nodes: dict[Part, list[str]],
               copies: dict[Part, dict[str, Any]], cap: int) -> None:
    """Plan invariants: only data-bearing partitions; steps 1..n; applying them in order never lowers the OWNING
    copies below min(current, target) and ends with exactly the ideal nodes holding the data; a partition's steps
    never overlap in time; no node runs more than ``cap`` steps at any instant."""
    steps: dict[Part, list[Any]] = defaultdict(list)
    for r in plan:
        steps[(r.group_name, r.partition_id)].append(r)
    for key, rows in steps.items():
        rows.sort(key=lambda r: r.step)
        current = set(owners.get(key, ()))
        where = f"{ctx}: {key} plan {[(r.step, r.action, r.source_node, r.target_node) for r in rows]}, " \
                f"map {list(copies.get(key, {}).values())}, ideal {ideal_nodes.get(key)}"
        assert current, f"{where}: a partition without an owner has steps"
        assert [r.step for r in rows] == list(range(1, len(rows) + 1)), f"{where}: steps not 1..n"
        floor = min(len(current), len(ideal_nodes[key]))
        for r in rows:
            if r.action == "COPY":
                assert r.source_node in current, f"{where}: COPY from a non-owner {r.source_node}"
                current.add(r.target_node)
            elif r.action == "DROP":
                current.discard(r.source_node)
            assert len(current) >= floor, f"{where}: owners fall to {sorted(current)} below {floor} at step {r.step}"
        for a, b in itertools.pairwise(rows):
            assert b.est_start_s >= a.est_end_s - 1e-9, f"{where}: step {b.step} starts before step {a.step} ends"
        assert current == set(ideal_nodes[key]), f"{where}: applying the plan leaves owners {sorted(current)}"
    for key, nodes in ideal_nodes.items():
        if owners.get(key) and not steps.get(key):
            surplus = set(copies.get(key, {})) - set(nodes)
            assert owners[key] >= set(nodes) and not surplus, f"{ctx}: {key} needs moves but has no plan"
    for r in plan:
        touched = {n for n in (r.source_node, r.target_node) if n}
        for node in touched:
            running = [o for o in plan if node in (o.source_node, o.target_node)
                       and o.est_start_s <= r.est_start_s + 1e-9 < o.est_end_s]
            assert len(running) <= cap, f"{ctx}: {node} runs {len(running)} steps at {r.est_start_s}: {running}"
