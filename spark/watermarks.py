"""Watermarks of an incremental load, kept in ``projection_timestamp_offset_store`` (no table of its own).

Per slice, under ``projection_name = 'spark-load:<job>'``: the rows at the slice's watermark timestamp,
one per persistence id loaded at exactly that timestamp -- a :class:`~pgjournal.model.offsets.TimestampOffset`
with its ``seen`` map, like a projection's offset. A slice where a load found nothing new gets one marker
row (persistence id ``''``, seq nr 0) at the load's visibility horizon: everything below it is loaded.

The *ledger*, under ``'spark-load:<job>:loads'`` (slice 0), has one row per committed load: persistence id =
load id, seq nr = load number, timestamp offset = the horizon it read up to. A load's output directory
counts only if its load id is in the ledger; the ledger row and the new watermarks commit together.
``projection_key`` holds what the job loads (its entity type, ``*`` for all) so a job cannot silently
change its filter between runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from pgjournal.errors import ConfigurationError, LoadConflict
from pgjournal.model.offsets import TimestampOffset
from pgjournal.store.timestamp_offsets import LEDGER_SUFFIX, LOAD_PREFIX, MARKER_PID, OffsetRow, load_conflict, offsets

ALL_TYPES = "*"
_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def check_job_name(job: str) -> str:
    if not isinstance(job, str) or not _JOB_NAME.fullmatch(job):
        raise ConfigurationError(f"load job name must be 1 to 100 characters from A-Z a-z 0-9 _ . -, got {job!r}")
    return job


def entity_key(entity_type: str | None) -> str:
    return ALL_TYPES if entity_type is None else entity_type


def watermark_name(job: str) -> str:
    """The projection name of a job's watermark rows."""
    return LOAD_PREFIX + job


def ledger_name(job: str) -> str:
    """The projection name of a job's ledger rows."""
    return LOAD_PREFIX + job + LEDGER_SUFFIX


@dataclass(frozen=True)
class LoadState:
    """What the committed loads of a job have reached."""

    job: str
    key: str
    last_load: int
    watermarks: Mapping[int, TimestampOffset]
    #: load id -> load number, for every committed load.
    loads: Mapping[str, int] = field(default_factory=dict)

    def lower_bound(self, lo: int, hi: int) -> datetime | None:
        """The earliest watermark of slices lo..hi, or ``None`` when one of them has none (read from the start)."""
        marks = [self.watermarks.get(s) for s in range(lo, hi + 1)]
        if any(m is None for m in marks):
            return None
        return min(m.timestamp for m in marks if m is not None)

    def seen_rows(self) -> list[tuple[str, int]]:
        """(persistence id, highest seq nr) loaded at the watermark timestamps: an event of that persistence id
        with a sequence number up to it is loaded (one append stamps all its events with one timestamp)."""
        return [(pid, seq) for mark in self.watermarks.values() for pid, seq in mark.seen.items() if pid]


def read_state(conn: psycopg.Connection, job: str, entity_type: str | None) -> LoadState:
    """The watermarks and ledger of ``job``; raises if the job was run with another entity type."""
    name, key = watermark_name(check_job_name(job)), entity_key(entity_type)
    store = offsets()
    keys = set(store.keys([name, ledger_name(job)]).all(conn))
    if keys - {key}:
        raise ConfigurationError(
            f"load job {job!r} loads entity type {', '.join(sorted(keys))!r}, not {key!r}: use another job name "
            f"(or the same entity type) -- '*' means all entity types"
        )
    seen: dict[int, dict[str, int]] = {}
    stamp: dict[int, datetime] = {}
    for row in store.at_latest(name).all(conn):
        seen.setdefault(row.slice, {})
        stamp[row.slice] = row.timestamp
        if row.persistence_id != MARKER_PID:
            seen[row.slice][row.persistence_id] = row.seq_nr
    loads = {row.load_id: row.load_number for row in store.ledger(ledger_name(job)).all(conn)}
    return LoadState(job, key, max(loads.values(), default=0),
                     {s: TimestampOffset(stamp[s], seen=seen[s]) for s in stamp}, loads)


def next_watermarks(
    state: LoadState,
    slices: Iterable[int],
    newest: Mapping[int, Sequence[tuple[str, int, datetime]]],
    horizon: datetime,
) -> dict[int, TimestampOffset]:
    """Each slice's watermark after a load: its newest loaded events (pid, seq nr, timestamp, all at the same
    timestamp) if it had any, else the horizon with nothing seen (never moving a watermark back)."""
    out: dict[int, TimestampOffset] = {}
    for s in slices:
        rows = newest.get(s)
        if rows:
            # An offset's position (what was consumed at one timestamp), not the gate's rule (each pid once, in order).
            seen: dict[str, int] = {}
            for pid, seq, _ in rows:
                seen[pid] = max(seq, seen.get(pid, 0))
            out[s] = TimestampOffset(rows[0][2], seen=seen)
            continue
        old = state.watermarks.get(s)
        out[s] = old if old is not None and old.timestamp >= horizon else TimestampOffset(horizon)
    return out


def commit_load(
    conn: psycopg.Connection,
    state: LoadState,
    load_number: int,
    load_id: str,
    horizon: datetime,
    watermarks: Mapping[int, TimestampOffset],
) -> None:
    """Store the new watermarks and the ledger row in one serializable transaction.

    Raises :class:`LoadConflict` when another run committed load ``load_number`` (or any later) meanwhile.
    """
    rows = [OffsetRow(s, pid, seq, mark.timestamp)
            for s, mark in watermarks.items() for pid, seq in (mark.seen.items() or [(MARKER_PID, 0)])]
    store, ledger = offsets(), ledger_name(state.job)
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            last = store.highest_seq_nr(ledger).one(conn)
            if last != load_number - 1:
                raise LoadConflict(f"load job {state.job!r}: load {last} was committed by another run while this "
                                   f"one prepared load {load_number}; run it again")
            conn.execute(*store.delete_slices(watermark_name(state.job), sorted(watermarks)))
            conn.execute(*store.insert(watermark_name(state.job), state.key, rows, fenced=True))
            conn.execute(*store.insert(ledger, state.key, [OffsetRow(0, load_id, load_number, horizon)], fenced=True))
    except psycopg.Error as exc:
        conflict = load_conflict(exc, state.job, load_number)
        if conflict is None:
            raise
        raise conflict from None
