"""Group commit for threads: appends of the blocking face ride together in one pipeline and one transaction once
``pipeline_drains`` of them (or of their groups) are in flight, or when no pool connection is free, with the rules
of :mod:`pgjournal.write.group_commit` (the asyncio twin is :mod:`pgjournal.aio.pipelining`).

There is no thread of the journal's own. The journal has ``pipeline_drains`` *places* (at most its pool size): a
thread that finds one free and nothing queued runs its append on a connection of its own, as without group commits
(a lone writer never waits for a group), then leaves the place. A thread that finds every place taken queues its
append and waits, to be answered or handed a place. A thread holding a place with appends queued is a *drain*: it
borrows a connection and sends all that is queued (its own append or not) in one pipeline and answers each member,
until its own append is answered. A place left with appends queued goes to the next queued thread (one wake-up, as
its answer would be), so what is queued goes at once. The group shares one commit on the server, where each
append on its own connection would commit once: ``python -m bench append`` (variants ``ours_ungrouped``,
``ours_drains_N``) and bench/results/group-commit-blocking.md have the figures.
"""

from __future__ import annotations

import _thread
import contextlib
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import JournalClosed
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import ALONE, Alone, AppendPlan
from pgjournal.write.group_commit import GroupCommit, cursors, failing, lost, returned_rows

if TYPE_CHECKING:
    from pgjournal.journal import Journal

class Answer:
    """A thread's wait for the outcome of its append in a group, or for the drain handed to it: a bare lock,
    held until an answer or the lead releases it (the cheapest wake-up between threads)."""

    __slots__ = ("_done", "_error", "_lead", "_ready", "_rows")

    def __init__(self) -> None:
        self._ready = _thread.allocate_lock()
        self._ready.acquire()
        self._done = self._lead = False
        self._rows: Rows | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, rows: Rows | None, /) -> None:
        self._rows, self._done = rows, True
        self._wake()

    def set_exception(self, exception: BaseException, /) -> None:
        self._error, self._done = exception, True
        self._wake()

    def lead(self) -> None:
        """Hand the drain to this thread."""
        self._lead = True
        self._wake()

    def led(self) -> bool:
        """Whether this thread was handed a drain's place it has not taken yet (the pipeline's lock held)."""
        return self._lead

    def take_lead(self) -> bool:
        """Whether this thread was handed a drain's place, taking it (the pipeline's lock held)."""
        lead, self._lead = self._lead, False
        return lead

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # woken already (the lead, then its answer): the flags tell
            self._ready.release()

    def wait(self) -> None:
        """Wait to be answered or handed a drain's place (held again after: the next one wakes this thread)."""
        self._ready.acquire()

    def result(self) -> Rows | None:
        if self._error is not None:
            raise self._error
        return self._rows


Queued = tuple[AppendPlan, Answer]



class AppendPipeline(GroupCommit[Answer]):
    """The queue of appends waiting for a group and the places (``drains``, at most one per pool connection) of
    the threads running an append alone or sending what is queued."""

    def __init__(self, journal: Journal, drains: int, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        super().__init__(enabled=enabled, guard=self._lock)
        self._journal = journal
        self._most = drains
        #: Places taken (threads running an append alone or sending what is queued, or handed a place).
        self._drains = 0
        self._closed = False

    def ride(self, plan: AppendPlan) -> Rows | Alone | None:
        """The rows of ``plan`` appended in a group commit; :data:`ALONE`: run it on a connection of your own
        now and call :meth:`leave` after (a drain's place is yours: fewer appends run than ``drains``); ``None``:
        not written, run it on a connection of your own (it does not ride, its statement failed or found no
        predecessor, or no drain could get a connection)."""
        if not self.enabled or plan.tags:
            return None
        with self._lock:
            if self._closed:
                return None
            drain = self._drains < self._most
            if drain:
                self._drains += 1
                if not self.queue and self._journal.connections.ready():
                    return ALONE
            answer = Answer()
            self.queue.append((plan, answer))
        if drain:
            self._drain(answer)
        while True:
            answer.wait()
            with self._lock:
                lead = answer.take_lead()
            if lead:  # handed a drain's place (perhaps answered meanwhile: it passes it on)
                self._drain(answer)
            if answer.done():
                return answer.result()

    def leave(self) -> None:
        """An append run :data:`ALONE` is done: its place goes to the next queued append's thread, else it is
        free."""
        with self._lock:
            self._pass_on()

    def close(self) -> None:
        """Queued appends go back to their threads (which find the journal closed); drains leave."""
        with self._lock:
            self._closed = True
        self.hand_back()

    def _drain(self, own: Answer) -> None:
        """Send what is queued, a share at a time, until ``own`` (the caller's append) is answered or nothing is
        queued."""
        batch: list[Queued] = []
        try:
            while self._stays(own):
                conn = self._journal.connections.get()
                try:
                    # All that waits: the other drains are in flight, and a group split in two costs more client
                    # CPU per append than it saves in waiting (bench/results/group-commit-blocking.md).
                    batch = self.take(1)
                    if batch:
                        self._send(conn, batch)
                    batch = []
                finally:
                    self._journal.connections.put(conn)
        except BaseException as exc:  # no connection to be had (PoolTimeout, JournalClosed), or interrupted
            self.on_stop(batch)  # on the wire: their outcome is not known
            with self._lock:
                self._drains -= 1
                last = not self._drains
            if last:  # no other drain will send what is queued: each thread runs its append itself
                self.hand_back()
            if not isinstance(exc, psycopg.Error | JournalClosed):
                raise

    def _stays(self, own: Answer) -> bool:
        """Whether this drain sends another group; if not, its place passes on (:meth:`_pass_on`)."""
        with self._lock:
            if self.queue and not own.done():
                return True
            self._pass_on()
            return False

    def _pass_on(self) -> None:
        """A drain's place is free (the lock held): the first queued append's thread takes it (one wake-up, as its
        answer would be), so what is queued goes at once; with nothing queued it stays free."""
        for _plan, answer in self.queue:
            if not answer.done() and not answer.led():  # one place each: two leads before a wake-up would be one
                answer.lead()
                return
        self._drains -= 1

    def _send(self, conn: psycopg.Connection[Any], batch: list[Queued]) -> None:
        """Send ``batch`` as one transaction in one pipeline (:mod:`pgjournal.write.group_commit` has the rules)."""
        kept = cursors(conn, len(batch))[: len(batch)]
        sent = 0
        try:
            with conn.pipeline() as pipeline:
                for (plan, _answer), cur in zip(batch, kept, strict=True):
                    sent += 1
                    try:
                        cur.execute(plan.sql, plan.params, prepare=True, binary=True)
                    except psycopg.Error as exc:  # an earlier statement's error, fetched now: the group failed
                        if lost(conn, exc):
                            raise
                try:
                    pipeline.sync()
                    synced = True
                except psycopg.Error as exc:  # the first error among the results: sync again to leave it clean
                    if lost(conn, exc):
                        raise
                    pipeline.sync()
                    synced = False
        except psycopg.Error as exc:
            if not lost(conn, exc):
                raise
            self.on_lost(batch, sent, exc)
            return
        results = [cur.pgresult for cur in kept]
        index = failing(synced, results)
        if index is None:
            self.on_commit(batch, [cur.fetchall() if returned_rows(result) else None
                                   for cur, result in zip(kept, results, strict=True)])
        else:
            self.on_rollback(batch, index)
