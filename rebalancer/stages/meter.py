"""Measuring an exchange (or a what-if, a generate): wall seconds and Spark jobs per stage, logged as they happen."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["STAGES", "Meter"]

_log = logging.getLogger("rebalancer.pipeline")

#: The stages an exchange's wall time is split into (``ExchangeSummary.stage_seconds``), in the order they run.
STAGES = ("inputs", "scope", "kernel", "plan", "routing", "writes", "stamps", "commit")


class Meter:
    """Wall seconds per stage, and the Spark jobs started under one job group (classic sessions only); every job
    is described in the Spark UI as ``rebalancer <work>: <stage>``.

    Each stage is logged (logger ``rebalancer.pipeline``, INFO) when it starts and ends; while one runs and INFO
    is enabled, the progress of its Spark tasks is logged when it changes (the CLI shows these lines in its
    spinner on a terminal).
    """

    def __init__(self, spark: SparkSession, work: str = "exchange") -> None:
        self.seconds: dict[str, float] = {}
        self.stage_jobs: dict[str, int] = {}
        self._work = work
        self._group = f"rebalancer-{work}-{uuid.uuid4().hex[:12]}"
        try:
            self._sc: Any = spark.sparkContext
        except Exception:  # Spark Connect: no SparkContext, no job count
            self._sc = None
        if self._sc is not None:
            self._sc.setJobGroup(self._group, f"rebalancer {work}")

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        label = f"{self._work}: {name}"
        if self._sc is not None:
            self._sc.setJobDescription(f"rebalancer {label}")
        _log.info("%s", label)
        watch = _TaskProgress(self._sc, label) if self._sc is not None and _log.isEnabledFor(logging.INFO) else None
        t0 = time.perf_counter()
        jobs0 = self.jobs() or 0
        try:
            yield
        finally:
            if watch is not None:
                watch.stop()
            seconds = time.perf_counter() - t0
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            jobs = (self.jobs() or 0) - jobs0
            self.stage_jobs[name] = self.stage_jobs.get(name, 0) + jobs
            _log.info("%s done in %.1f s, %d Spark jobs", label, seconds, jobs)

    def jobs(self) -> int | None:
        if self._sc is None:
            return None
        return len(self._sc.statusTracker().getJobIdsForGroup(self._group))

    def close(self) -> None:
        if self._sc is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", None)
            self._sc.setJobDescription(None)


class _TaskProgress:
    """Logs the tasks done of the Spark stages running now, when that changes (a thread polling the status
    tracker twice a second until stopped)."""

    def __init__(self, sc: Any, label: str) -> None:
        self._sc, self._label = sc, label
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rebalancer-progress", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        last = None
        while not self._done.wait(0.5):
            try:
                tracker = self._sc.statusTracker()
                infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            except Exception:  # the session is stopping: nothing to show
                return
            infos = [i for i in infos if i is not None]
            if not infos:
                continue
            done = sum(i.numCompletedTasks for i in infos)
            total = sum(i.numTasks for i in infos)
            if (done, total) != last:
                last = (done, total)
                _log.info("%s: Spark tasks %d/%d", self._label, done, total)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
