"""Durable state: the latest state of each persistence id, with a revision, in Akka's ``durable_state`` table.

``upsert(pid, revision, value)`` is optimistic: ``revision`` must be the current revision + 1 (1 for a new
persistence id), else :class:`~pgjournal.errors.RevisionConflict` and nothing is written. ``delete(pid,
revision)`` writes Akka's deleted state (an empty payload) at that revision, so readers of the changes see the
deletion and the revision keeps counting. ``changes_by_slices`` reads the table with the journal's by-slice
machinery (:class:`~pgjournal.query.by_slices.SliceQuery`): the same TimestampOffsets, horizon and backtracking,
and each persistence id's latest revision delivered (a revision overwritten before the reader came by is
never seen, as in Akka), never one older than a revision already delivered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from pgjournal.errors import RetriesExhausted, RevisionConflict, SchemaNotMigrated
from pgjournal.model.envelope import Source
from pgjournal.model.offsets import NoOffset, Offset, TimestampOffset
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.runtime.contention import KeyedLocks
from pgjournal.runtime.live import LiveQuery
from pgjournal.runtime.steps import Sleep, Step, rows_of, run_pooled, statement
from pgjournal.store.durable_state import DELETED_SER_ID
from pgjournal.validation import check_name, check_persistence_id, check_seq_nr
from pgjournal.write.failures import Failure, classify, refused, server_message, unknown

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore, JournalCore

#: The timestamp of a state not written yet (the write step sets the database's).
_NO_TIME = datetime.min


@dataclass(frozen=True, slots=True)
class DurableState:
    """A persistence id's stored state. ``value`` is ``None`` when ``deleted``; ``revision`` counts on."""

    persistence_id: str
    revision: int
    value: Any
    db_timestamp: datetime
    tags: tuple[str, ...] = ()
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class DurableStateChange:
    """What ``changes_by_slices`` delivers: a persistence id's state at a revision (Akka's
    ``UpdatedDurableState``, or ``DeletedDurableState`` when ``deleted``), with the offset to resume after it."""

    persistence_id: str
    revision: int
    slice: int
    entity_type: str
    db_timestamp: datetime
    offset: TimestampOffset
    value: Any
    deleted: bool = False
    tags: tuple[str, ...] = ()
    source: Source = Source.QUERY


class _StateRows:
    """``durable_state`` as the rows of a by-slice query (see :class:`pgjournal.query.by_slices.SliceRows`)."""

    contiguous = False  # one row per persistence id, overwritten: only its latest revision can be read

    def __init__(self, store: DurableStateRules) -> None:
        self._store = store
        capabilities = store.journal.capabilities
        if capabilities.writer_horizon and not capabilities.state_relations:
            raise SchemaNotMigrated("the database has no durable_state table; run `pgjournal migrate`")
        self.horizon_relations = capabilities.state_relations

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]:
        return self._store.sql.page_sql(min_slice, max_slice)

    def envelope(self, row: tuple[Any, ...], offset: TimestampOffset, source: Source) -> DurableStateChange:
        state = self._store.decode(row)
        return DurableStateChange(state.persistence_id, state.revision, row[0], row[1], state.db_timestamp, offset,
                                  state.value, state.deleted, state.tags, source)


class DurableStateRules:
    """What both faces' durable state stores share: the SQL, decoding, the by-slice rows, and reads and writes as
    steps (:mod:`pgjournal.runtime.steps`); a face adds its driver, its turns per persistence id and its queries."""

    def __init__(self, journal: JournalCore) -> None:
        self.journal = journal
        #: The SQL over durable_state (store layer).
        self.sql = journal.dialect.durable_state_store()
        self._retry = journal.settings.retry_policy
        self._retryable = journal.dialect.retryable_sqlstates

    def get_step(self, pid: str) -> Step[DurableState | None]:
        """:meth:`get` as a step (:mod:`pgjournal.runtime.steps`), for a blocking or an asyncio connection."""
        rows = yield statement(self.sql.get(pid))
        return self.decode(rows[0]) if rows else None

    def decode(self, row: tuple[Any, ...]) -> DurableState:
        """A row of :data:`pgjournal.store.durable_state.STATE_COLUMNS` as a :class:`DurableState`."""
        _slice, _entity_type, pid, revision, ts, ser_id, manifest, payload, tags = row
        if ser_id == DELETED_SER_ID:  # Akka tells a deleted state by the ser_id alone (its payload may be NULL)
            return DurableState(pid, revision, None, ts, tuple(tags or ()), deleted=True)
        value = self.journal.serializers.deserialize(
            ser_id, manifest or "", payload, where=f" of the durable state of persistence id {pid!r} revision "
            f"{revision}", persistence_id=pid, seq_nr=revision)
        return DurableState(pid, revision, value, ts, tuple(tags or ()))

    def rows(self) -> _StateRows:
        """``durable_state`` as the rows of a by-slice query."""
        return _StateRows(self)

    def upsert_write(self, persistence_id: str, revision: int, value: Any, tag: str | None = None
                     ) -> tuple[str, Step[DurableState]]:
        """Check and serialize an upsert (see :meth:`DurableStateStore.upsert`): its persistence id and its
        write as a step."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(revision, "revision", minimum=1)
        tags = (check_name(tag, "tag"),) if tag not in (None, "") else ()
        encoded = self.journal.serializers.serialize(value, persistence_id=pid)
        write = self._write_step(pid, revision, encoded.ser_id, encoded.manifest, encoded.payload, tags)
        return pid, self._state_step(write, DurableState(pid, revision, value, _NO_TIME, tags))

    def delete_write(self, persistence_id: str, revision: int) -> tuple[str, Step[DurableState]]:
        """Check a delete (see :meth:`DurableStateStore.delete`): its persistence id and its write as a step."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(revision, "revision", minimum=1)
        write = self._write_step(pid, revision, DELETED_SER_ID, "", b"", ())
        return pid, self._state_step(write, DurableState(pid, revision, None, _NO_TIME, (), deleted=True))

    def written(self, pid: str) -> None:
        """After a write committed: wake the live queries of its entity type."""
        if self.journal.signals is not None:
            self.journal.signals.written(slice_for_persistence_id(pid), entity_type_of(pid))

    @staticmethod
    def _state_step(write: Step[datetime], state: DurableState) -> Step[DurableState]:
        ts = yield from write
        return replace(state, db_timestamp=ts)

    def _write_step(self, pid: str, revision: int, ser_id: int, manifest: str, payload: bytes,
                    tags: tuple[str, ...]) -> Step[datetime]:
        """One statement, transient failures retried under the journal's
        :class:`~pgjournal.runtime.contention.RetryPolicy` (its pause yielded as a
        :class:`~pgjournal.runtime.steps.Sleep`)."""
        query = self.sql.write(pid, revision, ser_id, manifest, payload, list(tags) or None)
        what = f"writing the durable state of {pid!r}"
        attempt = 0
        while True:
            attempt += 1
            error: psycopg.Error | None
            try:
                rows = yield statement(query)
            except psycopg.Error as exc:  # a clash is a conflict: revision 1 raced another first write
                failure, error = classify(exc, retryable=self._retryable), exc
            else:
                if rows:
                    return rows[0][0]  # type: ignore[no-any-return]
                failure, error = classify(None), None  # not the current revision + 1
            if failure is Failure.CONFLICT:
                raise RevisionConflict(pid, revision, (yield from self._current_revision_step(pid)))
            assert error is not None
            if failure is Failure.UNKNOWN:
                raise unknown(what, "it", "Retrying with the same revision is safe: it writes, or raises "
                              "RevisionConflict.", error) from error
            if failure is Failure.REFUSED:
                raise refused(what, error, pid) from error
            pause = self._retry.next_pause(attempt, error.sqlstate)
            if pause is None:
                raise RetriesExhausted(f"writing revision {revision} of the durable state of {pid!r} failed "
                                       f"{attempt} times, the last with SQLSTATE {error.sqlstate} "
                                       f"({server_message(error)}); nothing was written") from error
            yield Sleep(pause)  # one statement, one transaction: running it again is safe

    def _current_revision_step(self, pid: str) -> Step[int | None]:
        try:
            rows = yield from rows_of(self.sql.revision(pid))
        except psycopg.Error:
            return None
        return int(rows[0][0]) if rows else 0


class SliceReads(Protocol):
    """The blocking face's by-slice reads (:class:`pgjournal.query.by_slices.BySlices`, above this module), over
    durable state's rows."""

    def current(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset, rows: _StateRows
                ) -> Iterator[Any]: ...

    def live(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset, rows: _StateRows
             ) -> LiveQuery[Any]: ...


class DurableStateStore(DurableStateRules):
    """The durable state store of a journal (``journal.durable_state``); thread-safe like the journal.
    ``by_slices``: the journal's by-slice reads, which its changes by slices run on."""

    journal: BlockingCore

    def __init__(self, journal: BlockingCore, by_slices: SliceReads) -> None:
        super().__init__(journal)
        self._by_slices = by_slices
        #: Writes of this process to one persistence id take turns; retries back off (pgjournal.runtime.contention).
        self._turns = KeyedLocks()

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, persistence_id: str) -> DurableState | None:
        """:meth:`~pgjournal.faces.DurableStates.get`."""
        pid = check_persistence_id(persistence_id)
        return run_pooled(self.get_step(pid), self.journal.connection)

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> Iterator[DurableStateChange]:
        """:meth:`~pgjournal.faces.DurableStates.current_changes_by_slices`."""
        return self._by_slices.current(entity_type, min_slice, max_slice, offset, rows=self.rows())

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> LiveQuery[DurableStateChange]:
        """:meth:`~pgjournal.faces.DurableStates.changes_by_slices`."""
        return self._by_slices.live(entity_type, min_slice, max_slice, offset, rows=self.rows())

    # -- writes --------------------------------------------------------------------------------------

    def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """:meth:`~pgjournal.faces.DurableStates.upsert`."""
        return self._run(*self.upsert_write(persistence_id, revision, value, tag))

    def delete(self, persistence_id: str, revision: int) -> DurableState:
        """:meth:`~pgjournal.faces.DurableStates.delete`."""
        return self._run(*self.delete_write(persistence_id, revision))

    def _run(self, pid: str, write: Step[DurableState]) -> DurableState:
        """Threads of this process writing ``pid`` take turns (see :mod:`pgjournal.runtime.contention`)."""
        with self._turns[pid]:
            state = run_pooled(write, self.journal.connection)
        self.written(pid)
        return state


__all__ = ["DurableState", "DurableStateChange", "DurableStateRules", "DurableStateStore"]
