"""Projection management: pause and resume (honoured by running workers), clear or set offsets, status.

Pausing is per projection (``projection_management`` row with key ``*``): every running range checks it
every ``management_interval`` seconds, stores what it handled and stops consuming until resumed, then
restarts from its stored offsets. Clear and set rewrite the per-slice rows; do them while paused (running
ranges keep what they loaded) and resume afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.errors import InvalidArgument
from pgjournal.slices import check_slice_range
from pgjournal.store.offsets import MARKER_PID
from pgjournal.validation import check_name

from .offset_store import OFFSET_TABLE, OffsetStore, check_offset_table

if TYPE_CHECKING:
    import psycopg

    from pgjournal.journal import Journal

PAUSE_KEY = "*"

IS_PAUSED_SQL = """
SELECT COALESCE(bool_or(paused), false) FROM projection_management
WHERE projection_name = %(name)s AND projection_key = %(key)s"""
SET_PAUSED_SQL = """
INSERT INTO projection_management (projection_name, projection_key, paused, last_updated)
VALUES (%(name)s, %(key)s, %(paused)s, %(now)s)
ON CONFLICT (projection_name, projection_key) DO UPDATE SET paused = EXCLUDED.paused,
    last_updated = EXCLUDED.last_updated"""
CLEAR_SQL = """
DELETE FROM {table}
WHERE projection_name = %(name)s AND slice BETWEEN %(min)s AND %(max)s"""
LATEST_PER_SLICE_SQL = """
SELECT DISTINCT ON (slice) slice, projection_key, timestamp_offset, timestamp_consumed, persistence_id
FROM projection_timestamp_offset_store WHERE projection_name = %(name)s
ORDER BY slice, timestamp_offset DESC, timestamp_consumed DESC"""
LEASES_SQL = """
SELECT slice, owner, epoch FROM projection_lease
WHERE projection_name = %(name)s AND owner IS NOT NULL AND expires_at > now()"""
WORKERS_SQL = """
SELECT owner FROM projection_worker WHERE projection_name = %(name)s AND expires_at > now()
ORDER BY started_at, owner"""
NAMES_SQL = """
SELECT projection_name FROM projection_management
UNION SELECT DISTINCT projection_name FROM projection_timestamp_offset_store
UNION SELECT projection_name FROM projection_worker
ORDER BY 1"""


def is_paused(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute(IS_PAUSED_SQL, {"name": name, "key": PAUSE_KEY}).fetchone()
    return bool(row and row[0])


def _set_paused(journal: Journal, name: str, paused: bool) -> None:
    check_name(name, "projection name")
    with journal.connection() as conn:
        conn.execute(SET_PAUSED_SQL, {"name": name, "key": PAUSE_KEY, "paused": paused,
                                      "now": int(time.time() * 1000)})


def pause(journal: Journal, name: str) -> None:
    """Running ranges store what they handled and stop consuming within ``management_interval``."""
    _set_paused(journal, name, True)


def resume(journal: Journal, name: str) -> None:
    _set_paused(journal, name, False)


def clear_offset(journal: Journal, name: str, min_slice: int = 0, max_slice: int = 1023, *,
                 offset_table: str = OFFSET_TABLE) -> int:
    """Forget the offsets of the slices: the projection processes them again from the first event.
    ``offset_table``: see ``ProjectionSettings.offset_table``."""
    check_name(name, "projection name")
    check_slice_range(min_slice, max_slice)
    with journal.connection() as conn:
        table = check_offset_table(offset_table)
        return conn.execute(CLEAR_SQL.format(table=table),
                            {"name": name, "min": min_slice, "max": max_slice}).rowcount


def set_offset(journal: Journal, name: str, timestamp: datetime, min_slice: int = 0, max_slice: int = 1023, *,
               offset_table: str = OFFSET_TABLE) -> None:
    """Count every event before ``timestamp`` as processed (and nothing after it) in the slices."""
    check_name(name, "projection name")
    check_slice_range(min_slice, max_slice)
    if not isinstance(timestamp, datetime) or timestamp.tzinfo is None:
        raise InvalidArgument(f"offset timestamp must be a timezone-aware datetime, got {timestamp!r}")
    store = OffsetStore(journal, name, "", min_slice, max_slice, time_window=1, table=offset_table)
    with journal.connection() as conn, conn.transaction():
        table = store.table
        conn.execute(CLEAR_SQL.format(table=table), {"name": name, "min": min_slice, "max": max_slice})
        store.save_marker(conn, range(min_slice, max_slice + 1), timestamp)


@dataclass(frozen=True)
class RangeStatus:
    """A run of consecutive slices with the same owner (a live lease) or, without leases, the same key."""

    min_slice: int
    max_slice: int
    owner: str | None
    key: str | None
    #: Earliest and latest of the slices' latest offsets (``None``: nothing processed yet).
    oldest_offset: datetime | None
    newest_offset: datetime | None
    #: The largest ``timestamp_consumed - timestamp_offset`` over the slices' latest rows, in seconds.
    lag: float | None

    @property
    def slices(self) -> str:
        return f"{self.min_slice}-{self.max_slice}"


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    paused: bool
    workers: list[str]
    ranges: list[RangeStatus]


def status(journal: Journal, name: str) -> ProjectionStatus:
    check_name(name, "projection name")
    with journal.connection() as conn:
        paused = is_paused(conn, name)
        latest = {row[0]: row[1:] for row in conn.execute(LATEST_PER_SLICE_SQL, {"name": name}).fetchall()}
        leases = {s: o for s, o, _ in conn.execute(LEASES_SQL, {"name": name}).fetchall()}
        workers = [row[0] for row in conn.execute(WORKERS_SQL, {"name": name}).fetchall()]
    ranges: list[RangeStatus] = []
    group: list[int] = []

    def label(s: int) -> tuple[str | None, str | None]:
        if leases:
            return leases.get(s), None
        row = latest.get(s)
        return None, row[0] if row else None

    def close() -> None:
        if not group:
            return
        rows = [latest[s] for s in group if s in latest]
        offsets = [r[1] for r in rows]
        lags = [(r[2] - r[1]).total_seconds() for r in rows if r[3] != MARKER_PID]
        owner, key = label(group[0])
        ranges.append(RangeStatus(group[0], group[-1], owner, key, min(offsets, default=None),
                                  max(offsets, default=None), max(lags, default=None)))

    for s in range(1024):
        if group and (label(s) != label(group[0]) or (not leases and label(s) == (None, None))):
            close()
            group = []
        if leases or s in latest:
            group.append(s)
        else:
            close()
            group = []
    close()
    return ProjectionStatus(name, paused, workers, ranges)


def list_projections(journal: Journal) -> list[str]:
    with journal.connection() as conn:
        return [row[0] for row in conn.execute(NAMES_SQL).fetchall()]
