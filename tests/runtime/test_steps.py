"""The sans-I/O steps: the same query logic run by the blocking driver and by the asyncio driver
(``psycopg.AsyncConnection``) delivers the same envelopes, gap fills and errors included."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support import FAST
from support.aio import connections_to
from support.faultproxy import fault_proxy
from support.tags import tags_written

from pgjournal import Journal, MissingTaggedEventsError, NoOffset, SerializationError, Source, slice_for_persistence_id
from pgjournal.query.by_slices import SliceQuery
from pgjournal.query.by_tag import TagStream
from pgjournal.runtime.live import Made
from pgjournal.runtime.steps import MORE, Pipelined, Sleep, Statement, adrive, arun, arun_pooled, run

TAGS: dict[str, Any] = dict(FAST, tag_bucket_size="Minute", tag_eventual_consistency_delay=0.05,
                            tag_gap_timeout=0.3)


@pytest.fixture
def tj(dsn: str) -> Iterator[Journal]:
    with Journal.open(dsn, **TAGS) as opened:
        yield opened


def slice_keys(envelopes: list[Any]) -> list[tuple[Any, ...]]:
    """What must agree between the faces (an offset's read_timestamp is the clock of its read: not compared)."""
    return [(e.persistence_id, e.seq_nr, e.db_timestamp, e.event, e.source, e.offset.timestamp,
             dict(e.offset.seen)) for e in envelopes]


def tag_keys(envelopes: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.persistence_id, e.seq_nr, e.tag_pid_sequence_nr, e.timestamp, e.offset, e.event, e.source)
            for e in envelopes]




async def async_slices(journal: Journal, dsn: str, entity_type: str) -> list[Any]:
    query = SliceQuery(journal, entity_type, 0, 1023, NoOffset)
    async with connections_to(dsn)() as aconn:
        await arun(query.settle_step(), aconn)
    return [e async for e in adrive(query.current_steps(), connections_to(dsn))]


async def async_tags(journal: Journal, dsn: str, tag: str) -> list[Any]:
    stream = TagStream(journal, tag, NoOffset, live=False)
    return [e async for e in adrive(stream.current_steps(), connections_to(dsn))]


def insert(journal: Journal, pid: str, seq_nr: int, seconds_ago: float) -> None:
    """An event written around the write path, with a chosen db_timestamp (an order the write path never
    produces: a later event earlier in time than its predecessor)."""
    with journal.connection() as conn:
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
            "adapter_manifest, event_ser_id, event_ser_manifest, event_payload) "
            "VALUES (%s, 'Cart', %s, %s, now() - %s * interval '1 second', 'test', '', 31, '', %s)",
            (slice_for_persistence_id(pid), pid, seq_nr, seconds_ago, f'{{"n": {seq_nr}}}'.encode()))


def test_current_by_slices_and_by_tag_read_the_same_through_asyncio(tj: Journal, dsn: str) -> None:
    for i in range(30):
        tj.append(f"Cart|{i % 7}", [{"n": i}, {"n": i, "second": True}], tags=["t"] if i % 2 else [])
    # Cart|gap: event 2 is earlier in time than event 1, so the main page meets 2 first and the gate fills 1.
    insert(tj, "Cart|gap", 2, 20.0)
    insert(tj, "Cart|gap", 1, 10.0)
    time.sleep(0.15)
    sync_slices = list(tj.query.current_events_by_slices("Cart", 0, 1023))
    sync_tags = list(tj.query.current_events_by_tag("t"))
    assert len(sync_slices) == 62 and len(sync_tags) == 30
    gap = [(e.seq_nr, e.source) for e in sync_slices if e.persistence_id == "Cart|gap"]
    assert gap == [(1, Source.BACKTRACKING), (2, Source.QUERY)]

    async def read() -> tuple[list[Any], list[Any]]:
        return await async_slices(tj, dsn, "Cart"), await async_tags(tj, dsn, "t")

    async_slices_, async_tags_ = asyncio.run(read())
    assert slice_keys(async_slices_) == slice_keys(sync_slices)
    assert tag_keys(async_tags_) == tag_keys(sync_tags)


def test_a_tag_gap_is_reported_alike_through_asyncio(tj: Journal, dsn: str) -> None:
    """From NoOffset a persistence id must start at 1: its first tag row missing is a gap, searched for
    ``tag_gap_timeout`` (sleeping between searches) and then reported, by both drivers."""
    tj.append("Cart|a", [1, 2, 3], tags=["x"])
    tags_written(tj)
    with tj.connection() as conn:
        conn.execute("DELETE FROM tag_views WHERE persistence_id = 'Cart|a' AND tag_pid_sequence_nr = 1")
    time.sleep(0.15)
    with pytest.raises(MissingTaggedEventsError) as sync_error:
        list(tj.query.current_events_by_tag("x"))
    with pytest.raises(MissingTaggedEventsError) as async_error:
        asyncio.run(async_tags(tj, dsn, "x"))
    assert (async_error.value.persistence_id, async_error.value.missing) == (
        sync_error.value.persistence_id, sync_error.value.missing) == ("Cart|a", [1])


def test_a_live_poll_step_runs_on_either_driver(journal: Journal, dsn: str) -> None:
    journal.append("Cart|1", [{"n": 1}, {"n": 2}])
    time.sleep(0.15)
    sync_query = SliceQuery(journal, "Cart", 0, 1023, NoOffset)
    async_query = SliceQuery(journal, "Cart", 0, 1023, NoOffset)
    with journal.connection() as conn:
        sync_deliveries, sync_rows = run(sync_query.poll_step(False), conn)
    async_deliveries, async_rows = asyncio.run(arun_pooled(async_query.poll_step(False), connections_to(dsn)))
    sync_items = list(Made(sync_deliveries, sync_query.envelope))
    async_items = list(Made(async_deliveries, async_query.envelope))
    assert (sync_rows, slice_keys(sync_items)) == (async_rows, slice_keys(async_items))
    assert [e.seq_nr for e in async_items] == [1, 2]


def test_drivers_stream_sleep_and_raise_inside_the_step(journal: Journal, dsn: str) -> None:
    """A statement streamed in chunks (``MORE``), a sleep, and a failing statement raised where the step
    asked (the step may catch it and go on)."""

    def step() -> Any:
        chunks = [(yield Statement("SELECT g FROM generate_series(1, 7) AS g", binary=True, stream=3))]
        while chunks[-1]:
            chunks.append((yield MORE))
        assert (yield Sleep(0.01)) is None
        try:
            yield Statement("SELECT 1/0")
        except psycopg.errors.DivisionByZero:
            caught = True
        one = yield Statement("SELECT 1")
        return [[r[0] for r in c] for c in chunks], caught, one

    expected = ([[1, 2, 3], [4, 5, 6], [7], []], True, [(1,)])
    with journal.connection() as conn:
        assert run(step(), conn) == expected
    assert asyncio.run(arun_pooled(step(), connections_to(dsn))) == expected


def test_a_live_event_that_does_not_decode_is_neither_skipped_nor_repeated(journal: Journal) -> None:
    """Envelopes are made as the reader takes them: the events before an undecodable one come first, the
    undecodable one raises each time it is taken, and once its serializer is registered it comes, then the rest."""

    class Upper:
        def to_binary(self, obj: Any) -> tuple[str, bytes]:
            return "", str(obj).upper().encode()

        def from_binary(self, payload: bytes, manifest: str) -> Any:
            return payload.decode()

    journal.append("Cart|1", [{"n": 1}])
    with journal.connection() as conn:  # event 2 written with serializer 4711, which this reader lacks
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
            "adapter_manifest, event_ser_id, event_ser_manifest, event_payload) "
            "VALUES (%s, 'Cart', 'Cart|1', 2, clock_timestamp(), 'test', '', 4711, '', 'X')",
            (slice_for_persistence_id("Cart|1"),))
    journal.append("Cart|1", [{"n": 3}])
    time.sleep(0.15)
    with journal.query.events_by_slices("Cart", 0, 1023) as live:
        assert next(live).seq_nr == 1
        for _ in range(2):
            with pytest.raises(SerializationError, match="4711"):
                next(live)
        journal.serializers.register_serializer(4711, Upper())
        assert [(e.seq_nr, e.event) for e in (next(live), next(live))] == [(2, "X"), (3, {"n": 3})]


def test_a_call_runs_a_function_of_the_face_on_either_driver(journal: Journal, dsn: str) -> None:
    """``Call``: a plain function on both drivers (with the step's connection when asked), a coroutine
    function awaited by the asyncio driver and refused by the blocking one; its exception raised in the step."""
    from pgjournal.runtime.steps import Call

    def on_connection(conn: Any, value: int) -> int:
        assert conn is not None and not conn.closed
        return value * 2

    def boom() -> None:
        raise ValueError("boom")

    async def later(value: int) -> int:
        await asyncio.sleep(0)
        return value + 1

    def step(with_coroutine: bool) -> Any:
        doubled = yield Call(on_connection, (21,), connection=True)
        try:
            yield Call(boom)
        except ValueError:
            caught = True
        added = (yield Call(later, (1,))) if with_coroutine else None
        return doubled, caught, added

    with journal.connection() as conn:
        assert run(step(False), conn) == (42, True, None)
        with pytest.raises(TypeError, match="asyncio driver"):
            run(step(True), conn)
    assert asyncio.run(arun_pooled(step(True), connections_to(dsn))) == (42, True, 2)


def _advisory_waiters(conn: psycopg.Connection, key: int) -> int:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted",
                       (key,)).fetchone()
    return int(row[0]) if row else 0


def test_pipelined_statements_read_what_committed_before_them_under_read_committed(dsn: str) -> None:
    """``Pipelined``: sent together by the blocking driver, in the pipeline's one transaction. Under READ COMMITTED
    each statement reads in a snapshot taken after the one before it ran: a row committed while the first waits is
    seen by the second. Under REPEATABLE READ they share one snapshot, taken before the first, which the first
    reports (the caller's check). The asyncio driver runs them one after another: each sees what committed before
    it, whatever the isolation. The count is of rows, so each case sees those committed by the cases before it."""
    key = 4711
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE pipelined_probe (n int)")

    def step() -> Any:
        waited, counted = yield Pipelined((Statement("SELECT current_setting('transaction_isolation'), "
                                                     "pg_advisory_xact_lock(%s)::text", (key,)),
                                           Statement("SELECT count(*) FROM pipelined_probe")))
        return waited, counted

    def with_a_commit_while_it_waits(start: Any, n: int) -> Any:
        """Run ``start()`` (the step on some driver) while an advisory lock holds its first statement, commit a
        row meanwhile, then let it go on."""
        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (key,))
            result: list[Any] = []
            thread = threading.Thread(target=lambda: result.append(start()))
            thread.start()
            deadline = time.monotonic() + 30
            while _advisory_waiters(holder, key) == 0:
                assert time.monotonic() < deadline, "the pipeline never waited for the lock"
                time.sleep(0.01)
            holder.execute("INSERT INTO pipelined_probe VALUES (%s)", (n,))
            holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
            thread.join(30)
        return result[0]

    default = "read committed"

    def blocking() -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"SET default_transaction_isolation = '{default}'")
            return run(step(), conn)

    async def on_asyncio() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await aconn.execute(f"SET default_transaction_isolation = '{default}'")
            return await arun(step(), aconn)

    assert with_a_commit_while_it_waits(blocking, 1) == ([("read committed", "")], [(1,)])
    default = "repeatable read"
    assert with_a_commit_while_it_waits(blocking, 2) == ([("repeatable read", "")], [(1,)])
    assert with_a_commit_while_it_waits(lambda: asyncio.run(on_asyncio()), 3) == ([("repeatable read", "")], [(3,)])


def test_a_failed_pipelined_statement_is_raised_in_the_step_and_the_connection_goes_on(dsn: str) -> None:
    def step() -> Any:
        try:
            yield Pipelined((Statement("SELECT 1"), Statement("SELECT 1/0")))
        except psycopg.errors.DivisionByZero:
            caught = True
        after = yield Statement("SELECT 2")
        return caught, after

    with psycopg.connect(dsn, autocommit=True) as conn:
        assert run(step(), conn) == (True, [(2,)])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert asyncio.run(arun_pooled(step(), connections_to(dsn))) == (True, [(2,)])


def test_a_link_lost_during_a_pipelined_request_raises_once_and_logs_nothing(dsn: str,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The link is cut as the pipeline goes out: the step gets the connection's error, as for one statement, and
    psycopg logs nothing of its own (a second error, at the pipeline's end, used to be logged as ignored: a line
    per failed poll while a peer is cut off)."""
    def step() -> Any:
        return (yield Pipelined((Statement("SELECT 1"), Statement("SELECT 'pipelined-probe'"))))

    async def on_asyncio(through: str) -> None:
        async with await psycopg.AsyncConnection.connect(through, autocommit=True) as aconn:
            await arun(step(), aconn)

    with fault_proxy(dsn) as (proxy, through), caplog.at_level(logging.WARNING, logger="psycopg"):
        with psycopg.connect(through, autocommit=True) as conn:
            proxy.cut_on(b"pipelined-probe", forward=False)
            with pytest.raises(psycopg.OperationalError):
                run(step(), conn)
        proxy.cut_on(b"pipelined-probe", forward=False)
        with pytest.raises(psycopg.OperationalError):
            asyncio.run(on_asyncio(through))
        assert proxy.traps_sprung == 2
    assert "error ignored" not in caplog.text
