"""Apply a committed migration plan to a live Apache Kafka cluster (docs/KAFKA.md, "Executing a plan").

Contract:
- :func:`moves_of` turns one version's ``migration_plan`` and ``ideal_assignment`` rows into one :class:`Move` per
  partition that has plan steps: the partition's target replica list (its ideal list, preferred leader first) and
  the brokers the move occupies. Pure: no Kafka, no Spark.
- :func:`next_wave` picks, in plan order, the moves to submit now so that no broker is touched by more than ``cap``
  moves in flight (Kafka itself has no per-broker cap on concurrent reassignments). Pure.
- :func:`dry_run_json` is the file ``kafka-reassign-partitions --execute --reassignment-json-file`` reads, for an
  operator who wants to apply the plan with Kafka's own tool instead.
- :func:`execute` applies the moves: batches of ``alter_partition_reassignments`` in waves under the cap, polled
  with ``list_partition_reassignments``, then a preferred leader election where the finished leader is not the
  first replica; optional replication throttles, set before a move and removed when every move is done.
- The executor keeps no state of its own: every run derives each move's state from the cluster (DONE: no
  reassignment in flight, the replica set is the target and, if the move promotes or the leader is outside the
  target, the leader is the first replica; IN FLIGHT: Kafka lists a reassignment for the partition to the same
  target; else PENDING, and a reassignment in flight to another target, an earlier plan's, is cancelled first).
  So a run killed at any point (SIGKILL included) is resumed by running it again: in-flight moves are waited for,
  never re-submitted; finished ones are never repeated; nothing is undone.
- Every failure is an :class:`ExecuteError` whose message is one sentence. Everything that can be checked before
  writing (every topic and partition exists, every target broker is registered) is checked before the first write,
  so a plan that cannot be applied changes nothing.
- kafka-python is imported inside the functions that talk to the cluster: this module imports without it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

if TYPE_CHECKING:
    from kafka import KafkaAdminClient

_T = TypeVar("_T")
log = logging.getLogger(__name__)

# Kafka's replication throttle configs (the same ones kafka-reassign-partitions --throttle sets).
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
PREFERRED_ELECTION = 0  # ElectionType.PREFERRED in the ElectLeaders request


class ExecuteError(RuntimeError):
    """A plan cannot be applied, or the cluster did not answer; the message is one sentence."""


@dataclass(frozen=True)
class Move:
    """One partition's migration: reassign it to ``replicas`` (and elect ``replicas[0]`` its leader).

    Attributes:
        topic: The Kafka topic (rebalancer's cache group).
        partition: The partition index.
        replicas: The target replica list, broker ids, preferred leader first (the partition's ideal list).
        adds: Brokers that receive a copy (the plan's COPY targets), in step order.
        removes: Brokers whose copy is removed (the plan's DROP sources), in step order.
        promote: Whether the plan has a PROMOTE for the partition (its leader must become ``replicas[0]``).
        touches: Brokers the move occupies a slot on: COPY targets and sources, DROP sources, the PROMOTE target.
        start_s: The earliest ``est_start_s`` of its steps: where it stands in the plan's order.
    """

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adds: tuple[int, ...]
    removes: tuple[int, ...]
    promote: bool
    touches: frozenset[int]
    start_s: float

    @property
    def key(self) -> tuple[str, int]:
        """``(topic, partition)``."""
        return (self.topic, self.partition)

    @property
    def label(self) -> str:
        """``topic-partition``, Kafka's own spelling of a partition."""
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class ExecuteResult:
    """What one :func:`execute` run did.

    Attributes:
        submitted: Moves this run submitted (a reassignment, or only an election where the order already matched).
        already_done: Moves found done at start (nothing to do).
        resumed: Moves found in flight at start (a reassignment an earlier run submitted), waited for.
        finished: Moves that became done during this run (submitted or resumed).
        seconds: Wall time of the run.
        max_in_flight_per_broker: The most moves in flight on one broker at any poll (resumed ones included).
    """

    submitted: int
    already_done: int
    resumed: int
    finished: int
    seconds: float
    max_in_flight_per_broker: int


# ---------------------------------------------------------------- pure part


def _broker_id(node_id: object, what: str) -> int:
    try:
        return int(str(node_id))
    except ValueError:
        raise ExecuteError(f"{what} names node {node_id!r}, which is not a Kafka broker id") from None


def _unique(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(values))


def ideal_lists(ideal: pa.Table) -> dict[tuple[str, int], tuple[int, ...]]:
    """Every partition's ideal list as broker ids, primary first, from ``ideal_assignment`` rows of one version.

    Raises:
        ExecuteError: a node id is not a broker id (the warehouse was not collected from Kafka).
    """
    lists: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for row in ideal.select(["group_name", "partition_id", "replica_index", "node_id"]).to_pylist():
        key = (row["group_name"], int(row["partition_id"]))
        lists[key].append((int(row["replica_index"]), _broker_id(row["node_id"], f"the ideal list of {key[0]}")))
    return {key: tuple(broker for _, broker in sorted(nodes)) for key, nodes in lists.items()}


def moves_of(plan: pa.Table, ideal: pa.Table) -> list[Move]:
    """One :class:`Move` per partition that has plan steps, in plan order.

    A partition's steps become one reassignment to its ideal list: Kafka applies COPY-then-DROP safely in one
    reassignment (the new replicas join the ISR before the old ones are removed, and a removed leader hands over
    first), so the plan's order of steps inside a partition is kept by Kafka itself; the order between partitions
    is kept by submitting moves by their earliest ``est_start_s`` (:func:`next_wave`). A PROMOTE becomes the
    preferred leader first in the list, then elected.

    Args:
        plan: ``migration_plan`` rows of one version (``group_name, partition_id, step, action, source_node,
            target_node, est_start_s`` are read; other columns are ignored).
        ideal: ``ideal_assignment`` rows of the same version (``group_name, partition_id, replica_index,
            node_id``).

    Returns:
        The moves sorted by ``(start_s, topic, partition)``.

    Raises:
        ExecuteError: A planned partition has no ideal list, or a node id is not a broker id.
    """
    targets = ideal_lists(ideal)
    steps: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    columns = ["group_name", "partition_id", "step", "action", "source_node", "target_node", "est_start_s"]
    for row in plan.select(columns).to_pylist():
        steps[(row["group_name"], int(row["partition_id"]))].append(row)
    moves = []
    for (topic, partition), rows in steps.items():
        label = f"{topic}-{partition}"
        if not targets.get((topic, partition)):
            raise ExecuteError(f"partition {label} has plan steps but no ideal replica list, so the plan and the "
                               f"ideal assignment given are not of the same version")
        rows.sort(key=lambda r: r["step"])
        adds, removes, touches = [], [], set()
        promote = False
        for row in rows:
            source = None if row["source_node"] is None else _broker_id(row["source_node"], f"the plan of {label}")
            target = None if row["target_node"] is None else _broker_id(row["target_node"], f"the plan of {label}")
            if row["action"] == "COPY" and target is not None:
                adds.append(target)
                touches.add(target)
                if source is not None:
                    touches.add(source)
            elif row["action"] == "DROP" and source is not None:
                removes.append(source)
                touches.add(source)
            elif row["action"] == "PROMOTE" and target is not None:
                promote = True
                touches.add(target)
        starts = [r["est_start_s"] for r in rows if r["est_start_s"] is not None]
        moves.append(Move(
            topic=topic,
            partition=partition,
            replicas=targets[(topic, partition)],
            adds=_unique(adds),
            removes=_unique(removes),
            promote=promote,
            touches=frozenset(touches),
            start_s=min(starts) if starts else math.inf,
        ))
    moves.sort(key=lambda m: (m.start_s, m.topic, m.partition))
    return moves


def plan_version_of(plan: pa.Table) -> tuple[int, int] | None:
    """The ``(topology_major, topology_minor)`` of ``plan``'s rows, or None when the columns or rows are absent."""
    if plan.num_rows == 0 or not {"topology_major", "topology_minor"} <= set(plan.column_names):
        return None
    return (int(plan.column("topology_major")[0].as_py()), int(plan.column("topology_minor")[0].as_py()))


def in_flight_per_broker(in_flight: Iterable[Move]) -> dict[int, int]:
    """How many of the ``in_flight`` moves touch each broker (brokers touched by none are absent)."""
    return dict(Counter(broker for move in in_flight for broker in move.touches))


def next_wave(pending: Sequence[Move], in_flight: Sequence[Move], cap: int) -> list[Move]:
    """The moves to submit now: greedily in ``pending``'s order, every one that keeps each broker within ``cap``.

    A move fits when every broker it touches is touched by fewer than ``cap`` moves in flight (those already in
    flight plus those picked before it); one that does not fit is skipped and stays pending, and later moves may
    still fit (they touch other brokers).

    Args:
        pending: Moves not submitted yet, in plan order.
        in_flight: Moves whose reassignment is running; they count against the cap.
        cap: The most moves in flight on one broker (>= 1).

    Returns:
        The chosen moves, in ``pending``'s order.

    Raises:
        ValueError: ``cap`` < 1.
    """
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    load = Counter(broker for move in in_flight for broker in move.touches)
    chosen = []
    for move in pending:
        if all(load[broker] < cap for broker in move.touches):
            chosen.append(move)
            load.update(move.touches)
    return chosen


def dry_run_json(moves: Iterable[Move]) -> dict[str, Any]:
    """The moves as the reassignment file of ``kafka-reassign-partitions --execute --reassignment-json-file``.

    Args:
        moves: The moves (their ``replicas`` become the file's target lists).

    Returns:
        ``{"version": 1, "partitions": [{"topic", "partition", "replicas", "log_dirs"}]}``, ``log_dirs`` one
        ``"any"`` per replica (Kafka picks the directory), in the moves' order.
    """
    return {
        "version": 1,
        "partitions": [
            {"topic": m.topic, "partition": m.partition, "replicas": list(m.replicas),
             "log_dirs": ["any"] * len(m.replicas)}
            for m in moves
        ],
    }


def is_done(move: Move, replicas: Sequence[int], leader: int, reassigning: bool) -> bool:
    """Whether ``move`` is done given its partition's state on the cluster (module docstring: DONE).

    Args:
        move: The move.
        replicas: The partition's current replica list.
        leader: Its current leader (-1: none).
        reassigning: Whether Kafka lists a reassignment in flight for it.

    Returns:
        True when nothing is left to do for it.
    """
    if reassigning or set(replicas) != set(move.replicas):
        return False
    if move.promote or leader not in move.replicas:
        return leader == move.replicas[0]
    return True


def forget_moves(ideal: Mapping[tuple[str, int], Sequence[int]], current: Mapping[tuple[str, int], Sequence[int]],
                 alive: Iterable[int], moved: Iterable[tuple[str, int]]) -> list[Move]:
    """Reassignments that only forget replicas on brokers that are down, for partitions the plan does not move.

    The plan moves data: a copy on a broker that died is simply gone for it, and no step removes it. Kafka keeps
    such a replica in the partition's assignment (and a reassignment in flight to a broker that died stays listed)
    until it is told otherwise. So a partition whose replicas are its ideal list plus brokers that are down gets a
    reassignment to its ideal list: no data moves, and it occupies no slot of the cap.

    Args:
        ideal: Every partition's ideal list (``ideal_assignment`` of the plan's version), broker ids.
        current: Each partition's replicas on the cluster now (during a reassignment: old and new together).
        alive: The brokers that are up (registered and not fenced).
        moved: The partitions the plan moves (left alone here).

    Returns:
        The moves, sorted by partition, each with ``removes`` the forgotten brokers and no ``touches``.
    """
    up, skip = set(alive), set(moved)
    moves = []
    for key in sorted(ideal):
        target, now = tuple(ideal[key]), current.get(key)
        if key in skip or now is None or not target:
            continue
        extra = set(now) - set(target)
        if extra and set(target) <= set(now) and not extra & up:
            moves.append(Move(topic=key[0], partition=key[1], replicas=target, adds=(),
                              removes=tuple(b for b in now if b in extra), promote=False, touches=frozenset(),
                              start_s=-math.inf))
    return moves


def _version_text(plan_version: tuple[int, int] | None) -> str:
    return "the plan" if plan_version is None else f"the plan of version ({plan_version[0]}, {plan_version[1]})"


def _moves(count: int) -> str:
    return f"{count} move was" if count == 1 else f"{count} moves were"


def _one_line(error: BaseException) -> str:
    """An exception as a clause for a one-sentence message (its class name, Kafka's messages are paragraphs)."""
    return type(error).__name__


# ---------------------------------------------------------------- live part


@dataclass(frozen=True)
class _PartitionState:
    replicas: tuple[int, ...]
    leader: int


class _Admin:
    """A KafkaAdminClient that retries a failed request on a fresh client until ``timeout_s`` has passed.

    kafka-python caches the broker it took for the controller and does not pick another after a connection error,
    and its first request after a broker died can fail: a new client re-bootstraps from the live brokers. Every
    request the executor sends is idempotent (the same target list, election, APPEND of the same entries), so a
    retry after an answer was lost is harmless.
    """

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        from kafka.errors import KafkaError

        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.client: KafkaAdminClient | None = None
        try:
            self.client = self._new_client(timeout_s)
        except (KafkaError, OSError):
            raise ExecuteError(f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s") from None

    def _new_client(self, bootstrap_timeout_s: float) -> KafkaAdminClient:
        from kafka import KafkaAdminClient

        # metadata_max_age_ms=1000: replica lists and leaders change under the executor; it must see them soon
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="rebalancer-execute",
                                request_timeout_ms=int(self.timeout_s * 1000),
                                bootstrap_timeout_ms=max(1, int(bootstrap_timeout_s * 1000)),
                                metadata_max_age_ms=1000)

    def call(self, what: str, request: Callable[[KafkaAdminClient], _T]) -> _T:
        """``request(client)``, retried on a new client after a failure; ExecuteError after ``timeout_s``."""
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if self.client is None:
                    self.client = self._new_client(max(0.001, deadline - time.monotonic()))
                return request(self.client)
            # RuntimeError: kafka-python's "Failed to find active controller id!" after a controller change
            except (KafkaError, OSError, RuntimeError) as error:
                self.close()
                if time.monotonic() >= deadline:
                    raise ExecuteError(f"Kafka did not answer the request to {what} within {self.timeout_s:g} s "
                                       f"({_one_line(error)} from {self.bootstrap})") from error
                time.sleep(0.2)

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            # closing a client that already failed: nothing left to release, whatever it raises
            with contextlib.suppress(Exception):
                client.close()

    # ---- requests ----
    def brokers(self) -> dict[int, bool]:
        """Every registered broker -> whether it is alive (registered and not fenced)."""

        def request(client: KafkaAdminClient) -> dict[int, bool]:
            return {int(b["broker_id"]): not b.get("is_fenced") for b in client.describe_cluster()["brokers"]}

        return self.call("describe the cluster", request)

    def partition_states(self, topics: Iterable[str]) -> dict[str, dict[int, _PartitionState] | None]:
        """Each topic's partitions (None: the topic does not exist)."""
        names = sorted(set(topics))

        def request(client: KafkaAdminClient) -> dict[str, dict[int, _PartitionState] | None]:
            from kafka.errors import UnknownTopicOrPartitionError

            described: dict[str, dict[int, _PartitionState] | None] = {}
            for topic in client.describe_topics(names):
                if topic["error_code"] == UnknownTopicOrPartitionError.errno:
                    described[topic["name"]] = None
                elif topic["error_code"] != 0:
                    raise UnknownTopicOrPartitionError(f"error {topic['error_code']} describing {topic['name']}")
                else:
                    described[topic["name"]] = {
                        int(p["partition_index"]): _PartitionState(tuple(p["replica_nodes"]), int(p["leader_id"]))
                        for p in topic["partitions"]
                    }
            return described

        return self.call("describe the moved topics", request) if names else {}

    def reassigning(self) -> dict[tuple[str, int], frozenset[int]]:
        """Each reassignment in flight: its partition -> the replicas it ends with (its replicas less the removing)."""

        def request(client: KafkaAdminClient) -> dict[tuple[str, int], frozenset[int]]:
            return {(tp.topic, tp.partition): frozenset(int(b) for b in r["replicas"]) - {int(b) for b in
                                                                                         r["removing_replicas"]}
                    for tp, r in client.list_partition_reassignments().items()}

        return self.call("list the partition reassignments", request)

    def reassign(self, moves: Sequence[Move]) -> dict[tuple[str, int], str]:
        """Submit the moves' reassignments in one request; the refused ones with Kafka's error name."""
        from kafka import TopicPartition

        def request(client: KafkaAdminClient) -> dict[tuple[str, int], str]:
            answer = client.alter_partition_reassignments(
                {TopicPartition(m.topic, m.partition): list(m.replicas) for m in moves})
            return {(tp.topic, tp.partition): error.__name__ for tp, error in answer.items() if error is not None}

        return self.call("reassign partitions", request)

    def cancel(self, keys: Sequence[tuple[str, int]]) -> None:
        """Cancel the reassignments in flight of these partitions (each reverts to the replicas it had before)."""
        from kafka import TopicPartition

        def request(client: KafkaAdminClient) -> None:
            client.alter_partition_reassignments({TopicPartition(topic, p): None for topic, p in keys})

        self.call("cancel superseded reassignments", request)

    def elect_preferred(self, moves: Sequence[Move]) -> dict[tuple[str, int], str]:
        """Elect each move's preferred leader; the partitions where that failed, with Kafka's error name."""
        from kafka.errors import ElectionNotNeededError, for_code

        partitions: dict[str, list[int]] = defaultdict(list)
        for move in moves:
            partitions[move.topic].append(move.partition)

        def request(client: KafkaAdminClient) -> dict[tuple[str, int], str]:
            answer = client.elect_leaders(PREFERRED_ELECTION, dict(partitions), raise_errors=False)
            failed = {}
            for result in answer.replica_election_results:
                for partition in result.partition_result:
                    if partition.error_code not in (0, ElectionNotNeededError.errno):
                        failed[(result.topic, partition.partition_id)] = for_code(partition.error_code).__name__
            return failed

        return self.call("elect preferred leaders", request)

    def alter_configs(self, what: str, topics: dict[str, dict[str, Any]], brokers: dict[int, dict[str, Any]]) -> None:
        """Incremental config changes (other configs untouched); ExecuteError naming the first refused resource."""
        from kafka.admin import ConfigResource, ConfigResourceType

        resources = [ConfigResource(ConfigResourceType.TOPIC, topic, configs) for topic, configs in topics.items()]
        resources += [ConfigResource(ConfigResourceType.BROKER, str(broker), configs)
                      for broker, configs in brokers.items()]
        if not resources:
            return

        def request(client: KafkaAdminClient) -> dict[str, dict[str, str]]:
            # raise_on_unknown=False: kafka-python only knows the dynamic configs a describe lists, and a broker's
            # throttle rates are listed only once set
            answer: dict[str, dict[str, str]] = client.alter_configs(resources, raise_on_unknown=False,
                                                                     incremental=True)
            return answer

        answer = self.call(what, request)
        for kind, results in answer.items():
            for name, outcome in results.items():
                if outcome != "OK":
                    error = outcome.split(":")[0].strip()
                    raise ExecuteError(f"Kafka refused to {what} on {kind} {name} ({error}): a re-run retries it")


def _throttle_configs(moves: Sequence[Move], states: dict[tuple[str, int], _PartitionState], rate: int,
                      ) -> tuple[dict[str, dict[str, Any]], dict[int, dict[str, Any]]]:
    """The topic and broker configs that throttle ``moves`` (appended: throttles of other moves stay)."""
    from kafka.admin import AlterConfigOp

    leaders: dict[str, list[str]] = defaultdict(list)
    followers: dict[str, list[str]] = defaultdict(list)
    brokers: set[int] = set()
    for move in moves:
        current = states[move.key].replicas
        # the replicas that serve the copy are the current ones (Kafka replicates from the leader, whichever it is)
        leaders[move.topic] += [f"{move.partition}:{b}" for b in current]
        followers[move.topic] += [f"{move.partition}:{b}" for b in move.replicas if b not in current]
        # the rate applies on the brokers that send and receive: the touched ones and the actual leader side
        brokers |= move.touches | set(current) | set(move.replicas)
    topics: dict[str, dict[str, Any]] = {}
    for topic in leaders:
        topics[topic] = {LEADER_THROTTLED_REPLICAS: (AlterConfigOp.APPEND, ",".join(leaders[topic]))}
        if followers[topic]:
            topics[topic][FOLLOWER_THROTTLED_REPLICAS] = (AlterConfigOp.APPEND, ",".join(followers[topic]))
    rates = {LEADER_THROTTLED_RATE: str(rate), FOLLOWER_THROTTLED_RATE: str(rate)}
    return topics, {broker: dict(rates) for broker in sorted(brokers)}


def _clear_throttles(admin: _Admin, topics: Iterable[str], brokers: Iterable[int]) -> None:
    from kafka.admin import AlterConfigOp

    delete = (AlterConfigOp.DELETE, None)
    admin.alter_configs(
        "remove the replication throttles",
        {topic: {LEADER_THROTTLED_REPLICAS: delete, FOLLOWER_THROTTLED_REPLICAS: delete} for topic in sorted(topics)},
        {broker: {LEADER_THROTTLED_RATE: delete, FOLLOWER_THROTTLED_RATE: delete} for broker in sorted(brokers)},
    )


def _current_states(admin: _Admin, moves: Sequence[Move], plan_version: tuple[int, int] | None,
                    ) -> dict[tuple[str, int], _PartitionState]:
    """Every move's partition state; ExecuteError when a topic or partition is gone."""
    described = admin.partition_states(m.topic for m in moves)
    states = {}
    for move in moves:
        partitions = described.get(move.topic)
        if partitions is None:
            raise ExecuteError(f"topic {move.topic!r} no longer exists on the cluster: {_version_text(plan_version)} "
                               f"cannot be applied; collect and exchange again")
        if move.partition not in partitions:
            raise ExecuteError(f"partition {move.label} no longer exists on the cluster: "
                               f"{_version_text(plan_version)} cannot be applied; collect and exchange again")
        states[move.key] = partitions[move.partition]
    return states


def execute(
    bootstrap: str,
    moves: Sequence[Move],
    *,
    cap: int,
    throttle_bytes_per_s: int = 0,
    poll_interval_s: float = 0.5,
    timeout_s: float = 600,
    client_timeout_s: float = 15,
    on_done: Callable[[list[Move]], None] | None = None,
    on_poll: Callable[[dict[int, int]], None] | None = None,
    plan_version: tuple[int, int] | None = None,
    ideal: Mapping[tuple[str, int], Sequence[int]] | None = None,
) -> ExecuteResult:
    """Apply ``moves`` to the Kafka cluster at ``bootstrap`` and wait until every one is done.

    Resumable with no state of its own (module docstring): moves already done are skipped, reassignments found in
    flight are waited for (never re-submitted), the rest are submitted in plan order, at most ``cap`` moves in
    flight per broker. A finished move whose leader is not its first replica gets a preferred leader election.

    Args:
        bootstrap: ``host:port[,host:port...]`` of the cluster.
        moves: The moves (:func:`moves_of`), in plan order.
        cap: The most moves in flight on one broker (>= 1); moves found in flight count against it.
        throttle_bytes_per_s: > 0: a replication throttle (bytes per second) on the moved replicas and every broker
            a move involves, set before the move is submitted and removed (incremental DELETE) once every move is
            done; 0: none, throttle configs are left as they are.
        poll_interval_s: How often to ask Kafka which reassignments are still in flight.
        timeout_s: The longest the run may take before it gives up (nothing is undone; a re-run resumes).
        client_timeout_s: The longest one admin request (with its retries) or the first connection may take.
        on_done: Called with the moves that became done, each time some do.
        on_poll: Called at each poll with ``{broker: moves in flight touching it}``.
        plan_version: The plan's ``(topology_major, topology_minor)`` (:func:`plan_version_of`), for the messages.
        ideal: Every partition's ideal list at the plan's version: partitions the plan does not move whose
            replicas also name brokers that are down are reassigned to it (:func:`forget_moves`).

    Returns:
        What the run did (:class:`ExecuteResult`).

    Raises:
        ExecuteError: No broker answered; a moved topic or partition no longer exists or a target broker is not
            registered (checked before anything is written); Kafka refused a reassignment or a throttle; the
            moves were not all done within ``timeout_s``.
        ValueError: ``cap`` < 1, or two moves of the same partition.
    """
    started = time.monotonic()
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    duplicated = [label for label, n in Counter(m.label for m in moves).items() if n > 1]
    if duplicated:
        raise ValueError(f"partition {duplicated[0]} has more than one move")
    admin = _Admin(bootstrap, client_timeout_s)
    try:
        if ideal:
            moves = [*forget_moves(ideal, _assigned(admin, {t for t, _ in ideal}), _alive(admin),
                                   {m.key for m in moves}), *moves]
        return _run(admin, list(moves), cap, throttle_bytes_per_s, poll_interval_s, timeout_s, started, on_done,
                    on_poll, plan_version)
    finally:
        admin.close()


def _assigned(admin: _Admin, topics: set[str]) -> dict[tuple[str, int], tuple[int, ...]]:
    """Every partition's replicas now, for the topics that still exist."""
    return {(topic, p): state.replicas for topic, parts in admin.partition_states(topics).items() if parts
            for p, state in parts.items()}


def _alive(admin: _Admin) -> set[int]:
    return {b for b, up in admin.brokers().items() if up}


def _run(admin: _Admin, moves: list[Move], cap: int, throttle: int, poll_interval_s: float, timeout_s: float,
         started: float, on_done: Callable[[list[Move]], None] | None,
         on_poll: Callable[[dict[int, int]], None] | None, plan_version: tuple[int, int] | None) -> ExecuteResult:
    # ---- everything checked before the first write ----
    states = _current_states(admin, moves, plan_version)
    registered = set(admin.brokers())
    for move in moves:
        unknown = sorted(set(move.replicas) - registered)
        if unknown:
            raise ExecuteError(f"broker {unknown[0]} (a target of {move.label}) is not registered in the cluster: "
                               f"{_version_text(plan_version)} cannot be applied; collect and exchange again")
    reassigning = admin.reassigning()

    pending: list[Move] = []
    in_flight: list[Move] = []
    superseded: list[Move] = []
    already_done = 0
    for move in moves:
        state = states[move.key]
        if reassigning.get(move.key) == frozenset(move.replicas):
            in_flight.append(move)
        elif move.key in reassigning:
            superseded.append(move)
        elif is_done(move, state.replicas, state.leader, reassigning=False):
            already_done += 1
        else:
            pending.append(move)
    if superseded:
        # A reassignment to another target is in flight: an earlier plan's, re-planned since (its target broker
        # died, say). Kafka 4.4 accepts a new target over it but may then never complete it (measured: a target
        # already in the ISR left listed with the dead broker both adding and removing), so it is cancelled first
        # (the partition reverts to its replicas before that move, none of this plan's steps) and then submitted.
        admin.cancel([m.key for m in superseded])
        deadline = time.monotonic() + max(10.0, 20 * poll_interval_s)
        while set(admin.reassigning()) & {m.key for m in superseded} and time.monotonic() < deadline:
            time.sleep(poll_interval_s)
        states.update(_current_states(admin, superseded, plan_version))
        pending = sorted([*pending, *superseded], key=lambda m: (m.start_s, m.topic, m.partition))
    resumed = len(in_flight)
    throttled_topics = {m.topic for m in moves}
    throttled_brokers = {b for m in moves for b in m.touches | set(m.replicas) | set(states[m.key].replicas)}

    electing: list[Move] = []  # reassignment finished, preferred leader not elected yet
    unsettled_since: dict[tuple[str, int], float] = {}  # in flight, no longer listed, not at the target yet
    cancelled_after_s = max(5.0, 10 * poll_interval_s)
    submitted: set[tuple[str, int]] = set()
    finished = 0
    max_load = max(in_flight_per_broker(in_flight).values(), default=0)
    while pending or in_flight or electing:
        if time.monotonic() - started > timeout_s:
            running = len(in_flight) + len(electing)
            raise ExecuteError(f"{_moves(running)} still in flight and {len(pending)} not submitted after "
                               f"{timeout_s:g} s: nothing is undone, and a re-run resumes them")
        wave = next_wave(pending, in_flight, cap)
        if wave:
            reorder_only = [m for m in wave if list(states[m.key].replicas) == list(m.replicas)]
            to_reassign = [m for m in wave if m not in reorder_only]
            if to_reassign:
                if throttle > 0:
                    topics, rates = _throttle_configs(to_reassign, states, throttle)
                    # a broker's config is sent to the broker itself: one that is down cannot take it (the live
                    # side of each copy still throttles it)
                    alive = {b for b, up in admin.brokers().items() if up}
                    admin.alter_configs("set the replication throttles", topics,
                                        {b: configs for b, configs in rates.items() if b in alive})
                log.info("reassigning %s", ", ".join(f"{m.label} {list(states[m.key].replicas)} -> {list(m.replicas)}"
                                                     for m in to_reassign))
                refused = admin.reassign(to_reassign)
                if refused:
                    (topic, partition), error = sorted(refused.items())[0]
                    others = f" and of {len(refused) - 1} other partitions" if len(refused) > 1 else ""
                    raise ExecuteError(f"Kafka refused the reassignment of {topic}-{partition} ({error}){others}: "
                                       f"the accepted moves keep running and a re-run resumes them")
            in_flight += to_reassign
            # the replica order is already the target: only the leader is left to elect
            electing += reorder_only
            submitted |= {m.key for m in wave}
            chosen = {m.key for m in wave}
            pending = [m for m in pending if m.key not in chosen]
        load = in_flight_per_broker(in_flight)
        max_load = max(max_load, *load.values(), 0)
        if on_poll is not None:
            on_poll(load)
        if in_flight:
            time.sleep(poll_interval_s)
            reassigning = admin.reassigning()
            settled = [m for m in in_flight if m.key not in reassigning]
            if settled:
                states.update(_current_states(admin, settled, plan_version))
                for move in settled:
                    if set(states[move.key].replicas) == set(move.replicas):
                        in_flight.remove(move)
                        unsettled_since.pop(move.key, None)
                        electing.append(move)
                        continue
                    # not listed, yet not at the target: the metadata answer (from any broker) is older than the
                    # list (from the controller), or someone cancelled the move; wait a while before taking it
                    # for cancelled and submitting it again
                    first_seen = unsettled_since.setdefault(move.key, time.monotonic())
                    if time.monotonic() - first_seen > cancelled_after_s:
                        log.info("%s: no reassignment listed for %.1f s, replicas %s, target %s: submitted again",
                                 move.label, cancelled_after_s, list(states[move.key].replicas), list(move.replicas))
                        in_flight.remove(move)
                        del unsettled_since[move.key]
                        pending.append(move)
                pending.sort(key=lambda m: (m.start_s, m.topic, m.partition))
        if electing:
            needs_election = [m for m in electing if states[m.key].leader != m.replicas[0]]
            failed = admin.elect_preferred(needs_election) if needs_election else {}
            done = [m for m in electing
                    if m.key not in failed or (not m.promote and states[m.key].leader in m.replicas)]
            electing = [m for m in electing if m not in done]
            finished += len(done)
            if done and on_done is not None:
                on_done(done)
            if electing:
                # the preferred leader is not in the ISR yet (a broker restarting): ask again at the next poll
                time.sleep(poll_interval_s)
                states.update(_current_states(admin, electing, plan_version))
    if throttle > 0:
        # a broker down now keeps its rate, harmless: the rate applies only to the throttled replicas listed on the
        # topics, and those lists are removed here
        alive = {b for b, up in admin.brokers().items() if up}
        _clear_throttles(admin, throttled_topics, throttled_brokers & alive)
    return ExecuteResult(
        submitted=len(submitted),
        already_done=already_done,
        resumed=resumed,
        finished=finished,
        seconds=time.monotonic() - started,
        max_in_flight_per_broker=max_load,
    )
