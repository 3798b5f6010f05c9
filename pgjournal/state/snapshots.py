"""Snapshots: the latest state of a persistence id at a sequence number (one row per persistence id)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg.errors

from pgjournal.errors import InvalidArgument
from pgjournal.runtime.steps import Step, first_of, run_pooled, statement
from pgjournal.store import Query
from pgjournal.validation import check_persistence_id, check_seq_nr, check_tags
from pgjournal.write.failures import guard_refusal

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore, JournalCore


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
    """The blocking face of snapshots (``journal.snapshots``); the rules and statements are the functions
    below, which the asyncio face runs too."""

    def __init__(self, journal: BlockingCore) -> None:
        self._journal = journal
        #: The statements over ``snapshot`` (store layer), also for by-slice reads
        #: (:mod:`pgjournal.query.from_snapshots`).
        self.sql = journal.snapshot_sql

    def save(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
             tags: Iterable[str] = ()) -> None:
        run_pooled(save_step(save_statement(self._journal, persistence_id, seq_nr, snapshot, metadata=metadata,
                                            tags=tags), persistence_id), self._journal.connection)

    def load(self, persistence_id: str, *, max_seq_nr: int | None = None,
             max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """The stored snapshot if it meets the criteria (at most ``max_seq_nr``, taken at or before
        ``max_timestamp``), else ``None``. The time of a snapshot is that of its event, or when it was saved
        if that event was not found."""
        step = load_step(self._journal, persistence_id, max_seq_nr=max_seq_nr, max_timestamp=max_timestamp)
        return run_pooled(step, self._journal.connection)

    def delete(self, persistence_id: str) -> None:
        delete = delete_statement(self._journal, persistence_id)
        with self._journal.connection() as conn:
            conn.execute(*delete)


def save_step(save: tuple[str, Any], persistence_id: str) -> Step[None]:
    """Run ``save``; a row the shard guard refuses is ``ShardLayoutMismatch`` (the write path's rule)."""
    try:
        yield statement(save)
    except psycopg.errors.CheckViolation as exc:
        misplaced = guard_refusal(f"saving a snapshot of {persistence_id!r}", exc, persistence_id)
        if misplaced is None:
            raise
        raise misplaced from exc


def save_statement(journal: JournalCore, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                   tags: Iterable[str] = ()) -> Query:
    """The statement that saves a snapshot (checked and serialized), unless a newer one is stored."""
    pid = check_persistence_id(persistence_id)
    check_seq_nr(seq_nr, "seq_nr", minimum=1)
    tag_list = check_tags(tags)
    serializers = journal.serializers
    encoded = serializers.serialize(snapshot, persistence_id=pid)
    meta = serializers.serialize(metadata, persistence_id=pid) if metadata is not None else None
    return journal.snapshot_sql.save(pid, seq_nr, int(time.time() * 1000), encoded.ser_id, encoded.manifest,
                                     encoded.payload, list(tag_list) or None,
                                     (meta.ser_id, meta.manifest, meta.payload) if meta else None)


def load_step(journal: JournalCore, persistence_id: str, *, max_seq_nr: int | None = None,
              max_timestamp: datetime | None = None) -> Step[SelectedSnapshot | None]:
    """Loading a snapshot (see :meth:`SnapshotStore.load`) as a step."""
    pid = check_persistence_id(persistence_id)
    max_seq = 2**63 - 1 if max_seq_nr is None else check_seq_nr(max_seq_nr, "max_seq_nr")
    if max_timestamp is not None and (not isinstance(max_timestamp, datetime) or max_timestamp.tzinfo is None):
        raise InvalidArgument(f"max_timestamp must be a timezone-aware datetime, got {max_timestamp!r}")
    row = yield from first_of(journal.snapshot_sql.load(pid, max_seq, max_timestamp))
    if row is None:
        return None
    serializers = journal.serializers
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


def delete_statement(journal: JournalCore, persistence_id: str) -> Query:
    return journal.snapshot_sql.delete(check_persistence_id(persistence_id))
