"""Run a projection over one slice range: read, validate, handle, store offsets; retry, fail or skip.

A :class:`RangeRunner` (re)starts its range from the stored offsets until it is stopped: after a pause, after
an infrastructure error (with backoff) and when a worker re-assigns ranges. One thread reads the live
``events_by_slices`` query into a bounded queue; the runner's thread validates and handles envelopes, so
groups and at-least-once saves can close on time even when no event arrives.

With a lease guard (see :mod:`projections.leases`) the runner stops before its lease can expire, and the
transactional modes check the lease inside their transaction (``FOR SHARE``: a take-over waits for the
commit), so two workers never commit work for one slice in overlapping leases.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import queue
import random
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import psycopg
import psycopg.errors

from pgjournal import metrics
from pgjournal.by_pid import ByPersistenceId
from pgjournal.connections import user_statements
from pgjournal.envelope import EventEnvelope
from pgjournal.errors import ConfigurationError, InvalidArgument, JournalError
from pgjournal.offsets import NoOffset, Offset
from pgjournal.query import Query
from pgjournal.slices import check_slice_range
from pgjournal.steps import Step, run

from .dead_letters import decoded, lenient, serializer_of, store_dead_letter
from .handlers import AtLeastOnce, ExactlyOnce, Grouped, Projection, ProjectionSettings
from .management import is_paused
from .offset_store import OffsetStore, Record, Verdict, range_key

if TYPE_CHECKING:
    from pgjournal.journal import Journal

#: Deadlocks in a row on one commit before the range restarts.
DEADLOCK_RETRIES = 10

log = logging.getLogger("projections")


class ProjectionFailed(JournalError):
    """A handler kept failing (or the payload does not decode) and the projection is configured to stop
    (``on_failure="stop"``): the offset stays before the event. ``ser_id``/``manifest`` are those stored with
    the event (``None`` when they could not be read)."""

    def __init__(self, projection: str, envelope: EventEnvelope, attempts: int, cause: BaseException, *,
                 ser_id: int | None = None, manifest: str | None = None) -> None:
        self.projection = projection
        self.persistence_id = envelope.persistence_id
        self.seq_nr = envelope.seq_nr
        self.ser_id = ser_id
        self.manifest = manifest
        self.cause = cause
        super().__init__(f"projection {projection!r} failed on {envelope.persistence_id!r} seq_nr "
                         f"{envelope.seq_nr} (ser_id {ser_id}, manifest {manifest!r}) after {attempts} "
                         f"attempt(s): {cause!r}")


class LeaseLost(JournalError):
    """This worker no longer owns (or may soon lose) a slice it was processing: stop the range."""


class LeaseGuard(Protocol):
    owner: str

    def valid(self) -> bool:
        """True while the lease is certainly held (renewed recently enough)."""

    def epochs(self, slices: Sequence[int]) -> dict[int, int]:
        """The lease epoch of each slice, as acquired."""

    def fence(self, conn: psycopg.Connection, slices: Sequence[int], epochs: Mapping[int, int]) -> None:
        """Inside a transaction: lock the leases of ``slices`` for share, or raise :class:`LeaseLost`."""


@dataclass(frozen=True)
class RunContext:
    """What a handler may want to know about the run it is called from (``current_context.get()``)."""

    projection: str
    key: str
    owner: str | None
    epochs: Mapping[int, int] = field(default_factory=dict)


current_context: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("projection_run", default=None)


@dataclass
class Stats:
    #: Envelopes the slice query delivered (duplicates included): what a (re)start costs in rows.
    read: int = 0
    handled: int = 0
    duplicates: int = 0
    rejected: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    restarts: int = 0


class _RangeMetrics:
    """The Prometheus series of one projection range (no-ops without the metrics extra)."""

    def __init__(self, projection: str, slices: str) -> None:
        self.envelopes = metrics.PROJECTION_ENVELOPES.labels(projection, slices)
        self.lag = metrics.PROJECTION_LAG.labels(projection, slices)
        self.errors = metrics.PROJECTION_ERRORS.labels(projection, slices)


class _HandlerError(Exception):
    def __init__(self, envelope: EventEnvelope) -> None:
        super().__init__()
        self.envelope = envelope


@dataclass
class _ReaderFailed:
    error: BaseException


def lookback(journal: Journal, settings: ProjectionSettings | None = None) -> float:
    """How far before its stored offset a range is read again: late commits the last run had not seen yet
    (its backtracking would have found them). ``ProjectionSettings.restart_lookback`` overrides it."""
    if settings is not None and settings.restart_lookback is not None:
        return settings.restart_lookback
    s = journal.settings
    return (s.backtracking_window if s.backtracking_enabled else 0.0) + s.backtracking_behind_current_time


class RangeRunner:
    """One projection over ``min_slice..max_slice``. ``run()`` blocks until :meth:`stop` (or a failure)."""

    def __init__(self, journal: Journal, projection: Projection, min_slice: int, max_slice: int, *,
                 guard: LeaseGuard | None = None) -> None:
        if not isinstance(projection, Projection):
            raise InvalidArgument(f"projection must be a Projection, got {type(projection).__name__}")
        check_slice_range(min_slice, max_slice)
        self.journal = journal
        self.projection = projection
        self.settings = projection.settings
        self.min_slice, self.max_slice = min_slice, max_slice
        self.key = range_key(min_slice, max_slice)
        self.guard = guard
        self.epochs: dict[int, int] = guard.epochs(range(min_slice, max_slice + 1)) if guard else {}
        self.stats = Stats()
        self._metrics = _RangeMetrics(projection.name, metrics.slices_label(min_slice, max_slice))
        #: What the runner reads through: a payload that does not decode arrives as an Undecodable event.
        serializers = lenient(journal)
        self.reading = Query(journal, serializers=serializers)
        self._replay = ByPersistenceId(journal, serializers)
        self._stop = threading.Event()
        self.lookback = lookback(journal, self.settings)
        self.time_window = max(self.settings.time_window, 2 * self.lookback)
        #: Why the run ended, when it failed.
        self.failed: BaseException | None = None
        self.thread: threading.Thread | None = None

    def stop(self) -> None:
        self._stop.set()

    def start(self) -> None:
        """Run on a daemon thread; a failure is kept in :attr:`failed` (and logged)."""

        def target() -> None:
            try:
                self.run()
            except ProjectionFailed as exc:
                log.error("%s", exc)
            except BaseException as exc:
                self.failed = exc
                log.exception("projection %s %s crashed", self.projection.name, self.key)

        self.thread = threading.Thread(target=target, daemon=True, name=f"projection-{self.projection.name}-{self.key}")
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- the restart loop ----------------------------------------------------------------------------

    def run(self) -> None:
        """Process until stopped. Raises :class:`ProjectionFailed`; returns on :class:`LeaseLost`."""
        token = current_context.set(RunContext(self.projection.name, self.key,
                                               self.guard.owner if self.guard else None, self.epochs))
        try:
            while not self._stop.is_set():
                if self.guard is not None and not self.guard.valid():
                    return
                try:
                    if self._paused():
                        self._stop.wait(self.settings.management_interval)
                        continue
                    self._run_once()
                except (ProjectionFailed, InvalidArgument, ConfigurationError) as exc:
                    self.failed = exc  # a failure, or a programming error: running again would not help
                    raise
                except LeaseLost as exc:
                    log.warning("projection %s %s: %s", self.projection.name, self.key, exc)
                    return
                except (psycopg.Error, JournalError, OSError) as exc:
                    self.stats.restarts += 1
                    self._metrics.errors.inc()
                    log.warning("projection %s %s restarts after %r", self.projection.name, self.key, exc)
                    self._stop.wait(self.settings.restart_backoff)
        finally:
            current_context.reset(token)

    def _paused(self) -> bool:
        with self.journal.connection() as conn:
            return is_paused(conn, self.projection.name)

    def _run_once(self) -> None:
        store = OffsetStore(self.journal, self.projection.name, self.projection.entity_type, self.min_slice,
                            self.max_slice, time_window=self.time_window, lookback=self.lookback,
                            table=self.settings.offset_table)
        with self.journal.connection() as conn:
            start = store.load(conn)  # the lookback is applied per slice: see OffsetStore.safe_point
        offset: Offset = NoOffset if start is None else start
        query = self.reading.events_by_slices(self.projection.entity_type, self.min_slice, self.max_slice, offset)
        inbox: queue.Queue[EventEnvelope | _ReaderFailed] = queue.Queue(maxsize=2 * self.journal.settings.buffer_size)
        halt = threading.Event()
        reader = threading.Thread(target=_read, args=(query, inbox, halt), daemon=True,
                                  name=f"read-{self.projection.name}-{self.key}")
        reader.start()
        try:
            self._consume(store, inbox)
        finally:
            halt.set()
            query.close()
            reader.join(timeout=30)

    # -- consuming -----------------------------------------------------------------------------------

    def _consume(self, store: OffsetStore, inbox: queue.Queue[EventEnvelope | _ReaderFailed]) -> None:
        """Hand envelopes to the handler as its mode wants them, and keep the range's housekeeping on time."""
        pending = self._pending_for(store)
        now = time.monotonic()
        next_check = now + self.settings.management_interval
        next_delete = now + min(self.settings.delete_interval, self.time_window)
        try:
            while not self._stop.is_set():
                self._check_lease()
                item = self._next(inbox, timeout=0.05 if pending.waiting() else 0.2)
                now = time.monotonic()
                if item is not None:
                    self.stats.read += 1
                    pending.take(item, now)
                pending.flush_if_due(now)
                if now >= next_check:
                    next_check = now + self.settings.management_interval
                    if self._paused():
                        log.info("projection %s %s paused", self.projection.name, self.key)
                        return
                if now >= next_delete:
                    next_delete = now + self.settings.delete_interval
                    self._housekeeping(store)
        finally:
            pending.on_stop()  # what was handled is stored; a group not handled yet is read again
            self._mark_on_stop(store)

    def _pending_for(self, store: OffsetStore) -> _Pending:
        handler = self.projection.handler
        if isinstance(handler, Grouped):
            return _Groups(self, store, handler)
        if isinstance(handler, AtLeastOnce):
            return _Unsaved(self, store, handler)
        return _Each(self, store)

    def _check_lease(self) -> None:
        if self.guard is not None and not self.guard.valid():
            raise LeaseLost(f"lease of {self.key} not renewed in time")

    @staticmethod
    def _next(inbox: queue.Queue[EventEnvelope | _ReaderFailed], timeout: float) -> EventEnvelope | None:
        """The next envelope the reader delivered (``None`` after ``timeout``); the reader's failure raised."""
        try:
            item = inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _ReaderFailed):
            raise item.error
        return item

    def _housekeeping(self, store: OffsetStore) -> None:
        """Evict old records, move the idle slices' markers, delete superseded offset rows."""
        store.evict()
        with self.journal.connection() as conn:
            store.advance_markers(conn, slack=self.lookback / 2)
            if store.rows_since_delete:
                store.delete_old(conn)

    def _mark_on_stop(self, store: OffsetStore) -> None:
        """Best effort: let the next run start near the newest offset (it starts earlier, safely, without)."""
        try:
            with self.journal.connection() as conn:
                store.advance_markers(conn)
        except (psycopg.Error, JournalError) as exc:
            log.info("projection %s %s: markers not advanced on stop: %r", self.projection.name, self.key, exc)

    def _admit(self, conn: psycopg.Connection, store: OffsetStore, env: EventEnvelope,
               pending: MutableMapping[str, Record]) -> list[EventEnvelope]:
        """Validate ``env``: nothing for a duplicate; for a rejected one, its missing predecessors first."""
        return run(self._admit_step(store, env, pending), conn)

    def _admit_step(self, store: OffsetStore, env: EventEnvelope, pending: MutableMapping[str, Record]
                    ) -> Step[list[EventEnvelope]]:
        """:meth:`_admit` as a step: the gate's verdict, and a gap filled by replaying the missing events."""
        validation = yield from store.validate_step(env, pending)
        if validation.verdict is Verdict.DUPLICATE:
            self.stats.duplicates += 1
            return []
        out: list[EventEnvelope] = []
        if validation.verdict is Verdict.REJECTED:
            self.stats.rejected += 1
            log.info("projection %s: %r seq_nr %d rejected (processed up to %d): loading the missing events",
                     self.projection.name, env.persistence_id, env.seq_nr, validation.after)
            out = yield from self._replay.events_step(env.persistence_id, validation.after + 1, env.seq_nr - 1)
        out.append(env)
        for e in out:
            pending[e.persistence_id] = Record(e.slice, e.seq_nr, e.db_timestamp)
        return out

    def _transact(self, store: OffsetStore, envelopes: Sequence[EventEnvelope]) -> None:
        """Exactly-once and grouped: handler and offsets in one transaction, with retries."""
        handler = self.projection.handler
        attempts = self.settings.attempts
        last: BaseException | None = None
        failed_on = envelopes[0]
        todo: list[EventEnvelope] = []
        attempt = 0
        conflicts = 0
        while attempt < attempts:
            attempt += 1
            pending: dict[str, Record] = {}
            with self.journal.connection() as conn:
                todo = [e for env in envelopes for e in self._admit(conn, store, env, pending)]
                if not todo:
                    return
                try:
                    self._commit(conn, store, todo, pending, handle=True)
                except psycopg.errors.DeadlockDetected as exc:
                    # Lease rows are locked in slice order, so this is rare; not the handler's fault.
                    conflicts += 1
                    if conflicts > DEADLOCK_RETRIES:
                        raise JournalError(f"projection {self.projection.name} {self.key}: deadlocked "
                                           f"{conflicts} times in a row committing {len(todo)} envelope(s); "
                                           "the range restarts") from exc
                    self._stop.wait(random.uniform(0, min(1.0, 0.01 * 2 ** conflicts)))  # backoff, jitter
                    attempt -= 1
                    continue
                except _HandlerError as exc:
                    last, failed_on = exc.__cause__, exc.envelope
                    log.warning("projection %s: handler failed on %r seq_nr %d (%d envelope(s), attempt %d/%d): "
                                "%r", self.projection.name, failed_on.persistence_id, failed_on.seq_nr, len(todo),
                                attempt, attempts, last)
                    if attempt < attempts:
                        self._backoff(attempt)
                    continue
            store.commit(pending)
            self._handled(todo)
            return
        assert last is not None
        if isinstance(handler, Grouped) and len(envelopes) > 1:
            # Find the envelope at fault: one at a time, each with its own attempts, then fail or skip it.
            log.warning("projection %s: group of %d failed %d times; handling it one envelope at a time",
                        self.projection.name, len(envelopes), attempts)
            for env in envelopes:
                self._transact(store, [env])
            return
        if self.settings.on_failure in ("stop", "fail"):
            raise self._failed(failed_on, attempts, last)
        dead_letter = self.settings.on_failure == "dead-letter"
        pending = {}
        with self.journal.connection() as conn:
            todo = [e for env in envelopes for e in self._admit(conn, store, env, pending)]
            dead = self._commit(conn, store, todo, pending, handle=dead_letter, dead_letter=dead_letter)
        store.commit(pending)
        if dead_letter:
            failed = {(env.persistence_id, env.seq_nr) for env, _ in dead}
            self._handled([e for e in todo if (e.persistence_id, e.seq_nr) not in failed])
            for env, exc in dead:
                self._log_dead_letter(env, exc)
        else:
            self._log_skipped(todo, last)

    def _commit(self, conn: psycopg.Connection, store: OffsetStore, todo: list[EventEnvelope],
                pending: dict[str, Record], *, handle: bool, dead_letter: bool = False
                ) -> list[tuple[EventEnvelope, BaseException]]:
        """Handle ``todo`` (unless not ``handle``) and store its offsets in one transaction. ``dead_letter``:
        each envelope in its own savepoint; one that fails is stored as a dead letter instead (returned)."""
        handler = self.projection.handler
        dead: list[tuple[EventEnvelope, BaseException]] = []
        with conn.transaction():
            if self.guard is not None:
                slices = sorted({e.slice for e in todo})
                self.guard.fence(conn, slices, self.epochs)
            if handle and dead_letter:
                for env in todo:
                    try:
                        with conn.transaction():
                            self._handle_in(conn, [env])
                    except Exception as exc:
                        store_dead_letter(conn, self.journal, self.projection.name, self.key, env, exc)
                        dead.append((env, exc))
            elif handle:
                current = todo[0]
                try:
                    with user_statements(conn):  # pgjournal's statement limits are not the handler's
                        if isinstance(handler, ExactlyOnce):
                            for current in todo:
                                handler.handle(conn, decoded(self.journal, current))
                        else:
                            assert isinstance(handler, Grouped)
                            handler.handle(conn, [decoded(self.journal, current) for current in todo])
                except Exception as exc:
                    raise _HandlerError(current) from exc
            try:
                store.save(conn, pending, fenced=True)
            except psycopg.errors.UniqueViolation:
                raise LeaseLost(f"an offset row of {self.key} exists already: another worker processed "
                                "the same event") from None
        return dead

    def _handle_in(self, conn: psycopg.Connection, envelopes: list[EventEnvelope]) -> None:
        handler = self.projection.handler
        ready = [decoded(self.journal, e) for e in envelopes]
        if isinstance(handler, ExactlyOnce):
            for env in ready:
                handler.handle(conn, env)
        else:
            assert isinstance(handler, Grouped)
            handler.handle(conn, ready)

    def _handled(self, envelopes: Sequence[EventEnvelope]) -> None:
        """Count envelopes whose handling committed; the lag is the clock minus the newest one's time."""
        if not envelopes:
            return
        self.stats.handled += len(envelopes)
        self._metrics.envelopes.inc(len(envelopes))
        newest = max(e.db_timestamp for e in envelopes)
        self._metrics.lag.set(max(0.0, (datetime.now(UTC) - newest).total_seconds()))

    def _log_dead_letter(self, env: EventEnvelope, exc: BaseException) -> None:
        self._metrics.errors.inc()
        self.stats.dead_lettered += 1
        log.error("projection %s: %r seq_nr %d stored as a dead letter after %d attempt(s): %r",
                  self.projection.name, env.persistence_id, env.seq_nr, self.settings.attempts, exc)

    def _failed(self, env: EventEnvelope, attempts: int, cause: BaseException) -> ProjectionFailed:
        ser_id: int | None = None
        manifest: str | None = None
        try:
            with self.journal.connection() as conn:
                ser_id, manifest = serializer_of(conn, self.journal, env)
        except (psycopg.Error, JournalError) as exc:
            log.warning("projection %s: serializer of %r seq_nr %d not read: %r", self.projection.name,
                        env.persistence_id, env.seq_nr, exc)
        return ProjectionFailed(self.projection.name, env, attempts, cause, ser_id=ser_id, manifest=manifest)

    def _at_least_once(self, store: OffsetStore, env: EventEnvelope, unsaved: dict[str, Record]) -> int:
        handler = self.projection.handler
        assert isinstance(handler, AtLeastOnce)
        scratch: dict[str, Record] = {}
        with self.journal.connection() as conn:
            todo = self._admit(conn, store, env, collections.ChainMap(scratch, unsaved))
        for e in todo:
            for attempt in range(1, self.settings.attempts + 1):
                if self.guard is not None and not self.guard.valid():
                    raise LeaseLost(f"lease of {self.key} not renewed in time")
                try:
                    handler.handle(decoded(self.journal, e))
                    self._handled([e])
                    break
                except Exception as exc:
                    log.warning("projection %s: handler failed on %r seq_nr %d (attempt %d/%d): %r",
                                self.projection.name, e.persistence_id, e.seq_nr, attempt,
                                self.settings.attempts, exc)
                    if attempt == self.settings.attempts:
                        if self.settings.on_failure in ("stop", "fail"):
                            raise self._failed(e, attempt, exc) from exc
                        if self.settings.on_failure == "dead-letter":
                            with self.journal.connection() as conn:
                                store_dead_letter(conn, self.journal, self.projection.name, self.key, e, exc)
                            self._log_dead_letter(e, exc)
                        else:
                            self._log_skipped([e], exc)
                    else:
                        self._backoff(attempt)
            unsaved[e.persistence_id] = Record(e.slice, e.seq_nr, e.db_timestamp)
        return len(todo)

    def _save(self, store: OffsetStore, unsaved: dict[str, Record]) -> None:
        with self.journal.connection() as conn:
            store.save(conn, unsaved, fenced=False)
        store.commit(unsaved)
        unsaved.clear()

    def _backoff(self, attempt: int) -> None:
        self._stop.wait(self.settings.backoff_for(attempt))

    def _log_skipped(self, envelopes: Sequence[EventEnvelope], cause: BaseException | None) -> None:
        for e in envelopes:
            self._metrics.errors.inc()
            self.stats.skipped += 1
            log.error("projection %s SKIPPED %r seq_nr %d after %d attempt(s): %r", self.projection.name,
                      e.persistence_id, e.seq_nr, self.settings.attempts, cause)


class _Pending:
    """Envelopes taken but not yet stored, in the way one handler mode stores them."""

    def __init__(self, runner: RangeRunner, store: OffsetStore) -> None:
        self.runner, self.store = runner, store

    def waiting(self) -> bool:
        return False

    def take(self, env: EventEnvelope, now: float) -> None:
        raise NotImplementedError

    def flush_if_due(self, now: float) -> None:
        pass

    def on_stop(self) -> None:
        pass


class _Each(_Pending):
    """Exactly-once: every envelope handled and stored in its own transaction."""

    def take(self, env: EventEnvelope, now: float) -> None:
        self.runner._transact(self.store, [env])


class _Groups(_Pending):
    """Grouped: up to ``max_count`` envelopes gathered for at most ``max_wait``, one transaction each group."""

    def __init__(self, runner: RangeRunner, store: OffsetStore, handler: Grouped) -> None:
        super().__init__(runner, store)
        self.handler = handler
        self.group: list[EventEnvelope] = []
        self.due = 0.0

    def waiting(self) -> bool:
        return bool(self.group)

    def take(self, env: EventEnvelope, now: float) -> None:
        if not self.group:
            self.due = now + self.handler.max_wait
        self.group.append(env)

    def flush_if_due(self, now: float) -> None:
        if self.group and (len(self.group) >= self.handler.max_count or now >= self.due):
            group, self.group = self.group, []
            self.runner._transact(self.store, group)


class _Unsaved(_Pending):
    """At-least-once: handled at once, offsets stored every ``save_every`` envelopes or ``save_interval``."""

    def __init__(self, runner: RangeRunner, store: OffsetStore, handler: AtLeastOnce) -> None:
        super().__init__(runner, store)
        self.handler = handler
        self.unsaved: dict[str, Record] = {}
        self.count = 0
        self.due = 0.0

    def waiting(self) -> bool:
        return bool(self.unsaved)

    def take(self, env: EventEnvelope, now: float) -> None:
        if not self.unsaved:
            self.due = now + self.handler.save_interval
        self.count += self.runner._at_least_once(self.store, env, self.unsaved)

    def flush_if_due(self, now: float) -> None:
        if self.unsaved and (self.count >= self.handler.save_every or now >= self.due):
            self.runner._save(self.store, self.unsaved)
            self.count = 0

    def on_stop(self) -> None:
        if self.unsaved:
            self.runner._save(self.store, self.unsaved)


def _read(query: object, inbox: queue.Queue[EventEnvelope | _ReaderFailed], halt: threading.Event) -> None:
    try:
        for env in query:  # type: ignore[attr-defined]
            while True:
                try:
                    inbox.put(env, timeout=0.1)
                    break
                except queue.Full:
                    if halt.is_set():
                        return
            if halt.is_set():
                return
    except BaseException as exc:  # handed to the consuming thread
        if not halt.is_set():
            inbox.put(_ReaderFailed(exc))


def run_range(journal: Journal, projection: Projection, min_slice: int, max_slice: int) -> RangeRunner:
    """Start a runner for one range on a daemon thread (no leases); ``stop()`` and ``join()`` it."""
    runner = RangeRunner(journal, projection, min_slice, max_slice)
    runner.start()
    return runner
