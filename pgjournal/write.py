"""The write path: one statement per ``append``, so a batch is one round trip and one transaction.

The statement finds the previous event of the persistence id, numbers the new events after it and
stamps them all with ``GREATEST(clock_timestamp(), previous + 1 µs)``, so time never goes backwards
within a persistence id. A primary-key clash means another writer was first: nothing is written.

``clock_timestamp()``, not the transaction start: it is read while the statement already holds its write
lock on the journal, which is what the visibility horizon (:mod:`pgjournal.horizon`) relies on. A
transaction that opened long before its first append therefore still stamps its events above every
horizon a reader computed before that append.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from . import metrics
from .envelope import EventEnvelope, Source
from .errors import (
    ConcurrencyConflict,
    ConfigurationError,
    InvalidArgument,
    JournalError,
    RetriesExhausted,
    WriteOutcomeUnknown,
)
from .offsets import TimestampOffset
from .slices import entity_type_of, slice_for_persistence_id
from .store.events import text_array
from .tag_write import bucket_size_recorded, prepare, record_bucket_size
from .validation import check_persistence_id, check_seq_nr, check_tags

if TYPE_CHECKING:
    from .core import JournalCore
    from .journal import Journal

@dataclass(slots=True)
class AppendPlan:
    """One append, checked, serialized and made a statement: what every face runs (the blocking pool, the
    asyncio pool, a caller's transaction) and how its result becomes envelopes."""

    pid: str
    slice: int
    entity_type: str
    events: list[Any]
    tags: tuple[str, ...]
    metadata: Any
    sql: str
    params: dict[str, Any]

    @property
    def expected(self) -> int | None:
        return self.params["expected"]  # type: ignore[no-any-return]

    def envelopes(self, rows: list[tuple[int, datetime]]) -> list[EventEnvelope]:
        """The appended events as envelopes, from the ``(seq_nr, db_timestamp)`` rows the statement returned."""
        pid, slice_, entity_type, trusted = self.pid, self.slice, self.entity_type, TimestampOffset.trusted
        return [
            EventEnvelope(pid, seq_nr, slice_, entity_type, ts, trusted(ts, ts, {pid: seq_nr}), event,
                          self.tags, self.metadata, Source.QUERY)
            for (seq_nr, ts), event in zip(sorted(rows), self.events, strict=True)
        ]


def plan_append(journal: JournalCore, persistence_id: str, events: Iterable[Any], expected_seq_nr: int | None,
                tags: Iterable[str] = (), metadata: Any = None) -> AppendPlan | None:
    """Check and serialize an append and build its statement; ``None`` when there are no events."""
    pid = check_persistence_id(persistence_id)
    if expected_seq_nr is not None:
        check_seq_nr(expected_seq_nr, "expected_seq_nr")
    tag_list = check_tags(tags)
    if isinstance(events, str | bytes | dict):
        raise InvalidArgument(f"events must be a list of events, got a single {type(events).__name__}; "
                              "wrap it in a list")
    try:
        event_list = list(events)
    except TypeError:
        raise InvalidArgument(f"events must be a list of events, got {type(events).__name__}") from None
    if not event_list:
        return None
    serializers = journal.serializers
    encoded = [serializers.serialize(event, persistence_id=pid) for event in event_list]
    meta = serializers.serialize(metadata, persistence_id=pid) if metadata is not None else None
    if journal.events.jsonb:  # Akka's JSONB payload columns take JSON only
        journal.events.check_payloads(pid, encoded, meta)
    slice_ = slice_for_persistence_id(pid)
    entity_type = entity_type_of(pid)
    params: dict[str, Any] = {
        "slice": slice_, "entity_type": entity_type, "pid": pid, "writer": journal.writer_id,
        "tags": text_array(tag_list) if tag_list else None, "expected": expected_seq_nr,
        "meta_ser_id": meta.ser_id if meta else None, "meta_manifest": meta.manifest if meta else None,
        "meta_payload": meta.payload if meta else None,
    }
    if len(encoded) == 1:
        params.update(ser_id=encoded[0].ser_id, manifest=encoded[0].manifest, payload=encoded[0].payload)
    else:
        params.update(ser_ids=[e.ser_id for e in encoded], manifests=[e.manifest for e in encoded],
                      payloads=[e.payload for e in encoded])
    sql = journal.events.append(slice_, after_latest=expected_seq_nr is None, single=len(encoded) == 1)
    if tag_list:  # tag view rows in the same statement: pgjournal.tag_write
        sql = prepare(journal, params, tag_list, len(encoded), after_latest=expected_seq_nr is None)
    return AppendPlan(pid, slice_, entity_type, event_list, tag_list, metadata, sql, params)


def refused(pid: str, exc: psycopg.Error) -> JournalError:
    """A statement the server refused for a reason that retrying will not change (privileges, a trigger, a
    constraint): the statement rolled back, so nothing was written."""
    kind = ConfigurationError if isinstance(exc, psycopg.errors.InsufficientPrivilege) else JournalError
    return kind(f"appending to {pid!r} was refused by the database: SQLSTATE {exc.sqlstate} "
                f"({_first_line(exc)}); nothing was written")


def conflict(pid: str, expected: int | None, actual: int | None) -> ConcurrencyConflict:
    """The conflict of an append after ``expected`` (``None``: after the latest); ``actual``: the highest
    sequence number stored, where it could be read."""
    first = (expected if expected is not None else (actual or 0)) + 1
    return ConcurrencyConflict(pid, first, expected_seq_nr=expected, actual_seq_nr=actual)


class EventWriter:
    """Appends events for one :class:`~pgjournal.Journal` (its connections, serializers and writer id)."""

    def __init__(self, journal: Journal, after_commit: Callable[[int, str], None] | None = None) -> None:
        self._journal = journal
        self._after_commit = after_commit
        #: The append counters' children per entity type.
        self._counters: dict[str, tuple[Any, Any]] = {}

    def append(
        self,
        persistence_id: str,
        events: Iterable[Any],
        *,
        expected_seq_nr: int | None = None,
        tags: Iterable[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        plan = plan_append(self._journal, persistence_id, events, expected_seq_nr, tags, metadata)
        if plan is None:
            return []
        before = record_bucket_size(self._journal) if plan.tags else None
        started = time.perf_counter()
        rows = self._execute(plan.pid, plan.sql, plan.params, before)
        metrics.APPEND_SECONDS.observe(time.perf_counter() - started)
        self.count(plan, rows)
        if self._after_commit is not None:
            self._after_commit(plan.slice, plan.entity_type)
        return plan.envelopes(rows)

    def count(self, plan: AppendPlan, rows: list[tuple[int, datetime]]) -> None:
        """Count a committed append (and note that its tagged events recorded the bucket size)."""
        if plan.tags:
            bucket_size_recorded(self._journal)
        counters = self._counters.get(plan.entity_type)
        if counters is None:  # labels() takes a lock and builds a key: once per entity type, not per append
            counters = self._counters[plan.entity_type] = (metrics.APPENDS.labels(plan.entity_type),
                                                           metrics.EVENTS_APPENDED.labels(plan.entity_type))
        counters[0].inc()
        counters[1].inc(len(rows))

    def _execute(self, pid: str, sql: str, params: dict[str, Any],
                 before: Callable[[psycopg.Connection], None] | None = None) -> list[tuple[int, datetime]]:
        """Run the append statement (after ``before``, in one transaction with it), retrying what may be."""
        expected = params["expected"]
        retries = self._journal.settings.append_retries
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._journal.connection() as conn:
                    rows = self._run(conn, sql, params, before)
            except psycopg.errors.UniqueViolation:
                if expected is None:
                    # No expectation was stated: number after the new highest. Each clash means another
                    # append committed, so this always ends; past append_retries, back off a little (with
                    # jitter) so a convoy of writers on one persistence id spreads out.
                    if attempt > retries:
                        time.sleep(random.uniform(0, min(0.05, 0.001 * attempt)))
                    continue
                raise self._conflict(pid, expected) from None
            except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as exc:
                if exc.sqlstate not in self._journal.dialect.retryable_sqlstates:
                    raise self._failed(pid, exc) from exc
                if attempt <= retries:
                    continue  # the statement is one transaction: running it again is safe
                raise RetriesExhausted(
                    f"appending to {pid!r} failed {attempt} attempt{'s' if attempt > 1 else ''} in a row with "
                    f"SQLSTATE {exc.sqlstate} ({_first_line(exc)}); append_retries is {retries}; nothing was "
                    "written, trying again later is safe"
                ) from exc
            except psycopg.Error as exc:  # the server answered with an error: the statement rolled back
                raise self._failed(pid, exc) from exc
            if not rows:  # expected_seq_nr is above the highest stored sequence number
                raise self._conflict(pid, expected)
            return rows

    @staticmethod
    def _run(conn: psycopg.Connection, sql: str, params: dict[str, Any],
             before: Callable[[psycopg.Connection], None] | None = None) -> list[tuple[int, datetime]]:
        try:
            cur = _append_cursor(conn)
            if before is None:
                return cur.execute(sql, params, prepare=True).fetchall()
            with conn.transaction():
                before(conn)
                rows = cur.execute(sql, params, prepare=True).fetchall()
                if not rows:  # a stale expected_seq_nr: a conflict, so nothing of this call stays
                    raise psycopg.Rollback()
                return rows
            return []
        except psycopg.OperationalError as exc:
            # No SQLSTATE: the server never answered (psycopg may say "connection socket closed" before it
            # marks the connection broken), so the statement may or may not have run.
            if conn.closed or conn.broken or exc.sqlstate is None:
                raise WriteOutcomeUnknown(
                    f"the connection was lost while appending to {params['pid']!r}; the events may or may not "
                    f"be written. Retrying with the same expected_seq_nr is safe. ({exc.__class__.__name__})"
                ) from exc
            raise

    _failed = staticmethod(refused)

    def _conflict(self, pid: str, expected: int | None) -> ConcurrencyConflict:
        try:
            actual: int | None = self._journal.by_pid.highest_seq_nr(pid)
        except (psycopg.Error, JournalError):
            actual = None
        return conflict(pid, expected, actual)


def _append_cursor(conn: psycopg.Connection) -> psycopg.Cursor[Any]:
    """The connection's cursor for append statements, kept on the (pool) connection: a new cursor per append
    cost 20-50 us of client CPU (measured, 2,000 appends), which all writer threads of a process share."""
    cur: psycopg.Cursor[Any] | None = getattr(conn, "_pgjournal_append_cursor", None)
    if cur is None or cur.closed:
        cur = conn.cursor()
        with contextlib.suppress(AttributeError):  # a connection class with __slots__: a cursor per append
            conn._pgjournal_append_cursor = cur  # type: ignore[attr-defined]
    return cur


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
