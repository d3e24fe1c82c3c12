"""Every single failure of a suite cluster, scheduled without Spark: makespan / lower bound over all of them.

``rebalancer what-if --sweep nodes`` computes, in one Spark pass, each single failure's plan, makespan and bound.
This does the same for the suite's clusters without Spark, from the plans ``bench/plans.py`` rebuilds (the plans
the pipeline commits, step for step): for every node of the M, L or XL cluster of ``bench/suite.py`` (its seed,
sizes and confs), the plan of that node failing, scheduled by ``portfolio``, ``hazelcast`` and ``serial`` under the
default cost model (cap 10), with its lower bound and bound terms. Plans are cached under ``.cache/sweep-plans/``
(building the XL cluster's thousand plans takes minutes; scheduling them, less).

It prints, per cluster, the distribution of ``portfolio`` / bound (min, median, 90th percentile, worst, how many over
1.03 and 1.05; a node that holds no data has no plan and is left out), the worst scenarios with their bound terms,
and whether ``portfolio`` was ever longer than ``hazelcast`` or ``serial``. ``--compare REF`` schedules every plan
with the scheduler of git commit ``REF`` too (``bench/schedule.py``'s ``load_scheduler``) and prints its
distribution beside. ``--json OUT`` writes every row. Like ``what-if``'s large sweeps, it schedules every plan with
the compiled loop (``event_loop.compile_for_every_plan``; the same schedules as the Python loop, which
``--python-loop`` keeps). ``--bytes-scale K`` multiplies every step's bytes by K first: the generated clusters move
little data (a transfer lasts 0.26 to 0.79 s at the default stream rate, against the 0.1 s every step costs besides),
and the scale shows how the distribution moves as transfers outweigh that fixed cost (docs/PLANNING.md).

Run from the repository root::

    .venv/bin/python bench/sweep.py --sizes M,L,XL --compare 71a1b69 --json bench/results/sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.ipc as ipc  # noqa: E402

from bench.plans import FAILED, HAZELCAST_PARTITION_BYTES, SEED, Change, scenario_plan  # noqa: E402
from bench.schedule import default_policy, load_scheduler  # noqa: E402
from rebalancer.planning import event_loop  # noqa: E402
from rebalancer.planning import schedule as scheduler  # noqa: E402

#: The suite's clusters (bench/suite.py): nodes, groups, partitions per group, backups, partition bytes.
CLUSTERS: dict[str, tuple[int, int, int, int, int]] = {
    "M": (10, 1, 20_000, 1, HAZELCAST_PARTITION_BYTES),
    "L": (100, 64, 1_024, 2, 209_715_200),
    "XL": (1_000, 256, 1_024, 2, 209_715_200),
}
CACHE = REPO / ".cache" / "sweep-plans"


@dataclass(frozen=True)
class Row:
    """One single failure: its plan's size and every makespan (seconds)."""

    size: str
    node: str
    steps: int
    portfolio_s: float
    hazelcast_s: float
    serial_s: float
    bound_s: float
    receive_s: float
    send_s: float
    slots_s: float
    chain_s: float
    scheduled_cpu_s: float
    before_s: float | None = None
    before_bound_s: float | None = None

    @property
    def ratio(self) -> float:
        return self.portfolio_s / self.bound_s if self.bound_s > 0 else 1.0


def failure_plan(size: str, node: int) -> pa.Table:
    """The plan of ``node{node}`` failing in cluster ``size`` (cached on disk)."""
    nodes, groups, partitions, backups, nbytes = CLUSTERS[size]
    path = CACHE / f"{size}-{SEED}-node{node}.arrow"
    if path.is_file():
        with ipc.open_file(path) as f:
            return f.read_all()
    plan = scenario_plan(Change(size, f"failure of node{node}", nodes, groups, partitions, backups, FAILED,
                                f"node{node}", nbytes))
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with ipc.new_file(tmp, plan.schema) as f:
        f.write_table(plan)
    tmp.replace(path)
    return plan


def scaled(plan: pa.Table, factor: float) -> pa.Table:
    """``plan`` with every step's bytes multiplied by ``factor`` (rounded down to whole bytes)."""
    if factor == 1:
        return plan
    column = plan.schema.get_field_index("bytes")
    more = pc.multiply(plan.column(column).cast(pa.float64()), factor)
    return plan.set_column(column, plan.schema.field(column), pc.floor(more).cast(plan.schema.field(column).type))


def measure(size: str, node: int, before: ModuleType | None, cap: int, bytes_scale: float = 1.0) -> Row:
    plan = scaled(failure_plan(size, node), bytes_scale)
    model = scheduler.CostModel(max_parallel_per_node=cap)
    cpu = time.process_time()
    portfolio = scheduler.schedule(plan, model, "portfolio")
    cpu = time.process_time() - cpu
    terms = scheduler.lower_bound_terms(portfolio, model)
    extra: dict[str, Any] = {}
    if before is not None:
        old_model = before.CostModel(max_parallel_per_node=cap)
        old = before.schedule(plan, old_model, default_policy(before))
        extra = {"before_s": before.makespan(old), "before_bound_s": before.lower_bound(old, old_model)}
    return Row(
        size=size, node=f"node{node}", steps=plan.num_rows, portfolio_s=scheduler.makespan(portfolio),
        hazelcast_s=scheduler.makespan(scheduler.schedule(plan, model, "hazelcast")),
        serial_s=scheduler.makespan(scheduler.schedule(plan, model, "serial")), bound_s=terms.value,
        receive_s=terms.receive_s, send_s=terms.send_s, slots_s=terms.slots_s, chain_s=terms.chain_s,
        scheduled_cpu_s=cpu, **extra,
    )


def distribution(ratios: list[float]) -> dict[str, float]:
    """Min, median, 90th percentile, worst and the counts over 1.03 and 1.05 of makespan / bound."""
    values = np.asarray(ratios, dtype=np.float64)
    return {
        "scenarios": len(values), "min": float(values.min()), "median": float(statistics.median(values)),
        "p90": float(np.percentile(values, 90)), "worst": float(values.max()),
        "over_1_03": int((values > 1.03).sum()), "over_1_05": int((values > 1.05).sum()),
    }


def describe(name: str, d: dict[str, float]) -> str:
    return (f"{name}: {d['scenarios']} scenarios, min {d['min']:.3f}, median {d['median']:.3f}, p90 {d['p90']:.3f}, "
            f"worst {d['worst']:.3f}; {d['over_1_03']} over 1.03, {d['over_1_05']} over 1.05")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="M,L", help="comma-separated clusters: M, L, XL")
    parser.add_argument("--cap", type=int, default=10)
    parser.add_argument("--nodes", help="only these node numbers (comma-separated), e.g. to look at one failure")
    parser.add_argument("--compare", metavar="REF", help="also schedule with the scheduler of this git commit")
    parser.add_argument("--json", metavar="OUT", help="write the rows and the distributions to this file")
    parser.add_argument("--python-loop", action="store_true", help="schedule plans under 20,000 steps as Python")
    parser.add_argument("--bytes-scale", type=float, default=1.0, help="multiply every step's bytes by this first")
    args = parser.parse_args()
    if not args.python_loop:
        event_loop.compile_for_every_plan()
    before = load_scheduler(args.compare) if args.compare else None
    began = time.time()
    rows: list[Row] = []
    summary: dict[str, Any] = {}
    for size in args.sizes.split(","):
        count = CLUSTERS[size][0]
        nodes = [int(n) for n in args.nodes.split(",")] if args.nodes else range(count)
        block = []
        for k in nodes:
            row = measure(size, k, before, args.cap, args.bytes_scale)
            block.append(row)
            print(f"  {size} node{k}: {row.steps} steps, portfolio {row.portfolio_s:.2f} s, bound {row.bound_s:.2f} s "
                  f"({row.ratio:.3f})" + (f", before {row.before_s:.2f} s ({row.before_s / row.before_bound_s:.3f})"
                                          if row.before_s is not None and row.before_bound_s else ""),
                  file=sys.stderr, flush=True)
        rows += block
        empty = [r for r in block if r.steps == 0]  # a node that held no data: no plan, no ratio
        block = [r for r in block if r.steps > 0]
        if empty:
            print(f"{size}: {len(empty)} scenarios without steps left out")
        after = distribution([r.ratio for r in block])
        entry: dict[str, Any] = {"after": after}
        print(describe(f"{size} portfolio / bound", after))
        if before is not None:
            entry["before"] = distribution([r.before_s / r.before_bound_s for r in block
                                            if r.before_s is not None and r.before_bound_s])
            print(describe(f"{size} before: portfolio / bound", entry["before"]))
        longer = [r.node for r in block if r.portfolio_s > min(r.hazelcast_s, r.serial_s) + 1e-9]
        entry["longer_than_a_baseline"] = longer
        print(f"{size}: portfolio longer than hazelcast or serial in {len(longer)} scenarios {longer[:10]}")
        for r in sorted(block, key=lambda r: -r.ratio)[:5]:
            print(f"  worst {r.node}: {r.steps} steps, {r.portfolio_s:.3f} s against {r.bound_s:.3f} s "
                  f"(receive {r.receive_s:.3f}, send {r.send_s:.3f}, slots {r.slots_s:.3f}, chain {r.chain_s:.3f}); "
                  f"hazelcast {r.hazelcast_s:.3f} s")
        summary[size] = entry
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    facts = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "commit": commit, "command": " ".join(["bench/sweep.py", *sys.argv[1:]]), "compare": args.compare,
        "cap": args.cap, "bytes_scale": args.bytes_scale, "seconds": round(time.time() - began, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
    print(f"{facts['date']}, {facts['seconds']} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({**facts, "summary": summary, "rows": [asdict(r) for r in rows]},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
