"""Ideal assignment for clients: which nodes hold each partition, with no Spark (see
:mod:`rebalancer.affinity.assign`, whose functions this module re-exports for the client package)."""

from __future__ import annotations

from rebalancer.affinity.assign import (
    InvalidGroupSettingsError,
    assign,
    assign_indexes,
    normalise_affinity,
    normalise_mode,
)
from rebalancer.vocabulary import AFFINITIES, MAX_PARTITIONS, MODES

__all__ = [
    "AFFINITIES",
    "MAX_PARTITIONS",
    "MODES",
    "InvalidGroupSettingsError",
    "assign",
    "assign_indexes",
    "normalise_affinity",
    "normalise_mode",
]
