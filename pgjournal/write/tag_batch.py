"""What a batched tag writer has to write, without I/O (:mod:`pgjournal.write.tag_batcher` tells the design):
:class:`TagBatch`, the pending events per persistence id (:class:`Pending`) and the bound of the writer's
watermark, with the statement that writes a batch as a step; :func:`pid_lsb`, the low bytes of a persistence id's
TimeUUIDs; :class:`Recovered`, what a recovery of a silent writer wrote."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.model.timeuuid import lsb_key
from pgjournal.runtime import metrics
from pgjournal.runtime.steps import Step, statement
from pgjournal.store import tags as store
from pgjournal.store.tags import NO_UPTO, BatchPair

if TYPE_CHECKING:
    from pgjournal.core.journal_core import JournalCore


def pid_lsb(pid: str) -> tuple[int, str]:
    """The TimeUUID low bytes of a persistence id's batched tag rows: as an order key (``ts_lsb``) and as 16 hex
    digits. A hash of the persistence id (RFC 4122 variant, multicast node bit), the same in every process."""
    digest = hashlib.blake2b(pid.encode("utf-8", "surrogatepass"), digest_size=8, person=b"pgjournal-tags").digest()
    lsb_bytes = (0x80 << 56) | (int.from_bytes(digest, "big") & 0x3FFFFFFFFFFFFFFF) | (1 << 40)
    return lsb_key(lsb_bytes), f"{lsb_bytes:016x}"


@dataclass(slots=True)
class Pending:
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

    def merge(self, other: Pending) -> None:
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
        self._pending: dict[str, Pending] = {}
        #: Taken by the write under way, not committed yet.
        self._taken: list[Pending] = []
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
            self._pending[pid] = Pending(pid, slice_, set(tags), upto, since, count)
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

    def take(self) -> list[Pending]:
        """Everything pending, for a write (it counts as pending until :meth:`finished` or :meth:`give_back`)."""
        with self._lock:
            entries = list(self._pending.values())
            self._pending.clear()
            self._queued = 0
            self._taken.extend(entries)
            return entries

    def next_statement(self, entries: list[Pending], *, own: bool = True) -> tuple[list[Pending], list[BatchPair]]:
        """The entries (from the front of ``entries``) and pairs of one statement: at least one entry, and
        about ``limit`` rows at most. Not ``own`` (a recovery's): they do not bound this writer's watermark."""
        chosen: list[Pending] = []
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

    def bound(self, excluding: Iterable[Pending] = ()) -> datetime | None:
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

    def finished(self, entries: list[Pending], rows: list[tuple[Any, ...]]) -> list[Pending]:
        """A statement for ``entries`` committed with ``rows`` (heartbeat, pid, tag, rows written): the entries
        with pairs that may have more rows (as many as the limit) are returned to write again."""
        written = {(pid, tag): n for _, pid, tag, n in rows if pid is not None}
        metrics.TAG_ROWS.inc(sum(written.values()))
        again: list[Pending] = []
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

    def give_back(self, entries: list[Pending]) -> None:
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


@dataclass(frozen=True)
class Recovered:
    """A silent writer whose tag rows were written by another (``rows``: tag view rows written)."""

    id: str
    writer: str
    persistence_ids: int
    rows: int
