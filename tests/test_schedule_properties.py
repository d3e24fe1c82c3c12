"""Properties of the migration scheduler on random plans (pure: no Spark).

Plans come from ``bench.plans.random_plan`` (2-6 nodes, 1-14 partitions of 1-4 steps, hot nodes, planner or any
step order), scheduled under random cost models (caps 1-4, three bandwidths and overheads). Checked:

- ``portfolio`` is never longer than ``serial``, and never longer than ``hazelcast`` when every partition is in one
  priority class (the module docstring says why not across classes);
- the lower bound never exceeds the makespan of any policy;
- every policy keeps the per-node caps at every instant, runs a partition's steps in order without overlap,
  reads every COPY from an allowed source;
- ``portfolio`` gives urgent partitions first call on the slots: a non-urgent step never starts while an urgent
  ready step that its start left room for waits.

``SCHEDULE_EXAMPLES`` (default 300; 3,000 under the soak profile, ``HYPOTHESIS_PROFILE=soak`` as ``make soak`` sets it)
sets the examples: all of them for the comparison with the baselines, half for plans across priority classes, a
quarter for the invariants, a tenth for determinism. Since ``portfolio`` runs CP-SAT on plans of up to 50 steps (up
to a few tenths of a second each where it cannot prove its schedule optimal), 300 take about 30 s here. More:
``SCHEDULE_EXAMPLES=20000 python -m pytest -p no:cacheprovider tests/test_schedule_properties.py``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from bench.plans import random_plan
from rebalancer.planning.schedule import POLICIES, CostModel, lower_bound, makespan, schedule

EXAMPLES = int(os.environ.get("SCHEDULE_EXAMPLES",
                              "3000" if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "soak" else "200"))
EPS = 1e-6


@st.composite
def plans(draw: st.DrawFn, one_class: bool = False) -> tuple[pa.Table, CostModel]:
    """A random plan and cost model (module docstring)."""
    plan = random_plan(
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(2, 6)),
        draw(st.integers(1, 14)),
        skew=draw(st.sampled_from([0.0, 0.5, 1.0])),
        planner_order=draw(st.booleans()),
        one_class=one_class,
    )
    model = CostModel(
        max_parallel_per_node=draw(st.integers(1, 4)),
        node_bandwidth_bytes_per_s=draw(st.sampled_from([2e8, 1e9, 2.5e9])),
        overhead_s=draw(st.sampled_from([0.0, 0.01, 0.1, 0.5])),
    )
    return plan, model


def property_settings(examples: int) -> settings:
    return settings(max_examples=max(examples, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(plans(one_class=True))
@property_settings(EXAMPLES)
def test_portfolio_is_never_longer_than_either_baseline_and_never_shorter_than_the_bound(
    plan_model: tuple[pa.Table, CostModel],
) -> None:
    plan, model = plan_model
    spans = {policy: makespan(schedule(plan, model, policy)) for policy in POLICIES}
    note(f"{model}: {spans}")
    assert spans["portfolio"] <= spans["hazelcast"] + EPS
    assert spans["portfolio"] <= spans["serial"] + EPS
    bound = lower_bound(schedule(plan, model, "portfolio"), model)
    for policy, span in spans.items():
        assert bound <= span + EPS, policy


@given(plans())
@property_settings(EXAMPLES // 2)
def test_across_priority_classes_portfolio_is_within_serial_and_above_the_bound(
    plan_model: tuple[pa.Table, CostModel],
) -> None:
    plan, model = plan_model
    portfolio = schedule(plan, model, "portfolio")
    serial = makespan(schedule(plan, model, "serial"))
    note(f"{model}: portfolio {makespan(portfolio)}, serial {serial}")
    assert lower_bound(portfolio, model) <= makespan(portfolio) + EPS <= serial + 2 * EPS
    for policy in ("hazelcast", "serial"):
        out = schedule(plan, model, policy)
        assert lower_bound(out, model) <= makespan(out) + EPS, policy


def touched(row: dict[str, Any]) -> set[str]:
    return {row["source_node"]} if row["action"] == "DROP" else {row["source_node"], row["target_node"]}


def running(rows: list[dict[str, Any]], t: float, skip: set[int] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """Running steps per node at instant t (start <= t < end), leaving out the rows in ``skip``."""
    load: dict[str, int] = defaultdict(int)
    for i, r in enumerate(rows):
        if i not in skip and r["est_start_s"] <= t < r["est_end_s"]:
            for v in touched(r):
                load[v] += 1
    return load


@given(plans(), st.sampled_from(POLICIES))
@property_settings(EXAMPLES // 4)
def test_caps_order_sources_and_urgent_partitions_first(plan_model: tuple[pa.Table, CostModel], policy: str) -> None:
    plan, model = plan_model
    rows = schedule(plan, model, policy).to_pylist()
    given_rows = plan.to_pylist()
    cap = model.max_parallel_per_node
    starts = sorted({r["est_start_s"] for r in rows})
    for t in starts:
        assert max(running(rows, t).values(), default=0) <= cap, t
    by_part: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_part[(r["group_name"], r["partition_id"])].append(i)
    previous: dict[int, int] = {}
    for idx in by_part.values():
        idx.sort(key=lambda i: rows[i]["step"])
        for a, b in zip(idx, idx[1:], strict=False):
            assert rows[a]["est_end_s"] <= rows[b]["est_start_s"], (rows[a], rows[b])
            previous[b] = a
    for r, g in zip(rows, given_rows, strict=True):
        if r["action"] != "COPY":
            assert r["source_node"] == g["source_node"]
        elif policy == "portfolio":
            assert r["source_node"] in g["candidates"] and r["source_node"] != r["target_node"]
        elif policy == "hazelcast":
            assert r["source_node"] == (g["primary_node"] or g["source_node"])
    if policy != "portfolio":
        return
    # Urgent first: when non-urgent steps start at t, an urgent step ready at t and still waiting did not fit in
    # the slots the steps running at t left, the non-urgent ones started at t set aside. (Instants where steps of
    # zero length start, with overhead_s 0, are ordered inside: they are skipped.)
    urgent = [r["owners"] < r["replicas"] or r["owners"] <= 1 for r in rows]
    for t in starts:
        late = {i for i, r in enumerate(rows) if r["est_start_s"] == t and not urgent[i]}
        if not late or any(r["est_start_s"] == r["est_end_s"] == t for r in rows):
            continue
        load = running(rows, t, skip=late)
        for i, r in enumerate(rows):
            # ready when the instant began (not through zero-length steps that started at t)
            ready = i not in previous or rows[previous[i]]["est_start_s"] < t >= rows[previous[i]]["est_end_s"]
            if urgent[i] and ready and r["est_start_s"] > t:
                if r["action"] == "COPY":
                    # with the source it read from in the end (one candidate schedule reads from the primary only);
                    # it may also have waited for a direction: a COPY running into its target or out of its source
                    fits = load[r["target_node"]] < cap and load[r["source_node"]] < cap
                    busy = any(
                        q["action"] == "COPY" and q["est_start_s"] <= t < q["est_end_s"]
                        and (q["target_node"] == r["target_node"] or q["source_node"] == r["source_node"])
                        for j, q in enumerate(rows) if j not in late
                    )
                    fits = fits and not busy
                else:
                    fits = all(load[v] < cap for v in touched(r))
                assert not fits, f"urgent {r} waited at t={t} while {[rows[j] for j in late]} started"


@given(plans())
@property_settings(EXAMPLES // 10)
def test_the_schedule_is_a_function_of_the_plan(plan_model: tuple[pa.Table, CostModel]) -> None:
    plan, model = plan_model
    order = np.random.default_rng(0).permutation(plan.num_rows)
    out = schedule(plan, model, "portfolio")
    shuffled = schedule(plan.take(order), model, "portfolio")
    assert shuffled.equals(out.take(order))
