"""Benchmark: the same Kafka cluster and change planned by ``kafka-reassign-partitions --generate`` and by rebalancer.

For each scenario (``failure``: the last broker SIGKILLed for good; ``join``: one broker added, in a third rack)
two identical real Kafka 4.4 clusters are started one after the other (tests/kafka/cluster.py; never both at once):
the same brokers and racks, the same topics created with the same explicit replica assignments (a Kafka-like
rack-aware round robin computed here, so both start identical), the same records produced with acks=all. Then:

- cluster A, Kafka's own tool: topics-to-move JSON, ``ReassignPartitionsCommand --generate`` over the alive
  brokers (rack-aware by default), its proposed assignment ``--execute``d with ``--throttle``, ``--verify`` polled
  until every partition is complete (which also removes the throttles);
- cluster B, rebalancer: collect + exchange on the healthy cluster (adoption: nothing planned), the change, then
  collect + exchange (planning) and ``execute_plan`` under the same throttle, ``migration.max_parallel_per_node`` at
  its default.

Both are measured from the cluster itself, final state against the state before the change: replicas moved, bytes
copied, leaders changed, partitions with two replicas in one rack, replicas and leaders per alive broker (max and
mean), the time to finish (the tool's wall time, and when the cluster's assignment reached its final state with no
reassignment in flight, sampled every 0.5 s by a thread of this script), and every record read back.

Run from the repository root: ``.venv/bin/python bench/kafka_compare.py [--out bench/results/kafka_compare.json]``
(needs java and mvn; about 9 minutes on a 2-core machine with the defaults). Prints the docs/KAFKA.md table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.repo import select_one_seconds  # noqa: E402
from tests.kafka.cluster import JVM, KafkaCluster, classpath, missing_tools  # noqa: E402
from tests.kafka.live import admin, describe, records, wait_fenced, wait_until, warehouse  # noqa: E402

TOOL = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
RACKS = ("a", "b")
JOIN_RACK = "c"
SCENARIOS = ("failure", "join")
Assignment = dict[str, dict[int, dict[str, Any]]]  # topic -> partition -> {replicas, isr, leader}


# ---------------------------------------------------------------- the identical start


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """The brokers ordered rack by rack in turn (a, b, a, b, ...), as Kafka's rack-aware assignment orders them."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    order = []
    for i in range(max(len(v) for v in by_rack.values())):
        order += [by_rack[r][i] for r in sorted(by_rack) if i < len(by_rack[r])]
    return order


def kafka_like_layout(racks: dict[int, str], partitions: int, replication: int, start: int) -> dict[int, list[int]]:
    """A rack-aware round robin like Kafka's (AdminUtils), with a fixed start instead of a random one.

    Partition ``p``'s first replica is the ``(start + p)``-th broker of the rack-alternated list; the others follow
    it at Kafka's shift (``1 + (p // n) % (n - 1)``), skipping a broker whose rack already holds a replica while some
    rack holds none, and a broker already chosen.
    """
    order = rack_alternated(racks)
    n, all_racks = len(order), set(racks.values())
    layout = {}
    for p in range(partitions):
        first = (start + p) % n
        replicas = [order[first]]
        index = first + 1 + (p // n) % max(1, n - 1)
        while len(replicas) < replication:
            broker = order[index % n]
            used = {racks[b] for b in replicas}
            if broker not in replicas and (racks[broker] not in used or used == all_racks):
                replicas.append(broker)
            index += 1
        layout[p] = replicas
    return layout


def create_topics(cluster: KafkaCluster, layouts: dict[str, dict[int, list[int]]]) -> None:
    """Topics with explicit replica assignments; waits until every partition's leader is its first replica."""
    from kafka.admin import NewTopic

    client = admin(cluster)
    try:
        client.create_topics([NewTopic(name, replica_assignments=layout) for name, layout in layouts.items()])
    finally:
        client.close()
    wait_until(lambda: all(s["leader"] == layouts[t][p][0] for t, parts in describe(cluster, list(layouts)).items()
                           for p, s in parts.items()) and len(describe(cluster, list(layouts))) == len(layouts),
               60, "topics created with their preferred leaders")


def produce(cluster: KafkaCluster, topic: str, count: int, size: int) -> None:
    """``count`` records of ``size`` bytes, keyed ``k<i>`` (the same partitions on every cluster), acks=all."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=20, batch_size=262144,
                             max_request_size=4194304)
    for i in range(count):
        producer.send(topic, key=f"k{i}".encode(), value=f"{topic}-{i}-".encode().ljust(size, b"x"))
    producer.flush()
    producer.close()


# ---------------------------------------------------------------- watching the cluster


class Sampler(threading.Thread):
    """Every ``interval_s``: each topic's replica sets and whether any reassignment is in flight, timestamped."""

    def __init__(self, cluster: KafkaCluster, topics: list[str], interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topics, self.interval_s = cluster, topics, interval_s
        self.samples: list[tuple[float, dict[tuple[str, int], frozenset[int]] | None, bool]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        client = None
        while not self.halt.is_set():
            now = time.monotonic()
            try:
                client = client or admin(self.cluster)
                replicas = {(t["name"], p["partition_index"]): frozenset(p["replica_nodes"])
                            for t in client.describe_topics(self.topics) for p in t["partitions"]}
                moving = bool(client.list_partition_reassignments())
                self.samples.append((now, replicas, moving))
            except Exception:  # noqa: BLE001 - a sample lost while the cluster changes; the next one counts
                if client is not None:
                    client.close()
                client = None
                self.samples.append((now, None, True))
            self.halt.wait(self.interval_s)
        if client is not None:
            client.close()

    def settled_at(self, final: Assignment, since: float) -> float | None:
        """Seconds from ``since`` to the first sample after which the cluster stayed at ``final``, nothing moving."""
        want = {(t, p): frozenset(s["replicas"]) for t, parts in final.items() for p, s in parts.items()}
        settled = None
        for at, replicas, moving in self.samples:
            if at < since:
                continue
            at_final = replicas == want and not moving
            settled = (settled or at) if at_final else None
        return None if settled is None else round(settled - since, 1)


def state_figures(before: Assignment, changed: Assignment, after: Assignment, racks: dict[int, str],
                  alive: list[int], partition_bytes: dict[tuple[str, int], int]) -> dict[str, Any]:
    """What a run did to the cluster: ``before`` the change, ``changed`` just after it, ``after`` the run."""
    moved = copied = removed = leaders_changed = same_rack = 0
    replicas: Counter[int] = Counter()
    leaders: Counter[int] = Counter()
    preferred: Counter[int] = Counter()
    under_replicated = 0
    for topic, parts in after.items():
        for p, now in parts.items():
            old = set(before[topic][p]["replicas"])
            added = set(now["replicas"]) - old
            moved += len(added)
            copied += len(added) * partition_bytes.get((topic, p), 0)
            removed += len(old - set(now["replicas"]))
            leaders_changed += now["leader"] != changed[topic][p]["leader"]
            zones = [racks[b] for b in now["replicas"]]
            same_rack += len(set(zones)) < len(zones)
            under_replicated += len(now["isr"]) < len(now["replicas"])
            replicas.update(now["replicas"])
            leaders[now["leader"]] += 1
            preferred[now["replicas"][0]] += 1
    count = len(alive)

    def spread(c: Counter[int]) -> dict[str, float]:
        return {"max": max(c[b] for b in alive), "min": min(c[b] for b in alive),
                "mean": round(sum(c[b] for b in alive) / count, 2)}

    return {"replicas_moved": moved, "replicas_removed": removed, "mb_copied": round(copied / 1e6, 2),
            "leaders_changed": leaders_changed, "partitions_two_replicas_one_rack": same_rack,
            "under_replicated_at_end": under_replicated, "on_dead_brokers": sum(replicas[b] for b in replicas
                                                                                if b not in alive),
            "replicas_per_broker": spread(replicas), "leaders_per_broker": spread(leaders),
            "preferred_leaders_per_broker": spread(preferred),
            "replicas_by_broker": {b: replicas[b] for b in alive}, "leaders_by_broker": {b: leaders[b] for b in alive}}


# ---------------------------------------------------------------- the two planners


def tool(cluster: KafkaCluster, *args: str, timeout_s: float = 300) -> str:
    """One run of Kafka's ReassignPartitionsCommand (its stdout); RuntimeError with its output when it fails."""
    cmd = ["java", *JVM, "-cp", classpath(), TOOL, "--bootstrap-server", cluster.bootstrap, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def proposed(generated: str) -> dict[str, Any]:
    """The JSON after "Proposed partition reassignment configuration" in ``--generate``'s output."""
    lines = generated.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Proposed partition reassignment configuration"):
            return dict(json.loads(next(x for x in lines[i + 1:] if x.strip().startswith("{"))))
    raise RuntimeError(f"no proposed reassignment in the tool's output:\n{generated[-3000:]}")


def run_kafka_tool(cluster: KafkaCluster, topics: list[str], alive: list[int], throttle: int, folder: Path,
                   sampler: Sampler) -> dict[str, Any]:
    """--generate over the alive brokers, --execute with --throttle, --verify until complete.

    When ``--execute --throttle`` fails (a dead broker among the current replicas: the tool sends the throttle rate
    to it too and times out before submitting anything), that failure and its duration are recorded, the same
    throttles are set by hand on the live brokers (:func:`set_throttles_by_hand`) and the plan is executed without
    ``--throttle``; the time to finish counts from there.
    """
    to_move = folder / "topics-to-move.json"
    to_move.write_text(json.dumps({"version": 1, "topics": [{"topic": t} for t in topics]}))
    started = time.monotonic()
    plan = proposed(tool(cluster, "--topics-to-move-json-file", str(to_move), "--broker-list",
                         ",".join(map(str, alive)), "--generate"))
    generate_s = time.monotonic() - started
    reassignment = folder / "reassignment.json"
    reassignment.write_text(json.dumps(plan))
    figures: dict[str, Any] = {"generate_s": round(generate_s, 1), "throttle": "`--execute --throttle`"}
    started = time.monotonic()
    try:
        tool(cluster, "--reassignment-json-file", str(reassignment), "--execute", "--throttle", str(throttle))
    except RuntimeError as error:
        # With a dead broker in a moved partition's current replicas the tool fails before it submits anything:
        # it sends the broker-level throttle rate to every broker of the moves, the dead one too, and the admin
        # client times out waiting for that node. An operator then sets the same throttles by hand, with Kafka's
        # own ConfigCommand, on the live brokers only, and executes without --throttle.
        failure = next((line for line in str(error).splitlines() if line.startswith("Error:")), str(error)[:300])
        failed_s = time.monotonic() - started
        submitted = len(admin_reassignments(cluster))
        figures.update({"execute_with_throttle": f"failed after {failed_s:.0f} s: {failure}",
                        "submitted_by_failed_execute": submitted,
                        "throttle": f"`--execute --throttle` failed after {failed_s:.0f} s "
                                    f"({failure.split(':')[1].split('.')[-1].strip()}, {submitted} submitted); "
                                    f"set by hand with ConfigCommand on the live brokers, then `--execute`"})
        started = time.monotonic()
        set_throttles_by_hand(cluster, plan, alive, throttle)
        tool(cluster, "--reassignment-json-file", str(reassignment), "--execute")
    figures["execute_command_s"] = round(time.monotonic() - started, 1)
    verifies = 0
    while True:
        out = tool(cluster, "--reassignment-json-file", str(reassignment), "--verify")
        verifies += 1
        if "still in progress" not in out and out.count("is complete") >= len(plan["partitions"]):
            break
        if time.monotonic() - started > 1800:
            raise RuntimeError(f"the reassignment did not complete within 1800 s:\n{out[-2000:]}")
        time.sleep(1.0)
    finished_s = time.monotonic() - started
    figures.update({"finished_s": round(finished_s, 1), "verify_runs": verifies, "started": started,
                    "partitions_in_reassignment": len(plan["partitions"]),
                    "last_verify": out.strip().splitlines()[-3:]})
    return figures


def admin_reassignments(cluster: KafkaCluster) -> dict[Any, Any]:
    client = admin(cluster)
    try:
        return dict(client.list_partition_reassignments())
    finally:
        client.close()


def set_throttles_by_hand(cluster: KafkaCluster, plan: dict[str, Any], alive: list[int], throttle: int) -> None:
    """The throttles ``--execute --throttle`` sets, with Kafka's ConfigCommand, on the live brokers only.

    As the tool does: on each moved topic, ``leader.replication.throttled.replicas`` lists every current replica
    of a moved partition and ``follower.replication.throttled.replicas`` every added one; the rates go to every
    broker a move involves (here: the live ones). ``--verify`` removes them all once the moves are done.
    """
    current = describe(cluster, sorted({p["topic"] for p in plan["partitions"]}))
    leaders: dict[str, list[str]] = {}
    followers: dict[str, list[str]] = {}
    brokers: set[int] = set()
    for move in plan["partitions"]:
        topic, p, target = move["topic"], move["partition"], move["replicas"]
        now = current[topic][p]["replicas"]
        if set(now) == set(target):
            continue
        leaders.setdefault(topic, []).extend(f"{p}:{b}" for b in now)
        followers.setdefault(topic, []).extend(f"{p}:{b}" for b in target if b not in now)
        brokers |= set(now) | set(target)
    command = ["java", *JVM, "-cp", classpath(), "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server",
               cluster.bootstrap, "--alter"]
    for topic in sorted(leaders):
        configs = f"leader.replication.throttled.replicas=[{','.join(leaders[topic])}]"
        if followers.get(topic):
            configs += f",follower.replication.throttled.replicas=[{','.join(followers[topic])}]"
        subprocess.run([*command, "--entity-type", "topics", "--entity-name", topic, "--add-config", configs],
                       check=True, capture_output=True, timeout=120)
    for broker in sorted(brokers & set(alive)):
        configs = f"leader.replication.throttled.rate={throttle},follower.replication.throttled.rate={throttle}"
        subprocess.run([*command, "--entity-type", "brokers", "--entity-name", str(broker), "--add-config", configs],
                       check=True, capture_output=True, timeout=120)


def run_rebalancer(spark: Any, cluster: KafkaCluster, folder: Path, throttle: int, change: Callable[[], None],
                   sampler_for: Callable[[], Sampler]) -> tuple[dict[str, Any], Sampler]:
    """Adopt the healthy cluster, apply ``change``, then plan (collect + exchange) and execute under ``throttle``."""
    from rebalancer.kafka.drive import collect_cluster, execute_plan, planned_moves
    from rebalancer.pipeline import run_exchange

    wh, settings = warehouse(spark, folder / "warehouse")
    settings = settings.with_overrides(kafka={"throttle_bytes_per_s": throttle, "execute_timeout_s": 1800.0,
                                              "poll_interval_s": 0.5},
                                       migration={"max_parallel_per_node": 10})
    started = time.monotonic()
    collect_cluster(wh, settings, cluster.bootstrap)
    adopted = run_exchange(spark, wh, settings)
    adopt_s = time.monotonic() - started
    if [s.migrations for s in adopted] != [0]:
        raise RuntimeError(f"adopting the healthy cluster planned moves: {adopted}")
    change()
    sampler = sampler_for()
    started = time.monotonic()
    collect_cluster(wh, settings, cluster.bootstrap)
    summaries = run_exchange(spark, wh, settings)
    planned = planned_moves(wh)
    plan_s = time.monotonic() - started
    executing = time.monotonic()
    result, collects = execute_plan(wh, settings, cluster.bootstrap, planned)
    execute_s = time.monotonic() - executing
    # one more round: does the next exchange find anything left to move?
    collect_cluster(wh, settings, cluster.bootstrap)
    again = run_exchange(spark, wh, settings)
    return {"adopt_s": round(adopt_s, 1), "plan_s": round(plan_s, 1), "finished_s": round(execute_s, 1),
            "started": executing, "planned_partitions": len(planned.moves),
            "plan_steps": sum(s.migrations for s in summaries), "lost_partitions": sum(s.lost_partitions
                                                                                       for s in summaries),
            "submitted": result.submitted, "collects_during_execution": collects,
            "max_in_flight_per_broker": result.max_in_flight_per_broker,
            "next_exchange_steps": sum(s.migrations for s in again)}, sampler


# ---------------------------------------------------------------- one scenario on one cluster


def one_cluster(scenario: str, planner: str, args: argparse.Namespace, folder: Path,
                spark_of: Callable[[], Any]) -> dict[str, Any]:
    racks = {b: RACKS[(b - 1) % len(RACKS)] for b in range(1, args.brokers + 1)}
    topics = [f"topic-{i}" for i in range(args.topics)]
    layouts = {t: kafka_like_layout(racks, args.partitions, args.replication, start=i) for i, t in enumerate(topics)}
    load_start = os.getloadavg()
    cluster = KafkaCluster(folder / "kafka", brokers=args.brokers, racks=[racks[b] for b in sorted(racks)])
    sampler: Sampler | None = None
    try:
        t0 = time.monotonic()
        cluster.start()
        create_topics(cluster, layouts)
        for t in topics:
            produce(cluster, t, args.records, args.record_bytes)
        setup_s = time.monotonic() - t0
        data = {t: records(cluster, t) for t in topics}
        partition_bytes = {(t, p): sum(1 for key in data[t] if key[0] == p) * args.record_bytes
                           for t in topics for p in range(args.partitions)}
        before = describe(cluster, topics)
        if any(before[t][p]["replicas"] != layouts[t][p] for t in topics for p in layouts[t]):
            raise RuntimeError("the cluster's assignment is not the layout it was created with")

        changed: list[Assignment] = []

        def change() -> None:
            if scenario == "failure":
                cluster.kill(args.brokers)
                wait_fenced(cluster, args.brokers)
            else:
                racks[cluster.add_broker(rack=JOIN_RACK)] = JOIN_RACK
            changed.append(describe(cluster, topics))  # the failure's own leader elections are not the planner's

        def start_sampler() -> Sampler:
            s = Sampler(cluster, topics)
            s.start()
            return s

        if planner == "kafka":
            change()
            sampler = start_sampler()
            alive = [b for b, node in sorted(cluster.nodes.items()) if node.alive]
            figures = run_kafka_tool(cluster, topics, alive, args.throttle, folder, sampler)
        else:
            spark = spark_of()
            figures, sampler = run_rebalancer(spark, cluster, folder, args.throttle, change, start_sampler)
            alive = [b for b, node in sorted(cluster.nodes.items()) if node.alive]
        time.sleep(1.0)
        sampler.halt.set()
        sampler.join(10)
        after = describe(cluster, topics)
        figures["data_moved_s"] = sampler.settled_at(after, figures.pop("started"))
        figures.update(state_figures(before, changed[0], after, racks, alive, partition_bytes))
        kept = {t: records(cluster, t) for t in topics}
        figures["records_before"] = sum(len(v) for v in data.values())
        figures["records_after"] = sum(len(v) for v in kept.values())
        figures["records_intact"] = kept == data
        figures["setup_s"] = round(setup_s, 1)
        figures["load_at_start"] = [round(x, 2) for x in load_start]
        figures["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        figures["racks"] = {str(b): r for b, r in sorted(racks.items())}
        return figures
    finally:
        if sampler is not None:
            sampler.halt.set()
        cluster.close()


# ---------------------------------------------------------------- reporting


def markdown(result: dict[str, Any]) -> str:
    rows = [
        ("replicas moved (copies made)", lambda f: f["replicas_moved"]),
        ("MB copied", lambda f: f["mb_copied"]),
        ("replicas removed", lambda f: f["replicas_removed"]),
        ("leaders changed by the planner", lambda f: f["leaders_changed"]),
        ("partitions with two replicas in one rack", lambda f: f["partitions_two_replicas_one_rack"]),
        ("replicas per broker max / mean", lambda f: f"{f['replicas_per_broker']['max']} / "
                                                   f"{f['replicas_per_broker']['mean']:g}"),
        ("leaders per broker max / mean", lambda f: f"{f['leaders_per_broker']['max']} / "
                                                  f"{f['leaders_per_broker']['mean']:g}"),
        ("partitions reassigned", lambda f: f.get("planned_partitions", f.get("partitions_in_reassignment"))),
        ("throttle", lambda f: f.get("throttle", "`kafka.throttle_bytes_per_s`")),
        ("planning, s", lambda f: f.get("plan_s", f.get("generate_s"))),
        ("time to finish (the tool's run), s", lambda f: f["finished_s"]),
        ("data moved (assignment final, nothing in flight), s", lambda f: f["data_moved_s"]),
        ("every record there", lambda f: f"{f['records_after']}/{f['records_before']}"
                                         + ("" if f["records_intact"] else " (changed!)")),
    ]
    out = []
    for scenario, planners in result["scenarios"].items():
        out.append(f"\n**{scenario}**\n")
        out.append("| | rebalancer | kafka-reassign-partitions --generate |")
        out.append("|---|---|---|")
        for label, get in rows:
            out.append(f"| {label} | {get(planners['rebalancer'])} | {get(planners['kafka'])} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kafka_compare.json")
    parser.add_argument("--brokers", type=int, default=4, help="brokers at the start, racks a, b, a, b, ...")
    parser.add_argument("--topics", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=12, help="partitions per topic")
    parser.add_argument("--replication", type=int, default=2)
    parser.add_argument("--records", type=int, default=24000, help="records per topic")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--throttle", type=int, default=1048576, help="replication throttle, bytes per second")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    reason = missing_tools()
    if reason:
        sys.exit(reason)
    load_start = os.getloadavg()
    started = time.time()
    classpath()
    select_one = select_one_seconds()
    spark_box: list[Any] = []

    def spark_of() -> Any:
        if not spark_box:
            from rebalancer.config import SparkSettings
            from rebalancer.session import get_spark

            spark_box.append(get_spark(SparkSettings(master="local[2]", shuffle_partitions=2), delta=False))
        return spark_box[0]

    scenarios: dict[str, dict[str, Any]] = {}
    try:
        for scenario in args.scenarios.split(","):
            scenarios[scenario] = {}
            for planner in ("kafka", "rebalancer"):
                with tempfile.TemporaryDirectory(prefix=f"kafka-compare-{scenario}-{planner}-") as tmp:
                    print(f"{scenario}: {planner} ...", flush=True)
                    scenarios[scenario][planner] = one_cluster(scenario, planner, args, Path(tmp), spark_of)
                    print(json.dumps(scenarios[scenario][planner], default=str), flush=True)
    finally:
        if spark_box:
            spark_box[0].stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "commit": commit.stdout.strip() or None,
        "command": " ".join([".venv/bin/python", "bench/kafka_compare.py", *sys.argv[1:]]),
        "seconds": round(time.time() - started, 1),
        "cpus": os.cpu_count(),
        "load_at_start": [round(x, 2) for x in load_start],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "select_1_s": select_one,
        "parameters": {k: v for k, v in vars(args).items() if k != "out"},
        "scenarios": scenarios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(markdown(result))
    print(f"load {result['load_at_start']} -> {result['load_at_end']}, SELECT 1 {select_one} s, "
          f"{result['seconds']} s in all; written to {args.out}")


if __name__ == "__main__":
    main()
