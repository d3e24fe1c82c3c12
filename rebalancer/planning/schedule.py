"""Migration scheduler: start time, end time and wave of every step of a migration plan (SPEC 4 "Migrations").

:func:`schedule` takes the rows of a migration plan (one row per step, :data:`PLAN_INPUT_SCHEMA`) and returns the
same rows, in the same order, with the COPY source chosen and ``wave``, ``est_start_s`` and ``est_end_s`` filled in
(:data:`SCHEDULED_SCHEMA`). :func:`lower_bound` gives a makespan no schedule of the plan can beat under the cost
model (:func:`lower_bound_terms` its terms); :func:`makespan` reads a schedule's makespan. Pure NumPy and pyarrow:
no Spark.

Input rows
    A partition is ``(group_name, partition_id)``; its steps are numbered ``step`` = 1..k (no gap, no duplicate).
    ``action`` is ``COPY``, ``PROMOTE`` or ``DROP``. ``source_node`` is, for a COPY, the planner's default
    supplier; for a PROMOTE the old primary; for a DROP the node that drops its copy. ``target_node`` is the node
    receiving data (COPY) or the new primary (PROMOTE), null for a DROP. A COPY lists in ``candidates`` every node
    that may supply it (non-empty, containing ``source_node``, different from the target), moves ``bytes`` by
    ``transfer`` = ``entries`` or ``files``. ``owners`` / ``replicas`` are the partition's OWNING copies when
    planned and its target copy count. ``primary_node`` (may be null) is the partition's current primary.

Cost model (fluid, simulated event by event; parameters in :class:`CostModel`)
    * Precedence: a step can start once the previous step of its partition has ended; step 1 is ready at t = 0.
    * Slots: a step *touches* nodes: a COPY its source and its target, a PROMOTE the old and the new primary, a
      DROP its node. At any instant at most ``max_parallel_per_node`` running steps touch any node; a ready step
      starts only if every node it touches has a free slot, and holds its slots until it ends.
    * Duration: every step first spends ``overhead_s`` (holding its slots). A PROMOTE or a DROP then ends. A COPY
      then transfers ``bytes``; while it transfers its rate is
      ``min(stream, bw / n_out(source), bw / n_in(target))``, where ``stream`` is ``entry_stream_bytes_per_s``
      (``entries``: FULL rebalance by entries or HISTORICAL replay) or ``file_stream_bytes_per_s`` (``files``),
      ``bw`` is ``node_bandwidth_bytes_per_s`` (each node, each direction: full duplex) and ``n_out`` / ``n_in``
      count the transfers in their transfer phase sending from that source / receiving at that target. Rates
      change only when a transfer starts or ends, so between two events every transfer moves at a constant rate
      and the simulation is exact (up to floating point). A COPY of 0 bytes ends after its overhead.
    * Direction-aware admission (``portfolio`` only; the baselines use slots alone): a node's inbound and outbound
      directions admit COPYs separately, so a node saturated in one direction still admits work in the other. A
      COPY is *committed* to its target's inbound and its source's outbound direction from its start until its
      transfer is within ``overhead_s`` of its end at its current rate (so that a successor's overhead overlaps
      its last bytes). A direction is closed while its committed COPYs' stream rates add up to its limit, and is
      never closed with nothing committed. Each candidate of ``portfolio`` sets the limits (Policies); in
      *balanced* they apply to the nodes that both receive COPYs and may send some, in both directions: ``bw``
      where the node's bandwidth outweighs its slots (the fewest transfers that fill the link: 7 entry transfers
      at the defaults) and ``bw - slowest stream`` where its slots outweigh its bandwidth (the most that slow no
      transfer below its stream: 6); other nodes have none. PROMOTEs and DROPs need slots only.
    * Waves: ``wave`` is the dense rank (1, 2, ...) of the distinct start times rounded to 1e-9 s: wave k is the
      k-th instant at which some steps start.

Policies (:data:`POLICIES`)
    Every policy but ``serial`` is a greedy list schedule: at every event the ready steps are offered the free
    slots in a priority order and each one that fits starts.

    ``portfolio``
        The shortest of its list schedules (the first on a tie), each simulated in full; one is abandoned as soon
        as it runs past the shortest so far; then the packed pass and, on small plans, the exact pass (below), both
        on plans in one priority class only. All candidates put first the partitions SPEC 4 sends first (*urgent*:
        ``owners < replicas`` or ``owners <= 1``), so at every instant the urgent ready steps are offered the free
        slots before any other: no other step takes a slot an urgent ready step could use. In the order they run:

        1. *balanced*: priority (1) urgent first; (2) fewer ``owners``; (3) steps without a transfer (PROMOTE,
           DROP) before COPYs; (4) least *slack*; (5) ``(group_name, partition_id, step)``. A node's work is
           counted in seconds of its dominant resource: its slots (solo time over ``max_parallel_per_node``),
           its inbound or its outbound bandwidth (bytes over ``bw``), a COPY's source side shared evenly by its
           candidates. Walking each node's steps in plan order, a step's latest start there is the node's work
           before it minus the node's whole work (up to a constant); a step's slack is the least over the nodes
           it must touch, its candidates counted at the one where it is latest. Least slack first keeps the most
           loaded nodes busy from the start and interleaves each node's steps in plan order. A COPY reads from
           the open candidate with the least bound work (the work pinned to it whatever the sources, plus the
           COPYs already read from it: this balances every node's total work, and keeps a node that must also
           drop many copies, such as a leaving one, from being every partition's supplier), then the fewest
           running COPYs sending from it, then the fewest bytes assigned, then ``node_id``. Direction-aware
           admission.
        2. *filling* (plans under ``MORE_CANDIDATES_BELOW_STEPS`` steps, as 3 and 4): every direction of every
           node admits COPYs until their stream rates reach ``bw`` (7 entry transfers at the defaults, where
           *balanced* stops slot-bound nodes at 6 and does not limit the others): a receiver whose slots are also
           wanted by its own sends then fills its link. Its order is *balanced*'s but for each node's *tail*: the
           last ``FILLING_TAIL`` (30%) of the COPYs into a node, in *balanced*'s order, take the same places
           longest first (within each priority class, so urgent partitions still go first). A receiver's last
           transfers are then its short ones and end close together, instead of one large transfer running alone
           at its stream rate while the link idles.
        3. *spread*: every COPY's source fixed in advance by the linear program of
           :mod:`rebalancer.planning.sources` (each pool's COPYs split over its members so that the busiest node's
           slot and send time is least), admission as *filling*, *balanced*'s order with a tail of
           ``SPREAD_TAIL`` (10%) longest first. A node that is a candidate for many COPYs but must also receive
           (its slots are wanted for both) sends only its share, and a COPY waits for its own source rather than
           taking whichever candidate is open first.
        4. *paced*: *filling*'s order and sources, but every node's inbound direction admits COPYs only while none
           is slowed below its stream rate (``bw - slowest stream``: 6 entry transfers), its outbound one until
           ``bw``. No receiver then slows the transfers of senders whose slots are their bottleneck (a node that
           both receives its own copies and sends half of another's: the XL failure of node445), and senders still
           fill their links.
        5. *bottleneck*: slots only: urgent first, fewer owners, steps without a transfer first, then the larger
           *bottleneck load* (a node's load is the solo time of the steps it must host plus an even share of the
           COPYs it may send; a step's, the largest over its nodes, a COPY's source side at its least loaded
           candidate), then the longer solo time, then plan order; the same source choice as *balanced*. As a
           candidate it makes ``portfolio`` never longer than this order alone, a simpler scheduler that beats
           *balanced* on random plans whose nodes both send and receive at random, where direction limits can
           starve a node whose transfers are slowed at their other end.
        6. *ordered*: urgent first, then ``(group_name, partition_id, step)``; a COPY reads from ``hazelcast``'s
           source when that is one of its candidates, else from its first open candidate; slots only. When the
           partitions are in one priority class and every COPY's ``hazelcast`` source is one of its candidates
           (plans of the planner with FULL rebalances: the serving primary owns), this *is* the ``hazelcast``
           schedule, so ``portfolio`` is never longer than ``hazelcast``. Across classes no such promise holds: going
           urgent first can cost time (one slot on ``a``; urgent ``a -> b`` 1 s; other partition ``a -> c`` 1 s
           then ``c -> d`` 10 s: urgent first ends at 12 s, partition order at 11 s).

        What each rule of *balanced* is for, measured on the benchmark's plans (docs/PLANNING.md): sorting a
        node's COPYs longest first (the bottleneck order's fifth rule) made equal-size transfers start and end
        together, so their successors' overheads coincided and a receiving node's link idled: 10-12% over the
        bound after the XL / XXL failures. Ranking by the static bottleneck load (its fourth) exhausted the
        work of the most loaded node's pairs first and left idle nodes at the end at cap 1 (26% over on M).
        Admitting by slots only let one direction fill a node's slots (cap 20, 19% over) and slowed transfers
        below their stream rate where slots were scarce (cap 10, 4.5%). What 2-4 are for: every single failure of
        the suite's L and XL clusters (docs/PLANNING.md, "Every failure"), where the lost copies' candidates are
        also receivers and one node may be a candidate for three lost partitions: *balanced* alone was up to 19.5%
        over the bound there (median 3.0%). Longest first over a whole node's COPYs idles links (above); over its
        tail only, it took the median L failure from 1.7% over the bound to 0.7%.

        *Packed pass.* On a plan within ``PACK_UP_TO_WORK``, in one priority class, whose shortest list schedule is more
        than ``PACK_ABOVE`` (1%) over :func:`lower_bound`: every COPY's source fixed (the linear program's rounding, as
        *spread*, then single COPYs moved between pool members while that lowers the busiest node's time), every step
        placed, in *balanced*'s order, at the earliest instant its slots and its directions' *lanes* are free (a serial
        schedule generation scheme in continuous time), then ``PACK_ROUNDS`` forward-backward rounds, once with lanes
        that slow no transfer (6 entry transfers per direction) and once with one lane more where a link holds its node
        back; the shorter plan is replayed by the event loop, each step ready at its planned start, slots only
        (:mod:`rebalancer.planning.packing`, which proves that the replay is no longer than the plan). A list schedule
        starts steps only at events and in one order; this one keeps each node's transfers staggered and fills the gaps
        behind them. Its schedule replaces the list schedule only when strictly shorter. Like the exact pass it ignores
        urgency, so it does not run across priority classes.

        *Exact pass.* On a plan of at most ``SOLVE_UP_TO_STEPS`` steps, in one priority class, whose shortest
        schedule so far is longer than :func:`lower_bound`, CP-SAT (:mod:`rebalancer.planning.optimum`) searches for a
        shorter schedule, starting from that one: one worker, seed 0, ``SOLVER_DETERMINISTIC_TIME`` of deterministic
        time, time counted in units of the greedy makespan / (``SOLVER_RESOLUTION`` * the longest queue a slot may
        have), its solution's grid gaps closed afterwards (:func:`rebalancer.planning.optimum.compact`). Its schedule
        replaces the greedy one only when strictly shorter, so ``portfolio`` keeps every promise above. It keeps
        every transfer at its stream rate (at most ``floor(bw / stream)`` per node and direction where the cap
        allows more), so its times are the cost model's. Same plan, same schedule, on any machine with the same
        ortools (the solver is deterministic, and the plan is solved in ``(group_name, partition_id, step)``
        order). Across priority classes it does not run: its optimum ignores urgency. :func:`schedule_with_stats`
        reports its status and seconds.
    ``hazelcast``
        Hazelcast's migration scheduler as a baseline: a COPY always reads from ``primary_node`` (``source_node``
        when null), whatever the candidates; first-fit in ``(group_name, partition_id, step)`` order; slots only;
        same rates.
    ``serial``
        One step at a time in ``(group_name, partition_id, step)`` order, from ``source_node`` as given; each runs
        alone, so a COPY moves at ``min(stream, bw)``. Its makespan is the sum of the estimated durations.

    ``portfolio`` and ``hazelcast`` never take longer than ``serial``. Let W(t) be the serial time still owed by the
    unfinished steps (remaining overhead plus remaining bytes at each one's solo rate). Some step always runs:
    when none runs, every slot is free and no direction has a COPY committed, so any ready step starts. If one
    is in its overhead W falls at rate >= 1; else take the node where the largest count m of transfers meets
    (as sender or receiver): each of those m transfers has ``n_out, n_in <= m``, so it moves at least
    ``min(stream, bw/m) >= min(stream, bw)/m``, and together they lower W at rate >= 1. So the makespan is at
    most W(0), the serial makespan.

Lower bound (:func:`lower_bound`, :func:`lower_bound_terms`)
    Write ``r = min(stream, bw)``, ``solo = overhead_s + bytes / r`` for a COPY (``overhead_s`` for the others),
    ``head`` / ``tail`` for the solo times of the steps before / after a step in its partition, and a COPY's
    *pool* for its candidates and its ``source_node`` but its target: the nodes any policy may read it from.
    Take any schedule that reads every COPY from its pool, with makespan T. A step starts no earlier than its
    head (its partition's earlier steps run one after the other, each for at least its solo time: no rate
    exceeds ``r``) and ends no later than T minus its tail, and holds its slots for at least its solo time. So:

    (a) receive: for every node v, the COPYs into v with bytes move them only in their transfer phases, which
        lie in ``[min(head) + overhead_s, T - min(tail)]``, at most ``bw`` per second in all:
        ``T >= min(head) + overhead_s + bytes_in(v) / bw + min(tail)``.
    (b) send: the same for the COPYs whose pool is v alone; and for a set S of k nodes, the COPYs whose whole
        pool lies in S send their bytes from S at most ``k * bw`` per second: ``T >= bytes / (k * bw)``.
    (c) slots: for every node v, the steps that must touch it (its COPYs in, its PROMOTEs and DROPs, the COPYs
        whose pool is v alone) hold one of its ``cap`` slots each for their solo time within
        ``[min(head), T - min(tail)]``; for a set S of k nodes, those steps plus the COPYs whose whole pool lies
        in S hold S's ``k * cap`` slots: ``T >= time / (k * cap)``.
    (d) odd sets: a step with both its nodes in S holds two of S's ``k * cap`` slots, so with ``k * cap`` odd at
        most ``(k * cap - 1) / 2`` such steps run at once: ``T >= time of those steps / ((k * cap - 1) / 2)``. And
        splitting the nodes into S and U (j nodes): every step but S's one-node steps has both nodes in S or
        touches U, and at most ``j * cap`` steps touch U at once, so
        ``T >= (all solo time - one-node time in S) / ((k * cap - 1) / 2 + j * cap)``.
    (e) chain: a partition's steps run one after the other: ``T >= head + solo + tail`` of any step.
    (f) balance: (b) and (c) for every node at once, each COPY's source side split over its pool in the shares a
        linear program picks to make the largest node's time least (:mod:`rebalancer.planning.sources`, with its
        proof): any schedule's sources are one such split. It is (b) and (c) with the best sets and splits, where
        the rankings above see prefixes only (the L failure of node85: 5.884 s against 5.798 s). Plans with more
        than ``sources.MAX_POOLS`` distinct pools go without it.

    The sets S are the first k nodes of rankings by the work that must be done there (for (b) by bytes, for (c)
    and (d) by slot time, each with and without an even share of the flexible sources), and for (d)'s second
    form S is every node but the j with the most one-node step time. The bound is the largest term; the
    property tests check that it never exceeds the makespan of any policy on thousands of random plans, nor
    CP-SAT's proven optimum (tests/test_schedule_optimum.py).

Implementation
    The event loop is :mod:`rebalancer.planning.event_loop` (run as Python for small plans, compiled by numba for large
    ones, with the same result). An event queue holds overhead ends, transfer ends, direction releases and the instants
    rows become ready when a candidate gives them one (*packed*; an event moves when a transfer's rate changes). Events
    less than 1e-9 s apart are processed as one instant, so symmetric transfers end together despite rounding. After an
    event only the transfers sharing a sender or a receiver with a transfer that started or ended can change rate, and
    only those whose stream exceeds the new fair share ``bw / count``. A ready step that does not fit waits in a heap,
    ordered by priority, per pair of nodes it would touch (its node twice for a one-node step; a COPY in the pair of
    each candidate and its target). A pair holds waiting steps only while one of its nodes is closed (for a COPY: the
    target's slots or inbound direction, the candidate's slots or outbound direction), so when a node opens only its
    pairs with an open partner are looked at (its list of pairs, or a bitwise AND of its partners with the open nodes
    when that is shorter; each pair's best waiting rank is kept beside the node's partners, so that this reads the
    node's own memory), merged in priority order; every waiting step taken out starts. The loop numbers the rows in
    priority order. Scheduling time is this loop, once per candidate (docs/PLANNING.md, "Speed").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.planning import event_loop, packing, sources
from rebalancer.planning import optimum as cpsat
from rebalancer.planning.event_loop import A_COPY, A_DROP, A_PROMOTE
from rebalancer.vocabulary import COPY, DROP, ENTRIES, FILES, PROMOTE

__all__ = [
    "PLAN_INPUT_SCHEMA",
    "POLICIES",
    "SCHEDULED_SCHEMA",
    "BoundTerms",
    "CostModel",
    "Optimum",
    "ScheduleInputError",
    "ScheduleStats",
    "lower_bound",
    "lower_bound_terms",
    "makespan",
    "optimum",
    "plan_fields",
    "schedule",
    "schedule_with_stats",
]

POLICIES = ("portfolio", "hazelcast", "serial")

SOLVE_UP_TO_STEPS = 50
"""``portfolio`` runs CP-SAT from its greedy schedule on plans of at most this many steps (module docstring, "Exact
pass"). Measured by ``bench/exact_pass.py`` (docs/PLANNING.md, "Near the optimum"): up to 50 steps it shortened half
the plans it ran on, by 3.6-7.4% (medians), in 0.05-0.35 s (medians); from 76 to 100 steps one in seven, by 0.5%, in
0.7 s."""
SOLVER_DETERMINISTIC_TIME = 0.02
"""CP-SAT's deterministic time limit in ``portfolio``'s exact pass. Its work count underrates the cumulative
constraints of this model: 0.1 of it took 1.5-3 s of wall time on a 61-step plan here."""
SOLVER_RESOLUTION = 50
"""The exact pass counts time in units of the greedy makespan / (this * the longest queue of a slot): coarser units let
CP-SAT prove more in its time, and rounding every step up to a unit delays a queue's last by one unit per step."""

MORE_CANDIDATES_BELOW_STEPS = 200_000
"""``portfolio`` runs its candidates *filling*, *spread* and *paced* on plans with fewer steps than this (a plan of a
million steps would spend seconds on each; every suite plan has a few thousand)."""
FILLING_TAIL = 0.3
"""*filling* and *paced* rank the last this share of every node's incoming COPYs longest first (module docstring,
"Policies"); measured over every single failure of the L cluster and every fifth of the XL (docs/PLANNING.md)."""
SPREAD_TAIL = 0.1
"""*spread* ranks the last this share of every node's incoming COPYs longest first."""
PACK_UP_TO_WORK = 1_000_000
"""``portfolio`` runs *packed* on plans whose steps times the most steps that may touch one node is at most this
(module docstring, "Packed pass"): placing a step scans what was placed on its nodes before it. Every single failure
of the suite's L and XL clusters is under it (at most 740,000: 0.3-1.0 s of CPU for the pass); its M failures and
scale-ups (3.5-57 million: 2-9 s) and its XXL failure (1.7 million) are over it (docs/PLANNING.md, "Every
failure")."""
PACK_ABOVE = 0.01
"""``portfolio`` runs *packed* only where its list schedules are more than this share over the lower bound: there it
gains at most that share, for 0.3-1 s of CPU per plan at L and XL, and ``what-if --sweep nodes`` schedules a plan per
node (docs/PLANNING.md, "The packed pass")."""
PACK_ROUNDS = 2
"""Forward-backward rounds of *packed* (:mod:`rebalancer.planning.packing`)."""

PLAN_INPUT_SCHEMA = pa.schema(
    [
        ("migration_id", pa.int64()),
        ("group_name", pa.string()),
        ("partition_id", pa.int32()),
        ("step", pa.int32()),
        ("action", pa.string()),
        ("source_node", pa.string()),
        ("target_node", pa.string()),
        ("candidates", pa.list_(pa.string())),
        ("primary_node", pa.string()),
        ("transfer", pa.string()),
        ("bytes", pa.int64()),
        ("owners", pa.int32()),
        ("replicas", pa.int32()),
    ]
)
_SCHEDULE_FIELDS = [
    pa.field("wave", pa.int32()),
    pa.field("est_start_s", pa.float64()),
    pa.field("est_end_s", pa.float64()),
]
SCHEDULED_SCHEMA = pa.schema([*PLAN_INPUT_SCHEMA, *_SCHEDULE_FIELDS])


def plan_fields(*names: str) -> list[pa.Field]:
    """The fields ``names`` of :data:`SCHEDULED_SCHEMA`, in the order given: a plan's columns that the scheduler
    reads or fills, declared here once (``rebalancer.planning.plan.PLAN_SCHEMA`` takes them)."""
    return [SCHEDULED_SCHEMA.field(name) for name in names]

_LOWER_BOUND_COLUMNS = (
    "group_name", "partition_id", "step", "action", "source_node", "target_node", "transfer", "bytes"
)
_ACTION_CODES = {COPY: A_COPY, PROMOTE: A_PROMOTE, DROP: A_DROP}
_WAVE_DECIMALS = 9
_RATE_TOLERANCE = 0.5  # bytes/s: committed stream rates are sums of the model's rates


class ScheduleInputError(ValueError):
    """A plan, a policy or a cost model the scheduler cannot use; the message says what was expected and got."""


@dataclass(frozen=True)
class CostModel:
    """Parameters of the scheduler's cost model (see the module docstring).

    Attributes:
        max_parallel_per_node: at most this many running migration steps touch any node.
        node_bandwidth_bytes_per_s: bandwidth of each node in each direction (default 20 Gbps full duplex).
        entry_stream_bytes_per_s: top rate of one entry-based transfer (FULL by entries, HISTORICAL replay).
        file_stream_bytes_per_s: top rate of one file-based transfer (FULL by files).
        overhead_s: fixed cost of every step (COPY, PROMOTE, DROP), during which it holds its slots.
    """

    max_parallel_per_node: int = 10
    node_bandwidth_bytes_per_s: float = 2.5e9
    entry_stream_bytes_per_s: float = 4.0e8
    file_stream_bytes_per_s: float = 1.25e9
    overhead_s: float = 0.1

    def __post_init__(self) -> None:
        cap = self.max_parallel_per_node
        if isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 1:
            raise ScheduleInputError(f"max_parallel_per_node: expected an integer >= 1, got {cap!r}")
        rates = ("node_bandwidth_bytes_per_s", "entry_stream_bytes_per_s", "file_stream_bytes_per_s")
        for name in (*rates, "overhead_s"):
            value = getattr(self, name)
            floor = "> 0" if name in rates else ">= 0"
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float | np.number)
                or not np.isfinite(value)
                or (value <= 0 if name in rates else value < 0)
            ):
                raise ScheduleInputError(f"{name}: expected a finite number {floor}, got {value!r}")


@dataclass
class _Plan:
    """A validated plan decoded into arrays indexed by row in ``(group_name, partition_id, step)`` order (``rows``:
    the plan's row of each), node ids as indices into ``nodes``."""

    n: int
    nodes: list[str]
    action: np.ndarray  # int8 action code
    src: np.ndarray  # int64 node index
    tgt: np.ndarray  # int64 node index, -1 when null
    primary: np.ndarray  # int64 node index, -1 when null
    pool_node: np.ndarray  # int64: the nodes each COPY may read from (its candidates but its target), ascending
    pool_start: np.ndarray  # int64, n + 1 offsets: row i's pool is pool_node[pool_start[i]:pool_start[i + 1]]
    nbytes: np.ndarray  # float64, 0 unless COPY
    stream: np.ndarray  # float64 stream rate of a COPY (entries or files), 0 otherwise
    owners: np.ndarray  # int64
    replicas: np.ndarray  # int64
    nxt: np.ndarray  # int64 row of the next step of the partition, -1 for the last
    part: np.ndarray  # int64 dense code of (group_name, partition_id)
    step: np.ndarray  # int64 step number
    rows: np.ndarray  # int64 the plan's row of each row here (rows here are in (group_name, partition_id, step) order)


@dataclass(frozen=True)
class _Candidate:
    """One greedy list schedule of a plan: the order steps are offered slots in and how COPY sources are picked.

    ``rank``: dispatch priority per row (a permutation of ``0..n-1``, 0 first). ``pool_node`` / ``pool_start``:
    per row, the nodes a COPY may read from (as in :class:`_Plan`). ``work``: per node, the work bound to it so far
    (a COPY reads from the open pool member with the least, then fewest COPYs sending, then fewest bytes assigned,
    then lowest index, and adds its solo duration), or None: the first open pool member. ``limits``: per direction
    (every node's inbound direction, then every node's outbound one: ``2 * nodes`` values), the committed stream
    rate from which the direction admits no further COPY (direction-aware admission, with the release of transfers
    ending within ``overhead_s``), or None: slots only. ``ready_at``: per row, the instant before which it may not
    start (the packed pass's plan), or None: none.
    """

    rank: np.ndarray
    pool_node: np.ndarray
    pool_start: np.ndarray
    work: np.ndarray | None = None
    limits: np.ndarray | None = None
    name: str = ""
    ready_at: np.ndarray | None = None


@dataclass(frozen=True)
class _Timetable:
    """A schedule: per row its start, end and the node it read from; its makespan; what made it."""

    start: np.ndarray
    end: np.ndarray
    chosen: np.ndarray
    makespan: float
    name: str = ""


@dataclass(frozen=True)
class ScheduleStats:
    """How :func:`schedule_with_stats` scheduled a plan.

    Attributes:
        policy: the policy.
        makespan_s: the schedule's makespan.
        chosen: what made it: ``portfolio``'s candidate (``balanced``, ``filling``, ``spread``, ``paced``,
            ``bottleneck``, ``ordered``), ``packed`` or ``solver``; the policy's name otherwise.
        greedy_makespan_s: ``portfolio``'s shortest schedule before the solver (a list schedule, or ``packed``).
        solver_status: CP-SAT's status when the solver ran (module docstring, "Exact pass"), else None.
        solver_seconds: wall seconds in the solver (0.0 when it did not run).
        solver_deterministic_time: CP-SAT's deterministic time spent (its limit: ``SOLVER_DETERMINISTIC_TIME``).
        solver_makespan_s: the makespan of the solver's schedule (inf when it found none or did not run).
        lower_bound_s: :func:`lower_bound` of the plan when ``portfolio`` computed it for its passes (a plan in one
            priority class small enough for one of them), else None. The scheduled plan has the same bound: each
            COPY's chosen source is one of its candidates, so its pool is unchanged.
    """

    policy: str
    makespan_s: float
    chosen: str
    greedy_makespan_s: float
    solver_status: str | None = None
    solver_seconds: float = 0.0
    solver_deterministic_time: float = 0.0
    solver_makespan_s: float = math.inf
    lower_bound_s: float | None = None


def schedule(plan: pa.Table, model: CostModel, policy: str = "portfolio") -> pa.Table:
    """Schedule the steps of a migration plan under the cost model.

    Args:
        plan: one row per step with at least the columns of :data:`PLAN_INPUT_SCHEMA` (castable to those types);
            other columns are kept as they are.
        model: the cost model.
        policy: ``"portfolio"``, ``"hazelcast"`` or ``"serial"`` (module docstring).

    Returns:
        ``plan``'s rows in the same order with ``source_node`` set to each COPY's chosen source (other rows keep
        theirs) and ``wave`` (int32), ``est_start_s`` and ``est_end_s`` (float64) filled in: replaced where the
        columns exist, appended in that order otherwise.

    Raises:
        ScheduleInputError: (a ``ValueError``) the policy is unknown, required columns are missing or not castable,
            or the rows break the input contract (null keys, unknown action, gaps in ``step``, a COPY with no
            usable source, ...). The message lists what was expected and what arrived.
    """
    return schedule_with_stats(plan, model, policy)[0]


def schedule_with_stats(plan: pa.Table, model: CostModel, policy: str = "portfolio") -> tuple[pa.Table, ScheduleStats]:
    """:func:`schedule`, and how it went (:class:`ScheduleStats`: which candidate won, the solver's time)."""
    if policy not in POLICIES:
        raise ScheduleInputError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
    if not isinstance(model, CostModel):
        raise ScheduleInputError(f"model: expected a CostModel, got {type(model).__name__}")
    p = _decode(plan, PLAN_INPUT_SCHEMA.names, model)
    solo = _solo_durations(p, model)
    if policy != "portfolio":
        run = _run_policy(p, model, solo, policy)
        return _with_schedule(plan, p, run), ScheduleStats(policy, run.makespan, policy, run.makespan)
    candidates = _candidates(p, model, solo)
    greedy = _shortest(p, model, solo, candidates)
    packs, solves = _packs(p), 0 < p.n <= SOLVE_UP_TO_STEPS
    # The passes run only above the lower bound, and only in one priority class: the bound costs a linear program.
    bound = lower_bound_terms(plan, model).value if (packs or solves) and _one_class(p) else math.inf
    if packs:
        greedy = _packed_pass(p, model, solo, greedy, bound, candidates)
    run, stats = _exact_pass(p, model, solo, greedy, bound)
    if math.isfinite(bound):
        stats = dataclasses.replace(stats, lower_bound_s=bound)
    return _with_schedule(plan, p, run), stats


def _run_policy(p: _Plan, model: CostModel, solo: np.ndarray, policy: str) -> _Timetable:
    if policy == "serial":
        return _serial(p, solo)
    if policy == "hazelcast":
        return _simulate(p, model, _hazelcast(p), solo)
    return _portfolio(p, model, solo)


def _one_class(p: _Plan) -> bool:
    """Every partition in one priority class (all urgent or none): the passes that ignore urgency may run."""
    urgent = _urgent(p)
    return bool(urgent.all() or not urgent.any())


def _packs(p: _Plan) -> bool:
    """The plan is within ``PACK_UP_TO_WORK``: the packed pass may run."""
    return p.n > 0 and p.n * _most_steps_on_a_node(p) <= PACK_UP_TO_WORK


def _packed_pass(p: _Plan, model: CostModel, solo: np.ndarray, greedy: _Timetable, bound: float,
                 candidates: list[_Candidate]) -> _Timetable:
    """``portfolio``'s packed pass (module docstring, "Packed pass") on a plan in one priority class whose greedy
    makespan is more than ``PACK_ABOVE`` over ``bound`` (the lower bound; ``inf`` across classes): the packed
    schedule replayed by the event loop, when strictly shorter. It places steps in *balanced*'s order and starts from
    *spread*'s sources (``candidates``, ``portfolio``'s list schedules) when the linear program ran."""
    if greedy.makespan <= bound * (1 + PACK_ABOVE):
        return greedy
    nn, cap = len(p.nodes), model.max_parallel_per_node
    bw, overhead = model.node_bandwidth_bytes_per_s, model.overhead_s
    by_name = {c.name: c for c in candidates}
    key = by_name["balanced"].rank
    start_from = greedy.chosen.astype(np.int64)  # each COPY's source: the linear program's rounding if it ran
    if "spread" in by_name:
        spread = by_name["spread"]
        copies = np.flatnonzero(p.action == A_COPY)
        start_from[copies] = spread.pool_node[spread.pool_start[copies]]
    source = packing.balanced_sources(p.action, p.src, p.tgt, p.pool_node, p.pool_start, start_from, p.nbytes, solo,
                                      nn, cap, bw)
    start, _ = packing.pack(p.action, p.src, p.tgt, p.nxt, p.pool_node, p.pool_start, source, p.nbytes, p.stream, key,
                            nn, cap, bw, overhead, PACK_ROUNDS)
    rank = np.empty(p.n, dtype=np.int64)
    rank[np.lexsort((key, start))] = np.arange(p.n, dtype=np.int64)
    is_copy = p.action == A_COPY  # a pool of one: the COPY's source
    pool_start = np.concatenate([[0], np.cumsum(is_copy)]).astype(np.int64)
    replay = _simulate(p, model, _Candidate(rank, source[is_copy], pool_start, name="packed", ready_at=start), solo)
    return replay if replay.makespan < greedy.makespan * (1 - 1e-9) else greedy


def _exact_pass(
    p: _Plan, model: CostModel, solo: np.ndarray, greedy: _Timetable, bound: float
) -> tuple[_Timetable, ScheduleStats]:
    """``portfolio``'s exact pass (module docstring, "Exact pass"): CP-SAT from the greedy schedule on plans of at most
    ``SOLVE_UP_TO_STEPS`` steps in one priority class whose greedy makespan is above ``bound`` (the lower bound;
    ``inf`` across classes); its schedule replaces the greedy one only when strictly shorter."""
    stats = ScheduleStats("portfolio", greedy.makespan, greedy.name, greedy.makespan)
    if not 0 < p.n <= SOLVE_UP_TO_STEPS or greedy.makespan <= bound * (1 + 1e-9):
        return greedy, stats
    found = _solve(p, model, solo, greedy, max_deterministic_time=SOLVER_DETERMINISTIC_TIME, seed=0,
                   lower_bound_s=bound, unit_s=greedy.makespan / (SOLVER_RESOLUTION * _longest_queue(p, model)),
                   linearization_level=0)
    solved = _solved_timetable(found, _problem(p, model, solo))
    stats = dataclasses.replace(stats, solver_status=found.status, solver_seconds=found.wall_s,
                                solver_deterministic_time=found.deterministic_time,
                                solver_makespan_s=solved.makespan if solved is not None else math.inf)
    if solved is not None and solved.makespan < greedy.makespan * (1 - 1e-9):
        return solved, dataclasses.replace(stats, makespan_s=solved.makespan, chosen="solver")
    return greedy, stats


@dataclass(frozen=True)
class Optimum:
    """What :func:`optimum` found (module :mod:`rebalancer.planning.optimum` has the model).

    Attributes:
        scheduled: the solver's schedule as :func:`schedule` returns one (None without a solution); its times are
            the cost model's for its starts and sources (every transfer at its stream rate).
        makespan_s: its makespan (``inf`` without a solution).
        bound_s: the solver's lower bound of its own (rounded) model.
        proven_bound_s: a lower bound of the cost model's optimum; 0.0 unless ``exact``.
        optimal: the solver proved its schedule optimal in its model; with ``exact``, ``makespan_s`` is then the
            cost model's optimum up to ``(steps + 1) * unit_s``.
        exact: the model is the cost model (no transfer can be slowed: ``cap * stream <= bw``).
        status: CP-SAT's status.
        seconds: wall seconds in the solver.
        deterministic_time: CP-SAT's deterministic time spent.
    """

    scheduled: pa.Table | None
    makespan_s: float
    bound_s: float
    proven_bound_s: float
    optimal: bool
    exact: bool
    status: str
    seconds: float
    deterministic_time: float


def optimum(
    plan: pa.Table,
    model: CostModel,
    *,
    max_deterministic_time: float = 10.0,
    unit_s: float = cpsat.UNIT_S,
    hint: str | None = "portfolio",
    seed: int = 0,
) -> Optimum:
    """The shortest schedule of ``plan`` under ``model`` that CP-SAT finds within ``max_deterministic_time``, and how
    far from the optimum it may be (:mod:`rebalancer.planning.optimum`): the tests' oracle.

    Args:
        plan: as for :func:`schedule`.
        model: the cost model.
        max_deterministic_time: CP-SAT's deterministic time limit (one worker, ``seed``: the same result on every
            machine).
        unit_s: the model's time unit (durations rounded up to it).
        hint: the policy whose schedule the solver starts from, or None.
        seed: CP-SAT's random seed.

    Raises:
        ScheduleInputError: as :func:`schedule`.
    """
    if not isinstance(model, CostModel):
        raise ScheduleInputError(f"model: expected a CostModel, got {type(model).__name__}")
    p = _decode(plan, PLAN_INPUT_SCHEMA.names, model)
    solo = _solo_durations(p, model)
    run = None
    if hint is not None:
        if hint not in POLICIES:
            raise ScheduleInputError(f"unknown policy {hint!r}; expected one of {list(POLICIES)}")
        run = _run_policy(p, model, solo, hint)
    found = _solve(p, model, solo, run, max_deterministic_time=max_deterministic_time, seed=seed, unit_s=unit_s)
    timetable = _solved_timetable(found, _problem(p, model, solo))
    return Optimum(
        scheduled=_with_schedule(plan, p, timetable) if timetable is not None else None,
        makespan_s=timetable.makespan if timetable is not None else math.inf, bound_s=found.bound_s,
        proven_bound_s=found.proven_bound_s, optimal=found.optimal, exact=found.exact, status=found.status,
        seconds=found.wall_s, deterministic_time=found.deterministic_time,
    )


def _solve(p: _Plan, model: CostModel, solo: np.ndarray, hint: _Timetable | None, **options: float) -> cpsat.Solution:
    """CP-SAT on ``p`` (whose rows are in ``(group_name, partition_id, step)`` order, so the same plan in any row order
    gives the same schedule), starting from ``hint``."""
    return cpsat.solve(_problem(p, model, solo), hint_start_s=hint.start if hint is not None else None,
                       hint_chosen=hint.chosen if hint is not None else None, **options)  # type: ignore[arg-type]


def _problem(p: _Plan, model: CostModel, solo: np.ndarray) -> cpsat.Problem:
    """``p`` under ``model`` as the solver reads it."""
    return cpsat.Problem(
        action=p.action, src=p.src, tgt=p.tgt, nxt=p.nxt, pool_node=p.pool_node, pool_start=p.pool_start,
        nbytes=p.nbytes, stream=p.stream, solo=solo, nn=len(p.nodes), cap=model.max_parallel_per_node,
        bw=model.node_bandwidth_bytes_per_s, overhead=model.overhead_s,
    )


def _longest_queue(p: _Plan, model: CostModel) -> int:
    """The most steps one slot of a node may have to run one after the other (the steps that may touch the node over
    its cap, at least 1): the exact pass's time unit is this much finer, so that rounding each step up to a unit
    delays a node's last step by a small share of the makespan."""
    return max(1, -(-_most_steps_on_a_node(p) // model.max_parallel_per_node))


def _most_steps_on_a_node(p: _Plan) -> int:
    """The most steps that may touch one node (a COPY its target and every pool member)."""
    nodes = np.concatenate([p.tgt[p.tgt >= 0], p.src[p.action != A_COPY], p.pool_node])
    return int(np.bincount(nodes, minlength=len(p.nodes)).max(initial=0))


def _solved_timetable(found: cpsat.Solution, problem: cpsat.Problem) -> _Timetable | None:
    """The solver's schedule in seconds, its grid's gaps closed (:func:`rebalancer.planning.optimum.compact`): each
    step lasts its solo time (no transfer is slowed)."""
    solo = problem.solo
    if found.start is None or found.chosen is None:
        return None
    start = cpsat.compact(problem, found.start, found.chosen)
    end = start + solo
    return _Timetable(start, end, found.chosen, float(end.max()) if len(end) else 0.0, "solver")


def makespan(scheduled: pa.Table) -> float:
    """The largest ``est_end_s`` of a scheduled plan, 0.0 for an empty plan.

    Raises:
        ScheduleInputError: ``est_end_s`` is missing.
    """
    if "est_end_s" not in scheduled.column_names:
        raise ScheduleInputError(f"expected a scheduled plan with column est_end_s, got {scheduled.column_names}")
    if scheduled.num_rows == 0:
        return 0.0
    top = pc.max(scheduled.column("est_end_s")).as_py()
    return 0.0 if top is None else float(top)


def lower_bound(scheduled: pa.Table, model: CostModel) -> float:
    """A makespan no schedule of this plan can beat under ``model``, whichever COPY sources it reads from among
    each COPY's ``candidates`` and its ``source_node``.

    The largest term of :func:`lower_bound_terms` (module docstring, "Lower bound").

    Args:
        scheduled: a plan as returned by :func:`schedule`; any plan with the columns ``group_name``,
            ``partition_id``, ``step``, ``action``, ``source_node``, ``target_node``, ``transfer`` and ``bytes``
            will do (``candidates`` is optional: without it a COPY may only read from its ``source_node``).
        model: the cost model.

    Returns:
        The bound in seconds; 0.0 for an empty plan.

    Raises:
        ScheduleInputError: columns are missing or rows break the input contract.
    """
    return lower_bound_terms(scheduled, model).value


@dataclass(frozen=True)
class BoundTerms:
    """The terms of the makespan lower bound in seconds (module docstring, "Lower bound"); each is a bound alone.

    Attributes:
        receive_s: (a) the bytes one node receives.
        send_s: (b) the bytes a set of nodes must send (COPYs whose every possible source is in the set).
        slots_s: (c) the solo step time a set of nodes must host in its slots.
        pairs_s: (d) the two-node steps inside a set of nodes whose slot count is odd.
        chain_s: (e) a partition's steps one after the other.
        balance_s: (f) every node's slot and send time, the COPYs split over their pools as well as any split could
            (:mod:`rebalancer.planning.sources`); 0.0 for plans with more pools than it takes.
    """

    receive_s: float
    send_s: float
    slots_s: float
    pairs_s: float
    chain_s: float
    balance_s: float = 0.0

    @property
    def value(self) -> float:
        """The bound: the largest term."""
        return max(self.receive_s, self.send_s, self.slots_s, self.pairs_s, self.chain_s, self.balance_s)


def lower_bound_terms(scheduled: pa.Table, model: CostModel) -> BoundTerms:
    """Every term of :func:`lower_bound` (same arguments and errors); all 0.0 for an empty plan."""
    missing = [c for c in _LOWER_BOUND_COLUMNS if c not in scheduled.column_names]
    if missing:
        raise ScheduleInputError(
            f"lower_bound: missing columns {missing}; expected at least {list(_LOWER_BOUND_COLUMNS)}, "
            f"got {scheduled.column_names}"
        )
    if scheduled.num_rows == 0:
        return BoundTerms(0.0, 0.0, 0.0, 0.0, 0.0)
    with_candidates = "candidates" in scheduled.column_names
    cols = _cast_columns(scheduled, [*_LOWER_BOUND_COLUMNS, *(["candidates"] if with_candidates else [])])
    n = scheduled.num_rows
    action = _actions(cols["action"])
    is_copy = action == A_COPY
    promote = action == A_PROMOTE
    nbytes = np.where(is_copy, cols["bytes"].fill_null(0).to_numpy().astype(np.float64), 0.0)
    bw, cap, overhead = model.node_bandwidth_bytes_per_s, model.max_parallel_per_node, model.overhead_s
    rate = np.minimum(_streams(cols["transfer"], is_copy, model), bw)
    solo = overhead + np.divide(nbytes, rate, out=np.zeros(n), where=is_copy)
    node_columns = [cols["source_node"], cols["target_node"]]
    if with_candidates:
        node_columns.append(cols["candidates"].flatten())
    nodes, (src, tgt, *flat) = _node_indices(node_columns)
    if (src < 0).any():
        raise ScheduleInputError("lower_bound: source_node must not be null")
    if ((action != A_DROP) & (tgt < 0)).any():
        raise ScheduleInputError("lower_bound: target_node must not be null for a COPY or a PROMOTE")
    nn = len(nodes)
    part = _partition_codes(cols["group_name"], cols["partition_id"])
    head, tail, chains = _chain_offsets(part, cols["step"].fill_null(0).to_numpy().astype(np.int64), solo)

    # Pools: the nodes a COPY may read from (candidates and source_node, never its target), as (row, node) pairs.
    pool_row, pool_node = np.flatnonzero(is_copy), src[is_copy]
    if flat:
        lengths = pc.list_value_length(cols["candidates"]).fill_null(0).to_numpy(zero_copy_only=False)
        cand_row = np.repeat(np.arange(n), lengths.astype(np.int64))
        keep = is_copy[cand_row] & (flat[0] >= 0)
        pool_row = np.concatenate([pool_row, cand_row[keep]])
        pool_node = np.concatenate([pool_node, flat[0][keep]])
    keep = pool_node != tgt[pool_row]
    pairs = event_loop.dense_codes(pool_row[keep] * nn + pool_node[keep])[0]
    pool_row, pool_node = pairs // nn, pairs % nn
    pool_len = np.bincount(pool_row, minlength=n)
    if (is_copy & (pool_len == 0)).any():
        rows = np.flatnonzero(is_copy & (pool_len == 0))[:5].tolist()
        raise ScheduleInputError(f"lower_bound: a COPY needs a source other than its target, got none at rows {rows}")
    forced = is_copy & (pool_len == 1)
    flexible = is_copy & (pool_len > 1)
    only = np.zeros(n, dtype=np.int64)
    only[pool_row[forced[pool_row]]] = pool_node[forced[pool_row]]  # a forced COPY's one source

    # (a), (b) for one node: bytes moved between the earliest a transfer can start and the latest it can end.
    moving = is_copy & (nbytes > 0)
    receive = _windowed(tgt[moving], nbytes[moving] / bw, head[moving] + overhead, tail[moving], nn)
    sends = moving & forced
    send = _windowed(only[sends], nbytes[sends] / bw, head[sends] + overhead, tail[sends], nn)

    # (c) for one node. Slot incidences whatever the sources: a COPY's target and, when forced, its source; both
    # nodes of a PROMOTE (one when they are the same); a DROP's node.
    on_tgt = is_copy | (promote & (tgt != src))
    on_src = ~is_copy | forced
    inc_row = np.concatenate([np.flatnonzero(on_tgt), np.flatnonzero(on_src)])
    inc_node = np.concatenate([tgt[on_tgt], np.where(forced, only, src)[on_src]])
    slots = _windowed(inc_node, solo[inc_row] / cap, head[inc_row], tail[inc_row], nn)

    # (b), (c), (d) for sets of nodes: the prefixes of the nodes ranked by load. A flexible COPY's source side is
    # inside a prefix when its whole pool is.
    pinned = np.bincount(inc_node, weights=solo[inc_row], minlength=nn)
    share = np.bincount(pool_node, weights=(solo / np.maximum(pool_len, 1))[pool_row] * flexible[pool_row],
                        minlength=nn)
    forced_bytes = np.bincount(only[forced], weights=nbytes[forced], minlength=nn)
    bytes_share = np.bincount(pool_node, weights=(nbytes / np.maximum(pool_len, 1))[pool_row] * flexible[pool_row],
                              minlength=nn)
    flex = np.flatnonzero(flexible)
    two = np.flatnonzero((promote & (tgt != src)) | forced)
    size = np.arange(1, nn + 1)
    slots_sets = send_sets = pairs_s = 0.0
    for key in (pinned, pinned + share):
        rank, top = _prefix_ranks(key, pool_row, pool_node, n)
        work = np.cumsum(np.bincount(rank[inc_node], weights=solo[inc_row], minlength=nn)
                         + np.bincount(top[flex], weights=solo[flex], minlength=nn))
        slots_sets = max(slots_sets, float((work / (cap * size)).max()))
        if cap % 2:  # (d): with cap * k odd, at most (cap * k - 1) / 2 two-node steps inside k nodes at once
            last = np.concatenate([np.maximum(rank[tgt[two]], rank[np.where(forced, only, src)[two]]),
                                   np.maximum(rank[tgt[flex]], top[flex])])
            inside = np.cumsum(np.bincount(last, weights=np.concatenate([solo[two], solo[flex]]), minlength=nn))
            odd = (size % 2 == 1) & (size * cap > 1)
            if odd.any():
                pairs_s = max(pairs_s, float((inside[odd] / ((cap * size[odd] - 1) // 2)).max()))
    if cap % 2:
        # (d) with the nodes split into U (the j nodes with the most one-node step time) and S (the others),
        # c * |S| odd: at most (c|S| - 1) / 2 steps run inside S and c|U| touch U, and every step but S's one-node
        # steps is one or the other.
        single_node = ~is_copy & ~(promote & (tgt != src))
        single = np.sort(np.bincount(src[single_node], weights=solo[single_node], minlength=nn))[::-1]
        outside = np.concatenate([[0.0], np.cumsum(single)[:-1]])  # one-node time in U_j, j = 0..nn-1
        rest = nn - np.arange(nn)
        odd = (cap * rest) % 2 == 1
        room = (cap * rest - 1) // 2 + cap * (nn - rest)
        odd &= room > 0
        if odd.any():
            numerator = solo.sum() - (single.sum() - outside[odd])
            pairs_s = max(pairs_s, float((numerator / room[odd]).max()))
    for key in (forced_bytes, forced_bytes + bytes_share):
        rank, top = _prefix_ranks(key, pool_row, pool_node, n)
        volume = np.cumsum(np.bincount(rank[only[forced]], weights=nbytes[forced], minlength=nn)
                           + np.bincount(top[flex], weights=nbytes[flex], minlength=nn))
        send_sets = max(send_sets, float((volume / (bw * size)).max()))
    pool_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(pool_len, out=pool_start[1:])
    balanced = sources.balance(
        action=action, src=src, tgt=tgt, pool_node=pool_node, pool_start=pool_start, nbytes=nbytes, solo=solo,
        head=head, tail=tail, order=np.lexsort((cols["step"].fill_null(0).to_numpy(), part)), nn=nn, cap=cap, bw=bw,
        overhead=overhead,
    )
    return BoundTerms(
        receive_s=receive,
        send_s=max(send, send_sets),
        slots_s=max(slots, slots_sets),
        pairs_s=pairs_s,
        chain_s=float(chains.max()),
        balance_s=balanced.bound_s if balanced is not None else 0.0,
    )


def _chain_offsets(part: np.ndarray, step: np.ndarray, solo: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the solo time of the steps before it in its partition (head) and after it (tail); per partition,
    the whole chain."""
    order = np.lexsort((step, part))
    before = np.cumsum(solo[order]) - solo[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = part[order][1:] != part[order][:-1]
    head = np.empty(len(order))
    head[order] = before - before[np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]
    chains = np.bincount(part, weights=solo)
    return head, chains[part] - head - solo, chains


def _windowed(node: np.ndarray, amount: np.ndarray, head: np.ndarray, tail: np.ndarray, nn: int) -> float:
    """The largest, over nodes, of the least head + the summed amount + the least tail of the node's rows."""
    if not len(node):
        return 0.0
    total = np.bincount(node, weights=amount, minlength=nn)
    first = np.full(nn, np.inf)
    last = np.full(nn, np.inf)
    np.minimum.at(first, node, head)
    np.minimum.at(last, node, tail)
    used = np.isfinite(first)
    return float((first[used] + total[used] + last[used]).max())


def _prefix_ranks(key: np.ndarray, pool_row: np.ndarray, pool_node: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """Rank of every node by ``key`` descending (ties by index) and, per row, the largest rank in its pool (-1
    without one): the row's pool lies in the prefix of the first k nodes when that rank is below k."""
    rank = np.empty(len(key), dtype=np.int64)
    rank[np.argsort(-key, kind="stable")] = np.arange(len(key))
    top = np.full(n, -1, dtype=np.int64)
    np.maximum.at(top, pool_row, rank[pool_node])
    return rank, top


# --- decoding -------------------------------------------------------------------------------------------------


def _cast_columns(table: pa.Table, names: tuple[str, ...] | list[str]) -> dict[str, pa.Array]:
    """The named columns as single arrays cast to :data:`PLAN_INPUT_SCHEMA` types."""
    out: dict[str, pa.Array] = {}
    bad: list[str] = []
    for name in names:
        want = PLAN_INPUT_SCHEMA.field(name).type
        col = table.column(name)
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if arr.type != want:
            try:
                arr = arr.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad.append(f"{name}: expected {want}, got {col.type}")
                continue
        out[name] = arr
    if bad:
        raise ScheduleInputError(f"columns with types that cannot be cast: {bad}")
    return out


def _node_indices(columns: list[pa.Array]) -> tuple[list[str], list[np.ndarray]]:
    """Sorted distinct node ids over ``columns`` (nulls skipped) and each column as indices (-1 for null)."""
    distinct: set[str] = set()
    for c in columns:
        if len(c):
            distinct.update(v for v in pc.unique(c).to_pylist() if v is not None)
    nodes = sorted(distinct)
    value_set = pa.array(nodes, type=pa.string())
    return nodes, [
        pc.index_in(c, value_set=value_set).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        for c in columns
    ]


def _actions(column: pa.Array) -> np.ndarray:
    """Action codes (0 COPY, 1 PROMOTE, 2 DROP); unknown or null actions raise."""
    known = pa.array(list(_ACTION_CODES), type=pa.string())
    codes = pc.index_in(column, value_set=known)
    if codes.null_count:
        bad = sorted({str(v) for v in pc.filter(column, pc.is_null(codes)).to_pylist()})
        raise ScheduleInputError(f"action: expected one of {list(_ACTION_CODES)}, got {bad}")
    return codes.to_numpy().astype(np.int8)


def _streams(transfer: pa.Array, is_copy: np.ndarray, model: CostModel) -> np.ndarray:
    """Stream rate per row: entry or file rate for a COPY, 0 otherwise; a COPY's transfer must be known."""
    kinds = pa.array([ENTRIES, FILES], type=pa.string())
    codes = pc.index_in(transfer, value_set=kinds).fill_null(-1).to_numpy(zero_copy_only=False)
    bad_rows = is_copy & (codes < 0)
    if bad_rows.any():
        got = sorted({str(v) for v in np.asarray(transfer.to_pylist(), dtype=object)[bad_rows]})
        raise ScheduleInputError(f"transfer of a COPY: expected one of {[ENTRIES, FILES]}, got {got}")
    rates = np.array([model.entry_stream_bytes_per_s, model.file_stream_bytes_per_s])
    return np.where(is_copy, rates[np.maximum(codes, 0)], 0.0)


def _partition_codes(group: pa.Array, pid: pa.Array) -> np.ndarray:
    """Dense codes of ``(group_name, partition_id)`` in ascending order."""
    g_codes = _group_codes(group)
    pids = pid.to_numpy(zero_copy_only=False).astype(np.int64)
    if not len(pids):
        return pids
    span = int(pids.max()) - int(pids.min()) + 1  # partition ids are int32: the key fits in int64
    return event_loop.dense_codes(g_codes * span + (pids - pids.min()))[1]


def _group_codes(group: pa.Array) -> np.ndarray:
    """Codes of ``group_name`` in ascending string order."""
    names = sorted(v for v in pc.unique(group).to_pylist() if v is not None)
    return pc.index_in(group, value_set=pa.array(names, type=pa.string())).to_numpy().astype(np.int64)


def _decode(plan: pa.Table, names: list[str], model: CostModel) -> _Plan:
    """Validate ``plan`` against the input contract and decode it (see :func:`schedule` for the errors)."""
    missing = [c for c in names if c not in plan.column_names]
    if missing:
        raise ScheduleInputError(f"plan lacks columns {missing}; expected at least {names}, got {plan.column_names}")
    cols = _cast_columns(plan, names)
    n = plan.num_rows
    for name in ("migration_id", "group_name", "partition_id", "step", "action", "source_node", "owners", "replicas"):
        if cols[name].null_count:
            raise ScheduleInputError(f"{name}: expected no nulls, got {cols[name].null_count} null(s)")
    action = _actions(cols["action"])
    is_copy = action == A_COPY

    cand = cols["candidates"]
    lengths = pc.list_value_length(cand).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    nodes, (src, tgt, primary, flat_idx) = _node_indices(
        [cols["source_node"], cols["target_node"], cols["primary_node"], cand.flatten()]
    )

    needs_target = action != A_DROP
    if (needs_target & (tgt < 0)).any():
        rows = np.flatnonzero(needs_target & (tgt < 0))[:5].tolist()
        raise ScheduleInputError(f"target_node: expected a node for every COPY and PROMOTE, got null at rows {rows}")
    nbytes_col = cols["bytes"].fill_null(-1).to_numpy().astype(np.int64)
    if (is_copy & (nbytes_col < 0)).any():
        rows = np.flatnonzero(is_copy & (nbytes_col < 0))[:5].tolist()
        raise ScheduleInputError(f"bytes: expected an integer >= 0 for every COPY, got null or negative at rows {rows}")
    stream = _streams(cols["transfer"], is_copy, model)

    # Candidates of the COPYs as sorted distinct (row, node) keys; the pool leaves the target out.
    nn = max(len(nodes), 1)
    cand_row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    keep = is_copy[cand_row] & (flat_idx >= 0)
    keys = event_loop.dense_codes(cand_row[keep] * nn + flat_idx[keep])[0]
    has_src = np.zeros(n, dtype=bool)
    copies = np.flatnonzero(is_copy)
    wanted = copies * nn + src[copies]  # (keys are sorted: a binary search is much faster than np.isin here)
    found = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
    has_src[copies] = keys[found] == wanted if len(keys) else False
    bad = np.flatnonzero(is_copy & (~has_src | (src == tgt)))
    if len(bad):
        i = int(bad[0])
        if src[i] == tgt[i] and has_src[i]:
            raise ScheduleInputError(
                f"row {i}: a COPY's source_node must differ from its target_node; got {nodes[src[i]]!r} for both"
            )
        got = [nodes[int(k % nn)] for k in keys[keys // nn == i]]
        raise ScheduleInputError(
            f"row {i}: a COPY's candidates must be non-empty and contain source_node {nodes[src[i]]!r}; got {got}"
        )
    keys = keys[keys % nn != tgt[keys // nn]]
    pool_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // nn, minlength=n), out=pool_start[1:])

    part = _partition_codes(cols["group_name"], cols["partition_id"])
    step = cols["step"].to_numpy().astype(np.int64)
    order = np.lexsort((step, part)) if n else np.zeros(0, dtype=np.int64)
    sp, ss = part[order], step[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sp[1:] != sp[:-1]
    expected = np.where(first, 1, np.concatenate([[0], ss[:-1] + 1]) if n else ss)
    if n and (ss != expected).any():
        k = int(np.flatnonzero(ss != expected)[0])
        row = int(order[k])
        group = cols["group_name"][row].as_py()
        pid = cols["partition_id"][row].as_py()
        steps = ss[sp == sp[k]].tolist()
        raise ScheduleInputError(
            f"partition ({group!r}, {pid}): steps must be 1..k without gaps or duplicates, got {steps}"
        )
    # Rows renumbered in (group_name, partition_id, step) order, so that every sum over rows (node loads, slack)
    # is taken in one order whatever the order of the plan's rows: the same plan gives the same schedule.
    nxt = np.full(n, -1, dtype=np.int64)
    if n > 1:
        same = sp[1:] == sp[:-1]
        nxt[:-1][same] = np.arange(1, n, dtype=np.int64)[same]
    sizes = np.diff(pool_start)[order]
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    take = np.repeat(pool_start[:-1][order] - starts[:-1], sizes) + np.arange(starts[-1], dtype=np.int64)
    return _Plan(
        n=n,
        nodes=nodes,
        action=action[order],
        src=src[order],
        tgt=tgt[order],
        primary=primary[order],
        pool_node=(keys % nn)[take],
        pool_start=starts,
        nbytes=np.where(is_copy, np.maximum(nbytes_col, 0), 0).astype(np.float64)[order],
        stream=stream[order],
        owners=cols["owners"].to_numpy().astype(np.int64)[order],
        replicas=cols["replicas"].to_numpy().astype(np.int64)[order],
        nxt=nxt,
        part=sp,
        step=ss,
        rows=order.astype(np.int64),
    )


def _solo_durations(p: _Plan, model: CostModel) -> np.ndarray:
    """Each step's duration when it runs alone: ``overhead_s + bytes / min(stream, bw)`` (COPY), else overhead."""
    is_copy = p.action == A_COPY
    rate = np.minimum(p.stream, model.node_bandwidth_bytes_per_s)
    moving = np.divide(p.nbytes, rate, out=np.zeros(p.n), where=is_copy)
    return model.overhead_s + moving


# --- policies -------------------------------------------------------------------------------------------------


def _serial(p: _Plan, solo: np.ndarray) -> _Timetable:
    """``serial``: one step after the other in ``(group_name, partition_id, step)`` order, each alone."""
    end = np.cumsum(solo)
    start = np.concatenate([[0.0], end[:-1]])[: p.n]  # an empty plan has no start, not one
    return _Timetable(start, end, p.src, float(end[-1]) if p.n else 0.0, "serial")


def _positions(p: _Plan) -> np.ndarray:
    """Each row's position in ``(group_name, partition_id, step)`` order: its index (``_decode`` numbers them so)."""
    return np.arange(p.n, dtype=np.int64)


def _urgent(p: _Plan) -> np.ndarray:
    """Rows of partitions that go first: under-replicated (``owners < replicas``) or with one owner."""
    return (p.owners < p.replicas) | (p.owners <= 1)


def _pool_rows(p: _Plan) -> np.ndarray:
    """The row of every entry of ``pool_node``."""
    return np.repeat(np.arange(p.n, dtype=np.int64), np.diff(p.pool_start))


def _hazelcast_sources(p: _Plan) -> np.ndarray:
    """The node each COPY reads from under ``hazelcast``: ``primary_node``, or ``source_node`` when null."""
    return np.where(p.primary >= 0, p.primary, p.src)


def _hazelcast(p: _Plan) -> _Candidate:
    """``hazelcast``: first fit in ``(group_name, partition_id, step)`` order, every COPY from its primary."""
    is_copy = p.action == A_COPY
    source = _hazelcast_sources(p)
    bad = np.flatnonzero(is_copy & (source == p.tgt))
    if len(bad):
        i = int(bad[0])
        raise ScheduleInputError(
            f"row {p.rows[i]}: policy 'hazelcast' has no usable source for the COPY to {p.nodes[p.tgt[i]]!r}: expected "
            f"a supplier other than the target, got {[p.nodes[source[i]]]}"
        )
    pool_start = np.zeros(p.n + 1, dtype=np.int64)
    np.cumsum(is_copy, out=pool_start[1:])
    return _Candidate(rank=_positions(p), pool_node=source[is_copy], pool_start=pool_start, name="hazelcast")


def _portfolio(p: _Plan, model: CostModel, solo: np.ndarray) -> _Timetable:
    """``portfolio``: the shortest of its candidate list schedules (module docstring, "Policies"), the first on a tie.

    A candidate is abandoned as soon as it runs past the shortest makespan so far.
    """
    return _shortest(p, model, solo, _candidates(p, model, solo))


def _candidates(p: _Plan, model: CostModel, solo: np.ndarray) -> list[_Candidate]:
    """``portfolio``'s list schedules, in the order they run (module docstring, "Policies")."""
    loads = _NodeLoads.of(p, model, solo)
    slack = _slack_rank(p, loads)
    out = [_Candidate(slack, p.pool_node, p.pool_start, loads.pinned, loads.limits, "balanced")]
    if p.n < MORE_CANDIDATES_BELOW_STEPS:
        nn, bw = len(p.nodes), model.node_bandwidth_bytes_per_s
        full = np.full(2 * nn, bw)
        filling = _tail_longest_first(p, slack, solo, FILLING_TAIL)
        out.append(_Candidate(filling, p.pool_node, p.pool_start, loads.pinned, full, "filling"))
        spread = _balance(p, model, solo, np.argsort(slack, kind="stable"))
        if spread is not None:
            out.append(_Candidate(_tail_longest_first(p, slack, solo, SPREAD_TAIL), spread.pool_node,
                                  spread.pool_start, loads.pinned, full, "spread"))
        paced = np.concatenate([np.full(nn, _unslowed(p, bw)), np.full(nn, bw)])
        out.append(_Candidate(filling, p.pool_node, p.pool_start, loads.pinned, paced, "paced"))
    bottleneck = _bottleneck_rank(p, loads, solo)
    return [*out, _Candidate(bottleneck, p.pool_node, p.pool_start, loads.pinned, name="bottleneck"), _ordered(p)]


def _unslowed(p: _Plan, bw: float) -> float:
    """The direction limit that slows no transfer below its stream rate: ``bw`` minus the slowest stream of the plan
    (6 entry transfers at the defaults), or ``bw`` without COPYs."""
    is_copy = p.action == A_COPY
    return bw - float(p.stream[is_copy].min()) + _RATE_TOLERANCE if is_copy.any() else bw


def _tail_longest_first(p: _Plan, rank: np.ndarray, solo: np.ndarray, fraction: float) -> np.ndarray:
    """``rank`` with the last ``fraction`` of every node's incoming COPYs (by count, rounded up, in ``rank`` order)
    ranked longest first among the places they hold (module docstring, "Policies": a receiver's last transfers
    short, so that they end close together). COPYs trade places only within one priority class (urgency and
    ``owners``, the rank's first keys), so urgent partitions still go first."""
    rows = np.flatnonzero(p.action == A_COPY)
    if fraction <= 0 or len(rows) == 0:
        return rank
    priority = event_loop.dense_codes(np.where(_urgent(p), 0, 1) + 2 * p.owners.astype(np.int64))[1]
    group = event_loop.dense_codes(p.tgt * (int(priority.max()) + 1) + priority)[1]  # a target and a class
    ordered = rows[np.lexsort((rank[rows], group[rows]))]  # each group's COPYs together, in rank order
    g = group[ordered]
    counts = np.bincount(g)
    first = np.cumsum(counts) - counts
    place = np.arange(len(ordered)) - first[g]
    tail = ordered[place >= counts[g] - np.ceil(counts[g] * fraction)]
    longest_first = tail[np.lexsort((rank[tail], -solo[tail], group[tail]))]
    out = rank.copy()
    out[longest_first] = rank[tail]
    return out


def _shortest(p: _Plan, model: CostModel, solo: np.ndarray, candidates: list[_Candidate]) -> _Timetable:
    """The shortest simulation of ``candidates`` (the first on a tie), each abandoned once past the best so far."""
    best = _simulate(p, model, candidates[0], solo)
    for cand in candidates[1:]:
        run = _simulate(p, model, cand, solo, horizon=best.makespan)
        if run.makespan < best.makespan:
            best = run
    return best


def _balance(p: _Plan, model: CostModel, solo: np.ndarray, order: np.ndarray) -> sources.Balance | None:
    """The linear program of :mod:`rebalancer.planning.sources` for ``p``: balanced sources (given to the COPYs in
    ``order``) and their bound."""
    head, tail, _ = _chain_offsets(p.part, p.step, solo)
    return sources.balance(
        action=p.action, src=p.src, tgt=p.tgt, pool_node=p.pool_node, pool_start=p.pool_start, nbytes=p.nbytes,
        solo=solo, head=head, tail=tail, order=order,
        nn=len(p.nodes), cap=model.max_parallel_per_node, bw=model.node_bandwidth_bytes_per_s,
        overhead=model.overhead_s,
    )


def _ordered(p: _Plan) -> _Candidate:
    """Urgent partitions first, then ``(group_name, partition_id, step)``; a COPY reads from ``hazelcast``'s source
    when that is one of its candidates, else from its first open candidate; slots only."""
    position = _positions(p)
    rank = np.empty(p.n, dtype=np.int64)
    rank[np.lexsort((position, ~_urgent(p)))] = np.arange(p.n, dtype=np.int64)
    rows = _pool_rows(p)
    source = _hazelcast_sources(p)
    own = p.pool_node == source[rows]
    has_own = np.bincount(rows[own], minlength=p.n) > 0
    keep = own | ~has_own[rows]
    pool_start = np.zeros(p.n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=p.n), out=pool_start[1:])
    return _Candidate(rank=rank, pool_node=p.pool_node[keep], pool_start=pool_start, name="ordered")


@dataclass(frozen=True)
class _NodeLoads:
    """What each node must do, whatever the sources (a COPY's source side split evenly over its pool).

    ``rows`` / ``nodes`` / ``use``: every (row, node) incidence and the seconds of the node's dominant resource it
    takes (``dominant``: 0 slots, 1 inbound bandwidth, 2 outbound bandwidth); ``pinned``: per node, the solo time
    of the steps it must host (COPYs it receives, PROMOTEs and DROPs it takes part in); ``load``: per node,
    seconds of its dominant resource; ``limits``: per direction, *balanced*'s admission (:class:`_Candidate`).
    """

    rows: np.ndarray
    nodes: np.ndarray
    use: np.ndarray
    pinned_count: int  # the first incidences are pinned; the rest are pool members
    pinned: np.ndarray
    load: np.ndarray
    limits: np.ndarray

    @classmethod
    def of(cls, p: _Plan, model: CostModel, solo: np.ndarray) -> _NodeLoads:
        """The loads of the nodes of ``p`` under ``model``, ``solo`` being each row's solo duration."""
        nn = len(p.nodes)
        cap, bw = model.max_parallel_per_node, model.node_bandwidth_bytes_per_s
        is_copy = p.action == A_COPY
        on_tgt = np.flatnonzero(is_copy | ((p.action == A_PROMOTE) & (p.tgt != p.src)))
        on_src = np.flatnonzero(~is_copy)
        pool_rows = _pool_rows(p)
        share = 1.0 / np.diff(p.pool_start)[pool_rows]
        rows = np.concatenate([on_tgt, on_src, pool_rows])
        nodes = np.concatenate([p.tgt[on_tgt], p.src[on_src], p.pool_node])
        weight = np.concatenate([np.ones(len(on_tgt) + len(on_src)), share])  # a pool member's share
        slots = solo[rows] * weight / cap
        pinned_count = len(on_tgt) + len(on_src)
        inbound = np.concatenate([p.nbytes[on_tgt], np.zeros(len(on_src) + len(pool_rows))]) / bw  # 0 unless COPY
        outbound = np.concatenate([np.zeros(pinned_count), p.nbytes[pool_rows] * share]) / bw
        per_node = np.stack([np.bincount(nodes, weights=x, minlength=nn) for x in (slots, inbound, outbound)])
        dominant = per_node.argmax(axis=0)
        use = np.stack([slots, inbound, outbound])[dominant[nodes], np.arange(len(rows))]
        pinned = np.bincount(nodes[:pinned_count], weights=solo[rows[:pinned_count]], minlength=nn)
        two_way = (np.bincount(p.tgt[is_copy], minlength=nn) > 0) & (np.bincount(p.pool_node, minlength=nn) > 0)
        limits = np.where(two_way, np.where(dominant > 0, bw, _unslowed(p, bw)), np.inf)
        return cls(rows, nodes, use, pinned_count, pinned.astype(np.float64), per_node.max(axis=0),
                   np.tile(limits, 2))


def _slack_rank(p: _Plan, loads: _NodeLoads) -> np.ndarray:
    """Dispatch rank of *balanced*, ``portfolio``'s first candidate: urgent partitions first, then fewer owners,
    steps without a transfer before COPYs, then the least slack, then ``(group_name, partition_id, step)`` (module
    docstring, "Policies")."""
    position = _positions(p)
    order = np.lexsort((position[loads.rows], loads.nodes))
    before = np.cumsum(loads.use[order]) - loads.use[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = loads.nodes[order][1:] != loads.nodes[order][:-1]
    before -= before[np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
    latest = np.empty(len(order))
    latest[order] = before - loads.load[loads.nodes[order]]  # latest start, up to the constant max(load)
    slack = np.full(p.n, np.inf)
    k = loads.pinned_count
    np.minimum.at(slack, loads.rows[:k], latest[:k])
    relaxed = np.full(p.n, -np.inf)
    np.maximum.at(relaxed, loads.rows[k:], latest[k:])  # a COPY reads from the pool member it has most time on
    slack = np.minimum(slack, np.where(np.isfinite(relaxed), relaxed, np.inf))
    rank = np.empty(p.n, dtype=np.int64)
    rank[np.lexsort((position, slack, p.action == A_COPY, p.owners, ~_urgent(p)))] = np.arange(p.n, dtype=np.int64)
    return rank


def _bottleneck_rank(p: _Plan, loads: _NodeLoads, solo: np.ndarray) -> np.ndarray:
    """Dispatch rank of the *bottleneck* order (module docstring, "Policies"): urgent partitions first, then fewer
    owners, steps without a transfer before COPYs, then the larger bottleneck load, then the longer solo time, then
    ``(group_name, partition_id, step)``. A node's load is the solo time of its pinned steps plus an even share of
    the COPYs it may send; a step's bottleneck load the largest over the nodes it touches, a COPY's source side
    counted at its least loaded candidate."""
    nn = len(p.nodes)
    is_copy = p.action == A_COPY
    rows = _pool_rows(p)
    load = loads.pinned + np.bincount(p.pool_node, weights=solo[rows] / np.diff(p.pool_start)[rows], minlength=nn)
    least = np.full(p.n, np.inf)
    np.minimum.at(least, rows, load[p.pool_node])
    target = np.where(p.tgt >= 0, load[np.maximum(p.tgt, 0)], 0.0)
    bottleneck = np.where(is_copy, np.maximum(target, least), load[p.src])
    promote = p.action == A_PROMOTE
    bottleneck[promote] = np.maximum(load[p.src[promote]], load[p.tgt[promote]])
    rank = np.empty(p.n, dtype=np.int64)
    order = np.lexsort((_positions(p), -solo, -bottleneck, is_copy, p.owners, ~_urgent(p)))
    rank[order] = np.arange(p.n, dtype=np.int64)
    return rank


def _simulate(p: _Plan, model: CostModel, cand: _Candidate, solo: np.ndarray, horizon: float = math.inf) -> _Timetable:
    """Greedy list scheduling of ``p`` under the fluid cost model (module docstring, "Implementation"): at every
    instant the ready steps are offered free slots in ``cand.rank`` order and every one that fits starts.

    Args:
        p: the decoded plan.
        model: the cost model.
        cand: order, sources and admission (:class:`_Candidate`).
        solo: each row's solo duration (what a COPY adds to its source's work).
        horizon: give up, with an infinite makespan, once the simulated time passes this.

    Returns:
        Start, end and source of every row (``source_node`` for PROMOTE and DROP), and the makespan.
    """
    return _Timetable(*event_loop.run(_loop_input(p, model, cand, solo), horizon), name=cand.name)


def _loop_input(p: _Plan, model: CostModel, cand: _Candidate, solo: np.ndarray) -> event_loop.LoopInput:
    """What the event loop reads to simulate candidate ``cand`` of plan ``p``."""
    nn = len(p.nodes)
    is_first = np.ones(p.n, dtype=bool)
    is_first[p.nxt[p.nxt >= 0]] = False
    return event_loop.LoopInput(
        action=p.action, tgt=p.tgt, src=p.src, nxt=p.nxt, rank=cand.rank, pool_node=cand.pool_node,
        pool_start=cand.pool_start, nbytes=p.nbytes, stream=p.stream, solo=solo, first=np.flatnonzero(is_first),
        work=cand.work if cand.work is not None else np.zeros(nn), balanced=cand.work is not None,
        limit=cand.limits if cand.limits is not None else np.full(2 * nn, math.inf),
        lookahead=cand.limits is not None, nn=nn, cap=model.max_parallel_per_node,
        bw=model.node_bandwidth_bytes_per_s, overhead=model.overhead_s, ready_at=cand.ready_at,
    )


def _in_plan_order(p: _Plan, values: np.ndarray) -> np.ndarray:
    """Per-row ``values`` of ``p`` in the plan's row order."""
    out = np.empty_like(np.asarray(values))
    out[p.rows] = values
    return out


def _with_schedule(plan: pa.Table, p: _Plan, run: _Timetable) -> pa.Table:
    """``plan`` with the chosen sources, waves and times (columns replaced in place or appended)."""
    run = _Timetable(_in_plan_order(p, run.start), _in_plan_order(p, run.end), _in_plan_order(p, run.chosen),
                     run.makespan, run.name)
    start = np.asarray(run.start, dtype=np.float64)
    if p.n:
        _, dense = np.unique(np.round(start, _WAVE_DECIMALS), return_inverse=True)
        wave = np.asarray(dense, dtype=np.int64).reshape(-1) + 1
    else:
        wave = np.zeros(0, dtype=np.int64)
    source_field = plan.schema.field("source_node")
    node_ids = pa.array(p.nodes, type=pa.string())
    chosen = pa.array(np.asarray(run.chosen, dtype=np.int64), type=pa.int64())
    sources = pc.take(node_ids, chosen) if p.n else pa.array([], type=pa.string())
    out = plan.set_column(plan.schema.get_field_index("source_node"), source_field, sources.cast(source_field.type))
    values = {
        "wave": pa.array(wave.astype(np.int32), type=pa.int32()),
        "est_start_s": pa.array(start, type=pa.float64()),
        "est_end_s": pa.array(np.asarray(run.end, dtype=np.float64), type=pa.float64()),
    }
    for f in _SCHEDULE_FIELDS:
        idx = out.schema.get_field_index(f.name)
        out = out.append_column(f, values[f.name]) if idx < 0 else out.set_column(idx, f, values[f.name])
    return out
