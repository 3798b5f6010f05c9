"""The asyncio projection runner: :class:`projections.logic.RangeLogic`'s rules (the same validation, offsets,
modes, retries and failure modes as :class:`~projections.runner.RangeRunner`) on an
:class:`~pgjournal.aio.AsyncJournal`, as tasks of one event loop.

Handlers may be coroutines: ``ExactlyOnce(async def handle(conn, envelope))`` and ``Grouped(async def
handle(conn, envelopes))`` get the unit's ``psycopg.AsyncConnection`` inside its open transaction (their
writes commit with the offsets); ``AtLeastOnce(async def handle(envelope))`` runs outside any transaction of
ours. A plain function is called as it is (it must not block the loop for long). Leases (workers) are the
blocking runner's; this one runs a range it is given (``run_range_async``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from pgjournal.aio import AsyncLiveQuery, AsyncQuery
from pgjournal.errors import ProjectionFailed
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import Offset
from pgjournal.model.printable import printable_logger

from .handlers import Projection
from .logic import CHUNKS, RangeLogic

if TYPE_CHECKING:
    from pgjournal.aio import AsyncJournal
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.shards import AsyncShardedJournal

log = printable_logger("projections")


class AsyncRangeRunner(RangeLogic):
    """One projection over ``min_slice..max_slice`` on an asyncio journal. ``await run()`` until :meth:`stop`
    (or a failure); or :meth:`start` it as a task and ``await join()``."""

    def __init__(self, journal: AsyncJournal | AsyncShardedJournal, projection: Projection, min_slice: int,
                 max_slice: int, *, source: AsyncJournal | AsyncShardedJournal | None = None,
                 serializers: SerializerRegistry | None = None) -> None:
        super().__init__(journal, projection, min_slice, max_slice, guard=None, stop=asyncio.Event(), source=source,
                         serializers=serializers)
        self.reading = AsyncQuery(self.source, serializers=self.serializers)
        self.task: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[list[EventEnvelope] | BaseException] = asyncio.Queue()
        self._reader: tuple[AsyncLiveQuery[EventEnvelope], asyncio.Task[None]] | None = None

    async def run(self) -> None:
        """Process until stopped. Raises :class:`ProjectionFailed`."""
        await self.journal.run(self.run_step())

    def start(self) -> asyncio.Task[None]:
        """Run as a task; a failure is kept in :attr:`failed` (and logged)."""

        async def target() -> None:
            try:
                await self.run()
            except ProjectionFailed as exc:
                log.error("%s", exc)
            except Exception as exc:
                self.failed = exc
                log.exception("projection %s %s crashed", self.projection.name, self.key)

        self.task = asyncio.get_running_loop().create_task(target(), name=f"projection-{self.projection.name}")
        return self.task

    async def join(self, timeout: float | None = None) -> None:
        if self.task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout)

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    # -- the asyncio face ----------------------------------------------------------------------------

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _next(self, timeout: float) -> list[EventEnvelope]:
        try:
            item = await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return []
        if isinstance(item, BaseException):
            raise item
        return item

    def _open_reader(self, offset: Offset) -> None:
        query = self.reading.events_by_slices(self.projection.entity_type, self.min_slice, self.max_slice, offset,
                                             tags=self.projection.tags)
        inbox: asyncio.Queue[list[EventEnvelope] | BaseException] = asyncio.Queue(maxsize=CHUNKS)
        self._inbox = inbox
        self._reader = (query, asyncio.get_running_loop().create_task(
            _read(query, inbox, self.source.settings.buffer_size), name=f"read-{self.projection.name}"))

    def _close_reader(self) -> None:
        if self._reader is not None:
            (query, task), self._reader = self._reader, None
            query.close()
            task.cancel()


async def _read(query: AsyncLiveQuery[EventEnvelope], inbox: asyncio.Queue[list[EventEnvelope] | BaseException],
                chunk: int) -> None:
    try:
        async for env in query:
            await inbox.put([env, *query.ready(chunk - 1)])
    except Exception as exc:  # handed to the consuming task
        await inbox.put(exc)


def run_range_async(journal: AsyncJournal | AsyncShardedJournal, projection: Projection, min_slice: int,
                    max_slice: int) -> AsyncRangeRunner:
    """Start a runner for one range as a task; ``stop()`` and ``await join()`` it."""
    runner = AsyncRangeRunner(journal, projection, min_slice, max_slice)
    runner.start()
    return runner
