"""A real Apache Kafka cluster (KRaft) on loopback for the connector tests (docs/KAFKA.md, "Testing").

Contract:
    - :func:`missing_tools` names what is missing (``java``, ``mvn``) in one sentence, or returns None; tests skip
      with that sentence, so they never pass silently without the real system.
    - :func:`classpath` copies Kafka's jars (``interop/kafka/pom.xml``: the broker and ``kafka-tools``) from Maven
      Central into ``.cache/kafka/lib`` once per checkout, under a file lock (parallel workers fetch once).
    - :class:`KafkaCluster` runs one controller-only node and N broker-only nodes (so that losing two brokers keeps
      the metadata quorum), each its own JVM with ``-Xmx256m``, SerialGC and C1 only (FIELD-NOTES: ready in
      10-20 s, about 150-200 MiB each). Brokers can be killed (SIGKILL), stopped (SIGTERM: a controlled shutdown),
      started again and added; everything listens on 127.0.0.1 ports picked here.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POM = REPO / "interop" / "kafka" / "pom.xml"
M2 = Path(os.environ.get("REBALANCER_INTEROP_M2", REPO / ".cache" / "m2"))
LIB = REPO / ".cache" / "kafka" / "lib"
CONTROLLER_ID = 100
JVM = ["-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
       "-Djava.awt.headless=true"]


# Broker logs: WARN and above (INFO for the controller's decisions) to the node's server.log.
LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.controller.name = org.apache.kafka.controller
logger.controller.level = info
"""


class KafkaHarnessError(RuntimeError):
    """Kafka's jars could not be fetched or a node did not start; the message holds the command and the log tail."""


def missing_tools() -> str | None:
    """One sentence naming the missing tools (``java``, ``mvn``), or None when both are on the PATH."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if not missing:
        return None
    return f"Kafka tests skipped: {' and '.join(missing)} not found on the PATH (a real Kafka needs Java 17 and Maven)"


def classpath() -> str:
    """Kafka's jars as a classpath, fetched from Maven Central into ``.cache/kafka/lib`` the first time.

    Raises:
        KafkaHarnessError: Maven failed.
    """
    LIB.parent.mkdir(parents=True, exist_ok=True)
    with open(LIB.parent / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = LIB / ".complete"
        if not done.exists() or done.stat().st_mtime < POM.stat().st_mtime:
            shutil.rmtree(LIB, ignore_errors=True)
            cmd = ["mvn", "-q", "-B", f"-Dmaven.repo.local={M2}", "-f", str(POM), "dependency:copy-dependencies",
                   f"-DoutputDirectory={LIB}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KafkaHarnessError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            done.touch()
    return f"{LIB}/*"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together while picked, so they differ)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Node:
    node_id: int
    port: int
    rack: str | None
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _cluster_id() -> str:
    """A random Kafka cluster id: 22 URL-safe base64 characters that never start with '-', which kafka-storage's
    argument parser would read as an option (one id in 64 would fail the format)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
        if not candidate.startswith("-"):
            return candidate


@dataclass
class KafkaCluster:
    """One controller and brokers ``1..n`` on loopback, in ``folder``; :meth:`start` formats and launches them."""

    folder: Path
    brokers: int = 3
    racks: list[str | None] | None = None
    cluster_id: str = field(default_factory=_cluster_id)
    nodes: dict[int, Node] = field(default_factory=dict)
    controller: Node | None = None

    # ---- life cycle ----
    def start(self, timeout_s: float = 90.0) -> KafkaCluster:
        """Format and launch the controller and every broker; return once all brokers answer metadata requests."""
        cp = classpath()
        ports = free_ports(self.brokers + 1)
        self.controller = Node(CONTROLLER_ID, ports[0], None, self.folder / "controller")
        racks = self.racks or [None] * self.brokers
        for i in range(1, self.brokers + 1):
            self.nodes[i] = Node(i, ports[i], racks[i - 1], self.folder / f"broker-{i}")
        everyone = [self.controller, *self.nodes.values()]
        self._format(cp, everyone)
        for node in everyone:
            self._launch(cp, node)
        self.wait_ready(list(self.nodes), timeout_s)
        return self

    def add_broker(self, rack: str | None = None, timeout_s: float = 60.0) -> int:
        """Start one more broker (the next id) and return its id once it answers."""
        cp = classpath()
        node_id = max(self.nodes) + 1
        node = Node(node_id, free_ports(1)[0], rack, self.folder / f"broker-{node_id}")
        self.nodes[node_id] = node
        self._format(cp, [node])
        self._launch(cp, node)
        self.wait_ready([node_id], timeout_s)
        return node_id

    def kill(self, node_id: int) -> None:
        """SIGKILL a broker: a crash (the controller fences it after ``broker.session.timeout.ms``)."""
        node = self.nodes[node_id]
        if node.process is not None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(30)

    def stop(self, node_id: int, timeout_s: float = 30.0) -> None:
        """SIGTERM a broker: a controlled shutdown (leadership handed over first); SIGKILL after ``timeout_s``."""
        node = self.nodes[node_id]
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(30)

    def unregister(self, node_id: int) -> None:
        """Remove a stopped broker's registration with Kafka's own tool (``kafka-cluster unregister``): the end of
        decommissioning it."""
        cmd = ["java", *JVM, "-cp", classpath(), "org.apache.kafka.tools.ClusterTool", "unregister",
               "--bootstrap-server", self.bootstrap, "--id", str(node_id)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise KafkaHarnessError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")

    def restart(self, node_id: int, timeout_s: float = 60.0) -> None:
        """Launch a stopped or killed broker again on its own log directory."""
        self._launch(classpath(), self.nodes[node_id])
        self.wait_ready([node_id], timeout_s)

    def close(self) -> None:
        """Kill every node (SIGKILL: a clean shutdown of the last nodes can hang once the quorum is gone)."""
        for node in [*self.nodes.values(), *([self.controller] if self.controller else [])]:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait(30)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- addresses ----
    @property
    def bootstrap(self) -> str:
        """Every broker that is running, as a bootstrap list."""
        return ",".join(n.address for n in self.nodes.values() if n.alive)

    def wait_ready(self, broker_ids: list[int], timeout_s: float) -> None:
        """Wait until each broker accepts connections and the controller lists it as registered and unfenced."""
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + timeout_s
        for node_id in broker_ids:
            node = self.nodes[node_id]
            while not _listening(node.port):
                self._check(node)
                if time.monotonic() > deadline:
                    raise KafkaHarnessError(
                        f"broker {node_id} did not listen within {timeout_s} s:\n{self._tail(node)}")
                time.sleep(0.2)
        while True:
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
                try:
                    seen = {b["broker_id"] for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced")}
                finally:
                    admin.close()
                if set(broker_ids) <= seen:
                    return
            except Exception:  # noqa: BLE001 - the cluster is still starting; retried until the deadline
                pass
            if time.monotonic() > deadline:
                raise KafkaHarnessError(f"brokers {broker_ids} not all registered within {timeout_s} s")
            time.sleep(0.3)

    # ---- internals ----
    def _properties(self, node: Node) -> str:
        assert self.controller is not None
        common = {
            "node.id": node.node_id,
            "controller.quorum.voters": f"{CONTROLLER_ID}@127.0.0.1:{self.controller.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.folder / "data"),
        }
        if node.node_id == CONTROLLER_ID:
            role = {"process.roles": "controller", "listeners": f"CONTROLLER://127.0.0.1:{node.port}"}
        else:
            role = {
                "process.roles": "broker",
                "listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "offsets.topic.replication.factor": 1,
                "transaction.state.log.replication.factor": 1,
                "transaction.state.log.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0,
                # leaders move only when a test (or rebalancer's executor) asks: what it sees stays put
                "auto.leader.rebalance.enable": "false",
                "log.segment.bytes": 1048576,
                **({"broker.rack": node.rack} if node.rack else {}),
            }
        timing = {"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500}
        lines = [f"{k}={v}" for k, v in {**common, **role, **timing}.items()]
        return "\n".join(lines) + "\n"

    def _format(self, cp: str, nodes: list[Node]) -> None:
        procs = []
        for node in nodes:
            node.folder.mkdir(parents=True, exist_ok=True)
            props = node.folder / "server.properties"
            props.write_text(self._properties(node))
            cmd = ["java", *JVM, "-cp", cp, "kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}",
                   "-c", str(props), "--ignore-formatted"]
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        for cmd, proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise KafkaHarnessError(f"{' '.join(cmd)} failed:\n{out.decode()[-3000:]}")

    def _launch(self, cp: str, node: Node) -> None:
        log = open(node.folder / "server.log", "ab")  # noqa: SIM115 - owned by the process until it exits
        config = node.folder / "log4j2.properties"
        config.write_text(LOG4J2)
        cmd = ["java", *JVM, f"-Dlog4j2.configurationFile={config}", "-cp", cp, "kafka.Kafka",
               str(node.folder / "server.properties")]
        node.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)

    def _check(self, node: Node) -> None:
        if node.process is not None and node.process.poll() is not None:
            raise KafkaHarnessError(f"node {node.node_id} exited with {node.process.returncode}:\n{self._tail(node)}")

    @staticmethod
    def _tail(node: Node) -> str:
        log = node.folder / "server.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
