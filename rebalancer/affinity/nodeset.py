"""The candidate nodes of an affinity function, as one immutable value shared by the engine and the client.

Contract:
- A :class:`NodeSet` lists server nodes in a fixed order; indexes into it are what the kernels return. No
  assignment depends on that order (every ranking is a total order on node properties), but
  :meth:`NodeSet.from_rows` still makes it canonical - ``node_order`` (join order; nulls last), then ``node_id`` -
  so that the Spark stage and the pure client see identical node sets.
- ``node_id`` (the consistent id) is unique and non-empty. ``capacity`` null means 1.0; capacities must be finite
  and >= 0. ``host`` and attribute values may be null; null compares equal to null everywhere in this package.
- Neighbour and backup-filter constraints only ever ask "do two nodes share a value?", so the node set reduces hosts
  and attribute tuples to small integer *classes* (equal value <=> equal class), which the NumPy kernels compare.

NumPy and the standard library only: no Spark import (``rebalancer.client`` uses this module).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["InvalidNodeSetError", "NodeSet"]

# Columns of the `nodes` table (SPEC section 2) that a node set reads; others are ignored.
NODE_COLUMNS = ("node_id", "node_uuid", "node_order", "host", "attributes", "capacity", "is_client")


class InvalidNodeSetError(ValueError):
    """The nodes handed to an affinity function break the node-set contract; the message says which node and why."""


def _row_get(row: Any, name: str) -> Any:
    """Field ``name`` of a mapping, a ``pyspark.sql.Row`` or any object with attributes; missing fields are None."""
    if isinstance(row, Mapping):
        return row.get(name)
    as_dict = getattr(row, "asDict", None)
    if callable(as_dict):  # pyspark Row: asDict() avoids relying on Row's positional/attribute quirks
        return as_dict().get(name)
    return getattr(row, name, None)


def _classes(values: Sequence[Any]) -> npt.NDArray[np.int32]:
    """Dense integer classes: equal values get equal classes (None is a value like any other)."""
    index: dict[Any, int] = {}
    return np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int32, count=len(values))


@dataclass(frozen=True)
class NodeSet:
    """Server nodes that can hold partitions.

    Attributes:
        node_ids: consistent ids, unique.
        node_uuids: runtime UUID text per node (``None`` entries allowed), or ``None`` when no node has one.
            Only the ``ignite`` affinity reads them, to break ties.
        hosts: host per node; nodes sharing a host are neighbours.
        attributes: attribute map per node (``None`` entries allowed), or ``None`` when no node has attributes.
        capacities: relative capacity per node (1.0 = standard).
        node_orders: join order per node, or ``None``; informational.
    """

    node_ids: tuple[str, ...]
    node_uuids: tuple[str | None, ...] | None = None
    hosts: tuple[str | None, ...] = ()
    attributes: tuple[Mapping[str, str | None] | None, ...] | None = None
    capacities: tuple[float, ...] = ()
    node_orders: tuple[int | None, ...] | None = None
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.node_ids)
        # Defaults that depend on n: every node on its own host, capacity 1.0.
        if not self.hosts and n:
            object.__setattr__(self, "hosts", tuple(None for _ in range(n)))
        if not self.capacities and n:
            object.__setattr__(self, "capacities", tuple(1.0 for _ in range(n)))
        for name in ("node_uuids", "hosts", "attributes", "capacities", "node_orders"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise InvalidNodeSetError(f"{name} has {len(values)} entries; expected one per node ({n})")
        seen: set[str] = set()
        for node_id in self.node_ids:
            if not isinstance(node_id, str) or not node_id:
                raise InvalidNodeSetError(f"node_id must be a non-empty string, got {node_id!r}")
            if node_id in seen:
                raise InvalidNodeSetError(f"node_id {node_id!r} appears more than once; node ids must be unique")
            seen.add(node_id)
        for node_id, cap in zip(self.node_ids, self.capacities, strict=True):
            if not isinstance(cap, float) or not math.isfinite(cap) or cap < 0:
                raise InvalidNodeSetError(f"node {node_id!r}: capacity must be a finite float >= 0, got {cap!r}")

    # ---- constructors ----
    @classmethod
    def of(
        cls,
        node_ids: Sequence[str],
        node_uuids: Sequence[str | None] | None = None,
        hosts: Sequence[str | None] | None = None,
        attributes: Sequence[Mapping[str, str | None] | None] | None = None,
        capacities: Sequence[float | None] | None = None,
        node_orders: Sequence[int | None] | None = None,
    ) -> NodeSet:
        """A node set from parallel sequences, kept in the order given.

        Args:
            node_ids: consistent ids.
            node_uuids: runtime UUIDs (entries may be None), or None.
            hosts: host per node, or None (all hosts null; null hosts are equal, so every node is then a neighbour
                of every other and ``exclude_neighbors`` falls back to the plain ranking).
            attributes: attribute map per node, or None.
            capacities: capacity per node (None entries mean 1.0), or None for all 1.0.
            node_orders: join order per node, or None.

        Returns:
            The node set.

        Raises:
            InvalidNodeSetError: lengths differ, ids are not unique, or a capacity is negative or not finite.
        """
        ids = tuple(node_ids)
        n = len(ids)
        caps = tuple(1.0 if c is None else float(c) for c in capacities) if capacities is not None else ()
        attrs = None if attributes is None else tuple(None if a is None else dict(a) for a in attributes)
        return cls(
            node_ids=ids,
            node_uuids=tuple(node_uuids) if node_uuids is not None else None,
            hosts=tuple(hosts) if hosts is not None else tuple(None for _ in range(n)),
            attributes=attrs,
            capacities=caps,
            node_orders=tuple(node_orders) if node_orders is not None else None,
        )

    @classmethod
    def from_rows(cls, rows: Iterable[Any]) -> NodeSet:
        """A node set from rows of the ``nodes`` table (mappings, ``pyspark.sql.Row`` or objects), in join order.

        Rows with ``is_client`` true are skipped (clients hold no data). The rest are ordered by ``node_order``
        (nulls last), then ``node_id``. Missing columns count as null.

        Args:
            rows: the alive nodes.

        Returns:
            The node set of the server rows.

        Raises:
            InvalidNodeSetError: see :meth:`of`.
        """
        servers = [r for r in rows if not _row_get(r, "is_client")]
        servers.sort(key=lambda r: (_row_get(r, "node_order") is None, _row_get(r, "node_order") or 0,
                                    str(_row_get(r, "node_id"))))
        uuids = [_row_get(r, "node_uuid") for r in servers]
        attrs = [_row_get(r, "attributes") for r in servers]
        orders = [_row_get(r, "node_order") for r in servers]
        return cls.of(
            node_ids=[_row_get(r, "node_id") for r in servers],
            node_uuids=uuids if any(u is not None for u in uuids) else None,
            hosts=[_row_get(r, "host") for r in servers],
            attributes=attrs if any(a is not None for a in attrs) else None,
            capacities=[_row_get(r, "capacity") for r in servers],
            node_orders=orders if any(o is not None for o in orders) else None,
        )

    # ---- derived values used by the kernels ----
    def __len__(self) -> int:
        return len(self.node_ids)

    @property
    def uniform_capacity(self) -> bool:
        """True when every capacity is exactly 1.0 (the unweighted rendezvous ranking applies)."""
        return all(c == 1.0 for c in self.capacities)

    def uuid_of(self, index: int) -> str | None:
        """The runtime UUID text of node ``index``, or None."""
        return None if self.node_uuids is None else self.node_uuids[index]

    def attribute_tuple(self, index: int, names: Sequence[str]) -> tuple[str | None, ...]:
        """Values of the attributes ``names`` on node ``index`` (None where the node lacks one)."""
        attrs = None if self.attributes is None else self.attributes[index]
        return tuple(None if attrs is None else attrs.get(name) for name in names)

    def derived(self, key: str, compute: Callable[[NodeSet], Any]) -> Any:
        """``compute(self)``, computed once per node set and key (kernels memoise node seeds and orders here).

        A node set is immutable, so anything derived from it can be reused by every batch a worker ranks.
        """
        if key not in self._cache:
            self._cache[key] = compute(self)
        return self._cache[key]

    def host_classes(self) -> npt.NDArray[np.int32]:
        """Integer class per node: equal hosts (nulls equal) <=> equal class."""
        return self.derived("hosts", lambda ns: _classes(ns.hosts))  # type: ignore[no-any-return]

    def filter_classes(self, names: Sequence[str]) -> npt.NDArray[np.int32]:
        """Integer class per node: equal values of every attribute in ``names`` (nulls equal) <=> equal class."""
        names = tuple(names)
        return self.derived(  # type: ignore[no-any-return]
            "filter:" + "\x00".join(names),
            lambda ns: _classes([ns.attribute_tuple(i, names) for i in range(len(ns))]),
        )
