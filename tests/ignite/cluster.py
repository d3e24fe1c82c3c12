"""A live Apache Ignite 2.17 cluster for tests that read a *running* cluster through its public interfaces.

``interop/ignite-live`` (``IgniteLiveCluster.java``) hosts several server nodes in one JVM, each with a thin-client
port on 127.0.0.1, and stays up while a test drives it one command at a time. Every command is answered after the
cluster settled, with Ignite's own view of itself (nodes, ideal and serving assignment, every node's partitions with
state, update counter and size, lost partitions, baseline): the truth to compare a collector's reading with.

Contract:
    - :func:`classpath` builds the module once per checkout under a file lock (``mvn -o`` when the jars are in
      ``.cache/m2``, else online from Maven Central), as ``tests/interop/harness.py`` does for ``interop/``.
    - :class:`IgniteCluster` is a context manager: ``step(op)`` sends one command (the Java class comment lists
      them) and returns the parsed answer, raising :class:`~tests.interop.harness.HarnessError` when Ignite refused
      it or the JVM died, and ``TimeoutError`` when no answer came in time; ``close()`` always kills the JVM.
    - :meth:`IgniteCluster.control_command` is the command line of Ignite's control utility (``control.sh``)
      against a live node, to which a test appends e.g. ``["--cache", "distribution", "null"]``.

Tests skip with :func:`tests.interop.harness.missing_tools`'s sentence when ``java`` or ``mvn`` is missing.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.interop.harness import REPO, HarnessError, build_classpath, free_base, ignite_jvm_options

MODULE = REPO / "interop" / "ignite-live"
MAIN = "rebalancer.interop.live.IgniteLiveCluster"
CONTROL_MAIN = "org.apache.ignite.internal.commandline.CommandHandler"  # control.sh's main class in 2.17
# Ports from the base: discovery base..+19, communication base+50..+69, thin client base+100..+119 (the Java side).
PORT_SPAN = 120


def classpath() -> str:
    """Classes + dependency jars of ``interop/ignite-live`` (Ignite 2.17 with indexing and the control utility).

    Raises:
        HarnessError: Maven failed (offline with a cold cache falls back to online once).
    """
    return build_classpath(MODULE)


def _java_options(heap: str) -> list[str]:
    """Ignite's ``--add-opens`` for Java 17 (interop/jvm-ignite.options) and quiet logging, with our heap size."""
    return [f"-Xmx{heap}", *(o for o in ignite_jvm_options() if not o.startswith("-Xmx"))]


class IgniteCluster:
    """One live Ignite JVM; use as ``with IgniteCluster(tmp_path) as cluster: cluster.step({"op": "start", ...})``.

    The nodes' work directory is ``workdir / "work"``: a persistent cluster started again on the same ``workdir``
    finds its data and baseline there. The JVM also stops its nodes and exits when its stdin closes, so a test
    process that dies leaves no cluster behind. After a ``TimeoutError`` the next answer may belong to the command
    that timed out: close the cluster.

    Attributes:
        last: the most recent answer (the dump after the last step).
        log_path: the JVM's log (Ignite's output and stack traces), quoted in errors.
    """

    def __init__(self, workdir: Path, heap: str = "1g", step_timeout_s: float = 120) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heap = heap
        self.step_timeout_s = step_timeout_s
        self.log_path = self.workdir / "ignite-live.log"
        self.last: dict[str, Any] = {}
        self._cp = classpath()
        self.base_port = free_base(PORT_SPAN)
        cmd = ["java", *_java_options(heap), "-cp", self._cp, MAIN, str(self.base_port), str(self.workdir / "work")]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        # A reader thread, so that a step can time out instead of blocking on a JVM that never answers.
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def step(self, op: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Send one command, wait for the settled cluster's answer and return it (also kept in :attr:`last`).

        Raises:
            HarnessError: Ignite refused the command (the answer's ``error``) or the JVM exited.
            TimeoutError: no answer within ``timeout_s`` (default: the constructor's ``step_timeout_s``).
        """
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(op) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError as e:
            raise HarnessError(f"the Ignite JVM is gone (log {self.log_path}):\n{self._tail()}") from e
        try:
            line = self._lines.get(timeout=timeout_s or self.step_timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer to {op} within {timeout_s or self.step_timeout_s} s "
                               f"(log {self.log_path})") from None
        if line is None:
            raise HarnessError(f"the Ignite JVM exited during {op} (log {self.log_path}):\n{self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise HarnessError(f"{op} failed: {answer['error']}")
        self.last = answer
        return answer

    @property
    def thin_ports(self) -> dict[str, int]:
        """Thin-client port of every live node, by node name (as of the last answer)."""
        return {n["name"]: n["thin_port"] for n in self.last.get("nodes", []) if n["alive"]}

    def host_port(self, node: str | None = None) -> tuple[str, int]:
        """``(host, thin-client port)`` of ``node``, or of the first live node; what pyignite's ``connect`` takes."""
        ports = self.thin_ports
        if not ports:
            raise HarnessError("no live node")
        return "127.0.0.1", ports[node] if node is not None else next(iter(ports.values()))

    def control_command(self, node: str | None = None, heap: str = "256m") -> list[str]:
        """The control utility (``control.sh``) against a live node; append the command, e.g. ``--cache ...``.

        It runs in its own JVM and connects through the node's thin-client port, as a real operator's would.
        """
        host, port = self.host_port(node)
        # IGNITE_HOME: where idle_verify writes its conflict report (else ./ignite/work/log under the caller's cwd).
        home = self.workdir / "control"
        return ["java", *_java_options(heap), f"-DIGNITE_HOME={home}", "-cp", self._cp, CONTROL_MAIN,
                "--host", host, "--port", str(port)]

    def _tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        """Ask the JVM to stop its nodes; kill it if it has not exited within 15 s. Idempotent."""
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write('{"op": "shutdown"}\n')
                self._proc.stdin.close()
                self._proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> IgniteCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
