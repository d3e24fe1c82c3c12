"""Ideal assignment for clients: which nodes hold each partition, with no Spark (see
:mod:`rebalancer.affinity.assign` and :mod:`rebalancer.affinity.balanced`, whose functions this module re-exports
for the client package). A group's settings are a :class:`GroupSettings` (``GroupSettings.from_row`` reads a
``cache_groups`` row). ``balanced`` groups are placed together: :func:`assign_balanced` with every balanced group
of the cluster and the engine's ``affinity.balanced_spread``, continuing from the previous placement
(``PreviousPlacement.from_lists``, e.g. the ideal lists of the version before) as the exchange does."""

from __future__ import annotations

from rebalancer.affinity.assign import (
    InvalidGroupSettingsError,
    assign,
    assign_indexes,
    normalise_affinity,
    normalise_mode,
)
from rebalancer.affinity.balanced import (
    BalancedPlacement,
    PreviousPlacement,
    assign_balanced,
    place_balanced,
)
from rebalancer.affinity.nodeset import NodeSet
from rebalancer.groups import GroupSettings, group_settings
from rebalancer.vocabulary import AFFINITIES, MAX_PARTITIONS, MODES

__all__ = [
    "AFFINITIES",
    "MAX_PARTITIONS",
    "MODES",
    "BalancedPlacement",
    "GroupSettings",
    "InvalidGroupSettingsError",
    "NodeSet",
    "PreviousPlacement",
    "assign",
    "assign_balanced",
    "assign_indexes",
    "group_settings",
    "normalise_affinity",
    "normalise_mode",
    "place_balanced",
]
