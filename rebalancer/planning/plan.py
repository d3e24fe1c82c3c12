"""The migration plan of a version: the kernel's steps with suppliers, bytes and ids (pure pyarrow and NumPy).

The kernel (:mod:`rebalancer.exchange.kernel`) decides each partition's steps and, for every COPY, the *pool* of
owners that may supply it (each with its size and bytes). What couples partitions is settled here, over all the
steps of a version at once, before the scheduler (:mod:`rebalancer.planning.schedule`) runs:

* **Supplier spread** (docs/EXCHANGE.md "Rebalance mode"): COPYs whose pools list the same nodes form a class;
  in ``(group_name, partition_id, target_node)`` order they are numbered 1, 2, ... and COPY number n takes pool
  member ``(n - 1 + p0) mod k`` (0-based, pool sorted by node id), with k the pool size and p0 the smallest
  ``partition_id`` in the class. A class is thus spread round-robin, and small pools do not all start at the
  lowest node id. The scheduler may still pick another member of ``candidates`` when the COPY starts.
* **Bytes**: a FULL COPY moves its supplier's ``bytes``; a HISTORICAL one replays ``to - from`` updates of about
  ``bytes / size`` each: ``max(1, ceil(bytes * (to - from) / size))``. PROMOTE and DROP move 0 bytes.
* **Transfer**: ``entries`` for HISTORICAL, ``migration.full_rebalance`` (``entries`` or ``files``) for FULL; a
  file transfer is sent in ``ceil(bytes / file_chunk_bytes)`` page-aligned chunks.
* **migration_id**: 1..n over the plan in ``(group_name, partition_id, step)`` order.

:func:`schedule_plan` then schedules the finished plan under the cost model and adds the makespan's lower bound.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.config import MigrationSettings
from rebalancer.planning import schedule as scheduling
from rebalancer.vocabulary import COPY, ENTRIES, FILES, HISTORICAL

__all__ = ["PLAN_SCHEMA", "cost_model", "finish_plan", "schedule_plan"]

_log = logging.getLogger(__name__)

#: A finished plan: ``migration_plan`` without version columns (``wave`` and times null until scheduled), plus
#: what the scheduler reads and the table does not keep (``candidates``, ``primary_node``, ``owners``, ``replicas``).
#: The columns the scheduler reads and fills are its own (:data:`rebalancer.planning.schedule.SCHEDULED_SCHEMA`);
#: the others are the planner's.
PLAN_SCHEMA = pa.schema(
    [
        *scheduling.plan_fields("migration_id", "group_name", "partition_id", "step", "action", "source_node",
                                "target_node"),
        ("rebalance_mode", pa.string()),
        ("from_counter", pa.int64()),
        ("to_counter", pa.int64()),
        *scheduling.plan_fields("bytes", "wave", "est_start_s", "est_end_s", "transfer"),
        ("chunks", pa.int32()),
        *scheduling.plan_fields("candidates", "primary_node", "owners", "replicas"),
    ]
)


def cost_model(settings: MigrationSettings) -> scheduling.CostModel:
    """The scheduler's cost model from the ``[migration]`` settings."""
    return scheduling.CostModel(
        max_parallel_per_node=settings.max_parallel_per_node,
        node_bandwidth_bytes_per_s=settings.node_bandwidth_bytes_per_s,
        entry_stream_bytes_per_s=settings.entry_stream_bytes_per_s,
        file_stream_bytes_per_s=settings.file_stream_bytes_per_s,
        overhead_s=settings.overhead_s,
    )


def finish_plan(steps: pa.Table, settings: MigrationSettings) -> pa.Table:
    """Suppliers, bytes, transfer, chunks and ids for every step of a version (module docstring).

    Args:
        steps: every ``steps`` row the kernel decided for the version (any order).
        settings: ``full_rebalance`` and ``file_chunk_bytes`` are read.

    Returns:
        :data:`PLAN_SCHEMA` rows in ``(group_name, partition_id, step)`` order; ``wave`` and times null.
    """
    order = pc.sort_indices(steps, [("group_name", "ascending"), ("partition_id", "ascending"),
                                    ("step", "ascending")])
    steps = steps.take(order)
    n = steps.num_rows
    is_copy = np.asarray(pc.equal(steps.column("action"), COPY).to_numpy(zero_copy_only=False), bool) if n else (
        np.zeros(0, bool))
    pool = steps.column("pool").combine_chunks() if n else pa.array([], pa.list_(pa.string()))
    supplier = _spread(steps, pool, is_copy)
    pool_offsets = np.asarray(pool.offsets.to_numpy(), dtype=np.int64) if n else np.zeros(1, np.int64)
    pick = pool_offsets[:-1] + supplier
    sizes = np.asarray(steps.column("pool_sizes").combine_chunks().flatten().to_numpy(), np.int64) if n else pick
    volumes = np.asarray(steps.column("pool_bytes").combine_chunks().flatten().to_numpy(), np.int64) if n else pick
    pick_c = np.where(is_copy, pick, 0)
    sup_size = np.where(is_copy, sizes[pick_c] if sizes.size else 0, 1)
    sup_bytes = np.where(is_copy, volumes[pick_c] if volumes.size else 0, 0)
    historical = np.asarray(pc.equal(steps.column("rebalance_mode"), HISTORICAL).fill_null(False).to_numpy(
        zero_copy_only=False), bool) if n else is_copy
    gap = (_ints(steps, "to_counter") - _ints(steps, "from_counter")).astype(np.float64)
    replay = np.maximum(1, np.ceil(sup_bytes.astype(np.float64) * gap / np.maximum(sup_size, 1))).astype(np.int64)
    nbytes = np.where(is_copy, np.where(historical, replay, sup_bytes), 0)
    transfer = np.full(n, None, dtype=object)
    transfer[is_copy] = np.where(historical[is_copy], ENTRIES, settings.full_rebalance)
    files = transfer == FILES
    chunks = np.where(files, -(-nbytes // settings.file_chunk_bytes), 0)
    sources = steps.column("source_node").combine_chunks() if n else pa.array([], pa.string())
    flat_pool = pool.flatten()
    if n and is_copy.any():
        chosen = flat_pool.take(pa.array(pick_c))
        sources = pc.if_else(pa.array(is_copy), chosen, sources)
    null_f, null_i = pa.nulls(n, pa.float64()), pa.nulls(n, pa.int32())
    return pa.table(
        {
            "migration_id": pa.array(np.arange(1, n + 1, dtype=np.int64)),
            "group_name": steps.column("group_name"),
            "partition_id": steps.column("partition_id"),
            "step": steps.column("step"),
            "action": steps.column("action"),
            "source_node": sources,
            "target_node": steps.column("target_node"),
            "rebalance_mode": steps.column("rebalance_mode"),
            "from_counter": steps.column("from_counter"),
            "to_counter": steps.column("to_counter"),
            "bytes": pa.array(nbytes, pa.int64()),
            "wave": null_i,
            "est_start_s": null_f,
            "est_end_s": null_f,
            "transfer": pa.array(transfer.tolist(), pa.string()),
            "chunks": pa.array(chunks, pa.int32(), mask=~files),
            "candidates": pa.ListArray.from_arrays(pool.offsets, flat_pool, mask=pa.array(~is_copy))
            if n else pa.array([], pa.list_(pa.string())),
            "primary_node": steps.column("primary_node"),
            "owners": steps.column("owners"),
            "replicas": steps.column("replicas"),
        },
        schema=PLAN_SCHEMA,
    )


def _ints(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(pc.fill_null(t.column(name), 0).to_numpy(zero_copy_only=False), np.int64)


def _spread(steps: pa.Table, pool: pa.ListArray, is_copy: np.ndarray) -> np.ndarray:
    """0-based index into each COPY's pool of its supplier (0 for other steps)."""
    n = steps.num_rows
    out = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(is_copy)
    if rows.size == 0:
        return out
    # A class is the exact list of pool node ids; encode it as one string to group by.
    classes = pc.binary_join(pool.take(pa.array(rows)), "\x00")
    class_id = np.asarray(pc.index_in(classes, value_set=pc.unique(classes)).to_numpy(), np.int64)
    groups = steps.column("group_name").take(pa.array(rows))
    group_rank = np.asarray(pc.rank(groups, sort_keys="ascending", tiebreaker="dense").to_numpy(), np.int64)
    pid = np.asarray(steps.column("partition_id").take(pa.array(rows)).to_numpy(), np.int64)
    targets = steps.column("target_node").take(pa.array(rows))
    target_rank = np.asarray(pc.rank(targets, sort_keys="ascending", tiebreaker="dense").to_numpy(), np.int64)
    order = np.lexsort((target_rank, pid, group_rank, class_id))
    cls = class_id[order]
    first = np.r_[0, np.flatnonzero(cls[1:] != cls[:-1]) + 1]
    ordinal = np.arange(rows.size) - np.repeat(first, np.diff(np.r_[first, rows.size]))
    p0 = np.minimum.reduceat(pid[order], first)
    k = np.diff(pool.offsets.to_numpy())[rows][order]
    out[rows[order]] = (ordinal + np.repeat(p0, np.diff(np.r_[first, rows.size]))) % k
    return out


def schedule_plan(plan: pa.Table, settings: MigrationSettings, policy: str = "portfolio") -> tuple[pa.Table, float]:
    """Schedule a finished plan under the cost model of ``settings``.

    Args:
        plan: :func:`finish_plan`'s result.
        settings: the ``[migration]`` settings (cost model and cap).
        policy: ``portfolio``, ``hazelcast`` or ``serial`` (see :mod:`rebalancer.planning.schedule`).

    Returns:
        The plan with sources chosen and ``wave``, ``est_start_s``, ``est_end_s`` set, and the lower bound of its
        makespan (0.0 for an empty plan). How it was scheduled (the winning candidate, the seconds in CP-SAT for a
        small plan: :class:`rebalancer.planning.schedule.ScheduleStats`) is logged at INFO.
    """
    if plan.num_rows == 0:
        return plan, 0.0
    model = cost_model(settings)
    scheduled, stats = scheduling.schedule_with_stats(plan, model, policy)
    # The bound costs a linear program: taken from the scheduler where its passes computed it.
    bound = stats.lower_bound_s if stats.lower_bound_s is not None else scheduling.lower_bound(scheduled, model)
    _log.info("scheduled %d steps by %s (%s): makespan %.3f s, bound %.3f s; greedy %.3f s%s", plan.num_rows,
              stats.policy, stats.chosen, stats.makespan_s, bound, stats.greedy_makespan_s,
              f"; CP-SAT {stats.solver_status} in {stats.solver_seconds:.2f} s ({stats.solver_deterministic_time:.2f}"
              " deterministic)" if stats.solver_status else "")
    return scheduled.select(PLAN_SCHEMA.names).cast(PLAN_SCHEMA), bound
