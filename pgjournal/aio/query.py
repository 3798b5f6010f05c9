"""``async_journal.query``: the reads of :class:`pgjournal.query.Query` as async iterators. Each runs the same
steps as the blocking face (:mod:`pgjournal.runtime.steps`) on the asyncio pool: the by-slice state machine, the
by-tag stream, the by-persistence-id reads, the gate, the horizon and the live loop's schedule."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.aio.live import AsyncLiveQuery
from pgjournal.buckets import check_bucket_size_step
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.model.slices import entity_type_of
from pgjournal.query.by_pid import PidSteps, check_range
from pgjournal.query.by_slices import Delivery, SliceQueries, SliceQuery, SliceRows
from pgjournal.query.by_tag import TagEnvelope, TagStream
from pgjournal.query.from_snapshots import Transform, snapshots_step
from pgjournal.runtime.live import Made
from pgjournal.runtime.steps import R, Step, adrive, adrive_ahead, arun_pooled
from pgjournal.tags.watermark import flushed_before_reading

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal
    from pgjournal.codec.serialization import SerializerRegistry


class AsyncQuery:
    """Every read of the journal, current (ends at the tail seen at start) and live (``close()`` stops it).
    ``serializers``: decode with these instead of the journal's (as :class:`pgjournal.query.Query`)."""

    def __init__(self, journal: AsyncJournal, *, serializers: SerializerRegistry | None = None) -> None:
        self._journal = journal
        self._serializers = serializers
        self._by_pid = PidSteps(journal, serializers)
        self._by_slices = journal.by_slices if serializers is None else AsyncBySlices(journal, serializers)

    async def _run(self, step: Step[R]) -> R:
        return await arun_pooled(step, self._journal.connection)

    # -- by persistence id ---------------------------------------------------------------------------

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> AsyncIterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.current_events_by_persistence_id`."""
        pid, start, to = check_range(persistence_id, from_seq_nr, to_seq_nr)
        return adrive(self._by_pid.current_steps(pid, start, to), self._journal.connection)

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> AsyncLiveQuery[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.events_by_persistence_id`."""
        state = self._by_pid.live_state(persistence_id, from_seq_nr, to_seq_nr)
        query: AsyncLiveQuery[EventEnvelope]

        async def poll(notified: bool) -> tuple[list[EventEnvelope], int]:
            return await self._run(self._by_pid.poll_step(state, notified, query.close))

        query = self._journal.live_query(poll, entity_types={entity_type_of(state.pid)})
        return query

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> AsyncIterator[str]:
        """:meth:`~pgjournal.faces.AsyncReads.current_persistence_ids`."""
        return adrive(self._by_pid.persistence_ids_steps(after, limit, entity_type=entity_type),
                      self._journal.connection)

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """:meth:`~pgjournal.faces.AsyncReads.timestamp_of`."""
        return await self._run(self._by_pid.timestamp_of_step(persistence_id, seq_nr))

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """:meth:`~pgjournal.faces.AsyncReads.load_envelope`."""
        return await self._run(self._by_pid.load_envelope_step(persistence_id, seq_nr))

    # -- by slices -----------------------------------------------------------------------------------

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                                 *, tags: Iterable[str] | None = None) -> AsyncIterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.current_events_by_slices`."""
        return self._by_slices.current(entity_type, min_slice, max_slice, offset, tags=tags)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                         *, tags: Iterable[str] | None = None) -> AsyncLiveQuery[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.events_by_slices`."""
        return self._by_slices.live(entity_type, min_slice, max_slice, offset, tags=tags)

    async def _from_snapshots(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset,
                              transform: Transform) -> tuple[SliceQuery, list[EventEnvelope]]:
        query = self._by_slices.query(entity_type, min_slice, max_slice, offset)
        return query, await self._run(snapshots_step(query, min_slice, max_slice, transform, self._serializers))

    async def current_events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.AsyncReads.current_events_by_slices_starting_from_snapshots`."""
        query, snapshots = await self._from_snapshots(entity_type, min_slice, max_slice, offset, transform)
        async for item in self._by_slices.run_current(query, snapshots):
            yield item

    async def events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> AsyncLiveQuery[EventEnvelope]:
        """The snapshots are read when the query is made (hence ``await``), then it runs like
        :meth:`events_by_slices`."""
        query, snapshots = await self._from_snapshots(entity_type, min_slice, max_slice, offset, transform)
        return self._by_slices.run_live(query, snapshots)

    # -- by tag --------------------------------------------------------------------------------------

    async def _tag_stream(self, tag: str, offset: Offset, *, live: bool) -> TagStream:
        size = await self._run(check_bucket_size_step(self._journal.settings.tag_bucket_size))
        return TagStream(self._journal, tag, offset, live=live, serializers=self._serializers, size=size)

    def current_events_by_tag(self, tag: str, offset: Offset = NoOffset) -> AsyncIterator[TagEnvelope]:
        """This journal's own tagged appends are written first, as on the blocking face."""
        return adrive_ahead(self._current_tag_steps(tag, offset), self._journal.connection)

    async def _current_tag_steps(self, tag: str, offset: Offset) -> Iterator[Step[Iterator[TagEnvelope]]]:
        if self._journal.tag_writer is not None:
            with flushed_before_reading():
                await self._journal.tag_writer.flush()
        return (await self._tag_stream(tag, offset, live=False)).current_steps()

    async def events_by_tag(self, tag: str, offset: Offset = NoOffset) -> AsyncLiveQuery[TagEnvelope]:
        """The tag view's bucket size is checked when the query is made (hence ``await``)."""
        stream = await self._tag_stream(tag, offset, live=True)

        async def poll(notified: bool) -> tuple[Made[Any, TagEnvelope], int]:
            return await self._run(stream.poll_step(notified))

        return self._journal.live_query(poll, entity_types=None, ahead=stream.poll_step)


class AsyncBySlices(SliceQueries["AsyncJournal"]):
    """The asyncio face of by-slice queries (the twin of :class:`pgjournal.query.by_slices.BySlices`): runs
    :class:`SliceQuery` steps on the journal's pool, where by-slice reads go (the replica when it has one)."""

    def current(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                rows: SliceRows | None = None, *, tags: Iterable[str] | None = None) -> AsyncIterator[Any]:
        """Events (or other ``rows``) up to the safe bound seen when the query starts."""
        return self.run_current(self.query(entity_type, min_slice, max_slice, offset, rows, tags=tags))

    async def run_current(self, query: SliceQuery, first: list[Any] | None = None) -> AsyncIterator[Any]:
        """A current by-slice query (after ``first``, the snapshots of one that starts from them)."""
        await arun_pooled(query.settle_step(), self._journal.read_connection)
        for item in first or ():
            yield item
        async for item in adrive(query.current_steps(), self._journal.read_connection):
            yield item

    def live(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
             rows: SliceRows | None = None, *, tags: Iterable[str] | None = None) -> AsyncLiveQuery[Any]:
        return self.run_live(self.query(entity_type, min_slice, max_slice, offset, rows, tags=tags))

    def run_live(self, query: SliceQuery, first: list[Any] | None = None,
                 before_poll: Callable[[], Awaitable[None]] | None = None) -> AsyncLiveQuery[Any]:
        """A live by-slice query (``first``: items handed out before its first poll; ``before_poll`` awaited
        before each poll, what it raises ending the query)."""
        self._journal.check_live_by_slices()

        async def poll(notified: bool) -> tuple[Made[Delivery, Any], int]:
            if before_poll is not None:
                await before_poll()
            deliveries, rows = await arun_pooled(query.poll_step(notified), self._journal.read_connection)
            return Made(deliveries, query.envelope), rows

        return self._journal.live_query(poll, entity_types={query.entity_type},
                                        settle=self._journal.read_margin + 0.005, first=first or ())
