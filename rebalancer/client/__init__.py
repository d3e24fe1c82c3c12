"""rebalancer's client: pure-Python routing of keys to partitions and nodes, with no Spark import.

A service that only needs to know where a key lives imports this package; it pulls in the standard library,
NumPy and ``mmh3`` only (``tests/test_client.py`` checks that ``pyspark``, ``pyarrow`` and ``pandas`` stay out of
``sys.modules``). Keep it that way: anything added here must import lazily whatever is heavier than that.

Contents:
- :func:`partition_of` -- key -> partition, the exact SPEC partitioners (``murmur3``, ``ignite``, ``hazelcast``).
"""

from __future__ import annotations

from rebalancer.client.partition import key_hash, partition_of

__all__ = ["key_hash", "partition_of"]

# Ideal assignment (which nodes hold each partition), the same NumPy kernels as the Spark stage.
from rebalancer.client.affinity import assign  # noqa: E402

__all__ += ["assign"]
