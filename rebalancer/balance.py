"""How even a committed placement is, and what the ``balanced`` affinity would move to even it (``rebalancer balance``,
like Ceph's ``balancer eval``; docs/AFFINITY.md).

Contract:
- :func:`evaluate` reads one committed version on the driver (Arrow reads: ``topology``, ``ideal_assignment``,
  ``partition_map``, and the ``nodes`` and ``cache_groups`` inputs) and returns a :class:`BalanceReport`; no Spark
  job. The placement evaluated is the ideal assignment (where the data is going), the bytes are those the map's
  OWNING copies hold (where the data is).
- Shares are capacity-weighted: a node's share of a total is ``total * capacity / sum(capacities)`` over the alive
  servers (capacity null = 1.0). Replicas count PARTITIONED groups only (a REPLICATED group is on every node);
  primaries count every group. A ratio is ``count / share``; the report's ratios are the maxima over nodes, so 1.0
  is perfectly even and 1.05 means the most loaded node holds 5 % more than its share.
- "What balanced would move": every running group placed by ``place_balanced`` over the same alive servers (each
  group's mode, backups, exclude_neighbors and backup filter as configured, ``affinity.balanced_spread``),
  continuing from the current ideal as an exchange would (docs/AFFINITY.md step 9: replicas stay unless their node
  is over its cap or a node far below its share pulls them), compared with the current ideal: the copies it would
  place on a node that the current ideal does not name, and the ratios it would reach. For a cluster already on
  ``balanced`` that is 0 copies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.affinity.balanced import place_balanced
from rebalancer.affinity.ideal import previous_placement
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.groups import GroupSettings
from rebalancer.inputs import latest_version, read_as_consumed
from rebalancer.storage import Warehouse
from rebalancer.tables import version_where
from rebalancer.vocabulary import OWNING

__all__ = ["BalanceReport", "NodeBalance", "evaluate"]


@dataclass(frozen=True)
class NodeBalance:
    """One alive server's load against its capacity-weighted share."""

    node_id: str
    capacity: float
    replicas: int
    replica_share: float
    primaries: int
    primary_share: float
    bytes: int
    bytes_share: float

    @property
    def replica_ratio(self) -> float:
        return _ratio(self.replicas, self.replica_share)

    @property
    def primary_ratio(self) -> float:
        return _ratio(self.primaries, self.primary_share)

    @property
    def bytes_ratio(self) -> float:
        return _ratio(self.bytes, self.bytes_share)


@dataclass(frozen=True)
class BalanceReport:
    """The evenness of one committed version and what ``balanced`` would change (module docstring)."""

    version: tuple[int, int]
    nodes: list[NodeBalance]  # by replica ratio, most loaded first
    balanced_copies: int  # copies ``balanced`` would place on nodes the current ideal does not name
    balanced_replica_ratio: float
    balanced_primary_ratio: float

    @property
    def replica_ratio(self) -> float:
        return max((n.replica_ratio for n in self.nodes), default=0.0)

    @property
    def primary_ratio(self) -> float:
        return max((n.primary_ratio for n in self.nodes), default=0.0)

    @property
    def bytes_ratio(self) -> float:
        return max((n.bytes_ratio for n in self.nodes), default=0.0)

    @property
    def idle_servers(self) -> int:
        """Alive servers the ideal assignment gives no replica."""
        return sum(1 for n in self.nodes if n.replicas == 0 and n.primaries == 0)

    def as_dict(self) -> dict[str, object]:
        return {
            "version": f"{self.version[0]}.{self.version[1]}",
            "replica_ratio": round(self.replica_ratio, 4),
            "primary_ratio": round(self.primary_ratio, 4),
            "bytes_ratio": round(self.bytes_ratio, 4),
            "idle_servers": self.idle_servers,
            "balanced": {"copies": self.balanced_copies, "replica_ratio": round(self.balanced_replica_ratio, 4),
                         "primary_ratio": round(self.balanced_primary_ratio, 4)},
            "nodes": [{"node_id": n.node_id, "capacity": n.capacity, "replicas": n.replicas,
                       "replica_share": round(n.replica_share, 2), "primaries": n.primaries,
                       "primary_share": round(n.primary_share, 2), "bytes": n.bytes,
                       "bytes_share": round(n.bytes_share, 1)} for n in self.nodes],
        }


def _ratio(count: float, share: float) -> float:
    return count / share if share > 0 else (0.0 if count == 0 else float("inf"))


def _counts(node_ids: list[str], column: pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """Occurrences of each of ``node_ids`` in ``column``."""
    counts = {r["values"]: r["counts"] for r in pc.value_counts(column).to_pylist()}
    return np.array([counts.get(n, 0) for n in node_ids], dtype=np.int64)


def _shares(total: float, capacity: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    weight = float(capacity.sum())
    return total * capacity / weight if weight > 0 else np.zeros_like(capacity)


def _max_ratio(counts: npt.NDArray[np.int64], shares: npt.NDArray[np.float64]) -> float:
    return max((_ratio(float(c), float(s)) for c, s in zip(counts, shares, strict=True)), default=0.0)


def evaluate(warehouse: Warehouse, version: tuple[int, int] | None = None, spread: bool = True) -> BalanceReport:
    """The balance of ``version`` (default: the latest committed one).

    Raises:
        LookupError: nothing is committed yet, or ``version`` is not a committed version.
    """
    latest = latest_version(warehouse)
    if latest is None:
        raise LookupError("nothing to evaluate: no exchange has been committed yet (run `rebalancer exchange`)")
    version = version or latest
    where = version_where(version)
    topology = warehouse.read_arrow("topology", where=where)
    if topology.num_rows == 0:
        raise LookupError(f"version {version[0]}.{version[1]} is not a committed version")
    servers = sorted(r["node_id"] for r in topology.to_pylist() if not r["is_client"])
    exchange: dict[str, Any] = next(iter(warehouse.read_arrow("exchanges", where=where).to_pylist()), {})
    rows = {r["node_id"]: r for r in read_as_consumed(warehouse, "nodes", exchange).to_pylist()}
    node_set = NodeSet.from_rows([rows[n] for n in servers])
    ids = list(node_set.node_ids)
    capacity = np.array([float(rows[n].get("capacity") if rows[n].get("capacity") is not None else 1.0)
                         for n in ids])

    ideal = warehouse.read_arrow("ideal_assignment", where=where)
    group_rows = {r["group_name"]: r for r in read_as_consumed(warehouse, "cache_groups", exchange).to_pylist()}
    running = sorted(set(ideal.column("group_name").to_pylist()))
    groups = {g: GroupSettings.from_row(group_rows[g]) for g in running}
    replicated = [g for g in running if groups[g].replicated]
    partitioned = ideal.filter(pc.invert(pc.is_in(ideal.column("group_name"), pa.array(replicated, pa.string()))))
    replicas = _counts(ids, partitioned.column("node_id"))
    primaries = _counts(ids, ideal.filter(pc.equal(ideal.column("replica_index"), 0)).column("node_id"))
    copies = warehouse.read_arrow("partition_map", where=where)
    owning = copies.filter(pc.equal(copies.column("state"), OWNING))
    sums = {r["node_id"]: r["bytes_sum"] or 0 for r in owning.group_by("node_id").aggregate([("bytes", "sum")])
            .to_pylist()}
    held = np.array([sums.get(n, 0) for n in ids], dtype=np.int64)
    replica_share = _shares(float(replicas.sum()), capacity)
    primary_share = _shares(float(primaries.sum()), capacity)
    bytes_share = _shares(float(held.sum()), capacity)
    nodes = [NodeBalance(n, float(capacity[i]), int(replicas[i]), float(replica_share[i]), int(primaries[i]),
                         float(primary_share[i]), int(held[i]), float(bytes_share[i])) for i, n in enumerate(ids)]
    nodes.sort(key=lambda n: (-n.replica_ratio, -n.primary_ratio, n.node_id))

    moved, b_replicas, b_primaries = _balanced_alternative(
        node_set, [groups[g] for g in running], set(replicated), ideal, spread)
    return BalanceReport(version, nodes, moved, _max_ratio(b_replicas, replica_share),
                         _max_ratio(b_primaries, primary_share))


def _balanced_alternative(
    nodes: NodeSet, groups: Iterable[GroupSettings], replicated: set[str], ideal: pa.Table, spread: bool
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Copies ``balanced`` would add against ``ideal``, and its replicas and primaries per node."""
    width = len(nodes)
    replicas, primaries = np.zeros(width, np.int64), np.zeros(width, np.int64)
    wanted = list(groups)
    if not wanted or width == 0:
        return 0, replicas, primaries
    matrices = place_balanced(wanted, nodes, spread=spread, previous=previous_placement(ideal)).matrices
    index = {n: i for i, n in enumerate(nodes.node_ids)}
    current: set[tuple[str, int, int]] = set()
    for g, p, n in zip(ideal.column("group_name").to_pylist(), ideal.column("partition_id").to_pylist(),
                       ideal.column("node_id").to_pylist(), strict=True):
        if n in index:
            current.add((g, p, index[n]))
    moved = 0
    for g, matrix in matrices.items():
        placed = matrix >= 0
        if g not in replicated:
            replicas += np.bincount(matrix[placed], minlength=width)
        primaries += np.bincount(matrix[:, 0][matrix[:, 0] >= 0], minlength=width)
        rows, cols = np.nonzero(placed)
        moved += sum(1 for p, n in zip(rows.tolist(), matrix[rows, cols].tolist(), strict=True)
                     if (g, p, n) not in current)
    return moved, replicas, primaries
