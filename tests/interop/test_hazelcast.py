"""Real Hazelcast 5.x: key partitioning against ``partition_of(..., "hazelcast")`` and the benchmark's membership
changes against rebalancer's planner (tests/interop/hazelcast_compare.py, docs/INTEROP.md)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from rebalancer.client import partition_of
from tests.interop import harness
from tests.interop.hazelcast_compare import benchmark_script, classify, compare, data_layout

pytestmark = [
    pytest.mark.slow,  # real Hazelcast JVMs: CI runs them with `make interop-slow`, beside the slow ones
    pytest.mark.skipif(harness.missing_tools() is not None, reason=str(harness.missing_tools())),
]

PARTITIONS = 271  # Hazelcast's default; the 20,000-partition run is bench/interop_hazelcast.py


def _keys(rng: random.Random) -> dict[str, list[Any]]:
    alphabet = "abcXYZ019-_ \u00e9\u00df\u4e2d\u0416\U0001f600\U00010348"
    strings = ["", "key-1", "abcd", "\U0001f600"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(2000)
    ]
    edges = [0, 1, -1, 2**31 - 1, -(2**31)]
    ints = edges + [rng.randint(-(2**31), 2**31 - 1) for _ in range(2000)]
    longs = edges + [2**63 - 1, -(2**63), 2**32] + [rng.randint(-(2**63), 2**63 - 1) for _ in range(2000)]
    uuids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(1000)]
    return {"string": strings, "int": ints, "long": longs, "uuid": uuids}


@pytest.fixture(scope="session")
def key_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict[str, list[Any]], dict[str, list[int]]]]:
    """One JVM, two one-member clusters (271 and 1,024 partitions), the same keys through each."""
    keys = _keys(random.Random(15))
    counts = (PARTITIONS, 1024)
    script = {
        "member_partitions": {f"k{parts}": parts for parts in counts},
        "steps": [{"op": "start", "member": f"k{parts}", "layout": False} for parts in counts]
        + [{"op": "keys", "member": f"k{parts}", "layout": False, **keys} for parts in counts],
    }
    run = harness.once_per_session(tmp_path_factory.getbasetemp(), "hazelcast-keys",
                                   lambda work: harness.run_hazelcast(script, work))
    return {parts: (keys, run["steps"][len(counts) + i]["partitions_of"]) for i, parts in enumerate(counts)}


@pytest.mark.parametrize("parts", [PARTITIONS, 1024])
def test_key_partitions_equal_real_hazelcast(key_runs: dict[int, Any], parts: int) -> None:
    keys, real = key_runs[parts]
    kinds = {"string": ("auto", str), "int": ("int", int), "long": ("long", int), "uuid": ("auto", uuid.UUID)}
    for kind, (int_type, make) in kinds.items():
        mine = [partition_of(make(k), parts, "hazelcast", int_type=int_type) for k in keys[kind]]
        diffs = [(k, r, m) for k, r, m in zip(keys[kind], real[kind], mine, strict=True) if r != m]
        assert not diffs, f"{kind} keys, {parts} partitions: (key, Hazelcast, rebalancer) {diffs[:5]}"
        assert len(mine) >= 1000


@pytest.fixture(scope="session")
def migration_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    script = benchmark_script(PARTITIONS)
    run = harness.once_per_session(tmp_path_factory.getbasetemp(), "hazelcast-migrations",
                                   lambda work: harness.run_hazelcast(script, work))
    run["backups"] = script["backups"]
    return run


@pytest.mark.slow
def test_hazelcast_moves_exactly_the_data_its_own_layout_change_needs(migration_run: dict[str, Any]) -> None:
    backups = migration_run["backups"]
    steps = migration_run["steps"]
    scenarios = [i for i, s in enumerate(steps) if "scenario" in s["step"]]
    assert len(scenarios) == 3
    for i in scenarios:
        before = data_layout(steps[i - 1]["layout"], backups)
        after = data_layout(steps[i]["layout"], backups)
        members = set(steps[i]["members"])
        assert all(len(set(r)) == backups + 1 and set(r) <= members for r in after), steps[i]["step"]
        hz = classify(steps[i]["migrations"], backups)
        # the public MigrationListener reports every migration and promotion the interceptor saw
        assert steps[i]["listener_completed"] == hz["migrations"] + hz["promotions"], (steps[i]["step"], hz["kinds"])
        crashed = steps[i]["step"]["op"] == "terminate"
        alive = members | ({steps[i]["step"]["member"]} if not crashed else set())
        needed = sum(1 for p, ns in enumerate(after) for n in ns if n not in before[p] or n not in alive)
        # Hazelcast moves what its layout change needs, plus the odd repeat: at 20,000 partitions one backup was
        # once moved twice, at 271 partitions (54 needed) two were once (docs/INTEROP.md). A repeat is Hazelcast's
        # behaviour, not ours: up to 3 or 1% are tolerated, never fewer than needed.
        assert needed <= hz["data_bearing"] <= needed + max(3, needed // 100), (
            steps[i]["step"], hz["kinds"], hz["data_bearing"], needed)
        # Hazelcast fills all 7 replica slots: far more migrations than data-bearing ones
        assert hz["migrations"] + hz["promotions"] > 2 * hz["data_bearing"]


@pytest.mark.slow
def test_our_plan_of_the_same_change_is_minimal_and_not_slower(migration_run: dict[str, Any]) -> None:
    rows = compare(migration_run)
    assert [r["scenario"] for r in rows] == ["graceful shutdown 10 -> 9", "join 9 -> 10", "crash 10 -> 9"]
    for r in rows:
        ours, hz = r["ours_same_target"], r["hazelcast_plan"]
        assert ours["copies"] == r["minimum_copies_hazelcast_target"] <= r["hazelcast"]["data_bearing"], r
        assert ours["steps"] < r["hazelcast"]["migrations"] + r["hazelcast"]["promotions"], r
        assert ours["makespan_s"] <= hz["makespan_s"] + 1e-6, r
        assert r["ours_rendezvous_target"]["copies"] == r["minimum_copies_rendezvous_target"], r
