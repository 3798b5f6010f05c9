"""The asyncio twin of :class:`pgjournal.server.connections.LimitedConnection`: a pool connection that gives up on an
answer after the round-trip limit (``statement_timeout + tcp_user_timeout``) and is closed, raising
:class:`~pgjournal.server.connections.ServerSilent` (the same :data:`~pgjournal.server.connections.WATCHDOG` cuts
it)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed, PoolTimeout

from pgjournal.server.connections import WATCHDOG, closed_journal, round_trip_ended, round_trip_limit
from pgjournal.settings import Settings

_IDLE = TransactionStatus.IDLE


class AsyncLimitedConnection(psycopg.AsyncConnection[Any]):
    limit: float | None = None

    async def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        limit = self.limit
        if limit is None:
            return await super().wait(gen, *args, **kwargs)
        WATCHDOG.arm(self, limit)
        try:
            result = await super().wait(gen, *args, **kwargs)
        except BaseException:
            round_trip_ended(self, limit, failed=True)
            raise
        round_trip_ended(self, limit, failed=False)
        return result


def async_limited_connection_class(settings: Settings) -> type[AsyncLimitedConnection]:
    return type("AsyncLimitedConnection", (AsyncLimitedConnection,), {"limit": round_trip_limit(settings)})


class AsyncPoolFront:
    """The asyncio pool's connections kept in front of it, so a borrow is a list pop or a future handed a
    connection by the task that returns one, not a round through ``AsyncConnectionPool.getconn``, whose client CPU
    per borrow is a large share of a raw INSERT's (``python -m bench async-append``: 200 tasks, 8 connections).

    The pool still opens, checks, resets and replaces every connection: the front takes one from it when it
    holds fewer than ``size`` and none is idle; a connection that is closed, broken or not idle (a transaction
    left open, a cancelled statement) goes back to the pool, and so does one return in ``recycle_every`` (the
    pool's lifetime and idle limits apply). Waiting borrowers are served in order, each within ``timeout``.
    """

    def __init__(self, pool: Any, size: int, timeout: float, *, recycle_every: int = 500) -> None:
        self.pool = pool
        self._size = size
        self._timeout = timeout
        self._idle: list[Any] = []
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        #: Connections taken from the pool and not handed back to it.
        self._held = 0
        self._returns = 0
        self._recycle_every = recycle_every
        self._closed = False

    async def get(self) -> Any:
        """An idle connection (raises the pool's ``PoolTimeout`` when none comes within ``timeout``,
        :class:`~pgjournal.errors.JournalClosed` once closed)."""
        if self._closed:
            raise closed_journal(self.pool)
        if self._idle:
            return self._idle.pop()
        if self._held < self._size:
            self._held += 1
            try:
                return await self.pool.getconn()
            except BaseException as exc:
                self._held -= 1
                if isinstance(exc, PoolClosed):
                    raise closed_journal(self.pool) from None
                raise
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._timeout):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                await self.put(waiter.result())  # handed a connection just as we gave up: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise PoolTimeout(f"no connection within {self._timeout:g}s") from None
            raise

    def ready(self) -> bool:
        """Whether a borrow now would be served at once (an idle connection, or room to take one from the pool)."""
        return bool(self._idle) or self._held < self._size

    async def put(self, conn: Any) -> None:
        self._returns += 1
        if (self._closed or conn.closed or conn.pgconn.transaction_status != _IDLE
                or self._returns % self._recycle_every == 0):
            self._held -= 1
            await self.pool.putconn(conn)  # reset (rolled back) or replaced by the pool
            if self._waiters and self._held < self._size:  # a waiter takes its connection from the pool
                self._held += 1
                self._serve(self._waiters.popleft(), self._from_pool())
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _from_pool(self) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(self.pool.getconn())

    def _serve(self, waiter: asyncio.Future[Any], fetch: asyncio.Task[Any]) -> None:
        def done(task: asyncio.Task[Any]) -> None:
            if task.cancelled() or task.exception() is not None:
                self._held -= 1
                if not waiter.done():
                    waiter.set_exception(task.exception() or asyncio.CancelledError())
            elif waiter.done():  # the waiter gave up meanwhile
                asyncio.get_running_loop().create_task(self.put(task.result()))
            else:
                waiter.set_result(task.result())

        fetch.add_done_callback(done)

    async def close(self) -> None:
        """Hand every idle connection back (before the pool closes); borrowers still waiting get
        :class:`~pgjournal.errors.JournalClosed`."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(closed_journal(self.pool))
        while self._idle:
            self._held -= 1
            await self.pool.putconn(self._idle.pop())

    def __len__(self) -> int:
        return len(self._idle)
