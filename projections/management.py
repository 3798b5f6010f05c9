"""Projection management: pause and resume (honoured by running workers), clear or set offsets, status.

Pausing is per projection (``projection_management`` row with key ``*``): every running range checks it
every ``management_interval`` seconds, stores what it handled and stops consuming until resumed, then
restarts from its stored offsets. Clear and set rewrite the per-slice rows; do them while paused (running
ranges keep what they loaded) and resume afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.errors import InvalidArgument
from pgjournal.model.slices import NUMBER_OF_SLICES, check_slice_range
from pgjournal.runtime.steps import Step, first_of, rows_of, run
from pgjournal.store import leases as lease_sql
from pgjournal.store import management as sql
from pgjournal.store import stats
from pgjournal.store.timestamp_offsets import OFFSET_TABLE, offsets
from pgjournal.validation import check_name

from .offset_store import OffsetStore

if TYPE_CHECKING:
    import psycopg

    from pgjournal.core.horizon import HorizonTracker
    from pgjournal.journal import Journal

PAUSE_KEY = "*"
LAST_SLICE = NUMBER_OF_SLICES - 1


def is_paused(conn: psycopg.Connection, name: str) -> bool:
    return run(is_paused_step(name), conn)


def is_paused_step(name: str) -> Step[bool]:
    """:func:`is_paused` as a step (:mod:`pgjournal.runtime.steps`)."""
    return bool((yield from first_of(sql.is_paused(name, PAUSE_KEY))))


def _set_paused(journal: Journal, name: str, paused: bool) -> None:
    check_name(name, "projection name")
    with journal.connection() as conn:
        conn.execute(*sql.set_paused(name, PAUSE_KEY, paused, int(time.time() * 1000)))


def pause(journal: Journal, name: str) -> None:
    """Running ranges store what they handled and stop consuming within ``management_interval``."""
    _set_paused(journal, name, True)


def resume(journal: Journal, name: str) -> None:
    _set_paused(journal, name, False)


def clear_offset(journal: Journal, name: str, min_slice: int = 0, max_slice: int = LAST_SLICE, *,
                 offset_table: str = OFFSET_TABLE) -> int:
    """Forget the offsets of the slices: the projection processes them again from the first event.
    ``offset_table``: see ``ProjectionSettings.offset_table``."""
    check_name(name, "projection name")
    check_slice_range(min_slice, max_slice)
    clear = offsets(offset_table).clear(name, min_slice, max_slice)
    with journal.connection() as conn:
        return conn.execute(*clear).rowcount


def set_offset(journal: Journal, name: str, timestamp: datetime, min_slice: int = 0, max_slice: int = LAST_SLICE, *,
               offset_table: str = OFFSET_TABLE) -> None:
    """Count every event before ``timestamp`` as processed (and nothing after it) in the slices."""
    check_name(name, "projection name")
    check_slice_range(min_slice, max_slice)
    if not isinstance(timestamp, datetime) or timestamp.tzinfo is None:
        raise InvalidArgument(f"offset timestamp must be a timezone-aware datetime, got {timestamp!r}")
    store = OffsetStore(journal, name, "", min_slice, max_slice, time_window=1, table=offset_table)
    with journal.connection() as conn, conn.transaction():
        conn.execute(*store.sql.clear(name, min_slice, max_slice))
        store.save_marker(conn, range(min_slice, max_slice + 1), timestamp)


def slice_lag(now: datetime, handled: datetime | None, first_pending: datetime | None) -> float:
    """The lag of one slice, in seconds: 0 when nothing is pending (no event of the projection's entity type
    newer than its offset is visible under the horizon), else the database clock minus the newest event handled
    (nothing handled yet: minus the first pending event). A projection's lag, in ``projection status`` and in
    ``pgjournal_projection_lag_seconds``, is the largest over its slices."""
    if first_pending is None:
        return 0.0
    since = handled if handled is not None else first_pending
    return max(0.0, (now - since).total_seconds())


def lags_step(entity_types: Sequence[str], handled: Mapping[int, datetime | None],
              tracker: HorizonTracker) -> Step[dict[int, float]]:
    """:func:`slice_lag` of each slice of ``handled`` (its newest offset, markers included; ``None``: none),
    read at one horizon."""
    if not handled or not entity_types:
        return {}
    horizon = yield from tracker.read_step()
    slices = sorted(handled)
    pending = {row.slice: row.db_timestamp for row in (yield from rows_of(
        stats.first_pending(list(entity_types), slices, [handled[s] for s in slices], horizon.safe)))}
    return {s: slice_lag(horizon.now, handled[s], pending.get(s)) for s in slices}


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
    #: The largest :func:`slice_lag` over the slices, in seconds (``None``: the entity type is unknown).
    lag: float | None

    @property
    def slices(self) -> str:
        return f"{self.min_slice}-{self.max_slice}"


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    paused: bool
    #: The owners of the workers whose heartbeat has not expired.
    workers: list[str]
    ranges: list[RangeStatus]
    #: The entity types the lag was measured over (given, or seen in the offsets).
    entity_types: list[str]

    @property
    def running(self) -> bool:
        """A worker is alive (it may be paused); ``False``: stopped, nothing consumes."""
        return bool(self.workers)


def status(journal: Journal, name: str, entity_types: Sequence[str] | None = None) -> ProjectionStatus:
    """Paused or not, the live workers, and per slice range its owner, offsets and lag (:func:`slice_lag`).
    ``entity_types``: what the projection consumes (default: the entity types of the persistence ids in its
    offsets; none seen, no lag)."""
    check_name(name, "projection name")
    with journal.connection() as conn:
        paused = is_paused(conn, name)
        latest = {row.slice: row for row in offsets().latest_per_slice(name).all(conn)}
        leases = {lease.slice: lease.owner for lease in lease_sql.live_leases(name).all(conn)}
        workers = lease_sql.live_workers(name).all(conn)
        types = sorted(entity_types) if entity_types else sorted(offsets().entity_types(name).all(conn))
        # With leases every slice is shown (a slice nobody holds is a range of its own, owner unknown), so every
        # slice needs its lag; without them, only the slices with offsets.
        shown = list(range(NUMBER_OF_SLICES)) if leases else sorted(latest)
        lags = run(lags_step(types, {s: latest[s].timestamp_offset if s in latest else None for s in shown},
                             journal.horizon_tracker()), conn)
    ranges: list[RangeStatus] = []
    group: list[int] = []

    def label(s: int) -> tuple[str | None, str | None]:
        if leases:
            return leases.get(s), None
        row = latest.get(s)
        return None, row.projection_key if row else None

    def close() -> None:
        if not group:
            return
        stamps = [latest[s].timestamp_offset for s in group if s in latest]
        owner, key = label(group[0])
        ranges.append(RangeStatus(group[0], group[-1], owner, key, min(stamps, default=None),
                                  max(stamps, default=None),
                                  max((lags[s] for s in group), default=0.0) if types else None))

    for s in range(NUMBER_OF_SLICES):
        if group and (label(s) != label(group[0]) or (not leases and label(s) == (None, None))):
            close()
            group = []
        if leases or s in latest:
            group.append(s)
        else:
            close()
            group = []
    close()
    return ProjectionStatus(name, paused, workers, ranges, types)


def list_projections(journal: Journal) -> list[str]:
    with journal.connection() as conn:
        return sql.names().all(conn)
