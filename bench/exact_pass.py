"""What ``portfolio``'s exact pass (CP-SAT from the greedy schedule) buys and costs, by plan size: the measurements
behind ``rebalancer.planning.schedule.SOLVE_UP_TO_STEPS`` and ``SOLVER_DETERMINISTIC_TIME``.

For small generated clusters (``bench/plans.py``'s scenario plans: 4-12 nodes, a failure, a join, a drain or a
graceful leave, 1-2 backups) and caps 1-5 and 10, each plan is scheduled once with the solver limited to plans of
``--up-to`` steps. It prints, per bucket of plan size: how many plans the solver ran on (it does not where the greedy
schedule meets the lower bound, or where urgent and other partitions mix), how many it shortened and by how much,
and the wall seconds it took (median and worst). Plans larger than the current limit are solved too (``--up-to``),
to show what a higher limit would cost.

Run from the repository root: ``.venv/bin/python bench/exact_pass.py [--up-to 400] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.plans import DRAINING, FAILED, JOINED, LEFT, Change, scenario_plan  # noqa: E402
from rebalancer.planning import schedule as scheduler  # noqa: E402

BUCKETS = ((1, 50), (51, 100), (101, 200), (201, 400), (401, 800))


def plans() -> list[tuple[str, object]]:
    """The measured plans: (label, plan), in a fixed order."""
    out = []
    for nodes in (4, 6, 8, 12):
        for partitions in (16, 64, 256, 512):
            for backups in (1, 2):
                for event in (FAILED, JOINED, DRAINING, LEFT):
                    node = f"node{nodes - 1}" if event == JOINED else "node1"
                    change = Change("small", event.lower(), nodes, 1, partitions, backups, event, node)
                    out.append((f"{nodes}n {partitions}p b{backups} {event}", scenario_plan(change, seed=7)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--up-to", type=int, default=800, help="solve plans of at most this many steps")
    parser.add_argument("--deterministic-time", type=float, default=scheduler.SOLVER_DETERMINISTIC_TIME,
                        help="CP-SAT's deterministic time limit per plan")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    scheduler.SOLVE_UP_TO_STEPS = args.up_to
    scheduler.SOLVER_DETERMINISTIC_TIME = args.deterministic_time
    rows = []
    began = time.time()
    for label, plan in plans():
        if not 0 < plan.num_rows <= args.up_to:
            continue
        for cap in (1, 2, 3, 5, 10):
            _, stats = scheduler.schedule_with_stats(plan, scheduler.CostModel(max_parallel_per_node=cap))
            rows.append({"plan": label, "steps": plan.num_rows, "cap": cap, "greedy_s": stats.greedy_makespan_s,
                         "makespan_s": stats.makespan_s, "chosen": stats.chosen, "status": stats.solver_status,
                         "solver_s": stats.solver_seconds})
    print("| steps | plans | solver ran | shortened | median gain | best gain | solver s, median | worst |")
    print("|---|---|---|---|---|---|---|---|")
    for lo, hi in BUCKETS:
        block = [r for r in rows if lo <= r["steps"] <= hi]
        if not block:
            continue
        ran = [r for r in block if r["status"]]
        won = [r for r in ran if r["chosen"] == "solver"]
        gains = [1 - r["makespan_s"] / r["greedy_s"] for r in won]
        secs = [r["solver_s"] for r in ran]
        print(f"| {lo}-{hi} | {len(block)} | {len(ran)} | {len(won)} | "
              f"{statistics.median(gains) * 100 if gains else 0:.1f}% | {max(gains, default=0) * 100:.1f}% | "
              f"{statistics.median(secs) if secs else 0:.2f} | {max(secs, default=0):.2f} |")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, {time.strftime('%Y-%m-%d', time.gmtime(began))}, up to {args.up_to} steps, "
          f"deterministic time {args.deterministic_time}, {time.time() - began:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({"commit": commit, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
