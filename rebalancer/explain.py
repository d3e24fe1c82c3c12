"""``rebalancer explain``: why one partition is where it is, at one committed version, from the committed tables.

Like Elasticsearch's allocation explain: for ``(group, partition)`` at a version (default the latest) it answers

- **placement**: every placement candidate in the affinity's rank order, with its weight, and why it was taken
  (primary, backup k) or skipped (not needed, neighbour of a node already in the list, the backup filter, draining,
  offline, the balanced affinity's cap);
- **copies**: each copy of ``partition_map`` with its state and why (owns at the highest counter, counter behind by
  k and reset to MOVING, same counter but another size, a new ideal node waiting for its COPY, surplus RENTING,
  LOST under the group's loss policy);
- **serving**: who serves, whether that primary is temporary, and which ideal nodes the late affinity switch waits
  for;
- **plan**: the partition's steps with the supplier and why, HISTORICAL or FULL and why, and the schedule: wave,
  start, end and what the step waited for (the partition's previous step, or a slot on a node at its cap).

Everything is read from the committed tables of the version (and the previous version's map); nothing is
recomputed but the affinity's ranking of the candidates. :func:`explain` returns plain data (``--json`` prints it);
:func:`describe` turns it into lines for people (the CLI and the HTML report print them).
tests/test_explain.py checks every partition of the exchange scenarios against the tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.affinity.assign import assign_indexes
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.affinity.rendezvous import weight
from rebalancer.config import Settings
from rebalancer.groups import GroupSettings
from rebalancer.inputs import read_as_consumed
from rebalancer.storage import Warehouse
from rebalancer.tables import version_where
from rebalancer.vocabulary import (
    BALANCED,
    COPY,
    DROP,
    HISTORICAL,
    IGNITE_AFFINITY,
    LOST,
    MOVING,
    OWNING,
    PROMOTE,
    RENDEZVOUS,
    RENTING,
    RESET_TO_MOVING,
    SIZE_MISMATCH,
)

__all__ = ["ExplainError", "describe", "explain"]

_EPSILON = 1e-9  # schedule times are sums of floats: equal within this


class ExplainError(ValueError):
    """Nothing to explain: no such version, group or partition; says which."""


def explain(warehouse: Warehouse, settings: Settings, group: str, partition: int,
            version: tuple[int, int] | None = None, node: str | None = None) -> dict[str, Any]:
    """Why partition ``partition`` of ``group`` is where it is at ``version`` (default: the latest committed).

    Args:
        warehouse: the warehouse (only read).
        settings: ``rebalance.history_threshold``, ``migration.max_parallel_per_node`` and the affinity settings.
        group: the cache group.
        partition: the partition id.
        version: ``(major, minor)`` of a committed version.
        node: keep only the candidates, copies and steps that involve this node.

    Returns:
        A JSON-able dict: ``group``, ``partition``, ``version``, ``exchange``, ``settings``, ``candidates``,
        ``copies``, ``serving``, ``lost``, ``plan`` (module docstring).

    Raises:
        ExplainError: the version is not committed, the group was not running in it, or the partition is out of
            range.
    """
    history = warehouse.read_arrow("exchanges").to_pylist()
    exchange = _exchange_row(history, version)
    v = (int(exchange["topology_major"]), int(exchange["topology_minor"]))
    where = version_where(v)
    if group not in (exchange["running_groups"] or []):
        raise ExplainError(f"group {group!r} was not running at version {v[0]}.{v[1]} (running: "
                           f"{', '.join(exchange['running_groups'] or []) or 'none'})")
    groups = read_as_consumed(warehouse, "cache_groups", exchange)
    g = _one(groups.filter(pc.equal(pc.field("group_name"), group)).to_pylist(), group)
    if not 0 <= partition < int(g["partitions"]):
        raise ExplainError(f"group {group!r} has partitions 0..{int(g['partitions']) - 1}, not {partition}")
    group_settings = GroupSettings.from_row(g)
    key: dict[str, Any] = {**where, "group_name": group, "partition_id": partition}
    ideal = sorted(warehouse.read_arrow("ideal_assignment", where=key).to_pylist(), key=lambda r: r["replica_index"])
    assignment = sorted(warehouse.read_arrow("affinity_assignment", where=key).to_pylist(),
                        key=lambda r: r["replica_index"])
    copies = sorted(warehouse.read_arrow("partition_map", where=key).to_pylist(), key=lambda r: r["node_id"])
    conflicts = {r["node_id"]: r for r in warehouse.read_arrow("counter_conflicts", where=key).to_pylist()}
    lost = warehouse.read_arrow("lost_partitions", where=key).to_pylist()
    plan = warehouse.read_arrow("migration_plan", where=where)
    steps = sorted(plan.filter(pc.and_(pc.equal(plan.column("group_name"), group),
                                       pc.equal(plan.column("partition_id"), partition))).to_pylist(),
                   key=lambda r: r["step"])
    servers = [r for r in warehouse.read_arrow("topology", where=where).to_pylist() if not r["is_client"]]
    nodes = {r["node_id"]: r for r in read_as_consumed(warehouse, "nodes", exchange).to_pylist()}
    before = _previous_copies(warehouse, history, exchange, group, partition)

    settings_row = {k: g.get(k) for k in ("partitions", "backups", "mode", "affinity", "exclude_neighbors",
                                          "backup_filter", "loss_policy", "persistent")}
    out: dict[str, Any] = {
        "group": group,
        "partition": partition,
        "version": list(v),
        "exchange": {"exchange_id": exchange["exchange_id"], "exchange_type": exchange["exchange_type"]},
        "settings": settings_row,
        "candidates": _candidates(group_settings, ideal, servers, nodes, exchange, settings),
        "copies": _copies(copies, ideal, conflicts, lost, before, steps, group_settings),
        "serving": _serving(assignment, ideal, copies),
        "lost": _lost(lost),
        "plan": _plan(steps, plan, copies, settings),
    }
    if node is not None:
        out["candidates"] = [c for c in out["candidates"] if c["node"] == node]
        out["copies"] = [c for c in out["copies"] if c["node"] == node]
        out["plan"] = [s for s in out["plan"] if node in (s["source"], s["target"])]
        out["node"] = node
    return out


# =====================================================================================================================
# Reading
# =====================================================================================================================


def _exchange_row(rows: list[dict[str, Any]], version: tuple[int, int] | None) -> dict[str, Any]:
    if not rows:
        raise ExplainError("nothing is committed yet: run `rebalancer exchange` first")
    if version is None:
        return max(rows, key=lambda r: r["exchange_id"])
    found = [r for r in rows if (r["topology_major"], r["topology_minor"]) == tuple(version)]
    if not found:
        newest = max(rows, key=lambda r: r["exchange_id"])
        raise ExplainError(f"version {version[0]}.{version[1]} is not committed (the latest is "
                           f"{newest['topology_major']}.{newest['topology_minor']})")
    return found[0]


def _one(rows: list[dict[str, Any]], group: str) -> dict[str, Any]:
    if not rows:
        raise ExplainError(f"group {group!r} is not in the cache_groups table")
    return rows[-1]


def _previous_copies(warehouse: Warehouse, rows: list[dict[str, Any]], exchange: Mapping[str, Any], group: str,
                     partition: int) -> dict[str, dict[str, Any]] | None:
    """The partition's copies at the version before (None for the first exchange)."""
    earlier = [r for r in rows if r["exchange_id"] < exchange["exchange_id"]]
    if not earlier:
        return None
    prev = max(earlier, key=lambda r: r["exchange_id"])
    where: dict[str, Any] = {**version_where((prev["topology_major"], prev["topology_minor"])),
                             "group_name": group, "partition_id": partition}
    return {r["node_id"]: r for r in warehouse.read_arrow("partition_map", where=where).to_pylist()}


# =====================================================================================================================
# Placement
# =====================================================================================================================


def _candidates(g: GroupSettings, ideal: Sequence[Mapping[str, Any]], servers: Sequence[Mapping[str, Any]],
                nodes: Mapping[str, Mapping[str, Any]], exchange: Mapping[str, Any],
                settings: Settings) -> list[dict[str, Any]]:
    """Every placement candidate in rank order, taken or skipped and why."""
    alive = {r["node_id"] for r in servers}
    draining = set(exchange.get("draining_nodes") or [])
    baseline = exchange.get("baseline_nodes")
    pool = sorted(set(baseline) if g.persistent and baseline is not None else alive)
    ranked_over = [nodes[n] for n in pool if n in nodes]
    partition = int(ideal[0]["partition_id"]) if ideal else None
    taken = {r["node_id"]: int(r["replica_index"]) for r in ideal}
    affinity = g.affinity
    if partition is None or not ranked_over:
        return []
    node_set = NodeSet.from_rows(ranked_over)
    # Every candidate in the ranking's order: the affinity's ranking (a balanced placement is ranked as rendezvous)
    # with a replica per node, no constraint.
    every_node = GroupSettings(g.name, g.partitions, len(node_set) - 1,
                               affinity=IGNITE_AFFINITY if affinity == IGNITE_AFFINITY else RENDEZVOUS)
    order = assign_indexes([partition], node_set, every_node, settings.affinity.ignite_ids_as_strings)[0]
    ranked = [node_set.node_ids[i] for i in order if i >= 0]
    replicas = len(pool) if g.replicated else min(g.backups + 1, len(pool))
    filters = g.backup_filter
    # SPEC 4: with unequal capacities the rank is by capacity / -ln((weight + 0.5) / 2^32), not by weight
    weighted = affinity != "ignite" and any(float(nodes[n].get("capacity") or 1.0) != 1.0 for n in ranked)
    out = []
    above: list[str] = []  # ideal nodes ranked above the current one
    for rank, n in enumerate(ranked, start=1):
        row = nodes[n]
        entry: dict[str, Any] = {
            "node": n, "rank": rank, "host": row.get("host"), "capacity": row.get("capacity"),
            "attributes": dict(row.get("attributes") or {}),
            "weight": weight(n, partition) if affinity != "ignite" else None,
            "taken": n in taken, "replica_index": taken.get(n),
        }
        if weighted:
            entry["score"] = float(row.get("capacity") or 1.0) / -math.log((weight(n, partition) + 0.5) / 2**32)
        if n in taken:
            role = "primary" if taken[n] == 0 else f"backup {taken[n]}"
            entry["reason"] = f"taken as {role}" + (" (offline: it gets its copy when it returns)"
                                                    if n not in alive else "")
            above.append(n)
        elif n not in alive:
            entry["reason"] = "offline: in the baseline but not alive"
        elif n in draining:
            entry["reason"] = "draining: leaves the placement while it still serves"
        elif len(above) >= replicas:
            entry["reason"] = (f"not needed: the list had its {replicas} replicas from higher ranks"
                               + (" (ranked by capacity-weighted score: capacity / -ln((weight + 0.5) / 2^32))"
                                  if weighted else ""))
        elif g.exclude_neighbors and any(nodes[m].get("host") == row.get("host") for m in above):
            m = next(m for m in above if nodes[m].get("host") == row.get("host"))
            entry["reason"] = f"neighbour: same host {row.get('host')!r} as {m}, already in the list"
        elif filters and (clash := _filter_clash(row, [nodes[m] for m in above], filters)) is not None:
            entry["reason"] = f"backup filter: {clash}"
        elif affinity == BALANCED:
            entry["reason"] = "the balanced affinity kept this node's replicas near its share (docs/AFFINITY.md)"
        else:
            entry["reason"] = "not taken (rank beyond what the affinity needed)"
        out.append(entry)
    for n, i in sorted(taken.items(), key=lambda kv: kv[1]):  # ideal nodes not ranked (a balanced placement's)
        if n not in ranked:
            out.append({"node": n, "rank": None, "host": nodes.get(n, {}).get("host"), "capacity": None,
                        "attributes": {}, "weight": None, "taken": True, "replica_index": i,
                        "reason": f"taken as {'primary' if i == 0 else f'backup {i}'}"})
    return out


def _filter_clash(row: Mapping[str, Any], chosen: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str | None:
    attrs = dict(row.get("attributes") or {})
    for other in chosen:
        theirs = dict(other.get("attributes") or {})
        for name in names:
            if attrs.get(name) is not None and attrs.get(name) == theirs.get(name):
                return f"{name} = {attrs[name]!r} like {other['node_id']}, already in the list"
    return None


# =====================================================================================================================
# Copies, serving, loss
# =====================================================================================================================


def _copies(copies: Sequence[Mapping[str, Any]], ideal: Sequence[Mapping[str, Any]],
            conflicts: Mapping[str, Mapping[str, Any]], lost: Sequence[Mapping[str, Any]],
            before: Mapping[str, Mapping[str, Any]] | None, steps: Sequence[Mapping[str, Any]],
            g: GroupSettings) -> list[dict[str, Any]]:
    ideal_nodes = {r["node_id"] for r in ideal}
    top = max((int(c["update_counter"] or 0) for c in copies if c["state"] == OWNING), default=None)
    out = []
    for c in copies:
        n, state, counter = c["node_id"], c["state"], c["update_counter"]
        conflict = conflicts.get(n)
        had = before.get(n) if before is not None else None
        if state == OWNING and conflict is not None and conflict["action"] == SIZE_MISMATCH:
            reason = (f"owns at the highest counter {counter}, but its size {c['size']} differs from another "
                      "owner's at that counter (SIZE_MISMATCH: a warning, nothing moves)")
        elif state == OWNING:
            reason = f"owns: counter {counter}" + (" (the highest)" if top is not None and counter == top else "")
        elif state == MOVING and conflict is not None and conflict["action"] == RESET_TO_MOVING:
            behind = int(conflict["max_update_counter"]) - int(conflict["update_counter"])
            reason = (f"counter {conflict['update_counter']} behind the highest {conflict['max_update_counter']} by "
                      f"{behind}: reset to MOVING and rebalanced")
        elif state == MOVING and had is None:
            reason = "new ideal node: the copy is created MOVING and loads by its COPY step"
        elif state == MOVING and had is not None and had["state"] == RENTING:
            reason = "was RENTING and is an ideal node again: restarts MOVING and loads by its COPY step"
        elif state == MOVING:
            reason = f"loading (was {had['state'] if had else 'absent'}): waits for its COPY step"
        elif state == RENTING:
            reason = ("surplus: not in the ideal list; kept RENTING while the ideal nodes load, then dropped"
                      if n not in ideal_nodes else "RENTING")
        elif state == LOST:
            policy = lost[0]["loss_policy"] if lost else g.loss_policy
            was = "" if had is None else f" (was {had['state']})"
            reason = (f"LOST{was}: the partition lost every OWNING copy; under {policy} it stays LOST until "
                      "RESET_LOST_PARTITIONS")
        else:
            reason = state
        has_step = any(s["target_node"] == n and s["action"] == COPY for s in steps)
        out.append({"node": n, "state": state, "update_counter": counter, "size": c["size"], "bytes": c["bytes"],
                    "ideal": n in ideal_nodes, "copy_planned": has_step, "reason": reason})
    return out


def _serving(assignment: Sequence[Mapping[str, Any]], ideal: Sequence[Mapping[str, Any]],
             copies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not assignment:
        return {"primary": None, "temporary": False, "reason": "nobody serves: no copy owns", "switch_waits_for": []}
    primary = assignment[0]
    state = {c["node_id"]: c["state"] for c in copies}
    waits = [r["node_id"] for r in ideal if state.get(r["node_id"]) != OWNING]
    if primary["is_temporary"]:
        ideal_primary = ideal[0]["node_id"] if ideal else None
        reason = (f"{primary['node_id']} serves temporarily: the ideal primary {ideal_primary} does not own yet "
                  f"({state.get(ideal_primary, 'no copy')}); the late affinity switch makes the ideal list serve "
                  "once every ideal node owns")
    elif waits:
        reason = (f"{primary['node_id']} is the ideal primary and owns; the ideal list serves, its other nodes "
                  "load meanwhile")
    else:
        reason = f"{primary['node_id']} is the ideal primary; every ideal node owns"
    return {"primary": primary["node_id"], "temporary": bool(primary["is_temporary"]),
            "serving": [r["node_id"] for r in assignment], "reason": reason,
            "switch_waits_for": [{"node": n, "state": state.get(n, "no copy")} for n in waits]}


def _lost(lost: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    if not lost:
        return None
    r = lost[0]
    return {"loss_policy": r["loss_policy"], "read_allowed": r["read_allowed"], "write_allowed": r["write_allowed"],
            "reason": f"every OWNING copy is gone; under {r['loss_policy']} reads "
                      f"{'are' if r['read_allowed'] else 'are not'} allowed and writes "
                      f"{'are' if r['write_allowed'] else 'are not'}"}


# =====================================================================================================================
# The plan and its schedule
# =====================================================================================================================


def _plan(steps: Sequence[Mapping[str, Any]], plan: pa.Table, copies: Sequence[Mapping[str, Any]],
          settings: Settings) -> list[dict[str, Any]]:
    by_node = {c["node_id"]: c for c in copies}
    cap = settings.migration.max_parallel_per_node
    starts = plan.column("est_start_s").to_numpy(zero_copy_only=False) if plan.num_rows else np.zeros(0)
    ends = plan.column("est_end_s").to_numpy(zero_copy_only=False) if plan.num_rows else np.zeros(0)
    sources = np.array(plan.column("source_node").to_pylist(), dtype=object)
    targets = np.array(plan.column("target_node").to_pylist(), dtype=object)
    out = []
    previous_end = None
    for s in steps:
        entry = {k: s[k] for k in ("migration_id", "step", "action", "rebalance_mode", "from_counter", "to_counter",
                                   "bytes", "wave", "est_start_s", "est_end_s")}
        entry["source"], entry["target"] = s["source_node"], s["target_node"]
        entry["why"] = _step_reason(s, by_node, settings)
        entry["waited_for"] = _waited(s, previous_end, starts, ends, sources, targets, cap)
        previous_end = s["est_end_s"]
        out.append(entry)
    return out


def _step_reason(s: Mapping[str, Any], copies: Mapping[str, Mapping[str, Any]], settings: Settings) -> str:
    if s["action"] == PROMOTE:
        return (f"the serving primary {s['source_node']} hands the primary role to the ideal primary "
                f"{s['target_node']}, which owns by then")
    if s["action"] == DROP:
        return f"{s['source_node']} is not in the ideal list: its copy is dropped once the ideal nodes own"
    pool = [n for n in (s.get("candidates") or [])]
    supplier = (f"supplier {s['source_node']}, chosen among the owners at the highest counter "
                f"{pool if pool else [s['source_node']]} (spread round-robin over COPYs with the same pool; the "
                "scheduler takes another when it starts sooner)")
    if s["rebalance_mode"] == HISTORICAL:
        return (f"{supplier}; HISTORICAL: the target is at counter {s['from_counter']} and the supplier's WAL "
                f"reaches back to it, so it replays {int(s['to_counter']) - int(s['from_counter'])} updates")
    target = copies.get(s["target_node"])
    c = int(target["update_counter"] or 0) if target is not None and target["state"] == MOVING else 0
    source = copies.get(s["source_node"])
    threshold = settings.rebalance.history_threshold
    if c == 0:
        why = "the target holds no data"
    elif source is not None and (source.get("wal_history_counter") is None or
                                 int(source["wal_history_counter"]) > c):
        why = f"no supplier's WAL history reaches back to the target's counter {c}"
    elif source is not None and int(source["size"] or 0) <= threshold:
        why = f"the partition has {source['size']} entries, not more than rebalance.history_threshold {threshold}"
    else:
        why = "replaying the gap would cost more than sending the partition"
    return f"{supplier}; FULL: {why}"


def _waited(s: Mapping[str, Any], previous_end: float | None, starts: np.ndarray, ends: np.ndarray,
            sources: np.ndarray, targets: np.ndarray, cap: int) -> str:
    start = s["est_start_s"]
    if start is None:
        return "not scheduled (the cluster is inactive)"
    if start <= _EPSILON:
        return "nothing: it starts at once"
    if previous_end is not None and math.isclose(previous_end, start, abs_tol=_EPSILON):
        return f"step {s['step'] - 1} of this partition (a partition's steps run in order)"
    for node in (s["source_node"], s["target_node"]):
        if node is None:
            continue
        touching = (sources == node) | (targets == node)
        finishing = touching & (np.abs(ends - start) <= _EPSILON)
        running = int(np.count_nonzero(touching & (starts < start - _EPSILON) & (ends > start - _EPSILON)))
        if finishing.any() and running + int(np.count_nonzero(finishing)) >= cap:
            return f"a slot on {node}: {cap} migrations (its cap) ran there until {start:.3f} s"
    return f"bandwidth or a slot freed at {start:.3f} s (the cost model shares each node's bandwidth)"


# =====================================================================================================================
# For people
# =====================================================================================================================


def describe(e: Mapping[str, Any]) -> list[str]:
    """An :func:`explain` answer as lines of text (headings unindented, details indented)."""
    v, st = e["version"], e["settings"]
    lines = [f"{e['group']} partition {e['partition']} at version {v[0]}.{v[1]} (exchange "
             f"{e['exchange']['exchange_id']}, {e['exchange']['exchange_type']}); {st['backups']} backups, "
             f"{st['mode'] or 'PARTITIONED'}, {st['affinity'] or 'rendezvous'} affinity, "
             f"{st['loss_policy'] or 'READ_WRITE_SAFE'}" + (f"; only node {e['node']}" if e.get("node") else ""),
             "placement (candidates in rank order)"]
    for c in e["candidates"]:
        w = "" if c["weight"] is None else f" weight {c['weight']}"
        w += f" capacity {c['capacity']:g} score {c['score']:.4g}" if "score" in c else ""
        lines.append(f"  {'-' if c['rank'] is None else c['rank']:>4} {c['node']}{w}: {c['reason']}")
    lines.append("copies" + ("" if e["copies"] else ": none"))
    lines += [f"  {c['node']} {c['state']} counter {c['update_counter']} size {c['size']}: {c['reason']}"
              for c in e["copies"]]
    s = e["serving"]
    lines.append(f"serving: {s['reason']}")
    if s["switch_waits_for"]:
        lines.append("  the switch waits for: " + ", ".join(f"{w['node']} ({w['state']})"
                                                           for w in s["switch_waits_for"]))
    if e["lost"]:
        lines.append(f"lost: {e['lost']['reason']}")
    lines.append("plan" + ("" if e["plan"] else ": no step"))
    for p in e["plan"]:
        times = ("unscheduled" if p["est_start_s"] is None else
                 f"wave {p['wave']}, {p['est_start_s']:.3f}-{p['est_end_s']:.3f} s")
        mode = f" {p['rebalance_mode']}" if p["rebalance_mode"] else ""
        lines.append(f"  step {p['step']} {p['action']}{mode} {p['source'] or '-'} -> {p['target'] or '-'}, "
                     f"{(p['bytes'] or 0) / 2**20:,.1f} MiB, {times}")
        lines.append(f"    why: {p['why']}")
        lines.append(f"    waited for: {p['waited_for']}")
    return lines
