"""Watermarks of an incremental load, kept in ``projection_timestamp_offset_store`` (no table of its own).

Per slice, under ``projection_name = 'spark-load:<job>'``: the rows at the slice's watermark timestamp,
one per persistence id loaded at exactly that timestamp -- a :class:`~pgjournal.offsets.TimestampOffset`
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
import psycopg.errors

from pgjournal.errors import ConfigurationError, LoadConflict
from pgjournal.offsets import TimestampOffset
from pgjournal.store.offsets import MARKER_PID

PREFIX = "spark-load:"
LEDGER_SUFFIX = ":loads"
ALL_TYPES = "*"
_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def check_job_name(job: str) -> str:
    if not isinstance(job, str) or not _JOB_NAME.fullmatch(job):
        raise ConfigurationError(f"load job name must be 1 to 100 characters from A-Z a-z 0-9 _ . -, got {job!r}")
    return job


def entity_key(entity_type: str | None) -> str:
    return ALL_TYPES if entity_type is None else entity_type


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
    name, key = PREFIX + check_job_name(job), entity_key(entity_type)
    keys = {k for (k,) in conn.execute(
        "SELECT DISTINCT projection_key FROM projection_timestamp_offset_store WHERE projection_name IN (%s, %s)",
        (name, name + LEDGER_SUFFIX)).fetchall()}
    if keys - {key}:
        raise ConfigurationError(
            f"load job {job!r} loads entity type {', '.join(sorted(keys))!r}, not {key!r}: use another job name "
            f"(or the same entity type) -- '*' means all entity types"
        )
    rows = conn.execute(
        "SELECT o.slice, o.persistence_id, o.seq_nr, o.timestamp_offset FROM projection_timestamp_offset_store o "
        "JOIN (SELECT slice, max(timestamp_offset) AS ts FROM projection_timestamp_offset_store "
        "      WHERE projection_name = %s GROUP BY slice) m ON m.slice = o.slice AND m.ts = o.timestamp_offset "
        "WHERE o.projection_name = %s",
        (name, name)).fetchall()
    seen: dict[int, dict[str, int]] = {}
    stamp: dict[int, datetime] = {}
    for slice_, pid, seq_nr, ts in rows:
        seen.setdefault(slice_, {})
        stamp[slice_] = ts
        if pid != MARKER_PID:
            seen[slice_][pid] = seq_nr
    loads = dict(conn.execute(
        "SELECT persistence_id, seq_nr FROM projection_timestamp_offset_store WHERE projection_name = %s",
        (name + LEDGER_SUFFIX,)).fetchall())
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
    name = PREFIX + state.job
    slices, pids, seq_nrs, stamps = [], [], [], []
    for s, mark in watermarks.items():
        for pid, seq in (mark.seen.items() or [(MARKER_PID, 0)]):
            slices.append(s)
            pids.append(pid)
            seq_nrs.append(seq)
            stamps.append(mark.timestamp)
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            row = conn.execute("SELECT COALESCE(max(seq_nr), 0) FROM projection_timestamp_offset_store "
                               "WHERE projection_name = %s", (name + LEDGER_SUFFIX,)).fetchone()
            if row is None or row[0] != load_number - 1:
                raise LoadConflict(f"load job {state.job!r}: load {row[0] if row else '?'} was committed by another "
                                   f"run while this one prepared load {load_number}; run it again")
            conn.execute("DELETE FROM projection_timestamp_offset_store WHERE projection_name = %s "
                         "AND slice = ANY(%s)", (name, sorted(watermarks)))
            conn.execute(
                "INSERT INTO projection_timestamp_offset_store (projection_name, projection_key, slice, "
                "persistence_id, seq_nr, timestamp_offset, timestamp_consumed) "
                "SELECT %s, %s, s, p, n, t, CURRENT_TIMESTAMP "
                "FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::timestamptz[]) AS w(s, p, n, t)",
                (name, state.key, slices, pids, seq_nrs, stamps))
            conn.execute(
                "INSERT INTO projection_timestamp_offset_store (projection_name, projection_key, slice, "
                "persistence_id, seq_nr, timestamp_offset, timestamp_consumed) "
                "VALUES (%s, %s, 0, %s, %s, %s, CURRENT_TIMESTAMP)",
                (name + LEDGER_SUFFIX, state.key, load_id, load_number, horizon))
    except psycopg.errors.SerializationFailure:
        raise LoadConflict(f"load job {state.job!r}: another run committed at the same time as load "
                           f"{load_number}; nothing of this run was committed, run it again") from None
