"""Real Ignite 2.x exchanges against ``rebalancer exchange``, version by version (docs/INTEROP.md).

Each scenario of tests/interop/ignite_scenarios.py runs on real Ignite (one JVM, loopback), then step by step
through rebalancer (tests/interop/ignite_replay.py). At every step both sides' topology versions and exchange
kinds must agree, and for every cache the ideal assignment (bit for bit), the serving assignment, the temporary
primaries, the MOVING copies, the lost partitions and what the loss policy allows. The differences found are
pinned here with their reasons (docs/INTEROP.md, "Differences"): a change on either side fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.interop import harness
from tests.interop.ignite_replay import StepResult, ignite_at, ours_at, replay, temporary_of
from tests.interop.ignite_scenarios import JOIN_FAIL_LEAVE, LOSS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(harness.missing_tools() is not None, reason=str(harness.missing_tools())),
]

# Ignite's message -> rebalancer's exchange type, per harness op
KIND = {("start", None): "ALL", ("client", None): "NONE", ("kill", None): "ALL", ("stop", None): "ALL",
        ("start_cache", "DynamicCacheChangeBatch"): "CACHE_CHANGE",
        ("stop_cache", "DynamicCacheChangeBatch"): "CACHE_CHANGE",
        ("reset_lost", "DynamicCacheChangeBatch"): "RESET_LOST",
        ("rebalance", "CacheAffinityChangeMessage"): "LATE_AFFINITY_SWITCH"}


def _run(spark: Any, tmp: Path, script: dict[str, Any]) -> tuple[dict[str, Any], list[StepResult]]:
    run = harness.run_ignite(script, tmp / "jvm")
    return run, replay(spark, tmp / "warehouse", script, run)


@pytest.fixture(scope="session")
def join_fail_leave(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[StepResult]]:
    return _run(spark, Path(tmp_path_factory.mktemp("join-fail-leave")), JOIN_FAIL_LEAVE)


@pytest.fixture(scope="session")
def loss(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[StepResult]]:
    return _run(spark, Path(tmp_path_factory.mktemp("loss")), LOSS)


def expected_versions(run: dict[str, Any]) -> list[list[tuple[tuple[int, int], str]]]:
    """Ignite's exchanges per step as rebalancer must commit them.

    Difference 1 (intended): Ignite also switches late affinity for its internal REPLICATED ``ignite-sys-cache``
    after a server join (a ``CacheAffinityChangeMessage`` minor version outside any ``rebalance`` step); rebalancer
    has no such cache, so those versions are dropped and the later minors of the same major renumbered.
    """
    out: list[list[tuple[tuple[int, int], str]]] = []
    minor_shift: dict[int, int] = {}
    for step in run["steps"]:
        op = step["step"]["op"]
        kept = []
        for e in step.get("exchanges", []):
            major, minor = e["result"]
            if e.get("message") == "CacheAffinityChangeMessage" and op != "rebalance":
                assert op == "start", f"a system-cache switch outside a server join: {step['step']}"
                minor_shift[major] = minor_shift.get(major, 0) + 1
                continue
            kept.append(((major, minor - minor_shift.get(major, 0)), KIND[(op, e.get("message"))]))
        out.append(kept)
    return out


def _check(run: dict[str, Any], ours: list[StepResult], script: dict[str, Any]) -> dict[str, int]:
    """Every comparison of every step; returns how many of each were made."""
    warehouse = run["warehouse"]
    counts = {"versions": 0, "ideal": 0, "assignment": 0, "temporary": 0, "moving": 0, "lost": 0, "access": 0}
    expected = expected_versions(run)
    evicting: dict[str, set[tuple[str, int]]] = {}
    for k, (step, mine) in enumerate(zip(run["steps"], ours, strict=True)):
        where = f"step {k} {step['step']}"
        assert list(zip(mine.versions, mine.exchange_types, strict=True)) == expected[k], where
        counts["versions"] += len(mine.versions)
        if not mine.versions:
            continue
        lost_at_kill = {}
        for cache, spec in script["caches"].items():
            real = ignite_at(step, cache)
            if real["affinity"] is None:
                continue
            o = ours_at(warehouse, cache, mine.versions[-1], spec["partitions"])
            ideal, serving = real["affinity"]["ideal"], real["affinity"]["assignment"]
            assert o["ideal"] == ideal, f"{where} {cache}: ideal assignment"
            assert o["assignment"] == serving, f"{where} {cache}: serving assignment"
            assert o["temporary"] == temporary_of(ideal, serving), f"{where} {cache}: temporary primaries"
            real_moving = {c for c, s in real["states"].items() if s == "MOVING"}
            assert {c for c, s in o["states"].items() if s == "MOVING"} == real_moving, f"{where} {cache}: MOVING"
            # Difference 2 (intended): after a switch Ignite evicts surplus copies by itself (the harness waits for
            # it); rebalancer marks them RENTING until the node reports EVICTED, and applies those reports at the
            # next exchange that reads reports (a client-only NONE exchange copies the previous version's map).
            renting = {c for c, s in o["states"].items() if s == "RENTING"}
            if step["step"]["op"] == "rebalance":
                before = ignite_at(run["steps"][k - 1], cache)["states"]
                evicting[cache] = {c for c in before if c not in real["states"]}
            elif mine.exchange_types != ["NONE"]:
                evicting[cache] = set()
            assert renting == evicting.get(cache, set()), f"{where} {cache}: RENTING"
            lost_real, lost_ours = list(real["lost"]), o["lost"]
            if spec.get("loss_policy") == "IGNORE":
                # Difference 3: Ignite keeps no lost state under IGNORE (lostPartitions() is empty). SPEC lists the
                # partitions in the version of the loss only; rebalancer lists them at every later version too,
                # until a reset (EXCHANGE.md): needs a fix in the exchange (docs/INTEROP.md).
                assert lost_real == []
                lost_at_kill.setdefault(cache, lost_ours)
                counts["lost"] += 1
                continue
            assert lost_ours == lost_real, f"{where} {cache}: lost partitions"
            counts["lost"] += 1
            access = step.get("access", {}).get(cache)
            if access is not None:
                flags = {(r.read_allowed, r.write_allowed) for r in _lost_rows(warehouse, cache, mine.versions[-1])}
                assert flags == {(access["lost_read"], access["lost_write"])}, f"{where} {cache}: lost access"
                blocked = spec.get("loss_policy") == "READ_ONLY_SAFE"
                assert access["other_write"] is not blocked, f"{where} {cache}: writes to the group"
                counts["access"] += 1
            counts["ideal"] += 1
            counts["assignment"] += 1
            counts["temporary"] += len(o["temporary"])
            counts["moving"] += len(real_moving)
    return counts


def _lost_rows(warehouse: Any, cache: str, version: tuple[int, int]) -> list[Any]:
    from pyspark.sql import functions as F

    at = (F.col("topology_major") == version[0]) & (F.col("topology_minor") == version[1])
    df = warehouse.read("lost_partitions").where(at & (F.col("group_name") == cache))
    return df.collect()


def test_join_client_crash_leave_agree_version_by_version(join_fail_leave: Any) -> None:
    run, ours = join_fail_leave
    counts = _check(run, ours, JOIN_FAIL_LEAVE)
    assert counts["temporary"] > 0 and counts["moving"] > 0, counts  # the scenario exercised late affinity
    last = run["steps"][-1]["affinity"]["c1"][-1]
    assert last["assignment"] == last["ideal"], "Ignite did not end stable"
    assert ours[-1].exchange_types == ["LATE_AFFINITY_SWITCH"]


def test_loss_policies_and_reset_agree_version_by_version(loss: Any) -> None:
    run, ours = loss
    counts = _check(run, ours, LOSS)
    assert counts["access"] >= 3, counts
    warehouse = run["warehouse"]
    kill = next(i for i, s in enumerate(run["steps"]) if s["step"]["op"] == "kill")
    lost_ign = ours_at(warehouse, "ign", ours[kill].versions[-1], 16)["lost"]
    assert lost_ign == ignite_at(run["steps"][kill], "safe")["lost"]  # same node, same partitions
    # Difference D, pinned: IGNORE lists the loss in its version only (SPEC: never sticky); Ignite lists none at all
    assert ignite_at(run["steps"][kill], "ign")["lost"] == []
    assert lost_ign, "the kill lost partitions of ign"
    for later in ours[kill + 1:]:
        assert ours_at(warehouse, "ign", later.versions[-1], 16)["lost"] == [], later
