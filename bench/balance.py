"""Benchmark: evenness, copies moved per change and ranking time of rendezvous, ignite and balanced (no Spark).

Scenarios are those of ``bench/suite.py`` (every node on its own host, capacity 1.0, no constraints):

  S    3 nodes, 1 group x 3 partitions, 1 backup
  M    10 nodes, 1 x 20,000, 1 backup
  L    100 nodes, 64 x 1,024, 2 backups
  XL   1,000 nodes, 256 x 1,024, 2 backups
  XXL  1,000 nodes, 912 x 1,024, 2 backups

each with one failure (``node{N // 2}`` leaves) and one join (``node{N}`` joins). Affinities: ``rendezvous`` and
``ignite`` (``rebalancer.client.affinity.assign_indexes``, one call per group, as the Spark stage computes every
group), ``balanced`` (spread: all groups balanced together) and ``balanced-collocate`` (equal groups share one
placement, as Ignite).

Figures:
- evenness of the placement after the failure (as docs/BENCHMARKS.md reports it), and the worst of the three
  placements (before, after the failure, after the join): replicas and primaries per node, max / mean / min;
- copies moved: copies on a node that did not hold that partition before. Minimum for a failure = the copies the
  failed node held; for a join = ceil(replicas / nodes after the join), the joiner's fair share;
- ranking time: the ideal assignment of the whole scenario before the change, in this process (NumPy, one core),
  median and minimum of ``--runs`` runs after a warm-up, the affinities' runs interleaved (the minimum is the
  figure least disturbed by other processes on a shared machine); for ``balanced`` also the median time of the
  placement after the failure continuing from the one before (what the exchange computes).
- ``balanced`` after a change continues from the placement before it (docs/AFFINITY.md step 9), as the exchange
  does; the others are stateless.

Writes ``bench/results/balance.json``, prints a Markdown table and draws ``docs/images/balance-affinities.png``.
Run from the repository root: ``.venv/bin/python bench/balance.py`` (``--only S,M,L`` for a subset,
``--from-results bench/results/balance.json`` to redraw the table and plot without measuring).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
try:  # running from a checkout without `pip install -e .`
    import rebalancer  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from rebalancer.affinity.balanced import PreviousPlacement, assign_balanced  # noqa: E402
from rebalancer.affinity.nodeset import NodeSet  # noqa: E402
from rebalancer.client.affinity import assign_indexes  # noqa: E402
from rebalancer.groups import GroupSettings  # noqa: E402

Matrices = dict[str, np.ndarray]
AFFINITIES = ("rendezvous", "ignite", "balanced", "balanced-collocate")
SEED = 20261121


@dataclass(frozen=True)
class Scenario:
    """A benchmark cluster: ``nodes`` servers and ``groups`` equal groups."""

    name: str
    nodes: int
    groups: int
    partitions: int
    backups: int

    @property
    def replicas(self) -> int:
        """Replicas of the whole scenario (every group PARTITIONED, no filter)."""
        return self.groups * self.partitions * min(self.backups + 1, self.nodes)


SCENARIOS = (
    Scenario("S", 3, 1, 3, 1),
    Scenario("M", 10, 1, 20_000, 1),
    Scenario("L", 100, 64, 1_024, 2),
    Scenario("XL", 1_000, 256, 1_024, 2),
    Scenario("XXL", 1_000, 912, 1_024, 2),
)


def node_set(ids: list[str]) -> NodeSet:
    """Nodes with their own hosts, capacity 1.0 and a runtime UUID drawn from the id (ignite breaks ties by it)."""
    uuids = [str(uuid.UUID(int=random.Random(f"{SEED}:{i}").getrandbits(128), version=4)) for i in ids]
    return NodeSet.of(ids, node_uuids=uuids, hosts=[f"host-{i}" for i in ids])


def place(affinity: str, s: Scenario, nodes: NodeSet, previous: PreviousPlacement | None = None) -> Matrices:
    """The ideal assignment of every group of ``s`` on ``nodes``; ``balanced`` continues from ``previous`` (the
    placement before the change) as the exchange does."""
    names = [f"group{g}" for g in range(s.groups)]
    if affinity.startswith("balanced"):
        groups = [GroupSettings(name, s.partitions, s.backups, affinity="balanced") for name in names]
        return assign_balanced(groups, nodes, spread=affinity == "balanced", previous=previous)
    pids = np.arange(s.partitions)
    return {name: assign_indexes(pids, nodes, GroupSettings(name, s.partitions, s.backups, affinity=affinity))
            for name in names}


def evenness(matrices: Matrices, n: int) -> dict[str, float]:
    """Replicas and primaries per node: max, mean, min and max / mean."""
    replicas = np.zeros(n, dtype=np.int64)
    primaries = np.zeros(n, dtype=np.int64)
    for m in matrices.values():
        replicas += np.bincount(m[m >= 0], minlength=n)
        primaries += np.bincount(m[:, 0], minlength=n)
    out: dict[str, float] = {}
    for name, counts in (("replicas", replicas), ("primaries", primaries)):
        mean = float(counts.mean())
        out |= {f"{name}_max": int(counts.max()), f"{name}_mean": mean, f"{name}_min": int(counts.min()),
                f"{name}_ratio": float(counts.max()) / mean}
    return out


def moved(before: Matrices, before_nodes: NodeSet, after: Matrices, after_nodes: NodeSet) -> int:
    """Copies in ``after`` on a node that held no copy of that partition in ``before``."""
    index = {node_id: i for i, node_id in enumerate(before_nodes.node_ids)}
    to_before = np.array([index.get(i, -2) for i in after_nodes.node_ids] + [-3], dtype=np.int64)  # -1 -> -3
    total = 0
    for name, a in before.items():
        c = to_before[after[name]]
        new = (c[:, :, None] != a[:, None, :]).all(axis=2) & (after[name] >= 0)
        total += int(new.sum())
    return total


def timed(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, tuple[float, float]]:
    """(median, minimum) seconds of ``runs`` calls of each function after one warm-up call, calls interleaved so
    that load from other processes hits every function alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(runs):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def measure(s: Scenario, runs: int) -> list[dict[str, Any]]:
    """Every affinity on scenario ``s``: evenness, movement, time."""
    ids = [f"node{i}" for i in range(s.nodes)]
    base = node_set(ids)
    failed_id = f"node{s.nodes // 2}"
    failed = node_set([i for i in ids if i != failed_id])
    joined = node_set(ids + [f"node{s.nodes}"])
    seconds = timed({a: partial(place, a, s, base) for a in AFFINITIES}, runs)
    # what the exchange runs after the failure: balanced continuing from the placement before it
    placed = {a: place(a, s, base) for a in AFFINITIES if a.startswith("balanced")}
    continued = timed({a: partial(place, a, s, failed, PreviousPlacement.of(m, base)) for a, m in placed.items()},
                      runs)
    rows = []
    for affinity in AFFINITIES:
        before = place(affinity, s, base)
        previous = PreviousPlacement.of(before, base)
        after_failure = place(affinity, s, failed, previous)
        after_join = place(affinity, s, joined, previous)
        held = sum(int((m == ids.index(failed_id)).sum()) for m in before.values())
        fair = math.ceil(s.replicas / (s.nodes + 1))
        states = [evenness(before, s.nodes), evenness(after_failure, s.nodes - 1), evenness(after_join, s.nodes + 1)]
        worst = {k: max(e[k] for e in states) for k in ("replicas_ratio", "primaries_ratio")}
        worst["replicas_min"] = min(e["replicas_min"] for e in states)
        rows.append({
            "scenario": s.name, "affinity": affinity, "nodes": s.nodes, "groups": s.groups,
            "partitions": s.partitions, "backups": s.backups, "replicas": s.replicas,
            "after_failure": states[1], "before": states[0], "after_join": states[2], "worst": worst,
            "failure_moved": moved(before, base, after_failure, failed), "failure_minimum": held,
            "join_moved": moved(before, base, after_join, joined), "join_minimum": fair,
            "seconds": seconds[affinity][0], "seconds_min": seconds[affinity][1],
            "continue_seconds": continued[affinity][0] if affinity in continued else None,
        })
        print(f"  {s.name} {affinity}: {rows[-1]['failure_moved']}/{held} {rows[-1]['join_moved']}/{fair} "
              f"{seconds[affinity][0]:.2f}s", flush=True)
    return rows


def pct(moved_: int, minimum: int) -> str:
    return f"{moved_:,} / {minimum:,} ({100 * (moved_ - minimum) / minimum:+.1f}%)" if minimum else f"{moved_:,} / 0"


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/AFFINITY.md."""
    lines = [
        "| scenario | affinity | replicas per node after the failure, max / mean / min (max/mean) | primaries, "
        "max / mean / min (max/mean) | worst max/mean of before, failure, join: replicas / primaries | "
        "failure: copies moved / failed node's copies | join: copies moved / fair share | ranking time, median (min) | "
        "after the failure, continuing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, w = r["after_failure"], r["worst"]
        lines.append(
            f"| {r['scenario']} | {r['affinity']} | {e['replicas_max']:,} / {e['replicas_mean']:,.1f} / "
            f"{e['replicas_min']:,} ({e['replicas_ratio']:.3f}) | {e['primaries_max']:,} / {e['primaries_mean']:,.1f}"
            f" / {e['primaries_min']:,} ({e['primaries_ratio']:.3f}) | {w['replicas_ratio']:.3f} / "
            f"{w['primaries_ratio']:.3f} | {pct(r['failure_moved'], r['failure_minimum'])} | "
            f"{pct(r['join_moved'], r['join_minimum'])} | {r['seconds']:.2f} s ({r['seconds_min']:.2f} s) | "
            + (f"{r['continue_seconds']:.2f} s |" if r.get("continue_seconds") is not None else "- |")
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Two panels: worst replicas max/mean per scenario, and copies moved over the minimum per change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(AFFINITIES)
    x = np.arange(len(scenarios))
    panels = [
        ("replicas per node, worst max / mean", lambda r: r["worst"]["replicas_ratio"], 1.05),
        ("failure: copies moved / failed node's copies", lambda r: r["failure_moved"] / r["failure_minimum"], 1.05),
        ("join: copies moved / joiner's fair share", lambda r: r["join_moved"] / r["join_minimum"], 1.10),
    ]
    for ax, (title, value, target) in zip(axes, panels, strict=True):
        for k, affinity in enumerate(AFFINITIES):
            ys = [value(next(r for r in rows if r["scenario"] == sc and r["affinity"] == affinity))
                  for sc in scenarios]
            ax.bar(x + (k - (len(AFFINITIES) - 1) / 2) * width, ys, width, label=affinity)
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.2f}")
        ax.set_xticks(x, scenarios)
        ax.set_ylim(0, None)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", help="comma-separated scenarios (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per affinity (median)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/balance.json")
    parser.add_argument("--image", type=Path, default=REPO / "docs/images/balance-affinities.png")
    parser.add_argument("--from-results", type=Path, help="print the table and draw the plot of a results file")
    parser.add_argument("--tiny", action="store_true", help="S and M only, one timed run (trying it out)")
    args = parser.parse_args()
    if args.tiny:
        args.only, args.runs = args.only or "S,M", 1
    if args.from_results:
        saved = json.loads(args.from_results.read_text())["rows"]
        print(table(saved))
        plot(saved, args.image)
        return
    wanted = set(args.only.split(",")) if args.only else {s.name for s in SCENARIOS}
    rows: list[dict[str, Any]] = []
    for s in SCENARIOS:
        if s.name in wanted:
            print(f"{s.name}: {s.nodes:,} nodes, {s.groups:,} x {s.partitions:,}, {s.backups} backups", flush=True)
            rows.extend(measure(s, args.runs))
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}, load average {os.getloadavg()[0]:.1f}",
        "versions": f"Python {platform.python_version()}, numpy {np.__version__}",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows))
    plot(rows, args.image)


if __name__ == "__main__":
    main()
