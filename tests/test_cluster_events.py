"""Baseline, activation and drain events -> exchanges and cluster state (pure Python; docs/EXCHANGE.md
"Baseline, activation, drain")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from rebalancer.config import BaselineConfig
from rebalancer.exchange.events import (
    ClusterState,
    Event,
    NodeInfo,
    TopologyState,
    plan_exchanges,
)

CATALOG = {f"n{i}": NodeInfo(i, False) for i in range(1, 6)} | {"c1": NodeInfo(9, True)}
GROUPS = ["g"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PERSISTENT = BaselineConfig(auto_adjust=False)
IN_MEMORY = BaselineConfig()


def at(seq: int, kind: str, node: str | None = None, seconds: float | None = None) -> Event:
    return Event(seq, kind, node_id=node, event_time=T0 + timedelta(seconds=seq if seconds is None else seconds))


def steady(settings: BaselineConfig = IN_MEMORY) -> TopologyState:
    steps, _ = plan_exchanges(TopologyState(), [at(1, "NODE_JOINED", "n1"), at(2, "NODE_JOINED", "n2"),
                                                at(3, "NODE_JOINED", "n3")], CATALOG, GROUPS, settings)
    s = steps[-1]
    return TopologyState(s.major, s.minor, s.alive, s.groups, s.cluster)


def test_by_default_the_baseline_follows_the_alive_servers() -> None:
    state = steady()
    assert state.cluster == ClusterState(baseline=frozenset({"n1", "n2", "n3"}), active=True,
                                         last_node_event_at=T0 + timedelta(seconds=3))
    steps, rejected = plan_exchanges(state, [at(4, "NODE_FAILED", "n2"), at(5, "NODE_JOINED", "c1")], CATALOG,
                                     GROUPS)
    assert rejected == [] and steps[0].cluster.baseline == {"n1", "n3"}  # clients are never in it


def test_without_auto_adjust_a_failure_keeps_the_baseline_until_baseline_changed() -> None:
    state = steady(PERSISTENT)
    assert state.cluster.baseline == {"n1", "n2", "n3"}  # set by the first exchange with a server
    steps, _ = plan_exchanges(state, [at(4, "NODE_FAILED", "n2"), at(5, "NODE_JOINED", "n4"),
                                      at(6, "BASELINE_CHANGED")], CATALOG, GROUPS, PERSISTENT)
    assert [(s.major, s.minor, s.exchange_type) for s in steps] == [(5, 0, "ALL"), (5, 1, "ALL")]
    assert steps[0].cluster.baseline == {"n1", "n2", "n3"}  # n2 offline, n4 alive but not in the baseline
    assert steps[1].cluster.baseline == {"n1", "n3", "n4"}


def test_a_timeout_adjusts_the_baseline_once_an_event_comes_that_late() -> None:
    slow = BaselineConfig(auto_adjust=True, auto_adjust_timeout_s=60)
    state = steady(slow)
    early = [at(4, "NODE_FAILED", "n2", seconds=10), at(5, "CACHE_STARTED", seconds=30)]
    steps, _ = plan_exchanges(state, [early[0]], CATALOG, GROUPS, slow)
    assert steps[0].cluster.baseline == {"n1", "n2", "n3"} and steps[0].cluster.adjust_due
    late = Event(5, "CLUSTER_DEACTIVATED", event_time=T0 + timedelta(seconds=71))
    before = Event(5, "CLUSTER_DEACTIVATED", event_time=T0 + timedelta(seconds=69))
    after_fail = TopologyState(steps[0].major, 0, steps[0].alive, steps[0].groups, steps[0].cluster)
    [kept], _ = plan_exchanges(after_fail, [before], CATALOG, GROUPS, slow)
    assert kept.cluster.baseline == {"n1", "n2", "n3"}
    [moved], _ = plan_exchanges(after_fail, [late], CATALOG, GROUPS, slow)
    assert moved.cluster.baseline == {"n1", "n3"} and not moved.cluster.adjust_due


def test_activation_and_deactivation_bump_the_minor_version_and_are_rejected_when_they_change_nothing() -> None:
    state = steady(PERSISTENT)
    events = [at(4, "CLUSTER_ACTIVATED"), at(5, "CLUSTER_DEACTIVATED"), at(6, "CLUSTER_DEACTIVATED"),
              at(7, "NODE_JOINED", "n4"), at(8, "CLUSTER_ACTIVATED"), at(9, "BASELINE_CHANGED", "n4")]
    steps, rejected = plan_exchanges(state, events, CATALOG, GROUPS, PERSISTENT)
    assert [(s.major, s.minor, s.cluster.active, s.activated) for s in steps] == [
        (3, 1, True, True), (3, 2, False, False), (4, 0, False, False), (4, 1, True, True)]
    assert [r.event.event_seq for r in rejected] == [6, 9]
    assert "null node_id" in rejected[1].reason
    # a later activation without auto-adjust keeps the baseline; n4 joined while inactive and is not in it
    assert steps[-1].cluster.baseline == {"n1", "n2", "n3"}


def test_the_first_activation_sets_the_baseline_even_of_a_cluster_active_without_one() -> None:
    events = [at(1, "NODE_JOINED", "n1"), at(2, "NODE_JOINED", "n2"), at(3, "CLUSTER_ACTIVATED"),
              at(4, "NODE_JOINED", "n3"), at(5, "CLUSTER_ACTIVATED")]
    steps, rejected = plan_exchanges(TopologyState(), events[:1], CATALOG, GROUPS, PERSISTENT)
    assert steps[0].cluster.baseline == {"n1"} and not steps[0].cluster.explicit  # set by the first exchange
    state = TopologyState(steps[0].major, 0, steps[0].alive, steps[0].groups, steps[0].cluster)
    steps, rejected = plan_exchanges(state, events[1:], CATALOG, GROUPS, PERSISTENT)
    assert [(s.major, s.minor, s.cluster.baseline) for s in steps] == [
        (2, 0, {"n1"}), (2, 1, {"n1", "n2"}), (3, 0, {"n1", "n2"})]
    assert steps[1].activated and [r.event.event_seq for r in rejected] == [5]


def test_a_draining_node_stays_alive_and_leaves_the_baseline() -> None:
    state = steady(PERSISTENT)
    steps, rejected = plan_exchanges(state, [at(4, "NODE_DRAINING", "n2"), at(5, "NODE_DRAINING", "n2"),
                                             at(6, "NODE_DRAINING", "c1")], CATALOG, GROUPS, PERSISTENT)
    assert [(s.major, s.exchange_type) for s in steps] == [(4, "ALL")]
    assert set(steps[0].alive) == {"n1", "n2", "n3"}
    assert steps[0].cluster.draining == {"n2"} and steps[0].cluster.baseline == {"n1", "n3"}
    assert [r.event.event_seq for r in rejected] == [5, 6]
    drained = TopologyState(4, 0, steps[0].alive, steps[0].groups, steps[0].cluster)
    [left], _ = plan_exchanges(drained, [at(7, "NODE_LEFT", "n2")], CATALOG, GROUPS, PERSISTENT)
    assert left.cluster.draining == frozenset() and left.cluster.baseline == {"n1", "n3"}


EVENT_KINDS = ["NODE_JOINED", "NODE_LEFT", "NODE_FAILED", "NODE_DRAINING", "BASELINE_CHANGED", "CLUSTER_ACTIVATED",
               "CLUSTER_DEACTIVATED"]


@given(kinds=st.lists(st.tuples(st.sampled_from(EVENT_KINDS), st.sampled_from(sorted(CATALOG))), max_size=30),
       auto=st.booleans(), timeout=st.sampled_from([0.0, 5.0]))
def test_cluster_state_invariants_over_random_histories(kinds: list[tuple[str, str]], auto: bool,
                                                        timeout: float) -> None:
    """Draining nodes are alive servers; auto-adjust without a timeout keeps the baseline equal to the alive
    servers not draining; the baseline never holds a client or a draining node; versions only grow."""
    settings = BaselineConfig(auto_adjust=auto, auto_adjust_timeout_s=timeout)
    events = [at(i + 1, kind, None if kind.startswith(("BASELINE", "CLUSTER")) else node)
              for i, (kind, node) in enumerate(kinds)]
    steps, rejected = plan_exchanges(TopologyState(), events, CATALOG, GROUPS, settings)
    assert len({e.event_seq for s in steps for e in events if e.event_seq in s.merged_event_seqs}) + len(
        rejected) == len(events)
    version = (0, 0)
    for s in steps:
        assert (s.major, s.minor) > version
        version = (s.major, s.minor)
        servers = {n for n, i in s.alive.items() if not i.is_client}
        assert s.cluster.draining <= servers
        if s.cluster.baseline is not None:
            assert not s.cluster.baseline & s.cluster.draining
            assert all(not CATALOG[n].is_client for n in s.cluster.baseline)
            if auto and timeout == 0:
                assert s.cluster.baseline == servers - s.cluster.draining
