"""The per-slice offset store of a projection (``projection_timestamp_offset_store``).

Per slice it keeps the latest offset and, within a time window behind it, one row per persistence id with
the highest sequence number processed. From these rows:

* **validation** of every envelope by the ordering/dedup gate (:mod:`pgjournal.query.gate`): *duplicate*
  (``seq_nr`` at or below the stored one, or older than the window of its slice, which was all processed),
  *accepted* (the next one, a first event, or a pid whose previous event lies before the window), or
  *rejected* (its predecessors were not processed: the runner loads them by persistence id and processes
  them first, so nothing is ever skipped);
* the **start offset** of a slice range: the earliest over its slices of each slice's *safe point* (every
  event of the slice before it was processed): its latest offset minus the backtracking lookback (late
  commits the previous run had not seen yet are read again and dropped as duplicates by the rows above),
  or its marker when that is later; lowered to the first event of any slice that has no row at all.

Marker rows (persistence id ``''``, seq_nr 0) record "everything of this slice before this time counts as
processed". :func:`projections.management.set_offset` writes them, and so does a running range
(:meth:`OffsetStore.advance_markers`) for slices that had no event for a while: its query reads all of its
slices in time order, so once it has committed an event at time N, every event of every slice of the range
before ``N - lookback`` was processed (an event committed later than that would have been missed by the
backtracking too; see ``ProjectionSettings.restart_lookback``). Without those markers one idle slice would
hold every restart back to its last event (one pid written a week ago: a week re-read on each restart).
Eviction keeps the latest row per slice, so a slice that was ever processed or marked always has a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import TimestampOffset
from pgjournal.model.slices import check_slice_range
from pgjournal.model.timeuuid import EPOCH
from pgjournal.query.gate import Gate, Verdict, judge
from pgjournal.runtime.steps import Call, Step, first_of, rows_of, run, statement
from pgjournal.store.timestamp_offsets import MARKER_PID, OFFSET_TABLE, OffsetRow, check_offset_table, offsets
from pgjournal.store.timestamp_offsets import range_key as range_key  # the runner's key of a range

from .shards import range_journal

if TYPE_CHECKING:
    import psycopg

    from pgjournal.journal import Journal
    from pgjournal.shards import ShardedJournal
    from pgjournal.store.events import EventStore


@dataclass(frozen=True, slots=True)
class Record:
    """The highest event of a persistence id processed (or about to be, in the open transaction)."""

    slice: int
    seq_nr: int
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class Validation:
    #: The gate's verdict (:class:`pgjournal.query.gate.Verdict`): ``ACCEPTED`` is ``NEXT``, ``REJECTED`` is ``GAP``.
    verdict: Verdict
    #: For a rejected envelope: the highest sequence number processed (or counted processed) before it;
    #: the runner loads ``after + 1 .. seq_nr - 1`` and processes them first.
    after: int = 0


class OffsetStore:
    """The offsets of one projection over one slice range, in memory and in the database.

    Not thread-safe: one runner owns it. ``pending`` maps, passed to :meth:`validate`, hold what the
    current unit of work accepted but has not committed yet.
    """

    def __init__(self, journal: Journal | ShardedJournal, name: str, entity_type: str, min_slice: int,
                 max_slice: int, *, time_window: float, lookback: float = 0.0, table: str = OFFSET_TABLE,
                 sparse: bool = False, source: Journal | ShardedJournal | None = None) -> None:
        check_slice_range(min_slice, max_slice)
        #: The offset table (pgjournal's or Akka's, :data:`OFFSET_TABLES`) and the statements over it.
        self.table = check_offset_table(table)
        self.sql = offsets(self.table)
        #: A sharded journal's database of the range: the offsets are stored beside the slices.
        self.journal: Journal = range_journal(journal, min_slice, max_slice)
        #: Where the events are, when not in :attr:`journal` (a processor's source): the probes of validation
        #: and of the start offset read there, on a connection of its own.
        self.source: Journal | None = None if source is None else range_journal(source, min_slice, max_slice)
        self.name = name
        self.entity_type = entity_type
        #: The projection reads a tag filter's events: a persistence id's numbers have holes (its events without
        #: the tags), so a higher number is the next one, not a gap (see :meth:`validate_step`).
        self.sparse = sparse
        self.min_slice, self.max_slice = min_slice, max_slice
        self.key = range_key(min_slice, max_slice)
        self.window = timedelta(seconds=time_window)
        #: How far before a slice's latest offset late commits may still arrive (the runner's lookback).
        self.lookback = timedelta(seconds=lookback)
        #: Per slice: the latest processed event time (markers included) and the latest marker.
        self.latest: dict[int, datetime] = {}
        self.markers: dict[int, datetime] = {}
        #: Per persistence id the highest event processed (stamped with its :class:`Record`), within the window.
        self.gate: Gate[Record] = Gate()
        self.rows_since_delete = 0
        #: The newest event time committed through this instance (this run), and the markers it wrote.
        self.run_newest: datetime | None = None
        self.marked: dict[int, datetime] = {}

    # -- loading -------------------------------------------------------------------------------------

    def load(self, conn: psycopg.Connection) -> TimestampOffset | None:
        """Read the rows of the range; return where its query starts (``None``: from the beginning)."""
        return run(self.load_step(), conn)

    def load_step(self) -> Step[TimestampOffset | None]:
        """:meth:`load` as a step (:mod:`pgjournal.runtime.steps`), for a blocking or an asyncio connection."""
        self.latest, self.markers, self.gate = {}, {}, Gate()
        for row in (yield from rows_of(self.sql.latest(self.name, self.min_slice, self.max_slice))):
            self.latest[row.slice] = row.latest
            if row.marker is not None:
                self.markers[row.slice] = row.marker
        if self.latest:
            rows = yield from rows_of(self.sql.highest_per_pid(self.name, {s: self.floor(s) for s in self.latest}))
            for r in rows:
                self.gate.deliver(r.persistence_id, r.seq_nr, Record(r.slice, r.seq_nr, r.timestamp))
        start = min((self.safe_point(s) for s in self.latest), default=None)
        empty = [s for s in range(self.min_slice, self.max_slice + 1) if s not in self.latest]
        if empty and start is not None:
            # Slices never processed (or cleared): their events before ``start`` must not be skipped. Ranges
            # mark all their slices once they ran (advance_markers), so a plain restart does not run this.
            probe = first_of(self.events.first_event(self.entity_type, empty, start), prepare=False)
            first = (yield from probe) if self.source is None else (yield Call(self.source.run, (probe,)))
            if first and first[0] is not None:
                start = first[0]
        elif empty:
            return None
        return TimestampOffset(max(EPOCH, start)) if start is not None else None

    @property
    def events(self) -> EventStore:
        """The statements over the events' table, in the database the events are in."""
        return (self.source or self.journal).events

    def safe_point(self, slice_: int) -> datetime:
        """Every event of the slice before this time was processed (``EPOCH`` for a slice without a row)."""
        latest = self.latest.get(slice_)
        if latest is None:
            return self.marked.get(slice_, EPOCH)
        point = max(latest - self.lookback, self.markers.get(slice_, EPOCH), self.marked.get(slice_, EPOCH))
        return max(point, EPOCH)

    def floor(self, slice_: int) -> datetime:
        """Events of the slice before this time all count as processed; rows are kept from here on."""
        latest = self.latest.get(slice_)
        if latest is None:
            return EPOCH
        return max(latest - self.window, self.markers.get(slice_, EPOCH))

    # -- validation ----------------------------------------------------------------------------------

    def validate(self, conn: psycopg.Connection, env: EventEnvelope, pending: Mapping[str, Record]
                 ) -> Validation:
        """:meth:`validate_step` on a blocking connection."""
        return run(self.validate_step(env, pending), conn)

    def validate_step(self, env: EventEnvelope, pending: Mapping[str, Record]) -> Step[Validation]:
        """The gate's verdict for ``env``; ``pending``: what the open unit of work accepted (it counts)."""
        record = pending.get(env.persistence_id)
        known = record.seq_nr if record is not None else self.gate.last(env.persistence_id)
        after = known if known is not None else (yield from self._unknown_step(env))
        if self.sparse:
            # The filtered query delivers a persistence id's tagged events once and in order (its gate), so
            # only a repeat is refused here; the numbers between belong to events the filter leaves out.
            repeat = after is Verdict.DUPLICATE or (isinstance(after, int) and env.seq_nr <= after)
            return Validation(Verdict.DUPLICATE if repeat else Verdict.NEXT)
        verdict = judge(after, env.seq_nr)
        # A rejection's ``after`` is a number: only a verdict of its own (a duplicate) comes back as a Verdict.
        return Validation(verdict, after if verdict is Verdict.REJECTED and isinstance(after, int) else 0)

    def _unknown_step(self, env: EventEnvelope) -> Step[int | Verdict]:
        """The gate's policy for a persistence id without a record: older than its slice's window, it was
        processed; a first event or one whose predecessor is before the window (or deleted) is next; else
        everything up to the highest event before the window counts as processed."""
        floor = self.floor(env.slice)
        if env.db_timestamp < floor:
            return Verdict.DUPLICATE
        if env.seq_nr == 1 or self.sparse:
            return 0  # (sparse: its earlier tagged events in the window would have a record: none was delivered)
        query = self.events.previous(env.persistence_id, env.seq_nr, floor)
        rows = (yield statement(query)) if self.source is None else (yield Call(self.source.run, (_rows(query),)))
        prev_ts, before_floor = rows[0] if rows else (None, 0)
        if prev_ts is None or prev_ts < floor:
            return env.seq_nr - 1  # the previous event was processed (or deleted)
        return int(before_floor)

    # -- storing -------------------------------------------------------------------------------------

    def save(self, conn: psycopg.Connection, pending: Mapping[str, Record], *, fenced: bool) -> None:
        """Insert a row per persistence id of ``pending`` (its highest event: lower ones are implied).

        ``fenced`` (exactly-once, grouped): a row that exists already means another worker processed the
        event, and the insert fails the transaction. Otherwise (at-least-once) such a row is ignored.
        """
        run(self.save_step(pending, fenced=fenced), conn)

    def save_step(self, pending: Mapping[str, Record], *, fenced: bool) -> Step[None]:
        """:meth:`save` as a step."""
        if not pending:
            return
        rows = [OffsetRow(r.slice, pid, r.seq_nr, r.timestamp) for pid, r in pending.items()]
        yield statement(self.sql.insert(self.name, self.key, rows, fenced=fenced))

    def commit(self, pending: Mapping[str, Record]) -> None:
        """Take ``pending`` into memory once its transaction committed."""
        for pid, record in pending.items():
            self.gate.deliver(pid, record.seq_nr, record)
            if self.run_newest is None or record.timestamp > self.run_newest:
                self.run_newest = record.timestamp
            if record.timestamp > self.latest.get(record.slice, EPOCH):
                self.latest[record.slice] = record.timestamp
        self.rows_since_delete += len(pending)

    def save_marker(self, conn: psycopg.Connection, slices: Iterable[int], timestamp: datetime) -> None:
        conn.execute(*self.marker_statement(slices, timestamp))

    def marker_statement(self, slices: Iterable[int], timestamp: datetime) -> tuple[str, Any]:
        """Mark ``timestamp`` processed in ``slices`` (see the module docstring)."""
        return self.sql.insert(self.name, self.key, [OffsetRow(s, MARKER_PID, 0, timestamp) for s in slices],
                               fenced=False)

    def advance_markers(self, conn: psycopg.Connection, *, slack: float = 0.0) -> int:
        """:meth:`advance_markers_step` on a blocking connection."""
        return run(self.advance_markers_step(slack=slack), conn)

    def advance_markers_step(self, *, slack: float = 0.0) -> Step[int]:
        """Mark ``run_newest - lookback`` in every slice of the range whose safe point is older (by more than
        ``slack`` seconds), so that the next run starts near the newest offset instead of at the last event of
        the idlest slice. Returns the number of slices marked.

        Why it is safe: this run's query read all slices of the range in (db_timestamp, seq_nr) order from
        the run's start (no later than any slice's safe point), and what it delivered was committed in
        delivery order. An event delivered after the one at ``run_newest`` came from backtracking, which never
        reads earlier than ``lookback`` behind the query's position, so every event before
        ``run_newest - lookback`` in any slice of the range was delivered and committed (or was processed
        before this run). In-memory floors stay as loaded: the markers only move where the next run starts.
        """
        if self.run_newest is None:
            return 0
        mark = self.run_newest - self.lookback
        due = timedelta(seconds=slack)
        slices = [s for s in range(self.min_slice, self.max_slice + 1) if self.safe_point(s) < mark - due]
        if not slices:
            return 0
        yield statement(self.marker_statement(slices, mark))
        for s in slices:
            self.marked[s] = mark
        self.rows_since_delete += len(slices)
        return len(slices)

    # -- eviction and deletion -----------------------------------------------------------------------

    def evict(self) -> None:
        """Forget records older than the window of their slice (they validate by the floor instead)."""
        self.gate.forget_where(lambda r: r.timestamp < self.floor(r.slice))

    def delete_old(self, conn: psycopg.Connection) -> int:
        """Delete superseded rows and rows older than the window (the latest row per slice stays)."""
        return run(self.delete_old_step(), conn)

    def delete_old_step(self) -> Step[int]:
        """:meth:`delete_old` as a step."""
        self.rows_since_delete = 0
        old = yield from rows_of(self.sql.old(self.name, self.min_slice, self.max_slice, self.window.total_seconds()))
        if not old:
            return 0
        count: int = yield statement(self.sql.delete(self.name, old))
        return count


def _rows(query: tuple[str, Any]) -> Step[Any]:
    return (yield statement(query))
