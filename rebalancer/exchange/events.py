"""Events -> exchanges: which topology versions a run commits, in pure Python (no Spark).

Rules (SPEC "Exchange (PME)", Ignite's AffinityTopologyVersion):
- A node event (NODE_JOINED / NODE_LEFT / NODE_FAILED) bumps the major version and resets minor to 0.
  Consecutive pending node events merge into one exchange whose version is the last event's.
  The merged exchange is ``ALL`` when any server node joined or left, ``NONE`` when only clients did.
- CACHE_STARTED / CACHE_STOPPED bump the minor version (``CACHE_CHANGE``), one exchange each;
  RESET_LOST_PARTITIONS bumps the minor version (``RESET_LOST``).
- Persistent clusters (docs/EXCHANGE.md "Baseline, activation, drain"; Ignite's ChangeGlobalStateMessage):
  NODE_DRAINING is a node event (the node stays alive and serving, leaves the placement candidates and the
  baseline); BASELINE_CHANGED (node_id null: the alive servers not draining become the baseline),
  CLUSTER_ACTIVATED and CLUSTER_DEACTIVATED bump the minor version (``ALL``), one exchange each. The baseline
  (``[baseline]``, :class:`rebalancer.config.BaselineConfig`): with auto-adjust and no timeout it is the alive
  servers not draining after every event; with a timeout it follows them once an event arrives at least the
  timeout after the last node event; without auto-adjust it is set by the first activation (or the first exchange
  with a server) and then only by BASELINE_CHANGED and drains. A cluster is active from its first exchange; its
  first CLUSTER_ACTIVATED (accepted even then) sets the baseline to the alive servers, as activating a persistent
  Ignite cluster does.
- An event that cannot apply (a join of a node already alive, a leave of a node not alive, an event for a node
  or group the input tables do not know, a start of a running group, a stop of a stopped one) is rejected with a
  reason and changes nothing; it is still consumed, so it is not re-read forever.
- A *late* event (:func:`late_events`): one whose ``event_seq`` is below the newest event a committed exchange
  merged, and that no exchange merged or rejected. The job only reads events above that seq, so it would never
  apply; it is rejected with a reason telling the writer to append it again with a higher ``event_seq``.
- The coordinator is the alive server with the lowest ``node_order`` (None when no server is alive).

The late affinity switch is decided from data (reports), not from events, by the exchange job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from rebalancer.config import BaselineConfig
from rebalancer.vocabulary import (
    ALL,
    BASELINE_CHANGED,
    CACHE_CHANGE,
    CACHE_EVENTS,
    CACHE_STARTED,
    CACHE_STOPPED,
    CLUSTER_ACTIVATED,
    CLUSTER_DEACTIVATED,
    CLUSTER_EVENTS,
    NODE_DRAINING,
    NODE_EVENTS,
    NODE_JOINED,
    NONE,
    RESET_LOST,
    RESET_LOST_PARTITIONS,
)

__all__ = [
    "ClusterState",
    "Event",
    "ExchangeStep",
    "NodeInfo",
    "Rejection",
    "TopologyState",
    "coordinator_of",
    "late_events",
    "placement_servers",
    "plan_exchanges",
]



@dataclass(frozen=True)
class NodeInfo:
    node_order: int
    is_client: bool


@dataclass(frozen=True)
class Event:
    event_seq: int
    event_type: str
    node_id: str | None = None
    group_name: str | None = None
    event_time: datetime | None = None


IN_MEMORY = BaselineConfig()  # the defaults: the baseline follows the alive servers


@dataclass(frozen=True)
class ClusterState:
    """The persistent-cluster facts of a version (docs/EXCHANGE.md "Baseline, activation, drain").

    Attributes:
        baseline: the baseline nodes (persistent groups are placed over them; some may be offline), or None
            before it is first set.
        active: False after CLUSTER_DEACTIVATED until CLUSTER_ACTIVATED: no data movement is planned.
        explicit: an activation event was applied (before that the cluster is active without one, and its first
            CLUSTER_ACTIVATED sets the baseline).
        draining: alive servers that are draining (copy sources, no longer placement candidates).
        last_node_event_at: the time of the newest applied node event (the auto-adjust timeout counts from it).
        adjust_due: a node event changed the alive servers since the baseline last followed them (timeout > 0).
    """

    baseline: frozenset[str] | None = None
    active: bool = True
    explicit: bool = False
    draining: frozenset[str] = frozenset()
    last_node_event_at: datetime | None = None
    adjust_due: bool = False


@dataclass(frozen=True)
class TopologyState:
    """What a committed version says: its version, alive nodes, running groups and cluster state."""

    major: int = 0
    minor: int = 0
    alive: Mapping[str, NodeInfo] = field(default_factory=dict)
    groups: frozenset[str] = frozenset()
    cluster: ClusterState = ClusterState()


@dataclass(frozen=True)
class ExchangeStep:
    """One exchange to commit: the version it produces and what changed to get there."""

    major: int
    minor: int
    exchange_type: str
    merged_event_seqs: tuple[int, ...]
    alive: Mapping[str, NodeInfo]
    groups: frozenset[str]
    new_groups: frozenset[str] = frozenset()
    reset_groups: frozenset[str] = frozenset()
    coordinator: str | None = None
    cluster: ClusterState = ClusterState()
    activated: bool = False  # this exchange activates the cluster: counters are validated across every report


@dataclass(frozen=True)
class Rejection:
    event: Event
    reason: str


def coordinator_of(alive: Mapping[str, NodeInfo]) -> str | None:
    """The alive server with the lowest node_order (ties by node_id), or None."""
    servers = [(info.node_order, node_id) for node_id, info in alive.items() if not info.is_client]
    return min(servers)[1] if servers else None


def placement_servers(alive: Mapping[str, NodeInfo], draining: frozenset[str]) -> frozenset[str]:
    """The alive servers that are not draining: the placement candidates, and what auto-adjust follows."""
    return frozenset(n for n, i in alive.items() if not i.is_client and n not in draining)


def _apply_node_event(
    event: Event, alive: dict[str, NodeInfo], catalog: Mapping[str, NodeInfo], draining: set[str]
) -> str | None:
    """Apply a node event to ``alive`` and ``draining`` in place; return a rejection reason instead when it cannot
    apply."""
    node = event.node_id
    if node is None:
        return f"{event.event_type} has no node_id"
    if node not in catalog:
        return f"{event.event_type} for node {node!r}, which is not in the nodes table"
    if event.event_type == NODE_JOINED:
        if node in alive:
            return f"NODE_JOINED for node {node!r}, which is already alive"
        alive[node] = catalog[node]
    elif event.event_type == NODE_DRAINING:
        if node not in alive or alive[node].is_client:
            return f"NODE_DRAINING for node {node!r}, which is not an alive server node; the event changes nothing"
        if node in draining:
            return f"NODE_DRAINING for node {node!r}, which is already draining; the event changes nothing"
        draining.add(node)
    else:
        if node not in alive:
            return (
                f"{event.event_type} for node {node!r}, which is not alive (it already left or failed, or never "
                "joined); the event changes nothing"
            )
        del alive[node]
        draining.discard(node)
    return None


def _cluster_event_problem(event: Event, cluster: ClusterState) -> str | None:
    """Why a baseline or activation event cannot apply, or None when it can."""
    if event.event_type == BASELINE_CHANGED and event.node_id is not None:
        return (f"BASELINE_CHANGED names node {event.node_id!r}; it takes a null node_id (the alive server nodes "
                "that are not draining become the baseline): start or stop nodes first, then change the baseline")
    if event.event_type == CLUSTER_ACTIVATED and cluster.active and cluster.explicit:
        return "CLUSTER_ACTIVATED while the cluster is active; the event changes nothing"
    if event.event_type == CLUSTER_DEACTIVATED and not cluster.active:
        return "CLUSTER_DEACTIVATED while the cluster is inactive; the event changes nothing"
    return None


def _due(cluster: ClusterState, settings: BaselineConfig, when: datetime | None) -> bool:
    """Whether the auto-adjust timeout has passed at ``when`` (an event's time) since the last node event."""
    if not (settings.auto_adjust and cluster.adjust_due):
        return False
    if cluster.last_node_event_at is None or when is None:
        return False
    return (when - cluster.last_node_event_at).total_seconds() >= settings.auto_adjust_timeout_s


def plan_exchanges(
    state: TopologyState,
    pending: Iterable[Event],
    node_catalog: Mapping[str, NodeInfo],
    group_catalog: Iterable[str],
    baseline: BaselineConfig = IN_MEMORY,
) -> tuple[list[ExchangeStep], list[Rejection]]:
    """Turn pending events (any order; processed by ``event_seq``) into the exchanges to commit.

    Rejected events change nothing. Events are "consumed" by the exchanges that follow them: the job reads as
    pending only events newer than the newest merged event, so a rejected event at the tail of the log is seen
    again by the next run (its ``rejected_rows`` entry is written once; the job deduplicates).

    Args:
        state: the last committed version (``TopologyState()`` before the first exchange).
        pending: events newer than the last committed exchange.
        node_catalog: every valid node of the ``nodes`` table.
        group_catalog: every valid group of the ``cache_groups`` table. Groups with no CACHE_STARTED event
            start with the first exchange that has a server node (a generated cluster has no cache events).
        baseline: the ``[baseline]`` settings.

    Returns:
        The exchanges in commit order, and the events that could not apply.
    """
    catalog_groups = frozenset(group_catalog)
    pending = list(pending)
    implicit_groups: frozenset[str] = frozenset()
    if not state.groups and coordinator_of(state.alive) is None:
        # A fresh cluster: groups with no CACHE_STARTED event start with the first server.
        explicit = {e.group_name for e in pending if e.event_type == CACHE_STARTED}
        implicit_groups = frozenset(g for g in catalog_groups if g not in explicit)
    major, minor = state.major, state.minor
    alive = dict(state.alive)
    groups = set(state.groups)
    cluster = state.cluster
    steps: list[ExchangeStep] = []
    rejections: list[Rejection] = []
    events = sorted(pending, key=lambda e: e.event_seq)

    def follow(c: ClusterState, draining: frozenset[str]) -> ClusterState:
        """The baseline after an event: auto-adjust without a timeout follows the alive servers at once; the first
        exchange with a server sets it; a drain removes the node from it."""
        servers = placement_servers(alive, draining)
        if baseline.follows_at_once:
            return replace(c, baseline=servers, draining=draining, adjust_due=False)
        if c.baseline is None:  # set by the first exchange with a server
            return replace(c, baseline=servers if servers else None, draining=draining)
        return replace(c, baseline=c.baseline - draining, draining=draining)

    i = 0
    while i < len(events):
        if _due(cluster, baseline, events[i].event_time):
            # the timeout passed with no node event: the baseline follows the alive servers from here
            cluster = replace(cluster, baseline=placement_servers(alive, cluster.draining), adjust_due=False)
        if events[i].event_type in NODE_EVENTS:
            merged: list[int] = []
            server_change = False
            draining = set(cluster.draining)
            last_at = cluster.last_node_event_at
            while i < len(events) and events[i].event_type in NODE_EVENTS:
                event = events[i]
                i += 1
                reason = _apply_node_event(event, alive, node_catalog, draining)
                if reason is not None:
                    rejections.append(Rejection(event, reason))
                    continue
                merged.append(event.event_seq)
                major += 1
                server_change = server_change or not node_catalog[event.node_id or ""].is_client
                last_at = event.event_time or last_at
            if not merged:
                continue
            minor = 0
            cluster = follow(replace(cluster, last_node_event_at=last_at,
                                     adjust_due=cluster.adjust_due or server_change), frozenset(draining))
            new_groups: frozenset[str] = frozenset()
            if implicit_groups and server_change:
                new_groups, implicit_groups = implicit_groups, frozenset()
                groups |= new_groups
            steps.append(
                ExchangeStep(
                    major, minor, ALL if server_change else NONE, tuple(merged), dict(alive),
                    frozenset(groups), new_groups=new_groups, coordinator=coordinator_of(alive), cluster=cluster,
                )
            )
            continue

        event = events[i]
        i += 1
        if event.event_type in CLUSTER_EVENTS:
            reason = _cluster_event_problem(event, cluster)
            if reason is not None:
                rejections.append(Rejection(event, reason))
                continue
            activated = event.event_type == CLUSTER_ACTIVATED
            if event.event_type == BASELINE_CHANGED:
                cluster = replace(cluster, baseline=placement_servers(alive, cluster.draining), adjust_due=False)
            elif activated:
                first = not cluster.explicit
                cluster = replace(cluster, active=True, explicit=True)
                if first or cluster.baseline is None or baseline.follows_at_once:
                    cluster = replace(cluster, baseline=placement_servers(alive, cluster.draining), adjust_due=False)
            else:
                cluster = replace(cluster, active=False, explicit=True)
            minor += 1
            steps.append(
                ExchangeStep(
                    major, minor, ALL, (event.event_seq,), dict(alive), frozenset(groups),
                    coordinator=coordinator_of(alive), cluster=cluster, activated=activated,
                )
            )
            continue
        reason = _group_event_problem(event, groups, catalog_groups)
        if reason is not None:
            rejections.append(Rejection(event, reason))
            continue
        group = event.group_name or ""
        minor += 1
        new: frozenset[str] = frozenset()
        reset: frozenset[str] = frozenset()
        if event.event_type == CACHE_STARTED:
            groups.add(group)
            new = frozenset({group})
        elif event.event_type == CACHE_STOPPED:
            groups.discard(group)
        else:
            reset = frozenset({group})
        steps.append(
            ExchangeStep(
                major, minor, RESET_LOST if reset else CACHE_CHANGE, (event.event_seq,), dict(alive),
                frozenset(groups), new_groups=new, reset_groups=reset, coordinator=coordinator_of(alive),
                cluster=cluster,
            )
        )
    return steps, rejections


def _group_event_problem(event: Event, groups: set[str], catalog: frozenset[str]) -> str | None:
    """Why a cache or reset event cannot apply, or None when it can."""
    group = event.group_name
    if event.event_type not in CACHE_EVENTS and event.event_type != RESET_LOST_PARTITIONS:
        return f"unknown event type {event.event_type!r}"
    if group is None:
        return f"{event.event_type} has no group_name"
    if group not in catalog:
        return f"{event.event_type} for group {group!r}, which is not in the cache_groups table"
    if event.event_type == CACHE_STARTED and group in groups:
        return f"CACHE_STARTED for group {group!r}, which is already running"
    if event.event_type != CACHE_STARTED and group not in groups:
        return f"{event.event_type} for group {group!r}, which is not running"
    return None


def late_events(events: Iterable[Event], last_event_seq: int) -> list[Rejection]:
    """Reject events that arrived after a committed exchange had already moved past their ``event_seq``.

    The job reads as pending only events with ``event_seq > last_event_seq`` (the newest event any committed
    exchange merged). An event appended later with a lower seq (a writer that reserved seqs out of order, a
    delayed retry) would therefore never be applied, silently. The caller passes exactly those events: valid,
    ``event_seq <= last_event_seq``, merged by no exchange and with no ``rejected_rows`` entry yet (every event
    is decided once: merged or rejected). Committed versions are never rewritten to fit them in.

    Args:
        events: the late events (any order).
        last_event_seq: the newest event seq a committed exchange merged.

    Returns:
        One rejection per event, by ``event_seq``; the reason names the seq to append above. Once its
        ``rejected_rows`` entry exists, the caller no longer passes the event, so it is recorded once.
    """
    return [
        Rejection(
            e,
            f"{e.event_type} event_seq {e.event_seq} arrived late: committed exchanges already applied the events "
            f"up to event_seq {last_event_seq}, so this event was never applied (versions are not rewritten); "
            f"append it again with an event_seq above {last_event_seq}",
        )
        for e in sorted(events, key=lambda e: e.event_seq)
    ]
