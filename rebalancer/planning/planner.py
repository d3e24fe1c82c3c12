"""Migration planner stage: the safe per-partition steps from the late assignment to the ideal one (SPEC 4).

Only data-bearing partitions are planned: a partition with no OWNING copy (lost, or nothing to copy from) gets no
step. Unlike Hazelcast, whose partition table always fills seven replica slots and plans a migration for every
slot that shifts, only copies that exist or must exist are touched. Per partition, in ``step`` order:

1. ``COPY`` to every ideal node without an OWNING copy (:func:`rebalancer.exchange.demands.copy_steps`: mode,
   counters, bytes and the supplier pool, by ideal ``replica_index``);
2. ``PROMOTE`` when the serving primary (``affinity_assignment`` replica 0, a temporary primary) is not the ideal
   primary: ``source_node`` the current primary, ``target_node`` the ideal one;
3. ``DROP`` of every copy on a node outside the ideal list (OWNING, MOVING or RENTING), by ``node_id``:
   ``source_node`` the node that drops it, ``target_node`` null.

Why this never lowers a partition's OWNING copies below ``min(current, target)``: COPYs only add owners, a
PROMOTE moves no data, and DROPs come last, when every ideal node owns, so the count after every DROP is at least
the ideal count. ``rebalancer.planning.schedule`` runs the steps of a partition in order.

``transfer``: ``entries`` for HISTORICAL (a WAL replay), ``migration.full_rebalance`` (``entries`` or ``files``)
for FULL; ``chunks`` = ``ceil(bytes / file_chunk_bytes)`` for file transfers (Ignite sends partition files in
page-aligned chunks), null otherwise.

The output also carries what the scheduler needs and the table does not keep (:data:`SCHEDULER_COLUMNS`):
``candidates`` (every owner that may supply a COPY), ``primary_node`` (the serving primary, the Hazelcast
baseline's only supplier), ``owners`` and ``replicas`` (the partition's OWNING copies now and its ideal count).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StringType, StructField, StructType

from rebalancer.config import MigrationSettings
from rebalancer.exchange import demands
from rebalancer.exchange.fullmap import (
    COPY_KEY,
    MAP_SCHEMA,
    OWNING,
    PARTITION_KEY,
    conform,
    require_columns,
    stage_schema,
)
from rebalancer.planning import schedule as scheduling

__all__ = [
    "PLAN_SCHEMA", "SCHEDULED_PLAN_SCHEMA", "SCHEDULER_COLUMNS", "cost_model", "plan_migrations", "schedule_plan",
]

COPY, PROMOTE, DROP = "COPY", "PROMOTE", "DROP"
ENTRIES, FILES = "entries", "files"

SCHEDULER_COLUMNS = StructType(
    [
        StructField("candidates", ArrayType(StringType())),
        StructField("primary_node", StringType()),
        StructField("owners", IntegerType()),
        StructField("replicas", IntegerType()),
    ]
)
# migration_plan without version columns, then the scheduler's inputs.
PLAN_SCHEMA = StructType(
    [f for f in stage_schema("migration_plan").fields if f.name not in SCHEDULER_COLUMNS.names]
    + SCHEDULER_COLUMNS.fields
)
# PLAN_SCHEMA with wave and times filled, plus the plan's makespan lower bound (the same on every row).
SCHEDULED_PLAN_SCHEMA = StructType(PLAN_SCHEMA.fields + [StructField("plan_lower_bound_s", DoubleType())])

_IDEAL_COLUMNS = ["group_name", "partition_id", "replica_index", "node_id"]


def plan_migrations(
    ideal_df: DataFrame,
    assignment_df: DataFrame,
    map_df: DataFrame,
    reports_df: DataFrame,
    *,
    history_threshold: int,
    full_rebalance: str = ENTRIES,
    file_chunk_bytes: int = 4_194_304,
) -> DataFrame:
    """Every step that takes the data-bearing partitions from their current copies to the ideal assignment.

    Args:
        ideal_df: this version's ideal assignment.
        assignment_df: this version's late assignment (replica 0 is the serving primary).
        map_df: this version's final map (after ``demands.add_moving_targets``).
        reports_df: ``partition_reports`` rows, all or each copy's latest (suppliers' WAL history).
        history_threshold: ``rebalance.history_threshold``.
        full_rebalance: ``entries`` or ``files``: how FULL COPYs move data.
        file_chunk_bytes: chunk size of file transfers.

    Returns:
        ``PLAN_SCHEMA`` rows; ``migration_id`` is 1..n in ``(group_name, partition_id, step)`` order; ``wave`` and
        the estimated times are null (``rebalancer.planning.schedule`` fills them).
    """
    require_columns(ideal_df, _IDEAL_COLUMNS, stage="plan_migrations", argument="ideal_df")
    require_columns(assignment_df, _IDEAL_COLUMNS, stage="plan_migrations", argument="assignment_df")
    require_columns(map_df, MAP_SCHEMA.fieldNames(), stage="plan_migrations", argument="map_df")
    if full_rebalance not in (ENTRIES, FILES):
        raise ValueError(f"full_rebalance must be {ENTRIES!r} or {FILES!r}, got {full_rebalance!r}")
    part, key = list(PARTITION_KEY), list(COPY_KEY)
    copies_df = demands.copy_steps(ideal_df, map_df, reports_df, history_threshold)

    # One row per data-bearing partition: owners now, ideal count and primary, serving primary, COPY count.
    facts_df = (
        map_df.groupBy(*part)
        .agg(F.count(F.when(F.col("state") == OWNING, True)).cast("int").alias("owners"))
        .where(F.col("owners") > 0)
        .join(
            ideal_df.groupBy(*part).agg(
                F.count(F.lit(1)).cast("int").alias("replicas"),
                F.min(F.when(F.col("replica_index") == 0, F.col("node_id"))).alias("_ideal_primary"),
            ),
            part,
        )
        .join(
            assignment_df.where(F.col("replica_index") == 0).select(*part, F.col("node_id").alias("primary_node")),
            part,
            "left",
        )
        .join(copies_df.groupBy(*part).agg(F.count(F.lit(1)).cast("int").alias("_copies")), part, "left")
        .withColumn("_copies", F.coalesce(F.col("_copies"), F.lit(0)))
        .withColumn(
            "_promote",
            F.col("primary_node").isNotNull() & (F.col("primary_node") != F.col("_ideal_primary")),
        )
    )
    none_long = F.lit(None).cast("long")
    # What a PROMOTE or a DROP carries in the COPY columns: no mode, counters or candidates, and no bytes.
    no_data = [
        F.lit(None).cast("string").alias("rebalance_mode"),
        none_long.alias("from_counter"),
        none_long.alias("to_counter"),
        F.lit(0).cast("long").alias("bytes"),
        F.lit(None).cast("array<string>").alias("candidates"),
    ]
    promotes_df = facts_df.where("_promote").select(
        *part,
        (F.col("_copies") + 1).alias("step"),
        F.lit(PROMOTE).alias("action"),
        F.col("primary_node").alias("source_node"),
        F.col("_ideal_primary").alias("target_node"),
        *no_data,
    )
    surplus_df = map_df.select(*key).join(ideal_df.select(*key), key, "left_anti")
    drops_df = surplus_df.join(facts_df, part).select(
        *part,
        (
            F.col("_copies")
            + F.col("_promote").cast("int")
            + F.row_number().over(Window.partitionBy(*part).orderBy("node_id"))
        ).alias("step"),
        F.lit(DROP).alias("action"),
        F.col("node_id").alias("source_node"),
        F.lit(None).cast("string").alias("target_node"),
        *no_data,
    )
    steps_df = copies_df.unionByName(promotes_df).unionByName(drops_df).join(
        facts_df.select(*part, "primary_node", "owners", "replicas"), part
    )
    is_copy = F.col("action") == COPY
    transfer = F.when(is_copy & (F.col("rebalance_mode") == demands.HISTORICAL), F.lit(ENTRIES)).when(
        is_copy, F.lit(full_rebalance)
    )
    out_df = (
        steps_df.withColumn("transfer", transfer)
        .withColumn(
            "chunks",
            F.when(F.col("transfer") == FILES, F.ceil(F.col("bytes") / F.lit(file_chunk_bytes)).cast("int")),
        )
        .join(demands.partition_offsets(steps_df), part)
        .withColumn("migration_id", F.col("_offset") + F.col("step"))
    )
    for name in ("wave", "est_start_s", "est_end_s"):
        out_df = out_df.withColumn(name, F.lit(None))
    return conform(out_df, PLAN_SCHEMA)


def cost_model(settings: MigrationSettings) -> scheduling.CostModel:
    """The scheduler's cost model from the ``[migration]`` settings."""
    return scheduling.CostModel(
        max_parallel_per_node=settings.max_parallel_per_node,
        node_bandwidth_bytes_per_s=settings.node_bandwidth_bytes_per_s,
        entry_stream_bytes_per_s=settings.entry_stream_bytes_per_s,
        file_stream_bytes_per_s=settings.file_stream_bytes_per_s,
        overhead_s=settings.overhead_s,
    )


def schedule_plan(plan_df: DataFrame, model: scheduling.CostModel, policy: str = "ours") -> DataFrame:
    """``plan_df`` with ``wave``, ``est_start_s``, ``est_end_s`` and the chosen COPY sources.

    Scheduling is global (the per-node caps couple every partition), so the plan is brought into one task and
    scheduled there with NumPy (``rebalancer.planning.schedule``); nothing goes through the driver. Plans are one
    row per migration step, thousands to a few hundred thousand rows.

    Args:
        plan_df: ``PLAN_SCHEMA`` rows (:func:`plan_migrations`).
        model: the cost model.
        policy: ``ours``, ``hazelcast`` or ``serial``.

    Returns:
        ``SCHEDULED_PLAN_SCHEMA`` rows: the same steps, scheduled, and ``plan_lower_bound_s``.
    """
    require_columns(plan_df, PLAN_SCHEMA.fieldNames(), stage="schedule_plan", argument="plan_df")
    if policy not in scheduling.POLICIES:
        raise ValueError(f"policy must be one of {', '.join(scheduling.POLICIES)}, got {policy!r}")
    names = SCHEDULED_PLAN_SCHEMA.fieldNames()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [b for b in batches if b.num_rows]
        if not received:
            return
        table = pa.Table.from_batches(received)
        scheduled = scheduling.schedule(table, model, policy)
        bound = scheduling.lower_bound(scheduled, model)
        scheduled = scheduled.append_column("plan_lower_bound_s", pa.array([bound] * scheduled.num_rows, pa.float64()))
        yield from scheduled.select(names).to_batches()

    # repartition, not coalesce: coalesce(1) would also run the plan's upstream stages in that one task.
    return conform(plan_df, PLAN_SCHEMA).repartition(1).mapInArrow(run, SCHEDULED_PLAN_SCHEMA)
