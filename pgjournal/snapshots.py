"""Snapshots: the latest state of a persistence id at a sequence number (one row per persistence id)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument
from .store.snapshots import SnapshotSQL
from .validation import check_persistence_id, check_seq_nr, check_tags

if TYPE_CHECKING:
    from .journal import Journal


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
        #: The statements over ``snapshot`` (store layer), also for by-slice reads (:mod:`pgjournal.from_snapshots`).
        self.sql = SnapshotSQL(journal.dialect, journal.events, jsonb=journal.stored.jsonb("snapshot", "snapshot"),
                               meta_jsonb=journal.stored.jsonb("meta_payload", "snapshot"))

    def save(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
             tags: Iterable[str] = ()) -> None:
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        tag_list = check_tags(tags)
        serializers = self._journal.serializers
        encoded = serializers.serialize(snapshot, persistence_id=pid)
        meta = serializers.serialize(metadata, persistence_id=pid) if metadata is not None else None
        save = self.sql.save(pid, seq_nr, int(time.time() * 1000), encoded.ser_id, encoded.manifest, encoded.payload,
                             list(tag_list) or None, (meta.ser_id, meta.manifest, meta.payload) if meta else None)
        with self._journal.connection() as conn:
            conn.execute(*save)

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
            row = self.sql.load(pid, max_seq, max_timestamp).one(conn)
        if row is None:
            return None
        serializers = self._journal.serializers
        where = f" of the snapshot of persistence id {row.persistence_id!r} at seq_nr {row.seq_nr}"
        found = {"persistence_id": row.persistence_id, "seq_nr": row.seq_nr}
        return SelectedSnapshot(
            row.persistence_id, row.seq_nr, row.db_timestamp, row.write_timestamp,
            serializers.deserialize(row.ser_id, row.ser_manifest, row.snapshot, where=where, **found),
            None if row.meta_ser_id is None else serializers.deserialize(
                row.meta_ser_id, row.meta_ser_manifest or "", row.meta_payload, where=f" of the metadata{where}",
                **found),
            tuple(row.tags or ()),
        )

    def delete(self, persistence_id: str) -> None:
        pid = check_persistence_id(persistence_id)
        with self._journal.connection() as conn:
            conn.execute(*self.sql.delete(pid))
