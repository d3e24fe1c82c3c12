"""The CLI end to end on a real warehouse: init, generate, sql, event; errors are one sentence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import pytest

from rebalancer import tables
from rebalancer.cli import main
from rebalancer.tables import SCHEMAS


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_init_generate_sql_counts_256_reports(spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")
    assert run(capsys, "--warehouse", w, "init")[0] == 0
    code, out, _ = run(capsys, "--warehouse", w, "generate", "--nodes", "5", "--groups", "2", "--partitions", "64",
                       "--backups", "1", "--seed", "7")
    assert code == 0, out
    assert "256 partition reports" in out
    code, out, _ = run(capsys, "--warehouse", w, "sql", "SELECT count(*) FROM partition_reports")
    assert code == 0
    assert "256" in out
    for name, schema in SCHEMAS.items():
        table = deltalake.DeltaTable(str(tmp_path / "w" / name))
        assert [f.name for f in table.schema().fields] == schema.fieldNames(), name


def test_sql_registers_a_view_for_each_table_its_query_names_and_every_view_for_show() -> None:
    # each view costs a read of its table's log (18 of them made a `SELECT 1` process slower than an L exchange)
    assert tables.named_in("SELECT 1") == []
    assert tables.named_in("select p.node_id from PARTITION_MAP p join `nodes` n using (node_id) -- migration_plan") \
        == ["nodes", "partition_map", "migration_plan"]  # in the contract's order; a comment's name counts too
    assert tables.named_in("SELECT * FROM partition_maps") == []  # whole words only
    assert tables.named_in("  show tables") is None  # every view


def test_event_appends_with_next_seq_and_adds_a_new_node(spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")
    run(capsys, "--warehouse", w, "generate", "--nodes", "3", "--groups", "1", "--partitions", "8")
    code, out, _ = run(capsys, "--warehouse", w, "event", "NODE_FAILED", "--node", "node1")
    assert code == 0 and "event 4: NODE_FAILED node1" in out
    code, out, _ = run(capsys, "--warehouse", w, "event", "node_joined", "--node", "node9", "--zone", "zone1")
    assert code == 0 and "event 5: NODE_JOINED node9" in out and "node node9 added" in out
    code, out, _ = run(capsys, "--warehouse", w, "sql", "SELECT node_order, host FROM nodes WHERE node_id = 'node9'")
    assert "4" in out and "host-node9" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["event", "NODE_EXPLODED", "--node", "n"], "unknown event type 'NODE_EXPLODED'"),
        (["event", "NODE_FAILED"], "NODE_FAILED needs --node ID"),
        (["event", "CACHE_STARTED"], "CACHE_STARTED needs --group NAME"),
        (["sql", "SELEC nonsense"], "error: "),
    ],
)
def test_errors_are_one_clear_line(spark: Any, tmp_path: Path, capsys: Any, argv: list[str], message: str) -> None:
    code, out, err = run(capsys, "--warehouse", str(tmp_path / "w"), *argv)
    assert code == 1
    assert message in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    others = [line for line in err.splitlines()
              if line and not line.startswith(("error:", "storage engine "))]  # the engine, said once
    assert len(errors) == 1, err
    assert all(line.endswith(" s") for line in others), err  # only the progress lines of finished steps
    assert "Traceback" not in err and "at org.apache" not in err


def test_bad_config_file_names_the_key(tmp_path: Path, capsys: Any) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[storage]\nengine = "nope"\n')
    code, _, err = run(capsys, "--conf", str(conf), "init")
    assert code == 1 and "storage.engine" in err


def test_job_entry_point_accepts_global_options_anywhere(spark: Any, tmp_path: Path, capsys: Any) -> None:
    import runpy

    w = str(tmp_path / "w")
    job = runpy.run_path(str(Path(__file__).parent.parent / "jobs" / "generate.py"))
    job["main"](["--nodes", "2", f"--warehouse={w}", "--strict", "--groups", "1", "--partitions", "4"])
    assert "wrote 2 nodes" in capsys.readouterr().out


def test_exchange_export_affinity_and_route(spark: Any, tmp_path: Path, capsys: Any) -> None:
    from rebalancer.client.routing import RoutingMap

    w = str(tmp_path / "w")
    code, out, err = run(capsys, "--warehouse", w, "route", "--group", "group0", "k")
    assert code == 1 and "there is no warehouse at" in err and "create one with `rebalancer init`" in err
    run(capsys, "--warehouse", w, "init")
    code, out, err = run(capsys, "--warehouse", w, "route", "--group", "group0", "k")
    assert code == 1 and "run `rebalancer exchange` first" in err
    run(capsys, "--warehouse", w, "generate", "--nodes", "3", "--groups", "2", "--partitions", "8")
    code, out, _ = run(capsys, "--warehouse", w, "exchange")
    assert code == 0
    assert "exchange 1 -> version 3.0 (ALL; events 1, 2, 3; coordinator node0)" in out
    assert "lost: 0; moving copies: 0" in out
    code, out, _ = run(capsys, "--warehouse", w, "exchange")
    assert "nothing to do" in out

    target = tmp_path / "routing.json"
    code, out, _ = run(capsys, "--warehouse", w, "export-affinity", "--out", str(target))
    assert code == 0 and "version 3.0 (2 groups)" in out
    routing = RoutingMap.load(target)
    assert routing.version == (3, 0) and routing.groups() == ["group0", "group1"]

    code, out, _ = run(capsys, "--warehouse", w, "route", "--group", "group1", "user-42", "order-7")
    assert code == 0
    for key in ("user-42", "order-7"):
        nodes = routing.nodes("group1", key)
        line = next(line for line in out.splitlines() if key in line)
        assert str(routing.partition("group1", key)) in line and nodes[0] in line


def test_simulate_options_are_checked_before_any_work(spark: Any, tmp_path: Path, capsys: Any) -> None:
    code, _, err = run(capsys, "--warehouse", str(tmp_path / "w"), "simulate", "--fail", "node0")
    assert code == 1 and "error: --fail NODE and --at-wave K go together" in err


@pytest.mark.slow  # the demo test runs the same twin printing; this one checks the command on its own
def test_simulate_runs_the_twin_until_stable(spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")
    run(capsys, "--warehouse", w, "generate", "--nodes", "3", "--groups", "1", "--partitions", "8", "--backups", "1")
    assert run(capsys, "--warehouse", w, "exchange")[0] == 0
    run(capsys, "--warehouse", w, "event", "NODE_JOINED", "--node", "node3")
    code, out, _ = run(capsys, "--warehouse", w, "simulate", "--until-stable")
    assert code == 0, out
    assert "twin round on version 4.0" in out and "LATE_AFFINITY_SWITCH" in out
    assert "stable at version 4.1" in out


def test_demo_ends_with_a_converged_twin(spark: Any, tmp_path: Path, capsys: Any) -> None:
    code, out, _ = run(capsys, "--warehouse", str(tmp_path / "w"), "demo", "--nodes", "4", "--groups", "1",
                       "--partitions", "16", "--backups", "1", "--report-dir", str(tmp_path / "report"))
    assert code == 0, out
    assert (tmp_path / "report" / "report.html").exists() and "where to look next" in out
    assert "exchange 2 -> version 5.0" in out and "exchange 3 -> version 6.0" in out  # node3 fails, node4 joins
    assert "twin round on version 6.0" in out and "stable at version 6." in out
    assert "what if, against version 6.0: " in out  # every failure and zone outage from the join's version
    assert "What if</h2>\n<p>" in (tmp_path / "report" / "report.html").read_text(encoding="utf-8")


def test_an_error_raised_in_the_jvm_is_its_innermost_java_cause(spark: Any) -> None:
    from py4j.protocol import Py4JJavaError

    from rebalancer.cli import _one_sentence

    with pytest.raises(Py4JJavaError) as info:  # an exception pyspark does not convert to a Python one
        spark._jvm.java.lang.Class.forName("no.such.Codec")
    assert str(info.value).startswith("An error occurred while calling")  # what a person would have seen
    assert _one_sentence(info.value) == "ClassNotFoundException: no.such.Codec"

    jvm = spark._jvm
    wrapped = jvm.java.lang.RuntimeException("Job aborted", jvm.java.lang.IllegalStateException("disk full"))

    class Wrapped(Exception):
        java_exception = wrapped

    assert _one_sentence(Wrapped("An error occurred while calling o123.save")) == "IllegalStateException: disk full"


def test_verbose_prints_the_traceback_before_the_sentence(spark: Any, tmp_path: Path, capsys: Any) -> None:
    code, _, err = run(capsys, "--verbose", "--warehouse", str(tmp_path / "w"), "sql", "SELEC nonsense")
    assert code == 1
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: ")
    code, _, err = run(capsys, "--warehouse", str(tmp_path / "w"), "sql", "SELEC nonsense")
    assert code == 1 and "Traceback" not in err


def test_kafka_commands_say_one_sentence_when_no_cluster_answers_and_write_nothing(
        spark: Any, tmp_path: Path, capsys: Any) -> None:
    conf = tmp_path / "fast.toml"
    conf.write_text("[kafka]\nclient_timeout_s = 2.0\n")
    w = str(tmp_path / "w")
    code, out, err = run(capsys, "--warehouse", w, "--conf", str(conf), "kafka", "collect", "--bootstrap",
                         "127.0.0.1:1")
    assert code == 1
    assert err.strip().splitlines()[-1] == "error: no Kafka broker answered at 127.0.0.1:1 within 2 s " \
                                           "(KafkaTimeoutError)"
    assert not (tmp_path / "w").exists(), "the cluster is read before anything is opened or written"
    code, _, err = run(capsys, "--warehouse", w, "kafka", "collect")
    assert code == 1 and err.strip().splitlines()[-1] == (
        "error: no Kafka cluster named: pass --bootstrap HOST:PORT or set [kafka] bootstrap")


def test_kafka_execute_dry_run_before_any_exchange_prints_an_empty_reassignment(
        spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")
    assert run(capsys, "--warehouse", w, "init")[0] == 0
    code, out, _ = run(capsys, "--warehouse", w, "kafka", "execute", "--dry-run")
    assert code == 0
    import json

    assert json.loads(out) == {"version": 1, "partitions": []}


def test_sql_formats_print_every_cell_whole_for_scripts(spark: Any, tmp_path: Path, capsys: Any) -> None:
    import csv
    import io
    import json

    w = str(tmp_path / "w")
    run(capsys, "--warehouse", w, "generate", "--nodes", "3", "--groups", "1", "--partitions", "8")
    query = ("SELECT node_id, attributes, array(node_order, 7) AS pair, named_struct('a', 1, 'b', CAST(NULL AS "
             "STRING)) AS s, repeat('x', 150) AS wide, CAST(NULL AS INT) AS nothing, TIMESTAMP '2026-11-28 "
             "10:00:00' AS at FROM nodes ORDER BY node_id")
    code, out, err = run(capsys, "--warehouse", w, "sql", "--format", "json", query)
    assert code == 0 and "3 row(s)" in err and "row(s)" not in out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["node_id"] for r in rows] == ["node0", "node1", "node2"]
    assert list(rows[0]) == ["node_id", "attributes", "pair", "s", "wide", "nothing", "at"]
    assert rows[0]["attributes"] == {"zone": "zone0", "rack": "rack0"} and rows[0]["pair"] == [1, 7]
    assert rows[0]["s"] == {"a": 1, "b": None} and rows[0]["nothing"] is None and rows[0]["wide"] == "x" * 150
    assert rows[0]["at"] == "2026-11-28T10:00:00"
    code, out, err = run(capsys, "--warehouse", w, "sql", "--format", "csv", "--limit", "2", query)
    assert code == 0 and "2 row(s) (more not shown; --limit N)" in err
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == ["node_id", "attributes", "pair", "s", "wide", "nothing", "at"] and len(table) == 3
    assert json.loads(table[1][1]) == {"zone": "zone0", "rack": "rack0"}
    assert table[1][:1] + table[1][2:] == ["node0", "[1, 7]", '{"a": 1, "b": null}', "x" * 150, "",
                                           "2026-11-28T10:00:00"]
    code, out, _ = run(capsys, "--warehouse", w, "sql", query)  # a table, stdout not a terminal: nothing cut
    assert code == 0 and "x" * 150 in out and "…" not in out and "3 row(s)" in out
