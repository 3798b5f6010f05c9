"""The write path: one statement per ``append``, so a batch is one round trip and one transaction.

The statement finds the previous event of the persistence id, numbers the new events after it and
stamps them all with ``GREATEST(clock_timestamp(), previous + 1 µs)``, so time never goes backwards
within a persistence id. A primary-key clash means another writer was first: nothing is written.

``clock_timestamp()``, not the transaction start: it is read while the statement already holds its write
lock on the journal, which is what the visibility horizon (:mod:`pgjournal.core.horizon`) relies on. A
transaction that opened long before its first append therefore still stamps its events above every
horizon a reader computed before that append.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors
from psycopg_pool import PoolTimeout

from pgjournal.errors import (
    ConcurrencyConflict,
    DatabaseUnavailable,
    InvalidArgument,
    JournalError,
    RetriesExhausted,
)
from pgjournal.model.envelope import EventEnvelope, Source, new_envelope
from pgjournal.model.offsets import TimestampOffset
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.runtime import metrics
from pgjournal.runtime.contention import KeyedLocks
from pgjournal.runtime.steps import first_of
from pgjournal.server.dsn import mask_dsn
from pgjournal.store.binary_arrays import bytea_array
from pgjournal.store.events import int_array, text_array
from pgjournal.tags.statement_writer import (
    bucket_size_recorded,
    prepare,
    record_bucket_size,
    stamp_time,
    statement_key,
)
from pgjournal.validation import check_persistence_id, check_seq_nr, checked_tags
from pgjournal.write.failures import Failure, classify, refused, server_message, unknown

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore, JournalCore
    from pgjournal.write.pipelining import AppendPipeline
    from pgjournal.write.tag_batcher import TagBatcher

#: Persistence ids whose append targets a writer keeps (a few hundred bytes each); past it, it starts over.
TARGETS_KEPT = 50_000


class _Target:
    """What appends to one persistence id need, worked out once: its slice, entity type, metric children,
    and the last event this writer appended to it (sequence number and db_timestamp, as the database
    returned them), so the next append with that ``expected_seq_nr`` reads nothing before it inserts."""

    __slots__ = ("counts", "entity_type", "last_seq", "last_ts", "pid", "slice", "statements")

    def __init__(self, pid: str, counts: list[int]) -> None:
        self.pid = pid
        self.slice = slice_for_persistence_id(pid)
        self.entity_type = entity_type_of(pid)
        #: this entity type's append counts (pgjournal.runtime.metrics.AppendStats)
        self.counts = counts
        self.last_seq: int | None = None
        self.last_ts: datetime | None = None
        #: (after, single, tags, metadata) -> the append statement; tags: 0 none, 1 the tags column alone (the
        #: batched tag writer's); the statements with tag view rows: pgjournal.tags.statement_writer.statement_key
        self.statements: dict[tuple[Any, ...], str] = {}


@dataclass(slots=True)
class AppendPlan:
    """One append, checked, serialized and made a statement: what every face runs (the blocking pool, the
    asyncio pool, a caller's transaction) and how its result becomes envelopes."""

    target: _Target
    events: list[Any]
    tags: tuple[str, ...]
    metadata: Any
    sql: str
    params: dict[str, Any]
    #: Sets the writer's clock in ``params`` right before each attempt (tagged appends), else ``None``.
    stamp: Callable[[dict[str, Any]], None] | None

    @property
    def pid(self) -> str:
        return self.target.pid

    @property
    def slice(self) -> int:
        return self.target.slice

    @property
    def entity_type(self) -> str:
        return self.target.entity_type

    @property
    def expected(self) -> int | None:
        return self.params["expected"]  # type: ignore[no-any-return]

    def envelopes(self, rows: list[tuple[int, datetime]]) -> list[EventEnvelope]:
        """The appended events as envelopes, from the ``(seq_nr, db_timestamp)`` rows the statement returned
        (sorted in place)."""
        target, adopted, tags, metadata = self.target, TimestampOffset.adopted, self.tags, self.metadata
        pid, slice_, entity_type = target.pid, target.slice, target.entity_type
        if len(rows) == 1:  # the common append, without a comprehension's frame
            (seq_nr, ts), = rows
            (event,) = self.events
            return [new_envelope(pid, seq_nr, slice_, entity_type, ts, adopted(ts, ts, {pid: seq_nr}), event, tags,
                                 metadata, Source.QUERY)]
        rows.sort()
        return [
            new_envelope(pid, seq_nr, slice_, entity_type, ts, adopted(ts, ts, {pid: seq_nr}), event, tags,
                         metadata, Source.QUERY)
            for (seq_nr, ts), event in zip(rows, self.events, strict=True)
        ]


@functools.lru_cache(maxsize=1024)
def tags_parameter(tags: tuple[str, ...]) -> str:
    """The ``tags`` parameter of checked ``tags``: its array literal, made once per tuple (appends repeat theirs)."""
    return text_array(tags)


def plan_append(journal: JournalCore, persistence_id: str, events: Iterable[Any], expected_seq_nr: int | None,
                tags: Iterable[str] = (), metadata: Any = None) -> AppendPlan | None:
    """:func:`build` for a persistence id this writer knows nothing about (the asyncio face, a caller's
    transaction): its predecessor is read by the statement unless there is none."""
    pid = check_persistence_id(persistence_id)
    target = _Target(pid, metrics.APPEND_STATS.counts(entity_type_of(pid)))
    return build(journal, target, events, expected_seq_nr, tags, metadata)


def build(journal: JournalCore, target: _Target, events: Iterable[Any], expected_seq_nr: int | None,
          tags: Iterable[str] = (), metadata: Any = None) -> AppendPlan | None:
    """Check and serialize an append to ``target`` and build its statement; ``None`` when there are no events.
    The common append (one event, no tags or metadata) is kept lean: on 2 cores the client's CPU per append
    is throughput."""
    pid = target.pid
    if expected_seq_nr is not None and (expected_seq_nr.__class__ is not int or not 0 <= expected_seq_nr < 1 << 63):
        check_seq_nr(expected_seq_nr, "expected_seq_nr")
    tag_list = () if tags.__class__ is tuple and not tags else checked_tags(tags)
    if events.__class__ is not list:
        if isinstance(events, str | bytes | dict):
            raise InvalidArgument(f"events must be a list of events, got a single {type(events).__name__}; "
                                  "wrap it in a list")
        try:
            events = list(events)
        except TypeError:
            raise InvalidArgument(f"events must be a list of events, got {type(events).__name__}") from None
    if not events:
        return None
    event_list = list(events)  # the caller's list may change while this runs
    serialize = journal.serializers.serialize
    encoded = [serialize(event_list[0], persistence_id=pid)] if len(event_list) == 1 else [
        serialize(event, persistence_id=pid) for event in event_list]
    meta = serialize(metadata, persistence_id=pid) if metadata is not None else None
    store = journal.events
    if store.jsonb:  # Akka's JSONB payload columns take JSON only
        store.check_payloads(pid, encoded, meta)
    single = len(encoded) == 1
    params: dict[str, Any] = {
        "slice": target.slice, "entity_type": target.entity_type, "pid": pid, "writer": journal.writer_id,
        "expected": expected_seq_nr}
    # The tags and metadata parameters only when there are any (the statement leaves their columns out).
    in_statement = bool(tag_list) and not journal.settings.batched_tags  # tag view rows in the same statement
    if tag_list:
        params["tags"] = tags_parameter(tag_list)
    if meta is not None or (in_statement and not (single and len(tag_list) == 1)):
        params.update(meta_ser_id=meta.ser_id if meta else None, meta_manifest=meta.manifest if meta else None,
                      meta_payload=meta.payload if meta else None)
    if single:
        first = encoded[0]
        params["ser_id"], params["manifest"], params["payload"] = first.ser_id, first.manifest, first.payload
    else:
        # Packed here rather than as lists: psycopg's list dumpers adapt element by element, and a bytea[] in
        # text form is hex both ways (pgjournal.store.binary_arrays).
        params.update(ser_ids=int_array([e.ser_id for e in encoded]),
                      manifests=text_array([e.manifest for e in encoded]),
                      payloads=bytea_array([e.payload for e in encoded]))
    if expected_seq_nr is None:
        after = "latest"
    elif expected_seq_nr == 0 or expected_seq_nr == target.last_seq:
        # The predecessor is known (none, or this writer's own last append): the statement reads nothing.
        after = "known"
        params["prev_ts"] = target.last_ts if expected_seq_nr else None
    else:
        after = "expected"
    stamp = None
    if in_statement:  # pgjournal.tags.statement_writer
        tagged = statement_key(after, single, len(tag_list), meta is not None)
        known = target.statements.get(tagged)
        sql = prepare(journal, params, tag_list, len(encoded), after=after, statement=known)
        if known is None:
            target.statements[tagged] = sql
        stamp = stamp_time
    else:  # untagged, or the batched tag writer's (pgjournal.write.tag_batcher): the events alone, tags column set
        key = (after, single, 1 if tag_list else 0, meta is not None)
        sql = target.statements.get(key)  # type: ignore[assignment]
        if sql is None:
            sql = target.statements[key] = store.append(target.slice, after=after, single=single, tags=bool(key[2]),
                                                        meta=key[3])
    return AppendPlan(target, event_list, tag_list, metadata, sql, params, stamp)


def failed(pid: str, failure: Failure, exc: psycopg.Error) -> JournalError:
    """The error of an append to ``pid`` that failed with ``exc``, classified REFUSED or UNKNOWN
    (:mod:`pgjournal.write.failures`)."""
    if failure is Failure.UNKNOWN:
        return unknown(f"appending to {pid!r}", "the events", "Retrying with the same expected_seq_nr is safe.", exc)
    return refused(f"appending to {pid!r}", exc, pid)


def conflict(pid: str, expected: int | None, actual: int | None) -> ConcurrencyConflict:
    """The conflict of an append after ``expected`` (``None``: after the latest); ``actual``: the highest
    sequence number stored, where it could be read."""
    first = (expected if expected is not None else (actual or 0)) + 1
    return ConcurrencyConflict(pid, first, expected_seq_nr=expected, actual_seq_nr=actual)


def exhausted(pid: str, attempt: int, started: float, exc: psycopg.Error, retries: int) -> RetriesExhausted:
    return RetriesExhausted(
        f"appending to {pid!r} failed {attempt} attempt{'s' if attempt > 1 else ''} in a row over "
        f"{time.monotonic() - started:.2f} s, the last with SQLSTATE {exc.sqlstate} ({server_message(exc)}); "
        f"append_retries is {retries}; nothing was written, trying again later is safe")


class WriterRules:
    """What both faces' writers share for one journal: the plan of an append (:func:`build` on what the writer
    knows of the persistence id's last append), and what a commit or a failure means for it (counts, the
    signal after commit). A face adds how the statement runs."""

    def __init__(self, journal: JournalCore, after_commit: Callable[[int, str], None] | None = None) -> None:
        self._journal = journal
        self._after_commit = after_commit
        #: Per persistence id (see :class:`_Target`).
        self._targets: dict[str, _Target] = {}
        #: A tagged append of this writer committed (so the bucket size is recorded, see :meth:`count`).
        self._tags_recorded = False

    def _target(self, persistence_id: Any) -> _Target:
        pid = check_persistence_id(persistence_id)
        counts = metrics.APPEND_STATS.counts(entity_type_of(pid))
        if len(self._targets) >= TARGETS_KEPT:
            self._targets.clear()
        target = self._targets[pid] = _Target(pid, counts)
        return target

    def plan(self, persistence_id: str, events: Iterable[Any], expected_seq_nr: int | None, tags: Iterable[str],
             metadata: Any) -> AppendPlan | None:
        """:func:`build` on this writer's target for the persistence id (what it knows of its last append)."""
        # A persistence id seen before was checked then (the same string passes the same checks).
        target = self._targets.get(persistence_id) if persistence_id.__class__ is str else None
        if target is None:
            target = self._target(persistence_id)
        return build(self._journal, target, events, expected_seq_nr, tags, metadata)

    @staticmethod
    def failed(plan: AppendPlan) -> None:
        """An append of ``plan`` failed, or its outcome is unknown: look the predecessor up next time."""
        plan.target.last_seq = plan.target.last_ts = None

    def committed(self, plan: AppendPlan, rows: list[tuple[int, datetime]], seconds: float) -> list[EventEnvelope]:
        """``plan`` committed with ``rows``: count it, remember its last event, signal; its envelopes."""
        envelopes = plan.envelopes(rows)  # sorts the rows
        self.count(plan, rows, seconds)
        target = plan.target
        target.last_seq, target.last_ts = rows[-1]
        if self._after_commit is not None:
            self._after_commit(target.slice, target.entity_type)
        return envelopes

    def count(self, plan: AppendPlan, rows: list[tuple[int, datetime]], seconds: float = 0.0) -> None:
        """Count a committed append (and note that its tagged events recorded the bucket size)."""
        if plan.tags and not self._tags_recorded:
            bucket_size_recorded(self._journal)
            self._tags_recorded = True
        metrics.APPEND_STATS.record(plan.target.counts, len(rows), seconds)



class EventWriter(WriterRules):
    """Appends events for one :class:`~pgjournal.Journal` (its connections, serializers and writer id).

    The common append (a known persistence id, one event, no tags or metadata) is kept lean: on 2 cores the
    client's CPU per append is throughput, and a raw single-row INSERT is the yardstick (bench ``append-cpu``).
    """

    _journal: BlockingCore

    def __init__(self, journal: BlockingCore, after_commit: Callable[[int, str], None] | None = None,
                 pipeline: AppendPipeline | None = None, tag_writer: TagBatcher | None = None) -> None:
        super().__init__(journal, after_commit)
        #: Appends that would wait for a connection ride in a group commit (pgjournal.write.pipelining).
        self._pipeline = pipeline
        #: The batched tag writer (the journal's), which writes tagged appends' tag rows after them.
        self._tag_writer = tag_writer
        #: Appends of this process to one persistence id take turns (pgjournal.runtime.contention).
        self._turns = KeyedLocks()
        self._retry = journal.settings.retry_policy

    def append(
        self,
        persistence_id: str,
        events: Iterable[Any],
        *,
        expected_seq_nr: int | None = None,
        tags: Iterable[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        plan = self.plan(persistence_id, events, expected_seq_nr, tags, metadata)
        if plan is None:
            return []
        batcher = self._tag_writer if plan.tags else None
        # The first tagged append records the bucket size and tag writer in its own transaction.
        before = record_bucket_size(self._journal) if plan.tags else None
        # The batched tag writer writes the tag view rows later (pgjournal.write.tag_batcher).
        ticket = batcher.begin(plan.entity_type) if batcher is not None else 0
        started = time.perf_counter()
        try:
            rows = self._execute(plan.target.pid, plan.sql, plan.params, before, plan.stamp, plan=plan)
        except BaseException as exc:
            self.failed(plan)
            if batcher is not None:
                batcher.failed(ticket, plan.pid, plan.slice, plan.tags, exc)
            raise
        if batcher is not None:
            batcher.written(ticket, plan.pid, plan.slice, plan.tags, rows)
        return self.committed(plan, rows, time.perf_counter() - started)

    def _execute(self, pid: str, sql: str, params: dict[str, Any],
                 before: Callable[[psycopg.Connection], None] | None = None,
                 stamp: Callable[[dict[str, Any]], None] | None = None, *, plan: AppendPlan | None = None
                 ) -> list[tuple[int, datetime]]:
        """Run the append statement (after ``before``, in one transaction with it), retrying what may be. ``plan``:
        its first attempt rides in a group commit where the pipeline takes it (:mod:`pgjournal.write.pipelining`).
        ``stamp`` sets the writer's clock in ``params`` right before each attempt (tagged appends: a TimeUUID
        taken before a wait for a turn or a backoff pause would lag behind the readers' horizon).

        Threads of this process appending to ``pid`` take turns here, so they never collide in the database;
        collisions with other processes (and SERIALIZABLE's false conflicts) are retried under the journal's
        :class:`~pgjournal.runtime.contention.RetryPolicy`."""
        expected = params["expected"]
        connections = self._journal.connections
        attempt = 0
        started = time.monotonic()
        with self._turns[pid]:
            if plan is not None and self._pipeline is not None:
                rows = self._pipeline.ride(plan)
                if rows:
                    return rows
            while True:
                attempt += 1
                try:
                    conn = connections.get()
                except PoolTimeout:
                    raise DatabaseUnavailable(f"no connection to {mask_dsn(self._journal.dsn)} within "
                                              f"{self._journal.settings.connect_timeout}s") from None
                error: psycopg.Error | None = None
                try:
                    rows = self._run(conn, sql, params, before, stamp)
                except psycopg.Error as exc:
                    rows, error = [], exc
                    failure = classify(exc, retryable=self._journal.dialect.retryable_sqlstates,
                                       clash_retries=expected is None, conn=conn)
                finally:
                    connections.put(conn)
                if rows:
                    return rows
                if error is None:  # no row: expected_seq_nr is above the highest stored sequence number
                    failure = classify(None)
                if failure is Failure.CONFLICT:
                    raise self._conflict(pid, expected) from None
                assert error is not None
                if failure is Failure.RETRY:
                    # Another writer appended first (number after it), or a transient error: the statement
                    # is one transaction, running it again is safe.
                    if self._retry.should_retry(attempt, error.sqlstate):
                        continue
                    raise self._exhausted(pid, attempt, started, error) from error
                raise failed(pid, failure, error) from error

    def _exhausted(self, pid: str, attempt: int, started: float, exc: psycopg.Error) -> RetriesExhausted:
        return exhausted(pid, attempt, started, exc, self._retry.retries)

    @staticmethod
    def _run(conn: psycopg.Connection, sql: str, params: dict[str, Any],
             before: Callable[[psycopg.Connection], None] | None = None,
             stamp: Callable[[dict[str, Any]], None] | None = None) -> list[tuple[int, datetime]]:
        cur = _append_cursor(conn)
        if stamp is not None:
            stamp(params)
        # Binary results: the returned (seq_nr, db_timestamp) parse for less than their text.
        if before is None:
            return cur.execute(sql, params, prepare=True, binary=True).fetchall()
        with conn.transaction():
            before(conn)
            rows = cur.execute(sql, params, prepare=True, binary=True).fetchall()
            if not rows:  # expected_seq_nr above the highest: a conflict, so nothing of this call stays
                raise psycopg.Rollback()
            return rows
        return []

    def _conflict(self, pid: str, expected: int | None) -> ConcurrencyConflict:
        try:
            row = self._journal.run(first_of(self._journal.events.highest_seq_nr(pid)))
            actual: int | None = int(row[0]) if row else 0
        except (psycopg.Error, JournalError):
            actual = None
        return conflict(pid, expected, actual)


def _append_cursor(conn: psycopg.Connection) -> psycopg.Cursor[Any]:
    """The connection's cursor for append statements, kept on the (pool) connection: a new cursor per append
    is client CPU paid on every append (``python -m bench append-cpu``), which all writer threads of a process
    share."""
    cur: psycopg.Cursor[Any] | None = getattr(conn, "_pgjournal_append_cursor", None)
    if cur is None or cur.closed:
        cur = conn.cursor()
        with contextlib.suppress(AttributeError):  # a connection class with __slots__: a cursor per append
            conn._pgjournal_append_cursor = cur  # type: ignore[attr-defined]
    return cur
