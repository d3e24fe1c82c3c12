"""Opening a SparkSession when rebalancer runs on its own (CLI, jobs, tests).

Library code never creates sessions at import or changes a session it was given. When a session already exists
(Databricks, a notebook, spark-submit) :func:`get_spark` returns it untouched; only when none exists does it build a
local one tuned for a laptop (settings measured in FIELD-NOTES: serial GC, C1 JIT, no UI, UTC).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import cast

from pyspark.sql import SparkSession

from rebalancer import delta_jars
from rebalancer.config import DELTA_RS, SparkSettings, StorageSettings

__all__ = ["CLASS_ARCHIVE", "LOCAL_SPARK_CONF", "get_spark", "java_options", "wants_delta_jars"]

_LOG4J = Path(__file__).with_name("log4j2.properties")
# C1-only JIT starts fast (FIELD-NOTES), but its default 48 MB code cache fills up in a long session (a twin run
# of many exchanges: "CodeCache is full. Compiler has been disabled"), after which the JVM only interprets.
_JAVA_OPTIONS = (
    "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -Duser.timezone=UTC "
    f"-Dlog4j.configurationFile={_LOG4J}"
)

#: The JVM's class-data-sharing archive of Spark's classes, made once by ``make install`` (``rebalancer.warmup``)
#: in the environment that holds pyspark's jars. Measured here: a session starts in 2.5 s instead of 4 s and its
#: first queries run about 2 s sooner. A JVM that cannot use it (other Java, other jars) starts without it.
CLASS_ARCHIVE = Path(sys.prefix) / "rebalancer-spark-classes.jsa"
_QUIET_ARCHIVE = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def java_options(archive: str | None = None) -> str:
    """The JVM options of sessions rebalancer builds: ``archive`` (``"use"``, ``"make"`` or None) adds the
    class archive, read or written at exit."""
    if archive == "use" and CLASS_ARCHIVE.is_file():
        return f"{_JAVA_OPTIONS} -XX:SharedArchiveFile={CLASS_ARCHIVE} {_QUIET_ARCHIVE}"
    if archive == "make":
        return f"{_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={CLASS_ARCHIVE} {_QUIET_ARCHIVE}"
    return _JAVA_OPTIONS


# Applied only to sessions rebalancer builds itself.
LOCAL_SPARK_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.catalogImplementation": "in-memory",
    # delta-rs commits the parquet files Spark writes; Delta readers expect microsecond timestamps, not INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.executor.extraJavaOptions": _JAVA_OPTIONS,
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def wants_delta_jars(storage: StorageSettings) -> bool:
    """Whether a session rebalancer builds for these storage settings carries the Delta jars: for ``auto`` (which
    then picks delta-spark whenever the install fetched them) and ``delta-spark``; not for ``delta-rs``."""
    return storage.engine != DELTA_RS


def get_spark(
    settings: SparkSettings | None = None, extra_conf: dict[str, str] | None = None, *, delta: bool = False
) -> SparkSession:
    """The active SparkSession, or a new local one built from ``settings``.

    Args:
        settings: master, app name, shuffle partitions and driver memory for a new session.
        extra_conf: more Spark settings for a new session (ignored when a session already exists).
        delta: put the Delta jars fetched at install (``rebalancer.delta_jars``), the Delta SQL extension and
            catalog into a new session; without fetched jars the session is built without them.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = settings or SparkSettings()
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Launched by spark-submit: master, memory and packages come from its command line, not from us.
        return SparkSession.builder.appName(settings.app_name).getOrCreate()
    # Python workers must run this interpreter, or mapInArrow workers miss pyarrow/numpy (FIELD-NOTES).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.master.startswith("local"):
        # A laptop's hostname often resolves to loopback; say so up front instead of a JVM warning per run.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.driver.memory": settings.driver_memory,
        "spark.sql.adaptive.enabled": str(settings.adaptive).lower(),
        **LOCAL_SPARK_CONF,
        "spark.driver.extraJavaOptions": java_options("use"),
        **(delta_jars.session_conf() if delta else {}),
        **(extra_conf or {}),
    }
    if settings.api_mode == "connect" and settings.master.startswith("local"):
        return _local_connect_session(conf)
    builder = SparkSession.builder.config("spark.api.mode", settings.api_mode)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if settings.api_mode == "classic":
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _local_connect_session(conf: dict[str, str]) -> SparkSession:
    """A local Spark Connect server with ``conf``, on a free port, and a Connect session of it.

    What pyspark does for ``spark.api.mode = connect`` with a local master (a classic session in this process
    whose Connect plugin serves the client; only holders of a random token may connect; stopping the client stops
    the server), but pyspark binds port 15002 outside its own tests, so a second such process on the machine could
    not start: this one asks the system for a free port.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", str(uuid.uuid4()))  # read by server and client
    port = _free_port()
    builder = SparkSession.builder.config("spark.api.mode", "classic")
    for key, value in {**conf, **_CONNECT_SERVER_CONF, "spark.connect.grpc.binding.port": str(port)}.items():
        builder = builder.config(key, value)
    builder.getOrCreate().sparkContext.setLogLevel("ERROR")
    # pyspark's markers of a local Connect server: sessions made from now on are Connect ones, and stopping the
    # client stops the server.
    os.environ["SPARK_LOCAL_REMOTE"] = "1"
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    # pyspark's own builder returns Connect sessions typed as its SparkSession the same way
    return cast(SparkSession, ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate())


_CONNECT_SERVER_CONF = {
    "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
    "spark.sql.artifact.isolation.enabled": "true",
    "spark.sql.artifact.isolation.alwaysApplyClassloader": "true",
}


def _free_port() -> int:
    """A TCP port no process listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
