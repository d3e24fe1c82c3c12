"""Build and run the Java interop harnesses (interop/, docs/INTEROP.md): real Ignite 2.x and Hazelcast 5.x in one JVM.

Contract:
    - :func:`missing_tools` names what is missing (``java``, ``mvn``) in one sentence, or returns None; tests skip
      with that sentence, so they never pass silently without the real systems.
    - :func:`classpath` builds ``interop/`` once per checkout (``mvn -o`` when the jars are cached in
      ``.cache/m2``, else online from Maven Central) under a file lock, so parallel test workers build once.
    - :func:`run_ignite` / :func:`run_hazelcast` write the script as JSON, run one JVM (loopback only, a free port
      range picked here, below the ephemeral ports Spark's connections take) and return the parsed JSON it dumped.
    - :func:`once_per_session` runs such a JVM once per test session even when several xdist workers need its
      dump: the first computes it under a file lock in the session's shared temporary folder, the others read it.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
INTEROP = REPO / "interop"
M2 = Path(os.environ.get("REBALANCER_INTEROP_M2", REPO / ".cache" / "m2"))
IGNITE_MAIN = "rebalancer.interop.IgniteHarness"
HAZELCAST_MAIN = "rebalancer.interop.HazelcastHarness"
# Port ranges tried for the harness JVMs: discovery/member ports base..base+19, Ignite communication base+50..+69.
# Below Linux's ephemeral ports (32768-60999): the outgoing connections of busy Spark processes beside the harness
# (CI runs them side by side) take ephemeral ports at random, and once left no free range of 120 in 47500-48450.
PORT_LOW, PORT_HIGH, PORT_SPAN = 20000, 32000, 80


class HarnessError(RuntimeError):
    """The harness failed to build or its JVM failed; the message holds the command and the log's tail."""


def missing_tools() -> str | None:
    """One sentence naming the missing tools (``java``, ``mvn``), or None when both are on the PATH."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if not missing:
        return None
    names = " and ".join(missing)
    return f"interop tests skipped: {names} not found on the PATH (real Ignite and Hazelcast need Java 17 and Maven)"


def build_classpath(module: Path) -> str:
    """The classpath (classes + dependency jars) of the Maven module at ``module``, building it first when stale:
    ``mvn -o`` when the jars are cached in ``.cache/m2``, else online from Maven Central, under a file lock so that
    parallel test workers build once.

    Raises:
        HarnessError: Maven failed (offline with a cold cache falls back to online once).
    """
    target = module / "target"
    classes, listing = target / "classes", target / "classpath.txt"
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        newest = max(f.stat().st_mtime for f in [module / "pom.xml", *module.joinpath("src").rglob("*.java")])
        if not (listing.exists() and classes.exists() and listing.stat().st_mtime >= newest):
            goals = ["compile", "dependency:build-classpath", f"-Dmdep.outputFile={listing}"]
            base = ["mvn", "-q", "-B", f"-Dmaven.repo.local={M2}", "-f", str(module / "pom.xml"), *goals]
            offline = subprocess.run([*base[:1], "-o", *base[1:]], capture_output=True, text=True)
            if offline.returncode != 0:
                online = subprocess.run(base, capture_output=True, text=True)
                if online.returncode != 0:
                    raise HarnessError(f"{' '.join(base)} failed:\n{online.stdout[-3000:]}{online.stderr[-3000:]}")
            listing.touch()
    return f"{classes}{os.pathsep}{listing.read_text().strip()}"


def classpath() -> str:
    """The harness classpath of ``interop/`` (:func:`build_classpath`)."""
    return build_classpath(INTEROP)


def worker_ports(low: int = PORT_LOW, high: int = PORT_HIGH) -> range:
    """This test worker's own band of ``low..high``: pytest-xdist's workers get disjoint bands, so two clusters started
    at once by two workers can never find each other (with one range for all, two Ignite clusters once did: a node
    of one joined the other and was refused for its duplicate consistent id). The whole range outside xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return range(low, high)
    band = (high - low) // count
    start = low + int(worker[2:]) % count * band
    return range(start, start + band)


def free_base(span: int = PORT_SPAN) -> int:
    """A port base whose ``span`` ports are all free on 127.0.0.1, in this worker's band (:func:`worker_ports`;
    random start, so concurrent runs of the suite rarely collide)."""
    ports = worker_ports()
    bases = list(range(ports.start, ports.stop - span + 1, span))
    random.shuffle(bases)
    for base in bases:
        try:
            for port in range(base, base + span):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise HarnessError(f"no free port range of {span} between {ports.start} and {ports.stop} on 127.0.0.1")


def _jvm(main: str, script: dict[str, Any], workdir: Path, jvm_options: list[str], timeout_s: float) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    script = {"base_port": free_base(), "work_dir": str(workdir / "work"), **script}
    script_path, out_path, log_path = workdir / "script.json", workdir / "out.json", workdir / "jvm.log"
    script_path.write_text(json.dumps(script))
    cmd = ["java", *jvm_options, "-cp", classpath(), main, str(script_path), str(out_path)]
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s)
    if proc.returncode != 0 or not out_path.exists():
        tail = log_path.read_text()[-4000:]
        raise HarnessError(f"{main} exited with {proc.returncode} (log {log_path}):\n{tail}")
    out: dict[str, Any] = json.loads(out_path.read_text())
    out["wall_s"] = round(time.perf_counter() - started, 2)
    return out


def ignite_jvm_options() -> list[str]:
    """The ``--add-opens`` options Ignite documents for Java 11+ (interop/jvm-ignite.options) and quiet logging."""
    opens = [line.strip() for line in (INTEROP / "jvm-ignite.options").read_text().splitlines() if line.strip()]
    return ["-Xmx1g", "-XX:+UseSerialGC", *opens, "-DIGNITE_QUIET=true", "-DIGNITE_NO_ASCII=true",
            "-DIGNITE_UPDATE_NOTIFIER=false", "-Djava.net.preferIPv4Stack=true"]


def run_ignite(script: dict[str, Any], workdir: Path, timeout_s: float = 600) -> dict[str, Any]:
    """Run an Ignite script (steps, caches, nodes; docs/INTEROP.md) and return its dump.

    Raises:
        HarnessError: the build or the JVM failed.
        subprocess.TimeoutExpired: the JVM ran longer than ``timeout_s``.
    """
    return _jvm(IGNITE_MAIN, script, workdir, ignite_jvm_options(), timeout_s)


def run_hazelcast(script: dict[str, Any], workdir: Path, heap: str = "1g", timeout_s: float = 600) -> dict[str, Any]:
    """Run a Hazelcast script (members, membership steps, keys; docs/INTEROP.md) and return its dump.

    Raises:
        HarnessError: the build or the JVM failed.
        subprocess.TimeoutExpired: the JVM ran longer than ``timeout_s``.
    """
    opts = [f"-Xmx{heap}", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
            "--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
            "-Dhazelcast.phone.home.enabled=false", "-Dhazelcast.logging.type=jdk"]
    return _jvm(HAZELCAST_MAIN, script, workdir, opts, timeout_s)


def once_per_session(base_temp: Path, name: str, compute: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``compute(workdir)`` once per session (all xdist workers), its JSON-able result shared through a file.

    Args:
        base_temp: ``tmp_path_factory.getbasetemp()``; under xdist each worker's is a child of the session's folder.
        name: what the run is (a file name).
        compute: runs the JVM in the given work folder and returns its dump.
    """
    shared = base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp
    folder = shared / "interop-runs"
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            out = compute(folder / name)
            result.write_text(json.dumps(out))
        loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded
