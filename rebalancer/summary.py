"""Small read-only summaries for people: how a cluster's data spreads over its nodes.

Arrow on the driver: their inputs are a cluster's reports and ideal placement, their results one row per node, and
the CLI only prints them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from rebalancer.vocabulary import MOVING, OWNING

__all__ = ["NODE_LOAD", "node_load"]

NODE_LOAD = pa.schema([("node_id", pa.string()), ("replicas", pa.int64()), ("primaries", pa.int64()),
                       ("bytes", pa.int64())])


def node_load(reports: pa.Table, assignment: pa.Table) -> pa.Table:
    """Replicas, primaries and bytes held per node.

    Args:
        reports: ``partition_reports`` rows (latest per copy); only OWNING and MOVING copies count.
        assignment: ``(group_name, partition_id, replica_index, node_id)``; ``replica_index`` 0 is the primary.

    Returns:
        One row per node with a copy, schema :data:`NODE_LOAD`, by node id.
    """
    held = reports.filter(pc.is_in(reports.column("state"), pa.array([OWNING, MOVING])))
    load = held.group_by("node_id").aggregate([("node_id", "count"), ("bytes", "sum")])
    primaries = assignment.filter(pc.equal(assignment.column("replica_index"), 0)) \
        .group_by("node_id").aggregate([("node_id", "count")])
    counted = dict(zip(primaries.column("node_id").to_pylist(), primaries.column("node_id_count").to_pylist(),
                       strict=True))
    nodes = load.column("node_id")
    return pa.table({
        "node_id": nodes,
        "replicas": load.column("node_id_count").cast(pa.int64()),
        "primaries": pa.array([counted.get(n, 0) for n in nodes.to_pylist()], pa.int64()),
        "bytes": load.column("bytes_sum").cast(pa.int64()),
    }, schema=NODE_LOAD).sort_by("node_id")
