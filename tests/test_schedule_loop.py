"""The scheduler's event loop run two ways (``rebalancer.planning.event_loop``): as Python and compiled by numba.

The loop is one function; :func:`~rebalancer.planning.event_loop.run` executes it as plain Python for small plans
and compiled for large ones. These tests hold the two to the same schedule, row for row and bit for bit, on random
plans and on a suite plan under both list-scheduling policies, and check which one ``run`` picks. Compiled, the
loop finds a freed node's waiting pairs by scanning bits where the Python run walks short lists, so the same
schedules also hold the two ways of finding them to the same pairs. The first compile
takes minutes; ``make compiled`` does it once (numba caches it beside the module), so these tests only load it:
they run in CI's ``make scheduler-slow``, after it, not in ``make test`` (every other scheduler test runs the loop
as Python).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.plans import CHANGES, random_plan, scenario_plan, synthetic_plan
from rebalancer.planning import event_loop, schedule

pytest.importorskip("numba", reason="the compiled loop needs numba (installed by the [cluster] extra)")
pytestmark = pytest.mark.slow


def both_ways(plan, model: schedule.CostModel, policy: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """The schedule of ``plan`` with the loop as Python, and compiled."""
    tables = []
    for threshold in (10**12, 0):
        monkeypatch.setattr(event_loop, "COMPILED_FROM_STEPS", threshold)
        out = schedule.schedule(plan, model, policy)
        tables.append([out.column(c).to_pylist() for c in ("source_node", "wave", "est_start_s", "est_end_s")])
    return tables[0], tables[1]


@given(
    seed=st.integers(0, 2**32 - 1),
    nodes=st.integers(2, 12),
    partitions=st.integers(1, 40),
    skew=st.sampled_from([0.0, 0.5, 1.0]),
    planner_order=st.booleans(),
    cap=st.integers(1, 4),
    overhead=st.sampled_from([0.0, 0.1]),
    policy=st.sampled_from(["portfolio", "hazelcast"]),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_compiled_and_python_loops_give_the_same_schedule_on_random_plans(
    seed: int, nodes: int, partitions: int, skew: float, planner_order: bool, cap: int, overhead: float, policy: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = random_plan(seed, nodes, partitions, skew=skew, planner_order=planner_order)
    model = schedule.CostModel(max_parallel_per_node=cap, overhead_s=overhead)
    python, compiled = both_ways(plan, model, policy, monkeypatch)
    assert python == compiled


@pytest.mark.parametrize("policy", ["portfolio", "hazelcast"])
def test_compiled_and_python_loops_give_the_same_schedule_on_a_suite_plan_and_a_crowded_one(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The crowded plan (300 steps on each of 40 nodes) makes nodes look their waiting pairs up by the open nodes
    # (fewer than their waiting pairs), the path small random plans rarely take.
    for plan in (scenario_plan(next(c for c in CHANGES if c.key == "L/failure")), synthetic_plan(6_000, 40)):
        python, compiled = both_ways(plan, schedule.CostModel(max_parallel_per_node=3), policy, monkeypatch)
        assert python == compiled


def loop_input(plan) -> event_loop.LoopInput:  # noqa: ANN001
    """The loop's input for ``plan``'s ``hazelcast`` candidate, at two slots per node."""
    model = schedule.CostModel(max_parallel_per_node=2)
    p = schedule._decode(plan, schedule.PLAN_INPUT_SCHEMA.names, model)
    return schedule._loop_input(p, model, schedule._hazelcast(p), schedule._solo_durations(p, model))


def test_compiled_and_python_loops_keep_the_same_ready_instants() -> None:
    # The packed pass replays its plan with a ready instant per row (`ready_at`, a fourth kind of event).
    x = loop_input(random_plan(11, 5, 30))
    ready = np.random.default_rng(0).uniform(0.0, 5.0, len(x.action))
    x = dataclasses.replace(x, ready_at=ready)
    python, compiled = (event_loop.run(x, compiled=flag) for flag in (False, True))
    for a, b in zip(python[:3], compiled[:3], strict=True):
        assert np.array_equal(a, b)
    assert python[3] == compiled[3]
    assert (python[0] >= ready - 1e-9).all()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_run_past_its_horizon_stops_with_an_infinite_makespan(compiled: bool) -> None:
    x = loop_input(random_plan(7, 4, 20))
    *_, full = event_loop.run(x, compiled=compiled)
    *_, cut = event_loop.run(x, horizon=float(full) / 2, compiled=compiled)
    assert math.isfinite(full) and full > 0
    assert math.isinf(cut)


def test_run_compiles_from_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    compiled_loop = event_loop._compiled_loop()

    def spy(*args):  # noqa: ANN002, ANN202
        calls.append("compiled")
        return compiled_loop(*args)

    monkeypatch.setattr(event_loop, "_compiled_loop", lambda: spy)
    x = loop_input(random_plan(3, 4, 10))
    n = len(x.action)
    monkeypatch.setattr(event_loop, "COMPILED_FROM_STEPS", n + 1)
    event_loop.run(x)
    assert calls == []
    monkeypatch.setattr(event_loop, "COMPILED_FROM_STEPS", n)
    event_loop.run(x)
    assert calls == ["compiled"]


def test_after_compile_for_every_plan_a_small_plan_runs_compiled_to_the_same_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What-if's large sweeps load the compiled loop once for all their plans: below ``COMPILED_FROM_STEPS`` a plan
    then runs compiled, with the schedule the Python loop gives."""
    plan, model = scenario_plan(CHANGES[1]), schedule.CostModel()
    monkeypatch.setattr(event_loop, "_EVERY_PLAN", [])
    assert plan.num_rows < event_loop.COMPILED_FROM_STEPS and not event_loop.runs_compiled(plan.num_rows)
    python = schedule.schedule(plan, model)
    assert event_loop.compile_for_every_plan()
    assert event_loop.runs_compiled(plan.num_rows) and event_loop.runs_compiled(1)
    compiled = schedule.schedule(plan, model)
    assert python.equals(compiled)
