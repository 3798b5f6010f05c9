"""events_by_slices: the events of one entity type in a slice range, in (db_timestamp, seq_nr) order.

The *main* cursor pages forward in ``(db_timestamp, seq_nr)`` order up to a safe bound: on
PostgreSQL the visibility horizon (derived from the transactions that hold a write lock on the journal,
see :mod:`pgjournal.core.horizon`), so it never passes a transaction that may still commit; in portable mode the clock
minus
``behind_current_time``. A slower *backtracking* cursor re-reads a window behind it and finds events that
committed after the main cursor passed their timestamp.

Every envelope goes through one gate (:mod:`pgjournal.query.gate`): per persistence id, an event is delivered once,
and only after its predecessor. A duplicate is dropped; an event whose predecessor was not delivered yet has
the missing events loaded by persistence id and delivered first (marked as backtracked). So a consumer sees
each event exactly once, in sequence order per persistence id, even when transactions commit out of order.

The logic runs no SQL itself: its pages are steps (:mod:`pgjournal.runtime.steps`) that describe their statements,
run by the blocking driver here and by an asyncio driver alike. A current query is a sequence of steps
(:meth:`SliceQuery.current_steps`, one connection each), a live poll one step (:meth:`SliceQuery.poll_step`).

**A tag filter** (``tags=``: the events carrying any of the tags, as Akka's ``IncludeTags``) is served by the
database, by one of two page forms, chosen by whether the main cursor has the visibility horizon:

* with the horizon (PostgreSQL), the page holds only the tagged events (the tagged events' index, so an
  untagged row is never read). The gate then sees a persistence id's numbers with holes (its untagged events)
  and judges them as durable state's rows (``contiguous`` false: a number at or below the delivered one is a
  duplicate, a higher one is delivered): below the horizon nothing commits late, and a persistence id's
  events commit in number order, so nothing is missed;
* without it (portable mode, where a late commit below the cursor is normal and the gate's gap fill finds
  it), the page holds every row, those without the tags as markers (no payload): the gate and the cursors run
  exactly as unfiltered, and the markers are dropped after the gate, before anything is decoded.

Either way the cursor (and with it the offset of the next delivered envelope) moves past the events
filtered out: a query resumed from a delivered envelope's offset neither repeats nor misses a tagged event,
and the filtered-out stretch behind it is not read again (sparse) or read without payloads (portable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pgjournal.core.horizon import Horizon
from pgjournal.core.journal_core import BlockingCore, JournalCore
from pgjournal.errors import InvalidArgument
from pgjournal.model.envelope import EventEnvelope, Source, envelope_from_row, metadata_of, new_envelope
from pgjournal.model.offsets import NoOffset, Offset, TimestampOffset
from pgjournal.model.slices import check_slice_range
from pgjournal.model.timeuuid import EPOCH, LATEST
from pgjournal.query.gate import DUPLICATE, GAP, Gate, Unknown
from pgjournal.runtime import metrics
from pgjournal.runtime.live import LiveQuery, Made
from pgjournal.runtime.steps import Statement, Step, drive, run_pooled, statement
from pgjournal.validation import check_name, check_persistence_id, check_tag_filter

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry

#: A row the gate lets through, with what its envelope needs: (row, source, and the main cursor's timestamp,
#: seen map and read timestamp at that moment, and the offset's ``settled``: ``None`` when it is the timestamp).
#: Envelopes are made from them as the reader takes them.
Delivery = tuple[tuple[Any, ...], Source, datetime, dict[str, int], datetime, "datetime | None"]


@dataclass
class _Cursor:
    """A position: a timestamp, and per persistence id the highest number read (or, from an offset,
    consumed) at exactly that timestamp. A page reads the rows after it in ``(db_timestamp, number)`` order,
    the order of the journal's time index, so the database sorts nothing; rows that share a timestamp and a
    number come in no particular order, and a page may end among them: ``seen`` holds every row read at ``ts``,
    so the next page skips exactly those."""

    ts: datetime
    seen: dict[str, int] = field(default_factory=dict)

    def params(self) -> dict[str, Any]:
        return {"from_ts": self.ts, "seen_pids": list(self.seen), "seen_seqs": list(self.seen.values())}


class SliceRows(Protocol):
    """What a by-slice query reads: rows whose first five columns are (slice, entity_type, persistence_id,
    number, db_timestamp), paged by the store's SQL, and how a row becomes what the reader receives."""

    @property
    def contiguous(self) -> bool:
        """Per persistence id every number is a row to deliver (events): the gate loads a missing predecessor.
        ``False`` (durable state, whose row is overwritten): only what was delivered is dropped."""

    @property
    def horizon_relations(self) -> tuple[int, ...] | None:
        """The tables whose writers bound the visibility horizon (``None``: the journal's)."""

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]: ...

    def envelope(self, row: tuple[Any, ...], offset: TimestampOffset, source: Source) -> Any: ...


class EventRows:
    """The journal's events (the default rows of a :class:`SliceQuery`), decoded with ``serializers``
    (default: the journal's; a projection passes a lenient registry that does not raise)."""

    horizon_relations = None

    def __init__(self, journal: JournalCore, serializers: SerializerRegistry | None = None, *,
                 tags: tuple[str, ...] | None = None, sparse: bool = True) -> None:
        self._journal = journal
        self._serializers = serializers if serializers is not None else journal.serializers
        #: The tag filter (``None``: every event) and its page form (see the module docstring).
        self.tags, self.sparse = tags, sparse
        #: Only a sparse page leaves holes in a persistence id's numbers (its untagged events).
        self.contiguous = tags is None or not sparse

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]:
        return self._journal.events.page_sql(min_slice, max_slice, self.tags, sparse=self.sparse)

    def envelope(self, row: tuple[Any, ...], offset: TimestampOffset, source: Source) -> EventEnvelope:
        return envelope_from_row(row, self._serializers, offset=offset, source=source)

    def envelopes(self, deliveries: list[Any], source: Source = Source.QUERY, read_timestamp: datetime | None = None
                  ) -> Iterator[EventEnvelope]:
        """:meth:`envelope` of each delivery (a :data:`Delivery`, or a bare row of a page read at
        ``read_timestamp``, delivered alone at its timestamp: see :meth:`SliceQuery.sift_step`), made as they
        are taken, at less per row (a catch-up's cost): the offset keeps the cursor's seen map (replaced, never
        changed) without a copy; payloads are read by the registry's bulk reader
        (:meth:`~pgjournal.codec.serialization.SerializerRegistry.bulk_reader`); the envelope is made without
        checks (:func:`new_envelope`)."""
        serializers = self._serializers
        read = serializers.bulk_reader()
        offset_of, make = TimestampOffset.adopted, new_envelope
        for delivery in deliveries:
            if delivery[0].__class__ is tuple:  # a Delivery (a row starts with its slice)
                row, at_source, at, seen, at_read, settled = delivery
            else:
                row, at_source, at, seen, at_read, settled = delivery, source, delivery[4], None, read_timestamp, None
            slice_, entity_type, pid, seq_nr, ts, ser_id, manifest, payload, tags, meta_id, _, _ = row
            event = read(ser_id, manifest, payload, pid, seq_nr)
            yield make(pid, seq_nr, slice_, entity_type, ts,
                       offset_of(at, at_read, seen if seen is not None else {pid: seq_nr}, settled), event,
                       tuple(tags) if tags else (), None if meta_id is None else metadata_of(row, serializers),
                       at_source)


class SliceQuery:
    """The state of one events_by_slices query (or, with other ``rows``, a query of the same shape such as
    durable state's changes): cursors, the gate, and the steps that read pages through it."""

    def __init__(self, journal: JournalCore, entity_type: str, min_slice: int, max_slice: int, offset: Offset,
                 rows: SliceRows | None = None, *, serializers: SerializerRegistry | None = None,
                 tags: Iterable[str] | None = None) -> None:
        self.journal = journal
        self.settings = journal.settings
        self.entity_type = check_name(entity_type, "entity type") if entity_type != "" else ""
        check_slice_range(min_slice, max_slice)
        #: The tag filter: deliver only events carrying one of these (``None``: every event).
        self.tags = check_tag_filter(tags)
        if self.tags is not None and rows is not None:
            raise InvalidArgument(f"a tag filter reads the journal's events, not {type(rows).__name__}")
        self._wanted = frozenset(self.tags or ())
        self.rows: SliceRows = rows if rows is not None else EventRows(
            journal, serializers, tags=self.tags, sparse=journal.capabilities.writer_horizon)
        self.page_sql, self.slice_params = self.rows.page_sql(min_slice, max_slice)
        self.start = _start_offset(offset)
        self.main = _Cursor(self.start.timestamp, dict(self.start.seen))
        self.read_timestamp = self.start.read_timestamp or self.start.timestamp
        #: Everything before this was delivered, or consumed before the query (the offsets' ``settled``). With
        #: the visibility horizon (nothing commits below it) it is the main cursor's timestamp. Without it the main
        #: cursor passes events whose transactions are still open, and a query resumed from an offset must still
        #: deliver them: only what every event before it has committed by (the clock minus
        #: ``backtracking_behind_current_time``), read by the main cursor or a backtracking pass, is settled.
        self.settled = self.start.floor
        #: How far behind its db_timestamp an event may commit and still be delivered; ``None`` where nothing
        #: below the main cursor commits late (the horizon), or nothing that does is delivered (backtracking off).
        self.late: timedelta | None = None
        #: Per persistence id delivered at or after ``settled``: (the highest number delivered, its db_timestamp);
        #: an offset's ``seen`` names them all (made on the first delivery, see :meth:`_settle`).
        self.unsettled: dict[str, tuple[int, datetime]] | None = None
        self.pruned_at: datetime | None = None
        #: The clock minus ``late`` at the current main page (its rows before that are settled once read).
        self.safe_line = EPOCH
        #: What the current backtracking pass settles once it ends.
        self.bt_settles = EPOCH
        #: Per persistence id the highest sequence number delivered, stamped with its db_timestamp (evicted
        #: once older than the backtracking window: such a persistence id cannot come back).
        self.gate: Gate[datetime] = Gate()
        self.window = timedelta(seconds=self.settings.backtracking_window)
        self.bt_behind = timedelta(seconds=self.settings.backtracking_behind_current_time)
        self.use_horizon = journal.capabilities.writer_horizon
        if not self.use_horizon and self.settings.backtracking_enabled:
            self.late = self.bt_behind
        #: The primary's horizon, or on a standby the primary's once replayed (pgjournal.core.replica).
        self.tracker = journal.reader_horizon(self.rows.horizon_relations)
        self.lag = metrics.LIVE_LAG.labels(self.entity_type, metrics.slices_label(min_slice, max_slice))
        # Backtracking state
        self.backtracking: _Cursor | None = None
        self.bt_until = EPOCH
        self.bt_resume: datetime | None = None
        self.idle_polls = 0
        self.rows_since_backtracking = 0
        #: The last main page was full: the next one is a catch-up page (``catchup_buffer_size`` rows).
        self.behind = False
        #: A current query's bound (set by :meth:`settle_step`).
        self.bound: Horizon | None = None

    # -- reading -------------------------------------------------------------------------------------

    def main_limit(self) -> int:
        """Rows of the next main page: small near the head (live latency), large while behind (catch-up)."""
        return max(self.settings.buffer_size, self.settings.catchup_buffer_size) if self.behind \
            else self.settings.buffer_size

    def page(self, cursor: _Cursor, until: datetime, limit: int | None = None) -> Statement:
        """The statement of one page after ``cursor`` below ``until``. Never a generic plan: it cannot prune
        partitions or use the bounds, and runs many times slower (``python -m bench by-slices`` notes the plan
        and pages of a page). Its timestamps are UTC datetimes (:func:`~pgjournal.runtime.steps.utc_timestamps`),
        as are those of the events a gap fill loads: one query's envelopes all carry the same ``tzinfo``."""
        params = {"entity_type": self.entity_type, "until": until, "limit": limit or self.settings.buffer_size,
                  **self.slice_params, **cursor.params()}
        return Statement(self.page_sql, params, binary=True, prepare=False, utc=True)

    def main_page_step(self, source: Source) -> Step[tuple[list[Delivery], int]]:
        """A live query's main page: the horizon, a page below it, the gate; the next backtracking."""
        limit = self.main_limit()
        horizon, rows = yield from self.tracker.read_with_step(lambda until: self.page(self.main, until, limit), 4)
        self.read_timestamp = horizon.now
        self._safe_line(horizon)
        out = yield from self.sift_step(rows, source, main=True)
        self.behind = len(rows) >= limit
        self.after_main(len(rows), horizon)
        caught_up = len(rows) < limit
        reached = max(horizon.safe, self.main.ts) if caught_up else self.main.ts
        self.lag.set(max(0.0, (horizon.now - reached).total_seconds()))
        return out, len(rows)

    def backtracking_page_step(self) -> Step[tuple[list[Delivery], int]]:
        assert self.backtracking is not None
        rows = yield self.page(self.backtracking, self.bt_until)
        out = yield from self.sift_step(rows, Source.BACKTRACKING, main=False)
        if len(rows) < self.settings.buffer_size:
            self.bt_resume = self.bt_until
            self.backtracking = None
            self._settle_to(min(self.bt_settles, self.main.ts))
        return out, len(rows)

    def poll_step(self, notified: bool) -> Step[tuple[list[Delivery], int]]:
        """One poll of a live query (see :mod:`pgjournal.runtime.live`): backtracking first when due, then the main
        page; the deliveries (:meth:`envelope` makes each one's envelope) and the rows read. On any failure the
        state is as before: nothing of the poll was delivered, it runs again."""
        saved = self.checkpoint()
        try:
            source = Source.NOTIFIED if notified else Source.QUERY
            if self.backtracking is None:
                return (yield from self.main_page_step(source))
            late, rows = yield from self.backtracking_page_step()
            if self.backtracking is not None:
                return late, rows
            fresh, rows = yield from self.main_page_step(source)
            return late + fresh, rows
        except BaseException:
            self.restore(saved)
            raise

    # -- a current query -----------------------------------------------------------------------------

    def settle_step(self) -> Step[Horizon]:
        """A current query's bound: the horizon once the writers hidden from this role at its start are gone."""
        self.bound = yield from self.tracker.settle_step(timeout=self.tracker.capabilities.longest_transaction)
        return self.bound

    def current_steps(self) -> Iterator[Step[Iterator[Any]]]:
        """A current query after :meth:`settle_step`: its main pages up to the bound, then (portable mode) one
        backtracking pass. Each step returns its envelopes (made as they are taken); run it, and take them,
        before asking for the next step."""
        horizon = self.bound
        assert horizon is not None, "settle_step runs first"
        while True:
            yield self._current_page_step(horizon)
            if not self.behind:
                break
        if not self.settings.backtracking_enabled or self.use_horizon:
            return  # below the visibility horizon the main pages missed nothing
        # Late commits below the bound that the main pages passed (before the offset too, after what it settled):
        # one backtracking pass catches them.
        self.backtracking = _Cursor(self._backtrack_from(self.main.ts - self.window - self.bt_behind))
        self.bt_until = horizon.safe
        self.bt_settles = self._settles(self.bt_until, horizon)
        while self.backtracking is not None:
            yield self._made(self.backtracking_page_step())

    def _current_page_step(self, horizon: Horizon) -> Step[Iterator[Any]]:
        """A current query's main page; its envelopes are made as the reader iterates them (the deliveries and
        the read timestamp are fixed when the page is read)."""
        limit = self.main_limit()
        rows = yield self.page(self.main, horizon.safe, limit)
        self.read_timestamp = horizon.now
        self._safe_line(horizon)
        bare = hasattr(self.rows, "envelopes")
        deliveries = yield from self.sift_step(rows, Source.QUERY, main=True, bare=bare)
        self.behind = len(rows) >= limit
        self._forget(self.main.ts - self.window - self.bt_behind)
        return self.envelopes(deliveries, Source.QUERY, self.read_timestamp)

    def _made(self, step: Step[tuple[list[Delivery], int]]) -> Step[Iterator[Any]]:
        deliveries, _rows = yield from step
        return self.envelopes(deliveries)

    # -- the gate ------------------------------------------------------------------------------------

    def sift_step(self, rows: list[tuple[Any, ...]], source: Source, *, main: bool, bare: bool = False
                  ) -> Step[list[Delivery]]:
        """The gate over a page: each row once, after its predecessor (missing ones loaded and delivered
        first); the cursor advanced. Returns the rows to deliver, in order, with what their envelopes need;
        :meth:`envelope` makes each as the reader takes it (an envelope made and dropped before the next one
        is made costs the garbage collector next to nothing; a page of 10,000 kept alive at once made the
        collector's passes a large part of a catch-up's client CPU: ``python -m bench by-slices``).

        ``bare`` (a main page whose rows have ``envelopes``, see :meth:`envelopes`): a row delivered alone at
        its timestamp (its offset: its own timestamp, persistence id and number) is delivered as the row itself,
        not a :data:`Delivery`; so a page keeps one object per row alive, not three (the tuple and the seen map
        cost more in garbage collection than in making them)."""
        out: list[Any] = []
        if not rows:
            return out
        cursor = self.main if main else self.backtracking
        assert cursor is not None
        if self.late is not None and self.unsettled is None:
            # Taken before the gate runs over this page: an offset names only what was delivered before it.
            self.unsettled = self._first_unsettled()
        contiguous = self.rows.contiguous
        predecessors = (yield from self._predecessors_step(rows)) if contiguous else {}
        unknown = self._unknown(predecessors) if contiguous else _next
        # Per-row work is the cost of a catch-up, so the loop keeps it small: the start timestamp in the rows'
        # tzinfo (a comparison across tzinfo objects calls utcoffset on both), lookups hoisted, the gate's
        # common case (the next number of a persistence id, or 1) in one call, the cursor written back once a
        # page (and before a gap is filled, which reads it), and the seen map of a timestamp made only when a
        # second row shares it (``seen`` None: ``{lone_pid: lone_seq}``). Both cursors keep it (the next page
        # skips what it holds, see :class:`_Cursor`); only the main cursor's goes into offsets.
        start = self.start
        page_from = cursor.ts
        start_ts = start.timestamp.astimezone(rows[0][4].tzinfo)
        take_next, judge, deliver = self.gate.take_next, self.gate.judge, self.gate.deliver
        read_timestamp = self.read_timestamp
        ts_at = cursor.ts
        seen: dict[str, int] | None = cursor.seen
        lone_pid, lone_seq = "", 0
        # A backtracking delivery's offset is the main cursor's position (unchanged by a backtracking page).
        main_ts, main_seen = self.main.ts, self.main.seen
        append = out.append
        for row in rows:
            pid, seq_nr, ts = row[2], row[3], row[4]
            # The cursor's seen map is replaced, never changed: a delivery keeps the one of its offset. (That map is
            # the offset's position at one timestamp; the gate below holds the rule "each pid once, in order".)
            if ts != ts_at:
                ts_at = ts
                seen, lone_pid, lone_seq = None, pid, seq_nr
            else:
                if seen is None:
                    seen = {lone_pid: lone_seq}
                seen = {**seen, pid: max(seq_nr, seen.get(pid, 0))}
            if ts <= start_ts and start.covers(ts, pid, seq_nr):
                continue  # consumed before this query started (only backtracking can meet these)
            if not take_next(pid, seq_nr, ts):
                verdict, after = judge(pid, seq_nr, unknown)
                if verdict is DUPLICATE:
                    continue  # a duplicate (backtracking, or a replayed gap)
                if verdict is GAP and contiguous:
                    if seen is None:
                        seen = {lone_pid: lone_seq}
                    cursor.ts, cursor.seen = ts_at, seen
                    out.extend((yield from self._fill_step(pid, after, seq_nr)))  # type: ignore[arg-type]
                deliver(pid, seq_nr, ts)
            if not main:
                append((row, source, main_ts, main_seen, read_timestamp, None))
            elif seen is not None:
                append((row, source, ts_at, seen, read_timestamp, None))
            else:
                append(row if bare else (row, source, ts_at, {pid: seq_nr}, read_timestamp, None))
        cursor.ts, cursor.seen = ts_at, seen if seen is not None else {lone_pid: lone_seq}
        if self.late is not None:
            out = self._settle(out, source, page_from if main else None)
        return out if self.tags is None else self._tagged(out)

    # -- what an offset settles (no visibility horizon) ------------------------------------------------

    def _safe_line(self, horizon: Horizon) -> None:
        if self.late is not None:
            self.safe_line = horizon.now - self.late

    def _settles(self, until: datetime, horizon: Horizon) -> datetime:
        """What a backtracking pass up to ``until`` begun at ``horizon`` settles: the rows before ``until``
        that had all committed when it began."""
        return until if self.late is None else min(until, horizon.now - self.late)

    def _settle_to(self, settled: datetime) -> None:
        if self.late is not None and settled > self.settled:
            self.settled = settled
            if self.unsettled is not None:
                self.unsettled = self._pruned(self.unsettled)

    def _settle(self, out: list[Any], source: Source, page_from: datetime | None) -> list[Any]:
        """The deliveries of a page (``page_from``: a main page's start; ``None``: a backtracking page) with
        offsets that say what they settled (see :attr:`settled`): a main row read where every event before it
        had committed (catch-up, or below the safe line) settles up to its timestamp, and its offset is the
        plain one; else the offset's ``seen`` names every persistence id delivered since ``settled``. An offset
        handed out is never changed afterwards: each gets maps of its own."""
        unsettled = self.unsettled if self.unsettled is not None else self._first_unsettled()
        # A main page reads on from where everything before was settled: its rows below the safe line settle.
        advancing = page_from is not None and self.settled >= page_from
        safe_line = self.safe_line
        named: dict[str, int] | None = None
        made: list[Any] = []
        append = made.append
        for delivery in out:
            if delivery[0].__class__ is tuple:
                row, at_source, at, seen, read_timestamp, _ = delivery
            else:
                row, at_source, at, seen, read_timestamp = delivery, source, delivery[4], None, self.read_timestamp
            pid, seq_nr, ts = row[2], row[3], row[4]
            unsettled[pid] = (seq_nr, ts)  # the gate delivers each persistence id in order: its highest
            if advancing and at_source is not Source.BACKTRACKING:
                settles = min(at, safe_line)
                if settles > self.settled:
                    self.settled, named = settles, None
            if self.settled >= at:
                append(delivery)  # everything before its timestamp settled: the plain offset
                continue
            if named is None:
                unsettled = self._pruned(unsettled)
                named = {p: v[0] for p, v in unsettled.items()}
            else:
                named = {**named, pid: seq_nr}
            if seen:  # what was read at its timestamp (the cursor skips those rows on resuming)
                named = {**named, **{p: q for p, q in seen.items() if q > named.get(p, 0)}}
            append((row, at_source, at, named, read_timestamp, self.settled))
        self.unsettled = unsettled if len(unsettled) <= self.settings.buffer_size else self._pruned(unsettled)
        return made

    def _first_unsettled(self) -> dict[str, tuple[int, datetime]]:
        """What the offset started from covers (its ``seen``) and what was delivered before the first page
        (snapshots), stamped no earlier than they can be."""
        unsettled = {pid: (seq_nr, self.start.timestamp) for pid, seq_nr in self.start.seen.items()}
        unsettled.update((pid, v) for pid, v in self.gate.delivered.items() if v[1] >= self.settled)
        return unsettled

    def _pruned(self, unsettled: dict[str, tuple[int, datetime]]) -> dict[str, tuple[int, datetime]]:
        """``unsettled`` without the persistence ids delivered only before ``settled`` (kept, they only make
        seen maps longer: what they say, that those events were delivered, is true)."""
        settled = self.settled
        if self.pruned_at == settled:
            return unsettled
        self.pruned_at = settled
        return {pid: v for pid, v in unsettled.items() if v[1] >= settled}

    def _tagged(self, deliveries: list[Any]) -> list[Any]:
        """The deliveries whose events carry one of the filter's tags: the markers of a portable page, and the
        events a gap fill loaded by persistence id, are dropped here, after the gate counted them."""
        wanted = self._wanted
        kept = []
        for delivery in deliveries:
            row = delivery[0] if delivery[0].__class__ is tuple else delivery
            tags = row[8]
            if tags and not wanted.isdisjoint(tags):
                kept.append(delivery)
        return kept

    def envelope(self, delivery: Delivery) -> Any:
        """The envelope of a delivery; its offset is the main cursor's position when its row was delivered."""
        row, source, ts, seen, read_timestamp, settled = delivery
        return self.rows.envelope(row, TimestampOffset.trusted(ts, read_timestamp, seen, settled), source)

    def envelopes(self, deliveries: list[Any], source: Source = Source.QUERY, read_timestamp: datetime | None = None
                  ) -> Iterator[Any]:
        """The envelopes of deliveries, made one by one as they are taken (by the rows' ``envelopes`` when they
        have one: see :meth:`EventRows.envelopes`, which also takes bare rows: see :meth:`sift_step`, with their
        page's ``source`` and ``read_timestamp``)."""
        many = getattr(self.rows, "envelopes", None)
        if many is not None:
            return many(deliveries, source, read_timestamp)  # type: ignore[no-any-return]
        return self._one_by_one(deliveries)

    def _one_by_one(self, deliveries: list[Delivery]) -> Iterator[Any]:
        envelope, trusted = self.rows.envelope, TimestampOffset.trusted
        for row, source, ts, seen, read_timestamp, settled in deliveries:
            yield envelope(row, trusted(ts, read_timestamp, seen, settled), source)

    def _unknown(self, predecessors: dict[str, tuple[int, datetime]]) -> Unknown:
        """The gate's policy for a persistence id not met yet: delivered up to its predecessor when that is
        before this query (or forgotten), ``None`` when the predecessor still has to be delivered."""
        start = self.start
        floor = max(start.floor, self.gate.forgotten_before)

        def unknown(pid: str, seq_nr: int) -> int | None:
            if seq_nr == 1 or pid not in predecessors:
                return seq_nr - 1
            prev_seq, prev_ts = predecessors[pid]
            if prev_ts < floor:
                return prev_seq
            if start.covers(prev_ts, pid, prev_seq):
                return prev_seq
            return None

        return unknown

    def _predecessors_step(self, rows: list[tuple[Any, ...]]) -> Step[dict[str, tuple[int, datetime]]]:
        """(seq_nr, db_timestamp) of the predecessor of the first row of each persistence id the gate does not
        know: one statement per page."""
        delivered = self.gate.delivered
        # Reversed, so the first row of each persistence id is the one kept.
        first = {row[2]: (row[0], row[3]) for row in reversed(rows) if row[3] > 1 and row[2] not in delivered}
        if not first:
            return {}
        found = yield statement(self.journal.events.predecessors(
            list(first), [s for s, _ in first.values()], [q for _, q in first.values()]))
        return {pid: (seq, ts) for pid, seq, ts in found}

    def _fill_step(self, pid: str, after: int | None, before: int) -> Step[list[Delivery]]:
        """Load and deliver the events of ``pid`` between what was delivered and ``before`` (``after`` None:
        all of them since the query's start, or since the gate forgot)."""
        floor = EPOCH if after is not None else max(self.start.floor, self.gate.forgotten_before)
        rows = yield statement(self.journal.events.between(pid, after or 0, before, floor), binary=True, utc=True)
        out: list[Delivery] = []
        for row in rows:
            seq_nr, ts = row[3], row[4]
            if after is None and self.start.covers(ts, pid, seq_nr):
                continue  # consumed before this query started
            self.gate.deliver(pid, seq_nr, ts)
            out.append((row, Source.BACKTRACKING, self.main.ts, self.main.seen, self.read_timestamp, None))
        return out

    # -- failure atomicity ---------------------------------------------------------------------------

    def checkpoint(self) -> tuple[Any, ...]:
        return (_clone(self.main), _clone(self.backtracking), self.gate.checkpoint(), self.bt_until, self.bt_resume,
                self.idle_polls, self.rows_since_backtracking, self.read_timestamp, self.settled,
                None if self.unsettled is None else dict(self.unsettled), self.bt_settles, self.pruned_at)

    def restore(self, saved: tuple[Any, ...]) -> None:
        (self.main, self.backtracking, gate, self.bt_until, self.bt_resume, self.idle_polls,
         self.rows_since_backtracking, self.read_timestamp, self.settled, self.unsettled, self.bt_settles,
         self.pruned_at) = saved
        self.gate.restore(gate)

    # -- scheduling ----------------------------------------------------------------------------------

    def after_main(self, rows: int, horizon: Horizon) -> None:
        self.rows_since_backtracking += rows
        self.idle_polls = self.idle_polls + 1 if rows == 0 else 0
        self._forget(self.main.ts - self.window - self.bt_behind)
        if not self.settings.backtracking_enabled or self.backtracking is not None:
            return
        behind = self.bt_resume is None or self.main.ts - self.bt_resume > self.window / 2
        # Many persistence ids delivered since what is settled make every offset's seen map long: settle them.
        named = self.unsettled is not None and len(self.unsettled) >= self.settings.buffer_size
        if self.idle_polls >= 5 or self.rows_since_backtracking >= 3 * self.settings.buffer_size or behind or named:
            self.start_backtracking(horizon)

    def start_backtracking(self, horizon: Horizon) -> None:
        earliest = self.main.ts - self.window
        start = earliest - self.bt_behind if self.bt_resume is None else max(self.bt_resume, earliest)
        start = self._backtrack_from(start)
        self.bt_until = min(self.main.ts + timedelta(microseconds=1), horizon.now - self.bt_behind)
        if start >= self.bt_until:
            return
        self.bt_settles = self._settles(self.bt_until, horizon)
        self.backtracking = _Cursor(start)
        self.idle_polls = self.rows_since_backtracking = 0

    def _backtrack_from(self, start: datetime) -> datetime:
        """Where a backtracking pass that would start at ``start`` starts: never before the offset's position, but
        the first pass from an offset that settled less than its timestamp from what it settled (a late commit
        may lie anywhere after that)."""
        if self.bt_resume is None and self.start.settled is not None:
            return self.start.settled
        return max(start, self.start.floor)

    def _forget(self, before: datetime) -> None:
        self.gate.forget(before)


def _next(_pid: str, seq_nr: int) -> int:
    """The policy of rows that are not contiguous (durable state): an unknown persistence id's row is new."""
    return seq_nr - 1


def _clone(cursor: _Cursor | None) -> _Cursor | None:
    return None if cursor is None else _Cursor(cursor.ts, dict(cursor.seen))


def _start_offset(offset: Offset) -> TimestampOffset:
    """The offset to start after. Anything before 1970 means the start (and keeps the window arithmetic
    inside datetime's range); every persistence id in ``seen`` must be one the journal could store."""
    if offset is NoOffset or offset is None:
        return TimestampOffset(EPOCH)
    if not isinstance(offset, TimestampOffset):
        raise InvalidArgument(f"events_by_slices takes NoOffset or a TimestampOffset, got {offset!r}")
    for pid in offset.seen:
        check_persistence_id(pid)
    if offset.timestamp < EPOCH:
        return TimestampOffset(EPOCH)
    if offset.timestamp > LATEST:
        raise InvalidArgument(f"offset timestamp {offset.timestamp.isoformat()} is beyond year 9000")
    return offset


Face = TypeVar("Face", bound=JournalCore)


class SliceQueries(Generic[Face]):
    """What both faces' by-slice queries share: making a :class:`SliceQuery` of the journal. ``serializers``:
    decode with these instead of the journal's (see :class:`pgjournal.query.Query`)."""

    def __init__(self, journal: Face, serializers: SerializerRegistry | None = None) -> None:
        self._journal = journal
        self._serializers = serializers

    def query(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
              rows: SliceRows | None = None, *, tags: Iterable[str] | None = None) -> SliceQuery:
        return SliceQuery(self._journal, entity_type, min_slice, max_slice, offset, rows,
                          serializers=self._serializers, tags=tags)


class BySlices(SliceQueries[BlockingCore]):
    """The blocking face of by-slice queries: runs :class:`SliceQuery` steps on the journal's pool."""

    def current(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                rows: SliceRows | None = None, *, tags: Iterable[str] | None = None) -> Iterator[Any]:
        """Events (or other ``rows``) up to the safe bound seen when the query starts, then one backtracking
        pass; with ``tags``, only the events carrying any of them."""
        return self.run_current(self.query(entity_type, min_slice, max_slice, offset, rows, tags=tags))

    def run_current(self, query: SliceQuery) -> Iterator[Any]:
        """:meth:`current` of a query built (and perhaps prepared, see :mod:`pgjournal.query.from_snapshots`) by
        the caller. The bound is settled now, before the first envelope is asked for."""
        run_pooled(query.settle_step(), self._journal.read_connection)
        return drive(query.current_steps(), self._journal.read_connection)

    def live(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
             rows: SliceRows | None = None, *, tags: Iterable[str] | None = None) -> LiveQuery[Any]:
        return self.run_live(self.query(entity_type, min_slice, max_slice, offset, rows, tags=tags))

    def run_live(self, query: SliceQuery, before_poll: Callable[[], None] | None = None) -> LiveQuery[Any]:
        """:meth:`live` of a query built (and perhaps prepared) by the caller; ``before_poll`` runs before each
        poll (what it raises ends the query, see :class:`~pgjournal.runtime.live.LiveQuery`)."""
        self._journal.check_live_by_slices()

        def poll(notified: bool) -> tuple[Made[Delivery, Any], int]:
            if before_poll is not None:
                before_poll()
            deliveries, rows = run_pooled(query.poll_step(notified), self._journal.read_connection)
            return Made(deliveries, query.envelope), rows

        return self._journal.live_query(poll, entity_types={query.entity_type},
                                        settle=self._journal.read_margin + 0.005)
