"""Errors raised by the storage module.

Every error is a :class:`StorageError`, so a caller (the CLI, a job) can catch one type and print the message.
Each message is one sentence that names the table and says what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ConcurrentWriteError",
    "DuplicateKeyError",
    "EngineUnavailableError",
    "InvalidArgumentError",
    "SchemaMismatchError",
    "StorageError",
    "TableNotFoundError",
    "UnknownTableError",
    "UnsupportedTableError",
    "VersionNotFoundError",
    "WhereMismatchError",
]


class StorageError(Exception):
    """Base class of every error raised by :mod:`rebalancer.storage`."""


class EngineUnavailableError(StorageError):
    """The configured storage engine cannot run in this Spark session (for example no Delta jars)."""


class UnknownTableError(StorageError, KeyError):
    """A table name is not part of the contract or is not a valid identifier."""

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""


class TableNotFoundError(StorageError):
    """The table does not exist in the warehouse yet."""


class VersionNotFoundError(StorageError):
    """Time travel asked for a table version that does not exist."""


class SchemaMismatchError(StorageError, ValueError):
    """A DataFrame or a stored table does not fit the table's schema (missing columns, narrowing types)."""


class InvalidArgumentError(StorageError, ValueError):
    """A ``where`` mapping or merge keys do not fit the table (unknown columns, empty, unsupported values)."""


class WhereMismatchError(StorageError, ValueError):
    """``replace_where`` was given rows that do not satisfy its own ``where`` (they would survive a re-run)."""


class DuplicateKeyError(StorageError, ValueError):
    """The source of a merge holds more than one row for one key, so the upsert is ambiguous."""


class UnsupportedTableError(StorageError):
    """The table uses a Delta feature (or a location) the chosen engine cannot read or write correctly."""


class ConcurrentWriteError(StorageError):
    """A write kept losing commit races with other writers until ``storage.commit_retries`` was exhausted."""
