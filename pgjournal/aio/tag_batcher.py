"""The asyncio face of the batched tag writer (:mod:`pgjournal.write.tag_batcher`): the same
:class:`~pgjournal.write.tag_batch.TagBatch` and the same work
(:class:`~pgjournal.write.tag_writer_rules.TagWriterRules`: which statements, in which order, retried how), run by a
task of the journal's event loop on a connection of its own, with an :class:`asyncio.Lock` keeping this writer's
statements one at a time. Heartbeat, recovery and close behave as on the blocking face: ``AsyncJournal.close()``
writes what is pending or raises :class:`~pgjournal.errors.TagFlushFailed` (the writer's row stays, so its events are
recovered)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import psycopg

from pgjournal.aio.connections import async_limited_connection_class
from pgjournal.core import journal_core as core
from pgjournal.runtime.steps import R, Work, arun_work
from pgjournal.server.connections import unreachable
from pgjournal.write.tag_batch import Recovered
from pgjournal.write.tag_writer_rules import TagWriterRules

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal


class AsyncTagBatcher(TagWriterRules):
    """The asyncio face: the journal's batched tag writer, a task that starts with the first tagged append. Use it
    from the journal's event loop."""

    _journal: AsyncJournal

    def __init__(self, journal: AsyncJournal) -> None:
        super().__init__(journal)
        self._io = asyncio.Lock()
        self._conn: psycopg.AsyncConnection | None = None
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the append path --------------------------------------------------------------------------------

    async def begin(self, entity_type: str) -> int:
        """Before a tagged append runs (see :meth:`~pgjournal.write.tag_batch.TagBatch.begin`); the first one
        of an entity type first records it in this writer's row."""
        if not self.batch.knows(entity_type):
            async with self._io:
                await self._do(self._register_work(entity_type))
                if self._task is None:
                    self._task = asyncio.get_running_loop().create_task(self._loop(), name="pgjournal-tag-writer")
        return self.batch.begin()

    def _wake(self) -> None:
        self._event.set()

    # -- writing ----------------------------------------------------------------------------------------

    async def flush(self) -> None:
        """:meth:`TagBatcher.flush <pgjournal.write.tag_batcher.TagBatcher.flush>`."""
        if not self._registered or self.batch.caught_up():
            return
        async with self._io:
            try:
                await self._do(self._flush_work())
            except Exception as exc:
                raise self._report(exc) from exc

    async def _do(self, work: Work[R]) -> R:
        return await arun_work(work, self._connection, self._pause)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._conn = await self._open_connection()
        try:
            yield conn
        except psycopg.OperationalError as exc:
            lost = core.lost_connection(self._journal.dsn, conn, exc)
            if lost is None:
                raise
            await self._disconnect()
            raise lost from exc

    async def _open_connection(self) -> psycopg.AsyncConnection:
        """A connection made as the pool's are (autocommit, pgjournal's limits), for this writer alone."""
        options = core.pool_options(self._journal.settings, self._journal.dsn)
        try:
            return await async_limited_connection_class(self._journal.settings).connect(
                self._journal.dsn, **options["kwargs"])
        except psycopg.OperationalError as exc:
            raise unreachable(self._journal.dsn, exc) from None

    async def _disconnect(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    # -- the task -----------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        failures = 0
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), self._wait(failures))
            self._event.clear()
            if self._closing:
                return
            try:
                async with self._io:
                    if self._closing:
                        return
                    await self._do(self._round_work())
                failures = 0
            except Exception as exc:  # reported; nothing pending is dropped, the next round tries again
                failures += 1
                self._report(exc)

    async def close(self) -> None:
        """Stop the task, write what is pending and drop this writer's row. Raises
        :class:`~pgjournal.errors.TagFlushFailed` when the rows cannot be written: the row stays for recovery."""
        self._closing = True
        self._event.set()
        if self._task is not None:
            await self._task
        async with self._io:
            try:
                await self._do(self._close_work())
            except Exception as exc:
                raise self._report(exc) from exc
            finally:
                await self._disconnect()

    async def recover(self, silent_for: float | None = None) -> list[Recovered]:
        """:meth:`TagBatcher.recover <pgjournal.write.tag_batcher.TagBatcher.recover>`."""
        async with self._io:
            return await self._do(self._recover_work(self._timeout if silent_for is None else silent_for))
