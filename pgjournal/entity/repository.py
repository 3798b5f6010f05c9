"""``EntityRepository(journal, Cart).handle("cart-1", AddItem(...))``: recover, decide, persist, answer.

Consistency: within a process, commands to one entity run one at a time, in arrival order (a per-entity
mailbox shared by every repository on the same Journal); commands that queue up while an append is in
flight are decided one after the other on the evolving state and written together in one append (group
commit: a hot entity is not limited to one round trip per command). Across processes, optimistic
concurrency decides: each append states the sequence number the decisions were based on, and a
:class:`~pgjournal.ConcurrencyConflict` drops the cached state, recovers and runs the command handlers
again (bounded, with jittered backoff).

Write failures are honest: an exception from :meth:`EntityRepository.handle` means nothing of the command
was written, except :class:`~pgjournal.WriteOutcomeUnknown`, raised only when the repository could not find
out within ``unknown_outcome_timeout`` seconds. When an append loses its connection mid-commit, the
repository appends the same events with the same expected sequence number again: that either writes them
(the first attempt did not commit) or conflicts, and then the writer of the next sequence number tells
whose events are there. The retried append also waits for a first attempt still in flight (the primary key
is locked), so a late commit cannot slip past the check.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from pgjournal.entity.breaker import CircuitBreaker, is_unavailability
from pgjournal.entity.cache import LruCache
from pgjournal.entity.errors import ConflictRetriesExhausted
from pgjournal.entity.mailbox import Mailboxes, Pending
from pgjournal.entity.model import CommandResult, Entity, Recovered, check_entity_name, effect_of
from pgjournal.entity.recovery import recover_step, snapshot_metadata
from pgjournal.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    WriteOutcomeUnknown,
)
from pgjournal.model.printable import printable_logger
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Call, Sleep, Step, first_of
from pgjournal.validation import check_persistence_id, check_tags

if TYPE_CHECKING:
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal

S = TypeVar("S")
_log = printable_logger("pgjournal.entity")

DEFAULT_SNAPSHOT_EVERY = 100
#: Before recovering again after a conflict: anything up to 2 ms, doubling to 50 ms.
CONFLICT_BACKOFF = Backoff(0.002, 2.0, 0.05, jitter=1.0)
#: Between the tries that find out whether an append with a lost connection was written.
SETTLE_BACKOFF = Backoff(0.05, 2.0, 1.0)


def _run_batch(pid: str, batch: list[Pending]) -> None:
    batch[0].owner._batch(pid, batch)


@dataclass
class _Shared:
    """Per-Journal state every repository on it shares: entity mailboxes and the default breaker."""

    mailboxes: Mailboxes = field(default_factory=Mailboxes)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)


_shared: weakref.WeakKeyDictionary[JournalCore, _Shared] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def _shared_for(journal: JournalCore) -> _Shared:
    with _shared_lock:
        found = _shared.get(journal)
        if found is None:
            found = _shared[journal] = _Shared()
        return found


def _check_count(value: Any, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


class RepositoryRules(Generic[S]):
    r"""What the blocking :class:`EntityRepository` and the asyncio
    :class:`~pgjournal.entity.aio.AsyncEntityRepository` share: settings, cache, counters, breaker, and the
    command loop as a step (:mod:`pgjournal.runtime.steps`) whose journal operations are ``Call``\ s of the face's
    journal (``append``, ``highest_seq_nr``, ``save_snapshot``, ``run``), blocking or awaited.

    ``snapshot_every``: save a snapshot after an append that crosses a multiple of it (0: never; default:
    100).
    ``cache_size``: recent entities kept in memory (LRU). ``max_conflict_retries``: how often a command is
    re-run after losing a race before :class:`ConflictRetriesExhausted`. ``max_batch``: at most this many
    queued commands to one entity are decided together and written in one append. ``breaker``: the circuit
    breaker (default: one shared by all repositories on ``journal``).
    """

    def __init__(
        self,
        journal: JournalCore,
        entity: Entity[S] | type[Entity[S]],
        *,
        snapshot_every: int | None = None,
        cache_size: int = 1000,
        max_conflict_retries: int = 20,
        max_batch: int = 64,
        unknown_outcome_timeout: float = 30.0,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.journal: Any = journal
        self.entity: Entity[S] = entity() if isinstance(entity, type) else entity
        self.name = check_entity_name(self.entity)
        if snapshot_every is None:
            snapshot_every = DEFAULT_SNAPSHOT_EVERY
        self.snapshot_every = _check_count(snapshot_every, "snapshot_every", minimum=0)
        self.max_conflict_retries = _check_count(max_conflict_retries, "max_conflict_retries", minimum=0)
        self.max_batch = _check_count(max_batch, "max_batch", minimum=1)
        if isinstance(unknown_outcome_timeout, bool) or not isinstance(unknown_outcome_timeout, int | float) or (
                unknown_outcome_timeout < 0):
            raise ConfigurationError(f"unknown_outcome_timeout must be a number of seconds >= 0, got "
                                     f"{unknown_outcome_timeout!r}")
        self.unknown_outcome_timeout = float(unknown_outcome_timeout)
        self._tags = check_tags(self.entity.tags)
        self._cache: LruCache[Recovered[S]] = LruCache(_check_count(cache_size, "cache_size", minimum=0))
        shared = _shared_for(journal)
        self._mailboxes = shared.mailboxes
        self.breaker = breaker if breaker is not None else shared.breaker
        self._counts = {"conflicts": 0, "stale_cache": 0, "unknown_outcomes": 0, "snapshots": 0, "batched": 0}
        self._counts_lock = threading.Lock()
        for cls in self.entity.types:
            journal.serializers.register(cls, f"{self.name}.{cls.__name__}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, breaker={self.breaker.state})"

    # -- public API ----------------------------------------------------------------------------------

    def persistence_id(self, entity_id: str) -> str:
        if not isinstance(entity_id, str) or not entity_id:
            raise InvalidArgument(f"entity id of {self.name!r} must be a non-empty string, got {entity_id!r}")
        return check_persistence_id(f"{self.name}|{entity_id}")

    def evict(self, entity_id: str | None = None) -> None:
        """Forget the cached state of ``entity_id`` (of every entity when ``None``)."""
        if entity_id is None:
            self._cache.clear()
        else:
            self._cache.drop(self.persistence_id(entity_id))

    def status(self) -> dict[str, object]:
        """Cache fill, counters and breaker state, for logs and health checks."""
        with self._counts_lock:
            counts = dict(self._counts)
        return {"entity": self.name, "cached": len(self._cache), **counts, "breaker": self.breaker.status()}

    def _count(self, what: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[what] += n

    def _recovered(self, pid: str, recovered: Recovered[S]) -> Recovered[S]:
        self._cache.put_if_newer(pid, recovered, lambda old, new: new.seq_nr > old.seq_nr)
        return recovered

    # -- the command loop (runs in the leader of the entity's mailbox) -----------------------------------

    def _batch_failed(self, pid: str, batch: list[Pending], exc: BaseException) -> None:
        """The unit of work of ``batch`` raised ``exc``: every caller gets it (a lost database as
        :class:`DatabaseUnavailable`); what is not an ``Exception`` is raised again."""
        self._cache.drop(pid)
        if isinstance(exc, psycopg.OperationalError) and is_unavailability(exc):
            commands = ", ".join(sorted({type(item.command).__name__ for item in batch}))
            converted = DatabaseUnavailable(
                f"command(s) {commands} for {pid!r} were not applied and nothing was written: "
                f"{' '.join(str(exc).split()) or exc.__class__.__name__}")
            converted.__cause__ = exc
            exc = converted
        for item in batch:
            item.fail(exc)
        if not isinstance(exc, Exception):
            raise exc

    def _batch_done(self, batch: list[Pending]) -> None:
        if len(batch) > 1:
            self._count("batched", len(batch))

    def _batch_step(self, pid: str, batch: list[Pending]) -> Step[None]:
        """Decide every command of ``batch`` in order against the current state, append all their events
        in one call, then complete each caller with its own reply, state and sequence number."""
        attempt = 0
        while True:
            current = self._cache.get(pid)
            cached = current is not None
            if current is None:
                current = yield from self._recover_step(pid)
            state = current.state
            events: list[Any] = []
            outcomes: list[CommandResult[S] | Exception] = []
            for item in batch:
                try:
                    effect = effect_of(self.entity, item.command, self.entity.handle(state, item.command))
                    after = state
                    for event in effect.events:
                        after = self.entity.apply(after, event)
                except Exception as exc:  # refused (or a bug): this command writes nothing, the others go on
                    outcomes.append(exc)
                    continue
                state = after
                events.extend(effect.events)
                outcomes.append(CommandResult(item.entity_id, effect.reply, state, current.seq_nr + len(events),
                                              effect.events))
            if not events:
                # A refusal or a read is only as good as the state it was decided on: a cached state may be
                # stale when other processes write, and no append would tell. Decide again on stored state.
                if cached and (yield from self._moved_on_step(pid, current.seq_nr)):
                    continue
            else:
                try:
                    yield from self._append_step(pid, events, current.seq_nr, current.state)
                except ConcurrencyConflict as conflict:
                    self._cache.drop(pid)
                    self._count("conflicts")
                    attempt += 1
                    if attempt > self.max_conflict_retries:
                        raise ConflictRetriesExhausted(pid, current.seq_nr + 1, attempt,
                                                       conflict.actual_seq_nr) from None
                    _log.debug("conflict on %r at seq_nr %d (attempt %d): recovering", pid, current.seq_nr + 1,
                               attempt)
                    yield Sleep(CONFLICT_BACKOFF.delay(attempt))
                    continue
            self._cache.put(pid, Recovered(state, current.seq_nr + len(events)))
            if events:
                yield from self._maybe_snapshot_step(pid, current.seq_nr, current.seq_nr + len(events), state)
            for item, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, CommandResult):
                    item.succeed(outcome)
                else:
                    item.fail(outcome)
            return

    def _moved_on_step(self, pid: str, seq_nr: int) -> Step[bool]:
        """Did another writer append to ``pid`` after ``seq_nr``? If so, forget the cached state."""
        if (yield Call(self.journal.highest_seq_nr, (pid,))) == seq_nr:
            return False
        self._cache.drop(pid)
        self._count("stale_cache")
        return True

    def _recover_step(self, pid: str) -> Step[Recovered[S]]:
        """The stored state of ``pid`` (a replicated repository's recovery reads the events' metadata too)."""
        return recover_step(self.journal, self.entity, pid)

    def _append_step(self, pid: str, events: Iterable[Any], expected: int, before: Any = None) -> Step[None]:
        """Append, or raise: ConcurrencyConflict (someone else's events are there: nothing of ours written),
        another error (nothing written) or WriteOutcomeUnknown (could not find out in time). ``before``: the
        state the events were decided on."""
        events = tuple(events)
        try:
            yield self._append_call(pid, events, expected, before)
        except WriteOutcomeUnknown as unknown:
            self._count("unknown_outcomes")
            _log.warning("append to %r after seq_nr %d lost its connection: finding out whether it was written",
                         pid, expected)
            yield from self._settle_unknown_step(pid, events, expected, unknown, before)

    def _append_call(self, pid: str, events: tuple[Any, ...], expected: int, before: Any = None) -> Call:
        return Call(self.journal.append, (pid, events), {"expected_seq_nr": expected, "tags": self._tags})

    def _settle_unknown_step(self, pid: str, events: tuple[Any, ...], expected: int, unknown: WriteOutcomeUnknown,
                             before: Any = None) -> Step[None]:
        deadline = time.monotonic() + self.unknown_outcome_timeout
        tries = 0
        last: BaseException = unknown
        while True:
            tries += 1
            pause = SETTLE_BACKOFF.delay(tries)
            try:
                try:
                    yield self._append_call(pid, events, expected, before)
                    _log.info("append to %r after seq_nr %d: the first attempt had not been written; now it is",
                              pid, expected)
                    return
                except ConcurrencyConflict:
                    if (yield from self._written_by_us_step(pid, expected + 1)):
                        _log.info("append to %r after seq_nr %d: the first attempt had been written", pid, expected)
                        return
                    raise
            except (WriteOutcomeUnknown, DatabaseUnavailable, psycopg.OperationalError) as exc:
                last = exc
            if time.monotonic() + pause > deadline:
                raise WriteOutcomeUnknown(
                    f"the connection was lost while appending {len(events)} event(s) to {pid!r} after sequence "
                    f"number {expected}, and the database did not answer within {self.unknown_outcome_timeout}s "
                    f"to tell whether they were written ({last.__class__.__name__}). Check with "
                    f"load({pid.partition('|')[2]!r}) before sending the command again"
                ) from last
            yield Sleep(pause)

    def _written_by_us_step(self, pid: str, seq_nr: int) -> Step[bool]:
        """Was ``seq_nr`` of ``pid`` written by this journal? While we lead the entity's mailbox, no other
        caller of this process appends to it, and writer ids are unique per journal."""
        row = yield Call(self.journal.run, (first_of(self.journal.events.writer_of(pid, seq_nr)),))
        return row is not None and row[0] == self.journal.writer_id

    def _snapshot_metadata(self, pid: str, state: S) -> Any:
        """What a snapshot of ``state`` stores as its metadata (what recovery checks before it uses one)."""
        return snapshot_metadata(self.entity)

    def _maybe_snapshot_step(self, pid: str, before: int, after: int, state: S) -> Step[None]:
        every = self.snapshot_every
        if every == 0 or after // every == before // every:
            return
        try:
            yield Call(self.journal.save_snapshot, (pid, after, self.entity.to_snapshot(state)),
                       {"metadata": self._snapshot_metadata(pid, state)})
            self._count("snapshots")
        except Exception as exc:  # the events are written: a missing snapshot only makes recovery longer
            _log.warning("could not save the snapshot of %r at seq_nr %d: %s: %s", pid, after,
                         exc.__class__.__name__, exc)


class EntityRepository(RepositoryRules[S]):
    """Commands in, events persisted, replies out, for one entity type. Thread-safe; share one per process.
    Settings: see :class:`RepositoryRules`."""

    journal: Journal

    def handle(self, entity_id: str, command: Any) -> CommandResult[S]:
        """Run ``command`` against the current state of ``entity_id`` and persist its events.

        Returns once the events are written. Raises what the command handler raised (a
        :class:`DomainError`: nothing written), :class:`ConflictRetriesExhausted`, :class:`CircuitOpen` or
        :class:`~pgjournal.DatabaseUnavailable` (nothing written), or :class:`~pgjournal.WriteOutcomeUnknown`.
        """
        item = Pending(self, entity_id, command)
        self._mailboxes.submit(self.persistence_id(entity_id), item, _run_batch, self.max_batch)
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[no-any-return]

    def load(self, entity_id: str) -> Recovered[S]:
        """The entity's state as stored now (snapshot + replay, bypassing the cache)."""
        pid = self.persistence_id(entity_id)
        with self.breaker.guard():
            return self._recovered(pid, self.journal.run(self._recover_step(pid)))

    def _batch(self, pid: str, batch: list[Pending]) -> None:
        try:
            with self.breaker.guard():
                self.journal.run(self._batch_step(pid, batch))
        except BaseException as exc:
            self._batch_failed(pid, batch, exc)
        self._batch_done(batch)
