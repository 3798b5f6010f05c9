"""events_by_slices: the events of one entity type in a slice range, in (db_timestamp, seq_nr) order.

The *main* cursor pages forward by ``(db_timestamp, seq_nr, persistence_id)`` up to a safe bound: on
PostgreSQL the visibility horizon (derived from the transactions that hold a write lock on the journal,
see :mod:`pgjournal.horizon`), so it never passes a transaction that may still commit; in portable mode the clock minus
``behind_current_time``. A slower *backtracking* cursor re-reads a window behind it and finds events that
committed after the main cursor passed their timestamp.

Every envelope goes through one gate: per persistence id, an event is delivered once, and only after its
predecessor. A duplicate is dropped; an event whose predecessor was not delivered yet has the missing
events loaded by persistence id and delivered first (marked as backtracked). So a consumer sees each
event exactly once, in sequence order per persistence id, even when transactions commit out of order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import metrics
from .envelope import EventEnvelope, Source, envelope_from_row
from .errors import InvalidArgument
from .horizon import Horizon
from .offsets import NoOffset, Offset, TimestampOffset
from .polling import LiveQuery
from .slices import check_slice_range
from .timeuuid import EPOCH
from .validation import check_name, check_persistence_id

if TYPE_CHECKING:
    import psycopg

    from .journal import Journal

#: Offsets past this are refused: the cursor arithmetic needs headroom below datetime.max.
LATEST = datetime(9000, 1, 1, tzinfo=UTC)



@dataclass
class _Cursor:
    """A position in (db_timestamp, seq_nr, persistence_id) order, plus what the offset says was consumed
    at exactly ``ts``."""

    ts: datetime
    seen: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    last_pid: str = ""

    def params(self) -> dict[str, Any]:
        return {"from_ts": self.ts, "last_seq": self.last_seq, "last_pid": self.last_pid,
                "seen_pids": list(self.seen), "seen_seqs": list(self.seen.values())}

    def advance(self, pid: str, seq_nr: int, ts: datetime, *, track_seen: bool) -> None:
        if ts != self.ts:
            self.ts, self.seen = ts, {}
        if track_seen:
            self.seen[pid] = max(seq_nr, self.seen.get(pid, 0))
        self.last_seq, self.last_pid = seq_nr, pid


class SliceRows(Protocol):
    """What a by-slice query reads: rows whose first five columns are (slice, entity_type, persistence_id,
    number, db_timestamp), paged by the store's SQL, and how a row becomes what the reader receives."""

    #: Per persistence id every number is a row to deliver (events): the gate loads a missing predecessor.
    #: ``False`` (durable state, whose row is overwritten): only what was delivered is dropped.
    contiguous: bool
    #: The tables whose writers bound the visibility horizon (``None``: the journal's).
    horizon_relations: tuple[int, ...] | None

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]: ...

    def envelope(self, row: tuple[Any, ...], offset: TimestampOffset, source: Source) -> Any: ...


class EventRows:
    """The journal's events (the default rows of a :class:`SliceQuery`)."""

    contiguous = True
    horizon_relations = None

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]:
        return self._journal.events.page_sql(min_slice, max_slice)

    def envelope(self, row: tuple[Any, ...], offset: TimestampOffset, source: Source) -> EventEnvelope:
        return envelope_from_row(row, self._journal.serializers, offset=offset, source=source)


class SliceQuery:
    """The state of one events_by_slices query (or, with other ``rows``, a query of the same shape such as
    durable state's changes): cursors, the delivered map and the gate."""

    def __init__(self, journal: Journal, entity_type: str, min_slice: int, max_slice: int, offset: Offset,
                 rows: SliceRows | None = None) -> None:
        self.journal = journal
        self.settings = journal.settings
        self.entity_type = check_name(entity_type, "entity type") if entity_type != "" else ""
        check_slice_range(min_slice, max_slice)
        self.rows: SliceRows = rows if rows is not None else EventRows(journal)
        self.page_sql, self.slice_params = self.rows.page_sql(min_slice, max_slice)
        self.start = _start_offset(offset)
        self.main = _Cursor(self.start.timestamp, dict(self.start.seen))
        self.read_timestamp = self.start.read_timestamp or self.start.timestamp
        #: Highest sequence number delivered per persistence id, with its timestamp (for eviction).
        self.delivered: dict[str, tuple[int, datetime]] = {}
        #: Persistence ids whose last delivery was before this were forgotten (they cannot come back).
        self.forgotten_before = EPOCH
        self.window = timedelta(seconds=self.settings.backtracking_window)
        self.bt_behind = timedelta(seconds=self.settings.backtracking_behind_current_time)
        self.use_horizon = journal.capabilities.writer_horizon
        self.tracker = journal.horizon_tracker(self.rows.horizon_relations)
        self.lag = metrics.LIVE_LAG.labels(self.entity_type, metrics.slices_label(min_slice, max_slice))
        # Backtracking state
        self.backtracking: _Cursor | None = None
        self.bt_until = EPOCH
        self.bt_resume: datetime | None = None
        self.idle_polls = 0
        self.rows_since_backtracking = 0
        #: The last main page was full: the next one is a catch-up page (``catchup_buffer_size`` rows).
        self.behind = False

    # -- reading -------------------------------------------------------------------------------------

    def horizon(self, conn: psycopg.Connection) -> Horizon:
        return self.tracker.read(conn)

    def main_limit(self) -> int:
        """Rows of the next main page: small near the head (live latency), large while behind (catch-up)."""
        return max(self.settings.buffer_size, self.settings.catchup_buffer_size) if self.behind \
            else self.settings.buffer_size

    def fetch(self, conn: psycopg.Connection, cursor: _Cursor, until: datetime, limit: int | None = None
              ) -> list[tuple[Any, ...]]:
        params = {"entity_type": self.entity_type, "until": until, "limit": limit or self.settings.buffer_size,
                  **self.slice_params, **cursor.params()}
        # Never a generic plan: it cannot prune partitions or use the bounds, and was measured ~9x slower.
        with conn.cursor(binary=True) as cur:
            return cur.execute(self.page_sql, params, prepare=False).fetchall()

    def main_page(self, source: Source) -> tuple[list[EventEnvelope], int]:
        with self.journal.connection() as conn:
            horizon = self.horizon(conn)
            limit = self.main_limit()
            rows = self.fetch(conn, self.main, horizon.safe, limit)
            self.read_timestamp = horizon.now
            out = self.gate(conn, rows, source, main=True)
        self.behind = len(rows) >= limit
        self.after_main(len(rows), horizon)
        caught_up = len(rows) < limit
        reached = max(horizon.safe, self.main.ts) if caught_up else self.main.ts
        self.lag.set(max(0.0, (horizon.now - reached).total_seconds()))
        return out, len(rows)

    def backtracking_page(self) -> tuple[list[EventEnvelope], int]:
        assert self.backtracking is not None
        with self.journal.connection() as conn:
            rows = self.fetch(conn, self.backtracking, self.bt_until)
            out = self.gate(conn, rows, Source.BACKTRACKING, main=False)
        if len(rows) < self.settings.buffer_size:
            self.bt_resume = self.bt_until
            self.backtracking = None
        return out, len(rows)

    # -- the gate ------------------------------------------------------------------------------------

    def gate(self, conn: psycopg.Connection, rows: list[tuple[Any, ...]], source: Source, *, main: bool
             ) -> list[EventEnvelope]:
        """Deliver each row once, after its predecessor; advance the cursors."""
        predecessors = self._predecessors_of_unknown(conn, rows) if self.rows.contiguous else {}
        out: list[EventEnvelope] = []
        cursor = self.main if main else self.backtracking
        assert cursor is not None
        if not rows:
            return out
        # Per-row work is the cost of a catch-up, so the loop keeps it small: the start timestamp in the rows'
        # tzinfo (a comparison across tzinfo objects calls utcoffset on both, ~0.8 us), lookups hoisted.
        start_ts = self.start.timestamp.astimezone(rows[0][4].tzinfo)
        start_seen = self.start.seen
        delivered = self.delivered
        envelope = self._envelope
        advance = cursor.advance
        contiguous = self.rows.contiguous
        for row in rows:
            slice_, pid, seq_nr, ts = row[0], row[2], row[3], row[4]
            advance(pid, seq_nr, ts, track_seen=main)
            if ts <= start_ts and (ts < start_ts or seq_nr <= start_seen.get(pid, 0)):
                continue  # consumed before this query started (only backtracking can meet these)
            known = delivered.get(pid)
            if known is not None and seq_nr <= known[0]:
                continue  # a duplicate (backtracking, or a replayed gap)
            if contiguous:
                after = known[0] if known is not None else self._delivered_up_to(pid, seq_nr, predecessors)
                if after is None or seq_nr > after + 1:
                    out.extend(self._fill(conn, pid, slice_, after, seq_nr))
            out.append(envelope(row, source))
        return out

    def _delivered_up_to(self, pid: str, seq_nr: int, predecessors: dict[str, tuple[int, datetime]]
                         ) -> int | None:
        """For a persistence id not met yet: the sequence number known delivered before this query (or
        forgotten), ``None`` when its predecessor still has to be delivered."""
        if seq_nr == 1 or pid not in predecessors:
            return seq_nr - 1
        prev_seq, prev_ts = predecessors[pid]
        if prev_ts < max(self.start.timestamp, self.forgotten_before):
            return prev_seq
        if prev_ts == self.start.timestamp and self.start.seen.get(pid, 0) >= prev_seq:
            return prev_seq
        return None

    def _predecessors_of_unknown(self, conn: psycopg.Connection, rows: list[tuple[Any, ...]]
                                 ) -> dict[str, tuple[int, datetime]]:
        first: dict[str, tuple[int, int]] = {}
        for row in rows:
            pid, seq_nr = row[2], row[3]
            if seq_nr > 1 and pid not in self.delivered and pid not in first:
                first[pid] = (row[0], seq_nr)
        if not first:
            return {}
        query = self.journal.events.predecessors(list(first), [s for s, _ in first.values()],
                                                 [q for _, q in first.values()])
        return {pid: (seq, ts) for pid, seq, ts in conn.execute(*query).fetchall()}

    def _fill(self, conn: psycopg.Connection, pid: str, slice_: int, after: int | None, before: int
              ) -> list[EventEnvelope]:
        """Load and deliver the events of ``pid`` between what was delivered and ``before``."""
        floor = EPOCH if after is not None else max(self.start.timestamp, self.forgotten_before)
        out = []
        for row in conn.execute(*self.journal.events.between(pid, after or 0, before, floor)).fetchall():
            seq_nr, ts = row[3], row[4]
            if after is None and ts == self.start.timestamp and seq_nr <= self.start.seen.get(pid, 0):
                continue  # consumed before this query started
            out.append(self._envelope(row, Source.BACKTRACKING))
        return out

    def _envelope(self, row: tuple[Any, ...], source: Source) -> EventEnvelope:
        pid, seq_nr, ts = row[2], row[3], row[4]
        self.delivered[pid] = (seq_nr, ts)
        offset = TimestampOffset.trusted(self.main.ts, self.read_timestamp, self.main.seen)
        return self.rows.envelope(row, offset, source)

    # -- failure atomicity ---------------------------------------------------------------------------

    def checkpoint(self) -> tuple[Any, ...]:
        return (_clone(self.main), _clone(self.backtracking), dict(self.delivered), self.forgotten_before,
                self.bt_until, self.bt_resume, self.idle_polls, self.rows_since_backtracking, self.read_timestamp)

    def restore(self, saved: tuple[Any, ...]) -> None:
        (self.main, self.backtracking, self.delivered, self.forgotten_before, self.bt_until, self.bt_resume,
         self.idle_polls, self.rows_since_backtracking, self.read_timestamp) = saved

    # -- scheduling ----------------------------------------------------------------------------------

    def after_main(self, rows: int, horizon: Horizon) -> None:
        self.rows_since_backtracking += rows
        self.idle_polls = self.idle_polls + 1 if rows == 0 else 0
        self._forget(self.main.ts - self.window - self.bt_behind)
        if not self.settings.backtracking_enabled or self.backtracking is not None:
            return
        behind = self.bt_resume is None or self.main.ts - self.bt_resume > self.window / 2
        if self.idle_polls >= 5 or self.rows_since_backtracking >= 3 * self.settings.buffer_size or behind:
            self.start_backtracking(horizon)

    def start_backtracking(self, horizon: Horizon) -> None:
        earliest = self.main.ts - self.window
        start = earliest - self.bt_behind if self.bt_resume is None else max(self.bt_resume, earliest)
        start = max(start, self.start.timestamp)
        self.bt_until = min(self.main.ts + timedelta(microseconds=1), horizon.now - self.bt_behind)
        if start >= self.bt_until:
            return
        self.backtracking = _Cursor(start)
        self.idle_polls = self.rows_since_backtracking = 0

    def _forget(self, before: datetime) -> None:
        if before <= self.forgotten_before:
            return
        self.delivered = {pid: v for pid, v in self.delivered.items() if v[1] >= before}
        self.forgotten_before = before


def _clone(cursor: _Cursor | None) -> _Cursor | None:
    return None if cursor is None else _Cursor(cursor.ts, dict(cursor.seen), cursor.last_seq, cursor.last_pid)


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


class BySlices:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def current(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                rows: SliceRows | None = None) -> Iterator[EventEnvelope]:
        """Events (or other ``rows``) up to the safe bound seen when the query starts, then one backtracking
        pass."""
        return self.run_current(SliceQuery(self._journal, entity_type, min_slice, max_slice, offset, rows))

    def run_current(self, query: SliceQuery) -> Iterator[EventEnvelope]:
        """:meth:`current` of a query built (and perhaps prepared, see :mod:`pgjournal.from_snapshots`) by
        the caller."""
        with self._journal.connection() as conn:
            horizon = query.tracker.settle(conn, timeout=query.tracker.capabilities.longest_transaction)
        return self._current(query, horizon)

    def _current(self, query: SliceQuery, horizon: Horizon) -> Iterator[EventEnvelope]:
        while True:
            limit = query.main_limit()
            with self._journal.connection() as conn:
                rows = query.fetch(conn, query.main, horizon.safe, limit)
                query.read_timestamp = horizon.now
                page = query.gate(conn, rows, Source.QUERY, main=True)
            query.behind = len(rows) >= limit
            query._forget(query.main.ts - query.window - query.bt_behind)
            yield from page
            if not query.behind:
                break
        if not self._journal.settings.backtracking_enabled or query.use_horizon:
            return  # below the visibility horizon the main pages missed nothing
        # Late commits below the bound that the main pages passed: one backtracking pass catches them.
        query.backtracking = _Cursor(max(query.start.timestamp, query.main.ts - query.window - query.bt_behind))
        query.bt_until = horizon.safe
        while query.backtracking is not None:
            page, _ = query.backtracking_page()
            yield from page

    def live(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
             rows: SliceRows | None = None) -> LiveQuery[EventEnvelope]:
        return self.run_live(SliceQuery(self._journal, entity_type, min_slice, max_slice, offset, rows))

    def run_live(self, query: SliceQuery) -> LiveQuery[EventEnvelope]:
        """:meth:`live` of a query built (and perhaps prepared) by the caller."""

        def poll(notified: bool) -> tuple[list[EventEnvelope], int]:
            saved = query.checkpoint()
            try:
                if query.backtracking is None:
                    return query.main_page(Source.NOTIFIED if notified else Source.QUERY)
                late, rows = query.backtracking_page()
                if query.backtracking is not None:
                    return late, rows
                fresh, rows = query.main_page(Source.NOTIFIED if notified else Source.QUERY)
                return late + fresh, rows
            except BaseException:
                query.restore(saved)  # nothing of a failed poll was delivered: it runs again from here
                raise

        return self._journal.live_query(poll, entity_types={query.entity_type},
                                        settle=self._journal.read_margin + 0.005)
