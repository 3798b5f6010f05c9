"""The batched tag writer (the default tag writer, see ``Settings.tag_batch_writer``): a tagged append writes its
events alone (their ``tags`` column), and a thread of the journal (a task on the asyncio face,
:mod:`pgjournal.aio.tag_batcher`) writes their tag view rows and ``tag_write_progress`` later,
many (persistence id, tag) pairs per statement, every ``tag_flush_interval`` or at ``tag_batch_size`` pending
events, as the Cassandra plugin's tag writers do.

**The rows come from the journal** (:func:`pgjournal.store.tags.batch_sql`): per (persistence id, tag), the
tagged events after the recorded progress, numbered from it; TimeUUIDs from their db_timestamp, raised above
the previous row of the pair, with low bytes hashed from the persistence id (:func:`pid_lsb`). So the rows
do not depend on who writes them or when: two processes appending to one persistence id, or a recovery after a
crash, write the same rows (progress only forward; two writers of one pair at once collide on the primary key,
and the loser's retry writes what is left); tag sequence numbers stay
contiguous and TimeUUID order is tag sequence order per (tag, persistence id). The progress is written in the
same statement as the rows.

**What readers wait for.** Each batched writer keeps a row in ``tag_batch_writers`` whose ``complete_before``
says: every tagged event it appended with an earlier db_timestamp has its tag rows. ``events_by_tag`` reads
no further than the oldest of these (:func:`complete_before_step`), so a writer that lags or died holds
readers back instead of letting them pass events whose rows come later: nothing is skipped, and no gap opens
(a pair's rows appear in tag sequence order, below the watermark all at once), so ``tag_gap_timeout`` never
fires because a writer is behind. The watermark is exact: it is at most the oldest pending event's
db_timestamp, the clock of the last statement before any append still running (:meth:`TagBatch.begin`),
and the clock of this writer's previous statement (an append starting later stamps a later time), and it
is written in the same statement as the rows. An idle writer still moves it forward every
``Settings.tag_heartbeat_interval``.

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

The logic is :class:`TagBatch` (no I/O), statement steps (:mod:`pgjournal.runtime.steps`) and the work of each
operation (:class:`TagWriterRules`: generators that yield a step per statement); :class:`TagBatcher` is the
blocking face: a thread, a lock that keeps this writer's statements one at a time (on its connection), and the
driver that runs the work with retries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from pgjournal.buckets import BucketSize, check_bucket_size_step
from pgjournal.core.journal_core import lost_connection
from pgjournal.errors import DatabaseUnavailable, JournalError, TagFlushFailed, WriteOutcomeUnknown
from pgjournal.model.printable import printable_logger
from pgjournal.model.timeuuid import lsb_key
from pgjournal.runtime import metrics
from pgjournal.runtime.contention import RetryPolicy
from pgjournal.runtime.steps import Step, run_pooled, statement
from pgjournal.store import tags as store
from pgjournal.store.tags import NO_UPTO, BatchPair
from pgjournal.tags.writer_mode import check_mode_step

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore, JournalCore
    from pgjournal.settings import Settings

log = printable_logger("pgjournal.write.tag_batcher")
R = TypeVar("R")


def pid_lsb(pid: str) -> tuple[int, str]:
    """The TimeUUID low bytes of a persistence id's batched tag rows: as an order key (``ts_lsb``) and as 16 hex
    digits. A hash of the persistence id (RFC 4122 variant, multicast node bit), the same in every process."""
    digest = hashlib.blake2b(pid.encode("utf-8", "surrogatepass"), digest_size=8, person=b"pgjournal-tags").digest()
    lsb_bytes = (0x80 << 56) | (int.from_bytes(digest, "big") & 0x3FFFFFFFFFFFFFFF) | (1 << 40)
    return lsb_key(lsb_bytes), f"{lsb_bytes:016x}"


@dataclass(slots=True)
class _Pending:
    """A persistence id's tagged events whose rows are not written yet: ``tags`` up to sequence number
    ``upto`` (:data:`NO_UPTO`: an append whose outcome is unknown, so whatever is there), the oldest
    db_timestamp among them (``since``: the watermark stays below it) and how many events."""

    pid: str
    slice: int
    tags: set[str]
    upto: int
    since: datetime
    count: int

    def add(self, tags: Iterable[str], upto: int, since: datetime, count: int) -> None:
        """More events of this persistence id (appends to one persistence id may report out of order)."""
        self.tags.update(tags)
        if upto > self.upto:
            self.upto = upto
        if since < self.since:
            self.since = since
        self.count += count

    def merge(self, other: _Pending) -> None:
        self.add(other.tags, other.upto, other.since, other.count)


class TagBatch:
    """What a batched writer has to write and how far its rows are complete; no I/O. Thread-safe: appends
    report to it from any thread, the writer takes its work from it."""

    def __init__(self, key: str, writer: str, limit: int) -> None:
        #: This writer's row in ``tag_batch_writers``.
        self.key = key
        #: The ``event_journal.writer`` of its events.
        self.writer = writer
        #: Rows per (persistence id, tag) and per statement at most.
        self.limit = limit
        #: The database clock of this writer's last statement: an append that starts later stamps later.
        self.clock: datetime | None = None
        self.entity_types: list[str] = []
        self._types: set[str] = set()
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        #: Taken by the write under way, not committed yet.
        self._taken: list[_Pending] = []
        #: Appends under way: ticket -> the clock before they started.
        self._running: dict[int, datetime | None] = {}
        self._tickets = 0
        #: Events pending (or taken) in all; ``_queued``: pending and not taken by a write.
        self.events = 0
        self._queued = 0
        #: The tag view's bucket size in ms (set by the face from the database before the first write).
        self.bucket_ms = 0
        #: The newest db_timestamp of the events reported written, and the watermark this writer's last
        #: statement wrote (at most: pairs left incomplete bound it lower, but they are taken, so not caught up).
        self._newest: datetime | None = None
        self._mark: datetime | None = None
        metrics.count_pending(self)

    # -- what the appends report -------------------------------------------------------------------------

    def knows(self, entity_type: str) -> bool:
        return entity_type in self._types

    def add_type(self, entity_type: str) -> None:
        with self._lock:
            if entity_type not in self._types:
                self._types.add(entity_type)
                self.entity_types = sorted(self._types)

    def begin(self) -> int:
        """An append is about to run: until it reports, the watermark stays below the clock known now."""
        with self._lock:
            self._tickets += 1
            self._running[self._tickets] = self.clock
            return self._tickets

    def written(self, ticket: int, pid: str, slice_: int, tags: Iterable[str], rows: list[tuple[int, datetime]]
                ) -> bool:
        """The append of ``ticket`` committed ``rows`` (sequence number, db_timestamp); True when this append
        makes a write due (``limit`` events queued)."""
        if len(rows) == 1:
            (upto, since), = rows
            newest = since
        else:
            upto, since, newest = max(r[0] for r in rows), min(r[1] for r in rows), max(r[1] for r in rows)
        with self._lock:
            self._running.pop(ticket, None)
            if self._newest is None or newest > self._newest:
                self._newest = newest
            before = self._queued
            self._add(pid, slice_, tags, upto, since, len(rows))
            return before < self.limit <= self._queued

    def failed(self, ticket: int, pid: str, slice_: int, tags: Iterable[str], *, unknown: bool) -> None:
        """The append of ``ticket`` raised: nothing was written, or (``unknown``) it may have been: then the
        persistence id's tagged events are written from whatever the journal holds."""
        with self._lock:
            clock = self._running.pop(ticket, None)
            if unknown and clock is not None:
                self._add(pid, slice_, tags, NO_UPTO, clock, 1)

    def _add(self, pid: str, slice_: int, tags: Iterable[str], upto: int, since: datetime, count: int) -> None:
        """Events of ``pid`` pending (the caller holds the lock): its entry updated in place, or a new one."""
        known = self._pending.get(pid)
        if known is None:
            self._pending[pid] = _Pending(pid, slice_, set(tags), upto, since, count)
        else:
            known.add(tags, upto, since, count)
        self.events += count
        self._queued += count

    # -- what the writer does ----------------------------------------------------------------------------

    def pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def idle(self) -> bool:
        """Nothing pending and no append under way."""
        with self._lock:
            return not (self._pending or self._taken or self._running)

    def caught_up(self) -> bool:
        """Every event reported written has its tag rows and is below this writer's watermark (as its last
        statement wrote it): a flush has nothing to do."""
        with self._lock:
            if self._pending or self._taken:
                return False
            return self._newest is None or (self._mark is not None and self._mark > self._newest)

    def take(self) -> list[_Pending]:
        """Everything pending, for a write (it counts as pending until :meth:`finished` or :meth:`give_back`)."""
        with self._lock:
            entries = list(self._pending.values())
            self._pending.clear()
            self._queued = 0
            self._taken.extend(entries)
            return entries

    def next_statement(self, entries: list[_Pending], *, own: bool = True) -> tuple[list[_Pending], list[BatchPair]]:
        """The entries (from the front of ``entries``) and pairs of one statement: at least one entry, and
        about ``limit`` rows at most. Not ``own`` (a recovery's): they do not bound this writer's watermark."""
        chosen: list[_Pending] = []
        pairs: list[BatchPair] = []
        rows = 0
        for entry in entries:
            size = len(entry.tags) * min(entry.count, self.limit)
            if chosen and rows + size > self.limit:
                break
            chosen.append(entry)
            rows += size
            lsb, lsb_hex = pid_lsb(entry.pid)
            since = entry.since if own else None
            pairs.extend(BatchPair(entry.pid, entry.slice, tag, entry.upto, since, lsb, lsb_hex)
                         for tag in sorted(entry.tags))
        return chosen, pairs

    def bound(self, excluding: Iterable[_Pending] = ()) -> datetime | None:
        """The watermark's bound from everything pending, taken or under way, but ``excluding`` (the entries
        a statement writes: their pairs that may stay incomplete bound it in the statement itself)."""
        skip = {id(e) for e in excluding}
        with self._lock:
            times = [e.since for e in self._pending.values()]
            times += [e.since for e in self._taken if id(e) not in skip]
            times += [t for t in self._running.values() if t is not None]
            if self.clock is not None:
                times.append(self.clock)
        return min(times) if times else None

    def saw_clock(self, clock: datetime, bound: datetime | None = None) -> None:
        """A statement of this writer read the database clock ``clock``; it wrote the watermark ``bound`` (None:
        its clock)."""
        with self._lock:
            if self.clock is None or clock > self.clock:
                self.clock = clock
            self._mark = clock if bound is None else min(bound, clock)

    def finished(self, entries: list[_Pending], rows: list[tuple[Any, ...]]) -> list[_Pending]:
        """A statement for ``entries`` committed with ``rows`` (heartbeat, pid, tag, rows written): the entries
        with pairs that may have more rows (as many as the limit) are returned to write again."""
        written = {(pid, tag): n for _, pid, tag, n in rows if pid is not None}
        metrics.TAG_ROWS.inc(sum(written.values()))
        again: list[_Pending] = []
        with self._lock:
            for entry in entries:
                more = {tag for tag in entry.tags if written.get((entry.pid, tag), 0) >= self.limit}
                if more:
                    entry.tags = more
                    again.append(entry)
                    continue
                self._taken = [e for e in self._taken if e is not entry]
                self.events -= entry.count
        return again

    def give_back(self, entries: list[_Pending]) -> None:
        """A write failed: its entries are pending again."""
        with self._lock:
            skip = {id(e) for e in entries}
            self._taken = [e for e in self._taken if id(e) not in skip]
            for entry in entries:
                self._queued += entry.count
                known = self._pending.get(entry.pid)
                if known is not None:  # already counted in _queued
                    entry.merge(known)
                self._pending[entry.pid] = entry

    # -- statements ----------------------------------------------------------------------------------------

    def write_step(self, journal: JournalCore, pairs: list[BatchPair], bound: datetime | None
                   ) -> Step[list[tuple[Any, ...]]]:
        """Write ``pairs`` (none: only this writer's row, a heartbeat) and this writer's row with its watermark
        bounded by ``bound``; returns the rows (heartbeat, pid, tag, rows written), the clock noted."""
        sql = store.batch_sql("event_journal", bucket_ms=self.bucket_ms, jsonb=journal.events.jsonb, pairs=bool(pairs))
        params = store.batch_params(self.key, self.writer, self.entity_types, bound, pairs, self.limit)
        # Prepared at once, on this writer's own connection (see the module's doc).
        rows: list[tuple[Any, ...]] = yield statement((sql, params), prepare=True)
        if not pairs:
            rows = [(rows[0][0], None, None, 0)]
        self.saw_clock(rows[0][0], bound)
        return rows


def complete_before_step(settings: Settings) -> Step[datetime | None]:
    """For readers: the time before which every batched writer's tag rows are written (None: no batched
    writer). A writer silent for ``tag_writer_timeout`` holds it back until it is recovered; it is logged once."""
    rows = yield statement(store.watermark(settings.tag_writer_timeout))
    mark = rows[0]
    for name in mark.silent or ():
        if name not in _warned:
            _warned.add(name)
            log.warning("batched tag writer %s has been silent for more than tag_writer_timeout (%g s): "
                        "events_by_tag waits for its tag rows; a running batched writer recovers them, or run "
                        "`pgjournal tags recover`", name, settings.tag_writer_timeout)
    return mark.complete_before  # type: ignore[no-any-return]


_warned: set[str] = set()


@dataclass(frozen=True)
class Recovered:
    """A silent writer whose tag rows were written by another (``rows``: tag view rows written)."""

    id: str
    writer: str
    persistence_ids: int
    rows: int


#: The orchestration of a writer's statements, for both faces: a generator that yields a factory of a fresh step
#: for each statement (the face runs it on the writer's own connection, retrying transient failures, and sends
#: back its result or throws its error in) and returns what the work returns.
Work = Generator[Callable[[], Step[Any]], Any, R]


class TagWriterRules:
    """What both faces of the batched writer do (the blocking :class:`TagBatcher` thread, the asyncio
    :class:`pgjournal.aio.tag_batcher.AsyncTagBatcher` task): the work of each operation as :data:`Work`, the
    retry rule, the reports. A face adds its lock, its connection, its timer and the driver of the work."""

    def __init__(self, journal: JournalCore) -> None:
        self._journal = journal
        settings = journal.settings
        self.batch = TagBatch(uuid.uuid4().hex, journal.writer_id, settings.tag_batch_size)
        self._retry = RetryPolicy.of(settings)
        self._retryable = journal.dialect.retryable_sqlstates
        self._interval = settings.tag_flush_interval
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
            entries = [_Pending(t.persistence_id, t.slice, set(t.tags), NO_UPTO, writer.complete_before, 1)
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
        return self._interval if not failures else min(self._timeout / 4, self._interval * 2 ** failures)

    def _report(self, exc: BaseException) -> TagFlushFailed:
        metrics.TAG_FLUSH_FAILURES.inc()
        reason = " ".join(str(exc).split()) or exc.__class__.__name__
        log.error("batched tag writer %s could not write tag view rows (%s): %d event(s) stay pending and are "
                  "written by the next round (or by recovery if this process ends)", self.batch.key, reason,
                  self.batch.events)
        return TagFlushFailed(f"the batched tag writer could not write the tag view rows of {self.batch.events} "
                              f"pending event(s): {reason}; they stay in the journal and are written by recovery "
                              "(`pgjournal tags recover`, or any batched writer after tag_writer_timeout)")


class TagBatcher(TagWriterRules):
    """The blocking face: the journal's batched tag writer, a thread that starts with the first tagged append."""

    _journal: BlockingCore

    def __init__(self, journal: BlockingCore) -> None:
        super().__init__(journal)
        #: This writer's statements, one at a time (the thread's, and a caller's flush or registration), on its
        #: own connection (opened at the first statement and again after a loss).
        self._io = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._event = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the append path --------------------------------------------------------------------------------

    def begin(self, entity_type: str) -> int:
        """Before a tagged append runs (see :meth:`TagBatch.begin`); the first one of an entity type first
        records it in this writer's row (recovery finds the writer's events by entity type)."""
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
        """Drive ``work``: each statement it asks for run with :meth:`_run` (the caller holds ``_io``)."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                factory = work.throw(error) if error is not None else work.send(result)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                result, error = self._run(factory), None
            except Exception as exc:
                result, error = None, exc

    def _run(self, step: Callable[[], Step[R]]) -> R:
        """Run a fresh ``step()`` on this writer's connection, retrying transient failures under the retry policy."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return run_pooled(step(), self._connection)
            except (DatabaseUnavailable, psycopg.Error) as exc:
                pause = self._pause(attempt, exc)
                if pause is None:
                    raise
                time.sleep(pause)

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


def flushed_before_reading() -> contextlib.AbstractContextManager[None]:
    """Around the flush a current tag query makes before it reads (read-your-writes in the process): a flush
    that fails (logged and counted already) does not fail the read; the watermark keeps it from passing the
    events whose rows are still pending."""
    return contextlib.suppress(TagFlushFailed)


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
