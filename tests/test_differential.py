"""Differential property test for the switch to the kernel: the old multi-stage path and the new pipeline.

Each example builds the same random history twice (random cluster, then failures, leaves, joins, clients,
MOVING copies reporting OWNING, resets, cache stops and starts; exchanges run after random steps) in two
warehouses, one run by the old stages (``rebalancer.exchange.legacy``), one by the pipeline, and requires
identical rows in every versioned table at every version (the SPEC columns; ``partition_map`` gains
``wal_history_counter`` in the new path and ``exchanges`` gains bookkeeping columns, so they are not compared).

Transient: it runs while both paths exist (``-m slow``); the old path goes once it has passed.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from rebalancer.affinity.assign import assign
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.exchange import legacy
from rebalancer.pipeline import VERSIONED_TABLES, run_exchange
from rebalancer.tables import OUTPUT_TABLES
from tests.exchange_scenarios import Cluster
from tests.test_exchange_properties import COUNTER, SIZE, groups_st, report_owning, table_rows

pytestmark = pytest.mark.slow

step_st = st.one_of(
    st.tuples(st.just("fail"), st.integers(0, 4), st.sampled_from(["NODE_FAILED", "NODE_LEFT"])),
    st.tuples(st.just("own"), st.integers(0, 255)),
    st.tuples(st.just("join")),
    st.tuples(st.just("client")),
    st.tuples(st.just("reset"), st.integers(0, 1)),
    st.tuples(st.just("cache"), st.integers(0, 1)),
)
steps_st = st.lists(st.tuples(step_st, st.sampled_from([False, True])), min_size=1, max_size=5)
_example = itertools.count()


def play(c: Cluster, runner: Any, servers: int, groups: list[tuple[int, int, str | None]],
         steps: list[tuple[tuple[Any, ...], bool]]) -> list[tuple[int, int]]:
    spec = {f"g{i}": g for i, g in enumerate(groups)}
    alive = [f"n{i}" for i in range(1, servers + 1)]
    for name, (partitions, backups, policy) in spec.items():
        c.group(name, partitions, backups, loss_policy=policy)
    c.join(*alive)
    c.report([(node, name, p, "OWNING", COUNTER, SIZE, None)
              for name, (partitions, backups, _) in spec.items()
              for p, nodes in enumerate(assign(NodeSet.of(alive), partitions, backups)) for node in nodes])
    versions: list[tuple[int, int]] = []

    def run() -> None:
        for s in runner(c.spark, c.warehouse, c.settings, clock=c.clock):
            versions.append((s.topology_major, s.topology_minor))

    run()
    new_servers, clients = itertools.count(servers + 1), itertools.count(1)
    running = set(spec)
    for i, (step, after) in enumerate(steps):
        kind = step[0]
        if kind == "fail" and len(alive) > 1:
            c.event(step[2], node=alive.pop(step[1] % len(alive)))
        elif kind == "join":
            alive.append(f"n{next(new_servers)}")
            c.join(alive[-1])
        elif kind == "client":
            c.join(f"c{next(clients)}", client=True)
        elif kind == "own" and versions:
            report_owning(c, versions[-1], set(alive), step[1])
        elif kind == "reset":
            c.event("RESET_LOST_PARTITIONS", group=f"g{step[1] % len(spec)}")
        elif kind == "cache":
            group = f"g{step[1] % len(spec)}"
            c.event("CACHE_STOPPED" if group in running else "CACHE_STARTED", group=group)
            running ^= {group}
        if after or i == len(steps) - 1:
            run()
    return versions


@settings(max_examples=15, deadline=None)
@given(servers=st.integers(2, 5), groups=groups_st, steps=steps_st)
def test_old_stages_and_kernel_commit_identical_rows(
    spark: Any, tmp_path: Path, servers: int, groups: list[tuple[int, int, str | None]],
    steps: list[tuple[tuple[Any, ...], bool]],
) -> None:
    k = next(_example)
    old = Cluster.create(spark, tmp_path / f"old{k}")
    new = Cluster.create(spark, tmp_path / f"new{k}")
    old_versions = play(old, legacy.run_exchange, servers, groups, steps)
    new_versions = play(new, run_exchange, servers, groups, steps)
    note(f"versions {new_versions}")
    assert old_versions == new_versions
    for version in new_versions:
        for name in VERSIONED_TABLES:
            columns = [c for c in OUTPUT_TABLES[name].fieldNames()
                       if c not in ("topology_major", "topology_minor", "wal_history_counter")]
            before = {r for r in table_rows(old, name, version)}
            after = {r for r in table_rows(new, name, version)}
            if name == "partition_map":  # compare without the new column
                before = {r[: len(columns)] for r in before}
                after = {r[: len(columns)] for r in after}
            assert before == after, (
                f"{name} at {version}: only old {sorted(before - after)[:6]}, only new {sorted(after - before)[:6]}"
            )
