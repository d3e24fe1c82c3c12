"""Affinity functions: which nodes hold each partition (ideal assignment), and key -> partition.

This package's kernels are NumPy only (the client imports them); the Spark stage is ``rebalancer.affinity.ideal``.
"""
