"""docs/QUERIES.md: every SQL and Python block runs on a real warehouse, and the key queries give the right answers.

One warehouse per module, built with the CLI in-process: the scenario of the issue (5 nodes, 2 groups x 32
partitions, 1 backup; exchange; node2 fails; exchange -> 6.0), then two bad report rows (for the rejected-rows query)
and a second failure merged with a join (node1 fails, node5 joins; exchange -> 8.0). The extra version is what gives
the queries something to find: after node2 alone nothing is lost and no primary is temporary; at 8.0 partitions
whose two copies were on node1 and node2 are lost, and node5 is the ideal primary of partitions it does not own yet.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from rebalancer.cli import main
from rebalancer.config import load_settings
from rebalancer.storage import Warehouse, open_warehouse
from rebalancer.tables import PARTITION_REPORTS

DOC = Path(__file__).resolve().parents[1] / "docs" / "QUERIES.md"
DELTA_SPARK_ONLY = "-- delta-spark only"
LATEST = (8, 0)
PREVIOUS = (6, 0)


def doc_blocks(language: str) -> list[tuple[str, str]]:
    """``(title, code)`` of every fenced block of ``language``, titled by the nearest ``###`` heading above it."""
    blocks: list[tuple[str, str]] = []
    title = ""
    lines = iter(DOC.read_text().splitlines())
    for line in lines:
        if line.startswith("### "):
            title = line[4:].strip()
        elif line.strip() == f"```{language}":
            code = []
            for body in lines:
                if body.strip() == "```":
                    break
                code.append(body)
            blocks.append((title, "\n".join(code)))
    return blocks


SQL = doc_blocks("sql")
RUNNABLE = [(t, q) for t, q in SQL if not q.lstrip().startswith(DELTA_SPARK_ONLY)]


def query(title: str) -> str:
    """The runnable SQL block under ``### title`` (exactly one)."""
    found = [q for t, q in RUNNABLE if t == title]
    assert len(found) == 1, f"expected one runnable SQL block under '### {title}', found {len(found)}"
    return found[0]


def cli(*argv: str) -> None:
    try:
        main(list(argv))
    except SystemExit as exc:
        assert not exc.code, f"rebalancer {' '.join(argv)} exited with {exc.code}"


@pytest.fixture(scope="module")
def warehouse(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Warehouse]:
    root = tmp_path_factory.mktemp("queries")
    w = str(root / "warehouse")  # "warehouse": the name the doc's Python snippets open, run from `root`
    cli("--warehouse", w, "generate", "--nodes", "5", "--groups", "2", "--partitions", "32", "--backups", "1",
        "--seed", "3")
    cli("--warehouse", w, "exchange")
    cli("--warehouse", w, "event", "NODE_FAILED", "--node", "node2")
    cli("--warehouse", w, "exchange")
    wh = open_warehouse(spark, load_settings().storage, w)
    bad = [
        ("node3", "group0", 0, "OWNED", 5, 5, 5, None, 2),
        ("node3", "group0", 99, "OWNING", 5, 5, 5, None, 2),
    ]
    wh.append("partition_reports", spark.createDataFrame(bad, PARTITION_REPORTS))
    cli("--warehouse", w, "event", "NODE_FAILED", "--node", "node1")
    cli("--warehouse", w, "event", "NODE_JOINED", "--node", "node5")
    cli("--warehouse", w, "exchange")
    wh.register_views()
    yield wh


@pytest.fixture(scope="module")
def python_blocks(warehouse: Warehouse) -> dict[str, Any]:
    """Run every ```python block of the doc in order, from the directory holding ``warehouse``; their namespace."""
    namespace: dict[str, Any] = {}
    before = os.getcwd()
    os.chdir(Path(warehouse.location).parent)
    try:
        for title, code in doc_blocks("python"):
            exec(compile(code, f"QUERIES.md ### {title}", "exec"), namespace)  # noqa: S102 - the doc's own snippets
    finally:
        os.chdir(before)
    warehouse.register_views()  # the snippets re-registered the views through their own Warehouse
    return namespace


def rows(spark: Any, sql: str) -> list[Any]:
    return spark.sql(sql).collect()


def exchange_row(wh: Warehouse, version: tuple[int, int]) -> Any:
    row = wh.read("exchanges").where(
        (F.col("topology_major") == version[0]) & (F.col("topology_minor") == version[1])
    ).first()
    assert row is not None
    return row


def at(wh: Warehouse, table: str, version: tuple[int, int]) -> list[Any]:
    return wh.read(table).where(
        (F.col("topology_major") == version[0]) & (F.col("topology_minor") == version[1])
    ).collect()


# ---- the doc itself ----

REQUIRED = [
    "Latest committed version and what it decided",
    "Bytes to move per node",
    "Partitions below full redundancy",
    "Temporary primaries",
    "Lost partitions",
    "What changed between a version and the previous one",
    "Schedule by wave",
    "Makespan against its lower bound",
    "The plan of a past version",
    "Delta time travel with delta-spark (Databricks, clusters with the Delta jars)",
    "Rejected input rows by table and reason",
    "Primary and backups of one partition",
    "Primary and backups of one key",
]


def test_doc_has_every_required_query_under_a_title_and_a_sentence() -> None:
    titles = {t for t, _ in SQL}
    assert not [t for t in REQUIRED if t not in titles]
    assert all(t for t, _ in SQL), "every SQL block needs a ### title above it"
    text = DOC.read_text()
    for title in titles:
        after = text.split(f"### {title}\n", 1)[1].lstrip("\n")
        assert not after.startswith("```"), f"'### {title}' needs a sentence before its first block"


def test_only_time_travel_is_marked_delta_spark_only() -> None:
    skipped = [q for _, q in SQL if q.lstrip().startswith(DELTA_SPARK_ONLY)]
    assert skipped, "the delta-spark time travel syntax must stay documented"
    for q in skipped:
        assert re.search(r"VERSION AS OF|TIMESTAMP AS OF|DESCRIBE HISTORY", q), q
    assert len(RUNNABLE) >= 15


# ---- every block runs ----


@pytest.mark.parametrize("sql", [q for _, q in RUNNABLE], ids=[t for t, _ in RUNNABLE])
def test_query_runs(spark: Any, warehouse: Warehouse, python_blocks: dict[str, Any], sql: str) -> None:
    spark.sql(sql).collect()


def test_delta_spark_only_blocks_do_not_run_on_the_embedded_default(spark: Any, warehouse: Warehouse) -> None:
    """The doc says these are not executed here; this is why (no Delta SQL without the Delta jars)."""
    assert warehouse.engine == "delta-rs"
    for _, q in SQL:
        if q.lstrip().startswith(DELTA_SPARK_ONLY):
            with pytest.raises(Exception):  # noqa: B017 - parse or analysis error, depending on the statement
                spark.sql(q).collect()
    with pytest.raises(Exception, match="TIME_TRAVEL"):
        spark.sql("SELECT * FROM migration_plan VERSION AS OF 1").collect()  # views cannot be time travelled


def test_python_snippets_time_travel_and_register_the_partitioner(
    spark: Any, warehouse: Warehouse, python_blocks: dict[str, Any]
) -> None:
    # partition_reports: v1 = generate's 128 reports, v2 = the fixture's two bad rows appended
    assert python_blocks["latest"] == 2
    assert rows(spark, "SELECT count(*) AS n FROM partition_reports_before")[0].n == 128
    from rebalancer.client import partition_of

    assert rows(spark, "SELECT partition_of('user-42', 32, 'murmur3') AS p")[0].p == partition_of("user-42", 32) == 16


# ---- the answers ----


def test_latest_version_and_its_events(spark: Any, warehouse: Warehouse) -> None:
    (latest,) = rows(spark, query("Latest committed version and what it decided"))
    assert (latest.topology_major, latest.topology_minor) == LATEST
    assert latest.exchange_type == "ALL" and latest.merged_event_seqs == [7, 8]
    assert latest.lost_partitions == 6 and latest.temporary_primaries == 14
    events = rows(spark, query("Events merged into the latest version"))
    assert [(e.event_seq, e.event_type, e.node_id) for e in events] == [(7, "NODE_FAILED", "node1"),
                                                                       (8, "NODE_JOINED", "node5")]


def test_bytes_per_node_add_up_to_the_exchange(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("Bytes to move per node"))
    summary = exchange_row(warehouse, LATEST)
    copies = [r for r in at(warehouse, "migration_plan", LATEST) if r.action == "COPY"]
    assert summary.bytes_to_move > 0
    assert sum(r.bytes_sent for r in result) == sum(r.bytes_received for r in result) == summary.bytes_to_move
    assert sum(r.copies_sent for r in result) == sum(r.copies_received for r in result) == len(copies)
    received = Counter()
    for c in copies:
        received[c.target_node] += c.bytes
    assert {r.node_id: r.bytes_received for r in result if r.bytes_received} == dict(received)
    assert "node1" not in {r.node_id for r in result}  # failed before this version


def test_partitions_below_full_redundancy(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("Partitions below full redundancy"))
    ideal = Counter((r.group_name, r.partition_id) for r in at(warehouse, "ideal_assignment", LATEST))
    owning = Counter(
        (r.group_name, r.partition_id) for r in at(warehouse, "partition_map", LATEST) if r.state == "OWNING"
    )
    expected = {key: owning[key] for key, n in ideal.items() if owning[key] < n}
    assert {(r.group_name, r.partition_id): r.owning_copies for r in result} == expected
    lost = {(r.group_name, r.partition_id) for r in at(warehouse, "lost_partitions", LATEST)}
    assert lost and {k for k, n in expected.items() if n == 0} == lost
    assert [r.owning_copies for r in result] == sorted(r.owning_copies for r in result)


def test_temporary_primaries_match_the_exchange(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("Temporary primaries"))
    assert len(result) == exchange_row(warehouse, LATEST).temporary_primaries == 14
    assert all(r.temporary_primary != r.ideal_primary and r.ideal_primary_state != "OWNING" for r in result)
    assert {r.ideal_primary for r in result} == {"node5"}  # the node that just joined owns nothing yet


def test_lost_partitions_and_their_policy(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("Lost partitions"))
    assert len(result) == exchange_row(warehouse, LATEST).lost_partitions == 6
    for r in result:
        assert r.loss_policy == "READ_WRITE_SAFE" and not r.read_allowed and not r.write_allowed
        assert r.group_writes_blocked is False  # only READ_ONLY_SAFE blocks a whole group
        assert r.nodes_with_lost_copy


def test_changes_between_versions_follow_the_partition_versions(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("What changed between a version and the previous one"))
    assert {(r.prev_major, r.prev_minor, r.topology_major, r.topology_minor) for r in result} == {PREVIOUS + LATEST}
    old = {(r.group_name, r.partition_id): r.partition_version for r in at(warehouse, "partition_versions", PREVIOUS)}
    new = {(r.group_name, r.partition_id): r.partition_version for r in at(warehouse, "partition_versions", LATEST)}
    bumped = {k for k in new if new[k] != old.get(k)}
    assert bumped and {(r.group_name, r.partition_id) for r in result} == bumped
    for r in result:
        assert r.new_partition_version == r.old_partition_version + 1
        assert r.old_primary != r.new_primary or sorted(r.old_nodes) != sorted(r.new_nodes)
        assert r.old_nodes[0] == r.old_primary and r.new_nodes[0] == r.new_primary
    stamps = rows(spark, query("Partition versions and group stamps over time"))
    assert len(stamps) == 3 * 2  # versions 5.0, 6.0, 8.0 x two groups
    changed_at_latest = Counter(r.group_name for r in result)
    assert {s.group_name: s.partitions_changed for s in stamps if (s.topology_major, s.topology_minor) == LATEST} \
        == dict(changed_at_latest)


def test_schedule_by_wave_and_makespan(spark: Any, warehouse: Warehouse) -> None:
    waves = rows(spark, query("Schedule by wave"))
    summary = exchange_row(warehouse, LATEST)
    assert [w.wave for w in waves] == list(range(1, len(waves) + 1))
    assert sum(w.steps for w in waves) == summary.migrations
    assert sum(w.bytes for w in waves) == summary.bytes_to_move
    assert max(w.last_end_s for w in waves) == pytest.approx(summary.makespan_s)
    assert all(w.steps == w.copies + w.promotes + w.drops for w in waves)
    starts = [w.starts_at_s for w in waves]
    assert starts == sorted(starts)

    versions = rows(spark, query("Makespan against its lower bound"))
    assert [(v.topology_major, v.topology_minor) for v in versions] == [(5, 0), (6, 0), LATEST]
    for v in versions:
        assert v.makespan_s >= v.makespan_lower_bound_s - 1e-9
        if v.steps:
            assert v.plan_end_s == pytest.approx(v.makespan_s) and v.ratio_to_bound >= 1.0
        else:
            assert v.ratio_to_bound is None

    steps = rows(spark, query("One partition's steps"))
    assert [s.step for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 2
    assert all(a.est_end_s <= b.est_start_s + 1e-9 for a, b in zip(steps, steps[1:], strict=False))


def test_past_plans_are_rows_of_older_versions(spark: Any, warehouse: Warehouse) -> None:
    past = rows(spark, query("The plan of a past version"))
    assert len(past) == len(at(warehouse, "migration_plan", PREVIOUS)) == 28
    before_latest = rows(spark, query("The plan of the version before the latest"))
    assert {(r.topology_major, r.topology_minor) for r in before_latest} == {PREVIOUS}
    assert sum(r.steps for r in before_latest) == exchange_row(warehouse, PREVIOUS).migrations
    seen = rows(spark, query("The reports a past version had seen"))
    assert len(seen) == 128 and {r.report_seq for r in seen} == {1}  # the bad rows (seq 2) came later


def test_rejected_rows_by_table_and_reason(spark: Any, warehouse: Warehouse) -> None:
    result = rows(spark, query("Rejected input rows by table and reason"))
    assert {r.table_name for r in result} == {"partition_reports"}
    reasons = " | ".join(r.reason for r in result)
    assert "state 'OWNED'" in reasons and "partition_id 99 is out of range" in reasons
    assert sum(r.rows_rejected for r in result) == 2
    assert {r.first_exchange for r in result} == {exchange_row(warehouse, LATEST).exchange_id}


def test_routing_queries_agree_with_the_exported_map(
    spark: Any, warehouse: Warehouse, python_blocks: dict[str, Any]
) -> None:
    from rebalancer.client.routing import RoutingMap
    from rebalancer.operations import export_affinity

    routing = RoutingMap.from_dict(export_affinity(warehouse))
    assert routing.version == LATEST
    (by_partition,) = rows(spark, query("Primary and backups of one partition"))
    assert by_partition.partition_id == 7
    assert [by_partition.primary_node, *by_partition.backup_nodes] == routing.partition_nodes("group0", 7)
    (by_key,) = rows(spark, query("Primary and backups of one key"))
    assert by_key.partition_id == routing.partition("group0", "user-42")
    assert [by_key.primary_node, *by_key.backup_nodes] == routing.nodes("group0", "user-42")
    served = sorted(
        (r.replica_index, r.node_id)
        for r in at(warehouse, "affinity_assignment", LATEST)
        if r.group_name == "group0" and r.partition_id == 7
    )
    assert [n for _, n in served] == routing.partition_nodes("group0", 7)  # the late (serving) assignment
