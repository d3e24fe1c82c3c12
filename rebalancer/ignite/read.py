"""Read a live Apache Ignite 2.x cluster through its public interfaces (docs/IGNITE.md).

Contract:
    - :func:`read_cluster` returns an :class:`IgniteSnapshot`: the server and client nodes (``SYS.NODES``, their
      attributes from ``SYS.NODE_ATTRIBUTES``), the cluster state (the thin client's cluster facade), the baseline
      (``SYS.BASELINE_NODES``), the cache groups (``SYS.CACHE_GROUPS``, persistence from
      the ``io.dataregion.*`` metrics) and every copy of every partition with its
      state, primary flag, update counter and size (Ignite's control utility, ``--cache distribution null``: no
      SQL view carries counters). Queries go through one thin-client connection; the control utility is one
      process started with the command ``[ignite] control`` names.
    - Nothing here decides what the rows mean for rebalancer: :mod:`rebalancer.ignite.collect` does.
    - :func:`parse_distribution` and :func:`parse_affinity` are pure (tested without a cluster).
    - Errors are one sentence: :class:`IgniteUnreachableError` (no connection, or the control utility could not
      reach the cluster), :class:`IgniteVersionError` (a cluster of another major version than 2.x, or one whose
      SQL views cannot answer).
"""

from __future__ import annotations

import csv
import logging
import re
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AffinityText", "IgniteCopy", "IgniteGroup", "IgniteNode", "IgniteSnapshot", "IgniteUnreachableError",
    "IgniteVersionError", "parse_affinity", "parse_distribution", "read_cluster", "require_2x",
]

DEFAULT_REGION = "default"  # the region a group without DATA_REGION_NAME lives in
MACS = "org.apache.ignite.macs"  # the attribute Ignite groups neighbours by (exclude_neighbors)
_DISTRIBUTION_HEADER = "groupId,partition,nodeId,primary,state,updateCounter,partitionSize"


class IgniteUnreachableError(RuntimeError):
    """The cluster did not answer; the message is one sentence."""


class IgniteVersionError(RuntimeError):
    """The cluster is not one this collector reads (another major version, or SQL views off); one sentence."""


@dataclass(frozen=True)
class IgniteNode:
    node_uuid: str  # the runtime id (changes at every start)
    consistent_id: str  # the stable id
    order: int  # the topology version the node joined at
    is_client: bool
    version: str
    attributes: dict[str, str]  # the attributes asked for (the MACs and the named ones) that the node publishes


@dataclass(frozen=True)
class IgniteGroup:
    group_id: int
    name: str
    mode: str  # PARTITIONED | REPLICATED | LOCAL
    partitions: int
    backups: int
    affinity: str  # the affinity function's toString, e.g. "RendezvousAffinityFunction [parts=1024, ...]"
    node_filter: str | None
    loss_policy: str
    data_region: str
    persistent: bool | None  # None: the data region's persistence could not be read


@dataclass(frozen=True)
class IgniteCopy:
    group_name: str
    partition: int
    node_uuid: str
    state: str
    primary: bool
    update_counter: int
    size: int


@dataclass(frozen=True)
class IgniteSnapshot:
    """The cluster as its public interfaces showed it at one moment."""

    version: str  # the version of the node answering the thin client
    active: bool
    nodes: tuple[IgniteNode, ...]
    groups: tuple[IgniteGroup, ...]
    baseline: tuple[str, ...] | None  # consistent ids; None: no baseline set
    copies: tuple[IgniteCopy, ...]


@dataclass(frozen=True)
class AffinityText:
    """What an affinity function's ``toString`` says (``SYS.CACHE_GROUPS.AFFINITY``)."""

    function: str  # the class's simple name
    partitions: int | None
    exclude_neighbors: bool
    backup_filter: str | None  # the legacy IgniteBiPredicate backupFilter's class, None when null
    affinity_backup_filter: str | None  # the affinityBackupFilter's class (without "@hash"), None when null


def parse_affinity(text: str) -> AffinityText:
    """Parse ``SYS.CACHE_GROUPS.AFFINITY``: ``RendezvousAffinityFunction [parts=64, exclNeighbors=false, ...]``."""
    head, _, body = text.partition("[")
    fields = dict(_pairs(body.rstrip().rstrip("]")))

    def cls(value: str | None) -> str | None:
        if value in (None, "", "null"):
            return None
        return value.split("@", 1)[0].rsplit(".", 1)[-1]

    parts = fields.get("parts")
    return AffinityText(head.strip().rsplit(".", 1)[-1], int(parts) if parts and parts.isdigit() else None,
                        fields.get("exclNeighbors", "false").lower() == "true", cls(fields.get("backupFilter")),
                        cls(fields.get("affinityBackupFilter")))


def _pairs(body: str) -> Iterator[tuple[str, str]]:
    for item in re.split(r",\s*(?=\w+=)", body):
        key, sep, value = item.partition("=")
        if sep:
            yield key.strip(), value.strip()


def parse_distribution(text: str) -> list[dict[str, Any]]:
    """The copies the control utility's ``--cache distribution null`` printed: one dict per CSV row after its
    ``[groupId,partition,nodeId,primary,state,updateCounter,partitionSize,nodeAddresses]`` header, with the group's
    name from the ``[next group: id=..., name=...]`` line above the rows. ``node`` is as printed: the first 8 hex
    characters of the node's runtime id."""
    rows: list[dict[str, Any]] = []
    header: list[str] | None = None
    name: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[" + _DISTRIBUTION_HEADER):
            header = line.strip("[]").split(",")
            continue
        group = re.fullmatch(r"\[next group: id=(-?\d+), name=(.*)\]", line)
        if group:
            name = group.group(2)
            continue
        if header is None or not re.match(r"-?\d+,\d+,", line):
            continue
        row = dict(zip(header, next(csv.reader([line])), strict=False))
        rows.append({"group_id": int(row["groupId"]), "group_name": name, "partition": int(row["partition"]),
                     "node": row["nodeId"], "primary": row["primary"] == "P", "state": row["state"],
                     "update_counter": int(row["updateCounter"]), "size": int(row["partitionSize"])})
    return rows


# ---- the cluster side ----
@contextmanager
def _client(host: str, port: int, timeout_s: float) -> Iterator[Any]:
    try:
        from pyignite import Client
    except ImportError as e:  # pragma: no cover - the extra is part of every install the Makefile makes
        raise IgniteUnreachableError("the Ignite thin client is not installed: pip install 'rebalancer[ignite]'") from e
    # pyignite logs every failed connection attempt with its traceback; the one sentence below says it all
    logging.getLogger("pyignite").addHandler(logging.NullHandler())
    client = Client(timeout=timeout_s)
    try:
        client.connect(host, port)
    except Exception as e:  # pyignite raises socket errors, its own ReconnectError or HandshakeError
        raise IgniteUnreachableError(
            f"no Ignite node answered the thin-client protocol at {host}:{port} ({_first_line(e)}); check "
            f"--host/--port ([ignite] host, port) and that the node's client connector is enabled") from e
    try:
        yield client
    finally:
        client.close()


def _query(client: Any, sql: str) -> list[dict[str, Any]]:
    with client.sql(sql, schema="SYS", include_field_names=True, page_size=4096) as cursor:
        rows = iter(cursor)
        names = [str(n).upper() for n in next(rows)]
        return [dict(zip(names, r, strict=True)) for r in rows]


def read_cluster(host: str, port: int, *, control: Sequence[str], timeout_s: float = 15.0,
                 attributes: Iterable[str] = ()) -> IgniteSnapshot:
    """The cluster behind the thin-client port ``host:port`` as it is now.

    Args:
        attributes: the node attributes to read besides the MACs (the view also holds every environment variable
            and JVM property of each node: only these names are asked for).
        control: the control utility's command (``control.sh`` of the Ignite distribution, or ``java -cp ...
            CommandHandler``); ``--host``, ``--port`` and the command's arguments are appended.

    Raises:
        IgniteUnreachableError: the thin client or the control utility could not reach the cluster.
        IgniteVersionError: the cluster is not Ignite 2.x, or its SQL views do not answer.
    """
    with _client(host, port, timeout_s) as client:
        active = int(client.get_cluster().get_state()) != 0
        try:
            node_rows = _query(client, "SELECT NODE_ID, CONSISTENT_ID, NODE_ORDER, IS_CLIENT, VERSION FROM NODES")
        except Exception as e:
            raise IgniteVersionError(
                f"the Ignite node at {host}:{port} refused a query of its SQL system views ({_first_line(e)}); the "
                f"collector needs Ignite 2.x with the ignite-indexing module (or another query engine) on the "
                f"nodes") from e
        require_2x([str(r["VERSION"]) for r in node_rows], f"{host}:{port}")
        by_node: dict[str, dict[str, str]] = {}
        names = ", ".join("'" + name.replace("'", "''") + "'" for name in sorted({MACS, *attributes}))
        for r in _query(client, f"SELECT NODE_ID, NAME, VALUE FROM NODE_ATTRIBUTES WHERE NAME IN ({names})"):
            by_node.setdefault(str(r["NODE_ID"]), {})[str(r["NAME"])] = "" if r["VALUE"] is None else str(r["VALUE"])
        nodes = tuple(IgniteNode(str(r["NODE_ID"]), str(r["CONSISTENT_ID"]), int(r["NODE_ORDER"]),
                                 bool(r["IS_CLIENT"]), str(r["VERSION"]), by_node.get(str(r["NODE_ID"]), {}))
                      for r in node_rows)
        baseline_rows = _query(client, "SELECT CONSISTENT_ID FROM BASELINE_NODES")
        persistence = _persistent_regions(client)
        groups = tuple(
            IgniteGroup(int(r["CACHE_GROUP_ID"]), str(r["CACHE_GROUP_NAME"]), str(r["CACHE_MODE"]),
                        int(r["PARTITIONS_COUNT"]), int(r["BACKUPS"]), str(r["AFFINITY"]),
                        None if r["NODE_FILTER"] is None else str(r["NODE_FILTER"]), str(r["PARTITION_LOSS_POLICY"]),
                        str(r["DATA_REGION_NAME"] or DEFAULT_REGION),
                        persistence.get(str(r["DATA_REGION_NAME"] or DEFAULT_REGION)) if persistence else None)
            for r in _query(client, "SELECT CACHE_GROUP_ID, CACHE_GROUP_NAME, CACHE_MODE, PARTITIONS_COUNT, BACKUPS, "
                                    "AFFINITY, NODE_FILTER, PARTITION_LOSS_POLICY, DATA_REGION_NAME FROM CACHE_GROUPS"))
    copies = _copies(control, host, port, nodes, groups, timeout_s) if active else ()
    version = next((n.version for n in nodes if not n.is_client), nodes[0].version if nodes else "")
    baseline = tuple(sorted(str(r["CONSISTENT_ID"]) for r in baseline_rows)) if baseline_rows else None
    return IgniteSnapshot(version, active, nodes, groups, baseline, copies)


def require_2x(versions: Sequence[str], where: str) -> None:
    """Refuse a cluster with a node of another major version than 2 (``VERSION`` as ``SYS.NODES`` shows it).

    Raises:
        IgniteVersionError: one sentence naming the versions seen.
    """
    if {v.split(".", 1)[0] for v in versions} != {"2"}:
        seen = ", ".join(sorted({v.split("#", 1)[0] for v in versions})) or "no node"
        raise IgniteVersionError(f"the cluster at {where} runs Ignite {seen}; the collector reads Ignite 2.x only")


def _persistent_regions(client: Any) -> dict[str, bool] | None:
    """Data region name -> persistence on, from the answering node's ``io.dataregion.<name>.CheckpointBufferSize``
    metric (a checkpoint buffer exists only for a persistent region; no view shows the flag cluster-wide, and a
    cluster's nodes share their regions' configuration). None when the metrics view does not answer."""
    try:
        rows = _query(client, "SELECT NAME, VALUE FROM METRICS WHERE NAME LIKE 'io.dataregion.%.CheckpointBufferSize'")
    except Exception:  # a metrics view switched off: the groups' persistence is unknown
        return None
    prefix, suffix = "io.dataregion.", ".CheckpointBufferSize"
    return {str(r["NAME"])[len(prefix):-len(suffix)]: int(r["VALUE"] or 0) > 0 for r in rows} or None


def _copies(control: Sequence[str], host: str, port: int, nodes: Sequence[IgniteNode],
            groups: Sequence[IgniteGroup], timeout_s: float) -> tuple[IgniteCopy, ...]:
    text = run_control(control, host, port, ["--cache", "distribution", "null"], timeout_s)
    names = {g.group_id: g.name for g in groups}
    servers = [n for n in nodes if not n.is_client]
    out = []
    for row in parse_distribution(text):
        matches = [n.node_uuid for n in servers if n.node_uuid.replace("-", "").lower().startswith(
            row["node"].replace("-", "").lower())]
        if len(matches) != 1:
            continue  # a node that left between the two reads (or an ambiguous short id): the next collect sees it
        out.append(IgniteCopy(row["group_name"] or names.get(row["group_id"], str(row["group_id"])), row["partition"],
                              matches[0], row["state"], row["primary"], row["update_counter"], row["size"]))
    return tuple(out)


def run_control(control: Sequence[str], host: str, port: int, args: Sequence[str], timeout_s: float) -> str:
    """Run Ignite's control utility against ``host:port`` and return its standard output.

    Raises:
        IgniteUnreachableError: it could not be started, timed out, or failed (its last line in the sentence).
    """
    command = [*control, "--host", host, "--port", str(port), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s * 8, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise IgniteUnreachableError(
            f"Ignite's control utility {control[0]!r} was not found; set [ignite] control to the control.sh of your "
            f"Ignite distribution") from e
    except subprocess.TimeoutExpired as e:
        raise IgniteUnreachableError(f"Ignite's control utility did not answer within {timeout_s * 8:.0f} s "
                                     f"({' '.join(args)} at {host}:{port})") from e
    if done.returncode != 0:
        last = _first_line(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip())
        raise IgniteUnreachableError(f"Ignite's control utility failed with exit code {done.returncode} on "
                                     f"{' '.join(args)} at {host}:{port}: {last}")
    return done.stdout


def _first_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
