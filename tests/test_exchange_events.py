"""Events -> exchanges (pure Python): version bumps, merging, NONE exchanges, coordinator, rejections."""

from __future__ import annotations

from rebalancer.exchange.events import Event, NodeInfo, TopologyState, coordinator_of, plan_exchanges

CATALOG = {
    "n1": NodeInfo(1, False),
    "n2": NodeInfo(2, False),
    "n3": NodeInfo(3, False),
    "n4": NodeInfo(4, False),
    "c1": NodeInfo(5, True),
}
GROUPS = ["g1", "g2"]


def joined(seq: int, node: str) -> Event:
    return Event(seq, "NODE_JOINED", node_id=node)


def steady(major: int = 3) -> TopologyState:
    alive = {n: CATALOG[n] for n in ("n1", "n2", "n3")}
    return TopologyState(major, 0, alive, frozenset(GROUPS))


def test_first_joins_merge_into_one_exchange_that_starts_the_groups() -> None:
    steps, rejected = plan_exchanges(TopologyState(), [joined(1, "n1"), joined(2, "n2"), joined(3, "n3")],
                                     CATALOG, GROUPS)
    assert rejected == []
    assert [(s.major, s.minor, s.exchange_type, s.merged_event_seqs) for s in steps] == [(3, 0, "ALL", (1, 2, 3))]
    assert steps[0].new_groups == frozenset(GROUPS)
    assert steps[0].coordinator == "n1"
    assert set(steps[0].alive) == {"n1", "n2", "n3"}


def test_three_joins_merge_and_take_the_last_version() -> None:
    events = [joined(10, "n4"), Event(11, "NODE_FAILED", node_id="n1"), Event(12, "NODE_LEFT", node_id="n2")]
    steps, _ = plan_exchanges(steady(), events, CATALOG, GROUPS)
    assert [(s.major, s.minor, s.exchange_type) for s in steps] == [(6, 0, "ALL")]
    assert set(steps[0].alive) == {"n3", "n4"}
    assert steps[0].coordinator == "n3"
    assert steps[0].new_groups == frozenset()


def test_client_join_gives_a_none_exchange() -> None:
    steps, _ = plan_exchanges(steady(), [joined(7, "c1")], CATALOG, GROUPS)
    assert [(s.major, s.minor, s.exchange_type) for s in steps] == [(4, 0, "NONE")]
    assert steps[0].coordinator == "n1"


def test_cache_and_reset_events_bump_the_minor_version_one_each() -> None:
    state = TopologyState(3, 0, steady().alive, frozenset({"g1"}))
    events = [
        Event(20, "CACHE_STARTED", group_name="g2"),
        Event(21, "RESET_LOST_PARTITIONS", group_name="g1"),
        Event(22, "CACHE_STOPPED", group_name="g2"),
        joined(23, "n4"),
    ]
    steps, rejected = plan_exchanges(state, events, CATALOG, GROUPS)
    assert rejected == []
    assert [(s.major, s.minor, s.exchange_type) for s in steps] == [
        (3, 1, "CACHE_CHANGE"), (3, 2, "RESET_LOST"), (3, 3, "CACHE_CHANGE"), (4, 0, "ALL")
    ]
    assert steps[0].new_groups == frozenset({"g2"}) and steps[0].groups == frozenset(GROUPS)
    assert steps[1].reset_groups == frozenset({"g1"})
    assert steps[2].groups == frozenset({"g1"})


def test_impossible_events_are_rejected_and_change_nothing() -> None:
    events = [
        joined(1, "n1"),  # already alive
        Event(2, "NODE_LEFT", node_id="n4"),  # not alive
        Event(3, "NODE_FAILED", node_id="ghost"),  # unknown
        Event(4, "CACHE_STARTED", group_name="g1"),  # already running
        Event(5, "CACHE_STOPPED", group_name="nope"),  # unknown group
        Event(6, "NODE_EXPLODED", node_id="n1"),
    ]
    steps, rejected = plan_exchanges(steady(), events, CATALOG, GROUPS)
    assert steps == []
    reasons = [r.reason for r in rejected]
    assert [r.event.event_seq for r in rejected] == [1, 2, 3, 4, 5, 6]
    assert "already alive" in reasons[0]
    assert "not alive" in reasons[1]
    assert "not in the nodes table" in reasons[2]
    assert "already running" in reasons[3]
    assert "not in the cache_groups table" in reasons[4]
    assert "unknown event type" in reasons[5]


def test_rejected_event_inside_a_merge_is_left_out_of_it() -> None:
    steps, rejected = plan_exchanges(steady(), [joined(8, "n4"), joined(9, "n4")], CATALOG, GROUPS)
    assert [(s.major, s.merged_event_seqs) for s in steps] == [(4, (8,))]
    assert [r.event.event_seq for r in rejected] == [9]


def test_coordinator_is_lowest_order_server_and_ignores_clients() -> None:
    assert coordinator_of({"c1": NodeInfo(0, True), "n2": NodeInfo(2, False), "n3": NodeInfo(1, False)}) == "n3"
    assert coordinator_of({"c1": NodeInfo(0, True)}) is None
