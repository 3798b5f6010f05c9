"""``AsyncShardedJournal``: the asyncio face of :class:`~pgjournal.shards.journal.ShardedJournal`, one
:class:`~pgjournal.aio.journal.AsyncJournal` per database, routed by the same rules (:mod:`pgjournal.shards.layout`)
and checked against the same layout record (:mod:`pgjournal.shards.record`)."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pgjournal.aio.journal import AsyncJournal
from pgjournal.errors import ConcurrencyConflict, DatabaseUnavailable, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.server.dsn import mask_dsn
from pgjournal.settings import Settings
from pgjournal.shards.journal import Shards, shard_settings
from pgjournal.shards.layout import Layout, Record, ShardSettings, format_range
from pgjournal.shards.migrate import migrate_all
from pgjournal.shards.record import read_record_step
from pgjournal.shards.routing import (
    REREAD_INTERVAL,
    Follow,
    Known,
    Moved,
    P,
    Routed,
    Routing,
    StreamFollow,
    after_conflict,
    found_nothing,
    known_databases,
    once,
    opening_routing,
)

if TYPE_CHECKING:
    from pgjournal.aio.live import AsyncLiveQuery
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.query.by_slices import SliceRows
    from pgjournal.state.durable_state import DurableState, DurableStateChange
    from pgjournal.state.snapshots import SelectedSnapshot


T = TypeVar("T")


class AsyncShardedJournal(Routed[AsyncJournal]):
    """An asyncio event journal over the databases of a slice-range layout (see ``ShardedJournal``)."""

    def __init__(self, known: Sequence[Known[AsyncJournal]], routing: Routing[AsyncJournal]) -> None:
        super().__init__(known, routing, known[0].journal.settings.layout_wait)
        self.query = AsyncShardedQuery(self)
        self.durable_state = AsyncShardedDurableState(self)

    @classmethod
    def open(cls, shards: Shards | None = None, *, serializers: SerializerRegistry | None = None,
             migrate: bool = False, **settings: Any) -> _Opening:
        """``await AsyncShardedJournal.open(...)`` or ``async with AsyncShardedJournal.open(...) as journal``; the
        same checks as ``ShardedJournal.open``."""
        return _Opening(cls._open(shard_settings(shards, settings), serializers, migrate, settings))

    @classmethod
    async def _open(cls, shards: ShardSettings, serializers: SerializerRegistry | None, migrate: bool,
                    settings: dict[str, Any]) -> AsyncShardedJournal:
        if migrate:  # Alembic is blocking: in a thread
            await asyncio.to_thread(migrate_all, shards, Settings.load(**settings))
        journals: list[AsyncJournal] = []
        try:
            for index, dsn in enumerate(shards.dsns):
                try:
                    journals.append(await AsyncJournal.open(dsn, serializers=serializers,
                                                            replica=shards.replica_of(dsn), **settings))
                except (DatabaseUnavailable, SchemaNotMigrated) as exc:
                    raise type(exc)(f"the database of slices {format_range(shards.ranges[index])}: {exc}") from None
            for dsn in shards.spares:
                try:
                    journals.append(await AsyncJournal.open(dsn, serializers=serializers,
                                                            replica=shards.replica_of(dsn), **settings))
                except (DatabaseUnavailable, SchemaNotMigrated) as exc:
                    raise type(exc)(f"the spare database {mask_dsn(dsn)}: {exc}") from None
            known = known_databases(shards, journals)
            routing = opening_routing(shards, known, [await journal.run(read_record_step()) for journal in journals])
        except BaseException:
            await _close_all(journals)
            raise
        return cls(known, routing)

    async def close(self) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.close`."""
        await _close_all(known.journal for known in self._known)

    async def __aenter__(self) -> AsyncShardedJournal:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- routing ---------------------------------------------------------------------------------------

    async def check_layout(self) -> Layout:
        """As ``ShardedJournal.check_layout``: the layout routed from now on, a newer one followed."""
        return await self._follow(self._routing, None)

    async def _follow(self, seen: Routing[AsyncJournal], refused: ShardLayoutMismatch | None) -> Layout:
        """As ``ShardedJournal._follow`` (the rule: :func:`~pgjournal.shards.routing.next_routing`)."""
        follow = Follow(seen, self._known, refused, self.layout_wait)
        while True:
            routing = follow.decide(await self._records())
            if routing is not None:
                break
            await asyncio.sleep(REREAD_INTERVAL)
        if routing is not seen:
            self._routing = routing
        return routing.layout

    async def _write(self, persistence_id: str, write: Callable[[AsyncJournal], Awaitable[T]]) -> T:
        """As ``ShardedJournal._write``: a write refused by a guard is retried once on the layout followed, one
        failing its sequence number check once where its range went."""
        routing = self._routing
        try:
            return await write(routing.for_persistence_id(persistence_id))
        except ShardLayoutMismatch as refused:
            if self._routing is routing:
                await self._follow(routing, refused)
        except ConcurrencyConflict as conflict:
            if self._routing is routing:
                moved = (after_conflict(routing, self._known, await self._records(), persistence_id)
                         if found_nothing(conflict) else None)
                if moved is None:
                    raise
                self._routing = moved
        return await write(self._routing.for_persistence_id(persistence_id))

    async def _records(self) -> list[Record | None]:
        return [await known.journal.run(read_record_step()) for known in self._known]

    async def migrate(self) -> None:
        """Migrate every database of the layout and record it (:func:`~pgjournal.shards.migrate.migrate_all`; in a
        thread, as Alembic is blocking)."""
        await asyncio.to_thread(migrate_all, self.shards, self.journals[0].settings)

    # -- writes, snapshots -----------------------------------------------------------------------------

    async def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
                     tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncJournalFace.append`."""
        batch, labels = once(events), once(tags)
        return await self._write(persistence_id, lambda journal: journal.append(
            persistence_id, batch, expected_seq_nr=expected_seq_nr, tags=labels, metadata=metadata))

    async def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """:meth:`~pgjournal.faces.AsyncJournalFace.delete_events`."""
        return await self._write(persistence_id, lambda journal: journal.delete_events(persistence_id, to_seq_nr))

    async def highest_seq_nr(self, persistence_id: str) -> int:
        """:meth:`~pgjournal.faces.AsyncJournalFace.highest_seq_nr`."""
        return await self.journal_for(persistence_id).highest_seq_nr(persistence_id)

    async def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                            tags: Iterable[str] = ()) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.save_snapshot`."""
        await self._write(persistence_id, lambda journal: journal.save_snapshot(persistence_id, seq_nr, snapshot,
                                                                                metadata=metadata, tags=tags))

    async def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                            max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.load_snapshot`."""
        return await self.journal_for(persistence_id).load_snapshot(persistence_id, max_seq_nr=max_seq_nr,
                                                                    max_timestamp=max_timestamp)

    async def delete_snapshot(self, persistence_id: str) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.delete_snapshot`."""
        await self._write(persistence_id, lambda journal: journal.delete_snapshot(persistence_id))


class AsyncShardedQuery:
    """``journal.query`` of an asyncio sharded journal (the routing of ``ShardedQuery``)."""

    def __init__(self, journal: AsyncShardedJournal) -> None:
        self._journal = journal

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> AsyncIterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.current_events_by_persistence_id`."""
        return self._journal.journal_for(persistence_id).query.current_events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> AsyncLiveQuery[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.events_by_persistence_id`."""
        return self._journal.journal_for(persistence_id).query.events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """:meth:`~pgjournal.faces.AsyncReads.timestamp_of`."""
        return await self._journal.journal_for(persistence_id).query.timestamp_of(persistence_id, seq_nr)

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """:meth:`~pgjournal.faces.AsyncReads.load_envelope`."""
        return await self._journal.journal_for(persistence_id).query.load_envelope(persistence_id, seq_nr)

    async def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                      entity_type: str | None = None) -> AsyncIterator[str]:
        """Every database's ids after ``after``, merged in id order, at most ``limit``."""
        sources = [journal.query.current_persistence_ids(after, limit, entity_type=entity_type)
                   for journal in self._journal.journals]
        heads: list[tuple[str, int]] = []
        try:
            for index, source in enumerate(sources):
                async for first in source:
                    heads.append((first, index))
                    break
            heapq.heapify(heads)
            given = 0
            while heads and (limit is None or given < limit):
                pid, index = heapq.heappop(heads)
                yield pid
                given += 1
                async for following in sources[index]:
                    heapq.heappush(heads, (following, index))
                    break
        finally:  # a source left part-read gives its connection back now
            for source in sources:
                closing = getattr(source, "aclose", None)
                if closing is not None:
                    await closing()

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                                 *, tags: Iterable[str] | None = None) -> AsyncIterator[EventEnvelope]:
        """Read from the one database holding ``min_slice..max_slice`` only."""
        return self._journal.journal_for_slices(min_slice, max_slice).query.current_events_by_slices(
            entity_type, min_slice, max_slice, offset, tags=tags)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> AsyncFollowingSlices[EventEnvelope]:
        """As ``ShardedQuery.events_by_slices``: live, following a move of the range by itself."""
        return AsyncFollowingSlices(self._journal, entity_type, min_slice, max_slice, offset, tags=tags)

    def current_events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> AsyncIterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.current_events_by_slices_starting_from_snapshots`."""
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return query.current_events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                                      transform=transform)

    async def events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> AsyncLiveQuery[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.events_by_slices_starting_from_snapshots`."""
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return await query.events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                                    transform=transform)


class AsyncFollowingSlices(Generic[P]):
    """The asyncio face of ``FollowingSlices`` (the rule: :class:`~pgjournal.shards.routing.StreamFollow`)."""

    def __init__(self, journal: AsyncShardedJournal, entity_type: str, min_slice: int, max_slice: int,
                 offset: Offset, rows: Callable[[AsyncJournal], SliceRows] | None = None, *,
                 tags: Iterable[str] | None = None) -> None:
        self._sharded, self._entity_type, self._rows, self._tags = journal, entity_type, rows, tags
        self._follow = StreamFollow(journal, min_slice, max_slice, offset)
        self._closed = False
        self._live = self._open()

    def _open(self) -> AsyncLiveQuery[P]:
        follow = self._follow
        by_slices, rows = follow.journal.by_slices, self._rows(follow.journal) if self._rows else None
        query = by_slices.query(self._entity_type, *follow.range, follow.offset, rows, tags=self._tags)
        return by_slices.run_live(query, before_poll=self._check)

    async def _check(self) -> None:
        if not self._follow.due():
            return
        try:
            await self._sharded.check_layout()
        except Exception as exc:
            self._follow.checked(exc)
        else:
            self._follow.checked(None)

    def __aiter__(self) -> AsyncIterator[P]:
        return self

    async def __anext__(self) -> P:
        while True:
            try:
                item = await self._live.__anext__()
            except Moved:
                self._live.close()
                if self._closed:
                    raise StopAsyncIteration from None
                self._live = self._open()
                continue
            except BaseException:
                self._live.close()
                raise
            self._follow.offset = item.offset
            return item

    def close(self) -> None:
        self._closed = True
        self._live.close()

    async def aclose(self) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed or self._live.closed

    async def __aenter__(self) -> AsyncFollowingSlices[P]:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()


class AsyncShardedDurableState:
    """``journal.durable_state`` of an asyncio sharded journal."""

    def __init__(self, journal: AsyncShardedJournal) -> None:
        self._journal = journal

    async def get(self, persistence_id: str) -> DurableState | None:
        """:meth:`~pgjournal.faces.AsyncDurableStates.get`."""
        return await self._journal.journal_for(persistence_id).durable_state.get(persistence_id)

    async def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """:meth:`~pgjournal.faces.AsyncDurableStates.upsert`."""
        return await self._journal._write(persistence_id, lambda journal: journal.durable_state.upsert(
            persistence_id, revision, value, tag))

    async def delete(self, persistence_id: str, revision: int) -> DurableState:
        """:meth:`~pgjournal.faces.AsyncDurableStates.delete`."""
        return await self._journal._write(persistence_id, lambda journal: journal.durable_state.delete(
            persistence_id, revision))

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> AsyncIterator[DurableStateChange]:
        """:meth:`~pgjournal.faces.AsyncDurableStates.current_changes_by_slices`."""
        return self._journal.journal_for_slices(min_slice, max_slice).durable_state.current_changes_by_slices(
            entity_type, min_slice, max_slice, offset)

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> AsyncFollowingSlices[DurableStateChange]:
        """Live, following a move of the range by itself (as ``ShardedDurableState.changes_by_slices``)."""
        return AsyncFollowingSlices(self._journal, entity_type, min_slice, max_slice, offset,
                                    rows=lambda journal: journal.durable_state.rows())


class _Opening:
    """``await AsyncShardedJournal.open(...)`` or ``async with AsyncShardedJournal.open(...) as journal``."""

    def __init__(self, opening: Any) -> None:
        self._opening = opening
        self._journal: AsyncShardedJournal | None = None

    def __await__(self) -> Generator[Any, None, AsyncShardedJournal]:
        return self._opening.__await__()  # type: ignore[no-any-return]

    async def __aenter__(self) -> AsyncShardedJournal:
        self._journal = await self._opening
        return self._journal

    async def __aexit__(self, *_exc: object) -> None:
        if self._journal is not None:
            await self._journal.close()


async def _close_all(journals: Iterable[AsyncJournal]) -> None:
    """Close every journal, even when one fails to; the first failure is raised after."""
    failure: BaseException | None = None
    for journal in journals:
        try:
            await journal.close()
        except BaseException as exc:  # the others must still close
            failure = failure or exc
    if failure is not None:
        raise failure
