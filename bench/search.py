"""How far a search over the greedy schedule's choices gets on one plan: the experiment behind docs/PLANNING.md's
"What a search finds" (issue 41, the L failure of node85).

``portfolio`` is the shortest of a few greedy list schedules, each fixed by three choices: the order steps are
offered slots in, every COPY's source, and every node direction's admission limit. This anneals all three at once
on one plan, with the event loop itself as the judge: each move changes one COPY's source (to another member of its
pool), moves one step to another place in the order, or sets one direction's limit to a whole count of the
slowest stream; the new schedule is simulated in full and kept by the Metropolis rule (temperature a share of the
makespan, cooled linearly to nothing). It starts from ``portfolio``'s shortest candidate, its sources as that
schedule chose them. The same seed gives the same result on every machine.

Optionally (``--solver DT``) CP-SAT's best schedule within DT units of deterministic time, from ``portfolio``'s
(:func:`rebalancer.planning.schedule.optimum`; its model keeps every transfer at its stream rate).

The plan is a single failure of a suite cluster (``bench/sweep.py``'s cache), or its COPYs into some nodes only
(``--receivers``): a smaller plan with the same structure, searched faster. Not a scheduler: a probe of what the
scheduler's own family of schedules can reach, which reads the scheduler's private functions.

Run from the repository root::

    .venv/bin/python bench/search.py --size L --node 85 --receivers node15,node30,node59 --evals 20000 --seed 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from bench.sweep import failure_plan  # noqa: E402
from rebalancer.planning import schedule as scheduler  # noqa: E402

LIMIT_STREAMS = (3, 4, 5, 6, 7, 8)  # a direction admits at most this many of the slowest stream


def anneal(plan: pa.Table, model: scheduler.CostModel, evals: int, seed: int, temperature: float) -> dict:
    """The shortest schedule the annealing met, with what it took (module docstring)."""
    p = scheduler._decode(plan, scheduler.PLAN_INPUT_SCHEMA.names, model)
    if not (p.action == scheduler.A_COPY).any():
        raise ValueError("the plan has no COPY: nothing to search over")
    solo = scheduler._solo_durations(p, model)
    runs = [(scheduler._simulate(p, model, c, solo), c) for c in scheduler._candidates(p, model, solo)]
    start, cand = min(runs, key=lambda run: run[0].makespan)
    nn, slowest = len(p.nodes), float(p.stream[p.action == scheduler.A_COPY].min())
    pools = [p.pool_node[p.pool_start[i] : p.pool_start[i + 1]] for i in range(p.n)]
    one_each = np.arange(p.n + 1, dtype=np.int64)

    def simulate(order: np.ndarray, source: np.ndarray, limits: np.ndarray) -> scheduler._Timetable:
        rank = np.empty(p.n, dtype=np.int64)
        rank[order] = np.arange(p.n, dtype=np.int64)
        tried = dataclasses.replace(cand, rank=rank, pool_node=source, pool_start=one_each, limits=limits)
        return scheduler._simulate(p, model, tried, solo)

    def makespan(order: np.ndarray, source: np.ndarray, limits: np.ndarray) -> float:
        return simulate(order, source, limits).makespan

    order = np.argsort(cand.rank, kind="stable")
    source = start.chosen.astype(np.int64)
    limits = (cand.limits if cand.limits is not None else np.full(2 * nn, model.node_bandwidth_bytes_per_s)).copy()
    current = best = makespan(order, source, limits)
    first = best_state = (order, source, limits)
    rng = np.random.default_rng(seed)
    clock = time.process_time()
    for k in range(evals):
        heat = temperature * (1.0 - k / evals) * current
        new_order, new_source, new_limits = order, source, limits
        move = int(rng.integers(3))
        if move == 0:
            i = int(rng.integers(p.n))
            new_source = source.copy()
            new_source[i] = int(rng.choice(pools[i]))
        elif move == 1:
            a, b = (int(x) for x in rng.integers(p.n, size=2))
            new_order = np.insert(np.delete(order, a), b, order[a])
        else:
            new_limits = limits.copy()
            new_limits[int(rng.integers(2 * nn))] = (int(rng.choice(LIMIT_STREAMS)) - 0.5) * slowest
        value = makespan(new_order, new_source, new_limits)
        if value <= current or (heat > 0 and rng.random() < math.exp(-(value - current) / heat)):
            order, source, limits, current = new_order, new_source, new_limits, value
            if value < best:
                best, best_state = value, (order, source, limits)
    order, source, limits = best_state
    # Each annealed choice alone, the starting candidate's other two kept.
    alone = {name: makespan(*(best_state[j] if j == k else first[j] for j in range(3)))
             for k, name in enumerate(("order", "sources", "limits"))}
    # Per node, how many transfers ran into it and out of it on average over the best schedule.
    run = simulate(order, source, limits)
    is_copy = p.action == scheduler.A_COPY
    moving = np.where(is_copy, run.end - run.start - model.overhead_s, 0.0) / run.makespan
    inbound = np.bincount(p.tgt[is_copy], weights=moving[is_copy], minlength=nn)
    outbound = np.bincount(source[is_copy], weights=moving[is_copy], minlength=nn)
    mean_streams = {p.nodes[v]: {"in": round(float(inbound[v]), 2), "out": round(float(outbound[v]), 2)}
                    for v in np.flatnonzero(inbound + outbound > 0)}
    pairs: dict[str, int] = {}
    for s, t in zip(source[is_copy].tolist(), p.tgt[is_copy].tolist(), strict=True):
        key = f"{p.nodes[s]}->{p.nodes[t]}"
        pairs[key] = pairs.get(key, 0) + 1
    streams = np.round(limits / slowest + 0.5, 2)
    changed = {
        p.nodes[v]: {"in_streams": float(streams[v]), "out_streams": float(streams[nn + v])}
        for v in range(nn)
        if cand.limits is None or limits[v] != cand.limits[v] or limits[nn + v] != cand.limits[nn + v]
    }
    return {
        "start": start.name, "start_s": start.makespan, "best_s": best, "evals": evals, "seed": seed,
        "temperature": temperature, "cpu_s": time.process_time() - clock, "copies_by_pair": pairs,
        "limits_changed": changed, "each_alone_s": alone, "mean_streams": mean_streams,
        "order_correlation": float(np.corrcoef(np.argsort(order), cand.rank)[0, 1]) if p.n > 1 else 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="L", help="suite cluster: M, L or XL")
    parser.add_argument("--node", type=int, default=85, help="the failed node's number")
    parser.add_argument("--receivers", help="keep only the COPYs into these nodes (comma-separated)")
    parser.add_argument("--evals", type=int, default=20_000, help="simulations of the annealing")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.002, help="start temperature, a share of the makespan")
    parser.add_argument("--solver", type=float, metavar="DT", help="also CP-SAT for DT units of deterministic time")
    parser.add_argument("--json", metavar="OUT", help="write the result to this file")
    args = parser.parse_args()

    plan = failure_plan(args.size, args.node)
    if args.receivers:
        plan = plan.filter(pc.is_in(plan.column("target_node"), pa.array(args.receivers.split(","))))
    label = f"{args.size} failure of node{args.node}"
    if args.receivers:
        label += f", COPYs into {args.receivers}"
    model = scheduler.CostModel()
    portfolio = scheduler.schedule(plan, model, "portfolio")
    terms = scheduler.lower_bound_terms(portfolio, model)
    result = {
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=REPO).stdout.strip(),
        "plan": label,
        "steps": plan.num_rows, "bound_s": terms.value, "terms": dataclasses.asdict(terms),
        "portfolio_s": scheduler.makespan(portfolio),
        "search": anneal(plan, model, args.evals, args.seed, args.temperature),
    }
    if args.solver:
        found = scheduler.optimum(plan, model, max_deterministic_time=args.solver)
        result["solver"] = {"makespan_s": found.makespan_s, "status": found.status, "seconds": found.seconds,
                            "deterministic_time": found.deterministic_time}
    bound = result["bound_s"]
    print(f"{result['plan']}: {result['steps']} steps, bound {bound:.3f} s")
    print(f"  portfolio {result['portfolio_s']:.3f} s ({result['portfolio_s'] / bound:.4f})")
    search = result["search"]
    print(f"  search    {search['best_s']:.3f} s ({search['best_s'] / bound:.4f}) after {search['evals']} simulations "
          f"from {search['start']}, {search['cpu_s']:.0f} s CPU; order correlation {search['order_correlation']:.2f}")
    print("  each annealed choice alone: " + ", ".join(f"{k} {v:.3f} s" for k, v in search["each_alone_s"].items()))
    if "solver" in result:
        s = result["solver"]
        print(f"  CP-SAT    {s['makespan_s']:.3f} s ({s['makespan_s'] / bound:.4f}), {s['status']}, "
              f"{s['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
