"""What a live Kafka cluster is, read through its public admin API (kafka-python), as plain frozen records.

Contract:
    - :func:`read_cluster` asks the cluster for its brokers (DescribeCluster), topics and partitions with their
      replicas, in-sync replicas, leader and reassignments in flight (Metadata, ListPartitionReassignments), each
      replica's size on disk (DescribeLogDirs, sent to every broker) and each partition's high watermark and log
      start offset (ListOffsets, sent to the leaders). About 4 + brokers requests whatever the cluster's size.
    - Nothing here decides what the records mean for rebalancer: :mod:`rebalancer.kafka.collect` does.
    - Failures are :class:`KafkaUnreachableError` with one sentence; kafka-python is imported here only (and in
      :mod:`rebalancer.kafka.execute`), so the engine installs and imports without the ``kafka`` extra.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Broker", "ClusterSnapshot", "KafkaUnreachableError", "PartitionState", "admin_client", "read_cluster"]


class KafkaUnreachableError(RuntimeError):
    """No broker answered, or the cluster refused a request; the message is one sentence."""


@dataclass(frozen=True)
class Broker:
    broker_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True)
class PartitionState:
    """One partition as the controller sees it, plus the offsets its leader gives."""

    topic: str
    partition: int
    replicas: tuple[int, ...]  # the assignment, preferred leader first (during a move: old and new together)
    isr: tuple[int, ...]
    leader: int  # -1: no leader (every in-sync replica is gone)
    adding: tuple[int, ...]  # a reassignment in flight: replicas being added
    removing: tuple[int, ...]  # ... and being removed
    high_watermark: int | None  # None without a leader
    log_start: int | None

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas the partition keeps once a move in flight completes, in assignment order."""
        return tuple(b for b in self.replicas if b not in self.removing)


@dataclass(frozen=True)
class ClusterSnapshot:
    cluster_id: str
    brokers: tuple[Broker, ...]  # the brokers registered and not fenced: the alive ones
    topics: dict[str, tuple[PartitionState, ...]]  # topic -> its partitions, in partition order
    internal: frozenset[str]
    replica_bytes: dict[tuple[str, int, int], int]  # (topic, partition, broker) -> bytes on disk
    fenced: frozenset[int] = frozenset()  # registered but fenced: crashed or stopped, expected back


@contextlib.contextmanager
def admin_client(bootstrap: str, timeout_s: float) -> Iterator[Any]:
    """A kafka-python admin client for ``bootstrap``, closed on exit.

    Raises:
        KafkaUnreachableError: the ``kafka`` extra is missing or no broker answered within ``timeout_s``.
    """
    try:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError
    except ImportError:
        raise KafkaUnreachableError(
            "the Kafka client is not installed: pip install 'rebalancer[kafka]' (kafka-python)") from None
    try:
        client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                  bootstrap_timeout_ms=int(timeout_s * 1000), metadata_max_age_ms=1000,
                                  client_id="rebalancer")
    except (KafkaError, OSError, ValueError) as exc:
        raise KafkaUnreachableError(
            f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s ({type(exc).__name__})") from None
    try:
        yield client
    finally:
        client.close()


def read_cluster(bootstrap: str, *, timeout_s: float = 15.0, include_internal: bool = True) -> ClusterSnapshot:
    """The cluster's brokers, topics, partitions, replica sizes and offsets, as of now.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: how long one request may take.
        include_internal: whether Kafka's internal topics (``__consumer_offsets``, ...) are read.

    Raises:
        KafkaUnreachableError: no broker answered, or a request failed (one sentence).
    """
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answers = _ask(bootstrap, timeout_s)
            break
        except KafkaError as exc:
            # kafka-python keeps a broker that just died as its controller and fails its first request after a
            # broker died: a new client re-bootstraps from the live brokers; every request here only reads
            if time.monotonic() > deadline:
                raise KafkaUnreachableError(f"the Kafka cluster at {bootstrap} did not answer a request within "
                                            f"{timeout_s:g} s: {type(exc).__name__}") from None
            time.sleep(0.5)
    cluster, described, moving, latest, earliest, logs = answers
    brokers = tuple(sorted(
        (Broker(int(b["broker_id"]), str(b["host"]), int(b["port"]), b.get("rack") or None)
         for b in cluster["brokers"] if not b.get("is_fenced")),
        key=lambda b: b.broker_id))
    fenced = frozenset(int(b["broker_id"]) for b in cluster["brokers"] if b.get("is_fenced"))
    internal = frozenset(t["name"] for t in described if t.get("is_internal"))
    in_flight = _reassignments(moving)
    topics: dict[str, tuple[PartitionState, ...]] = {}
    for t in sorted(described, key=lambda t: t["name"]):
        name = t["name"]
        if t.get("error_code") or (name in internal and not include_internal):
            continue
        states = []
        for p in sorted(t["partitions"], key=lambda p: p["partition_index"]):
            pid = int(p["partition_index"])
            move = in_flight.get((name, pid), ((), ()))
            tp = TopicPartition(name, pid)
            states.append(PartitionState(
                topic=name, partition=pid, replicas=tuple(int(b) for b in p["replica_nodes"]),
                isr=tuple(int(b) for b in p["isr_nodes"]), leader=int(p["leader_id"]),
                adding=move[0], removing=move[1],
                high_watermark=int(latest[tp].offset) if tp in latest else None,
                log_start=int(earliest[tp].offset) if tp in earliest else None,
            ))
        topics[name] = tuple(states)
    sizes: dict[tuple[str, int, int], int] = {}
    for entry in logs:
        for log_dir in entry.get("log_dirs", []):
            for topic in log_dir.get("topics", []):
                for part in topic.get("partitions", []):
                    if not part.get("is_future_key"):
                        key = (topic["name"], int(part["partition_index"]), int(entry["broker"]))
                        sizes[key] = sizes.get(key, 0) + int(part["partition_size"])
    return ClusterSnapshot(str(cluster.get("cluster_id")), brokers, topics, internal, sizes, fenced)


def _ask(bootstrap: str, timeout_s: float) -> tuple[Any, ...]:
    """The answers :func:`read_cluster` reads, from one fresh client."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    with admin_client(bootstrap, timeout_s) as admin:
        cluster = admin.describe_cluster()
        described = admin.describe_topics()
        moving = admin.list_partition_reassignments()
        led = [TopicPartition(t["name"], p["partition_index"]) for t in described if not t.get("error_code")
               for p in t["partitions"] if p["leader_id"] >= 0]
        latest = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in led}) if led else {}
        earliest = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in led}) if led else {}
        logs = admin.describe_log_dirs()
    return cluster, described, moving, latest, earliest, logs


def _reassignments(moving: Any) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...]]]:
    """(topic, partition) -> (adding, removing) of each reassignment in flight (kafka-python's
    ``list_partition_reassignments``: TopicPartition -> {adding_replicas, removing_replicas, ...})."""
    return {(tp.topic, int(tp.partition)): (tuple(int(b) for b in r["adding_replicas"]),
                                            tuple(int(b) for b in r["removing_replicas"]))
            for tp, r in (moving or {}).items()}
