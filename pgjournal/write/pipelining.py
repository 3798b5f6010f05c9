"""Group commit for threads: appends of the blocking face that would wait for a pool connection ride together in
one pipeline and one transaction, with the rules of :mod:`pgjournal.write.group_commit` (the asyncio twin is
:mod:`pgjournal.aio.pipelining`).

There is no thread of the journal's own in the common case: a thread that queues its append while fewer drains
run than the pool has connections becomes a drain itself. It borrows a connection, sends its share of the queue
(its own append or not) and answers each member through its future, until its own append is answered and another
drain carries on, or the queue is empty. The last drain with more queued hands the rest to a short-lived thread
rather than keep its caller waiting for appends of others. Every other thread waits on its append's future.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import JournalClosed
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import AppendPlan
from pgjournal.write.group_commit import GroupCommit, cursors, failing, lost, returned_rows

if TYPE_CHECKING:
    from pgjournal.journal import Journal

Queued = tuple[AppendPlan, "Future[Rows | None]"]


class AppendPipeline(GroupCommit["Future[Rows | None]"]):
    """The queue of appends waiting for a connection and the drains (at most one per pool connection) that send
    them."""

    def __init__(self, journal: Journal, drains: int, *, enabled: bool = True) -> None:
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
        answer: Future[Rows | None] = Future()
        with self._lock:
            if self._closed:
                return None
            self.queue.append((plan, answer))
            drain = self._drains < self._most
            if drain:
                self._drains += 1
        if drain:
            self._drain(answer)
        return answer.result()

    def close(self) -> None:
        """Queued appends go back to their threads (which find the journal closed); drains leave."""
        with self._lock:
            self._closed = True
        self.hand_back()

    def _drain(self, own: Future[Rows | None] | None) -> None:
        """Send what is queued, a share at a time, until ``own`` (the caller's append; ``None``: a drain thread's
        own) is answered and another drain runs, or nothing is queued."""
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

    def _stays(self, own: Future[Rows | None] | None) -> bool:
        """Whether this drain sends another group; if not, it is no longer counted."""
        with self._lock:
            if self.queue and not (own is not None and own.done()):
                return True
            if self.queue and self._drains == 1:  # the last drain: a thread carries on, the caller has its answer
                try:
                    threading.Thread(target=self._drain, args=(None,), name="pgjournal-group-commit",
                                     daemon=True).start()
                except RuntimeError:  # no thread to be had (the interpreter is ending): this one carries on
                    return True
                return False
            self._drains -= 1
            return False

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
