"""rebalancer: partition map exchange, late affinity and migration plans as batch Spark jobs over Delta tables.

Importing the package imports no Spark: ``rebalancer.client`` and ``rebalancer.hashing`` work without it.
"""

__version__ = "0.2.0"
