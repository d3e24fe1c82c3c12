"""bench/search.py's annealing (docs/PLANNING.md, "Every failure"): it keeps only schedules of the event loop, finds a
shorter one where the portfolio's is not the best, and gives the same result for the same seed. Pure: no Spark."""

from __future__ import annotations

from bench.plans import FAILED, Change, scenario_plan
from bench.search import anneal
from rebalancer.planning.schedule import CostModel, lower_bound, schedule

PLAN = scenario_plan(Change("S", "failure", 6, 2, 32, 2, FAILED, "node1"))
MODEL = CostModel(max_parallel_per_node=3)


def test_the_search_shortens_the_portfolio_schedule_and_is_the_same_for_the_same_seed() -> None:
    found = anneal(PLAN, MODEL, evals=300, seed=3, temperature=0.002)
    bound = lower_bound(schedule(PLAN, MODEL, "portfolio"), MODEL)
    assert bound - 1e-9 <= found["best_s"] < found["start_s"]
    assert set(found["each_alone_s"]) == {"order", "sources", "limits"}
    again = anneal(PLAN, MODEL, evals=300, seed=3, temperature=0.002)
    assert {k: v for k, v in again.items() if k != "cpu_s"} == {k: v for k, v in found.items() if k != "cpu_s"}
