"""How commits run: retried when they lose a race with another writer, and independent ones a few at once."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

from pyspark.sql import SparkSession

from rebalancer.storage.errors import ConcurrentWriteError

__all__ = ["backoff_seconds", "commit_each", "retry_on_conflict", "transaction_app"]

log = logging.getLogger("rebalancer.storage")

T = TypeVar("T")


def transaction_app(name: str) -> str:
    """The Delta application transaction id (``txn`` action) that every rewrite of table ``name`` records, with
    the table version it planned from plus one: two rewrites planned from one version conflict (both engines)."""
    return f"rebalancer:{name}"


def backoff_seconds(attempt: int) -> float:
    """Randomised exponential backoff before retry ``attempt`` (0-based): about 50 ms, 100 ms, ... capped at 2 s.

    The jitter keeps two writers that collided from colliding again in lockstep.
    """
    return min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())


def retry_on_conflict(
    action: Callable[[], T],
    *,
    table: str,
    retries: int,
    is_conflict: Callable[[BaseException], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``action`` and re-run it when its commit lost a race with another writer.

    ``action`` must re-plan from the table's latest version on every call (a conflict means its snapshot is stale).

    Args:
        action: one attempt: plan, write files, commit.
        table: the table name, for messages.
        retries: how many times a conflicting attempt is retried (``storage.commit_retries``).
        is_conflict: tells a lost commit race from any other error (which propagates at once).
        sleep: waits between attempts (replaceable in tests).

    Returns:
        What the successful attempt returned.

    Raises:
        ConcurrentWriteError: every one of the ``retries + 1`` attempts conflicted.
    """
    last: BaseException | None = None
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as exc:
            if not is_conflict(exc):
                raise
            last = exc
            log.warning(
                "commit to %s conflicted with another writer (attempt %d of %d)", table, attempt + 1, retries + 1
            )
            if attempt < retries:
                sleep(backoff_seconds(attempt))
    raise ConcurrentWriteError(
        f"writing {table} lost the commit race to other writers {retries + 1} times "
        f"(storage.commit_retries = {retries}); run it again once the other writer has finished, or raise "
        f"storage.commit_retries."
    ) from last


def commit_each(
    spark: SparkSession,
    commits: Mapping[str, Callable[[], None]],
    workers: int,
    committed: Callable[[str], None] | None = None,
) -> None:
    """Run independent ``commits``, up to ``workers`` at once, calling ``committed(name)`` on this thread as each
    one ends (in the order they end; with one worker, in ``commits`` order).

    Every commit runs with this thread's Spark job group and description (or Connect tags), so its jobs are
    counted and named with the caller's. On the first error (of a commit or of ``committed``) the commits not
    started are cancelled, the running ones finish, and that error is raised.
    """
    if workers <= 1 or len(commits) <= 1:
        for name, commit in commits.items():
            commit()
            if committed is not None:
                committed(name)
        return
    from pyspark import inheritable_thread_target  # each wrapper holds its own copy of the job properties

    pool = ThreadPoolExecutor(max_workers=min(workers, len(commits)), thread_name_prefix="rebalancer-commit")
    try:
        futures = {pool.submit(inheritable_thread_target(spark)(commit)): name for name, commit in commits.items()}
        for future in as_completed(futures):
            future.result()
            if committed is not None:
                committed(futures[future])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
