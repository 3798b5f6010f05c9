"""Group commit for threads: appends of the blocking face that would wait for a pool connection ride together in
one pipeline and one transaction, with the rules of :mod:`pgjournal.write.group_commit` (the asyncio twin is
:mod:`pgjournal.aio.pipelining`).

There is no thread of the journal's own: a thread that queues its append when no drain runs becomes the drain. It
borrows a connection, sends what is queued (its own append or not) and answers each member, until its own append
is answered; then, if more is queued, it hands the drain to the next waiting thread (one wake-up, as an answer
is) and returns to its caller. Another drain starts only when more is queued than the running ones take in one
group: threads waiting for a connection are few beside asyncio tasks, and one drain sending them all makes the
groups, and the savings, largest (``python -m bench append``, ``ours_4_connections``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import JournalClosed
from pgjournal.runtime.steps import pipeline, run
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import AppendPlan
from pgjournal.write.group_commit import BATCH, GroupCommit, Send

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore

class Answer:
    """A thread's wait for the outcome of its append in a group, or for the drain handed to it."""

    __slots__ = ("_done", "_error", "_lead", "_ready", "_rows")

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._done = self._lead = False
        self._rows: Rows | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, rows: Rows | None, /) -> None:
        self._rows, self._done = rows, True
        self._ready.set()

    def set_exception(self, exception: BaseException, /) -> None:
        self._error, self._done = exception, True
        self._ready.set()

    def lead(self) -> None:
        """Hand the drain to this thread."""
        self._lead = True
        self._ready.set()

    def wait(self) -> bool:
        """Wait: ``True`` once answered, ``False`` when handed the drain."""
        self._ready.wait()
        if self._done:
            return True
        self._lead = False
        self._ready.clear()
        if self._done:  # answered between the check and the clear: keep the wake-up
            self._ready.set()
            return True
        return False

    def result(self) -> Rows | None:
        if self._error is not None:
            raise self._error
        return self._rows


Queued = tuple[AppendPlan, Answer]


class AppendPipeline(GroupCommit[Answer]):
    """The queue of appends waiting for a connection and the drains (at most one per pool connection) that send
    them."""

    def __init__(self, journal: BlockingCore, drains: int, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        super().__init__(enabled=enabled, guard=self._lock)
        self._journal = journal
        self._most = drains
        #: Drains running (threads sending what is queued).
        self._drains = 0
        self._closed = False

    def ride(self, plan: AppendPlan) -> Rows | None:
        """The rows of ``plan`` appended in a group commit; ``None``: not written, run it on a connection of its
        own (it does not ride, its statement failed or found no predecessor, or no drain could get a
        connection)."""
        if not self.rides(plan, self._journal.connections.ready):
            return None
        answer = Answer()
        with self._lock:
            if self._closed:
                return None
            self.queue.append((plan, answer))
            # One more drain only when the running ones would not take all that is queued in their next groups.
            drain = self._drains < self._most and (not self._drains or len(self.queue) > self._drains * BATCH)
            if drain:
                self._drains += 1
        if drain:
            self._drain(answer)
        while not answer.wait():  # handed the drain
            self._drain(answer)
        return answer.result()

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
                    batch = self.take(self._drains)
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
        """Whether this drain sends another group; if not, it is no longer counted (or its count passes on)."""
        with self._lock:
            if self.queue and not own.done():
                return True
            if self.queue and self._drains == 1:  # the last drain: the next waiting thread carries on
                for _plan, answer in self.queue:
                    if not answer.done():
                        answer.lead()
                        return False
            self._drains -= 1
            return False

    def _send(self, conn: psycopg.Connection[Any], batch: list[Queued]) -> None:
        """Send ``batch`` as one transaction in one pipeline (:mod:`pgjournal.write.group_commit` has the rules)."""
        send = Send(self, conn, batch)
        with send.guard(), pipeline(conn) as opened:
            run(send.pipeline_step(opened), conn)
        run(send.outcome_step(), conn)
