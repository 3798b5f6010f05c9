"""What a journal face is, declared once: the operations every journal offers its callers, whatever its face
(blocking or asyncio) and however many databases it spans (one, or a sharded layout). Each protocol is the
documentation of its operations (as Akka writes its docs once, on its query traits); a face's own docstring is a
line that says where it runs them. ``tests/architecture/test_faces.py`` checks that :class:`~pgjournal.Journal`,
:class:`~pgjournal.ShardedJournal` (:class:`JournalFace`), :class:`~pgjournal.aio.AsyncJournal` and
:class:`~pgjournal.shards.AsyncShardedJournal` (:class:`AsyncJournalFace`) offer these with the same names and
parameters, awaited where the asyncio face awaits, so that an operation added to one face and not the others
fails there.

Shared logic above the faces (routing, entities) is typed against these protocols rather than against one face."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, Protocol, TypeVar

from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.state.durable_state import DurableState, DurableStateChange
from pgjournal.state.snapshots import SelectedSnapshot

T_co = TypeVar("T_co", covariant=True)


class LiveStream(Protocol[T_co]):
    """A live query of the blocking face: an iterator that never ends by itself; ``close()`` (from any thread) or
    leaving ``with`` stops it."""

    def __iter__(self) -> Iterator[T_co]: ...
    def __next__(self) -> T_co: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> LiveStream[T_co]: ...
    def __exit__(self, *_exc: object) -> None: ...


class AsyncLiveStream(Protocol[T_co]):
    """A live query of the asyncio face: an async iterator that never ends by itself; ``close()`` or leaving
    ``async with`` stops it. Use it from the event loop it runs on."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...
    async def __anext__(self) -> T_co: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...


# -- reads ---------------------------------------------------------------------------------------------


class Reads(Protocol):
    """``journal.query``: every read, in a *current* form (ends at the tail seen when it starts) and a *live*
    form (keeps polling until closed). By persistence id in its database; by slices in the one database of the
    range (a range across the databases of a sharded layout is refused)."""

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> Iterator[EventEnvelope]:
        """The events ``from_seq_nr..to_seq_nr`` of ``persistence_id`` (not deleted), in sequence order, up to
        the highest written when the query starts."""
        ...

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> LiveStream[EventEnvelope]:
        """Like :meth:`current_events_by_persistence_id`, but keeps polling (ends after ``to_seq_nr``)."""
        ...

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> Iterator[str]:
        """Persistence ids after ``after`` in id order, at most ``limit`` (``None``: all), keyset-paged;
        with ``entity_type`` only that type's (Akka's ``currentPersistenceIds(entityType, afterId, limit)``).
        A sharded journal merges every database's in id order (as Akka over its data partitions)."""
        ...

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of event ``seq_nr`` of ``persistence_id``; ``None`` when there is none (or it is
        deleted). Akka's ``timestampOf``."""
        ...

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """Event ``seq_nr`` of ``persistence_id``; raises :class:`~pgjournal.errors.EventNotFound` when there
        is none (or it is deleted). Akka's ``loadEnvelope``."""
        ...

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                                 *, tags: Iterable[str] | None = None) -> Iterator[EventEnvelope]:
        """Events of ``entity_type`` in slices ``min_slice..max_slice`` after ``offset``, up to the tail seen
        when the query starts; each once, per persistence id in sequence order. ``tags``: only the events
        carrying any of them, filtered by the database (see :mod:`pgjournal.query.by_slices`)."""
        ...

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> LiveStream[EventEnvelope]:
        """Like :meth:`current_events_by_slices`, but keeps polling; ``close()`` (or ``with``) stops it. A sharded
        journal's follows a move of the range to another database by itself."""
        ...

    def current_events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> Iterator[EventEnvelope]:
        """Like :meth:`current_events_by_slices`, but a persistence id with a snapshot taken after ``offset``
        starts with that snapshot (an envelope with ``source`` ``snapshot``, its sequence number, and
        ``transform(snapshot)`` as its event) and continues with its events after it. Akka's
        ``currentEventsBySlicesStartingFromSnapshots``; see :mod:`pgjournal.query.from_snapshots`."""
        ...

    def events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> LiveStream[EventEnvelope]:
        """Like :meth:`current_events_by_slices_starting_from_snapshots`, but keeps polling; ``close()`` (or
        ``with``) stops it."""
        ...


class AsyncReads(Protocol):
    """``journal.query`` of the asyncio faces: the reads of :class:`Reads`, as async iterators. A read that must
    ask the database before its stream exists (a snapshot read first) is awaited."""

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> AsyncIterator[EventEnvelope]:
        """:meth:`Reads.current_events_by_persistence_id`."""
        ...

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> AsyncLiveStream[EventEnvelope]:
        """:meth:`Reads.events_by_persistence_id`."""
        ...

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> AsyncIterator[str]:
        """:meth:`Reads.current_persistence_ids`."""
        ...

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """:meth:`Reads.timestamp_of`."""
        ...

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """:meth:`Reads.load_envelope`."""
        ...

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                                 *, tags: Iterable[str] | None = None) -> AsyncIterator[EventEnvelope]:
        """:meth:`Reads.current_events_by_slices`."""
        ...

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> AsyncLiveStream[EventEnvelope]:
        """:meth:`Reads.events_by_slices`."""
        ...

    def current_events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`Reads.current_events_by_slices_starting_from_snapshots`."""
        ...

    async def events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> AsyncLiveStream[EventEnvelope]:
        """:meth:`Reads.events_by_slices_starting_from_snapshots`; the snapshots are read when the query is
        made (hence ``await``)."""
        ...


# -- durable state -------------------------------------------------------------------------------------


class DurableStates(Protocol):
    """``journal.durable_state``: Akka's durable state store, the latest state per persistence id with revisions,
    and its changes by slices."""

    def get(self, persistence_id: str) -> DurableState | None:
        """The current state (``deleted`` set after :meth:`delete`), ``None`` when never written."""
        ...

    def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """Store ``value`` as revision ``revision`` (the current revision + 1; 1 for a new persistence id) with
        an optional ``tag``. Raises :class:`~pgjournal.errors.RevisionConflict` otherwise; nothing is written."""
        ...

    def delete(self, persistence_id: str, revision: int) -> DurableState:
        """Mark the state deleted at ``revision`` (the current revision + 1, as for :meth:`upsert`): Akka's
        ``deleteObject(persistenceId, revision)``. A later upsert continues at ``revision + 1``."""
        ...

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> Iterator[DurableStateChange]:
        """The states of ``entity_type`` in slices ``min_slice..max_slice`` changed after ``offset``, up to the
        bound seen when the query starts, in (db_timestamp, revision) order: each persistence id's latest
        revision, each revision at most once."""
        ...

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> LiveStream[DurableStateChange]:
        """Like :meth:`current_changes_by_slices`, but keeps polling; ``close()`` (or ``with``) stops it."""
        ...


class AsyncDurableStates(Protocol):
    """``journal.durable_state`` of the asyncio faces: :class:`DurableStates`, awaited."""

    async def get(self, persistence_id: str) -> DurableState | None:
        """:meth:`DurableStates.get`."""
        ...

    async def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """:meth:`DurableStates.upsert`."""
        ...

    async def delete(self, persistence_id: str, revision: int) -> DurableState:
        """:meth:`DurableStates.delete`."""
        ...

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> AsyncIterator[DurableStateChange]:
        """:meth:`DurableStates.current_changes_by_slices`."""
        ...

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> AsyncLiveStream[DurableStateChange]:
        """:meth:`DurableStates.changes_by_slices`."""
        ...


# -- the journal ---------------------------------------------------------------------------------------


class JournalFace(Protocol):
    """A blocking journal: writes, snapshots, its reads (``query``), its durable state (``durable_state``) and
    its lifecycle (``with`` closes it). Thread-safe; open one per process and share it."""

    @property
    def query(self) -> Reads:
        """Every read (:class:`Reads`)."""
        ...

    @property
    def durable_state(self) -> DurableStates:
        """The durable state store (:class:`DurableStates`)."""
        ...

    def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
               tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """Append ``events`` atomically after ``expected_seq_nr`` (the highest sequence number the caller
        has seen, 0 for a new persistence id; ``None``: after whatever is there).

        Raises :class:`~pgjournal.errors.ConcurrencyConflict` when another writer got there first; then
        nothing of the batch is written.
        """
        ...

    def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """Mark events up to ``to_seq_nr`` deleted (every read skips them; sequence numbers stay taken): how
        many were marked."""
        ...

    def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest sequence number written for ``persistence_id`` (deleted events count), 0 when none."""
        ...

    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> None:
        """Store ``snapshot`` of ``persistence_id`` as of ``seq_nr`` (one per persistence id: it replaces the one
        before)."""
        ...

    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """The snapshot of ``persistence_id`` if it is within ``max_seq_nr`` and ``max_timestamp``, else
        ``None``."""
        ...

    def delete_snapshot(self, persistence_id: str) -> None:
        """Delete the snapshot of ``persistence_id`` (none: nothing happens)."""
        ...

    def migrate(self) -> None:
        """Upgrade the schema of every database of this journal to the current version."""
        ...

    def close(self) -> None:
        """Close the journal: pending batched tag rows are written first (else
        :class:`~pgjournal.errors.TagFlushFailed`, after closing the rest)."""
        ...

    def __enter__(self) -> JournalFace: ...
    def __exit__(self, *_exc: object) -> None: ...


class AsyncJournalFace(Protocol):
    """An asyncio journal: :class:`JournalFace`, awaited; ``async with`` closes it. Use it from the event loop it
    was opened on."""

    @property
    def query(self) -> AsyncReads:
        """Every read (:class:`AsyncReads`)."""
        ...

    @property
    def durable_state(self) -> AsyncDurableStates:
        """The durable state store (:class:`AsyncDurableStates`)."""
        ...

    async def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
                     tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """:meth:`JournalFace.append`. Cancelling it leaves all of the events written or none."""
        ...

    async def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """:meth:`JournalFace.delete_events`."""
        ...

    async def highest_seq_nr(self, persistence_id: str) -> int:
        """:meth:`JournalFace.highest_seq_nr`."""
        ...

    async def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                            tags: Iterable[str] = ()) -> None:
        """:meth:`JournalFace.save_snapshot`."""
        ...

    async def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                            max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """:meth:`JournalFace.load_snapshot`."""
        ...

    async def delete_snapshot(self, persistence_id: str) -> None:
        """:meth:`JournalFace.delete_snapshot`."""
        ...

    async def migrate(self) -> None:
        """:meth:`JournalFace.migrate` (Alembic is blocking: in a thread)."""
        ...

    async def close(self) -> None:
        """:meth:`JournalFace.close`."""
        ...

    async def __aenter__(self) -> AsyncJournalFace: ...
    async def __aexit__(self, *_exc: object) -> None: ...

__all__ = ["AsyncDurableStates", "AsyncJournalFace", "AsyncLiveStream", "AsyncReads", "DurableStates",
           "JournalFace", "LiveStream", "Reads"]
