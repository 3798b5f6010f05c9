"""Reading ahead: the next page's statement runs on the server while the reader takes the last page's items, on
both faces, for a current query (``drive_ahead``, ``adrive_ahead``) and a live one in a catch-up (``LiveQuery``,
``AsyncLiveQuery``); what a reader that stops early, a failing step and a one-connection pool leave.

The overlap is shown, not timed: the next step's statement waits on an advisory lock the test holds, and the test
finds it waiting in ``pg_stat_activity`` while it still holds the first page's first item."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
import pytest
from support.aio import connections_to
from support.eventually import eventually
from support.tags import TAGS, tags_written

from pgjournal import Journal
from pgjournal.aio.live import AsyncLiveQuery
from pgjournal.runtime.live import LiveQuery, Schedule
from pgjournal.runtime.steps import (
    Abandoned,
    ReadAhead,
    Statement,
    Step,
    adrive_ahead,
    arun_pooled,
    drive_ahead,
    run_pooled,
)

LOCK = 770_001
PAGE = 5


def connections(dsn: str, out: list[int]) -> Any:
    """A factory of blocking connections to ``dsn``, counting those out in ``out[0]``."""

    @contextlib.contextmanager
    def connection() -> Iterator[psycopg.Connection]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            out[0] += 1
            try:
                yield conn
            finally:
                out[0] -= 1

    return connection


def page(number: int, *, locked: bool = False, fails: bool = False) -> Step[list[int]]:
    """``PAGE`` items of page ``number``; ``locked``: its statement first waits for the test's advisory lock."""
    if fails:
        yield Statement("SELECT 1 / 0")
    wait = "pg_advisory_lock_shared(%s::bigint), pg_advisory_unlock_shared(%s::bigint), " if locked else ""
    rows = yield Statement(f"SELECT {wait}g FROM generate_series(%s::int, %s::int) AS g",
                           ((LOCK, LOCK) if locked else ()) + (number * PAGE, number * PAGE + PAGE - 1))
    return [row[-1] for row in rows]


def pages(count: int, *, locked: int | None = None, fails: int | None = None) -> Iterator[Step[list[int]]]:
    for number in range(count):
        yield page(number, locked=number == locked, fails=number == fails)


def waiting_on_the_lock(server: psycopg.Connection) -> bool:
    return bool(server.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                               "AND NOT granted", (LOCK,)).fetchone()[0])  # type: ignore[index]


@contextlib.contextmanager
def lock_held(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        try:
            yield holder
        finally:
            holder.execute("SELECT pg_advisory_unlock_all()")


def test_the_next_page_runs_on_the_server_while_the_reader_holds_this_one(dsn: str) -> None:
    out = [0]
    with lock_held(dsn) as holder:
        items = drive_ahead(pages(3, locked=1), connections(dsn, out))
        assert next(items) == 0
        eventually(lambda: waiting_on_the_lock(holder), "page 1's statement waiting, sent before it was asked for")
        holder.execute("SELECT pg_advisory_unlock_all()")
        assert [0, *items] == list(range(3 * PAGE))
    assert out[0] == 0


def test_a_reader_that_stops_early_gives_back_the_connection_of_the_page_read_ahead(dsn: str) -> None:
    out = [0]
    items = drive_ahead(pages(4), connections(dsn, out))
    assert next(items) == 0
    del items  # as a loop left with break drops it: its pages' generator is closed
    assert out[0] == 0, "the page read ahead holds its connection only while its step runs"


def test_a_step_that_fails_ahead_raises_where_its_items_would_come(dsn: str) -> None:
    items = drive_ahead(pages(3, fails=1), connections(dsn, [0]))
    taken = [next(items) for _ in range(PAGE)]
    assert taken == list(range(PAGE))
    with pytest.raises(psycopg.errors.DivisionByZero):
        next(items)


def test_the_asyncio_face_reads_ahead_too(dsn: str) -> None:
    async def read(holder: psycopg.Connection) -> list[int]:
        items = adrive_ahead(pages(3, locked=1), connections_to(dsn))
        first = await items.__anext__()
        await asyncio.to_thread(eventually, lambda: waiting_on_the_lock(holder), "page 1 sent ahead")
        holder.execute("SELECT pg_advisory_unlock_all()")
        return [first, *[item async for item in items]]

    with lock_held(dsn) as holder:
        assert asyncio.run(read(holder)) == list(range(3 * PAGE))


class FullPages:
    """A live poll of full pages (the schedule polls again at once: a catch-up) up to ``count``, then empty ones;
    ``locked``: the poll of that page waits for the test's lock."""

    def __init__(self, count: int, locked: int) -> None:
        self.count, self.locked, self.next = count, locked, 0

    def step(self, _notified: bool) -> Step[tuple[Iterable[int], int]]:
        number = self.next
        if number >= self.count:
            return [], 0
        items = yield from page(number, locked=number == self.locked)
        self.next += 1
        return items, PAGE


def test_a_live_query_in_a_catch_up_polls_ahead_on_both_faces(dsn: str) -> None:
    schedule = dict(buffer_size=PAGE, refresh_interval=0.05)
    with lock_held(dsn) as holder:
        polls = FullPages(3, locked=1)
        connection = connections(dsn, [0])
        live = LiveQuery(lambda notified: run_pooled(polls.step(notified), connection), Schedule(**schedule),
                         ahead=(polls.step, connection))
        with live:
            assert next(live) == 0
            eventually(lambda: waiting_on_the_lock(holder), "the live query's next poll sent ahead")
            holder.execute("SELECT pg_advisory_unlock_all()")
            assert [0, *(next(live) for _ in range(3 * PAGE - 1))] == list(range(3 * PAGE))

    async def read(holder: psycopg.Connection) -> list[int]:
        polls = FullPages(3, locked=1)
        connection = connections_to(dsn)
        async with AsyncLiveQuery(lambda notified: arun_pooled(polls.step(notified), connection),
                                  Schedule(**schedule), ahead=True) as alive:
            first = await alive.__anext__()
            await asyncio.to_thread(eventually, lambda: waiting_on_the_lock(holder), "the next poll sent ahead")
            holder.execute("SELECT pg_advisory_unlock_all()")
            return [first, *[await alive.__anext__() for _ in range(3 * PAGE - 1)]]

    with lock_held(dsn) as holder:
        assert asyncio.run(read(holder)) == list(range(3 * PAGE))


def test_a_one_connection_pool_reads_a_tag_as_before_with_an_append_inside_the_loop(dsn: str) -> None:
    with Journal.open(dsn, **{**TAGS, "pool_max_size": 1, "buffer_size": 4}) as journal:
        for n in range(10):
            journal.append(f"Cart|{n}", [{"n": n}], tags=["t"])
        tags_written(journal)
        eventually(lambda: len(list(journal.query.current_events_by_tag("t"))) == 10, "the tag's rows readable")
        seen = []
        for envelope in journal.query.current_events_by_tag("t"):
            seen.append(envelope.persistence_id)
            journal.append("Other|1", [{"inside": len(seen)}])
        assert seen == [f"Cart|{n}" for n in range(10)]


def test_a_step_read_ahead_for_a_closed_reader_sends_no_further_statement(dsn: str) -> None:
    """A live query closed after its catch-up must not run on (its back track): the step ahead ends at its next
    statement once the reader is closed."""
    sent: list[int] = []

    def two_statements() -> Step[None]:
        yield from page(0, locked=True)
        sent.append(1)
        yield Statement("SELECT 1")
        sent.append(2)

    out = [0]
    with lock_held(dsn) as holder:
        reader = ReadAhead(connections(dsn, out))
        future = reader.start(two_statements())
        eventually(lambda: waiting_on_the_lock(holder), "the step's first statement waiting")
        reader.close()
    with pytest.raises(Abandoned):
        future.result(timeout=30)
    assert sent == [1]
    eventually(lambda: out[0] == 0, "its connection given back")


def test_leaving_an_asyncio_live_query_ends_its_poll_ahead_on_the_server_before_the_loop_ends(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Its statement cancelled on the server and its connection closed in order, not cut off by the event loop's
    own cancellation at its end (psycopg: "query cancellation interrupted ... closing connection")."""
    schedule = dict(buffer_size=PAGE, refresh_interval=0.05)

    async def leave(holder: psycopg.Connection) -> None:
        polls = FullPages(3, locked=1)
        connection = connections_to(dsn)
        async with AsyncLiveQuery(lambda notified: arun_pooled(polls.step(notified), connection),
                                  Schedule(**schedule), ahead=True) as alive:
            assert await alive.__anext__() == 0
            await asyncio.to_thread(eventually, lambda: waiting_on_the_lock(holder), "the next poll sent ahead")
        assert not waiting_on_the_lock(holder)  # cancelled on the server by the time `async with` is left

    with lock_held(dsn) as holder, caplog.at_level("WARNING", logger="psycopg"):
        asyncio.run(leave(holder))
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []


def test_a_live_query_closed_from_another_thread_while_its_reader_waits_on_the_poll_ahead_ends_quietly(
        dsn: str) -> None:
    """The poll ahead (two statements, the first waiting on the test's lock) ends at its second once the query is
    closed: the reader waiting for it sees the query end, not the poll's abandonment."""
    polls = FullPages(3, locked=1)

    def two_statements(notified: bool) -> Step[tuple[Iterable[int], int]]:
        found = yield from polls.step(notified)
        yield Statement("SELECT 1")
        return found

    connection = connections(dsn, [0])
    schedule = Schedule(buffer_size=PAGE, refresh_interval=0.05)
    outcome: list[Any] = []
    with lock_held(dsn) as holder:
        live = LiveQuery(lambda notified: run_pooled(two_statements(notified), connection), schedule,
                         ahead=(two_statements, connection))
        assert [next(live) for _ in range(PAGE)] == list(range(PAGE))
        reader = threading.Thread(target=lambda: outcome.append(list(live)))  # waits on the poll ahead
        reader.start()
        eventually(lambda: waiting_on_the_lock(holder), "the poll ahead waiting")
        live.close()
    reader.join(30)
    assert outcome == [[]]
