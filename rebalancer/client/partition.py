"""Key -> partition for routing single keys from plain Python (no Spark, no Arrow, no pandas).

This is the client-facing name for the exact partitioners of SPEC section 4 ("Key -> partition"). It re-exports
the scalar functions of :mod:`rebalancer.affinity.partitioners` rather than re-implementing them, so the engine's
Spark/NumPy paths and a client can never disagree: the engine's tests prove the array kernels equal these scalars.

Importing this module imports only the standard library, NumPy and ``mmh3``; ``pyarrow`` is imported only if a
caller hands :func:`rebalancer.affinity.partitioners.partitions_of` a string array, which this module does not.

Example:
    >>> from rebalancer.client import partition_of
    >>> partition_of("user-42", 1024)  # murmur3, the default
    720
    >>> partition_of(42, 271, "hazelcast")  # a Java Integer key on a default Hazelcast cluster
    175
    >>> partition_of(42, 1024, "ignite", int_type="long")  # a Java Long key on Ignite
    42
"""

from __future__ import annotations

from rebalancer.affinity.partitioners import (
    DEFAULT_PARTITIONER,
    HAZELCAST_DEFAULT_PARTITIONS,
    IGNITE_DEFAULT_PARTITIONS,
    PARTITIONERS,
    IntType,
    Key,
    Partitioner,
    key_hash,
    partition_of,
)

__all__ = [
    "DEFAULT_PARTITIONER",
    "HAZELCAST_DEFAULT_PARTITIONS",
    "IGNITE_DEFAULT_PARTITIONS",
    "PARTITIONERS",
    "IntType",
    "Key",
    "Partitioner",
    "key_hash",
    "partition_of",
]
