"""The batched tag writer (the default tag writer, see ``Settings.tag_batch_writer``): a tagged append writes its
events alone (their ``tags`` column), and a thread of the journal (a task on the asyncio face,
:mod:`pgjournal.aio.tag_batcher`) writes their tag view rows and ``tag_write_progress`` later,
many (persistence id, tag) pairs per statement, every ``tag_flush_interval`` or at ``tag_batch_size`` pending
events, as the Cassandra plugin's tag writers do.

**The rows come from the journal** (:func:`pgjournal.store.tags.batch_sql`): per (persistence id, tag), the tagged
events after the recorded progress, numbered from it; TimeUUIDs from their db_timestamp, raised above the previous row
of the pair, with low bytes hashed from the persistence id (:func:`~pgjournal.write.tag_batch.pid_lsb`). So the rows
do not depend on who writes them or when: two processes appending to one persistence id, or a recovery after a crash,
write the same rows (progress only forward; two writers of one pair at once collide on the primary key, and the
loser's retry writes what is left); tag sequence numbers stay contiguous and TimeUUID order is tag sequence order per
(tag, persistence id). The progress is written in the same statement as the rows.

**What readers wait for.** Each batched writer keeps a row in ``tag_batch_writers`` whose ``complete_before`` says:
every tagged event it appended with an earlier db_timestamp has its tag rows. ``events_by_tag`` reads no further than
the oldest of these (:func:`~pgjournal.tags.watermark.complete_before_step`), so a writer that lags or died holds
readers back instead of letting them pass events whose rows come later: nothing is skipped, and no gap opens (a pair's
rows appear in tag sequence order, below the watermark all at once), so ``tag_gap_timeout`` never fires because a
writer is behind. The watermark is exact: it is at most the oldest pending event's db_timestamp, the clock of the last
statement before any append still running (:meth:`~pgjournal.write.tag_batch.TagBatch.begin`), and the clock of this
writer's previous statement (an append starting later stamps a later time), and it is written in the same statement as
the rows. An idle writer still moves it forward every ``Settings.tag_heartbeat_interval``.

**Recovery.** A writer whose heartbeat is older than ``tag_writer_timeout`` is presumed dead (SIGKILL, a lost
host). Every running batched writer looks for such writers when it starts and every half timeout, and
``pgjournal tags recover`` does it on demand: it claims the row, finds the persistence ids the dead writer
appended tagged events to since its watermark (its ``entity_types``, the journal's slice index, its
``writer``), writes their tag rows, then drops the row, and readers move on. Readers never write (the reader
role may only SELECT): they wait, and log the silent writer once.

**Failures** are retried under the journal's :class:`~pgjournal.runtime.contention.RetryPolicy`; a write that still
fails is logged (``pgjournal.write.tag_batcher``) and counted (``pgjournal_tag_flush_failures_total``), and what was
pending stays pending for the next round: nothing is dropped. ``Journal.close()`` writes what is pending and
raises :class:`~pgjournal.errors.TagFlushFailed` if it cannot (the writer's row stays, so it is recovered).

**A connection of its own.** The writer's statements run on one connection it opens when it starts (and again
after a loss), not on the pool's: against the ``tag_rows_floor`` contender of ``python -m bench tags-append``
(8 writers), the batched writer ran clearly below the floor on the pool's connections and at about the floor on
its own. Why is not established: the statement is prepared once and after five runs kept as one generic plan
(on the pool, every backend planned it five times), but planning is a small part of a batch's execution, too
little to explain the difference.

**Transactions.** A tagged append in ``journal.transaction()`` counts as under way from before its insert (so the
watermark cannot pass it while the transaction is open); its events are handed over after the commit and
forgotten on a rollback (:class:`pgjournal.write.transaction.TransactionRules`).

The pieces, by layer: :mod:`pgjournal.write.tag_batch` (:class:`~pgjournal.write.tag_batch.TagBatch`, what is
pending and the watermark's bound, no I/O), :mod:`pgjournal.write.tag_writer_rules` (the work of each operation,
for both faces, as :data:`~pgjournal.runtime.steps.Work`), :mod:`pgjournal.tags.watermark` (what readers wait for);
this module is the blocking face, :class:`TagBatcher`: a thread, a lock that keeps this writer's statements one at
a time (on its connection), the work run by :func:`~pgjournal.runtime.steps.run_work`. Its asyncio twin is
:mod:`pgjournal.aio.tag_batcher`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg

from pgjournal.core.journal_core import lost_connection
from pgjournal.runtime.steps import R, Work, run_work
from pgjournal.write.tag_batch import Recovered
from pgjournal.write.tag_writer_rules import TagWriterRules

if TYPE_CHECKING:
    from pgjournal.journal import Journal


class TagBatcher(TagWriterRules):
    """The blocking face: the journal's batched tag writer, a thread that starts with the first tagged append."""

    _journal: Journal

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal)
        #: This writer's statements, one at a time (the thread's, and a caller's flush or registration), on its
        #: own connection (opened at the first statement and again after a loss).
        self._io = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._event = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the append path --------------------------------------------------------------------------------

    def begin(self, entity_type: str) -> int:
        """Before a tagged append runs (see :meth:`~pgjournal.write.tag_batch.TagBatch.begin`); the first one
        of an entity type first records it in this writer's row (recovery finds the writer's events by entity
        type)."""
        if not self.batch.knows(entity_type):
            with self._io:
                self._do(self._register_work(entity_type))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="pgjournal-tag-writer", daemon=True)
                    self._thread.start()
        return self.batch.begin()

    def _wake(self) -> None:
        self._event.set()

    # -- writing ----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything pending now and move the watermark past it: afterwards ``events_by_tag`` reads
        every tagged event this journal appended before the call (cheap when that is so already). Raises
        :class:`TagFlushFailed`."""
        if not self._registered or self.batch.caught_up():
            return
        with self._io:
            try:
                self._do(self._flush_work())
            except Exception as exc:
                raise self._report(exc) from exc

    def _do(self, work: Work[R]) -> R:
        """Drive ``work`` on this writer's connection, retrying transient failures (the caller holds ``_io``)."""
        return run_work(work, self._connection, self._pause)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """This writer's connection (the caller holds ``_io``); a lost one is closed, the next statement opens
        another."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._conn = self._journal.open_connection()
        try:
            yield conn
        except psycopg.OperationalError as exc:
            lost = lost_connection(self._journal.dsn, conn, exc)
            if lost is None:
                raise  # the server answered (a serialization failure, a cancelled statement, ...)
            self._disconnect()
            raise lost from exc

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the thread ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = 0
        while not self._closing:
            self._event.wait(self._wait(failures))
            self._event.clear()
            if self._closing:
                return
            try:
                with self._io:
                    if self._closing:
                        return
                    self._do(self._round_work())
                failures = 0
            except Exception as exc:  # reported; nothing pending is dropped, the next round tries again
                failures += 1
                self._report(exc)

    def close(self) -> None:
        """Stop the thread, write what is pending and drop this writer's row (readers stop waiting for it).
        Raises :class:`TagFlushFailed` when the rows cannot be written: the row stays, so they are recovered."""
        self._closing = True
        self._event.set()
        if self._thread is not None:
            self._thread.join()
        with self._io:
            try:
                self._do(self._close_work())
            except Exception as exc:
                raise self._report(exc) from exc
            finally:
                self._disconnect()

    # -- recovery -----------------------------------------------------------------------------------------

    def recover(self, silent_for: float | None = None) -> list[Recovered]:
        """Write the tag rows of the batched writers silent for ``silent_for`` seconds (default
        ``tag_writer_timeout``; 0: every writer but this one) and drop their rows."""
        with self._io:
            return self._do(self._recover_work(self._timeout if silent_for is None else silent_for))
