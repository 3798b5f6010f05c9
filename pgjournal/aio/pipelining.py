"""Appends that would wait for a pool connection ride together: a *drain* borrows a connection and sends what is
queued on it in one pipeline (psycopg's pipeline mode) and **one transaction**: the statements run one after the
other and one Sync ends them, so the group commits once (one commit record, one WAL flush on the server) instead
of once per append. Each statement is still the append's own (its rows, its timestamp rule, its predecessor
check, its events stamped while it holds the write lock, as on a connection of its own). This group
commit is what makes one asyncio process cheaper per append than a connection per append (bench
``async-append``); it also saves the per-append cost of the event loop (a socket wait, a timer and a task switch
per round trip).

A statement that fails (a primary-key clash, a deadlock, a timeout) rolls the whole group back, so nothing of it
was written: its own append goes back to its task, which runs it on a connection of its own through
:func:`pgjournal.write.append_steps.append_step` (the write path's conflict and retry rules, one implementation), and
the
others are queued again for the next pipeline. Each failure takes one append out, so a group is tried at most
as many times as it has appends. An append whose statement found no predecessor inserts nothing and goes back to
its task the same way while the others commit. Groups are sorted by persistence id, so two groups that insert
the same keys lock them in one order and never deadlock each other. Only the first attempt of an untagged
append rides in a pipeline, and only on READ COMMITTED PostgreSQL (a serializable commit may fail at the Sync,
for the whole group). A lost connection leaves the outcome of what was sent unknown
(:class:`~pgjournal.errors.WriteOutcomeUnknown`: the whole group committed or none of it).

Cancelling an append still queued removes it (nothing written); once sent, its group runs to its end on the
server (all of it or nothing) and only the task stops waiting. The drain's connection goes back to the pool idle.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import ExecStatus

from pgjournal.errors import JournalClosed
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import AppendPlan, failed
from pgjournal.write.failures import Failure, classify

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal

#: Appends sent in one pipeline at most (a drain takes what is queued, up to this).
BATCH = 64

Queued = tuple[AppendPlan, "asyncio.Future[Rows | None]"]


def supported() -> bool:
    """Pipeline mode: libpq 14 or later."""
    return psycopg.AsyncPipeline.is_supported()


class AppendPipeline:
    """The queue of appends waiting for a connection and the drains (at most one per pool connection) that
    send them."""

    def __init__(self, journal: AsyncJournal, drains: int, *, enabled: bool = True) -> None:
        self._journal = journal
        self._queue: collections.deque[Queued] = collections.deque()
        self._most = drains
        self._drains: set[asyncio.Task[None]] = set()
        self.enabled = enabled and supported()
        #: Appends sent in a pipeline so far, the pipelines that carried them, and those rolled back.
        self.sent = self.pipelines = self.rolled_back = 0

    def takes(self, plan: AppendPlan) -> bool:
        """Whether ``plan`` should ride in a pipeline: untagged (a tagged append may record the bucket size in a
        transaction of its own) and no connection is free right now."""
        return self.enabled and not plan.tags and not self._journal.connections.ready()

    async def submit(self, plan: AppendPlan) -> Rows | None:
        """The rows of ``plan`` appended in a pipeline; ``None``: not written, run it on a connection of its own
        (its statement failed or found no predecessor, or no drain could get a connection)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Rows | None] = loop.create_future()
        self._queue.append((plan, future))
        if len(self._drains) < self._most:
            drain = loop.create_task(self._drain())
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        return await future

    async def close(self) -> None:
        for drain in list(self._drains):
            drain.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        self._hand_back(last=True)

    async def _drain(self) -> None:
        sent: list[Queued] = []
        try:
            while self._queue:
                conn = await self._journal.connections.get()
                try:
                    sent = self._take()
                    if sent:
                        await self._send(conn, sent)
                    sent = []
                finally:
                    await self._journal.connections.put(conn)
        except BaseException as exc:  # cancelled, or no connection to be had (PoolTimeout, JournalClosed)
            for plan, future in sent:  # on the wire: their outcome is not known
                if not future.done():
                    future.set_exception(_unknown(plan))
            self._hand_back()
            if not isinstance(exc, psycopg.Error | JournalClosed):
                raise
        finally:
            # Leave at once, not in a done callback: the tasks this drain just answered queue their next appends
            # before such a callback would run, and must see that a new drain is needed.
            self._drains.discard(asyncio.current_task())

    def _take(self) -> list[Queued]:
        """This drain's share of the queue: every drain (connection) gets some, since each append waits for its
        whole pipeline (a commit each on the server) and a drain taking all would leave the others idle."""
        batch: list[Queued] = []
        queue = self._queue
        share = min(BATCH, -(-len(queue) // max(1, len(self._drains))))
        while queue and len(batch) < share:
            item = queue.popleft()
            if not item[1].done():  # a cancelled task's append is not sent
                batch.append(item)
        return batch

    def _hand_back(self, *, last: bool = False) -> None:
        """When no other drain will send what is queued (``last``: none will): each task runs its append
        itself."""
        if not last and self._drains - {asyncio.current_task()}:
            return
        while self._queue:
            _plan, future = self._queue.popleft()
            if not future.done():
                future.set_result(None)

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[Queued]) -> None:
        """Send ``batch`` as one transaction in one pipeline (the module's docstring has the rules). A lost
        connection leaves the outcome of what was sent unknown; what was not sent goes back to its task."""
        batch.sort(key=lambda item: item[0].pid)
        cursors = _cursors(conn, len(batch))
        self.sent += len(batch)
        self.pipelines += 1
        sent = 0
        try:
            async with conn.pipeline() as pipeline:
                for (plan, _future), cur in zip(batch, cursors):  # noqa: B905 - there may be more cursors
                    sent += 1
                    try:
                        await cur.execute(plan.sql, plan.params, prepare=True, binary=True)
                    except psycopg.Error as exc:  # an earlier statement's error, fetched now: the group failed
                        if _lost(conn, exc):
                            raise
                synced = await _collect(conn, pipeline)
        except psycopg.Error as exc:
            if not _lost(conn, exc):
                raise
            for index, (plan, future) in enumerate(batch):
                if not future.done():
                    if index < sent:
                        future.set_exception(failed(plan.pid, Failure.UNKNOWN, exc))
                    else:
                        future.set_result(None)
            return
        # Committed only if the Sync came back clean *and* every statement has its result: the error of one (and
        # the skipped ones after it) may have been fetched during a later execute, leaving the Sync clean.
        results = [cur.pgresult for cur in cursors[: len(batch)]]
        failing = next((i for i, result in enumerate(results) if result is None
                        or result.status not in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)), None)
        if synced and failing is None:
            for (_plan, future), cur, result in zip(batch, cursors, results):  # noqa: B905
                rows = await cur.fetchall() if result is not None and result.status == ExecStatus.TUPLES_OK else None
                if not future.done():
                    future.set_result(rows or None)
            return
        self.rolled_back += 1
        if failing is None:  # the commit itself failed: nothing to single out, each runs on its own
            for _plan, future in batch:
                if not future.done():
                    future.set_result(None)
            return
        _plan, future = batch.pop(failing)
        if not future.done():
            future.set_result(None)
        self._queue.extendleft(reversed(batch))


async def _collect(conn: psycopg.AsyncConnection[Any], pipeline: psycopg.AsyncPipeline) -> bool:
    """Fetch every result of the pipeline; whether the Sync came back clean. ``sync()`` raises the first
    error among the results it fetched (the statements after it were skipped, and the Sync rolled the transaction
    back): sync once more to leave the pipeline clean."""
    try:
        await pipeline.sync()
        return True
    except psycopg.Error as exc:
        if _lost(conn, exc):
            raise
    await pipeline.sync()
    return False


def _cursors(conn: psycopg.AsyncConnection[Any], count: int) -> list[psycopg.AsyncCursor[Any]]:
    """At least ``count`` cursors kept on the connection for its pipelines (a new cursor per append is client
    CPU paid on every append: ``python -m bench async-append``)."""
    cursors: list[psycopg.AsyncCursor[Any]] = getattr(conn, "_pgjournal_pipeline_cursors", [])
    if len(cursors) < count:
        cursors = [cur for cur in cursors if not cur.closed]
        cursors.extend(conn.cursor() for _ in range(count - len(cursors)))
        conn._pgjournal_pipeline_cursors = cursors  # type: ignore[attr-defined]
    return cursors


def _lost(conn: psycopg.AsyncConnection[Any], exc: psycopg.Error) -> bool:
    """The connection is gone (the server never answered), not a statement refused or skipped after one was:
    any other failure rolled the group back and its append runs on its own
    (:func:`pgjournal.write.append_steps.append_step`
    classifies it)."""
    return classify(exc, conn=conn) is Failure.UNKNOWN


def _unknown(plan: AppendPlan) -> BaseException:
    return failed(plan.pid, Failure.UNKNOWN, psycopg.OperationalError("the pipeline carrying this append was stopped"))
