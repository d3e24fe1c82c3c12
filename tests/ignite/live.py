"""Helpers for the tests against a live Ignite cluster: a warehouse collecting it, and the comparison of what the
engine committed after a collect with what Ignite itself holds at that moment (docs/IGNITE.md, "Checked against")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rebalancer.config import Settings
from rebalancer.ignite.collect import CollectResult, collect
from rebalancer.inputs import latest_version
from rebalancer.pipeline import ExchangeSummary, run_exchange
from rebalancer.storage import Warehouse, open_warehouse
from rebalancer.tables import version_where
from tests.conftest import TEST_STORAGE
from tests.ignite.cluster import CONTROL_MAIN, IgniteCluster

# Copy states the comparison reads on both sides: an EVICTED copy is gone (Ignite keeps some in its map, the
# engine drops them), every other state must agree copy by copy.
COMPARED_STATES = ("OWNING", "MOVING", "RENTING", "LOST")


def control_prefix(cluster: IgniteCluster) -> list[str]:
    """The control utility's command without ``--host``/``--port``: the collector appends its own."""
    command = cluster.control_command()
    return command[:command.index(CONTROL_MAIN) + 1]


def settings_for(cluster: IgniteCluster, folder: Path, **sections: dict[str, Any]) -> Settings:
    host, port = cluster.host_port()
    ignite = {"host": host, "port": port, "control": control_prefix(cluster), "client_timeout_s": 20.0}
    sections = {**sections, "ignite": ignite | sections.get("ignite", {})}
    return Settings().with_overrides(storage={"warehouse": str(folder), **TEST_STORAGE},
                                     **sections)


@dataclass
class Collector:
    """A warehouse that collects one live cluster and runs the exchange after each collect."""

    spark: Any
    cluster: IgniteCluster
    folder: Path
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.settings = settings_for(self.cluster, self.folder, **self.sections)
        self.warehouse: Warehouse = open_warehouse(self.spark, self.settings.storage)

    def collect(self) -> CollectResult:
        host, port = self.cluster.host_port()  # a live node: the one the settings named may be gone
        return collect(self.warehouse, self.settings.ignite, host, port)

    def exchange(self) -> list[ExchangeSummary]:
        return run_exchange(self.spark, self.warehouse, self.settings)

    def round(self) -> tuple[CollectResult, list[ExchangeSummary]]:
        collected = self.collect()
        return collected, self.exchange()


def ours(warehouse: Warehouse, group: str, partitions: int) -> dict[str, Any]:
    """The engine's newest committed version of ``group`` in the dump's shapes."""
    version = latest_version(warehouse)
    assert version is not None, "no version committed"
    where = version_where(version)

    def rows(name: str) -> list[dict[str, Any]]:
        table = warehouse.read_arrow(name, where=where).to_pylist()
        return [r for r in table if r["group_name"] == group]

    ideal: list[list[str]] = [[] for _ in range(partitions)]
    for r in sorted(rows("ideal_assignment"), key=lambda r: r["replica_index"]):
        ideal[r["partition_id"]].append(r["node_id"])
    late: list[list[str]] = [[] for _ in range(partitions)]
    for r in sorted(rows("affinity_assignment"), key=lambda r: r["replica_index"]):
        late[r["partition_id"]].append(r["node_id"])
    states = {(r["node_id"], r["partition_id"]): r["state"] for r in rows("partition_map")
              if r["state"] in COMPARED_STATES}
    lost = sorted(r["partition_id"] for r in rows("lost_partitions"))
    return {"version": version, "ideal": ideal, "late": late, "states": states, "lost": lost}


def theirs(dump: dict[str, Any], group: str) -> dict[str, Any]:
    """Ignite's own state of ``group`` in the same shapes (the harness reads it from Ignite's internals)."""
    g = dump["groups"][group]
    names = {n["name"]: n["consistent_id"] for n in dump["nodes"]}
    states = {(names.get(node, node), int(p)): state for node, parts in g["local"].items()
              for p, state, _counter, _size in parts if state in COMPARED_STATES}
    lost = sorted({int(p) for cache in g.get("caches", [group]) for p in dump.get("lost", {}).get(cache, [])})
    return {"ideal": g["ideal"], "late": g["late"], "states": states, "lost": lost}


def differences(dump: dict[str, Any], warehouse: Warehouse, groups: list[str] | None = None) -> dict[str, Any]:
    """Per group and aspect, what differs between Ignite and the engine's newest version: {} when they agree.
    Partitions are listed, not counted, so that a failure shows where."""
    out: dict[str, Any] = {}
    alive = {n["consistent_id"] for n in dump["nodes"] if n["alive"]}
    for group in groups or list(dump["groups"]):
        theirs_ = theirs(dump, group)
        ours_ = ours(warehouse, group, len(theirs_["ideal"]))
        # the engine's ideal lists name offline baseline nodes too (SPEC; docs/INTEROP.md): their alive part is
        # Ignite's ideal assignment
        ours_["ideal"] = [[n for n in nodes if n in alive] for nodes in ours_["ideal"]]
        diff: dict[str, Any] = {}
        for aspect in ("ideal", "late"):
            bad = [p for p, (a, b) in enumerate(zip(theirs_[aspect], ours_[aspect], strict=True)) if a != b]
            if bad:
                diff[aspect] = {p: (theirs_[aspect][p], ours_[aspect][p]) for p in bad[:5]} | {"count": len(bad)}
        copies = set(theirs_["states"]) | set(ours_["states"])
        bad_states = {c: (theirs_["states"].get(c), ours_["states"].get(c)) for c in sorted(copies)
                      if theirs_["states"].get(c) != ours_["states"].get(c)}
        if bad_states:
            diff["states"] = dict(list(bad_states.items())[:8]) | {"count": len(bad_states)}
        if theirs_["lost"] != ours_["lost"]:
            diff["lost"] = (theirs_["lost"], ours_["lost"])
        if diff:
            out[group] = diff
    return out
