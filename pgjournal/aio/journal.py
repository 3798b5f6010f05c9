"""``async with AsyncJournal.open(dsn) as journal: await journal.append(...); journal.query...``: the journal on
an ``AsyncConnectionPool``. Everything it decides comes from the code the blocking face runs: the open
steps and :class:`~pgjournal.core.journal_core.JournalCore`, the write path's statement
(:mod:`pgjournal.write.event_writer`,
:mod:`pgjournal.write.append_steps`), the stores, the queries' steps and the live loop's schedule."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Generator, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgjournal.admin import migrate as migrations
from pgjournal.admin.stored_format import StoredFormat
from pgjournal.aio.connections import AsyncPoolFront, async_limited_connection_class
from pgjournal.aio.durable_state import AsyncDurableStateStore
from pgjournal.aio.live import AsyncLiveQuery, AsyncPoll
from pgjournal.aio.pipelining import AppendPipeline
from pgjournal.aio.query import AsyncBySlices, AsyncQuery
from pgjournal.aio.signals import AsyncSignals
from pgjournal.aio.tag_batcher import AsyncTagBatcher
from pgjournal.aio.transaction import AsyncTransaction, transaction
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.core import journal_core as core
from pgjournal.core.capabilities import Capabilities
from pgjournal.core.journal_core import JournalCore
from pgjournal.model.envelope import EventEnvelope
from pgjournal.query.by_pid import PidSteps
from pgjournal.runtime.contention import KeyedLocks
from pgjournal.runtime.live import T
from pgjournal.runtime.steps import Step, arun, arun_pooled, count_of
from pgjournal.server.connections import connection_kwargs, unreachable
from pgjournal.settings import Settings
from pgjournal.state.snapshots import SelectedSnapshot, delete_statement, load_step, save_statement, save_step
from pgjournal.validation import check_persistence_id, check_seq_nr
from pgjournal.write.append_steps import append_step
from pgjournal.write.event_writer import WriterRules
from pgjournal.write.group_commit import allowed_step


class AsyncJournal(JournalCore):
    """An event journal on one database for asyncio code. Open one per process (and event loop) and share it;
    use it from the event loop it was opened on."""

    def __init__(self, dsn: str, settings: Settings, serializers: SerializerRegistry,
                 capabilities: Capabilities, stored: StoredFormat | None = None, replica: str | None = None) -> None:
        super().__init__(dsn, settings, serializers, capabilities, stored, replica)
        self.signals: AsyncSignals | None = (AsyncSignals(dsn, connection_kwargs(settings)) if capabilities.notify
                                             else None)
        self._pool = AsyncConnectionPool(dsn, connection_class=async_limited_connection_class(settings),
                                         name="pgjournal-async", **core.pool_options(settings, dsn))
        #: Every borrowing of a pool connection goes through this front (see AsyncPoolFront).
        self.connections = AsyncPoolFront(self._pool, settings.pool_max_size, settings.connect_timeout)
        #: By-slice reads on a hot standby (``replica``): its own pool, the same limits.
        self._replica_pool = None if replica is None else AsyncConnectionPool(
            replica, connection_class=async_limited_connection_class(settings), name="pgjournal-async-replica",
            **core.pool_options(settings, replica))
        self.replica_connections = None if self._replica_pool is None else AsyncPoolFront(
            self._replica_pool, settings.pool_max_size, settings.connect_timeout)
        #: The batched tag writer (see :mod:`pgjournal.aio.tag_batcher`); None: tag rows are written in the
        #: append's own statement.
        self.tag_writer = AsyncTagBatcher(self) if settings.batched_tags else None
        #: What the blocking face's writer knows per persistence id, its counts, and signals after commit.
        self._writer = WriterRules(self, after_commit=self.signals.written if self.signals else None)
        #: Appends of this journal's tasks to one persistence id take turns (pgjournal.runtime.contention), as threads
        #: do.
        self._turns = KeyedLocks(lock=asyncio.Lock)
        #: Appends that would wait for a connection are sent together (pgjournal.aio.pipelining).
        self._pipeline = AppendPipeline(self, settings.pool_max_size, enabled=settings.async_pipeline)
        self.by_pid = PidSteps(self)
        self.by_slices = AsyncBySlices(self)
        self.query = AsyncQuery(self)
        #: Durable state (pgjournal.state.durable_state's rules, awaited).
        self.durable_state = AsyncDurableStateStore(self)

    @classmethod
    def open(cls, dsn: str | None = None, *, serializers: SerializerRegistry | None = None, migrate: bool = False,
             replica: str | None = None, **settings: Any) -> Opening[AsyncJournal]:
        """Connect (to the embedded server when no DSN is given or set) and check the schema, as
        :meth:`Journal.open <pgjournal.Journal.open>` does (``replica``: a hot standby for by-slice reads).
        ``journal = await AsyncJournal.open(...)``, or ``async with AsyncJournal.open(...) as journal:`` (closed
        when the block ends)."""
        return Opening(cls._open(dsn, serializers, migrate, replica, settings))

    @classmethod
    async def _open(cls, dsn: str | None, serializers: SerializerRegistry | None, migrate: bool,
                    replica: str | None, settings: dict[str, Any]) -> AsyncJournal:
        resolved, loaded = core.opening(dsn, serializers, migrate, settings)
        standby = core.replica_of(replica)
        conn = await _connect(resolved, loaded)
        async with conn:
            if migrate:  # Alembic is blocking: in a thread
                await asyncio.to_thread(migrations.upgrade, resolved, loaded.dialect)
            capabilities, stored, loaded = await arun(core.open_step(resolved, loaded), conn)
            if loaded.async_pipeline and not await arun(allowed_step(loaded), conn):
                loaded = replace(loaded, async_pipeline=False)
            primary = await arun(core.primary_step(), conn) if standby is not None else None
        if standby is not None:
            async with await _connect(standby, loaded) as conn:
                await arun(core.replica_step(standby, primary), conn)
        journal = cls(resolved, loaded, core.registry(serializers, stored), capabilities, stored, standby)
        await journal._pool.open(wait=False)
        if journal._replica_pool is not None:
            await journal._replica_pool.open(wait=False)
        return journal

    # -- lifecycle -----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the journal; the batched tag writer first writes what is pending (else raises
        :class:`~pgjournal.errors.TagFlushFailed`, after closing the rest)."""
        try:
            if self.tag_writer is not None:
                await self.tag_writer.close()
        finally:
            await self._pipeline.close()
            if self.signals is not None:
                await self.signals.close()
            await self.connections.close()
            await self._pool.close()
            if self._replica_pool is not None and self.replica_connections is not None:
                await self.replica_connections.close()
                await self._replica_pool.close()

    async def __aenter__(self) -> AsyncJournal:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def connection(self) -> _Borrowed:
        """``async with journal.connection() as conn``: an autocommit connection of the pool (a broken one is
        discarded on return; one returned inside a transaction is rolled back by the pool)."""
        return _Borrowed(self.connections, self.dsn, self.settings)

    def read_connection(self) -> _Borrowed:
        """A connection for by-slice reads: to the replica when the journal has one, else :meth:`connection`."""
        if self.replica_connections is None or self.replica_dsn is None:
            return self.connection()
        return _Borrowed(self.replica_connections, self.replica_dsn, self.settings)

    async def open_connection(self) -> psycopg.AsyncConnection:
        """A connection of its own, made as the pool's are (autocommit, pgjournal's limits), for a background
        writer that runs one heavy statement over and over (:mod:`pgjournal.aio.tag_batcher`). The caller closes
        it."""
        options = core.pool_options(self.settings, self.dsn)
        try:
            return await async_limited_connection_class(self.settings).connect(self.dsn, **options["kwargs"])
        except psycopg.OperationalError as exc:
            raise unreachable(self.dsn, exc) from None

    async def run(self, step: Step[T]) -> T:
        """Run a step (:mod:`pgjournal.runtime.steps`) on a connection of the pool (borrowed at its first statement)."""
        return await arun_pooled(step, self.connection)

    run_on_primary = run

    def live_query(self, poll: AsyncPoll[T], *, entity_types: Iterable[str] | None = None, settle: float = 0.0,
                   first: Iterable[T] = (), ahead: Callable[[bool], Step[tuple[Iterable[T], int]]] | None = None
                   ) -> AsyncLiveQuery[T]:
        """Wrap ``poll`` in the asyncio live loop, woken by writers' signals where they are on. ``ahead``: ``poll``
        as a step, for a query whose next poll may run while this one's items are handed out (read ahead in a
        catch-up: ``poll`` started as a task)."""
        return AsyncLiveQuery(poll, self.schedule(settle), self.signals.subscribe(entity_types) if self.signals
                              else None, first, ahead=ahead is not None)

    async def migrate(self) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.migrate`."""
        await asyncio.to_thread(migrations.upgrade, self.dsn, self.settings.dialect)

    # -- writes --------------------------------------------------------------------------------------

    async def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
                     tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """:meth:`Journal.append <pgjournal.Journal.append>`: atomically, after ``expected_seq_nr``; a
        :class:`~pgjournal.errors.ConcurrencyConflict` writes nothing. Cancelling it leaves all of the events
        written or none (one statement), and the connection back in the pool.

        Tasks appending to one persistence id take turns (they never collide in the database); an append that
        would wait for a connection rides in a pipeline with others (:mod:`pgjournal.aio.pipelining`)."""
        plan = self._writer.plan(persistence_id, events, expected_seq_nr, tags, metadata)
        if plan is None:
            return []
        batcher = self.tag_writer if plan.tags else None
        # The batched tag writer writes the tag view rows later (pgjournal.aio.tag_batcher).
        ticket = await batcher.begin(plan.entity_type) if batcher is not None else 0
        started = time.perf_counter()
        try:
            async with self._turns[plan.pid]:
                rows = await self._pipeline.submit(plan) if self._pipeline.takes(plan) else None
                if rows is None:  # on a connection of its own, with the write path's conflict and retry rules
                    async with self.connection() as conn:
                        rows = await arun(append_step(self, plan), conn)
        except BaseException as exc:
            self._writer.failed(plan)
            if batcher is not None:
                batcher.failed(ticket, plan.pid, plan.slice, plan.tags, exc)
            raise
        if batcher is not None:
            batcher.written(ticket, plan.pid, plan.slice, plan.tags, rows)
        return self._writer.committed(plan, rows, time.perf_counter() - started)

    def transaction(self, *, savepoints: bool = False) -> contextlib.AbstractAsyncContextManager[AsyncTransaction]:
        """``async with journal.transaction() as tx:`` appends and your own SQL on ``tx.connection`` that commit
        or roll back together (the rules: :mod:`pgjournal.write.transaction`)."""
        return transaction(self, savepoints=savepoints)

    async def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """Mark events up to ``to_seq_nr`` deleted (every read skips them; sequence numbers stay taken)."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(to_seq_nr, "to_seq_nr")
        return await self.run(count_of(self.events.mark_deleted(pid, to_seq_nr)))

    async def highest_seq_nr(self, persistence_id: str) -> int:
        """:meth:`~pgjournal.faces.JournalFace.highest_seq_nr`."""
        return await self.run(self.by_pid.highest_seq_nr_step(check_persistence_id(persistence_id)))

    # -- snapshots -----------------------------------------------------------------------------------

    async def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                            tags: Iterable[str] = ()) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.save_snapshot`."""
        await self.run(save_step(save_statement(self, persistence_id, seq_nr, snapshot, metadata=metadata,
                                                tags=tags), persistence_id))

    async def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                            max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.load_snapshot`."""
        return await self.run(load_step(self, persistence_id, max_seq_nr=max_seq_nr, max_timestamp=max_timestamp))

    async def delete_snapshot(self, persistence_id: str) -> None:
        """:meth:`~pgjournal.faces.AsyncJournalFace.delete_snapshot`."""
        await self.run(count_of(delete_statement(self, persistence_id)))


class _Borrowed:
    """A connection of the journal's pool for an ``async with`` block, a lost connection reported as a typed
    error (a class, not a generator-based context manager: this runs once per append)."""

    __slots__ = ("_conn", "_dsn", "_front", "_settings")

    def __init__(self, front: AsyncPoolFront, dsn: str, settings: Settings) -> None:
        self._front, self._dsn, self._settings = front, dsn, settings

    async def __aenter__(self) -> psycopg.AsyncConnection:
        try:
            conn: psycopg.AsyncConnection = await self._front.get()
            self._conn = conn
        except PoolTimeout:
            raise core.no_connection(self._dsn, self._settings) from None
        return self._conn

    async def __aexit__(self, kind: Any, exc: Any, _tb: Any) -> None:
        await self._front.put(self._conn)
        if isinstance(exc, psycopg.OperationalError):
            lost = core.lost_connection(self._dsn, self._conn, exc)
            if lost is not None:
                raise lost from exc


async def _connect(dsn: str, settings: Settings) -> psycopg.AsyncConnection:
    """One autocommit connection for opening; an unreachable server is a typed error."""
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=True, **connection_kwargs(settings))
    except psycopg.OperationalError as exc:
        raise unreachable(dsn, exc) from None


class Closes(Protocol):
    async def close(self) -> None: ...


Opened = TypeVar("Opened", bound=Closes)


class Opening(Generic[Opened]):
    """What an asyncio journal's ``open`` returns: ``await`` it for the journal, or ``async with`` it (the journal
    closed when the block ends)."""

    def __init__(self, opening: Coroutine[Any, Any, Opened]) -> None:
        self._opening = opening
        self._journal: Opened | None = None

    def __await__(self) -> Generator[Any, None, Opened]:
        return self._opening.__await__()

    async def __aenter__(self) -> Opened:
        self._journal = await self._opening
        return self._journal

    async def __aexit__(self, *_exc: object) -> None:
        if self._journal is not None:
            await self._journal.close()
