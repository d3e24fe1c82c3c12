"""Real Apache Ignite 2.x against ``rebalancer``'s ``ignite`` affinity and ``ignite`` partitioner (no Spark).

One JVM runs two clusters on loopback (tests/interop/harness.py): first with String consistent ids, then with
``java.util.UUID`` ones (what persistent nodes generate). Each joins, fails and leaves nodes under five caches
(plain, exclNeighbors, attribute backup filter, REPLICATED, both constraints); every affinity version Ignite
computed is compared bit for bit with :func:`rebalancer.client.assign` over the alive servers of that version.
The first cluster also maps thousands of String, Integer, Long and UUID keys with ``affinity(cache).partition``
(1,024 partitions: the mask rule; 1,000: the abs rule) and every one is compared with ``partition_of``.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from rebalancer.client import assign, partition_of
from tests.interop import harness

pytestmark = [
    pytest.mark.slow,  # a real Ignite JVM: CI runs it with `make interop-slow`, beside the slow ones
    pytest.mark.skipif(harness.missing_tools() is not None, reason=str(harness.missing_tools())),
]

CACHES: dict[str, dict[str, Any]] = {
    "plain": {"partitions": 1024, "backups": 2},
    "neighbors": {"partitions": 97, "backups": 1, "exclude_neighbors": True},
    "zones": {"partitions": 128, "backups": 2, "backup_filter": ["zone"]},
    "replicated": {"partitions": 64, "backups": 0, "mode": "REPLICATED"},
    "both": {"partitions": 200, "backups": 1, "exclude_neighbors": True, "backup_filter": ["zone"]},
    "keys1024": {"partitions": 1024, "backups": 0},
    "keys1000": {"partitions": 1000, "backups": 0},
}
# "Aa" and "BB" have equal String.hashCode: a real cluster refuses the second (test below), so ties never occur.
STRING_IDS = ["node0", "Aa", "alpha-7", "zeta", "n\u00e9ud", "node5", "00000000-0000-0000-0000-00000000abcd"]
UUID_IDS = [
    "5b3e2f9a-6c1d-4e8b-a7f0-2d9c8b1a0e3f",
    "3f0d8a6c-0b1e-4a57-9f23-5d6b1c2e7a10",
    "c2a1f9e4-7d3b-4e0a-8c5f-1b2d3e4f5a6b",
    "00000000-0000-0000-0000-000000000001",
    "80000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-0000-00000000fffe",
]


def _node_specs(ids: list[str], uuid_ids: bool) -> dict[str, dict[str, Any]]:
    return {
        node: {"host": f"host{i // 2}", "attributes": {"zone": f"z{i % 3}"}, "uuid_consistent_id": uuid_ids}
        for i, node in enumerate(ids)
    }


def _keys(rng: random.Random) -> dict[str, list[Any]]:
    alphabet = "abcXYZ019-_ \u00e9\u00df\u4e2d\u0416\U0001f600\U00010348"
    strings = ["", "hello", "Aa", "BB", "\U0001f600"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(2000)
    ]
    edges32 = [0, 1, -1, 2**31 - 1, -(2**31), 65535, 65536, -65536]
    ints = edges32 + [rng.randint(-(2**31), 2**31 - 1) for _ in range(2000)]
    longs = edges32 + [2**63 - 1, -(2**63), 2**32, -(2**32)] + [rng.randint(-(2**63), 2**63 - 1) for _ in range(2000)]
    uuids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(1000)]
    return {"string": strings, "int": ints, "long": longs, "uuid": uuids}


def _script(ids: list[str], uuid_ids: bool, with_keys: bool) -> list[dict[str, Any]]:
    caches = [c for c in CACHES if with_keys or not c.startswith("keys")]
    steps: list[dict[str, Any]] = [{"op": "start", "node": n} for n in ids[:4]]
    if not uuid_ids:  # "BB".hashCode() == "Aa".hashCode(): Ignite rejects the join
        steps.append({"op": "start", "node": "BB", "expect_failure": True})
    steps += [{"op": "start_cache", "cache": c} for c in caches]
    steps += [{"op": "start", "node": n} for n in ids[4:]]
    steps += [{"op": "kill", "node": ids[1]}, {"op": "stop", "node": ids[4]}, {"op": "client", "node": "client-1"}]
    if not uuid_ids:  # two more topologies, then the cluster ends so that the second one can start
        steps += [{"op": "stop", "node": n} for n in ["client-1", ids[0], ids[2]]] + [{"op": "stop_all"}]
    return steps


@pytest.fixture(scope="session")
def ignite_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    keys = _keys(random.Random(15))
    first = _script(STRING_IDS, uuid_ids=False, with_keys=True)
    first.insert(len(CACHES) + 5, {"op": "keys", "cache": "keys1024", **keys})
    first.insert(len(CACHES) + 6, {"op": "keys", "cache": "keys1000", **keys})
    second = _script(UUID_IDS, uuid_ids=True, with_keys=False)
    script = {
        "caches": CACHES,
        "nodes": {**_node_specs(STRING_IDS, False), **_node_specs(UUID_IDS, True), "client-1": {}, "BB": {}},
        "steps": first + second,
    }
    out = harness.once_per_session(tmp_path_factory.getbasetemp(), "ignite-affinity",
                                   lambda work: harness.run_ignite(script, work))
    out["keys"] = keys
    out["string_steps"] = len(first)
    return out


def _versions(run: dict[str, Any]) -> list[tuple[int, str, dict[str, Any], list[dict[str, Any]]]]:
    """(step index, cache, affinity version row, alive server rows) for every version Ignite computed."""
    out = []
    for i, step in enumerate(run["steps"]):
        servers = [n for n in step.get("nodes", []) if not n["is_client"]]
        for cache, versions in step.get("affinity", {}).items():
            for row in versions:
                out.append((i, cache, row, servers))
    return out


def test_ideal_assignment_equals_real_ignite_at_every_version(ignite_run: dict[str, Any]) -> None:
    checked, caches_seen = 0, set()
    for i, cache, row, servers in _versions(ignite_run):
        spec = CACHES[cache]
        ours = assign(
            servers,
            spec["partitions"],
            spec["backups"],
            affinity="ignite",
            mode=spec.get("mode", "PARTITIONED"),
            exclude_neighbors=spec.get("exclude_neighbors", False),
            backup_filter=spec.get("backup_filter", ()),
            ids_as_strings=i < ignite_run["string_steps"],
        )
        for p, (real, mine) in enumerate(zip(row["ideal"], ours, strict=True)):
            assert mine == real, (
                f"step {i} {ignite_run['steps'][i]['step']} cache {cache} version {row['version']} partition {p}: "
                f"Ignite {real}, rebalancer {mine}; servers {[(n['node_id'], n['node_uuid']) for n in servers]}"
            )
        checked += 1
        caches_seen.add(cache)
    assert caches_seen == set(CACHES)
    assert checked >= 60, f"only {checked} (cache, version) pairs were compared"


def test_both_clusters_ran_with_their_id_kinds(ignite_run: dict[str, Any]) -> None:
    split = ignite_run["string_steps"]
    ids_first = {n["node_id"] for s in ignite_run["steps"][:split] for n in s.get("nodes", [])}
    ids_second = {n["node_id"] for s in ignite_run["steps"][split:] for n in s.get("nodes", [])}
    assert set(STRING_IDS) <= ids_first
    assert set(UUID_IDS) <= ids_second
    assert ignite_run["ignite_version"].startswith("2.")


def test_equal_consistent_id_hash_codes_are_refused_by_ignite(ignite_run: dict[str, Any]) -> None:
    """Ignite refuses a node whose consistent id has an existing node's hashCode; rebalancer places both (INTEROP)."""
    step = next(s for s in ignite_run["steps"] if s["step"].get("node") == "BB")
    assert "same hash code for partitioned affinity" in step["error"]
    both = assign([{"node_id": "Aa", "node_uuid": None}, {"node_id": "BB", "node_uuid": None}], 8, 1, "ignite")
    assert all(sorted(p) == ["Aa", "BB"] for p in both)


@pytest.mark.parametrize("cache", ["keys1024", "keys1000"])
def test_key_partitions_equal_real_ignite(ignite_run: dict[str, Any], cache: str) -> None:
    real = next(s["partitions_of"] for s in ignite_run["steps"] if s["step"].get("cache") == cache
                and s["step"]["op"] == "keys")
    parts = CACHES[cache]["partitions"]
    keys = ignite_run["keys"]
    kinds = {"string": ("auto", str), "int": ("int", int), "long": ("long", int), "uuid": ("auto", uuid.UUID)}
    for kind, (int_type, make) in kinds.items():
        mine = [partition_of(make(k), parts, "ignite", int_type=int_type) for k in keys[kind]]
        diffs = [(k, r, m) for k, r, m in zip(keys[kind], real[kind], mine, strict=True) if r != m]
        assert not diffs, f"{kind} keys, {parts} partitions: (key, Ignite, rebalancer) {diffs[:5]}"
        assert len(mine) >= 1000
