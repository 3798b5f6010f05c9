"""``events_by_tag``: the Cassandra plugin's events-by-tag semantics on the ``tag_views`` table.

The stream reads rows in TimeUUID order (Cassandra's: ``ts_time, ts_lsb``) across the time buckets from
the offset (exclusive) or from ``tag_first_time_bucket``, and only rows older than the upper bound:
``now - tag_eventual_consistency_delay`` (on PostgreSQL, outside portable mode, also no later than the
visibility horizon (:mod:`pgjournal.core.horizon`: journal writers still open) minus that delay, so a commit
held open is waited for instead of passed), and below the watermark of every batched tag writer
(:mod:`pgjournal.write.tag_batcher`: tag rows it has not written yet are waited for, even if it died). One
keyset query walks every bucket up to the current one, so empty buckets cost nothing.

Per persistence id the stream remembers the last ``tag_pid_sequence_nr`` delivered and so delivers each
event once and per persistence id in order:

* a lower number is a duplicate and dropped;
* a higher one than expected is a gap: the missing numbers are looked up (by an index on
  ``(tag_name, persistence_id, tag_pid_sequence_nr)``, never before the query's start offset) and delivered
  first; while any is missing the stream waits, and after ``tag_gap_timeout`` fails with
  :class:`MissingTaggedEventsError` naming tag, persistence id and numbers (more than 5000 missing: at once);
* a persistence id met for the first time must start at 1 for a query from ``NoOffset``. With an offset its
  first number is accepted when the row's bucket is in the past (or the scan timeout is 0); in the current
  bucket its lower numbers are searched for ``tag_new_persistence_id_scan_timeout``, then it is accepted.
  A query starting in the current bucket first scans it once for each persistence id's lowest number.

Back tracking re-reads, every ``tag_back_track_interval``, the last ``tag_back_track_period`` behind the
cursor, and every ``tag_back_track_long_interval`` the ``tag_back_track_long_period`` ("max": from the start
of the previous bucket), without payloads; rows the stream has not delivered (late commits) are loaded and
delivered. The short back track rests on the assumption that a row is visible by the time the upper bound is
``tag_back_track_period`` past its timestamp (a row later than that is the long back track's), so of its window
it re-reads only what the cursor passed within that period of the bound it read under: rows a catch-up read long
after they were written cannot have been invisible then, and are not read again each second.

Each envelope's ``offset`` is the stream position after it (a late event carries the cursor's position, not its
own older TimeUUID), so resuming from any offset neither repeats nor skips what the cursor had passed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from pgjournal.buckets import BucketSize, parse_first_time_bucket
from pgjournal.core.journal_core import BlockingCore, JournalCore
from pgjournal.errors import InvalidArgument, MissingTaggedEventsError, SerializationError
from pgjournal.model.envelope import Source
from pgjournal.model.offsets import NoOffset, Offset, TimeBasedUUID
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.model.timeuuid import EPOCH, UUID_EPOCH_OFFSET, from_key, ms_of_ticks, ticks_of_ms
from pgjournal.query.gate import DUPLICATE, NEXT, Gate
from pgjournal.runtime.live import LiveQuery, Made
from pgjournal.runtime.steps import MORE, Sleep, Step, drive, drive_ahead, run_pooled, statement
from pgjournal.store import tags as store
from pgjournal.tags.statement_writer import bucket_size
from pgjournal.tags.watermark import complete_before_step
from pgjournal.validation import check_name

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry

MAX_MISSING = 5000
#: Rows per chunk when a page streams in (> 1; chunked results need libpq 17), else whole pages. Whole pages are
#: the default: psycopg hands a streamed row out one at a time, dearer per row than reading a page at once, and
#: on a shared machine that client CPU costs more than the overlap with the server gains (``python -m bench
#: tags-catchup``); a page read whole is also prepared once.
STREAM_CHUNK = 1
_MIN_LSB = -(2**63)
_MAX_LSB = 2**63 - 1


class TagEnvelope(msgspec.Struct, weakref=False):
    """An event read by tag. ``offset`` is where the stream stands after it (see the module docstring);
    ``timestamp`` is the event's own TimeUUID and ``db_timestamp`` its time (the writer's clock). Both are made
    when asked: a catch-up keeps only their integers (``pos`` ``None``: the stream stood at the event itself).

    A :class:`msgspec.Struct`: a reader makes one per event, and its ``__init__`` (in C) stores the fields for
    less than a Python ``__init__`` does; equal when tag, persistence id, tag sequence number and TimeUUID are."""

    tag: str
    persistence_id: str
    seq_nr: int
    tag_pid_sequence_nr: int
    _ticks: int
    _lsb: int
    _pos: tuple[int, int] | None
    event: Any
    metadata: Any
    writer_uuid: str
    source: Source

    @property
    def timestamp(self) -> uuid.UUID:
        return from_key(self._ticks, self._lsb)

    @property
    def offset(self) -> TimeBasedUUID:
        pos = self._pos
        return TimeBasedUUID(from_key(self._ticks, self._lsb) if pos is None else from_key(*pos))

    @property
    def db_timestamp(self) -> datetime:
        return EPOCH + timedelta(microseconds=(self._ticks - UUID_EPOCH_OFFSET) // 10)

    @property
    def slice(self) -> int:
        return slice_for_persistence_id(self.persistence_id)

    @property
    def entity_type(self) -> str:
        return entity_type_of(self.persistence_id)

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.tag,)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TagEnvelope):
            return NotImplemented
        return (self.tag, self.persistence_id, self.tag_pid_sequence_nr, self._ticks, self._lsb) == (
            other.tag, other.persistence_id, other.tag_pid_sequence_nr, other._ticks, other._lsb)

    def __hash__(self) -> int:
        return hash((self.tag, self.persistence_id, self.tag_pid_sequence_nr))

    def __repr__(self) -> str:
        return (f"TagEnvelope(tag={self.tag!r}, persistence_id={self.persistence_id!r}, seq_nr={self.seq_nr}, "
                f"tag_pid_sequence_nr={self.tag_pid_sequence_nr}, timestamp={self.timestamp}, "
                f"event={self.event!r}, source={self.source.value})")


@dataclass
class _Gap:
    """A persistence id whose next numbers are missing; ``pending`` rows wait behind them."""

    pid: str
    missing: set[int]
    deadline: float
    fail: bool  # gap (fail at the deadline) or a new persistence id's scan (accept at the deadline)
    pending: list[tuple[Any, ...]]
    waited: float


def _ticks_of(dt: datetime) -> int:
    return (dt - EPOCH) // timedelta(microseconds=1) * 10 + UUID_EPOCH_OFFSET


def _ticks_in(seconds: float) -> int:
    """A duration in TimeUUID ticks (100 ns)."""
    return round(seconds * 10_000_000)


def _none_delivered(_pid: str, _tag_seq: int) -> int:
    """Back tracking's policy: of a persistence id not met yet nothing was delivered."""
    return 0


def _blocking(journal: JournalCore) -> BlockingCore:
    if not isinstance(journal, BlockingCore):
        raise InvalidArgument(f"a TagStream of {type(journal).__name__} runs its steps on that face's driver (a "
                              "blocking journal's pool is what poll() and a bucket size looked up use)")
    return journal


class TagStream:
    """The state of one events_by_tag query. Its polls are steps (:mod:`pgjournal.runtime.steps`): ``poll_step`` for a
    live query, ``current_steps`` for a current one; ``poll()`` runs one on the journal's pool."""

    def __init__(self, journal: JournalCore, tag: str, offset: Offset, *, live: bool,
                 serializers: SerializerRegistry | None = None, size: BucketSize | None = None) -> None:
        """``journal``: of either face. ``size``: the tag view's bucket size, checked against the database (the
        asyncio face checks it with :func:`pgjournal.buckets.check_bucket_size_step`); ``None``: looked up on the
        pool of a blocking journal."""
        self._journal = journal
        self._serializers = serializers if serializers is not None else journal.serializers
        self._tracker = journal.horizon_tracker()
        self._tag = check_name(tag, "tag")
        settings = journal.settings
        if size is None:
            size = bucket_size(_blocking(journal), record=False)
        self._size: BucketSize = size
        self._delay = settings.tag_eventual_consistency_delay
        self._gap_timeout = settings.tag_gap_timeout
        self._scan_timeout = settings.tag_new_persistence_id_scan_timeout
        self._limit = settings.buffer_size
        self._live = live
        if offset is NoOffset or offset is None:
            first = parse_first_time_bucket(settings.tag_first_time_bucket, self._size)
            self._start = (ticks_of_ms(first) - 1, _MAX_LSB)
            self._using_offset = False
        elif isinstance(offset, TimeBasedUUID):
            self._start = offset.key
            self._using_offset = True
        else:
            raise InvalidArgument(f"events_by_tag needs a TimeBasedUUID offset or NoOffset, got {offset!r}")
        self._pos: tuple[int, int] = self._start
        #: Per persistence id the highest tag sequence number delivered (never forgotten).
        self._gate: Gate[None] = Gate()
        self._gap: _Gap | None = None
        now = time.monotonic()
        self._next_short = now + settings.tag_back_track_interval
        self._next_long = now + settings.tag_back_track_long_interval
        self._short_interval = settings.tag_back_track_interval
        self._long_interval = settings.tag_back_track_long_interval
        self._short_period = settings.tag_back_track_period
        self._long_period = settings.tag_back_track_long_period_seconds
        self._upper: int | None = None  # fixed for a current query
        #: A live query: the upper bound the last page was read under; the key ranges the cursor passed within
        #: ``tag_back_track_period`` of the bound they were read under (the only ones the short back track
        #: re-reads), recorded up to ``_recorded``.
        self._read_upper: int | None = None
        self._near: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self._recorded = self._start
        #: A live query's last upper bound while pages below it came back full (see _upper_bound_step).
        self._live_upper: int | None = None
        self._initial_scan_done = False
        self.exhausted = False
        #: Envelopes the last poll delivered (a current query pauses while a gap is open and none came).
        self._delivered_last = 0

    # -- helpers -------------------------------------------------------------------------------------

    def _bucket(self, ticks: int) -> int:
        return self._size.bucket_of(ms_of_ticks(ticks))

    def _bound(self, key: tuple[int, int]) -> tuple[int, int, int]:
        return self._bucket(key[0]), key[0], key[1]

    def _upper_bound_step(self) -> Step[int]:
        if self._upper is not None:
            return self._upper
        if self._live_upper is not None and self._pos[0] < self._live_upper:
            # Catching up (the last page came back full): what was settled below the last bound stays settled,
            # so the rows below it are read first, without asking the horizon and the watermark per page.
            return self._live_upper
        tracker = self._tracker
        horizon = (yield from tracker.read_step()) if self._live else (
            yield from tracker.settle_step(timeout=tracker.capabilities.longest_transaction))
        upper = _ticks_of(horizon.safe) - _ticks_in(self._delay)
        # Tag rows that batched tag writers still owe (pgjournal.write.tag_batcher): never read past them.
        complete = yield from complete_before_step(self._journal.settings)
        if complete is not None:
            upper = min(upper, _ticks_of(complete) - 1)
        if not self._live:
            self._upper = upper
        return upper

    def _decode(self, row: Sequence[Any], pos: tuple[int, int] | None, source: Source) -> TagEnvelope:
        ticks, lsb, pid, tag_seq, seq_nr, ser_id, manifest, payload, meta_id, _, _, writer = row
        event = self._deserialize(ser_id, manifest, payload, pid, seq_nr)
        metadata = None if meta_id is None else self._metadata(row)
        return TagEnvelope(self._tag, pid, seq_nr, tag_seq, ticks, lsb, pos, event, metadata, writer, source)

    def _deserialize(self, ser_id: int, manifest: str, payload: bytes, pid: str, seq_nr: int) -> Any:
        serializers = self._serializers
        try:  # the tag is named in an error only: a second decode, to build the message where it is needed
            return serializers.deserialize(ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr)
        except SerializationError:
            return serializers.deserialize(ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr,
                                           where=f" of persistence id {pid!r} seq_nr {seq_nr} (tag {self._tag!r})")

    def _metadata(self, row: Sequence[Any]) -> Any:
        pid, seq_nr, meta_id, meta_manifest, meta = row[2], row[4], row[8], row[9], row[10]
        serializers = self._serializers
        try:
            return serializers.deserialize(meta_id, meta_manifest or "", meta, persistence_id=pid, seq_nr=seq_nr)
        except SerializationError:
            where = f" of the metadata of persistence id {pid!r} seq_nr {seq_nr} (tag {self._tag!r})"
            return serializers.deserialize(meta_id, meta_manifest or "", meta, where=where, persistence_id=pid,
                                           seq_nr=seq_nr)

    def maker(self, source: Source) -> Callable[[Any], TagEnvelope]:
        """How a poll's deliveries become envelopes, each when it is taken (:class:`~pgjournal.runtime.live.Made`:
        a page of thousands is not kept alive at once, the garbage collector's cost). A delivery is a row the
        main cursor took (its envelope from ``source``, the stream standing at it) or ``(row, position, source)``
        (gaps, back tracking: :meth:`_decode`). Payloads are read by the registry's bulk reader
        (:meth:`~pgjournal.codec.serialization.SerializerRegistry.bulk_reader`), the tag named in an error."""
        tag, decode, deserialize, metadata = self._tag, self._decode, self._deserialize, self._metadata
        read, envelope = self._serializers.bulk_reader(deserialize), TagEnvelope

        def make(delivery: Any) -> TagEnvelope:
            if delivery[0].__class__ is tuple:
                return decode(*delivery)
            ticks, lsb, pid, tag_seq, seq_nr, ser_id, manifest, payload, meta_id, _, _, writer = delivery
            event = read(ser_id, manifest, payload, pid, seq_nr)
            return envelope(tag, pid, seq_nr, tag_seq, ticks, lsb, None, event,
                            None if meta_id is None else metadata(delivery), writer, source)

        return make

    def _in_current_bucket(self, ticks: int) -> bool:
        return self._bucket(ticks) >= self._size.bucket_of(int(time.time() * 1000))

    # -- delivery ------------------------------------------------------------------------------------

    def _deliver_rows(self, rows: list[tuple[Any, ...]], source: Source, out: list[Any]) -> None:
        """Deliver rows of one pid in tag sequence order, skipping what was delivered already."""
        gate = self._gate
        for row in sorted(rows, key=lambda r: r[3]):
            pid, tag_seq = row[2], row[3]
            if gate.judge(pid, tag_seq, _none_delivered)[0] is DUPLICATE:
                continue
            key = (row[0], row[1])
            if key > self._pos:
                self._pos = key
            gate.deliver(pid, tag_seq, None)
            out.append((row, self._pos, source))

    def _unknown_at(self, ticks: int) -> Any:
        """The gate's policy for a persistence id met for the first time in a row at ``ticks``: from NoOffset it
        must start at 1; from an offset its earlier events lie before the offset when the row's bucket is in
        the past (or there is no scan), else they are searched for (from 1)."""

        def unknown(_pid: str, tag_seq: int) -> int:
            if tag_seq == 1:
                return 0
            if self._using_offset and (self._scan_timeout == 0 or not self._in_current_bucket(ticks)):
                return tag_seq - 1
            return 0

        return unknown

    def _check_row_step(self, row: tuple[Any, ...], source: Source, out: list[Any]) -> Step[bool]:
        """Handle one row in stream order; False when the stream must wait (a gap is open)."""
        pid, tag_seq = row[2], row[3]
        known = self._gate.last(pid) is not None
        verdict, after = self._gate.judge(pid, tag_seq, self._unknown_at(row[0]))
        if verdict is DUPLICATE:
            return True
        if verdict is NEXT:
            self._deliver_rows([row], source, out)
            return True
        # A gap: a known persistence id (or any, from NoOffset) fails after tag_gap_timeout; a new one's scan
        # from an offset is accepted after tag_new_persistence_id_scan_timeout.
        fail = known or not self._using_offset
        return (yield from self._open_gap_step(pid, after + 1, row, fail=fail,  # type: ignore[operator]
                                               timeout=self._gap_timeout if fail else self._scan_timeout,
                                               source=source, out=out))

    def _open_gap_step(self, pid: str, first_missing: int, row: tuple[Any, ...], *, fail: bool, timeout: float,
                       source: Source, out: list[Any]) -> Step[bool]:
        wanted = set(range(first_missing, row[3]))
        if fail and len(wanted) > MAX_MISSING:
            raise MissingTaggedEventsError(self._tag, pid, sorted(wanted),
                                           f"(more than {MAX_MISSING} missing: not searched)")
        self._gap = _Gap(pid, wanted, time.monotonic() + timeout, fail, [row], timeout)
        return (yield from self._search_gap_step(source, out))

    def _search_gap_step(self, source: Source, out: list[Any]) -> Step[bool]:
        gap = self._gap
        assert gap is not None
        found = yield statement(store.missing(self._tag, gap.pid, min(gap.missing), max(gap.missing) + 1,
                                              self._bound(self._start)))
        found = [r for r in found if r[3] in gap.missing]
        gap.missing -= {r[3] for r in found}
        gap.pending.extend(found)
        if gap.missing and time.monotonic() < gap.deadline:
            return False
        if gap.missing and gap.fail:
            self._gap = None
            raise MissingTaggedEventsError(self._tag, gap.pid, sorted(gap.missing),
                                           f"after waiting tag_gap_timeout ({gap.waited}s)")
        # Found everything, or a new persistence id whose scan time is up: deliver from the lowest found.
        self._gap = None
        pending = sorted({r[3]: r for r in gap.pending}.values(), key=lambda r: r[3])
        if gap.missing and pending:
            self._gate.assume(gap.pid, pending[0][3] - 1, None)
        self._deliver_rows(pending, source, out)
        return True

    # -- the main cursor and back tracking -----------------------------------------------------------

    def _initial_scan_step(self) -> Step[None]:
        """Starting from an offset in the current bucket: learn each persistence id's lowest number in it."""
        self._initial_scan_done = True
        if not (self._using_offset and self._live and self._scan_timeout > 0 and self._in_current_bucket(
                self._start[0])):
            return
        rows = yield statement(store.lowest_in_bucket(self._tag, self._bucket(self._start[0]), self._start))
        for pid, lowest in rows:
            self._gate.assume(pid, lowest - 1, None)

    def poll(self, notified: bool = False) -> tuple[Made[Any, TagEnvelope], int]:
        """:meth:`poll_step` on a connection of the journal's pool."""
        return run_pooled(self.poll_step(notified), _blocking(self._journal).connection)

    def poll_step(self, notified: bool = False) -> Step[tuple[Made[Any, TagEnvelope], int]]:
        """The next envelopes (made as they are taken, see :meth:`maker`) and the number of rows read; on an
        exception the state is as before (the shared live loop retries a poll that lost the database, and
        nothing of it was delivered)."""
        deliveries, rows = yield from self._deliveries_step(notified)
        return Made(deliveries, self.maker(Source.NOTIFIED if notified else Source.QUERY)), rows

    def _deliveries_step(self, notified: bool) -> Step[tuple[list[Any], int]]:
        """A poll's deliveries (see :meth:`maker`) and rows read; on an exception the state is as before."""
        saved = self._checkpoint()
        try:
            deliveries, rows = yield from self._poll_step(notified)
        except BaseException:
            self._restore(saved)
            raise
        self._gate.commit()
        self._delivered_last = len(deliveries)
        return deliveries, rows

    def current_steps(self) -> Iterator[Step[Iterator[TagEnvelope]]]:
        """A current query: polls until the bound; while a gap is open and a poll brought nothing, the next one
        waits a moment (up to 50 ms, never past the gap's deadline)."""
        pause = 0.0
        while True:
            yield self._paused_poll_step(pause)
            if self.exhausted and self._gap is None:
                return
            pause = 0.0
            if not self._delivered_last and self._gap is not None:
                pause = min(0.05, max(0.001, self._gap.deadline - time.monotonic()))

    def _paused_poll_step(self, pause: float) -> Step[Iterator[TagEnvelope]]:
        if pause:
            yield Sleep(pause)
        deliveries, _rows = yield from self._deliveries_step(False)
        # Made by map as they are taken (cheaper per envelope than Made, which a live query needs: there an
        # envelope that cannot be made stays first; a current query ends at it).
        return map(self.maker(Source.QUERY), deliveries)

    def _checkpoint(self) -> tuple[Any, ...]:
        gap = self._gap
        gap_copy = None if gap is None else _Gap(gap.pid, set(gap.missing), gap.deadline, gap.fail,
                                                 list(gap.pending), gap.waited)
        self._gate.begin()  # the gate records what the poll changes (not a copy of every persistence id met)
        return (self._pos, gap_copy, self._next_short, self._next_long, self._initial_scan_done, self._upper,
                self._live_upper, self.exhausted, list(self._near), self._recorded, self._read_upper)

    def _restore(self, saved: tuple[Any, ...]) -> None:
        (self._pos, self._gap, self._next_short, self._next_long, self._initial_scan_done, self._upper,
         self._live_upper, self.exhausted, self._near, self._recorded, self._read_upper) = saved
        self._gate.undo()

    def _poll_step(self, notified: bool) -> Step[tuple[list[Any], int]]:
        out, read, caught_up = yield from self._read_step(notified)
        if self._live:
            self._passed()
            if caught_up:
                yield from self._back_track_step(out)
        return out, read

    def _passed(self) -> None:
        """Record what the cursor passed since the last record that may have hidden a late commit when it was
        read: the part within ``tag_back_track_period`` of the bound it was read under (none yet: all of it)."""
        low, self._recorded = self._recorded, self._pos
        if self._read_upper is not None:
            low = max(low, (self._read_upper - _ticks_in(self._short_period), _MIN_LSB))
        if low >= self._pos:
            return
        if self._near and self._near[-1][1] >= low:
            self._near[-1] = (self._near[-1][0], self._pos)
        else:
            self._near.append((low, self._pos))

    def _read_step(self, notified: bool) -> Step[tuple[list[Any], int, bool]]:
        """A poll's reading: envelopes, rows read, and whether it reached the bound with no gap open."""
        out: list[Any] = []
        source = Source.NOTIFIED if notified else Source.QUERY
        if not self._initial_scan_done:
            yield from self._initial_scan_step()
        if self._gap is not None and not (yield from self._search_gap_step(Source.BACKTRACKING, out)):
            return out, (yield from self._while_gap_open_step()), False
        upper = yield from self._upper_bound_step()
        if upper <= self._pos[0]:
            self.exhausted = True
            return out, 0, False
        if self._live:
            self._passed()  # what a gap's search delivered was read under the bound before this one
            self._read_upper = upper
        # Streamed (STREAM_CHUNK), rows arrive in chunks while earlier ones are taken. A row that needs more
        # queries ends the fast path: the rest of the page is read first (one connection runs one query at a
        # time), then handled below. Envelopes are made later, as they are taken (see maker).
        size = STREAM_CHUNK
        rows = yield statement(store.page(self._tag, self._bound(self._pos), self._bucket(upper), upper, self._limit),
                               binary=True, stream=size if size > 1 else 0)
        take_leading = self._gate.take_leading
        read = 0
        rest: list[tuple[Any, ...]] = []
        while rows and not rest:
            taken = take_leading(rows, None)  # the common case, here: each row the next of its persistence id
            if taken:
                out.extend(rows[:taken] if taken < len(rows) else rows)
                last = rows[taken - 1]
                self._pos = (last[0], last[1])
            rest = rows[taken:]
            read += len(rows)
            rows = yield MORE
        while rows:
            rest.extend(rows)
            read += len(rows)
            rows = yield MORE
        for row in rest:
            if not (yield from self._check_row_step(row, source, out)):
                return out, (yield from self._while_gap_open_step()), False  # a gap: wait, re-read from this row
            key = (row[0], row[1])
            if key > self._pos:
                self._pos = key
        # A full page: more rows may lie below this bound; the next poll reads them before asking for a new one.
        self._live_upper = upper if self._live and read >= self._limit else None
        caught_up = read < self._limit and self._gap is None
        if caught_up:
            self.exhausted = True
        return out, read, caught_up

    def _while_gap_open_step(self) -> Step[int]:
        """Live: search again soon (the shared loop re-polls at once after a full page), not after a whole
        refresh interval; a new persistence id's scan is typically much shorter than that."""
        if not self._live or self._gap is None:
            return 0
        yield Sleep(max(0.0, min(0.05, self._gap.deadline - time.monotonic())))
        return self._limit

    def _back_track_step(self, out: list[Any]) -> Step[None]:
        now = time.monotonic()
        window = max((self._pos[0] - _ticks_in(self._short_period), _MIN_LSB), self._start)
        self._near = [(max(low, window), high) for low, high in self._near if high > window]
        if now >= self._next_long:
            self._next_long = now + self._long_interval
            self._next_short = now + self._short_interval
            period = self._long_period
            if period is None:  # "max": from the start of the previous bucket
                start = (ticks_of_ms(self._bucket(self._pos[0]) - self._size.millis) - 1, _MAX_LSB)
            else:
                start = (self._pos[0] - _ticks_in(period), _MIN_LSB)
            spans = [(max(start, self._start), self._pos)]
        elif now >= self._next_short:
            self._next_short = now + self._short_interval
            spans = list(self._near)
        else:
            return
        for low, high in spans:
            if not (yield from self._back_track_span_step(low, min(high, self._pos), out)):
                return

    def _back_track_span_step(self, start: tuple[int, int], end: tuple[int, int], out: list[Any]) -> Step[bool]:
        """Deliver the rows between ``start`` and ``end`` the stream has not delivered; False when a gap opened."""
        while start < end and self._gap is None:
            keys = yield statement(store.keys(self._tag, self._bound(start), self._bound(end), self._limit))
            late: dict[str, list[int]] = {}
            for _ticks, _lsb, pid, tag_seq in keys:
                if self._gate.judge(pid, tag_seq, _none_delivered)[0] is not DUPLICATE:
                    late.setdefault(pid, []).append(tag_seq)
            for pid, numbers in late.items():
                rows = yield statement(store.load(self._tag, pid, numbers, self._bound(self._start)))
                for row in rows:
                    if not (yield from self._check_row_step(row, Source.BACKTRACKING, out)):
                        return False  # a gap opened: the next poll continues the search
            if len(keys) < self._limit:
                return True
            start = (keys[-1][0], keys[-1][1])
        return self._gap is None


class ByTag:
    """The blocking face of events_by_tag: runs :class:`TagStream` steps on the journal's pool."""

    def __init__(self, journal: BlockingCore, serializers: SerializerRegistry | None = None) -> None:
        self._journal = journal
        self._serializers = serializers

    def current(self, tag: str, offset: Offset = NoOffset) -> Iterator[TagEnvelope]:
        """Events with ``tag`` after ``offset`` up to now minus the eventual consistency delay (at start)."""
        stream = TagStream(self._journal, tag, offset, live=False, serializers=self._serializers)
        run = drive_ahead if self._journal.reads_ahead else drive
        return run(stream.current_steps(), self._journal.connection)

    def live(self, tag: str, offset: Offset = NoOffset) -> LiveQuery[TagEnvelope]:
        """Events with ``tag`` after ``offset``, polling for new ones until ``close()``."""
        stream = TagStream(self._journal, tag, offset, live=True, serializers=self._serializers)
        return self._journal.live_query(stream.poll, entity_types=None, ahead=stream.poll_step)
