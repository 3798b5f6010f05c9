"""The firehose: consumers of the same entity type and slice range in one process share one live query.

Akka R2DBC's ``EventsBySliceFirehose`` idea, on pgjournal's public query API. ``Firehose(journal)`` keeps, per
(entity type, slice range), one live ``events_by_slices`` query (the *hose*) running in a thread. Its envelopes
go into a ring of ``buffer_size`` entries that every attached consumer reads with a cursor of its own, so N
consumers cost the database one polling query instead of N.

A consumer (``firehose.events_by_slices(...)``, an iterator like a live query) starts *behind* the hose: it
reads ``current_events_by_slices`` from its own offset, then joins at the newest ring entry whose predecessors
it has all had, that is, where the hose's offset before that entry is one the consumer's own offset reaches
(offsets are positions in ``(db_timestamp, seq_nr)`` order, so the hose from there delivers everything after
it). When no retained entry qualifies (the hose moved on by more than a buffer meanwhile, or the visibility
horizon of the catch-up read stopped short of the hose), it runs another, shorter catch-up from where it is;
when such a run finds nothing (a consumer whose offset is older than where the hose started, in a range with
no new event), it waits for the hose up to ``refresh_interval`` before the next one. Events both sources
deliver (the overlap, and late commits the hose's backtracking finds) are dropped by sequence number per
persistence id, and anything the consumer's start offset covers is dropped too; a gap (never expected) is
filled by persistence id. So each consumer receives
every event after its offset exactly once, in sequence order per persistence id, as its own query would.

The offsets consumers receive never go backwards: an envelope from the hose whose offset is behind what the
consumer's catch-up already reached carries the later of the two. Resuming from the last offset received (on
the firehose or on a query of one's own) misses nothing.

Slow consumers: when the ring is full and a consumer still holds its oldest entry, the hose waits (everyone
slows down). After ``slow_consumer_timeout`` seconds of that, every consumer at least half a buffer behind the
fastest one is detached (as Akka's firehose does; consumers all trailing the hose together are not slow, they
just read slower than the hose could), and its next read raises :class:`~pgjournal.errors.SlowConsumer` with the
offset to resume from.

A hose starts when its first consumer has caught up, right after that consumer's offset (in portable mode a
backtracking window before it), so that consumer joins at once and so do later ones whose offset reaches it;
it stops ``linger`` seconds after its last consumer closed (a restarting consumer finds it still running). A
hose whose query fails (the database gone for ``live_query_retries`` polls, an event that cannot be decoded)
passes the error to its attached consumers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from pgjournal.errors import ConfigurationError, InvalidArgument, SlowConsumer
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import NoOffset, Offset, TimestampOffset
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import check_slice_range
from pgjournal.model.timeuuid import EPOCH
from pgjournal.query.gate import DUPLICATE, GAP, Gate
from pgjournal.validation import check_name

if TYPE_CHECKING:
    from pgjournal.core.capabilities import Capabilities
    from pgjournal.query import Query
    from pgjournal.runtime.live import LiveQuery
    from pgjournal.settings import Settings

_log = printable_logger(__name__)
Key = tuple[str, int, int]


def later(a: TimestampOffset, b: TimestampOffset) -> TimestampOffset:
    """The offset that covers everything ``a`` and ``b`` cover."""
    if a.timestamp != b.timestamp:
        return a if a.timestamp > b.timestamp else b
    # An offset's position (what was consumed at one timestamp), not the gate's rule (each pid once, in order).
    seen = dict(a.seen)
    for pid, seq_nr in b.seen.items():
        seen[pid] = max(seq_nr, seen.get(pid, 0))
    read = max((t for t in (a.read_timestamp, b.read_timestamp) if t is not None), default=None)
    settled = max(a.floor, b.floor)
    return TimestampOffset.trusted(a.timestamp, read, seen, None if settled == a.timestamp else settled)


def _reaches(a: TimestampOffset, b: TimestampOffset) -> bool:
    """Whether ``a`` covers everything ``b`` covers."""
    if a.timestamp != b.timestamp:
        return a.timestamp > b.timestamp
    return all(a.seen.get(pid, 0) >= seq_nr for pid, seq_nr in b.seen.items())


class Queried(Protocol):
    """What a firehose uses of a blocking journal (:class:`~pgjournal.Journal` meets it): its public queries, its
    settings and what its server allows."""

    @property
    def settings(self) -> Settings: ...
    @property
    def capabilities(self) -> Capabilities: ...
    @property
    def query(self) -> Query: ...


class Firehose:
    """Shared live queries for the consumers of one :class:`~pgjournal.Journal` (make one per journal).

    ``buffer_size``: envelopes kept between the slowest and the fastest attached consumer; ``slow_consumer_timeout``:
    seconds the hose waits for a consumer holding a full buffer before detaching it; ``linger``: seconds a hose
    keeps running after its last consumer closed.
    """

    def __init__(self, journal: Queried, *, buffer_size: int = 1000, slow_consumer_timeout: float = 2.0,
                 linger: float = 20.0) -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 2:
            raise ConfigurationError(f"firehose buffer_size must be an integer >= 2, got {buffer_size!r}")
        for name, value in (("slow_consumer_timeout", slow_consumer_timeout), ("linger", linger)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 86_400:
                raise ConfigurationError(f"firehose {name} must be a number of seconds from 0 to 86,400, got "
                                         f"{value!r}")
        self.journal = journal
        self.buffer_size = buffer_size
        self.slow_consumer_timeout = float(slow_consumer_timeout)
        self.linger = float(linger)
        self._hoses: dict[Key, _Hose] = {}
        self._lock = threading.Lock()
        self._closed = False

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                         ) -> FirehoseConsumer:
        """Events of ``entity_type`` in ``min_slice..max_slice`` after ``offset``, live, through the shared query:
        what ``journal.query.events_by_slices`` delivers, each once and in order per persistence id.
        ``close()`` (or ``with``) stops it."""
        entity_type = check_name(entity_type, "entity type") if entity_type != "" else ""
        check_slice_range(min_slice, max_slice)
        if offset is not NoOffset and not isinstance(offset, TimestampOffset):
            raise InvalidArgument(f"the firehose takes NoOffset or a TimestampOffset, got {offset!r}")
        if self._closed:
            raise InvalidArgument("this firehose is closed")
        return FirehoseConsumer(self, (entity_type, min_slice, max_slice), offset)

    def hose(self, key: Key) -> _Hose:
        """The running hose of ``key`` (started when there is none), with one more consumer counted on it."""
        with self._lock:
            hose = self._hoses.get(key)
            if hose is None or hose.stopped:
                hose = self._hoses[key] = _Hose(self, key)
            hose.acquire()
            return hose

    def forget(self, hose: _Hose) -> None:
        with self._lock:
            if self._hoses.get(hose.key) is hose:
                del self._hoses[hose.key]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def hoses(self) -> int:
        """Shared queries running now."""
        with self._lock:
            return sum(1 for h in self._hoses.values() if not h.stopped)

    def close(self) -> None:
        """Stop every hose; their consumers end."""
        self._closed = True
        with self._lock:
            hoses = list(self._hoses.values())
            self._hoses.clear()
        for hose in hoses:
            hose.stop()

    def __enter__(self) -> Firehose:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclasses.dataclass(slots=True)
class _Entry:
    envelope: EventEnvelope
    #: The hose's offset before this envelope: everything it delivered before it lies at or before this.
    before: TimestampOffset


class _Hose:
    """One shared live query and its ring of envelopes."""

    def __init__(self, owner: Firehose, key: Key) -> None:
        self.owner = owner
        self.key = key
        self.capacity = owner.buffer_size
        self.cond = threading.Condition()
        self.ring: deque[_Entry] = deque()
        #: Absolute index of ``ring[0]``; ``base + len(ring)`` is the index the next envelope gets.
        self.base = 0
        #: Attached consumers' cursors (absolute index of the next entry each reads).
        self.cursors: dict[str, int] = {}
        self.detached: set[str] = set()
        self.failure: BaseException | None = None
        self.stopped = False
        self.users = 0
        #: Since when (monotonic) appends have waited for a consumer holding a full ring.
        self.full_since: float | None = None
        self._live: LiveQuery[EventEnvelope] | None = None
        self._linger: threading.Timer | None = None
        settings = owner.journal.settings
        #: Portable mode (no visibility horizon): the hose starts a backtracking window before the offset it
        #: is started at, so late commits stamped before it are still found by its backtracking.
        self.early = timedelta(0) if owner.journal.capabilities.writer_horizon else timedelta(
            seconds=settings.backtracking_window + settings.backtracking_behind_current_time)
        #: Where the hose started (its offset before its first envelope) and its offset after its latest
        #: envelope; ``None`` until the first consumer has caught up and started it (:meth:`start`).
        self.start_offset: TimestampOffset | None = None
        self.last: TimestampOffset | None = None
        #: How far behind its main cursor the hose may still deliver an event (its backtracking).
        self.margin = timedelta(seconds=settings.backtracking_window + settings.backtracking_behind_current_time)
        self._thread = threading.Thread(target=self._run, name=f"pgjournal-firehose-{key[0]}-{key[1]}-{key[2]}",
                                        daemon=True)

    @property
    def head(self) -> int:
        return self.base + len(self.ring)

    def start(self, offset: TimestampOffset) -> None:
        """Start the shared query after ``offset``: the position of the first consumer that caught up (it has
        had everything before; so have later consumers once their own offset reaches it). Under ``cond``."""
        self.start_offset = self.last = TimestampOffset(offset.timestamp - self.early) if self.early else offset
        entity_type, lo, hi = self.key
        self._live = self.owner.journal.query.events_by_slices(entity_type, lo, hi, self.start_offset)
        self._thread.start()

    def acquire(self) -> None:
        with self.cond:
            self.users += 1
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None

    def release(self, consumer_id: str) -> None:
        with self.cond:
            self.cursors.pop(consumer_id, None)
            self.detached.discard(consumer_id)
            self.users -= 1
            self.cond.notify_all()
            if self.users > 0 or self.stopped:
                return
            if self.owner.linger > 0:
                self._linger = threading.Timer(self.owner.linger, self._stop_if_unused)
                self._linger.daemon = True
                self._linger.start()
                return
        self._stop_if_unused()

    def _stop_if_unused(self) -> None:
        with self.cond:
            if self.users > 0:
                return
        self.stop()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.owner.forget(self)
        if self._live is not None:
            self._live.close()

    # -- the hose's thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._live is not None
        try:
            for envelope in self._live:
                if not self._append(envelope):
                    break
        except BaseException as exc:  # passed to the consumers, which raise it
            _log.warning("firehose %s slices %d-%d failed: %s: %s", *self.key, type(exc).__name__, exc)
            with self.cond:
                self.failure = exc
                self.cond.notify_all()
        finally:
            self.stop()

    def _append(self, envelope: EventEnvelope) -> bool:
        with self.cond:
            if len(self.ring) < self.capacity:
                self.full_since = None  # nobody held the hose back
            while len(self.ring) >= self.capacity:
                if self.stopped:
                    return False
                needed = min(self.cursors.values(), default=self.head)
                while self.ring and self.base < needed and len(self.ring) >= self.capacity:
                    self.ring.popleft()
                    self.base += 1
                if len(self.ring) < self.capacity:
                    break
                # A consumer holds the oldest entry of a full ring: everyone waits for it, but only so long (it
                # may be advancing one entry at a time, so the time counts from when the ring first stayed full).
                now = time.monotonic()
                if self.full_since is None:
                    self.full_since = now
                if now - self.full_since >= self.owner.slow_consumer_timeout:
                    self._detach_slow()
                    self.full_since = None
                    continue
                self.cond.wait(self.owner.slow_consumer_timeout - (now - self.full_since))
            if self.stopped:
                return False
            self.ring.append(_Entry(envelope, self.last))  # type: ignore[arg-type]
            self.last = envelope.offset if isinstance(envelope.offset, TimestampOffset) else self.last
            self.cond.notify_all()
            return True

    def _detach_slow(self) -> None:
        """Detach the consumers at least half a buffer behind the fastest one. When all are close together (the
        hose is faster than all of them, e.g. while it catches up), nobody is slow: everyone keeps waiting."""
        fastest = max(self.cursors.values(), default=self.head)
        slow = [cid for cid, cursor in self.cursors.items() if fastest - cursor >= self.capacity // 2]
        for cid in slow:
            del self.cursors[cid]
            self.detached.add(cid)
        if slow:
            _log.warning("firehose %s slices %d-%d: detached %d slow consumer(s), half a buffer or more behind the "
                         "fastest after %.1f s with a full buffer of %d envelopes", *self.key, len(slow),
                         self.owner.slow_consumer_timeout, self.capacity)
        self.cond.notify_all()


class FirehoseConsumer(Iterator[EventEnvelope]):
    """One consumer of a shared query: an iterator that never ends by itself; ``close()`` stops it."""

    def __init__(self, owner: Firehose, key: Key, offset: Offset) -> None:
        self.id = uuid.uuid4().hex
        self._owner = owner
        self._key = key
        #: What the consumer had consumed before it started (never delivered again).
        self._start: TimestampOffset | None = offset if isinstance(offset, TimestampOffset) else None
        #: The offset of the last envelope delivered (monotonic).
        self._last: TimestampOffset | None = self._start
        self._closed = False
        self._hose: _Hose | None = None
        self._catchup: Iterator[EventEnvelope] | None = None
        #: Catch-up envelopes older than this cannot come from the hose again (not remembered for dedup).
        self._floor: datetime | None = None
        #: Envelopes the current catch-up run delivered.
        self._run_count = 0
        #: The ordering/dedup gate between the catch-up and the hose, stamped with each event's time (it keeps
        #: only what the hose may still deliver again: at or after the join point minus its backtracking
        #: margin); ``None`` once not needed.
        self._gate: Gate[datetime] | None = Gate()
        self._dedup_until: datetime | None = None
        self._pending: deque[EventEnvelope] = deque()
        self._attached = False
        #: Catch-up runs made (1 when the consumer joined after its first).
        self.catchup_runs = 0

    @property
    def attached(self) -> bool:
        """Reading from the shared query (``False`` while catching up on its own)."""
        return self._attached

    @property
    def offset(self) -> TimestampOffset | None:
        """The offset of the last envelope delivered (resume from it); the start offset before the first."""
        return self._last

    def __iter__(self) -> FirehoseConsumer:
        return self

    def __next__(self) -> EventEnvelope:
        while True:
            if self._closed:
                raise StopIteration
            if self._pending:
                return self._emit(self._pending.popleft())
            if self._hose is None:
                self._hose = self._owner.hose(self._key)
                self._begin_catchup()
            if self._catchup is not None:
                envelope = next(self._catchup, None)
                if envelope is not None:
                    self._remember(envelope)
                    return self._emit(envelope)
                self._try_join()
                continue
            envelope = self._from_hose()
            if envelope is not None and self._accept(envelope):
                return self._emit(self._pending.popleft()) if self._pending else self._emit(envelope)

    # -- catching up -----------------------------------------------------------------------------------

    def _begin_catchup(self) -> None:
        hose = self._hose
        assert hose is not None
        with hose.cond:
            oldest = hose.ring[0].before if hose.ring else hose.last
        if oldest is None:  # not started yet: it will start at or after where this run starts, minus its margin
            oldest = self._last if self._last is not None else TimestampOffset(EPOCH)
        self._floor = oldest.timestamp - hose.early - hose.margin
        entity_type, lo, hi = self._key
        self._catchup = iter(self._owner.journal.query.current_events_by_slices(
            entity_type, lo, hi, self._last if self._last is not None else NoOffset))
        self._run_count = 0
        self.catchup_runs += 1

    def _remember(self, envelope: EventEnvelope) -> None:
        self._run_count += 1
        gate = self._gate
        if gate is None or self._floor is None:
            return
        if envelope.db_timestamp >= self._floor:
            gate.deliver(envelope.persistence_id, envelope.seq_nr, envelope.db_timestamp)
        else:  # the hose cannot deliver it again; an entry of an earlier run would be stale
            gate.drop(envelope.persistence_id)

    def _try_join(self) -> None:
        """After a catch-up run: attach at the newest hose entry whose predecessors the consumer has all had
        (the hose's offset before it is one the consumer's offset reaches); else catch up again."""
        hose = self._hose
        assert hose is not None
        reached = self._last if self._last is not None else TimestampOffset(EPOCH)
        with hose.cond:
            failed = hose.failure is not None or hose.stopped
            join_at = None
            if not failed and hose.start_offset is None:
                hose.start(reached)  # the first consumer to catch up starts the shared query where it is
            if not failed:
                index, before = hose.head, hose.last
                assert before is not None, "a started hose has an offset"
                while True:
                    if _reaches(reached, before):
                        join_at = index
                        break
                    if index == hose.base:
                        break
                    index -= 1
                    before = hose.ring[index - hose.base].before
            if join_at is not None:
                hose.cursors[self.id] = join_at
                self._attached = True
                self._catchup = None
                floor = before.timestamp - hose.margin  # type: ignore[union-attr]  # set where join_at was
            elif not failed and self._run_count == 0:
                # Nothing new here and the hose has delivered nothing past us yet: wait for it (or poll again).
                hose.cond.wait(self._owner.journal.settings.refresh_interval)
        if join_at is not None:
            assert self._gate is not None
            self._gate.forget_where(lambda ts: ts < floor)
            newest = max((ts for _, ts in self._gate.delivered.values()), default=None)
            self._dedup_until = None if newest is None else newest + hose.margin
            _log.debug("firehose consumer %s joined %s slices %d-%d after %d catch-up run(s)", self.id, *self._key,
                       self.catchup_runs)
            return
        if failed:  # the hose ended under us: take (or start) the current one, unless the firehose closed
            if self._owner.closed:
                self.close()
                return
            hose.release(self.id)
            self._hose = self._owner.hose(self._key)
        self._begin_catchup()

    # -- reading the hose ------------------------------------------------------------------------------

    def _from_hose(self) -> EventEnvelope | None:
        hose = self._hose
        assert hose is not None
        with hose.cond:
            while True:
                if self._closed:
                    return None
                if self.id in hose.detached:
                    self._attached = False
                    self.close()  # a detached consumer ends; resume from its offset
                    raise SlowConsumer(
                        f"firehose consumer of {self._key[0]!r} slices {self._key[1]}-{self._key[2]} fell a whole "
                        f"buffer ({hose.capacity} envelopes) behind for more than "
                        f"{self._owner.slow_consumer_timeout:g} s and was detached; resume from its last offset "
                        "(SlowConsumer.offset)", offset=self._last)
                cursor = hose.cursors.get(self.id)
                if cursor is not None and cursor < hose.head:
                    entry = hose.ring[cursor - hose.base]
                    hose.cursors[self.id] = cursor + 1
                    hose.cond.notify_all()
                    return entry.envelope
                if hose.failure is not None:
                    raise hose.failure
                if hose.stopped:
                    self._closed = True
                    return None
                hose.cond.wait()

    def _accept(self, envelope: EventEnvelope) -> bool:
        """Whether a hose envelope is new to this consumer; queues a gap's events first (never expected)."""
        pid, seq_nr, ts = envelope.persistence_id, envelope.seq_nr, envelope.db_timestamp
        if self._start is not None and self._start.covers(ts, pid, seq_nr):
            return False
        gate = self._gate
        if gate is None:
            return True
        if self._dedup_until is not None and envelope.offset.timestamp > self._dedup_until:
            self._gate = None  # past what catching up could have delivered twice
            return True
        verdict, after = gate.judge(pid, seq_nr, _new)
        if verdict is DUPLICATE:
            return False
        gate.deliver(pid, seq_nr, ts)
        if verdict is GAP:
            assert isinstance(after, int)  # by the policy, only a known persistence id has a gap
            _log.warning("firehose consumer %s: %s seq_nr %d came after %d; loading the gap", self.id, pid, seq_nr,
                         after)
            self._pending.extend(self._owner.journal.query.current_events_by_persistence_id(
                pid, after + 1, seq_nr - 1))
            self._pending.append(envelope)
        return True

    def _emit(self, envelope: EventEnvelope) -> EventEnvelope:
        offset = envelope.offset
        if self._last is None or _reaches(offset, self._last):
            self._last = offset
            return envelope
        self._last = later(self._last, offset)
        return dataclasses.replace(envelope, offset=self._last)

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed and self._hose is None:
            return
        self._closed = True
        hose, self._hose = self._hose, None
        if hose is not None:
            hose.release(self.id)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> FirehoseConsumer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _new(_pid: str, seq_nr: int) -> int:
    """The gate's policy for a persistence id the catch-up did not deliver (or before the hose's reach): its
    event is the next one (only the hose delivers it)."""
    return seq_nr - 1
