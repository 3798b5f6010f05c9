"""SQL over ``snapshot``: one persistence id's snapshot (save, load, delete) and the snapshots of a slice range
(``events_by_slices_starting_from_snapshots``). Both reads return :class:`SnapshotRow`, payloads as bytes
also where Akka's ``payload-column-type = JSONB`` made the payload columns JSONB."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.store import Query, Read, rows, tables
from pgjournal.store.events import read_payload

if TYPE_CHECKING:
    from pgjournal.store.events import EventStore
    from pgjournal.store.tables import Slicing

SNAPSHOT_TABLE = tables.SNAPSHOT


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """A stored snapshot (:data:`COLUMNS`, in order), payloads as bytes. ``db_timestamp``: of the event at
    ``seq_nr`` (``None`` if it was not found when saved); ``write_timestamp``: epoch milliseconds."""

    slice: int
    entity_type: str
    persistence_id: str
    seq_nr: int
    db_timestamp: datetime | None
    write_timestamp: int
    ser_id: int
    ser_manifest: str
    snapshot: bytes
    tags: list[str] | None
    meta_ser_id: int | None
    meta_ser_manifest: str | None
    meta_payload: bytes | None


COLUMNS = ("slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, ser_manifest, "
           "{snapshot}, tags, meta_ser_id, meta_ser_manifest, {meta_payload}")
# A snapshot never replaces a newer one; db_timestamp is that of the event it was taken at.
UPSERT = f"""
INSERT INTO {SNAPSHOT_TABLE} (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id,
    ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload)
VALUES (%(slice)s, %(entity_type)s, %(pid)s::varchar, %(seq_nr)s::bigint, {{timestamp_of}},
    %(write_timestamp)s, %(ser_id)s, %(manifest)s, {{payload}}, %(tags)s::text[],
    %(meta_ser_id)s, %(meta_manifest)s, {{meta_payload}})
ON CONFLICT (persistence_id) DO UPDATE SET seq_nr = excluded.seq_nr, db_timestamp = excluded.db_timestamp,
    write_timestamp = excluded.write_timestamp, ser_id = excluded.ser_id, ser_manifest = excluded.ser_manifest,
    snapshot = excluded.snapshot, tags = excluded.tags, meta_ser_id = excluded.meta_ser_id,
    meta_ser_manifest = excluded.meta_ser_manifest, meta_payload = excluded.meta_payload
WHERE snapshot.seq_nr <= excluded.seq_nr"""
SELECT = f"""
SELECT {{columns}}
FROM {SNAPSHOT_TABLE} WHERE persistence_id = %s AND seq_nr <= %s
    AND (%s::timestamptz IS NULL
         OR COALESCE(db_timestamp, to_timestamp(write_timestamp / 1000.0)) <= %s::timestamptz)"""
# In time order (snapshot_slice_idx). A snapshot saved without its event's timestamp (NULL) cannot be placed
# in time and is left out: its persistence id's events are read in full instead.
BY_SLICES = f"""
SELECT {{columns}} FROM {SNAPSHOT_TABLE} WHERE entity_type = %(entity_type)s AND {{slices}}
    AND db_timestamp >= %(since)s ORDER BY db_timestamp, persistence_id"""
DELETE = f"DELETE FROM {SNAPSHOT_TABLE} WHERE persistence_id = %s"
COUNT = f"SELECT count(*) FROM {SNAPSHOT_TABLE} WHERE persistence_id = %s"


def _jsonb_in(param: str) -> str:
    """A bytes parameter written into a JSONB column (Akka's ``payload-column-type = JSONB``)."""
    return f"convert_from(%({param})s::bytea, 'UTF8')::jsonb"


class SnapshotSQL:
    """The statements over ``snapshot`` for one journal: which payload columns are JSONB (Akka's option), the
    event table a saved snapshot takes its event's db_timestamp from (the event store's for the slice) and
    the dialect's slice predicate."""

    def __init__(self, dialect: Slicing, events: EventStore, *, jsonb: bool = False, meta_jsonb: bool = False
                 ) -> None:
        self._dialect = dialect
        self._events = events
        self._upsert = UPSERT.replace("{payload}", _jsonb_in("payload") if jsonb else "%(payload)s").replace(
            "{meta_payload}", _jsonb_in("meta_payload") if meta_jsonb else "%(meta_payload)s")
        columns = COLUMNS.format(snapshot=read_payload("snapshot", jsonb),
                                 meta_payload=read_payload("meta_payload", meta_jsonb))
        self._select = SELECT.format(columns=columns)
        self._by_slices = BY_SLICES.replace("{columns}", columns)
        #: The upsert per event table (one, or one per Akka data partition).
        self._upserts: dict[str, str] = {}

    def save(self, pid: str, seq_nr: int, write_timestamp: int, ser_id: int, manifest: str, payload: bytes,
             tags: list[str] | None, meta: tuple[int, str, bytes] | None) -> Query:
        """Store the snapshot unless a newer one is stored; its db_timestamp is its event's."""
        slice_ = slice_for_persistence_id(pid)
        params = {
            "slice": slice_, "entity_type": entity_type_of(pid), "pid": pid, "seq_nr": seq_nr,
            "write_timestamp": write_timestamp, "ser_id": ser_id, "manifest": manifest, "payload": payload,
            "tags": tags, "meta_ser_id": meta[0] if meta else None, "meta_manifest": meta[1] if meta else None,
            "meta_payload": meta[2] if meta else None}
        timestamp_of = self._events.timestamp_of_sql(slice_)
        sql = self._upserts.get(timestamp_of)
        if sql is None:
            sql = self._upserts[timestamp_of] = self._upsert.format(timestamp_of=timestamp_of)
        return sql, params

    def load(self, pid: str, max_seq_nr: int, max_timestamp: datetime | None) -> Read[SnapshotRow]:
        """The snapshot of ``pid`` if it is at most ``max_seq_nr`` and taken at or before ``max_timestamp``
        (its event's time, or when it was saved if that event was not found)."""
        return rows(SnapshotRow, self._select, (pid, max_seq_nr, max_timestamp, max_timestamp))

    def by_slices(self, entity_type: str, min_slice: int, max_slice: int, since: datetime) -> Read[SnapshotRow]:
        """The snapshots of an entity type in a slice range taken at an event at or after ``since``."""
        slices, params = self._dialect.slice_condition(min_slice, max_slice)
        return rows(SnapshotRow, self._by_slices.format(slices=slices),
                    {**params, "entity_type": entity_type, "since": since})

    @staticmethod
    def delete(pid: str) -> Query:
        return DELETE, (pid,)

    @staticmethod
    def count(pid: str) -> Query:
        """One row: how many snapshots ``pid`` has (0 or 1)."""
        return COUNT, (pid,)
