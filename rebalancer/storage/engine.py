"""Choosing the storage engine (SPEC section 1): delta-spark when the Delta classes are in the Spark JVM, else delta-rs.

Probing follows FIELD-NOTES: ``spark._jvm.io.delta.tables.DeltaTable`` is a harmless ``JavaPackage`` even when the
class is absent, so classic sessions ask the JVM's context class loader with ``Class.forName``; Spark Connect
sessions have no JVM handle, so they resolve the ``delta`` data source and look for ``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession

from rebalancer.config import AUTO_ENGINE, DELTA_RS, DELTA_SPARK, StorageSettings
from rebalancer.delta_jars import DELTA_ARTIFACT, jars
from rebalancer.storage.errors import EngineUnavailableError

__all__ = [
    "DELTA_CLASS", "delta_classes_available", "engine_reason", "install_hint", "probe_delta_format", "resolve_engine",
]

DELTA_CLASS = "io.delta.tables.DeltaTable"
_EXTENSION_CONFS = (
    "--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
    "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
)


def install_hint() -> str:
    """How to put Delta into a Spark session: the ``spark-submit`` options, ready to paste.

    Returns:
        e.g. ``spark-submit --packages io.delta:delta-spark_2.13:4.4.0 --conf spark.sql.extensions=... --conf ...``.
    """
    return f"spark-submit --packages {':'.join(DELTA_ARTIFACT)} {_EXTENSION_CONFS}"


def probe_delta_format(spark: SparkSession) -> bool:
    """Whether the session resolves the ``delta`` data source (works on Spark Connect, where there is no JVM).

    Args:
        spark: any session, classic or Connect.

    Returns:
        False when Spark reports ``DATA_SOURCE_NOT_FOUND`` for ``delta``; True otherwise (a missing path or "not a
        Delta table" error means the source itself was found).
    """
    probe = f"/rebalancer-delta-probe-{uuid.uuid4().hex}"  # a path that cannot exist
    try:
        _ = spark.read.format("delta").load(probe).schema
    except Exception as exc:
        text = str(exc)
        return not ("DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source: delta" in text)
    return True


def delta_classes_available(spark: SparkSession) -> bool:
    """Whether ``io.delta.tables.DeltaTable`` is loadable in the session's JVM.

    Args:
        spark: the session; a Spark Connect session is probed through :func:`probe_delta_format`.

    Returns:
        True when delta-spark can run in this session.
    """
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
    except Exception:  # Spark Connect raises (JVM_ATTRIBUTE_NOT_SUPPORTED) instead of lacking the attribute
        jvm = None
    if jvm is None:
        return probe_delta_format(spark)
    try:
        # The context class loader sees --packages / --jars added at start-up; the system loader may not.
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
    except Exception:
        return False
    return True


def resolve_engine(spark: SparkSession, settings: StorageSettings) -> str:
    """The engine a warehouse uses: ``storage.engine``, with ``auto`` resolved by probing the session.

    Args:
        spark: the session the warehouse will use.
        settings: the storage settings (``engine`` and ``catalog_prefix`` matter here).

    Returns:
        ``"delta-spark"`` or ``"delta-rs"``.

    Raises:
        EngineUnavailableError: delta-spark is required (explicitly, or by a catalog prefix) but the Delta classes
            are not in the session.
    """
    if settings.engine == DELTA_RS:
        if settings.catalog_prefix:
            raise EngineUnavailableError(
                f"storage.catalog_prefix = '{settings.catalog_prefix}' names Unity Catalog tables, which only the "
                f"delta-spark engine can write; set storage.engine = 'auto' or 'delta-spark', or clear the prefix."
            )
        return DELTA_RS
    available = delta_classes_available(spark)
    if available:
        return DELTA_SPARK
    if settings.engine == DELTA_SPARK:
        raise EngineUnavailableError(
            f"storage.engine = 'delta-spark' but {DELTA_CLASS} is not in this Spark session; start it with "
            f"`{install_hint()}` (or the same settings in your cluster configuration; sessions rebalancer builds "
            f"include the jars that `python -m rebalancer.delta_jars` fetched), or set storage.engine = 'delta-rs'."
        )
    if settings.catalog_prefix:
        raise EngineUnavailableError(
            f"storage.catalog_prefix = '{settings.catalog_prefix}' needs the delta-spark engine but {DELTA_CLASS} "
            f"is not in this Spark session; start it with `{install_hint()}`, or clear the prefix to use a local "
            f"warehouse directory."
        )
    return DELTA_RS


def engine_reason(settings: StorageSettings, engine: str) -> str:
    """Why a warehouse uses ``engine`` (the CLI prints it): the setting that asked for it, or what ``auto`` found.

    Args:
        settings: the storage settings the warehouse was opened with.
        engine: the engine :func:`resolve_engine` chose.
    """
    if settings.engine != AUTO_ENGINE:
        return f"storage.engine = '{settings.engine}'"
    if engine == DELTA_SPARK:
        return "storage.engine = 'auto' and the Delta jars are in the Spark session"
    fetched = "" if jars() else " (none were fetched here: `python -m rebalancer.delta_jars` fetches them)"
    return f"storage.engine = 'auto' and the Delta jars are not in the Spark session{fetched}"
