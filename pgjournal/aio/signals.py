"""LISTEN/NOTIFY wake-ups for asyncio live queries, with the rules of :mod:`pgjournal.runtime.signals`: a writer only
records that an entity type changed, *after* its commit; a sender task sends one coalesced ``NOTIFY`` per
entity type at most every :data:`~pgjournal.runtime.signals.SEND_INTERVAL`; a listener task
(``AsyncConnection.notifies()``)
sets the events of the live queries that care. Signals only cut latency: a lost one costs a poll interval."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import psycopg

from pgjournal.model.printable import printable_logger
from pgjournal.runtime.signals import SEND_INTERVAL, SENDER_SETUP, Listening, notify_sql, wakes
from pgjournal.runtime.steps import arun_work

_log = printable_logger("pgjournal.runtime.signals")


class AsyncSignals:
    def __init__(self, dsn: str, connect_kwargs: dict[str, Any] | None = None) -> None:
        self._dsn = dsn
        self._kwargs = connect_kwargs or {}
        self._pending: set[str] = set()
        self._due = asyncio.Event()
        self._subscribers: dict[asyncio.Event, frozenset[str] | None] = {}
        self._closed = False
        self._sender: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None

    # -- writers -------------------------------------------------------------------------------------

    def written(self, _slice: int, entity_type: str) -> None:
        """Record that ``entity_type`` got events (call it after the commit); the sender notifies soon. The
        sender is woken only when the set goes from empty to non-empty (as in :mod:`pgjournal.runtime.signals`: a
        wake-up
        per append would cost a task switch per append)."""
        if entity_type in self._pending:
            return
        wake = not self._pending
        self._pending.add(entity_type)
        if wake:
            self._due.set()
        if self._sender is None and not self._closed:
            self._sender = asyncio.get_running_loop().create_task(self._send_loop(), name="pgjournal-notify")

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        conn: psycopg.AsyncConnection | None = None
        next_send = 0.0
        try:
            while True:
                while not self._pending and not self._closed:
                    self._due.clear()
                    await self._due.wait()
                if not self._pending:
                    break  # closed, and everything recorded has been sent
                if (wait := next_send - loop.time()) > 0 and not self._closed:
                    await asyncio.sleep(wait)  # one round of signals per SEND_INTERVAL
                batch, self._pending = self._pending, set()
                next_send = loop.time() + SEND_INTERVAL
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True, **self._kwargs)
                        await conn.execute(SENDER_SETUP)
                    await conn.execute(notify_sql(conn, batch))  # type: ignore[arg-type]
                except psycopg.Error as exc:  # best effort: readers still poll
                    _log.debug("notification lost: %s", exc.__class__.__name__)
                    conn = None
                    await asyncio.sleep(0.1)
        finally:
            if conn is not None:
                await conn.close()

    # -- readers -------------------------------------------------------------------------------------

    def subscribe(self, entity_types: Iterable[str] | None = None) -> Callable[[asyncio.Event], Callable[[], None]]:
        """A ``subscribe`` hook for :class:`~pgjournal.aio.live.AsyncLiveQuery` (``None``: every entity type)."""
        wanted = None if entity_types is None else frozenset(entity_types)

        def attach(event: asyncio.Event) -> Callable[[], None]:
            self._subscribers[event] = wanted
            if self._listener is None and not self._closed:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # made outside the event loop: the query polls without wake-ups
                    _log.debug("live query made outside a running event loop: no LISTEN wake-ups")
                else:
                    self._listener = loop.create_task(self._listen_loop(), name="pgjournal-listen")
            return lambda: self._detach(event)

        return attach

    def _detach(self, event: asyncio.Event) -> None:
        self._subscribers.pop(event, None)

    def _wake(self, entity_type: str | None) -> None:
        for event, wanted in self._subscribers.items():
            if wakes(wanted, entity_type):
                event.set()

    async def _listen_loop(self) -> None:
        listening = Listening(lambda: self._closed, self._wake, _receive)
        await arun_work(listening.work(), self._listener_connection, listening.pause)

    @contextlib.asynccontextmanager
    async def _listener_connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True, **self._kwargs) as conn:
            yield conn

    async def close(self) -> None:
        """Send what is pending, stop listening."""
        self._closed = True
        self._due.set()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await self._listener
        if self._sender is not None:
            with contextlib.suppress(psycopg.Error):
                await asyncio.wait_for(self._sender, timeout=2)


async def _receive(conn: psycopg.AsyncConnection) -> list[psycopg.Notify]:
    """The next signals (close cancels the wait)."""
    return [note async for note in conn.notifies(stop_after=1)]
