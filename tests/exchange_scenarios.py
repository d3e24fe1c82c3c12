"""Helpers for exchange scenario tests: build a warehouse from hand-written rows, run exchanges, read versions."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalancer.config import Settings
from rebalancer.pipeline import ExchangeSummary, run_exchange
from rebalancer.stages import paths
from rebalancer.storage import Warehouse, open_warehouse
from rebalancer.tables import CACHE_GROUPS, NODES, PARTITION_REPORTS, TOPOLOGY_EVENTS
from tests.conftest import TEST_STORAGE

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Cluster:
    """A warehouse under test with helpers named after what a cluster does."""

    spark: SparkSession
    warehouse: Warehouse
    settings: Settings
    _seq: int = 0
    _report_seq: int = 0
    _order: int = 0
    _ticks: int = field(default=0)

    @classmethod
    def create(cls, spark: SparkSession, path: Path, **overrides: dict[str, Any]) -> Cluster:
        settings = Settings().with_overrides(storage={"warehouse": str(path), **TEST_STORAGE},
                                             **overrides)
        warehouse = open_warehouse(spark, settings.storage)
        warehouse.create_tables()
        return cls(spark, warehouse, settings)

    def clock(self) -> datetime:
        self._ticks += 1
        return T0 + timedelta(seconds=self._ticks)

    def group(self, name: str, partitions: int, backups: int, loss_policy: str | None = None,
              mode: str | None = None, affinity: str | None = None, persistent: bool = True) -> None:
        row = (name, partitions, backups, mode, affinity, None, None, loss_policy, persistent, None)
        self.warehouse.append("cache_groups", self.spark.createDataFrame([row], CACHE_GROUPS))

    def node(self, node_id: str, host: str | None = None, client: bool = False) -> None:
        self.warehouse.append("nodes", self.spark.createDataFrame([self._node_row(node_id, host, client)], NODES))

    def _node_row(self, node_id: str, host: str | None, client: bool) -> tuple[Any, ...]:
        self._order += 1
        return (node_id, None, self._order, host or f"h-{node_id}", {}, 1.0, client)

    def event(self, event_type: str, node: str | None = None, group: str | None = None) -> int:
        self._seq += 1
        row = (self._seq, event_type, node, group, T0 + timedelta(seconds=self._seq))
        self.warehouse.append("topology_events", self.spark.createDataFrame([row], TOPOLOGY_EVENTS))
        return self._seq

    def twin(self, **kwargs: Any) -> Any:
        """Run the twin (``rebalancer.twin.simulate``) on this cluster. The twin appends the failures it injects to
        the events, so this cluster numbers its next events after the ones the twin's exchanges merged (a reused
        ``event_seq`` is a duplicate key: the engine keeps the first row)."""
        from rebalancer.twin.simulate import simulate

        result = simulate(self.spark, self.warehouse, self.settings, clock=self.clock, **kwargs)
        merged = [seq for r in result.rounds for s in r.exchanges for seq in s.merged_event_seqs]
        self._seq = max([self._seq, *merged])
        return result

    def join(self, *node_ids: str, client: bool = False) -> None:
        """The nodes' rows in one commit, then their NODE_JOINED events (one each, in order) in one commit."""
        rows = [self._node_row(node_id, None, client) for node_id in node_ids]
        self.warehouse.append("nodes", self.spark.createDataFrame(rows, NODES))
        self.events_at([(self._seq + i, "NODE_JOINED", node_id) for i, node_id in enumerate(node_ids, start=1)])
        self._seq += len(node_ids)

    def report(self, rows: list[tuple[str, str, int, str, int, int, int | None]]) -> None:
        """Reports ``(node, group, partition, state, counter, size, wal_history_counter)``; bytes = 10 x size."""
        out = []
        for node, group, partition, state, counter, size, wal in rows:
            self._report_seq += 1
            out.append((node, group, partition, state, counter, size, size * 10, wal, self._report_seq))
        self.warehouse.append("partition_reports", self.spark.createDataFrame(out, PARTITION_REPORTS))

    def report_at(self, rows: list[tuple[str, str, int, str, int, int, int | None]], seq: int) -> None:
        """Like :meth:`report`, with explicit ``report_seq`` values ``seq, seq + 1, ...`` (a collector's own)."""
        out = [(n, g, p, state, counter, size, size * 10, wal, seq + i)
               for i, (n, g, p, state, counter, size, wal) in enumerate(rows)]
        self.warehouse.append("partition_reports", self.spark.createDataFrame(out, PARTITION_REPORTS))

    def event_at(self, seq: int, event_type: str, node: str | None = None, group: str | None = None) -> None:
        """Append one event with an explicit ``event_seq`` (a retried or concurrent writer)."""
        self.events_at([(seq, event_type, node, group)])

    def events_at(self, events: list[tuple[Any, ...]]) -> None:
        """Append events ``(seq, type, node[, group])`` in ONE commit."""
        rows = [(e[0], e[1], e[2], e[3] if len(e) > 3 else None, T0 + timedelta(seconds=e[0])) for e in events]
        self.warehouse.append("topology_events", self.spark.createDataFrame(rows, TOPOLOGY_EVENTS))

    def copy_to(self, path: Path) -> Cluster:
        """This cluster's warehouse copied file by file to ``path`` (Delta tables are relative to their folder),
        opened there, with this cluster's sequences and clock: the copy continues exactly as this one would."""
        shutil.copytree(self.settings.storage.warehouse, path)
        settings = self.settings.with_overrides(storage={"warehouse": str(path)})
        return replace(self, warehouse=open_warehouse(self.spark, settings.storage), settings=settings)

    def exchange(self, **kwargs: Any) -> list[ExchangeSummary]:
        return run_exchange(self.spark, self.warehouse, self.settings, clock=self.clock, **kwargs)

    def table(self, name: str, version: tuple[int, int]) -> DataFrame:
        major, minor = version
        return (
            self.warehouse.read(name)
            .where((F.col("topology_major") == major) & (F.col("topology_minor") == minor))
            .drop("topology_major", "topology_minor")
        )

    def rows(self, name: str, version: tuple[int, int], *columns: str) -> set[tuple[Any, ...]]:
        df = self.table(name, version)
        return {tuple(r) for r in df.select(*(columns or df.columns)).collect()}


# The limits of ``stages.paths`` a test may lower to force the Spark paths (:func:`force_spark_paths`).
_PATH_THRESHOLDS = ("DRIVER_RANKINGS", "KEYS_AS_LITERALS")


def force_spark_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage of the exchanges of warehouses opened after this on its Spark path: the driver holds no
    replicas (``Warehouse.driver_replicas``, patched on the class) and every limit of ``stages.paths`` is 0."""
    monkeypatch.setattr(Warehouse, "driver_replicas", 0)
    for name in _PATH_THRESHOLDS:
        monkeypatch.setattr(paths, name, 0)


def _path_limits() -> list[Any]:
    """The limits under which a builder's exchanges run: part of its template's key."""
    on_driver = vars(Warehouse)["driver_replicas"]
    return [on_driver if isinstance(on_driver, int) else "auto", *(getattr(paths, n) for n in _PATH_THRESHOLDS)]


def built_once(builder: Callable[..., Cluster]) -> Callable[..., Cluster]:
    """A scenario builder ``builder(spark, path, *args, **kwargs)`` that builds each distinct call once per test
    process (beside the first caller's ``path``) and gives every caller its own copy: a delta-spark exchange or
    input commit costs Spark jobs, and many scenarios start from the same cluster."""
    templates: dict[str, Cluster] = {}

    @functools.wraps(builder)
    def build(spark: SparkSession, path: Path, *args: Any, **kwargs: Any) -> Cluster:
        key = repr((args, sorted(kwargs.items()), _path_limits()))
        if key not in templates:
            templates[key] = builder(spark, path.with_name(f"{path.name}-{builder.__name__}-template"), *args,
                                     **kwargs)
        return templates[key].copy_to(path)

    return build


def assert_table(cluster: Cluster, name: str, version: tuple[int, int], columns: list[str],
                 expected: list[tuple[Any, ...]]) -> None:
    """Exact rows (on ``columns``) of table ``name`` at ``version``, compared with chispa (order ignored)."""
    from chispa import assert_df_equality

    actual = cluster.table(name, version).select(*columns)
    expected_df = cluster.spark.createDataFrame(expected, actual.schema)
    assert_df_equality(actual, expected_df, ignore_row_order=True, ignore_nullable=True)


def run_together(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each call in its own thread at once; what each returned, or the exception it raised, by name."""
    import threading

    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = calls[name]()
        except Exception as exc:  # noqa: BLE001 - the caller inspects what each run ended with
            results[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
