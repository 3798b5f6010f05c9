"""SQL over ``projection_dead_letter``: envelopes a projection could not decode or handle, copied from the
journal with their payload (see :mod:`projections.dead_letters`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.store import Query, Read, rows, tables
from pgjournal.store.events import read_payload

if TYPE_CHECKING:
    from pgjournal.store.events import EventStore

DEAD_LETTER_TABLE = tables.PROJECTION_DEAD_LETTER


@dataclass(frozen=True)
class DeadLetter:
    """A stored dead letter (the columns of :data:`LIST_SQL`, in order)."""

    projection_key: str
    slice: int
    persistence_id: str
    seq_nr: int
    db_timestamp: datetime
    ser_id: int
    manifest: str
    payload: bytes = field(repr=False)
    error: str
    failed_at: datetime


@dataclass(frozen=True, slots=True)
class Serializer:
    """The serializer id and manifest an event was stored with."""

    ser_id: int
    manifest: str


# The stored row is the source of serializer id, manifest and payload: the envelope has only the event.
INSERT_SQL = f"""
INSERT INTO {DEAD_LETTER_TABLE} (projection_name, projection_key, slice, persistence_id, seq_nr, db_timestamp,
    ser_id, manifest, payload, error, failed_at)
SELECT %(name)s, %(key)s, slice, persistence_id, seq_nr, db_timestamp, event_ser_id, event_ser_manifest,
       {{payload}}, %(error)s, clock_timestamp()
FROM {{table}} WHERE persistence_id = %(pid)s AND seq_nr = %(seq_nr)s AND slice = %(slice)s
ON CONFLICT (projection_name, persistence_id, seq_nr) DO UPDATE
SET error = EXCLUDED.error, failed_at = EXCLUDED.failed_at, projection_key = EXCLUDED.projection_key"""
SERIALIZER_SQL = """
SELECT event_ser_id, event_ser_manifest FROM {table} WHERE persistence_id = %(pid)s AND seq_nr = %(seq_nr)s
  AND slice = %(slice)s"""
LIST_SQL = f"""
SELECT projection_key, slice, persistence_id, seq_nr, db_timestamp, ser_id, manifest, payload, error, failed_at
FROM {DEAD_LETTER_TABLE} WHERE projection_name = %(name)s ORDER BY persistence_id, seq_nr"""
DELETE_SQL = f"""
DELETE FROM {DEAD_LETTER_TABLE} WHERE projection_name = %(name)s AND persistence_id = %(pid)s
  AND seq_nr = %(seq_nr)s"""
UPDATE_SQL = f"""
UPDATE {DEAD_LETTER_TABLE} SET error = %(error)s, failed_at = clock_timestamp()
WHERE projection_name = %(name)s AND persistence_id = %(pid)s AND seq_nr = %(seq_nr)s"""


@functools.cache
def _insert(table: str, jsonb: bool) -> str:
    # A JSONB journal's payload (Akka's JSONB option) is kept as its JSON bytes.
    return INSERT_SQL.format(table=table, payload=read_payload("event_payload", jsonb))


def store(events: EventStore, name: str, key: str, pid: str, seq_nr: int, error: str) -> Query:
    """Copy the journal row of ``pid``/``seq_nr`` into the dead letters of projection ``name`` (or replace the
    error of the one stored)."""
    slice_ = slice_for_persistence_id(pid)
    return (_insert(events.table(slice_), "event_payload" in events.jsonb),
            {"name": name, "key": key, "pid": pid, "seq_nr": seq_nr, "slice": slice_, "error": error})


def serializer(events: EventStore, pid: str, seq_nr: int) -> Read[Serializer]:
    """The serializer id and manifest stored with an event (no row when the event is gone)."""
    slice_ = slice_for_persistence_id(pid)
    return rows(Serializer, SERIALIZER_SQL.format(table=events.table(slice_)),
                {"pid": pid, "seq_nr": seq_nr, "slice": slice_})


def dead_letters(name: str) -> Read[DeadLetter]:
    """The dead letters of projection ``name``, by persistence id and sequence number."""
    return rows(DeadLetter, LIST_SQL, {"name": name})


def delete(name: str, pid: str, seq_nr: int) -> Query:
    return DELETE_SQL, {"name": name, "pid": pid, "seq_nr": seq_nr}


def set_error(name: str, pid: str, seq_nr: int, error: str) -> Query:
    """Record that replaying the dead letter failed again."""
    return UPDATE_SQL, {"name": name, "pid": pid, "seq_nr": seq_nr, "error": error}
