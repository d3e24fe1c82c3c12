"""Helpers for the tests against a real Kafka cluster: topics, records, what the cluster says, warehouses."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rebalancer.config import Settings
from rebalancer.storage import open_warehouse
from rebalancer.storage.base import Warehouse
from tests.conftest import TEST_STORAGE
from tests.kafka.cluster import KafkaCluster


def admin(cluster: KafkaCluster) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10000, metadata_max_age_ms=1000)


def create_topics(cluster: KafkaCluster, topics: dict[str, tuple[int, int]]) -> None:
    """Topics name -> (partitions, replication factor), placed by Kafka itself; waits until every one has leaders."""
    from kafka.admin import NewTopic

    client = admin(cluster)
    try:
        client.create_topics([NewTopic(name, p, rf) for name, (p, rf) in topics.items()])
    finally:
        client.close()
    wait_until_in_sync(cluster, {name: partitions for name, (partitions, _) in topics.items()})


def _in_sync(partition: dict[str, Any]) -> bool:
    """A partition (as :func:`describe` gives it) with a leader and every replica in sync. A follower still
    catching up is not OWNING to the collector, and an exchange would rightly plan to copy to it."""
    return bool(partition["leader"] >= 0 and set(partition["isr"]) == set(partition["replicas"]))


def wait_until_in_sync(cluster: KafkaCluster, partitions: dict[str, int]) -> None:
    """Until each topic has its number of partitions, each :func:`_in_sync`."""
    def in_sync() -> bool:
        now = describe(cluster, list(partitions))  # a topic Kafka answered with an error is left out: not in sync
        return set(now) == set(partitions) and all(
            len(v) == partitions[t] and all(map(_in_sync, v.values())) for t, v in now.items())

    wait_until(in_sync, 30, "every replica in sync")


def wait_until_every_topic_in_sync(cluster: KafkaCluster) -> None:
    """Until every partition of every topic on the cluster is :func:`_in_sync`: what a test that collects a shared
    cluster whole waits for before it asserts an exchange moves nothing (another test's topic still catching up is
    a copy to plan)."""
    wait_until(lambda: all(_in_sync(r) for v in describe(cluster).values() for r in v.values()), 30,
               "every topic in sync")


def describe(cluster: KafkaCluster, topics: list[str] | None = None) -> dict[str, dict[int, dict[str, Any]]]:
    """topic -> partition -> {replicas, isr, leader} as the cluster says now."""
    client = admin(cluster)
    try:
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for t in client.describe_topics(topics):
            if t.get("error_code"):
                continue
            out[t["name"]] = {p["partition_index"]: {"replicas": list(p["replica_nodes"]), "isr": list(p["isr_nodes"]),
                                                      "leader": p["leader_id"]} for p in t["partitions"]}
        return out
    finally:
        client.close()


def produce(cluster: KafkaCluster, topic: str, count: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5)
    for i in range(count):
        producer.send(topic, key=f"k{i}".encode(), value=f"{topic}-{i}".encode())
    producer.flush()
    producer.close()


def records(cluster: KafkaCluster, topic: str) -> dict[tuple[int, int], bytes]:
    """Every record of ``topic`` as (partition, offset) -> value, read from the beginning."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000, metadata_max_age_ms=1000)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(parts)
        ends = consumer.end_offsets(parts)
        consumer.seek_to_beginning(*parts)
        out: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in parts) and time.monotonic() < deadline:
            for tp, batch in consumer.poll(timeout_ms=1000).items():
                for record in batch:
                    out[(tp.partition, record.offset)] = record.value
        return out
    finally:
        consumer.close()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - the cluster is moving under us; asked again until the deadline
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.5)


def wait_fenced(cluster: KafkaCluster, broker: int) -> None:
    """Until the controller no longer lists ``broker`` as an unfenced broker (its session timed out)."""
    def gone() -> bool:
        client = admin(cluster)
        try:
            return broker not in {b["broker_id"] for b in client.describe_cluster()["brokers"]
                                  if not b.get("is_fenced")}
        finally:
            client.close()
    wait_until(gone, 30, f"broker {broker} fenced")


def warehouse(spark: Any, folder: Path) -> tuple[Warehouse, Settings]:
    settings = Settings().with_overrides(
        storage={"warehouse": str(folder), **TEST_STORAGE},
        kafka={"poll_interval_s": 0.3, "execute_timeout_s": 180.0, "client_timeout_s": 10.0},
        migration={"max_parallel_per_node": 2},
    )
    return open_warehouse(spark, settings.storage), settings


def ideal_lists(wh: Warehouse, version: tuple[int, int]) -> dict[tuple[str, int], list[int]]:
    from rebalancer.tables import version_where

    rows = sorted(wh.read_arrow("ideal_assignment", where=version_where(version)).to_pylist(),
                  key=lambda r: r["replica_index"])
    out: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        out.setdefault((r["group_name"], r["partition_id"]), []).append(int(r["node_id"]))
    return out


def plan_rows(wh: Warehouse, version: tuple[int, int]) -> list[dict[str, Any]]:
    from rebalancer.tables import version_where

    return wh.read_arrow("migration_plan", where=version_where(version)).to_pylist()


class ReassignmentSampler:
    """Asks Kafka for its reassignments in flight every 0.1 s while the ``with`` block runs, independently of the
    executor: per sample, how many listed moves add or remove a replica on each broker."""

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster = cluster
        self.samples: list[Counter[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = admin(self.cluster)
        try:
            while not self._stop.is_set():
                try:
                    listed = client.list_partition_reassignments()
                except Exception:  # noqa: BLE001 - a broker may be moving under us; the next sample asks again
                    listed = None
                if listed is not None:
                    self.samples.append(Counter(b for r in listed.values()
                                                for b in {*r["adding_replicas"], *r["removing_replicas"]}))
                self._stop.wait(0.1)
        finally:
            client.close()

    def most_per_broker(self) -> int:
        return max((max(c.values(), default=0) for c in self.samples), default=0)

    def __enter__(self) -> ReassignmentSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
