"""Group stamps (SPEC 4 "Versions and stamps", exact): one hash of every partition version of a group.

Hazelcast's "parallel independent migrations" replaced one global partition-table version by a version per
partition; a member compares stamps (a hash of every partition's version) to know whether its table is current
without comparing the whole table. The kernel decides each partition's version (+1 when its serving set of nodes
or its primary changes); this module hashes them:

``stamp = mmh3.hash64(concat(4-byte big-endian signed version for p in 0..P-1), seed=0)[0]``, the first signed
64-bit half of MurmurHash3 x64_128. A partition without a version row counts as version 0.

Pure NumPy and pyarrow: a group's versions are one dense vector (at most 65,536 entries), hashed on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["STAMPS_SCHEMA", "group_stamp", "stamps_of"]

STAMPS_SCHEMA = pa.schema([("group_name", pa.string()), ("stamp", pa.int64())])


def group_stamp(versions: np.ndarray) -> int:
    """The stamp of one group from its partitions' versions in partition order (index = partition_id)."""
    payload = np.asarray(versions, dtype=np.int64).astype(">i4").tobytes()
    return int(mmh3.hash64(payload, seed=0, signed=True)[0])


def stamps_of(versions: pa.Table, partitions: Mapping[str, int]) -> pa.Table:
    """The stamp of every group of ``partitions`` from its ``partition_versions`` rows.

    Args:
        versions: ``group_name``, ``partition_id``, ``partition_version`` rows (other groups are ignored).
        partitions: partition count per group to stamp.

    Returns:
        :data:`STAMPS_SCHEMA` rows, one per group of ``partitions``, by group name.
    """
    names = sorted(partitions)
    group = np.asarray(pc.index_in(versions.column("group_name"), value_set=pa.array(names, pa.string()))
                       .fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    pid = np.asarray(versions.column("partition_id").to_numpy(zero_copy_only=False), np.int64)
    value = np.asarray(versions.column("partition_version").to_numpy(zero_copy_only=False), np.int64)
    keep = group >= 0
    group, pid, value = group[keep], pid[keep], value[keep]
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(names) + 1))
    stamps = []
    for i, name in enumerate(names):
        rows = order[bounds[i]:bounds[i + 1]]
        dense = np.zeros(partitions[name], dtype=np.int64)
        dense[pid[rows]] = value[rows]
        stamps.append(group_stamp(dense))
    return pa.table({"group_name": names, "stamp": stamps}, schema=STAMPS_SCHEMA)
