"""A session, a warehouse and the settings, opened lazily: what the CLI, the jobs and the demo work in.

Spark starts only when a command first needs it (a typo in an argument costs no JVM start); ``starting`` wraps that
start (the CLI shows a spinner).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from rebalancer.config import Settings, load_settings

__all__ = ["Workspace"]


@dataclass
class Workspace:
    """Settings, and the session and warehouse they describe (created on first use)."""

    settings: Settings
    starting: Callable[[str], AbstractContextManager[None]] = field(default=lambda _label: nullcontext(), repr=False)
    # Told which storage engine the warehouse uses and why, once, when it is opened (the CLI prints it on stderr).
    announce: Callable[[str], None] = field(default=lambda _text: None, repr=False)
    _spark: Any = field(default=None, repr=False)
    _warehouse: Any = field(default=None, repr=False)
    _checked: bool = field(default=False, repr=False)
    _started_spark: bool = field(default=False, repr=False)

    @property
    def spark(self) -> Any:
        """The active SparkSession, or a new one from ``settings.spark``."""
        if self._spark is None:
            with self.starting("starting Spark"):
                from pyspark.sql import SparkSession

                from rebalancer.session import get_spark, wants_delta_jars

                self._started_spark = SparkSession.getActiveSession() is None
                self._spark = get_spark(self.settings.spark, delta=wants_delta_jars(self.settings.storage))
        return self._spark

    def close(self) -> None:
        """Stop the session this workspace started, not one it found running (a notebook's, the tests').

        On a cluster (a standalone master, ``local-cluster``) the executors are then stopped before the application
        exits; a process that just exits leaves the workers relaunching executors during the JVM's shutdown, and
        every command ended with dozens of ERROR lines and stack traces. Stopping takes about 0.1 s locally.
        """
        if self._spark is not None and self._started_spark:
            self._spark.stop()
            self._spark, self._warehouse, self._started_spark = None, None, False

    @property
    def warehouse(self) -> Any:
        """The warehouse of ``settings.storage`` (its engine chosen then), checked to be in this release's format.

        Raises:
            WarehouseFormatError: there is no warehouse at the path, or it is in another format (one sentence;
                nothing is written).
        """
        if not self._checked:
            from rebalancer.formats import require_current

            require_current(self.any_warehouse())
            self._checked = True
        return self.any_warehouse()

    def new_or_current_warehouse(self) -> Any:
        """The warehouse, created in this release's format when there is none at the path (``init``, ``generate``,
        ``demo``: the commands that may create one); an existing one must be current, as for :attr:`warehouse`."""
        from rebalancer.formats import WarehouseMissingError, create_warehouse

        try:
            return self.warehouse
        except WarehouseMissingError:
            warehouse = self.any_warehouse()
            create_warehouse(warehouse)
            self._checked = True
            self.announce(f"created a new warehouse at {warehouse.location}")
            return warehouse

    def any_warehouse(self) -> Any:
        """The warehouse whatever its format, unchecked (``upgrade``)."""
        if self._warehouse is None:
            from rebalancer.storage import engine_reason, open_warehouse

            self._warehouse = open_warehouse(self.spark, self.settings.storage)
            self.announce(f"storage engine {self._warehouse.engine}: "
                          f"{engine_reason(self.settings.storage, self._warehouse.engine)}")
        return self._warehouse

    @classmethod
    def from_args(
        cls, argv: Sequence[str], description: str, options: Callable[[argparse.ArgumentParser], None] | None = None
    ) -> tuple[Workspace, argparse.Namespace]:
        """A workspace from a spark-submit job's arguments: ``[--warehouse W] [--conf F] [--strict]`` plus the
        job's own ``options`` (in any order).

        Raises:
            SystemExit: the arguments do not parse (argparse prints the usage).
            ConfigError: the configuration file is invalid.
        """
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--warehouse", help="warehouse directory (default: storage.warehouse)")
        parser.add_argument("--conf", help="TOML settings file (see conf/default.toml)")
        parser.add_argument("--strict", action="store_true", help="fail on any bad input row")
        if options is not None:
            options(parser)
        args = parser.parse_args(list(argv))
        settings = load_settings(args.conf)
        if args.warehouse:
            settings = settings.with_overrides(storage={"warehouse": args.warehouse})
        if args.strict:
            settings = settings.with_overrides(validation={"strict": True})
        return cls(settings), args
