"""Benchmark of the migration scheduler alone: makespans and scheduling time on the suite's plans, without Spark.

For every change of ``bench/plans.py`` (the plans ``bench/suite.py``'s scenarios commit, rebuilt in pure Python,
plus ``bench/migrations.py``'s graceful scale-down) and every per-node cap, the plan is scheduled by ``portfolio``,
``hazelcast`` and ``serial`` and its lower bound computed (``rebalancer.planning.schedule``, default cost model
otherwise). A synthetic plan of ``--synthetic`` steps (1,000,000 by default, on 1,000 nodes) is scheduled at the
default cap to time the scheduler. Times are of this process: wall seconds and CPU seconds (the CPU time is what
to read on a shared machine).

``--compare REF`` also schedules every plan with the scheduler of git commit ``REF`` (its default policy and its own
lower bound), to print the figures before and after a change side by side. The scheduler of ``REF`` is its whole
``rebalancer/planning`` package (the event loop too), copied under ``.cache/bench-schedulers/`` as a package of its
own, where numba caches its compiled loop. ``--repeat N`` schedules each plan N times with ``portfolio`` (alternating
with ``REF``'s when comparing: the machine's load then weighs on both alike) and reports the median CPU seconds.

Run from the repository root: ``.venv/bin/python bench/schedule.py [--compare REF] [--json OUT]``; it prints a
Markdown table. ``--synthetic 0`` skips the synthetic plan; ``--only M,XL`` keeps some scenarios.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402

from bench.plans import CHANGES, Change, scenario_plan, synthetic_plan  # noqa: E402
from rebalancer.planning import event_loop  # noqa: E402
from rebalancer.planning import schedule as scheduler  # noqa: E402

CAPS = (1, 2, 5, 10, 20)
SYNTHETIC_NODES = 1_000


@dataclass(frozen=True)
class Row:
    """One plan at one cap: makespans in seconds, scheduling times of ``portfolio`` (wall and CPU)."""

    scenario: str
    change: str
    steps: int
    cap: int
    portfolio_s: float
    hazelcast_s: float
    serial_s: float
    bound_s: float
    portfolio_wall_s: float
    portfolio_cpu_s: float
    before_portfolio_s: float | None = None
    before_bound_s: float | None = None
    before_wall_s: float | None = None
    before_cpu_s: float | None = None
    runs: int = 1

    @property
    def over_bound(self) -> float:
        return self.portfolio_s / self.bound_s - 1.0 if self.bound_s > 0 else 0.0


def timed(call: Callable[[], pa.Table]) -> tuple[pa.Table, float, float]:
    """``call()`` with its wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = call()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def load_scheduler(ref: str) -> ModuleType:
    """The scheduler module of git commit ``ref`` with the event loop of that commit: its ``rebalancer/planning``
    copied to ``.cache/bench-schedulers/planning_<commit>`` and imported as that package (its imports of
    ``rebalancer.planning`` renamed), so that numba caches its compiled loop there, once per commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    package = f"planning_{commit}"
    parent = REPO / ".cache" / "bench-schedulers"
    target = parent / package
    if not (target / "schedule.py").is_file():
        listing = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{commit}:rebalancer/planning"],
                                 check=True, capture_output=True, text=True).stdout.split()
        target.mkdir(parents=True, exist_ok=True)
        for name in (n for n in listing if n.endswith(".py")):
            source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:rebalancer/planning/{name}"],
                                    check=True, capture_output=True, text=True).stdout
            (target / name).write_text(source.replace("rebalancer.planning", package))
    sys.path.insert(0, str(parent))
    if (target / "event_loop.py").is_file():  # before 6785560 the loop was part of schedule.py
        importlib.import_module(f"{package}.event_loop").compile_ahead()
    return importlib.import_module(f"{package}.schedule")


def default_policy(scheduler_module: ModuleType) -> str:
    """The policy a scheduler module schedules committed plans with: the first of its ``POLICIES`` (``portfolio``;
    commits before the policy had that name call it ``ours``)."""
    return str(scheduler_module.POLICIES[0])


def measure(
    name: tuple[str, str], plan: pa.Table, caps: tuple[int, ...], before: ModuleType | None, repeat: int = 1
) -> list[Row]:
    """Every policy and the bound of ``plan`` at each cap (serial does not depend on the cap: run once); ``portfolio``
    (and ``before``'s default policy, alternating) ``repeat`` times, with the median CPU seconds."""
    rows = []
    serial_s = scheduler.makespan(scheduler.schedule(plan, scheduler.CostModel(), "serial"))
    for cap in caps:
        model = scheduler.CostModel(max_parallel_per_node=cap)
        old_model = before.CostModel(max_parallel_per_node=cap) if before is not None else None
        times: list[tuple[float, float]] = []
        old_times: list[tuple[float, float]] = []
        for _ in range(repeat):
            portfolio, wall, cpu = timed(lambda model=model: scheduler.schedule(plan, model, "portfolio"))
            times.append((wall, cpu))
            if before is not None:
                old, old_wall, old_cpu = timed(lambda old_model=old_model: before.schedule(
                    plan, old_model, default_policy(before)))
                old_times.append((old_wall, old_cpu))
        extra: dict[str, Any] = {}
        if before is not None:
            extra = {
                "before_portfolio_s": before.makespan(old),
                "before_bound_s": before.lower_bound(old, old_model),
                "before_wall_s": statistics.median(w for w, _ in old_times),
                "before_cpu_s": statistics.median(c for _, c in old_times),
            }
        wall, cpu = statistics.median(w for w, _ in times), statistics.median(c for _, c in times)
        rows.append(Row(
            scenario=name[0], change=name[1], steps=plan.num_rows, cap=cap,
            portfolio_s=scheduler.makespan(portfolio),
            hazelcast_s=scheduler.makespan(scheduler.schedule(plan, model, "hazelcast")),
            serial_s=serial_s, bound_s=scheduler.lower_bound(portfolio, model), portfolio_wall_s=wall,
            portfolio_cpu_s=cpu,
            runs=repeat, **extra,
        ))
        versus = f" (before: {extra['before_cpu_s']:.2f} s)" if extra else ""
        print(f"  {name[0]} {name[1]} cap {cap}: portfolio {rows[-1].portfolio_s:.2f} s, "
              f"bound {rows[-1].bound_s:.2f} s ({rows[-1].over_bound:+.1%}), scheduled in {cpu:.2f} s CPU{versus}",
              file=sys.stderr, flush=True)
    return rows


def seconds(value: float) -> str:
    """Makespans as the benchmark pages print them: ``3h02m`` from an hour, ``1m51s`` from a minute, else
    ``58.1 s``."""
    if value >= 3600:
        h, m = divmod(round(value / 60), 60)
        return f"{h}h{m:02d}m"
    if value >= 60:
        m, s = divmod(round(value), 60)
        return f"{m}m{s:02d}s"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def markdown(rows: list[Row], with_before: bool) -> str:
    head = ["scenario", "change", "steps", "cap"]
    if with_before:
        head += ["before: portfolio", "before: bound", "before: over", "before: scheduled in (CPU)"]
    head += ["portfolio", "hazelcast", "serial", "bound", "portfolio over bound", "portfolio <= baselines",
             "portfolio scheduled in (CPU)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.scenario, r.change, f"{r.steps:,}", str(r.cap)]
        if with_before and r.before_portfolio_s is not None and r.before_bound_s is not None:
            cells += [seconds(r.before_portfolio_s), seconds(r.before_bound_s),
                      f"{r.before_portfolio_s / r.before_bound_s - 1:.1%}" if r.before_bound_s else "-",
                      f"{r.before_cpu_s:.2f} s" if r.before_cpu_s is not None else "-"]
        elif with_before:
            cells += ["-", "-", "-", "-"]
        fine = r.portfolio_s <= r.hazelcast_s + 1e-9 and r.portfolio_s <= r.serial_s + 1e-9
        cells += [seconds(r.portfolio_s), seconds(r.hazelcast_s), seconds(r.serial_s), seconds(r.bound_s),
                  f"{r.over_bound:.1%}", "yes" if fine else "**no**", f"{r.portfolio_cpu_s:.2f} s"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated scenarios (S, M, L, XL, XXL) or scenario/change keys")
    parser.add_argument("--caps", default=",".join(map(str, CAPS)), help="comma-separated per-node caps")
    parser.add_argument("--synthetic", type=int, default=1_000_000, help="steps of the synthetic plan (0: none)")
    parser.add_argument("--compare", metavar="REF", help="also schedule with the scheduler of this git commit")
    parser.add_argument("--repeat", type=int, default=1, help="schedule each plan this many times with portfolio "
                        "(alternating with --compare's), reporting the median CPU seconds")
    parser.add_argument("--json", metavar="OUT", help="write the rows and the run's facts to this file")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    caps = tuple(int(c) for c in args.caps.split(","))
    only = set(args.only.split(",")) if args.only else None
    changes: list[Change] = [c for c in CHANGES if only is None or c.scenario in only or c.key in only]
    before = load_scheduler(args.compare) if args.compare else None
    event_loop.compile_ahead()  # (or load it from numba's cache) before anything is timed
    began = time.time()
    rows: list[Row] = []
    for change in changes:
        plan = scenario_plan(change)
        rows += measure((change.scenario, change.change), plan, caps, before, args.repeat)
    if args.synthetic:
        plan = synthetic_plan(args.synthetic, SYNTHETIC_NODES)
        rows += measure(("synthetic", f"{SYNTHETIC_NODES:,} nodes"), plan, (10,), before, args.repeat)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    facts = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "commit": commit + (" plus uncommitted changes" if dirty else ""),
        "compare": args.compare,
        "repeat": args.repeat,
        "command": " ".join(["bench/schedule.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "cost_model": asdict(scheduler.CostModel()),
        "seconds": round(time.time() - began, 1),
    }
    print(markdown(rows, before is not None))
    print(f"\n{facts['date']}, commit {facts['commit']}, {facts['seconds']} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({**facts, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
