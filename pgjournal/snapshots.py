"""Snapshots: the latest state of a persistence id at a sequence number (one row per persistence id)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument
from .slices import entity_type_of, slice_for_persistence_id
from .store.events import read_payload
from .validation import check_persistence_id, check_seq_nr, check_tags

if TYPE_CHECKING:
    from .journal import Journal

# A snapshot never replaces a newer one; db_timestamp is that of the event it was taken at.
UPSERT = """
INSERT INTO snapshot (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id,
    ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload)
VALUES (%(slice)s, %(entity_type)s, %(pid)s::varchar, %(seq_nr)s::bigint, {timestamp_of},
    %(write_timestamp)s, %(ser_id)s, %(manifest)s, {payload}, %(tags)s::text[],
    %(meta_ser_id)s, %(meta_manifest)s, {meta_payload})
ON CONFLICT (persistence_id) DO UPDATE SET seq_nr = excluded.seq_nr, db_timestamp = excluded.db_timestamp,
    write_timestamp = excluded.write_timestamp, ser_id = excluded.ser_id, ser_manifest = excluded.ser_manifest,
    snapshot = excluded.snapshot, tags = excluded.tags, meta_ser_id = excluded.meta_ser_id,
    meta_ser_manifest = excluded.meta_ser_manifest, meta_payload = excluded.meta_payload
WHERE snapshot.seq_nr <= excluded.seq_nr"""
SELECT = """
SELECT persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, ser_manifest, {snapshot}, tags,
    meta_ser_id, meta_ser_manifest, {meta_payload}
FROM snapshot WHERE persistence_id = %s AND seq_nr <= %s
    AND (%s::timestamptz IS NULL
         OR COALESCE(db_timestamp, to_timestamp(write_timestamp / 1000.0)) <= %s::timestamptz)"""
DELETE = "DELETE FROM snapshot WHERE persistence_id = %s"


def _jsonb_in(param: str) -> str:
    """A bytes parameter written into a JSONB column (Akka's ``payload-column-type = JSONB``)."""
    return f"convert_from(%({param})s::bytea, 'UTF8')::jsonb"


@dataclass(frozen=True)
class SelectedSnapshot:
    persistence_id: str
    seq_nr: int
    #: ``db_timestamp`` of the event at ``seq_nr`` (``None`` if that event was not found when saved).
    db_timestamp: datetime | None
    #: When the snapshot was written, epoch milliseconds.
    write_timestamp: int
    snapshot: Any
    metadata: Any = None
    tags: tuple[str, ...] = ()


class SnapshotStore:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        jsonb = journal.stored.jsonb("snapshot", "snapshot"), journal.stored.jsonb("meta_payload", "snapshot")
        self._upsert = UPSERT.replace("{payload}", _jsonb_in("payload") if jsonb[0] else "%(payload)s").replace(
            "{meta_payload}", _jsonb_in("meta_payload") if jsonb[1] else "%(meta_payload)s")
        self._select = SELECT.format(snapshot=read_payload("snapshot", jsonb[0]),
                                     meta_payload=read_payload("meta_payload", jsonb[1]))

    def save(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
             tags: Iterable[str] = ()) -> None:
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        tag_list = check_tags(tags)
        serializers = self._journal.serializers
        encoded = serializers.serialize(snapshot, persistence_id=pid)
        meta = serializers.serialize(metadata, persistence_id=pid) if metadata is not None else None
        slice_ = slice_for_persistence_id(pid)
        params = {
            "slice": slice_, "entity_type": entity_type_of(pid), "pid": pid, "seq_nr": seq_nr,
            "write_timestamp": int(time.time() * 1000), "ser_id": encoded.ser_id, "manifest": encoded.manifest,
            "payload": encoded.payload, "tags": list(tag_list) or None,
            "meta_ser_id": meta.ser_id if meta else None, "meta_manifest": meta.manifest if meta else None,
            "meta_payload": meta.payload if meta else None,
        }
        with self._journal.connection() as conn:
            conn.execute(self._upsert.format(timestamp_of=self._journal.events.timestamp_of_sql(slice_)), params)

    def load(self, persistence_id: str, *, max_seq_nr: int | None = None,
             max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """The stored snapshot if it meets the criteria (at most ``max_seq_nr``, taken at or before
        ``max_timestamp``), else ``None``. The time of a snapshot is that of its event, or when it was saved
        if that event was not found."""
        pid = check_persistence_id(persistence_id)
        max_seq = 2**63 - 1 if max_seq_nr is None else check_seq_nr(max_seq_nr, "max_seq_nr")
        if max_timestamp is not None and (not isinstance(max_timestamp, datetime) or max_timestamp.tzinfo is None):
            raise InvalidArgument(f"max_timestamp must be a timezone-aware datetime, got {max_timestamp!r}")
        with self._journal.connection() as conn:
            row = conn.execute(self._select, (pid, max_seq, max_timestamp, max_timestamp)).fetchone()
        if row is None:
            return None
        pid, seq_nr, db_ts, write_ts, ser_id, manifest, payload, tags, meta_id, meta_manifest, meta = row
        serializers = self._journal.serializers
        where = f" of the snapshot of persistence id {pid!r} at seq_nr {seq_nr}"
        return SelectedSnapshot(
            pid, seq_nr, db_ts, write_ts,
            serializers.deserialize(ser_id, manifest, payload, where=where, persistence_id=pid, seq_nr=seq_nr),
            None if meta_id is None else serializers.deserialize(
                meta_id, meta_manifest or "", meta, where=f" of the metadata{where}", persistence_id=pid,
                seq_nr=seq_nr),
            tuple(tags or ()),
        )

    def delete(self, persistence_id: str) -> None:
        pid = check_persistence_id(persistence_id)
        with self._journal.connection() as conn:
            conn.execute(DELETE, (pid,))
