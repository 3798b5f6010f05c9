"""SQL over ``projection_timestamp_offset_store`` (or Akka's ``akka_projection_timestamp_offset_store``):
projections' per-slice offsets and the Spark incremental load's watermarks and ledger, which keep their rows
in the same table under their own projection names.

Conventions of the rows: a row with persistence id :data:`MARKER_PID` (seq_nr 0) marks a slice as read up
to its timestamp with nothing seen at it; a projection's ``projection_key`` is its slice range
(:func:`range_key`); a Spark load job ``<job>`` keeps its watermarks under ``spark-load:<job>`` and one
ledger row per committed load under ``spark-load:<job>:loads`` (see :mod:`spark.watermarks`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg.errors

from pgjournal.errors import InvalidArgument, LoadConflict
from pgjournal.store import Query, Read, rows, scalars, tables

#: A row with this persistence id marks a slice as read up to its timestamp with nothing seen at it.
MARKER_PID = ""
#: pgjournal's offset table, and Akka Projection R2DBC's (the same columns and key): a projection with
#: ``ProjectionSettings(offset_table=AKKA_OFFSET_TABLE)`` continues from an Akka projection's offsets of the
#: same name, and Akka continues from its offsets.
OFFSET_TABLE = tables.PROJECTION_TIMESTAMP_OFFSET_STORE
AKKA_OFFSET_TABLE = "akka_projection_timestamp_offset_store"
OFFSET_TABLES = (OFFSET_TABLE, AKKA_OFFSET_TABLE)
#: Projection names of a Spark load job's watermarks (``LOAD_PREFIX + job``) and its ledger (``+ LEDGER_SUFFIX``).
LOAD_PREFIX = "spark-load:"
LEDGER_SUFFIX = ":loads"


def check_offset_table(table: object) -> str:
    """``table`` if it is one of :data:`OFFSET_TABLES` (names go into SQL text, so only these)."""
    if table not in OFFSET_TABLES:
        raise InvalidArgument(f"offset_table must be one of {', '.join(OFFSET_TABLES)}, got {table!r}")
    return str(table)


def range_key(min_slice: int, max_slice: int) -> str:
    """The ``projection_key`` of a slice range, as Akka writes it: ``name-min-max`` minus the name."""
    return f"{min_slice}-{max_slice}"


# -- rows ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceLatest:
    """:data:`LATEST_SQL`: a slice's latest offset and its latest marker."""

    slice: int
    latest: datetime
    marker: datetime | None


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """One stored offset: an event (or a marker) counted as processed in a slice."""

    slice: int
    persistence_id: str
    seq_nr: int
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class LatestRow:
    """:data:`LATEST_PER_SLICE_SQL`: the newest row of a slice, for status and lag."""

    slice: int
    projection_key: str
    timestamp_offset: datetime
    timestamp_consumed: datetime
    persistence_id: str


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A committed Spark load: its number, its id and the horizon it read up to."""

    load_number: int
    load_id: str
    horizon: datetime
    committed: datetime


# -- statements ----------------------------------------------------------------------------------------

# Per slice of the range: the latest row and the latest marker. (Plans: bench/restart_plans.py.)
LATEST_SQL = """
SELECT slice, max(timestamp_offset), max(timestamp_offset) FILTER (WHERE persistence_id = '')
FROM {table}
WHERE projection_name = %(name)s AND slice BETWEEN %(min)s AND %(max)s
GROUP BY slice"""
# The highest row per persistence id within the window of its slice. (Plans: bench/restart_plans.py.)
PIDS_SQL = """
SELECT DISTINCT ON (s.persistence_id) s.slice, s.persistence_id, s.seq_nr, s.timestamp_offset
FROM {table} AS s
JOIN unnest(%(slices)s::int[], %(floors)s::timestamptz[]) AS f(slice, floor) ON s.slice = f.slice
WHERE s.projection_name = %(name)s AND s.persistence_id <> '' AND s.timestamp_offset >= f.floor
ORDER BY s.persistence_id, s.seq_nr DESC"""
INSERT_SQL = """
INSERT INTO {table}
    (projection_name, projection_key, slice, persistence_id, seq_nr, timestamp_offset, timestamp_consumed)
SELECT %(name)s, %(key)s, u.slice, u.pid, u.seq, u.ts, clock_timestamp()
FROM unnest(%(slices)s::int[], %(pids)s::text[], %(seqs)s::bigint[], %(tss)s::timestamptz[]) AS u(slice, pid, seq, ts)
{conflict}"""
# Superseded rows (a higher event of the same pid has a row: its time is not earlier) and rows older than the
# window behind their slice's latest; so a slice's latest time always keeps a row. Read first, then deleted by
# key: in one statement (DELETE ... USING this query) a planner without statistics for the table (a fresh one,
# not analysed yet) joined it by a nested loop that ran the window query again for every row, seconds per
# delete from a thousand rows on.
OLD_SQL = """
SELECT slice, persistence_id, seq_nr, timestamp_offset FROM (
    SELECT slice, persistence_id, seq_nr, timestamp_offset,
           row_number() OVER (PARTITION BY slice, persistence_id ORDER BY seq_nr DESC, timestamp_offset DESC) AS rn,
           max(timestamp_offset) OVER (PARTITION BY slice) AS latest
    FROM {table}
    WHERE projection_name = %(name)s AND slice BETWEEN %(min)s AND %(max)s) AS d
WHERE d.rn > 1 OR d.timestamp_offset < d.latest - %(window)s * INTERVAL '1 second'"""
DELETE_SQL = """
DELETE FROM {table} AS s
USING unnest(%(slices)s::int[], %(pids)s::text[], %(seqs)s::bigint[], %(tss)s::timestamptz[]) AS u(slice, pid, seq, ts)
WHERE s.projection_name = %(name)s AND s.slice = u.slice AND s.persistence_id = u.pid AND s.seq_nr = u.seq
  AND s.timestamp_offset = u.ts"""
CLEAR_SQL = """
DELETE FROM {table}
WHERE projection_name = %(name)s AND slice BETWEEN %(min)s AND %(max)s"""
LATEST_PER_SLICE_SQL = """
SELECT DISTINCT ON (slice) slice, projection_key, timestamp_offset, timestamp_consumed, persistence_id
FROM {table} WHERE projection_name = %(name)s
ORDER BY slice, timestamp_offset DESC, timestamp_consumed DESC"""
# Per slice, the rows at its latest timestamp (a Spark load's watermark: the time and the pids seen at it).
AT_LATEST_SQL = """
SELECT o.slice, o.persistence_id, o.seq_nr, o.timestamp_offset FROM {table} o
JOIN (SELECT slice, max(timestamp_offset) AS ts FROM {table} WHERE projection_name = %(name)s GROUP BY slice) m
  ON m.slice = o.slice AND m.ts = o.timestamp_offset
WHERE o.projection_name = %(name)s"""


class Offsets:
    """The statements over one offset table (:data:`OFFSET_TABLES`); get one with :func:`offsets`."""

    def __init__(self, table: str = OFFSET_TABLE) -> None:
        self.table = check_offset_table(table)
        (self._latest, self._pids, self._old, self._delete, self._clear, self._latest_per_slice,
         self._at_latest) = (sql.format(table=self.table) for sql in (
            LATEST_SQL, PIDS_SQL, OLD_SQL, DELETE_SQL, CLEAR_SQL, LATEST_PER_SLICE_SQL, AT_LATEST_SQL))
        self._insert_fenced = INSERT_SQL.format(table=self.table, conflict="")
        self._insert_unfenced = INSERT_SQL.format(table=self.table, conflict="ON CONFLICT DO NOTHING")

    # -- projections -----------------------------------------------------------------------------------

    def latest(self, name: str, min_slice: int, max_slice: int) -> Read[SliceLatest]:
        """Per slice of the range that has rows: its latest offset and latest marker."""
        return rows(SliceLatest, self._latest, {"name": name, "min": min_slice, "max": max_slice})

    def highest_per_pid(self, name: str, floors: dict[int, datetime]) -> Read[OffsetRow]:
        """Per persistence id (markers aside), its highest row at or after the floor of its slice."""
        slices = sorted(floors)
        return rows(OffsetRow, self._pids, {"name": name, "slices": slices, "floors": [floors[s] for s in slices]})

    def insert(self, name: str, key: str, offsets: Sequence[OffsetRow], *, fenced: bool) -> Query:
        """Insert the rows; ``fenced``: a row that exists already fails the statement (a unique violation),
        else it is left as it is."""
        return (self._insert_fenced if fenced else self._insert_unfenced), {"name": name, "key": key,
                                                                            **_columns(offsets)}

    def old(self, name: str, min_slice: int, max_slice: int, window: float) -> Read[OffsetRow]:
        """The superseded rows and the rows ``window`` seconds older than their slice's latest."""
        return rows(OffsetRow, self._old, {"name": name, "min": min_slice, "max": max_slice, "window": window})

    def delete(self, name: str, offsets: Sequence[OffsetRow]) -> Query:
        """Delete these rows (rowcount)."""
        return self._delete, {"name": name, **_columns(offsets)}

    def clear(self, name: str, min_slice: int, max_slice: int) -> Query:
        """Delete every row of the slices (rowcount)."""
        return self._clear, {"name": name, "min": min_slice, "max": max_slice}

    def latest_per_slice(self, name: str) -> Read[LatestRow]:
        """The newest row of each slice that has one."""
        return rows(LatestRow, self._latest_per_slice, {"name": name})

    def entity_types(self, name: str) -> Read[str]:
        """The entity types of the persistence ids stored under ``name`` (markers aside): what a projection
        that does not say which it consumes was seen to handle (:func:`~pgjournal.model.slices.entity_type_of`)."""
        return scalars(f"SELECT DISTINCT CASE WHEN strpos(persistence_id, '|') > 0 "
                       f"THEN split_part(persistence_id, '|', 1) ELSE '' END FROM {self.table} "
                       "WHERE projection_name = %s AND persistence_id <> %s", (name, MARKER_PID))

    # -- Spark load watermarks and ledger ----------------------------------------------------------------

    def keys(self, names: Sequence[str]) -> Read[str]:
        """The distinct ``projection_key`` values stored under ``names``."""
        return scalars(f"SELECT DISTINCT projection_key FROM {self.table} WHERE projection_name = ANY(%s)",
                       (list(names),))

    def at_latest(self, name: str) -> Read[OffsetRow]:
        """Per slice, the rows at its latest timestamp."""
        return rows(OffsetRow, self._at_latest, {"name": name})

    def ledger(self, name: str, limit: int | None = None) -> Read[LedgerRow]:
        """The rows of a load ledger, newest load first (``limit``: only that many)."""
        return rows(LedgerRow, f"SELECT seq_nr, persistence_id, timestamp_offset, timestamp_consumed FROM {self.table} "
                    "WHERE projection_name = %s ORDER BY seq_nr DESC LIMIT %s", (name, limit))

    def highest_seq_nr(self, name: str) -> Read[int]:
        """The highest sequence number stored under ``name`` (a ledger's last load number), 0 when none."""
        return scalars(f"SELECT COALESCE(max(seq_nr), 0) FROM {self.table} WHERE projection_name = %s", (name,))

    def delete_slices(self, name: str, slices: Sequence[int]) -> Query:
        return f"DELETE FROM {self.table} WHERE projection_name = %s AND slice = ANY(%s)", (name, list(slices))


def _columns(offsets: Sequence[OffsetRow]) -> dict[str, list[Any]]:
    return {"slices": [o.slice for o in offsets], "pids": [o.persistence_id for o in offsets],
            "seqs": [o.seq_nr for o in offsets], "tss": [o.timestamp for o in offsets]}


def offsets(table: str = OFFSET_TABLE) -> Offsets:
    """The statements over ``table`` (one of :data:`OFFSET_TABLES`, else :class:`InvalidArgument`)."""
    return _offsets(check_offset_table(table))


@functools.cache
def _offsets(table: str) -> Offsets:
    return Offsets(table)


# -- database errors -----------------------------------------------------------------------------------
# A fenced insert of a row that exists raises psycopg's UniqueViolation: the runner reads it as a lost lease.


def load_conflict(exc: BaseException, job: str, load_number: int) -> LoadConflict | None:
    """What a serializable commit of a load's watermarks failing with ``exc`` means, if it is a conflict."""
    if isinstance(exc, psycopg.errors.SerializationFailure):
        return LoadConflict(f"load job {job!r}: another run committed at the same time as load {load_number}; "
                            "nothing of this run was committed, run it again")
    return None
