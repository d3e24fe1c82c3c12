"""Storage: the only code in rebalancer that touches Delta.

A *warehouse* holds one Delta table per name of :data:`rebalancer.tables.SCHEMAS` (SPEC section 1). Open it with
:func:`open_warehouse`; everything else goes through the returned :class:`Warehouse`::

    wh = open_warehouse(spark, settings.storage)
    wh.create_tables()
    wh.replace_where("topology", topology_df, {"topology_major": 5, "topology_minor": 0})
    wh.register_views()
    spark.sql("SELECT count(*) FROM topology").show()

Two engines implement it with the same layout and schemas: ``delta-spark`` (Delta jars in the Spark JVM, used when
present) and ``delta-rs`` (the ``deltalake`` package; Spark writes the files, delta-rs commits them). :data:`ENGINES`
maps each engine's name (declared in :mod:`rebalancer.config`) to how its warehouse is opened: a new engine is a
module with its :class:`Warehouse` and one entry there. See docs/STORAGE.md for the design, guarantees and measured
timings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

from rebalancer.config import DELTA_RS, DELTA_SPARK, StorageSettings
from rebalancer.storage import errors
from rebalancer.storage.base import TABLE_PROPERTIES, Warehouse
from rebalancer.storage.engine import delta_classes_available, engine_reason, resolve_engine
from rebalancer.storage.errors import *  # noqa: F403 - every storage error (errors.__all__) is public here
from rebalancer.storage.sql import WhereValue

__all__ = [
    "ENGINES",
    "TABLE_PROPERTIES",
    "Opener",
    "Warehouse",
    "WhereValue",
    "delta_classes_available",
    "engine_reason",
    "open_warehouse",
    "resolve_engine",
    *errors.__all__,
]

#: How an engine opens a warehouse: ``(spark, storage settings, warehouse location) -> Warehouse``.
Opener = Callable[[SparkSession, StorageSettings, str | Path], Warehouse]


def _open_delta_spark(spark: SparkSession, settings: StorageSettings, location: str | Path) -> Warehouse:
    from rebalancer.storage.delta_spark import DeltaSparkWarehouse

    return DeltaSparkWarehouse(
        spark, location, catalog_prefix=settings.catalog_prefix, commit_retries=settings.commit_retries,
        concurrent_commits=settings.concurrent_commits, driver_reader=settings.driver_reader,
        driver_writer=settings.driver_writer, driver_replicas=settings.driver_replicas,
    )


def _open_delta_rs(spark: SparkSession, settings: StorageSettings, location: str | Path) -> Warehouse:
    from rebalancer.storage.delta_rs import DeltaRsWarehouse

    return DeltaRsWarehouse(spark, location, commit_retries=settings.commit_retries,
                            concurrent_commits=settings.concurrent_commits, driver_replicas=settings.driver_replicas)


#: The storage engines by name, and how each opens its warehouse. An opener imports its engine's module when it is
#: first called, so one engine's packages load only where it runs.
ENGINES: Final[Mapping[str, Opener]] = {DELTA_RS: _open_delta_rs, DELTA_SPARK: _open_delta_spark}


def open_warehouse(spark: SparkSession, settings: StorageSettings, warehouse: str | Path | None = None) -> Warehouse:
    """Open the warehouse with the engine ``settings.engine`` selects (``auto``: delta-spark if loadable).

    Nothing is created or read here; call :meth:`Warehouse.create_tables` to create missing tables.

    Args:
        spark: the session used for reads and data-file writes.
        settings: ``storage`` settings: engine, warehouse directory, catalog prefix, commit retries.
        warehouse: overrides ``settings.warehouse`` (the CLI's ``--warehouse``); relative paths are resolved
            against the working directory.

    Returns:
        A :class:`Warehouse` whose ``engine`` is ``"delta-spark"`` or ``"delta-rs"``.

    Raises:
        EngineUnavailableError: delta-spark is required (explicitly or by ``catalog_prefix``) but not loadable.
        UnsupportedTableError: the delta-rs engine was given a remote warehouse URI.
    """
    engine = resolve_engine(spark, settings)
    location = warehouse if warehouse is not None else settings.warehouse
    return ENGINES[engine](spark, settings, location)
