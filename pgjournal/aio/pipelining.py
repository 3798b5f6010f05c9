"""Group commit for asyncio tasks: appends that would wait for a pool connection ride together in one pipeline
and one transaction, with the rules of :mod:`pgjournal.write.group_commit` (the blocking twin is
:mod:`pgjournal.write.pipelining`). Besides the server's commit per append, the group saves the event loop's work
per append (a socket wait, a timer and a task switch per round trip): bench ``async-append``.

A drain is a task (at most one per pool connection) started by an append that finds fewer drains than
connections; it sends what is queued until nothing is. A failed or unanswered append goes back to its task, which
runs it on a connection of its own through :func:`pgjournal.write.append_steps.append_step`.

Cancelling an append still queued removes it (nothing written); once sent, its group runs to its end on the
server (all of it or nothing) and only the task stops waiting. The drain's connection goes back to the pool idle.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import JournalClosed
from pgjournal.runtime.steps import apipeline, arun
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import AppendPlan
from pgjournal.write.group_commit import GroupCommit, Send

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal

Queued = tuple[AppendPlan, "asyncio.Future[Rows | None]"]


class AppendPipeline(GroupCommit["asyncio.Future[Rows | None]"]):
    """The queue of appends waiting for a connection and the drains (at most one per pool connection) that
    send them."""

    def __init__(self, journal: AsyncJournal, drains: int, *, enabled: bool = True) -> None:
        super().__init__(enabled=enabled)
        self._journal = journal
        self._most = drains
        self._drains: set[asyncio.Task[None]] = set()

    def takes(self, plan: AppendPlan) -> bool:
        """Whether ``plan`` should ride in a group (:meth:`GroupCommit.rides`)."""
        return self.rides(plan, self._journal.connections.ready)

    async def submit(self, plan: AppendPlan) -> Rows | None:
        """The rows of ``plan`` appended in a pipeline; ``None``: not written, run it on a connection of its own
        (its statement failed or found no predecessor, or no drain could get a connection)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Rows | None] = loop.create_future()
        self.queue.append((plan, future))
        if len(self._drains) < self._most:
            drain = loop.create_task(self._drain())
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        return await future

    async def close(self) -> None:
        for drain in list(self._drains):
            drain.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        self.hand_back()

    async def _drain(self) -> None:
        sent: list[Queued] = []
        try:
            while self.queue:
                conn = await self._journal.connections.get()
                try:
                    sent = self.take(len(self._drains))
                    if sent:
                        await self._send(conn, sent)
                    sent = []
                finally:
                    await self._journal.connections.put(conn)
        except BaseException as exc:  # cancelled, or no connection to be had (PoolTimeout, JournalClosed)
            self.on_stop(sent)  # on the wire: their outcome is not known
            if not self._drains - {asyncio.current_task()}:  # no other drain will send what is queued
                self.hand_back()
            if not isinstance(exc, psycopg.Error | JournalClosed):
                raise
        finally:
            # Leave at once, not in a done callback: the tasks this drain just answered queue their next appends
            # before such a callback would run, and must see that a new drain is needed.
            self._drains.discard(asyncio.current_task())

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[Queued]) -> None:
        """Send ``batch`` as one transaction in one pipeline (:mod:`pgjournal.write.group_commit` has the rules)."""
        send = Send(self, conn, batch)
        with send.guard():
            async with apipeline(conn) as opened:
                await arun(send.pipeline_step(opened), conn)
        await arun(send.outcome_step(), conn)
