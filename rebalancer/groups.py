"""A cache group's settings, typed: one ``cache_groups`` row with SPEC's null defaults applied, in one place.

Contract (SPEC section 2, ``cache_groups``): :meth:`GroupSettings.from_row` is the only place that reads a row's
settings and resolves its nulls: ``mode`` null = PARTITIONED, ``affinity`` null = rendezvous, ``exclude_neighbors``
null = false, ``backup_filter`` null = none, ``loss_policy`` null = READ_WRITE_SAFE, ``persistent`` null = true,
``partitioner`` null = ``ignite`` for the ignite affinity, else ``murmur3``. Every stage that needs a group's
settings (the exchange kernel, the affinity functions, the balanced placement, client routing, explain, balance)
takes the :class:`GroupSettings` built once from the row and applies no default of its own.

``from_row`` also refuses what no stage could act on (a missing name, partitions outside 1..65536, negative
backups, an unknown mode or affinity) with :class:`InvalidGroupSettingsError` naming the group. Input validation
(:mod:`rebalancer.validation`) rejects those rows before an exchange reads them, so for the rows an exchange
consumes it never raises; a row handed in from elsewhere (a Spark stage's input, a test) is checked here.

Plain Python over :mod:`rebalancer.vocabulary`: no NumPy, no pyarrow, no pyspark (the pure client imports it).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from rebalancer.vocabulary import (
    AFFINITIES,
    BACKUP_FILTER_DEFAULT,
    DEFAULT_PARTITIONER,
    IGNITE_AFFINITY,
    MAX_PARTITIONS,
    MODES,
    PARTITIONED,
    READ_WRITE_SAFE,
    RENDEZVOUS,
    REPLICATED,
)

__all__ = [
    "GroupSettings",
    "InvalidGroupSettingsError",
    "group_settings",
    "normalise_affinity",
    "normalise_mode",
    "resolve_partitioner",
]


class InvalidGroupSettingsError(ValueError):
    """A cache group's settings are outside the contract; the message names the value and what is allowed."""


def _one_of(what: str, value: str | None, allowed: Sequence[str], default: str) -> str:
    """``value``, or ``default`` for null; :class:`InvalidGroupSettingsError` for a value outside ``allowed``."""
    if value is None:
        return default
    if value not in allowed:
        raise InvalidGroupSettingsError(f"{what} {value!r} is not one of {', '.join(allowed)} (or null)")
    return value


def normalise_affinity(value: str | None) -> str:
    """SPEC default: null affinity = ``rendezvous``. Raises :class:`InvalidGroupSettingsError` for other values."""
    return _one_of("affinity", value, AFFINITIES, RENDEZVOUS)


def normalise_mode(value: str | None) -> str:
    """SPEC default: null mode = ``PARTITIONED``. Raises :class:`InvalidGroupSettingsError` for other values."""
    return _one_of("mode", value, MODES, PARTITIONED)


def resolve_partitioner(partitioner: str | None, affinity: str | None) -> str:
    """A group's key partitioner with the SPEC default applied.

    Args:
        partitioner: ``cache_groups.partitioner`` (``murmur3`` | ``ignite`` | ``hazelcast`` | None, any case).
        affinity: ``cache_groups.affinity`` (``rendezvous`` | ``ignite`` | None, any case).

    Returns:
        The lower-case partitioner name: ``partitioner`` when set, else ``ignite`` for the ``ignite`` affinity,
        else ``murmur3``.
    """
    if partitioner is not None:
        return partitioner.strip().lower()
    if affinity is not None and affinity.strip().lower() == IGNITE_AFFINITY:
        return IGNITE_AFFINITY
    return DEFAULT_PARTITIONER


@dataclass(frozen=True)
class GroupSettings:
    """One cache group's settings, nulls resolved to SPEC's defaults (module docstring).

    Attributes:
        name: ``group_name``.
        partitions: partition count; partition ids are ``0 .. partitions - 1``.
        backups: backups per partition (ignored for REPLICATED).
        mode: ``PARTITIONED`` or ``REPLICATED``.
        affinity: ``rendezvous``, ``ignite`` or ``balanced``.
        exclude_neighbors: keep replicas on distinct hosts where possible.
        backup_filter: attribute names replicas must differ in (a list given is kept as a tuple).
        loss_policy: ``READ_WRITE_SAFE``, ``READ_ONLY_SAFE`` or ``IGNORE``.
        persistent: placed over the baseline topology when one is set.
        partitioner: the key partitioner clients route with (``murmur3``, ``ignite`` or ``hazelcast``); left
            empty, SPEC's default for ``affinity`` (:func:`resolve_partitioner`).
    """

    name: str
    partitions: int
    backups: int
    mode: str = PARTITIONED
    affinity: str = RENDEZVOUS
    exclude_neighbors: bool = False
    backup_filter: tuple[str, ...] = BACKUP_FILTER_DEFAULT
    loss_policy: str = READ_WRITE_SAFE
    persistent: bool = True
    partitioner: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backup_filter", tuple(self.backup_filter))
        if not self.partitioner:
            object.__setattr__(self, "partitioner", resolve_partitioner(None, self.affinity))

    @property
    def replicated(self) -> bool:
        """True for a REPLICATED group: every node holds every partition."""
        return self.mode == REPLICATED

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> GroupSettings:
        """A ``cache_groups`` row (a mapping; absent keys read as null) with SPEC's defaults for its nulls.

        Raises:
            InvalidGroupSettingsError: no group name, partitions outside 1..65536, negative or missing backups, an
                unknown mode or affinity. The message names the group.
        """
        name = row.get("group_name")
        if not isinstance(name, str) or not name:
            raise InvalidGroupSettingsError(f"cache group without a group_name: {row!r}")
        partitions, backups = row.get("partitions"), row.get("backups")
        try:
            if not _is_int(partitions) or not 1 <= partitions <= MAX_PARTITIONS:
                raise InvalidGroupSettingsError(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions!r}")
            if not _is_int(backups) or backups < 0:
                raise InvalidGroupSettingsError(f"backups must be >= 0, got {backups!r}")
            mode = normalise_mode(row.get("mode"))
            affinity = normalise_affinity(row.get("affinity"))
        except InvalidGroupSettingsError as exc:
            raise InvalidGroupSettingsError(f"cache group {name!r}: {exc}") from None
        return cls(
            name=name,
            partitions=int(partitions),
            backups=int(backups),
            mode=mode,
            affinity=affinity,
            exclude_neighbors=bool(row.get("exclude_neighbors")),
            backup_filter=tuple(row.get("backup_filter") or BACKUP_FILTER_DEFAULT),
            loss_policy=row.get("loss_policy") or READ_WRITE_SAFE,
            persistent=row.get("persistent") is not False,
            partitioner=resolve_partitioner(row.get("partitioner"), affinity),
        )


def _is_int(value: object) -> TypeGuard[int]:
    """An integer of any integer type (Python's, NumPy's)."""
    return isinstance(value, numbers.Integral)


def group_settings(rows: Iterable[Mapping[str, Any]]) -> dict[str, GroupSettings]:
    """Each row's :class:`GroupSettings` by group name (:meth:`GroupSettings.from_row`; a later row of a name
    replaces an earlier one).

    Raises:
        InvalidGroupSettingsError: a row's settings are outside the contract (names the group).
    """
    out: dict[str, GroupSettings] = {}
    for row in rows:
        settings = GroupSettings.from_row(row)
        out[settings.name] = settings
    return out
