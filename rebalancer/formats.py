"""The warehouse's format: which version of the table contract its tables follow, and the check every command makes.

A *format* is one version of ``tables.SCHEMAS``. Each release that changed a table (a column or a table added) made a
new one; :data:`FORMATS` lists them all, oldest first, with what each added (docs/STORAGE.md "Formats"). Since
format 9 a warehouse records its format in the ``warehouse_format`` table, one row per creation or upgrade; a
warehouse written before that records nothing and is recognised by its columns (:func:`stored_format`).

:func:`require_current` is what every command but ``init``, ``generate`` and ``upgrade`` does on opening a warehouse:
no warehouse at the path, an earlier format, or a later one each stop the command with one sentence, before
anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from rebalancer import __version__
from rebalancer.storage import Warehouse
from rebalancer.tables import INPUT_TABLES, OUTPUT_TABLES, SCHEMAS, WAREHOUSE_FORMAT

__all__ = [
    "CURRENT_FORMAT",
    "FORMATS",
    "Format",
    "WarehouseFormatError",
    "WarehouseMissingError",
    "WarehouseOutdatedError",
    "WarehouseTooNewError",
    "create_warehouse",
    "record_format",
    "require_current",
    "stored_format",
]


@dataclass(frozen=True)
class Format:
    """One version of the table contract.

    Attributes:
        number: 1, 2, ... in the order they were released.
        added_columns: table -> the columns this format added to it (to tables earlier formats already had).
        added_tables: the tables this format added.
        summary: what it added, for docs and ``upgrade --dry-run``.
    """

    number: int
    added_columns: dict[str, tuple[str, ...]]
    added_tables: tuple[str, ...]
    summary: str


FORMATS: tuple[Format, ...] = (
    Format(1, {}, (*INPUT_TABLES, *(t for t in OUTPUT_TABLES if t != "what_if")),
           "the first release's tables"),
    Format(2, {"migration_plan": ("transfer", "chunks")}, (),
           "migration_plan: how a COPY moves its data (transfer, chunks)"),
    Format(3, {"exchanges": ("input_versions", "stage_seconds", "spark_jobs"),
               "partition_map": ("wal_history_counter",)}, (),
           "exchanges: the input versions consumed and the stage timings; partition_map: the WAL history"),
    Format(4, {"migration_plan": ("candidates", "primary_node", "owners", "replicas")}, (),
           "migration_plan: what the scheduler decided from (candidates, primary_node, owners, replicas)"),
    Format(5, {"exchanges": ("stage_jobs",)}, (), "exchanges: the Spark jobs per stage"),
    Format(6, {"exchanges": ("baseline_nodes", "cluster_active", "draining_nodes", "last_node_event_at",
                             "baseline_adjust_due")}, (),
           "exchanges: the baseline, activation and drain state"),
    Format(7, {}, ("what_if",), "the what_if table"),
    Format(8, {"what_if": ("lost_by_policy",)}, (), "what_if: lost partitions by loss policy"),
    Format(9, {}, ("warehouse_format",), "the warehouse_format table: the warehouse records its format"),
)
CURRENT_FORMAT = FORMATS[-1].number


class WarehouseFormatError(RuntimeError):
    """The warehouse cannot be used by this command as it is (the message says why, in one sentence)."""


class WarehouseMissingError(WarehouseFormatError):
    """There is no warehouse at the path."""


class WarehouseOutdatedError(WarehouseFormatError):
    """The warehouse was written in an earlier format: ``rebalancer upgrade`` brings it to this release's."""


class WarehouseTooNewError(WarehouseFormatError):
    """The warehouse was written by a later release, in a format this release does not know."""


def _columns(number: int) -> dict[str, set[str]]:
    """Every table of format ``number`` and its columns."""
    out: dict[str, set[str]] = {}
    for f in FORMATS[:number]:
        for table in f.added_tables:
            later = {c for g in FORMATS[number:] for c in g.added_columns.get(table, ())}
            out[table] = {c for c in SCHEMAS[table].fieldNames() if c not in later}
    return out


def recorded_format(warehouse: Warehouse) -> tuple[int, str] | None:
    """The newest format row of ``warehouse_format`` (format, release), or None when there is none."""
    if not warehouse.exists("warehouse_format"):
        return None
    rows = warehouse.read_arrow("warehouse_format").to_pylist()
    if not rows:
        return None
    newest = max(rows, key=lambda r: (r["format"], r["written_at"]))
    return int(newest["format"]), str(newest["release"])


def stored_format(warehouse: Warehouse) -> int | None:
    """The warehouse's format: the one it records, else the newest whose tables and columns it all has.

    Returns:
        None when no table of the contract exists at the warehouse's location (there is no warehouse there).
    """
    recorded = recorded_format(warehouse)
    return recorded[0] if recorded is not None else _format_by_columns(warehouse)


def _format_by_columns(warehouse: Warehouse) -> int | None:
    """The newest format whose every table and column the warehouse has (None: it has no table at all)."""
    present = {name: set(warehouse.stored_columns(name)) for name in SCHEMAS if warehouse.exists(name)}
    if not present:
        return None
    found = 1
    for f in FORMATS:
        if all(t in present and cols <= present[t] for t, cols in _columns(f.number).items()):
            found = f.number
    return found


def require_current(warehouse: Warehouse) -> None:
    """Stop unless the warehouse exists in this release's format; reads only, writes nothing.

    Raises:
        WarehouseMissingError: no warehouse at the location.
        WarehouseOutdatedError: an earlier format (the message lists what ``rebalancer upgrade`` will add).
        WarehouseTooNewError: a later format (the message names the release that wrote it).
    """
    recorded = recorded_format(warehouse)
    if recorded is not None and recorded[0] == CURRENT_FORMAT:
        return
    if recorded is not None and recorded[0] > CURRENT_FORMAT:
        number, release = recorded
        raise WarehouseTooNewError(
            f"the warehouse at {warehouse.location} is in format {number}, written by rebalancer {release}; this "
            f"release ({__version__}) reads format {CURRENT_FORMAT} and earlier: install rebalancer {release} or "
            f"later to use it.")
    found = recorded[0] if recorded is not None else _format_by_columns(warehouse)
    if found is None:
        raise WarehouseMissingError(
            f"there is no warehouse at {warehouse.location}: create one with `rebalancer init` (or `rebalancer "
            f"generate`), or name an existing one with --warehouse.")
    if found < CURRENT_FORMAT:
        added = "; ".join(f.summary for f in FORMATS[found:])
        raise WarehouseOutdatedError(
            f"the warehouse at {warehouse.location} is in format {found}, this release's is {CURRENT_FORMAT}: run "
            f"`rebalancer upgrade` to add {added} (`--dry-run` lists each change); nothing was written.")


def record_format(warehouse: Warehouse, note: str) -> None:
    """Append this release's format row (the last write of a creation or an upgrade)."""
    row = {"format": CURRENT_FORMAT, "release": __version__, "written_at": datetime.now(UTC), "note": note}
    schema = to_arrow_schema(WAREHOUSE_FORMAT, timezone="UTC")
    warehouse.append_arrow("warehouse_format", pa.Table.from_pylist([row], schema=schema))


def create_warehouse(warehouse: Warehouse) -> list[str]:
    """Create a new warehouse in this release's format, or the tables a current one misses (``init``).

    Returns:
        The tables created.

    Raises:
        WarehouseOutdatedError, WarehouseTooNewError: a warehouse in another format is there (nothing is written).
    """
    try:
        require_current(warehouse)
    except WarehouseMissingError:
        created = warehouse.create_tables()
        record_format(warehouse, "created")
        return created
    return warehouse.create_tables()
