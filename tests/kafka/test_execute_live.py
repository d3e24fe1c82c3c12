"""The Kafka executor (rebalancer.kafka.execute) against a real Kafka 4.4 KRaft cluster of four brokers on loopback.

- Draining broker 4 with at most two moves in flight per broker (and one PROMOTE-only move: a reorder, then an
  election): every moved partition ends on its ideal list with its preferred leader, the in-flight counts seen at
  every poll stay within the cap, every record is still read back at the same offset, Kafka's own
  ``kafka-reassign-partitions --verify`` reads the dry-run file and reports every reassignment completed, and a
  second run finds everything done and submits nothing.
- A run SIGKILLed while a throttled reassignment is in flight (its new broker is down, so it waits) is resumed by a
  second run once the broker is back (a run while it is still down gives up after its timeout with one sentence):
  the move in flight counts as resumed and is not re-submitted, the others are submitted, everything ends on the
  target with every record, and the throttles the killed run set are removed.
- A plan naming a deleted topic fails with one sentence before anything is written; an unreachable bootstrap fails
  with one sentence within the client timeout.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rebalancer.kafka.execute import ExecuteError, ExecuteResult, Move, dry_run_json, execute, moves_of
from tests.kafka.cluster import LIB, REPO, KafkaCluster, missing_tools

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools())),
]

DRAINED = 4
SURVIVORS = (1, 2, 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(tmp_path_factory.mktemp("kafka-execute"), brokers=4).start() as running:
        yield running


@contextlib.contextmanager
def fresh_admin(cluster: KafkaCluster) -> Iterator[Any]:
    """An admin client of the brokers running now (kafka-python does not re-pick its controller after one stops)."""
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, metadata_max_age_ms=1000)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def admin(cluster: KafkaCluster) -> Iterator[Any]:
    with fresh_admin(cluster) as client:
        yield client


# ---------------------------------------------------------------- helpers


def create_topic(admin: Any, name: str, partitions: int, replication: int,
                 assignments: dict[int, list[int]] | None = None) -> None:
    """Create ``name`` (Kafka places the replicas, or ``assignments``) and wait until every partition has a leader
    and every replica in sync (a follower still catching up is rightly planned a copy)."""
    if assignments is None:
        admin.create_topics({name: {"num_partitions": partitions, "replication_factor": replication}})
    else:
        admin.create_topics({name: {"assignments": assignments}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.describe_topics([name])[0]
        if described["error_code"] == 0 and len(described["partitions"]) == partitions and all(
                p["leader_id"] >= 0 and set(p["isr_nodes"]) == set(p["replica_nodes"])
                for p in described["partitions"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} has not every partition led and in sync after 30 s")


def produce(bootstrap: str, topic: str, records: int, value_bytes: int) -> dict[tuple[int, int], bytes]:
    """``records`` keyed records (acks=all); ``(partition, offset) -> key + value`` as Kafka acknowledged them."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = []
        for i in range(records):
            key = f"key-{i}".encode()
            value = key + b"=" + bytes([97 + i % 26]) * value_bytes
            futures.append((key, value, producer.send(topic, key=key, value=value)))
        producer.flush()
        written = {}
        for key, value, future in futures:
            meta = future.get(timeout=30)
            written[(meta.partition, meta.offset)] = key + b"|" + value
        return written
    finally:
        producer.close()


def consume_all(bootstrap: str, topic: str, expected: int) -> dict[tuple[int, int], bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None, consumer_timeout_ms=10_000)
    try:
        read = {}
        deadline = time.monotonic() + 60
        for record in consumer:
            read[(record.partition, record.offset)] = record.key + b"|" + record.value
            if len(read) >= expected or time.monotonic() > deadline:
                break
        return read
    finally:
        consumer.close()


def replicas_of(admin: Any, topic: str) -> dict[int, tuple[list[int], int]]:
    """``partition -> (replicas, leader)``."""
    [described] = admin.describe_topics([topic])
    return {p["partition_index"]: (list(p["replica_nodes"]), p["leader_id"]) for p in described["partitions"]}


def drain_plan(topic: str, current: dict[int, tuple[list[int], int]], drained: int, promote_one: bool = False,
               ) -> tuple[pa.Table, pa.Table]:
    """``migration_plan`` and ``ideal_assignment`` rows moving every replica on ``drained`` to a survivor.

    The copy on ``drained`` is replaced by the least loaded survivor the partition is not on; where ``drained``
    was the preferred leader the next replica becomes the preferred leader (a PROMOTE between COPY and DROP).
    ``promote_one``: the first partition not on ``drained`` also gets a PROMOTE only (its replicas rotated).
    """
    load = {b: sum(b in replicas for replicas, _ in current.values()) for b in SURVIVORS}
    steps: list[dict[str, Any]] = []
    ideal: list[dict[str, Any]] = []
    promoted_only = min((p for p, (replicas, _) in current.items() if drained not in replicas), default=None)
    for partition, (replicas, leader) in sorted(current.items()):
        if partition == promoted_only and promote_one:
            # the second replica becomes the preferred leader: a reorder and an election, no data moves
            target = [*replicas[1:], replicas[0]]
            steps.append({"topology_major": 7, "topology_minor": 1, "group_name": topic, "partition_id": partition,
                          "wave": 0, "est_start_s": 0.0, "est_end_s": 0.1, "step": 0, "action": "PROMOTE",
                          "source_node": None, "target_node": str(target[0])})
        elif drained not in replicas:
            target = replicas
        else:
            newcomer = min((b for b in SURVIVORS if b not in replicas), key=lambda b: (load[b], b))
            load[newcomer] += 1
            target = [b for b in replicas if b != drained] + [newcomer]
            start = float(len({s["partition_id"] for s in steps}))
            row = {"topology_major": 7, "topology_minor": 1, "group_name": topic, "partition_id": partition,
                   "wave": 0, "est_start_s": start, "est_end_s": start + 1.0}
            steps.append({**row, "step": 0, "action": "COPY", "source_node": str(leader),
                          "target_node": str(newcomer)})
            if replicas[0] == drained:
                steps.append({**row, "step": 1, "action": "PROMOTE", "source_node": None,
                              "target_node": str(target[0])})
            steps.append({**row, "step": 2, "action": "DROP", "source_node": str(drained), "target_node": None})
        ideal += [{"group_name": topic, "partition_id": partition, "replica_index": i, "node_id": str(b)}
                  for i, b in enumerate(target)]
    plan_schema = pa.schema([
        ("topology_major", pa.int64()), ("topology_minor", pa.int32()), ("group_name", pa.string()),
        ("partition_id", pa.int32()), ("step", pa.int32()), ("action", pa.string()), ("source_node", pa.string()),
        ("target_node", pa.string()), ("wave", pa.int32()), ("est_start_s", pa.float64()),
        ("est_end_s", pa.float64()),
    ])
    ideal_schema = pa.schema([("group_name", pa.string()), ("partition_id", pa.int32()),
                              ("replica_index", pa.int32()), ("node_id", pa.string())])
    return pa.Table.from_pylist(steps, schema=plan_schema), pa.Table.from_pylist(ideal, schema=ideal_schema)


def throttle_configs(admin: Any, topic: str, brokers: list[int]) -> dict[str, str]:
    """The replication throttle configs set on ``topic`` and ``brokers`` (``"topic:key"`` or ``"broker:key"``)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    resources = [ConfigResource(ConfigResourceType.TOPIC, topic)]
    resources += [ConfigResource(ConfigResourceType.BROKER, str(b)) for b in brokers]
    described = admin.describe_configs(resources)
    found = {}
    for kind, by_name in described.items():
        for name, configs in by_name.items():
            for key, config in configs.items():
                if "throttled" in key:
                    found[f"{kind} {name}:{key}"] = config["value"]
    return found


def assert_one_sentence(message: str) -> None:
    assert message and "\n" not in message and ". " not in message.rstrip("."), message


# ---------------------------------------------------------------- tests


def test_draining_a_broker_keeps_the_cap_the_records_and_is_idempotent(
        cluster: KafkaCluster, admin: Any, tmp_path: Path) -> None:
    topic = "drain"
    create_topic(admin, topic, partitions=12, replication=2)
    written = produce(cluster.bootstrap, topic, records=1000, value_bytes=100)
    before = replicas_of(admin, topic)
    plan, ideal = drain_plan(topic, before, DRAINED, promote_one=True)
    moves = moves_of(plan, ideal)
    [promote_only] = [m for m in moves if DRAINED not in m.touches]
    assert promote_only.promote and not promote_only.adds and not promote_only.removes
    assert len(moves) - 1 == sum(DRAINED in r for r, _ in before.values()) >= 4
    assert any(m.promote for m in moves if m.adds)

    polls: list[dict[int, int]] = []
    done: list[Move] = []
    result = execute(cluster.bootstrap, moves, cap=2, on_poll=polls.append, on_done=done.extend,
                     poll_interval_s=0.2, timeout_s=120, plan_version=(7, 1))

    assert (result.submitted, result.already_done, result.resumed, result.finished) == (len(moves), 0, 0, len(moves))
    assert sorted(m.label for m in done) == sorted(m.label for m in moves)
    assert polls and max(max(p.values(), default=0) for p in polls) <= 2
    assert max(p.get(DRAINED, 0) for p in polls) == 2  # the drained broker is the bottleneck: used to the cap
    assert 1 <= result.max_in_flight_per_broker <= 2
    after = replicas_of(admin, topic)
    for m in moves:
        assert after[m.partition] == (list(m.replicas), m.replicas[0]), m
    assert {p: after[p] for p in after if p not in {m.partition for m in moves}} == {
        p: before[p] for p in before if p not in {m.partition for m in moves}}
    assert not admin.list_partition_reassignments()
    assert consume_all(cluster.bootstrap, topic, len(written)) == written

    # Kafka's own tool reads the dry-run file and agrees every reassignment is complete
    reassignment = tmp_path / "reassignment.json"
    reassignment.write_text(json.dumps(dry_run_json(moves)))
    verify = subprocess.run(
        ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{LIB}/*",
         "org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server", cluster.bootstrap,
         "--verify", "--reassignment-json-file", str(reassignment)],
        capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for m in moves:
        assert f"Reassignment of partition {m.label} is completed." in verify.stdout, verify.stdout

    again = execute(cluster.bootstrap, moves, cap=2, poll_interval_s=0.2)
    assert (again.submitted, again.already_done, again.resumed, again.finished) == (0, len(moves), 0, 0)
    assert replicas_of(admin, topic) == after


RUN_IN_CHILD = """
import pickle, sys
from rebalancer.kafka.execute import execute
moves = pickle.loads(open(sys.argv[1], "rb").read())
execute(sys.argv[2], moves, cap=1, throttle_bytes_per_s=int(sys.argv[3]), poll_interval_s=0.2, timeout_s=300)
"""


def kill_a_run_mid_move(cluster: KafkaCluster, pickled: Path, throttle: int) -> set[int]:
    """Run :func:`execute` of the pickled moves in a child process, SIGKILL it once a reassignment is in flight.

    Returns:
        The partitions with a reassignment in flight after the kill.
    """
    child = subprocess.Popen([sys.executable, "-c", RUN_IN_CHILD, str(pickled), cluster.bootstrap, str(throttle)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with fresh_admin(cluster) as watcher:
            deadline = time.monotonic() + 60
            while not watcher.list_partition_reassignments():
                assert child.poll() is None, child.communicate()[0].decode()
                assert time.monotonic() < deadline, "no reassignment in flight within 60 s"
                time.sleep(0.05)
            time.sleep(1.0)  # a few polls of the child's: it must not submit more while the cap is used
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            return {tp.partition for tp in watcher.list_partition_reassignments()}
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        assert child.stdout is not None
        child.stdout.close()


def test_a_killed_run_is_resumed_by_the_next(cluster: KafkaCluster, admin: Any, tmp_path: Path) -> None:
    topic = "resume"
    create_topic(admin, topic, partitions=6, replication=2)
    written = produce(cluster.bootstrap, topic, records=300, value_bytes=1000)
    before = replicas_of(admin, topic)
    plan, ideal = drain_plan(topic, before, DRAINED)
    moves = moves_of(plan, ideal)
    assert len(moves) >= 2
    pickled = tmp_path / "moves.pickle"
    pickled.write_bytes(pickle.dumps(moves))
    # the first move's new broker is down: its reassignment stays in flight (Kafka accepts a registered, fenced
    # target and waits for it), and with cap 1 on the drained broker nothing else starts; the run is killed there
    offline = moves[0].adds[0]
    cluster.stop(offline)
    try:
        in_flight_at_kill = kill_a_run_mid_move(cluster, pickled, throttle=50_000)
        with fresh_admin(cluster) as watcher:
            throttled = throttle_configs(watcher, topic, [DRAINED])
        # while the broker is down the move cannot finish: a run gives up after its timeout, undoing nothing
        with pytest.raises(ExecuteError) as gave_up:
            execute(cluster.bootstrap, moves, cap=1, poll_interval_s=0.2, timeout_s=2)
        assert str(gave_up.value) == (f"1 move was still in flight and {len(moves) - 1} not submitted after 2 s: "
                                      f"nothing is undone, and a re-run resumes them")
        # the run that resumes starts while the broker is still down (else the move may finish before it looks)
        polling = threading.Event()
        outcome: dict[str, Any] = {}

        def resume() -> None:
            try:
                outcome["result"] = execute(cluster.bootstrap, moves, cap=1, throttle_bytes_per_s=10_000_000,
                                            poll_interval_s=0.2, timeout_s=180, on_poll=lambda _: polling.set())
            except BaseException as error:  # noqa: BLE001 - handed to the test's thread below
                outcome["error"] = error
                polling.set()

        resuming = threading.Thread(target=resume, daemon=True)
        resuming.start()
        assert polling.wait(60), "the resuming run did not poll within 60 s"
    finally:
        cluster.restart(offline)
    resuming.join(200)
    assert not resuming.is_alive(), "the resuming run did not finish within 200 s"
    if "error" in outcome:
        raise outcome["error"]
    result: ExecuteResult = outcome["result"]
    assert in_flight_at_kill == {moves[0].partition}
    assert f"topic {topic}:leader.replication.throttled.replicas" in throttled
    assert throttled[f"broker {DRAINED}:leader.replication.throttled.rate"] == "50000"

    assert (result.resumed, result.already_done, result.submitted) == (1, 0, len(moves) - 1)
    assert result.finished == len(moves) and result.max_in_flight_per_broker == 1
    with fresh_admin(cluster) as checker:
        after = replicas_of(checker, topic)
        for m in moves:
            assert after[m.partition] == (list(m.replicas), m.replicas[0]), m
        assert not checker.list_partition_reassignments()
        assert throttle_configs(checker, topic, [*SURVIVORS, DRAINED]) == {}
    assert consume_all(cluster.bootstrap, topic, len(written)) == written


def test_a_deleted_topic_fails_before_anything_is_written(cluster: KafkaCluster, admin: Any) -> None:
    create_topic(admin, "kept", 4, 2, assignments={0: [4, 1], 1: [2, 4], 2: [1, 2], 3: [3, 4]})
    create_topic(admin, "gone", 2, 2, assignments={0: [4, 3], 1: [1, 4]})
    kept_plan, kept_ideal = drain_plan("kept", replicas_of(admin, "kept"), DRAINED)
    gone_plan, gone_ideal = drain_plan("gone", replicas_of(admin, "gone"), DRAINED)
    moves = moves_of(pa.concat_tables([kept_plan, gone_plan]), pa.concat_tables([kept_ideal, gone_ideal]))
    assert [m.topic for m in moves].count("kept") == 3 and [m.topic for m in moves].count("gone") == 2
    before = replicas_of(admin, "kept")
    admin.delete_topics(["gone"])
    deadline = time.monotonic() + 30
    while admin.describe_topics(["gone"])[0]["error_code"] == 0:
        assert time.monotonic() < deadline, "topic 'gone' still described 30 s after its deletion"
        time.sleep(0.2)

    with pytest.raises(ExecuteError) as raised:
        execute(cluster.bootstrap, moves, cap=2, throttle_bytes_per_s=1_000_000, plan_version=(3, 0))

    assert str(raised.value) == ("topic 'gone' no longer exists on the cluster: the plan of version (3, 0) cannot be "
                                 "applied; collect and exchange again")
    assert_one_sentence(str(raised.value))
    assert replicas_of(admin, "kept") == before
    assert not admin.list_partition_reassignments()
    assert throttle_configs(admin, "kept", [*SURVIVORS, DRAINED]) == {}


def test_an_unreachable_bootstrap_fails_within_the_client_timeout() -> None:
    moves = [Move("t", 0, (1, 2), (2,), (), False, frozenset({1, 2}), 0.0)]
    started = time.monotonic()
    with pytest.raises(ExecuteError) as raised:
        execute("127.0.0.1:1", moves, cap=1, client_timeout_s=3)
    assert time.monotonic() - started < 6
    assert str(raised.value) == "no Kafka broker answered at 127.0.0.1:1 within 3 s"
