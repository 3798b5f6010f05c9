"""``AsyncShardedJournal``: the asyncio face of :class:`~pgjournal.shards.journal.ShardedJournal`, one
:class:`~pgjournal.aio.journal.AsyncJournal` per database, routed by the same steps
(:mod:`pgjournal.shards.routed`), which this face runs with :func:`~pgjournal.runtime.steps.arun_calls`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pgjournal.aio.journal import AsyncJournal, Opening
from pgjournal.faces import AsyncDurableStates, AsyncReads
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.runtime.steps import arun_calls
from pgjournal.shards import routed
from pgjournal.shards.routed import Following, RoutedDurableState, RoutedJournal, RoutedParts, awaited, by_pid, by_range
from pgjournal.shards.routing import Known, Moved, P, Routing

if TYPE_CHECKING:
    from pgjournal.aio.live import AsyncLiveQuery
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.state.durable_state import DurableStateChange


class AsyncShardedJournal(RoutedJournal[AsyncJournal]):
    """An asyncio event journal over the databases of a slice-range layout (see ``ShardedJournal``)."""

    def __init__(self, known: Sequence[Known[AsyncJournal]], routing: Routing[AsyncJournal]) -> None:
        super().__init__(known, routing, known[0].journal.settings.layout_wait)
        self.query = AsyncShardedQuery(self)
        self.durable_state = AsyncShardedDurableState(self)

    @classmethod
    def open(cls, shards: routed.Shards | None = None, *, serializers: SerializerRegistry | None = None,
             migrate: bool = False, **settings: Any) -> Opening[AsyncShardedJournal]:
        """``await AsyncShardedJournal.open(...)`` or ``async with AsyncShardedJournal.open(...) as journal``; the
        same checks as ``ShardedJournal.open``."""
        chosen = routed.shard_settings(shards, settings)

        async def opening() -> AsyncShardedJournal:
            journals: list[AsyncJournal] = []
            try:
                known, routing = await arun_calls(routed.opening_step(chosen, migrate, settings, lambda dsn: (
                    AsyncJournal.open(dsn, serializers=serializers, replica=chosen.replica_of(dsn), **settings)),
                    cls._in_thread, journals))
            except BaseException:
                await routed.aclose_all(journals)
                raise
            return cls(known, routing)

        return Opening(opening())

    _in_thread = staticmethod(lambda fn, *args: asyncio.to_thread(fn, *args))  # Alembic is blocking

    async def close(self) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.close`: every database's journal."""
        await routed.aclose_all(known.journal for known in self._known)

    async def __aenter__(self) -> AsyncShardedJournal:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    check_layout = awaited(RoutedJournal.check_layout_step)
    migrate = awaited(RoutedJournal.migrate_step)
    append = awaited(RoutedJournal.append_step)
    delete_events = awaited(RoutedJournal.delete_events_step)
    highest_seq_nr = awaited(RoutedJournal.highest_seq_nr_step)
    save_snapshot = awaited(RoutedJournal.save_snapshot_step)
    load_snapshot = awaited(RoutedJournal.load_snapshot_step)
    delete_snapshot = awaited(RoutedJournal.delete_snapshot_step)


class AsyncShardedQuery(RoutedParts[AsyncJournal]):
    """``journal.query`` of an asyncio sharded journal (the routing of ``ShardedQuery``)."""

    current_events_by_persistence_id = by_pid(AsyncReads.current_events_by_persistence_id)
    events_by_persistence_id = by_pid(AsyncReads.events_by_persistence_id)
    timestamp_of = by_pid(AsyncReads.timestamp_of)
    load_envelope = by_pid(AsyncReads.load_envelope)
    current_events_by_slices = by_range(AsyncReads.current_events_by_slices)
    current_events_by_slices_starting_from_snapshots = by_range(
        AsyncReads.current_events_by_slices_starting_from_snapshots)
    events_by_slices_starting_from_snapshots = by_range(AsyncReads.events_by_slices_starting_from_snapshots)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> AsyncIterator[str]:
        """:meth:`~pgjournal.faces.Reads.current_persistence_ids`: every database's, merged in id order."""
        return routed.amerged([journal.query.current_persistence_ids(after, limit, entity_type=entity_type)
                               for journal in self._journal.journals], limit)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> AsyncFollowingSlices[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.events_by_slices`: live, following a move of the range by itself."""
        return AsyncFollowingSlices(self._journal, entity_type, min_slice, max_slice, offset, tags=tags)


class AsyncShardedDurableState(RoutedDurableState[AsyncJournal]):
    """``journal.durable_state`` of an asyncio sharded journal."""

    get = by_pid(AsyncDurableStates.get, "durable_state")
    upsert = awaited(RoutedDurableState.upsert_step)
    delete = awaited(RoutedDurableState.delete_step)
    current_changes_by_slices = by_range(AsyncDurableStates.current_changes_by_slices, "durable_state")

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> AsyncFollowingSlices[DurableStateChange]:
        """:meth:`~pgjournal.faces.DurableStates.changes_by_slices`, following a move of the range by itself."""
        return AsyncFollowingSlices(self._journal, entity_type, min_slice, max_slice, offset,
                                    rows=lambda journal: journal.durable_state.rows())


class AsyncFollowingSlices(Following[AsyncJournal, P]):
    """The asyncio face of ``FollowingSlices`` (:class:`~pgjournal.shards.routed.Following`): an async iterator."""

    _live: AsyncLiveQuery[P]

    _check = awaited(Following._check_step)

    def __aiter__(self) -> AsyncIterator[P]:
        return self

    async def __anext__(self) -> P:
        while True:
            try:
                item = await self._live.__anext__()
            except Moved:
                if self._reopened():
                    continue
                raise StopAsyncIteration from None
            except BaseException:
                self._live.close()
                raise
            return self._handed(item)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncFollowingSlices[P]:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

