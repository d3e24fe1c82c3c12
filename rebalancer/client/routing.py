"""Partition-aware client routing (Ignite IEP-23) from an exported ``rebalancer-routing-v1`` map, without Spark.

A client loads the JSON document that ``rebalancer export-affinity --out FILE`` writes (docs/ROUTING.md), maps a
key to its partition with the group's partitioner (:func:`rebalancer.affinity.partitioners.partition_of`, the same
exact code the engine uses) and sends the request to that partition's primary. The map is a snapshot of one
topology version: when a server reports a newer version (:meth:`RoutingMap.is_newer`), the client re-exports or
re-loads the map; until then a request that lands on a node that is no longer primary is simply forwarded by the
server, as in Ignite.

Imports only the standard library and the partitioners (NumPy, mmh3); never pyspark.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rebalancer.affinity.partitioners import PARTITIONERS, IntType, partition_of

__all__ = [
    "ROUTING_FORMAT",
    "GroupRoute",
    "NoRouteError",
    "RoutingFormatError",
    "RoutingMap",
    "UnknownGroupError",
]

#: The only document format this client reads (the ``format`` field).
ROUTING_FORMAT = "rebalancer-routing-v1"
_MAX_PARTITIONS = 65536


class RoutingFormatError(ValueError):
    """The document is not a valid ``rebalancer-routing-v1`` routing map (the message says which field and why)."""


class UnknownGroupError(KeyError):
    """A cache group the routing map does not route; the message lists the known groups."""

    def __init__(self, group: str, known: Sequence[str]) -> None:
        self.group = group
        self.known = tuple(known)
        super().__init__(group)

    def __str__(self) -> str:
        listed = ", ".join(self.known) if self.known else "(none)"
        return f"unknown cache group {self.group!r}; the routing map knows: {listed}"


class NoRouteError(LookupError):
    """No node serves the partition (the exported node list is empty, e.g. a lost partition with no copy)."""


@dataclass(frozen=True)
class GroupRoute:
    """One shared mapping: its id, the groups that use it, the key partitioner and every partition's nodes."""

    mapping_id: int
    group_names: tuple[str, ...]
    partitions: int
    partitioner: str
    nodes: tuple[tuple[str, ...], ...]


def _fail(where: str, problem: str) -> RoutingFormatError:
    return RoutingFormatError(f"{where}: {problem}")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"expected an integer, got {value!r}")
    return value


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, f"expected a list of strings, got {value!r}")
    return tuple(value)


def _parse_mapping(raw: Any, where: str) -> GroupRoute:
    if not isinstance(raw, Mapping):
        raise _fail(where, f"expected an object, got {type(raw).__name__}")
    for key in ("mapping_id", "group_names", "partitions", "partitioner", "nodes"):
        if key not in raw:
            raise _fail(where, f"missing field {key!r}")
    mapping_id = _int(raw["mapping_id"], f"{where}.mapping_id")
    names = _str_list(raw["group_names"], f"{where}.group_names")
    if not names:
        raise _fail(f"{where}.group_names", "must name at least one group")
    partitions = _int(raw["partitions"], f"{where}.partitions")
    if not 1 <= partitions <= _MAX_PARTITIONS:
        raise _fail(f"{where}.partitions", f"expected 1..{_MAX_PARTITIONS}, got {partitions}")
    partitioner = raw["partitioner"]
    if partitioner not in PARTITIONERS:
        raise _fail(f"{where}.partitioner", f"expected one of {list(PARTITIONERS)}, got {partitioner!r}")
    nodes = raw["nodes"]
    if not isinstance(nodes, list) or len(nodes) != partitions:
        got = len(nodes) if isinstance(nodes, list) else type(nodes).__name__
        raise _fail(f"{where}.nodes", f"expected one node list per partition ({partitions}), got {got}")
    lists = tuple(_str_list(n, f"{where}.nodes[{p}]") for p, n in enumerate(nodes))
    return GroupRoute(mapping_id, names, partitions, str(partitioner), lists)


class RoutingMap:
    """An immutable routing snapshot of one topology version: group -> (partitioner, per-partition nodes).

    Build it with :meth:`load` or :meth:`from_dict`; the constructor takes already parsed parts.
    """

    def __init__(self, version: tuple[int, int], routes: Sequence[GroupRoute]) -> None:
        """Index ``routes`` by group name.

        Args:
            version: ``(topology_major, topology_minor)`` of the map.
            routes: the mappings; each group must appear in exactly one.

        Raises:
            RoutingFormatError: a group appears in two mappings, or two mappings share an id.
        """
        self._version = (int(version[0]), int(version[1]))
        self._routes = tuple(sorted(routes, key=lambda r: r.mapping_id))
        self._by_group: dict[str, GroupRoute] = {}
        seen_ids: set[int] = set()
        for route in self._routes:
            if route.mapping_id in seen_ids:
                raise _fail("mappings", f"mapping_id {route.mapping_id} appears twice")
            seen_ids.add(route.mapping_id)
            for name in route.group_names:
                other = self._by_group.get(name)
                if other is not None:
                    raise _fail("mappings", f"group {name!r} is in mappings {other.mapping_id} and {route.mapping_id}")
                self._by_group[name] = route

    # ---- construction ----

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RoutingMap:
        """Parse and validate a ``rebalancer-routing-v1`` document (unknown extra fields are ignored).

        Args:
            doc: the decoded JSON object.

        Returns:
            The routing map.

        Raises:
            RoutingFormatError: wrong ``format`` string, a missing or mistyped field, a partition count outside
                1..65536, an unknown partitioner, a ``nodes`` list whose length is not ``partitions``, or a group
                in two mappings.
        """
        if not isinstance(doc, Mapping):
            raise _fail("document", f"expected a JSON object, got {type(doc).__name__}")
        fmt = doc.get("format")
        if fmt != ROUTING_FORMAT:
            raise _fail("format", f"expected {ROUTING_FORMAT!r}, got {fmt!r}")
        major = _int(doc.get("topology_major"), "topology_major")
        minor = _int(doc.get("topology_minor"), "topology_minor")
        raw_mappings = doc.get("mappings")
        if not isinstance(raw_mappings, list):
            raise _fail("mappings", f"expected a list, got {raw_mappings!r}")
        routes = [_parse_mapping(m, f"mappings[{i}]") for i, m in enumerate(raw_mappings)]
        return cls((major, minor), routes)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RoutingMap:
        """Read a routing map from a JSON file written by ``export-affinity``.

        Raises:
            OSError: the file cannot be read.
            RoutingFormatError: the file is not JSON or not a valid ``rebalancer-routing-v1`` document.
        """
        with open(path, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as exc:
                raise _fail(str(path), f"not valid JSON ({exc})") from exc
        return cls.from_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        """The map as a ``rebalancer-routing-v1`` document (``from_dict(m.to_dict())`` round-trips)."""
        return {
            "format": ROUTING_FORMAT,
            "topology_major": self._version[0],
            "topology_minor": self._version[1],
            "mappings": [
                {
                    "mapping_id": r.mapping_id,
                    "group_names": list(r.group_names),
                    "partitions": r.partitions,
                    "partitioner": r.partitioner,
                    "nodes": [list(n) for n in r.nodes],
                }
                for r in self._routes
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` to ``path`` as JSON (UTF-8)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    # ---- queries ----

    @property
    def version(self) -> tuple[int, int]:
        """``(topology_major, topology_minor)`` of the snapshot."""
        return self._version

    def is_newer(self, major: int, minor: int) -> bool:
        """Whether a version a server reports is newer than this map's, i.e. the client should refresh.

        Versions order by major, then minor (Ignite's ``AffinityTopologyVersion``).
        """
        return (int(major), int(minor)) > self._version

    def groups(self) -> list[str]:
        """The routed cache group names, sorted."""
        return sorted(self._by_group)

    def route(self, group: str) -> GroupRoute:
        """The mapping that routes ``group``.

        Raises:
            UnknownGroupError: ``group`` is not in the map (a ``KeyError``; the message lists the known groups).
        """
        try:
            return self._by_group[group]
        except KeyError:
            raise UnknownGroupError(group, self.groups()) from None

    def partition(self, group: str, key: Any, *, int_type: IntType = "auto") -> int:
        """The partition of ``key`` in ``group``, with the group's partitioner (SPEC 4 "Key -> partition").

        Args:
            group: cache group name.
            key: ``str``, ``int``, ``bytes`` or ``uuid.UUID``.
            int_type: the Java type of an ``int`` key for the ``ignite`` / ``hazelcast`` partitioners:
                ``"auto"`` (Integer when it fits in 32 bits, else Long), ``"int"`` or ``"long"``.

        Raises:
            UnknownGroupError: ``group`` is not in the map.
            TypeError, ValueError: the partitioner does not accept ``key`` (see ``partition_of``).
        """
        route = self.route(group)
        return partition_of(key, route.partitions, route.partitioner, int_type=int_type)

    def partition_nodes(self, group: str, partition_id: int) -> list[str]:
        """The nodes serving ``partition_id`` of ``group``, primary first (``[]`` when no node serves it).

        Raises:
            UnknownGroupError: ``group`` is not in the map.
            IndexError: ``partition_id`` is outside ``0..partitions-1``.
        """
        route = self.route(group)
        if not 0 <= partition_id < route.partitions:
            raise IndexError(f"group {group!r} has partitions 0..{route.partitions - 1}, got {partition_id}")
        return list(route.nodes[partition_id])

    def nodes(self, group: str, key: Any, *, int_type: IntType = "auto") -> list[str]:
        """The nodes serving ``key`` in ``group``: the primary first, then the backups in replica order.

        ``int_type`` as in :meth:`partition`; ``[]`` when no node serves the key's partition.

        Raises:
            UnknownGroupError: ``group`` is not in the map.
        """
        return self.partition_nodes(group, self.partition(group, key, int_type=int_type))

    def primary(self, group: str, key: Any, *, int_type: IntType = "auto") -> str:
        """The node to send ``key``'s requests to in ``group`` (the serving primary, temporary or not).

        ``int_type`` as in :meth:`partition`.

        Raises:
            UnknownGroupError: ``group`` is not in the map.
            NoRouteError: no node serves the key's partition.
        """
        partition_id = self.partition(group, key, int_type=int_type)
        nodes = self.partition_nodes(group, partition_id)
        if not nodes:
            raise NoRouteError(f"no node serves partition {partition_id} of group {group!r} at {self._version}")
        return nodes[0]

    def __repr__(self) -> str:
        return f"RoutingMap(version={self._version}, mappings={len(self._routes)}, groups={len(self._by_group)})"
