"""Every write of one version: the versioned tables, the group stamps from the versions written, and last the
``exchanges`` row, the moment the version starts to exist for readers.

The versioned tables are independent commits (up to ``storage.concurrent_commits`` at once). A re-run after a
crash recomputes the same version from the same inputs and replaces the partial rows; of two runs racing for the
same version, the second to commit its ``exchanges`` row fails with :class:`ExchangeConflictError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.exchange.events import ExchangeStep
from rebalancer.exchange.stamps import STAMPS_SCHEMA, stamps_of
from rebalancer.groups import GroupSettings
from rebalancer.stages.meter import Meter
from rebalancer.stages.rows import Decided, Rows, arrow_schema, version_tables, versioned_arrow
from rebalancer.storage import Warehouse
from rebalancer.tables import EXCHANGES, TOPOLOGY, version_where
from rebalancer.vocabulary import NONE

__all__ = ["ExchangeConflictError", "commit_exchange_row", "write_version"]

class ExchangeConflictError(RuntimeError):
    """Another exchange committed the same topology version first."""


def write_version(rows: Rows[Any], decided: Decided[Any] | None, small_tables: Mapping[str, pa.Table],
                  step: ExchangeStep, plan: pa.Table, groups: Sequence[GroupSettings], replicas: int,
                  meter: Meter, hook: Callable[[str], None]) -> None:
    """Write every versioned table of ``step``'s version: the large ones from the decided and the carried rows,
    the client routing maps (recomputed when a partition or the running groups changed, else carried), the small
    ones (``small_tables``, and the plan) and the stamps. ``groups``: the running groups; ``replicas``: the
    version's copies, a size hint."""
    previous, scope, sizes = rows.previous, rows.scope, rows.sizes
    warehouse = previous.warehouse
    version = (step.major, step.minor)
    where = version_where(version)
    repeat = step.exchange_type == NONE and previous.committed is not None  # clients only: the same decisions

    def small(name: str, table: pa.Table) -> pa.Table:
        return versioned_arrow(previous.arrow(name) if repeat else table, name, version)

    touched = scope.touched_groups(frozenset(sizes))
    tables: dict[str, Any] = {"topology": pa.Table.from_pylist(
        [{"topology_major": version[0], "topology_minor": version[1], "node_id": n, "node_order": i.node_order,
          "is_client": i.is_client} for n, i in sorted(step.alive.items())],
        schema=arrow_schema(TOPOLOGY))}
    tables.update(version_tables(rows, decided, version))
    with meter.stage("routing"):
        if touched or previous.committed is None or step.groups != previous.committed.state.groups:
            routes = rows.client_affinity(tables["affinity_assignment"], groups)
        else:
            routes = rows.read("client_affinity")
        tables["client_affinity"] = rows.versioned(routes, "client_affinity", version)
    with meter.stage("writes"):
        for name in ("counter_conflicts", "lost_partitions"):
            tables[name] = small(name, small_tables[name])
        tables["migration_plan"] = small("migration_plan", plan)
        warehouse.replace_where_many(tables, where, committed=lambda name: hook(f"after:{name}"),
                                     rows_hint=4 * replicas)  # ideal, assignment, map; versions and routing
    with meter.stage("stamps"):
        parts = []
        if touched:
            written = rows.written(tables["partition_versions"], "partition_versions", version,
                                   ["group_name", "partition_id", "partition_version"], sorted(touched))
            parts.append(stamps_of(written, {g: sizes[g] for g in touched}))
        rest = sorted(set(sizes) - touched)
        if rest and previous.committed is not None:
            old = previous.of_groups("partition_stamps", rest)
            parts.append(old.select(["group_name", "stamp"]).cast(STAMPS_SCHEMA))
        stamps = pa.concat_tables(parts) if parts else STAMPS_SCHEMA.empty_table()
        warehouse.replace_where_arrow("partition_stamps", small("partition_stamps", stamps), where)
        hook("after:partition_stamps")


def commit_exchange_row(warehouse: Warehouse, row: Mapping[str, Any]) -> None:
    """Commit the ``exchanges`` row, the moment the version starts to exist; detect a rival's commit."""
    warehouse.insert_absent_arrow("exchanges", pa.Table.from_pylist([dict(row)], schema=arrow_schema(EXCHANGES)),
                                  ["exchange_id"])
    committed = warehouse.read_arrow("exchanges", where={"exchange_id": row["exchange_id"]}).to_pylist()
    started: datetime = row["started_at"]
    if len(committed) != 1 or abs(committed[0]["started_at"].timestamp() - started.timestamp()) > 1e-6:
        raise ExchangeConflictError(
            f"exchange {row['exchange_id']} (version {row['topology_major']}.{row['topology_minor']}) was committed "
            "by another run while this one worked; nothing was duplicated, run `rebalancer exchange` again to "
            "continue")


def plan_figures(plan: pa.Table, bound: float) -> dict[str, Any]:
    """The plan's counts and times an ``exchanges`` row records."""
    return {
        "migrations": plan.num_rows,
        "bytes_to_move": int(pc.sum(plan.column("bytes")).as_py() or 0) if plan.num_rows else 0,
        "makespan_s": float(pc.max(plan.column("est_end_s")).as_py() or 0.0) if plan.num_rows else 0.0,
        "makespan_lower_bound_s": float(bound),
    }
