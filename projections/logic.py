"""The rules of running a projection over one slice range, written once as steps (:mod:`pgjournal.runtime.steps`) for
both faces: the blocking :class:`~projections.runner.RangeRunner` (threads) and the asyncio
:class:`~projections.aio.AsyncRangeRunner` (tasks, handlers may be coroutines).

:class:`RangeLogic` holds the restart loop (pause, backoff, which failures end the run), the consuming loop
(groups and at-least-once saves closing on time, the pause check, housekeeping), the units of work
(validation by the offset store and replay of rejected envelopes; exactly-once and grouped: handler and
offsets in one transaction with retries, deadlocks retried, failure modes stop, skip and dead-letter;
at-least-once: handled, offsets saved in batches). Database work is a step run on a connection of the
journal's pool (``Call(journal.run, ...)``); what only a face can do is a ``Call`` of one of its methods:
:meth:`RangeLogic._next` (the next chunk of envelopes its reader delivered), :meth:`RangeLogic._pause` (a wait that
``stop()`` ends), :meth:`RangeLogic._open_reader` and :meth:`RangeLogic._close_reader`. A handler is
``Call``\\ ed on the unit's connection: the asyncio driver awaits what a coroutine handler returns.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import psycopg.errors

from pgjournal.errors import ConfigurationError, InvalidArgument, JournalError, LeaseLost, ProjectionFailed
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import NoOffset, Offset, TimestampOffset
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import check_slice_range
from pgjournal.query.by_pid import ByPersistenceId
from pgjournal.query.gate import Verdict
from pgjournal.runtime import metrics
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Call, Statement, Step, statement

from .dead_letters import dead_letter_statement, decoded, lenient, serializer_of_step
from .handlers import AtLeastOnce, ExactlyOnce, Grouped, Projection, ProjectionSettings
from .management import is_paused_step, lags_step
from .offset_store import OffsetStore, Record, range_key
from .shards import range_journal

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.core.journal_core import JournalCore

#: Deadlocks in a row on one commit before the range restarts.
DEADLOCK_RETRIES = 10
#: Before committing again after a deadlock: anything up to 20 ms, doubling to 1 s.
DEADLOCK_BACKOFF = Backoff(0.02, 2.0, 1.0, jitter=1.0)
DEAD_LETTER_SAVEPOINT = "pgjournal_dead_letter"
#: The reader hands envelopes over in chunks, each at most the journal's ``buffer_size`` (what one poll read and
#: is there without another), one hand-over between threads or tasks for many envelopes; its inbox holds at most
#: this many chunks (a reader runs that far ahead of the handler).
CHUNKS = 2

log = printable_logger("projections")


class LeaseGuard(Protocol):
    owner: str

    def valid(self) -> bool:
        """True while the lease is certainly held (renewed recently enough)."""

    def epochs(self, slices: Sequence[int]) -> dict[int, int]:
        """The lease epoch of each slice, as acquired."""

    def fence_step(self, slices: Sequence[int], epochs: Mapping[int, int]) -> Step[None]:
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


def lookback(journal: JournalCore, settings: ProjectionSettings | None = None) -> float:
    """How far before its stored offset a range is read again: late commits the last run had not seen yet
    (its backtracking would have found them). ``ProjectionSettings.restart_lookback`` overrides it."""
    if settings is not None and settings.restart_lookback is not None:
        return settings.restart_lookback
    s = journal.settings
    return (s.backtracking_window if s.backtracking_enabled else 0.0) + s.backtracking_behind_current_time


class RangeLogic:
    """One projection over ``min_slice..max_slice``: everything but the waiting and the reading, which a face
    supplies (see the module docstring). ``stop()`` ends the run."""

    def __init__(self, journal: Any, projection: Projection, min_slice: int, max_slice: int, *,
                 guard: LeaseGuard | None, stop: Any, source: Any = None,
                 serializers: SerializerRegistry | None = None) -> None:
        if not isinstance(projection, Projection):
            raise InvalidArgument(f"projection must be a Projection, got {type(projection).__name__}")
        check_slice_range(min_slice, max_slice)
        #: The journal of the range: a sharded journal's database of these slices (offsets stored beside them).
        self.journal = range_journal(journal, min_slice, max_slice)
        #: Where the events are read: the same journal, or another database's (a processor's source). The
        #: offsets, leases and the handler's transaction stay in :attr:`journal`; the reads by persistence id
        #: that validation and replay need go to the source.
        self.source = self.journal if source is None else range_journal(source, min_slice, max_slice)
        if self.foreign and projection.settings.on_failure == "dead-letter":
            raise ConfigurationError("on_failure='dead-letter' copies the event from the journal of the offsets; "
                                     "with a source in another database use 'stop' or 'skip'")
        self.projection = projection
        self.settings = projection.settings
        self.min_slice, self.max_slice = min_slice, max_slice
        self.key = range_key(min_slice, max_slice)
        self.guard = guard
        self.epochs: dict[int, int] = guard.epochs(range(min_slice, max_slice + 1)) if guard else {}
        self.stats = Stats()
        self._metrics = _RangeMetrics(projection.name, metrics.slices_label(min_slice, max_slice))
        #: What the runner reads through: a payload that does not decode arrives as an Undecodable event.
        self.serializers = serializers if serializers is not None else lenient(self.source)
        self._replay = ByPersistenceId(self.source, self.serializers)
        #: ``threading.Event`` or ``asyncio.Event``: set by :meth:`stop`.
        self._stop = stop
        self.lookback = lookback(self.source, self.settings)
        self.time_window = max(self.settings.time_window, 2 * self.lookback)
        #: Why the run ended, when it failed.
        self.failed: BaseException | None = None
        #: The horizon the lag is measured under, remembered from reading to reading.
        self._lag_tracker = self.source.horizon_tracker()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return bool(self._stop.is_set())

    # -- what a face supplies ------------------------------------------------------------------------

    def _next(self, timeout: float) -> Any:
        """The next chunk of envelopes the reader delivered (``[]`` after ``timeout``); the reader's failure
        raised."""
        raise NotImplementedError

    def _pause(self, seconds: float) -> Any:
        """Wait ``seconds``, or less when the run is stopped."""
        raise NotImplementedError

    def _open_reader(self, offset: Offset) -> Any:
        """Start reading the range's live query from ``offset`` into the inbox :meth:`_next` takes from."""
        raise NotImplementedError

    def _close_reader(self) -> None:
        """Stop the reader (without waiting on the event loop: it may run while the step is closed)."""
        raise NotImplementedError

    def _on(self, step: Step[Any]) -> Call:
        """Run ``step`` on a connection of the journal's pool."""
        return Call(self.journal.run, (step,))

    @property
    def foreign(self) -> bool:
        """The events are read from another database than the one the offsets are stored in."""
        return self.source is not self.journal

    # -- the restart loop ----------------------------------------------------------------------------

    def run_step(self) -> Step[None]:
        """Process until stopped. Raises :class:`ProjectionFailed`; returns on :class:`LeaseLost`."""
        token = current_context.set(RunContext(self.projection.name, self.key,
                                               self.guard.owner if self.guard else None, self.epochs))
        try:
            while not self._stop.is_set():
                if self.guard is not None and not self.guard.valid():
                    return
                try:
                    if (yield self._on(is_paused_step(self.projection.name))):
                        yield Call(self._pause, (self.settings.management_interval,))
                        continue
                    yield from self._run_once_step()
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
                    yield Call(self._pause, (self.settings.restart_backoff,))
        finally:
            current_context.reset(token)

    def offset_store(self) -> OffsetStore:
        return OffsetStore(self.journal, self.projection.name, self.projection.entity_type, self.min_slice,
                           self.max_slice, time_window=self.time_window, lookback=self.lookback,
                           table=self.settings.offset_table, sparse=self.projection.tags is not None,
                           source=self.source if self.foreign else None)

    def _run_once_step(self) -> Step[None]:
        store = self.offset_store()
        start: TimestampOffset | None = yield self._on(store.load_step())  # lookback per slice: safe_point
        yield Call(self._open_reader, (NoOffset if start is None else start,))
        try:
            yield from self._consume_step(store)
        finally:
            self._close_reader()

    # -- consuming -----------------------------------------------------------------------------------

    def _consume_step(self, store: OffsetStore) -> Step[None]:
        """Hand envelopes to the handler as its mode wants them, and keep the range's housekeeping on time."""
        pending = self._pending_for(store)
        try:
            yield from self._consume_loop_step(store, pending)
        except GeneratorExit:
            raise  # closed (its task cancelled): the next run starts earlier, safely
        except BaseException:
            yield from self._on_stop_step(store, pending)
            raise
        yield from self._on_stop_step(store, pending)

    def _consume_loop_step(self, store: OffsetStore, pending: _Pending) -> Step[None]:
        now = time.monotonic()
        next_check = now + self.settings.management_interval
        next_delete = now + min(self.settings.delete_interval, self.time_window)
        next_lag = now
        while not self._stop.is_set():
            self._check_lease()
            chunk = yield Call(self._next, (pending.wait(time.monotonic()),))
            now = time.monotonic()
            for item in chunk:
                self.stats.read += 1
                yield from pending.take_step(item, now)
                yield from pending.flush_if_due_step(now)
                if self._stop.is_set():
                    return  # the rest of the chunk is read again from the offsets, as an inbox left unread
                self._check_lease()
            if not chunk:
                yield from pending.flush_if_due_step(now)
            if now >= next_check:
                next_check = now + self.settings.management_interval
                if (yield self._on(is_paused_step(self.projection.name))):
                    log.info("projection %s %s paused", self.projection.name, self.key)
                    return
            if now >= next_delete:
                next_delete = now + self.settings.delete_interval
                store.evict()
                yield self._on(self._housekeeping_step(store))
            if now >= next_lag:
                next_lag = now + self.settings.lag_interval
                yield from self._measure_lag_step(store)

    def _on_stop_step(self, store: OffsetStore, pending: _Pending) -> Step[None]:
        """What was handled is stored (a group not handled yet is read again); then, best effort, the markers
        move so the next run starts near the newest offset (it starts earlier, safely, without)."""
        yield from pending.on_stop_step()
        try:
            yield self._on(store.advance_markers_step())
        except (psycopg.Error, JournalError) as exc:
            log.info("projection %s %s: markers not advanced on stop: %r", self.projection.name, self.key, exc)

    def _pending_for(self, store: OffsetStore) -> _Pending:
        handler = self.projection.handler
        if isinstance(handler, Grouped):
            return _Groups(self, store, handler)
        if isinstance(handler, AtLeastOnce):
            return _Unsaved(self, store, handler)
        return _Each(self, store)

    def _measure_lag_step(self, store: OffsetStore) -> Step[None]:
        """Set the range's lag gauge as ``projection status`` measures it (:func:`~projections.management.slice_lag`
        over what this run committed and the markers), so both show the same number; a failed reading keeps the
        last one."""
        handled = {s: max((t for t in (store.latest.get(s), store.marked.get(s)) if t is not None), default=None)
                   for s in range(self.min_slice, self.max_slice + 1)}
        try:
            lags = yield Call(self.source.run, (lags_step([self.projection.entity_type], handled, self._lag_tracker),))
        except (psycopg.Error, JournalError) as exc:
            log.info("projection %s %s: lag not measured: %r", self.projection.name, self.key, exc)
            return
        self._metrics.lag.set(max(lags.values(), default=0.0))

    def _check_lease(self) -> None:
        if self.guard is not None and not self.guard.valid():
            raise LeaseLost(f"lease of {self.key} not renewed in time")

    def _housekeeping_step(self, store: OffsetStore) -> Step[None]:
        """Move the idle slices' markers, delete superseded offset rows."""
        yield from store.advance_markers_step(slack=self.lookback / 2)
        if store.rows_since_delete:
            yield from store.delete_old_step()

    # -- units of work -------------------------------------------------------------------------------

    def _admit_step(self, store: OffsetStore, env: EventEnvelope, pending: MutableMapping[str, Record]
                    ) -> Step[list[EventEnvelope]]:
        """Validate ``env``: nothing for a duplicate; for a rejected one, its missing predecessors first."""
        validation = yield from store.validate_step(env, pending)
        if validation.verdict is Verdict.DUPLICATE:
            self.stats.duplicates += 1
            return []
        out: list[EventEnvelope] = []
        if validation.verdict is Verdict.REJECTED:
            self.stats.rejected += 1
            log.info("projection %s: %r seq_nr %d rejected (processed up to %d): loading the missing events",
                     self.projection.name, env.persistence_id, env.seq_nr, validation.after)
            replay = self._replay.events_step(env.persistence_id, validation.after + 1, env.seq_nr - 1)
            out = (yield Call(self.source.run, (replay,))) if self.foreign else (yield from replay)
        out.append(env)
        for e in out:
            pending[e.persistence_id] = Record(e.slice, e.seq_nr, e.db_timestamp)
        return out

    def _admit_all_step(self, store: OffsetStore, envelopes: Sequence[EventEnvelope],
                        pending: MutableMapping[str, Record]) -> Step[list[EventEnvelope]]:
        todo: list[EventEnvelope] = []
        for env in envelopes:
            todo.extend((yield from self._admit_step(store, env, pending)))
        return todo

    def _attempt_step(self, store: OffsetStore, envelopes: Sequence[EventEnvelope], pending: dict[str, Record]
                      ) -> Step[list[EventEnvelope]]:
        """One attempt of a transactional unit on one connection: admit, then handle and commit."""
        todo = yield from self._admit_all_step(store, envelopes, pending)
        if todo:
            yield from self._commit_step(store, todo, pending, handle=True)
        return todo

    def _transact_step(self, store: OffsetStore, envelopes: Sequence[EventEnvelope]) -> Step[None]:
        """Exactly-once and grouped: handler and offsets in one transaction, with retries."""
        handler = self.projection.handler
        attempts = self.settings.attempts
        last: BaseException | None = None
        failed_on = envelopes[0]
        attempt = 0
        conflicts = 0
        while attempt < attempts:
            attempt += 1
            pending: dict[str, Record] = {}
            try:
                todo = yield self._on(self._attempt_step(store, envelopes, pending))
            except psycopg.errors.DeadlockDetected as exc:
                # Lease rows are locked in slice order, so this is rare; not the handler's fault.
                conflicts += 1
                if conflicts > DEADLOCK_RETRIES:
                    raise JournalError(f"projection {self.projection.name} {self.key}: deadlocked {conflicts} "
                                       f"times in a row committing {len(envelopes)} envelope(s); the range "
                                       "restarts") from exc
                yield Call(self._pause, (DEADLOCK_BACKOFF.delay(conflicts),))
                attempt -= 1
                continue
            except _HandlerError as exc:
                last, failed_on = exc.__cause__, exc.envelope
                log.warning("projection %s: handler failed on %r seq_nr %d (%d envelope(s), attempt %d/%d): %r",
                            self.projection.name, failed_on.persistence_id, failed_on.seq_nr, len(envelopes),
                            attempt, attempts, last)
                if attempt < attempts:
                    yield Call(self._pause, (self.settings.backoff_for(attempt),))
                continue
            if todo:
                store.commit(pending)
                self._handled(todo)
            return
        assert last is not None
        if isinstance(handler, Grouped) and len(envelopes) > 1:
            # Find the envelope at fault: one at a time, each with its own attempts, then fail or skip it.
            log.warning("projection %s: group of %d failed %d times; handling it one envelope at a time",
                        self.projection.name, len(envelopes), attempts)
            for env in envelopes:
                yield from self._transact_step(store, [env])
            return
        if self.settings.on_failure in ("stop", "fail"):
            raise (yield from self._failed_step(failed_on, attempts, last))
        dead_letter = self.settings.on_failure == "dead-letter"
        pending = {}
        todo, dead = yield self._on(self._give_up_step(store, envelopes, pending, dead_letter))
        store.commit(pending)
        if dead_letter:
            failed = {(env.persistence_id, env.seq_nr) for env, _ in dead}
            self._handled([e for e in todo if (e.persistence_id, e.seq_nr) not in failed])
            for env, error in dead:
                self._log_dead_letter(env, error)
        else:
            self._log_skipped(todo, last)

    def _give_up_step(self, store: OffsetStore, envelopes: Sequence[EventEnvelope], pending: dict[str, Record],
                      dead_letter: bool) -> Step[tuple[list[EventEnvelope], list[tuple[EventEnvelope, BaseException]]]]:
        """After the last attempt: skip (offsets only) or dead-letter (each envelope once more, the failing
        ones stored as dead letters), in one transaction."""
        todo = yield from self._admit_all_step(store, envelopes, pending)
        dead = yield from self._commit_step(store, todo, pending, handle=dead_letter, dead_letter=dead_letter)
        return todo, dead

    def _commit_step(self, store: OffsetStore, todo: list[EventEnvelope], pending: dict[str, Record], *,
                     handle: bool, dead_letter: bool = False) -> Step[list[tuple[EventEnvelope, BaseException]]]:
        """Handle ``todo`` (unless not ``handle``) and store its offsets in one transaction. ``dead_letter``:
        each envelope in its own savepoint; one that fails is stored as a dead letter instead (returned)."""
        dead: list[tuple[EventEnvelope, BaseException]] = []
        yield Statement("BEGIN")
        try:
            if self.guard is not None:
                yield from self.guard.fence_step(sorted({e.slice for e in todo}), self.epochs)
            if handle and dead_letter:
                for env in todo:
                    yield Statement(f"SAVEPOINT {DEAD_LETTER_SAVEPOINT}")
                    try:
                        yield from self._handle_step([env])
                    except _HandlerError as failure:
                        exc = failure.__cause__ if isinstance(failure.__cause__, Exception) else failure
                        yield Statement(f"ROLLBACK TO SAVEPOINT {DEAD_LETTER_SAVEPOINT}")
                        yield statement(dead_letter_statement(self.journal, self.projection.name, self.key, env, exc))
                        dead.append((env, exc))
                    else:
                        yield Statement(f"RELEASE SAVEPOINT {DEAD_LETTER_SAVEPOINT}")
            elif handle:
                yield from self._handle_step(todo)
            try:
                yield from store.save_step(pending, fenced=True)
            except psycopg.errors.UniqueViolation:
                raise LeaseLost(f"an offset row of {self.key} exists already: another worker processed the same "
                                "event") from None
        except GeneratorExit:
            raise  # the connection goes back inside the transaction: the pool rolls it back
        except BaseException:
            with contextlib.suppress(psycopg.Error):  # a lost connection: the original error tells more
                yield Statement("ROLLBACK")
            raise
        yield Statement("COMMIT")
        return dead

    def _handle_step(self, envelopes: list[EventEnvelope]) -> Step[None]:
        """The handler on the unit's connection, inside its transaction, without pgjournal's statement limits
        (the handler's statements are the user's); a failure is a :class:`_HandlerError` naming the envelope."""
        handler = self.projection.handler
        current = envelopes[0]
        lifted = yield Call(_without_limit, connection=True)
        if lifted:
            yield Statement("SET LOCAL statement_timeout = 0")
        try:
            if isinstance(handler, ExactlyOnce):
                for current in envelopes:
                    yield Call(handler.handle, (decoded(self.source, current),), connection=True)
            else:
                assert isinstance(handler, Grouped)
                yield Call(handler.handle, ([decoded(self.source, e) for e in envelopes],), connection=True)
        except Exception as exc:
            yield Call(_with_limit, (lifted,), connection=True)
            raise _HandlerError(current) from exc
        yield Call(_with_limit, (lifted,), connection=True)

    def _at_least_once_step(self, store: OffsetStore, env: EventEnvelope, unsaved: dict[str, Record]) -> Step[int]:
        handler = self.projection.handler
        assert isinstance(handler, AtLeastOnce)
        scratch: dict[str, Record] = {}
        todo = yield self._on(self._admit_step(store, env, collections.ChainMap(scratch, unsaved)))
        for e in todo:
            for attempt in range(1, self.settings.attempts + 1):
                if self.guard is not None and not self.guard.valid():
                    raise LeaseLost(f"lease of {self.key} not renewed in time")
                try:
                    yield Call(handler.handle, (decoded(self.source, e),))
                    self._handled([e])
                    break
                except Exception as exc:
                    log.warning("projection %s: handler failed on %r seq_nr %d (attempt %d/%d): %r",
                                self.projection.name, e.persistence_id, e.seq_nr, attempt,
                                self.settings.attempts, exc)
                    if attempt == self.settings.attempts:
                        if self.settings.on_failure in ("stop", "fail"):
                            raise (yield from self._failed_step(e, attempt, exc)) from exc
                        if self.settings.on_failure == "dead-letter":
                            yield self._on(_one(dead_letter_statement(self.journal, self.projection.name, self.key,
                                                                      e, exc)))
                            self._log_dead_letter(e, exc)
                        else:
                            self._log_skipped([e], exc)
                    else:
                        yield Call(self._pause, (self.settings.backoff_for(attempt),))
            unsaved[e.persistence_id] = Record(e.slice, e.seq_nr, e.db_timestamp)
        return len(todo)

    def _save_step(self, store: OffsetStore, unsaved: dict[str, Record]) -> Step[None]:
        yield self._on(store.save_step(unsaved, fenced=False))
        store.commit(unsaved)
        unsaved.clear()

    # -- outcomes ------------------------------------------------------------------------------------

    def _handled(self, envelopes: Sequence[EventEnvelope]) -> None:
        """Count envelopes whose handling committed (the lag is measured apart: :meth:`_measure_lag_step`)."""
        if not envelopes:
            return
        self.stats.handled += len(envelopes)
        self._metrics.envelopes.inc(len(envelopes))

    def _log_dead_letter(self, env: EventEnvelope, exc: BaseException) -> None:
        self._metrics.errors.inc()
        self.stats.dead_lettered += 1
        log.error("projection %s: %r seq_nr %d stored as a dead letter after %d attempt(s): %r",
                  self.projection.name, env.persistence_id, env.seq_nr, self.settings.attempts, exc)

    def _failed_step(self, env: EventEnvelope, attempts: int, cause: BaseException) -> Step[ProjectionFailed]:
        ser_id: int | None = None
        manifest: str | None = None
        try:
            ser_id, manifest = yield Call(self.source.run, (serializer_of_step(self.source, env),))
        except (psycopg.Error, JournalError) as exc:
            log.warning("projection %s: serializer of %r seq_nr %d not read: %r", self.projection.name,
                        env.persistence_id, env.seq_nr, exc)
        return ProjectionFailed(self.projection.name, env, attempts, cause, ser_id=ser_id, manifest=manifest)

    def _log_skipped(self, envelopes: Sequence[EventEnvelope], cause: BaseException | None) -> None:
        for e in envelopes:
            self._metrics.errors.inc()
            self.stats.skipped += 1
            log.error("projection %s SKIPPED %r seq_nr %d after %d attempt(s): %r", self.projection.name,
                      e.persistence_id, e.seq_nr, self.settings.attempts, cause)


def _one(query: tuple[str, Any]) -> Step[Any]:
    return (yield statement(query))


def _without_limit(conn: Any) -> bool:
    """Lift the connection's client-side round-trip limit (:func:`pgjournal.server.connections.user_statements`, for
    steps); whether there was one."""
    if getattr(conn, "limit", None) is None:
        return False
    conn.limit = None
    return True


def _with_limit(conn: Any, lifted: bool) -> None:
    if lifted:
        del conn.limit  # back to the class's limit


class _Pending:
    """Envelopes taken but not yet stored, in the way one handler mode stores them."""

    def __init__(self, runner: RangeLogic, store: OffsetStore) -> None:
        self.runner, self.store = runner, store

    def wait(self, now: float) -> float:
        """How long the next read may wait for an envelope: until what is pending is due, at most 0.2 s (the
        loop's housekeeping and stop checks)."""
        due = self.due_at()
        return 0.2 if due is None else min(0.2, max(0.001, due - now))

    def due_at(self) -> float | None:
        """When what is pending must be handled (``None``: nothing is pending)."""
        return None

    def take_step(self, env: EventEnvelope, now: float) -> Step[None]:
        raise NotImplementedError

    def flush_if_due_step(self, now: float) -> Step[None]:
        return
        yield

    def on_stop_step(self) -> Step[None]:
        return
        yield


class _Each(_Pending):
    """Exactly-once: every envelope handled and stored in its own transaction."""

    def take_step(self, env: EventEnvelope, now: float) -> Step[None]:
        yield from self.runner._transact_step(self.store, [env])


class _Groups(_Pending):
    """Grouped: up to ``max_count`` envelopes gathered for at most ``max_wait`` (or until none came for
    ``idle_wait``), one transaction each group."""

    def __init__(self, runner: RangeLogic, store: OffsetStore, handler: Grouped) -> None:
        super().__init__(runner, store)
        self.handler = handler
        self.group: list[EventEnvelope] = []
        #: When the group goes: ``max_wait`` after its first envelope (``deadline``), or ``idle_wait`` after its last.
        self.due = self.deadline = 0.0

    def due_at(self) -> float | None:
        return self.due if self.group else None

    def take_step(self, env: EventEnvelope, now: float) -> Step[None]:
        if not self.group:
            self.deadline = now + self.handler.max_wait
        self.group.append(env)
        idle = self.handler.idle_wait
        self.due = self.deadline if idle is None else min(self.deadline, now + idle)
        return
        yield

    def flush_if_due_step(self, now: float) -> Step[None]:
        if self.group and (len(self.group) >= self.handler.max_count or now >= self.due):
            group, self.group = self.group, []
            yield from self.runner._transact_step(self.store, group)


class _Unsaved(_Pending):
    """At-least-once: handled at once, offsets stored every ``save_every`` envelopes or ``save_interval``."""

    def __init__(self, runner: RangeLogic, store: OffsetStore, handler: AtLeastOnce) -> None:
        super().__init__(runner, store)
        self.handler = handler
        self.unsaved: dict[str, Record] = {}
        self.count = 0
        self.due = 0.0

    def due_at(self) -> float | None:
        return self.due if self.unsaved else None

    def take_step(self, env: EventEnvelope, now: float) -> Step[None]:
        if not self.unsaved:
            self.due = now + self.handler.save_interval
        self.count += yield from self.runner._at_least_once_step(self.store, env, self.unsaved)

    def flush_if_due_step(self, now: float) -> Step[None]:
        if self.unsaved and (self.count >= self.handler.save_every or now >= self.due):
            yield from self.runner._save_step(self.store, self.unsaved)
            self.count = 0

    def on_stop_step(self) -> Step[None]:
        if self.unsaved:
            yield from self.runner._save_step(self.store, self.unsaved)
