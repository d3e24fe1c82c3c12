"""Example producer: how data nodes feed rebalancer's input tables, with ``deltalake`` and ``pyarrow`` only.

rebalancer needs no agent inside the data grid. The nodes, or one collector process they send their state to, append
rows to Delta tables of the warehouse, and ``rebalancer exchange`` (or ``jobs/exchange.py``) consumes them:

- ``topology_events``: a node joined, left or failed; a cache started or stopped; lost partitions were reset;
- ``partition_reports``: a node's local view of one partition copy (state, update counter, size, bytes, WAL start);
- ``nodes``: a node describes itself (host, attributes) before its first ``NODE_JOINED`` event.

This file imports neither Spark nor rebalancer, so it can run in a node's sidecar or a small collector service. The
column names and types mirror ``rebalancer/tables.py`` (SPEC section 2); ``tests/test_examples.py`` checks that
they do and that an exchange consumes what this file writes without rejecting a row. See docs/DEPLOY.md, "What the
engine needs from the data nodes", for when to write what.

Sequence numbers (read this before running several producers): the exchange applies only the reports whose
``report_seq`` is greater than the newest one the previous version consumed (``exchanges.max_report_seq``, the
maximum over *all* writers), and only the events whose ``event_seq`` is greater than the last one it processed. A
:class:`Producer` therefore starts from the table's current maximum and counts up locally, which is correct while
it is the only writer of its table. Run one collector per warehouse (nodes send to it), not one producer per node.

Command line (a demonstration; a real node calls :class:`Producer` from its own code)::

    python examples/report_producer.py --warehouse W join --node node5 --host host-5 --zone zone2
    python examples/report_producer.py --warehouse W report --node node5 --group group0 --partition 17 \\
        --state OWNING --counter 1200 --size 1150 --bytes 1177600 --wal-from 900
    python examples/report_producer.py --warehouse W event NODE_LEFT --node node5
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

# The input schemas of SPEC section 2 (rebalancer/tables.py), as Arrow types. Every column is nullable in the
# tables; the engine rejects (into rejected_rows) rows whose required values are null.
PARTITION_REPORTS = pa.schema(
    [
        ("node_id", pa.string()),
        ("group_name", pa.string()),
        ("partition_id", pa.int32()),
        ("state", pa.string()),  # OWNING | MOVING | RENTING | EVICTED | LOST
        ("update_counter", pa.int64()),
        ("size", pa.int64()),  # entries
        ("bytes", pa.int64()),
        ("wal_history_counter", pa.int64()),  # earliest counter the node can replay from its WAL; null = none
        ("report_seq", pa.int64()),  # the latest report per node/group/partition wins
    ]
)
TOPOLOGY_EVENTS = pa.schema(
    [
        ("event_seq", pa.int64()),
        ("event_type", pa.string()),
        ("node_id", pa.string()),
        ("group_name", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),  # UTC: a naive timestamp would need a newer Delta protocol
    ]
)
NODES = pa.schema(
    [
        ("node_id", pa.string()),  # the stable consistent id
        ("node_uuid", pa.string()),  # runtime UUID (ignite affinity tie-breaks); may be null
        ("node_order", pa.int64()),  # join order, unique
        ("host", pa.string()),  # nodes on one host are neighbours
        ("attributes", pa.map_(pa.string(), pa.string())),  # zone, rack, ...
        ("capacity", pa.float64()),  # null = 1.0
        ("is_client", pa.bool_()),  # clients hold no data
    ]
)

STATES = ("OWNING", "MOVING", "RENTING", "EVICTED", "LOST")
NODE_EVENTS = ("NODE_JOINED", "NODE_LEFT", "NODE_FAILED")
GROUP_EVENTS = ("CACHE_STARTED", "CACHE_STOPPED", "RESET_LOST_PARTITIONS")


@dataclass(frozen=True)
class Report:
    """One node's view of one partition copy (``report_seq`` is assigned when it is written)."""

    node_id: str
    group_name: str
    partition_id: int
    state: str
    update_counter: int
    size: int
    bytes: int
    wal_history_counter: int | None = None

    def check(self) -> None:
        """Fail here, in the producer, on what the engine would only reject later into ``rejected_rows``."""
        if self.state not in STATES:
            raise ValueError(f"state {self.state!r} is not one of {', '.join(STATES)}")
        if min(self.partition_id, self.update_counter, self.size, self.bytes) < 0:
            raise ValueError(f"negative partition_id, update_counter, size or bytes in {self}")
        if self.wal_history_counter is not None and not 0 <= self.wal_history_counter <= self.update_counter:
            raise ValueError(f"wal_history_counter must be in 0..update_counter in {self}")


class Producer:
    """Appends to a local warehouse's input tables, one Delta commit per call.

    Args:
        warehouse: the warehouse directory (``--warehouse`` of the CLI). For object stores pass a URI and
            ``storage_options`` as ``deltalake`` expects them.
        storage_options: credentials and options for ``deltalake`` (None for local directories).
    """

    def __init__(self, warehouse: str | os.PathLike[str], storage_options: dict[str, str] | None = None) -> None:
        self.warehouse = os.fspath(warehouse)
        self.storage_options = storage_options
        self._next: dict[str, int] = {}

    def _path(self, table: str) -> str:
        return f"{self.warehouse.rstrip('/')}/{table}"

    def _files(self, table: str) -> list[str]:
        return DeltaTable(self._path(table), storage_options=self.storage_options).file_uris()

    def _max(self, table: str, column: str) -> int:
        """The column's maximum over the table's current snapshot (0 when empty), read with pyarrow."""
        maxima = [pc.max(pq.read_table(f, columns=[column]).column(column)).as_py() for f in self._files(table)]
        return max((m for m in maxima if m is not None), default=0)

    def _values(self, table: str, column: str) -> list[object]:
        return [v for f in self._files(table) for v in pq.read_table(f, columns=[column]).column(column).to_pylist()]

    def _take_seq(self, table: str, column: str, count: int) -> int:
        """The first of ``count`` new sequence numbers: above the table's maximum when first asked, then local."""
        if table not in self._next:
            self._next[table] = self._max(table, column) + 1
        first = self._next[table]
        self._next[table] += count
        return first

    def _append(self, table: str, data: pa.Table) -> None:
        write_deltalake(self._path(table), data, mode="append", storage_options=self.storage_options)

    def report(self, reports: Iterable[Report]) -> list[int]:
        """Append reports in one commit, with increasing ``report_seq`` in the given order; returns the seqs."""
        rows = list(reports)
        for r in rows:
            r.check()
        if not rows:
            return []
        first = self._take_seq("partition_reports", "report_seq", len(rows))
        seqs = list(range(first, first + len(rows)))
        data = pa.table(
            {
                "node_id": [r.node_id for r in rows],
                "group_name": [r.group_name for r in rows],
                "partition_id": [r.partition_id for r in rows],
                "state": [r.state for r in rows],
                "update_counter": [r.update_counter for r in rows],
                "size": [r.size for r in rows],
                "bytes": [r.bytes for r in rows],
                "wal_history_counter": [r.wal_history_counter for r in rows],
                "report_seq": seqs,
            },
            schema=PARTITION_REPORTS,
        )
        self._append("partition_reports", data)
        return seqs

    def event(
        self,
        event_type: str,
        node_id: str | None = None,
        group_name: str | None = None,
        event_time: datetime | None = None,
    ) -> int:
        """Append one topology event with the next ``event_seq``; returns it."""
        if event_type in NODE_EVENTS and not node_id:
            raise ValueError(f"{event_type} needs a node_id")
        if event_type in GROUP_EVENTS and not group_name:
            raise ValueError(f"{event_type} needs a group_name")
        if event_type not in NODE_EVENTS + GROUP_EVENTS:
            raise ValueError(f"unknown event type {event_type!r}")
        seq = self._take_seq("topology_events", "event_seq", 1)
        row = {
            "event_seq": [seq],
            "event_type": [event_type],
            "node_id": [node_id],
            "group_name": [group_name],
            "event_time": [event_time or datetime.now(UTC)],
        }
        self._append("topology_events", pa.table(row, schema=TOPOLOGY_EVENTS))
        return seq

    def join(
        self,
        node_id: str,
        host: str,
        attributes: dict[str, str] | None = None,
        capacity: float = 1.0,
        node_uuid: str | None = None,
        is_client: bool = False,
    ) -> int:
        """A node joins: its ``nodes`` row (when the table does not know it yet), then ``NODE_JOINED``.

        A node that rejoins keeps its row (and its join order). A joining node that already holds data (a restart
        with persistence) must report its copies right after this, before the next exchange runs.
        """
        if node_id not in self._values("nodes", "node_id"):
            row = {
                "node_id": [node_id],
                "node_uuid": [node_uuid],
                "node_order": [self._max("nodes", "node_order") + 1],
                "host": [host],
                "attributes": [list((attributes or {}).items())],
                "capacity": [capacity],
                "is_client": [is_client],
            }
            self._append("nodes", pa.table(row, schema=NODES))
        return self.event("NODE_JOINED", node_id=node_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Append events and partition reports to a rebalancer warehouse.")
    parser.add_argument("--warehouse", required=True, help="warehouse directory")
    commands = parser.add_subparsers(dest="command", required=True)
    join = commands.add_parser("join", help="a node joins (nodes row if new, then NODE_JOINED)")
    join.add_argument("--node", required=True)
    join.add_argument("--host", required=True)
    join.add_argument("--zone")
    event = commands.add_parser("event", help="any other topology event")
    event.add_argument("event_type", choices=NODE_EVENTS + GROUP_EVENTS)
    event.add_argument("--node")
    event.add_argument("--group")
    report = commands.add_parser("report", help="one partition copy's state")
    report.add_argument("--node", required=True)
    report.add_argument("--group", required=True)
    report.add_argument("--partition", type=int, required=True)
    report.add_argument("--state", choices=STATES, required=True)
    report.add_argument("--counter", type=int, required=True, help="update counter")
    report.add_argument("--size", type=int, required=True, help="entries")
    report.add_argument("--bytes", type=int, required=True)
    report.add_argument("--wal-from", type=int, help="earliest counter the WAL can replay from")
    args = parser.parse_args(argv)

    producer = Producer(args.warehouse)
    if args.command == "join":
        seq = producer.join(args.node, args.host, {"zone": args.zone} if args.zone else None)
        print(f"event {seq}: NODE_JOINED {args.node}")
    elif args.command == "event":
        seq = producer.event(args.event_type, node_id=args.node, group_name=args.group)
        print(f"event {seq}: {args.event_type} {args.node or args.group}")
    else:
        (seq,) = producer.report(
            [Report(args.node, args.group, args.partition, args.state, args.counter, args.size, args.bytes,
                    args.wal_from)]
        )
        print(f"report {seq}: {args.node} {args.group}/{args.partition} {args.state}")


if __name__ == "__main__":
    main()
