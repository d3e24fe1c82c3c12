"""The committed version an exchange continues from: its tables read once and handed down to every stage."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from rebalancer.inputs import Committed
from rebalancer.storage import Warehouse
from rebalancer.tables import version_where

__all__ = ["Previous", "key_pairs"]

#: The previous version's tables whose partitions an exchange must decide again (steps left, lost, in conflict).
UNSTABLE_TABLES = ("migration_plan", "lost_partitions", "counter_conflicts")


class Previous:
    """The committed version ``committed`` (None before the first exchange), each of its tables read at most once
    on the driver (Arrow) and once as a Spark frame, whichever stages ask: scope, placement, the kernel's input,
    the carried rows and the stamps all read the same rows. what-if keeps one for every scenario.

    Also the input tables as that version consumed them (``nodes``, ``cache_groups``: what changed since).
    """

    def __init__(self, warehouse: Warehouse, committed: Committed | None) -> None:
        self.warehouse = warehouse
        self.committed = committed
        self._arrow: dict[tuple[str, int | None], pa.Table] = {}
        self._frames: dict[str, DataFrame] = {}

    @property
    def version(self) -> tuple[int, int]:
        assert self.committed is not None, "no committed version"
        return self.committed.version

    def arrow(self, name: str) -> pa.Table:
        """The version's rows of versioned table ``name``, on the driver."""
        key = (name, None)
        if key not in self._arrow:
            self._arrow[key] = self.warehouse.read_arrow(name, where=version_where(self.version))
        return self._arrow[key]

    def frame(self, name: str) -> DataFrame:
        """The version's rows of versioned table ``name``, as a Spark frame (nothing is read until it runs)."""
        if name not in self._frames:
            self._frames[name] = self.warehouse.read(name, where=version_where(self.version))
        return self._frames[name]

    def unstable_keys(self) -> set[tuple[str, int]]:
        """The partitions the version left unstable: with plan steps, lost, or with a counter conflict."""
        keys: set[tuple[str, int]] = set()
        for name in UNSTABLE_TABLES:
            keys |= key_pairs(self.arrow(name))
        return keys

    def consumed(self, name: str) -> pa.Table | None:
        """Input table ``name`` at the Delta version the committed exchange consumed, or None where it recorded
        none."""
        assert self.committed is not None
        then = self.committed.input_versions.get(name)
        if then is None:
            return None
        key = (name, then)
        if key not in self._arrow:
            self._arrow[key] = self.warehouse.read_arrow(name, version=then)
        return self._arrow[key]

    def of_groups(self, name: str, groups: Sequence[str]) -> pa.Table:
        """:meth:`arrow` of ``groups`` only."""
        rows = self.arrow(name)
        return rows.filter(pc.is_in(rows.column("group_name"), pa.array(sorted(groups), pa.string())))


def key_pairs(t: pa.Table) -> set[tuple[str, int]]:
    """The (group_name, partition_id) pairs of an Arrow table."""
    return set(zip(t.column("group_name").to_pylist(), t.column("partition_id").to_pylist(), strict=True))


def changed_rows(old: Iterable[Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]], key: str,
                 columns: Sequence[str] | None = None) -> set[str]:
    """The keys of ``new`` whose row differs from ``old``'s in ``columns`` (every column of the new row when
    None), lists and maps compared by value; a key missing from ``old`` counts as changed."""
    before = {r[key]: r for r in old}
    out = set()
    for k, row in new.items():
        was = before.get(k)
        if was is None or any(_norm(was.get(c)) != _norm(row.get(c)) for c in (columns or row)):
            out.add(k)
    return out


def _norm(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return value
