"""examples/report_producer.py: what it writes matches the contract, and an exchange consumes it without rejections."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import deltalake
import pytest
from pyspark.sql import functions as F

from rebalancer.cli import main
from rebalancer.config import load_settings
from rebalancer.storage import open_warehouse
from rebalancer.storage.delta_rs import to_arrow_schema
from rebalancer.tables import SCHEMAS

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "report_producer.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("report_producer", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


producer_module = load_example()


def cli(capsys: Any, *argv: str) -> str:
    try:
        main(list(argv))
    except SystemExit as exc:
        out, err = capsys.readouterr()
        assert not exc.code, err
        return out
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("table", "schema"),
    [
        ("partition_reports", producer_module.PARTITION_REPORTS),
        ("topology_events", producer_module.TOPOLOGY_EVENTS),
        ("nodes", producer_module.NODES),
    ],
)
def test_producer_schemas_are_the_contract(table: str, schema: Any) -> None:
    expected = to_arrow_schema(SCHEMAS[table], timezone="UTC")
    assert schema.names == expected.names
    assert [str(f.type) for f in schema] == [str(f.type) for f in expected]


def test_producer_refuses_what_the_engine_would_reject(tmp_path: Path) -> None:
    producer = producer_module.Producer(tmp_path)  # nothing is read or written before the checks
    with pytest.raises(ValueError, match="state 'OWNED'"):
        producer.report([producer_module.Report("n", "g", 0, "OWNED", 1, 1, 1)])
    with pytest.raises(ValueError, match="wal_history_counter"):
        producer.report([producer_module.Report("n", "g", 0, "OWNING", 5, 1, 1, wal_history_counter=6)])
    with pytest.raises(ValueError, match="NODE_FAILED needs a node_id"):
        producer.event("NODE_FAILED")


def test_exchange_consumes_the_producers_join_and_reports(spark: Any, tmp_path: Path, capsys: Any) -> None:
    w = str(tmp_path / "w")
    cli(capsys, "--warehouse", w, "generate", "--nodes", "4", "--groups", "1", "--partitions", "16", "--backups", "1",
        "--seed", "5")
    producer = producer_module.Producer(w)

    # A new node joins through the producer (nodes row + NODE_JOINED); the exchange merges it with generate's joins.
    assert producer.join("node4", "host-4", {"zone": "zone1"}) == 5
    producer_module.main(["--warehouse", w, "event", "NODE_LEFT", "--node", "node9"])  # unknown node: rejected
    out = cli(capsys, "--warehouse", w, "exchange")
    assert "-> version 5.0 (ALL; events 1, 2, 3, 4, 5" in out, out

    wh = open_warehouse(spark, load_settings().storage, w)
    at_5 = (F.col("topology_major") == 5) & (F.col("topology_minor") == 0)
    summary = wh.read("exchanges").where(at_5).first()
    assert summary is not None and summary.temporary_primaries > 0
    node4 = wh.read("nodes").where(F.col("node_id") == "node4").first()
    assert node4 is not None and node4.node_order == 5 and node4.host == "host-4" and node4.attributes == {
        "zone": "zone1"
    }

    # node4 finishes receiving every copy of the plan (MOVING -> OWNING) and reports each one, as a node would.
    plan = wh.read("migration_plan").where(at_5 & (F.col("action") == "COPY")).alias("p")
    sources = wh.read("partition_map").where(at_5).alias("m")
    copies = plan.join(
        sources,
        (F.col("p.group_name") == F.col("m.group_name"))
        & (F.col("p.partition_id") == F.col("m.partition_id"))
        & (F.col("p.source_node") == F.col("m.node_id")),
    ).select("p.target_node", "p.group_name", "p.partition_id", "p.to_counter", "m.size", "p.bytes").collect()
    assert copies and {c.target_node for c in copies} == {"node4"}
    reports = [
        producer_module.Report(c.target_node, c.group_name, c.partition_id, "OWNING", c.to_counter, c.size, c.bytes)
        for c in copies
    ]
    seqs = producer.report(reports)
    assert seqs == list(range(2, 2 + len(copies)))  # generate's reports all have report_seq 1

    out = cli(capsys, "--warehouse", w, "exchange")
    assert "-> version 5.1 (LATE_AFFINITY_SWITCH" in out, out
    at_51 = (F.col("topology_major") == 5) & (F.col("topology_minor") == 1)
    switch = wh.read("exchanges").where(at_51).first()
    assert switch is not None and switch.max_report_seq == seqs[-1] and switch.temporary_primaries == 0
    owned = {
        (r.group_name, r.partition_id): (r.state, r.update_counter)
        for r in wh.read("partition_map").where(at_51 & (F.col("node_id") == "node4")).collect()
    }
    assert owned == {(c.group_name, c.partition_id): ("OWNING", c.to_counter) for c in copies}

    # Only the deliberately bad event was rejected; every row the producer wrote was accepted.
    rejected = wh.read("rejected_rows").collect()
    assert [(r.table_name, r.exchange_id) for r in rejected] == [("topology_events", 1)], rejected
    assert "node9" in rejected[0].row_json

    # After the switch the surplus copies are dropped: their nodes report EVICTED, and validation accepts those too.
    drops = wh.read("migration_plan").where(at_51 & (F.col("action") == "DROP")).collect()
    assert drops
    producer.report(
        producer_module.Report(d.source_node, d.group_name, d.partition_id, "EVICTED", 0, 0, 0) for d in drops
    )
    from rebalancer.operations import validate_warehouse

    assert validate_warehouse(wh) == 1  # node9's event only
    assert [r.table_name for r in wh.read("rejected_rows").where("exchange_id IS NULL").collect()] == [
        "topology_events"]
    for table in ("nodes", "topology_events", "partition_reports"):
        protocol = deltalake.DeltaTable(f"{w}/{table}").protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), table
