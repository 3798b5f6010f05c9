"""The batched tag writer's work, for both faces (:mod:`pgjournal.write.tag_batcher` tells the design): each
operation (register, write what is pending, flush, a timer round, recovery, close) as
:data:`~pgjournal.runtime.steps.Work` over the statements of :class:`~pgjournal.write.tag_batch.TagBatch`, the rule
of which failures are tried again, and the reports. The blocking :class:`~pgjournal.write.tag_batcher.TagBatcher`
and the asyncio :class:`~pgjournal.aio.tag_batcher.AsyncTagBatcher` run it with
:func:`~pgjournal.runtime.steps.run_work` and :func:`~pgjournal.runtime.steps.arun_work`."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.buckets import BucketSize, check_bucket_size_step
from pgjournal.errors import DatabaseUnavailable, JournalError, TagFlushFailed, WriteOutcomeUnknown
from pgjournal.model.printable import printable_logger
from pgjournal.runtime import metrics
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Step, Work, statement
from pgjournal.store import tags as store
from pgjournal.store.tags import NO_UPTO, BatchPair
from pgjournal.tags.writer_mode import check_mode_step
from pgjournal.write.tag_batch import Pending, Recovered, TagBatch

if TYPE_CHECKING:
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.settings import Settings

#: One logger for the batched writer's reports, whichever module of it speaks.
log = printable_logger("pgjournal.write.tag_batcher")


class TagWriterRules:
    """What both faces of the batched writer do (the blocking :class:`~pgjournal.write.tag_batcher.TagBatcher`
    thread, the asyncio :class:`pgjournal.aio.tag_batcher.AsyncTagBatcher` task): the work of each operation as
    :data:`Work`, the retry rule, the reports. A face adds its lock, its connection, its timer and the driver of the
    work."""

    def __init__(self, journal: JournalCore) -> None:
        self._journal = journal
        settings = journal.settings
        self.batch = TagBatch(uuid.uuid4().hex, journal.writer_id, settings.tag_batch_size)
        self._retry = settings.retry_policy
        self._retryable = journal.dialect.retryable_sqlstates
        self._interval = settings.tag_flush_interval
        #: After failed rounds: twice the interval, doubling, to a quarter of the writer timeout.
        self._slower = Backoff(2 * self._interval, 2.0, settings.tag_writer_timeout / 4)
        self._heartbeat = settings.tag_heartbeat_interval
        self._timeout = settings.tag_writer_timeout
        self._closing = False
        self._registered = False
        self._last_write = 0.0
        self._next_recovery = 0.0

    # -- the append path (no I/O) -----------------------------------------------------------------------

    def written(self, ticket: int, pid: str, slice_: int, tags: Iterable[str], rows: list[tuple[int, datetime]]
                ) -> None:
        if self.batch.written(ticket, pid, slice_, tags, rows):
            self._wake()

    def failed(self, ticket: int, pid: str, slice_: int, tags: Iterable[str], error: BaseException) -> None:
        """The append raised ``error``: the write path's errors say nothing was written, except
        :class:`WriteOutcomeUnknown` (and anything unexpected)."""
        unknown = isinstance(error, WriteOutcomeUnknown) or not isinstance(error, JournalError)
        self.batch.failed(ticket, pid, slice_, tags, unknown=unknown)

    def _wake(self) -> None:
        raise NotImplementedError

    # -- the work ---------------------------------------------------------------------------------------

    def _heartbeat_work(self) -> Work[None]:
        yield lambda: self.batch.write_step(self._journal, [], self.batch.bound())
        self._last_write = time.monotonic()

    def _prepare_work(self) -> Work[None]:
        """Check the tag view's bucket size and the tag writer recorded in the database before this writer's row
        (a database of the in-statement writer refuses the append before its event). The first tagged append
        records them in its own transaction, as on the in-statement path (a failed one records nothing)."""
        if not self.batch.bucket_ms:
            size: BucketSize = yield functools.partial(_tag_settings_step, self._journal.settings)
            self.batch.bucket_ms = size.millis

    def _register_work(self, entity_type: str) -> Work[None]:
        """This writer's row, naming ``entity_type`` (recovery finds the writer's events by entity type)."""
        if self._closing:
            raise TagFlushFailed("the journal is closed: its batched tag writer takes no more appends")
        yield from self._prepare_work()
        self.batch.add_type(entity_type)
        yield from self._heartbeat_work()
        self._registered = True

    def _write_pending_work(self) -> Work[None]:
        """Write what is pending now, statement by statement (each with the watermark)."""
        entries = self.batch.take()
        try:
            while entries:
                chosen, pairs = self.batch.next_statement(entries)
                bound = self.batch.bound(excluding=chosen)
                rows = yield functools.partial(self.batch.write_step, self._journal, pairs, bound)
                entries = self.batch.finished(chosen, rows) + entries[len(chosen):]
                self._last_write = time.monotonic()
        except BaseException:
            self.batch.give_back(entries)
            raise

    def _flush_work(self) -> Work[None]:
        """Write everything pending and move the watermark past it (nothing to do when it is past already)."""
        if not self._registered or self.batch.caught_up():
            return
        yield from self._write_pending_work()
        yield from self._heartbeat_work()

    def _round_work(self) -> Work[None]:
        """One round of the timer: write what is pending, else a heartbeat when due; look for dead writers every
        half ``tag_writer_timeout``."""
        if self.batch.pending():
            yield from self._write_pending_work()
        elif time.monotonic() - self._last_write >= self._heartbeat:
            yield from self._heartbeat_work()
        if time.monotonic() >= self._next_recovery:
            self._next_recovery = time.monotonic() + self._timeout / 2
            yield from self._recover_work(self._timeout)

    def _close_work(self) -> Work[None]:
        """Write what is pending and drop this writer's row (readers stop waiting for it)."""
        if not self._registered:
            return
        yield from self._write_pending_work()
        if self.batch.idle():
            yield lambda: _execute(store.drop_batch_writer(self.batch.key))
            self._registered = False
        else:
            log.warning("batched tag writer %s closed with appends still running: its row stays for recovery",
                        self.batch.key)

    def _recover_work(self, silent_for: float) -> Work[list[Recovered]]:
        yield from self._prepare_work()
        done = []
        writers = yield lambda: _rows(store.batch_writers(silent_for))
        for writer in writers:
            if writer.id == self.batch.key:
                continue
            claimed = yield functools.partial(_rows, store.claim_batch_writer(writer.id, writer.heartbeat))
            if not claimed:
                continue  # another process took it, or it came back
            found = yield functools.partial(
                _rows, store.tagged_since(writer.writer, writer.entity_types, writer.complete_before))
            entries = [Pending(t.persistence_id, t.slice, set(t.tags), NO_UPTO, writer.complete_before, 1)
                       for t in found]
            rows = 0
            while entries:
                chosen, pairs = self.batch.next_statement(entries, own=False)
                # Bounded by this writer's watermark as it is at each try.
                result = yield functools.partial(self._write_adopted, pairs)
                written = {(pid, tag): n for _, pid, tag, n in result if pid is not None}
                rows += sum(written.values())
                for entry in chosen:
                    entry.tags = {t for t in entry.tags if written.get((entry.pid, t), 0) >= self.batch.limit}
                entries = [e for e in chosen if e.tags] + entries[len(chosen):]
            yield functools.partial(_execute, store.drop_batch_writer(writer.id, claimed[0]))
            self._registered = True
            log.warning("batched tag writer %s (writer %s) was silent for more than %g s: wrote %d tag view row(s) "
                        "of %d persistence id(s) it had appended to, and dropped its row", writer.id, writer.writer,
                        silent_for, rows, len(found))
            done.append(Recovered(writer.id, writer.writer, len(found), rows))
        return done

    def _write_adopted(self, pairs: list[BatchPair]) -> Step[list[tuple[Any, ...]]]:
        return self.batch.write_step(self._journal, pairs, self.batch.bound())

    # -- rules --------------------------------------------------------------------------------------------

    def _pause(self, attempt: int, exc: BaseException) -> float | None:
        """After failed attempt ``attempt`` of a statement with ``exc``: the pause before trying again, or None
        to give up (raise it)."""
        if isinstance(exc, DatabaseUnavailable):  # lost or no connection: the statement may be retried as it is
            pause = self._retry.next_pause(attempt, "08006")
            if pause is not None:
                log.debug("batched tag writer: %s; retrying", exc)
            return pause
        if not isinstance(exc, psycopg.Error):
            return None
        # 23505: another writer wrote the same tag rows first (see pgjournal.store.tags): the next attempt
        # reads its progress and writes what is left.
        transient = exc.sqlstate in self._retryable or exc.sqlstate == "23505" or (
            isinstance(exc, psycopg.OperationalError) and exc.sqlstate not in (None, "42501"))
        return self._retry.next_pause(attempt, exc.sqlstate) if transient else None

    def _wait(self, failures: int) -> float:
        """How long the timer waits before its next round (longer after failed rounds)."""
        return self._interval if not failures else self._slower.delay(failures)

    def _report(self, exc: BaseException) -> TagFlushFailed:
        metrics.TAG_FLUSH_FAILURES.inc()
        reason = " ".join(str(exc).split()) or exc.__class__.__name__
        log.error("batched tag writer %s could not write tag view rows (%s): %d event(s) stay pending and are "
                  "written by the next round (or by recovery if this process ends)", self.batch.key, reason,
                  self.batch.events)
        return TagFlushFailed(f"the batched tag writer could not write the tag view rows of {self.batch.events} "
                              f"pending event(s): {reason}; they stay in the journal and are written by recovery "
                              "(`pgjournal tags recover`, or any batched writer after tag_writer_timeout)")


def _tag_settings_step(settings: Settings) -> Step[BucketSize]:
    """Check the bucket size and the tag writer against what is recorded (nothing recorded: fine)."""
    size = yield from check_bucket_size_step(settings.tag_bucket_size)
    yield from check_mode_step(True)
    return size


def _rows(query: Any) -> Step[list[Any]]:
    rows: list[Any] = yield statement(query)
    return rows


def _execute(query: tuple[str, Any]) -> Step[int]:
    count: int = yield statement(query)
    return count
