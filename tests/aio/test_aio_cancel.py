"""Cancellation and timeouts on the asyncio face: a task cancelled anywhere in an append (or in a transaction)
leaves all of its events or none and its connection clean in the pool; ``asyncio.timeout`` around a live query
stops it within its bound, in a wait and in a poll blocked on the server."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from support.aio import SETTINGS, eventually

from pgjournal import slice_for_persistence_id
from pgjournal.aio import AsyncJournal

EVENTS = 12


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=4)) as opened:
        yield opened


def counts(dsn: str, prefix: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT persistence_id, count(*) FROM event_journal WHERE persistence_id LIKE %s "
                                 "GROUP BY persistence_id", (prefix + "%",)).fetchall())


async def pool_is_clean(journal: AsyncJournal, dsn: str) -> None:
    """Every server session of the pool idle (none left in a transaction or running a statement), and every
    connection the pool hands out idle and usable."""

    def server_states() -> list[str]:
        with psycopg.connect(dsn) as conn:
            return [r[0] for r in conn.execute(
                "SELECT state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND query NOT ILIKE 'LISTEN%%'").fetchall()]

    async def all_idle() -> bool:
        return all(state == "idle" for state in server_states())

    await eventually(all_idle, "every pool session idle on the server")
    size = journal.settings.pool_max_size
    borrowed = [await journal.connections.get() for _ in range(size)]
    try:
        for conn in borrowed:
            assert not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    finally:
        for conn in borrowed:
            await journal.connections.put(conn)


async def cancel_at_random(make: Callable[[int], Awaitable[Any]], seed: int, want: int = 10) -> tuple[int, int]:
    """Run ``make(0)`` to the end to learn how long one takes, then start ``make(i)`` for i = 1, 2, ... and cancel
    each at a random moment within 1.5 times that, until ``want`` were cancelled and ``want`` finished (at most
    400 tries, so a slow or a fast machine both cut at every point). Returns (cancelled, tries)."""
    rng = random.Random(seed)
    started = time.monotonic()
    await make(0)
    took = time.monotonic() - started
    cancelled = finished = 0
    tries = 1
    while (cancelled < want or finished < want) and tries < 400:
        task = asyncio.ensure_future(make(tries))
        tries += 1
        await asyncio.sleep(rng.uniform(0, 1.5 * took))
        task.cancel()
        try:
            await task
            finished += 1
        except asyncio.CancelledError:
            cancelled += 1
    return cancelled, tries


def slow_inserts(dsn: str) -> None:
    """Every journal row takes 2 ms on the server, so an append's statement runs long enough for a cancel request
    to reach it before it commits (on a fast server the one-statement append commits before the request
    arrives, and only the committed end would be tested)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER slow BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION slow_insert()")


async def test_cancelling_appends_at_many_points_leaves_all_or_nothing(aj: AsyncJournal, dsn: str) -> None:
    slow_inserts(dsn)
    cancelled, tries = await cancel_at_random(
        lambda i: aj.append(f"Cancel|{i}", [{"i": i, "pad": "x" * 200}] * EVENTS, tags=["c"] if i % 3 == 0 else ()),
        21)
    assert cancelled >= 10, "too few appends were cancelled to prove anything"
    written = counts(dsn, "Cancel|")
    assert set(written.values()) <= {EVENTS}, "an append was half written"
    assert 0 < len(written) < tries, "cancelled at both ends: some appends committed, some not"
    if aj.tag_writer is not None:  # the batched tag writer (the default) writes the tag rows of what committed
        await aj.tag_writer.flush()
    with psycopg.connect(dsn) as conn:
        journal_rows = conn.execute("SELECT count(*) FROM event_journal WHERE tags @> '{c}'").fetchone()[0]
        tag_rows = conn.execute("SELECT count(*) FROM tag_views WHERE tag_name = 'c'").fetchone()[0]
    assert journal_rows == tag_rows, "a tag view row for every committed tagged event, none for a cancelled one"
    await pool_is_clean(aj, dsn)
    assert (await aj.append("Cancel|after", [1]))[0].seq_nr == 1


async def test_cancelling_an_append_blocked_on_the_server(aj: AsyncJournal, dsn: str) -> None:
    """The append waits for another transaction's row lock (same persistence id and number): cancelling it
    cancels the statement on the server, and the connection comes back idle."""
    with psycopg.connect(dsn) as blocker:
        blocker.execute("INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                        "event_ser_id, event_ser_manifest, event_payload, writer) SELECT slice, 'Cancel', "
                        "'Cancel|held', 1, now(), 31, '', '{}', 'blocker' FROM (SELECT %s::int AS slice) s",
                        (slice_for_persistence_id("Cancel|held"),))
        task = asyncio.create_task(aj.append("Cancel|held", ["mine"], expected_seq_nr=0))

        def waiting() -> bool:
            with psycopg.connect(dsn) as conn:
                return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                         "AND datname = current_database()").fetchone()[0])

        async def blocked() -> bool:
            return await asyncio.to_thread(waiting)

        await eventually(blocked, "the append waits for the row lock")
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 2
        blocker.rollback()
    await pool_is_clean(aj, dsn)
    assert counts(dsn, "Cancel|held") == {}


async def test_cancelling_a_transaction_rolls_all_of_it_back(aj: AsyncJournal, dsn: str) -> None:
    async def unit(i: int) -> None:
        async with aj.transaction() as tx:
            await tx.append(f"Unit|{i}-a", [i] * 3)
            await tx.connection.execute("SELECT pg_sleep(0.001)")
            await tx.append(f"Unit|{i}-b", [i] * 3, tags=["u"])

    cancelled, tries = await cancel_at_random(unit, 7)
    assert cancelled >= 10
    written = counts(dsn, "Unit|")
    for i in range(tries):
        assert written.get(f"Unit|{i}-a") == written.get(f"Unit|{i}-b"), f"unit {i} was half committed"
    await pool_is_clean(aj, dsn)


async def test_a_timeout_stops_a_waiting_live_query_promptly(dsn: str) -> None:
    async with AsyncJournal.open(dsn, **dict(SETTINGS, refresh_interval=30.0)) as journal:
        await journal.append("Live|1", [1])
        live = journal.query.events_by_slices("Live", 0, 1023)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                async for _ in live:
                    pass
        assert time.monotonic() - started < 1.5, "the timeout must end the 30 s wait"
        await pool_is_clean(journal, dsn)


async def test_a_timeout_stops_a_live_query_in_a_poll_blocked_on_the_server(aj: AsyncJournal, dsn: str) -> None:
    with psycopg.connect(dsn) as blocker:
        blocker.execute("LOCK TABLE event_journal IN ACCESS EXCLUSIVE MODE")  # every read waits
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                async for _ in aj.query.events_by_slices("Live", 0, 1023):
                    pass
        assert time.monotonic() - started < 2.0, "the blocked poll is cancelled on the server"
        blocker.rollback()
    await pool_is_clean(aj, dsn)


async def test_the_pool_front_serves_waiters_and_loses_no_connection(dsn: str) -> None:
    """200 tasks on 2 connections, some cancelled while they wait or hold one, one connection left inside a
    transaction: every borrower served (or cancelled), the held count back to the pool's size, all idle."""
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=2, connect_timeout=5)) as journal:
        front = journal.connections
        rng = random.Random(3)
        served = 0

        async def borrower(i: int) -> None:
            nonlocal served
            async with journal.connection() as conn:
                await conn.execute("SELECT pg_sleep(0.001)")
                if i == 7:
                    await conn.execute("BEGIN")  # returned inside a transaction: the pool resets it
                served += 1

        tasks = [asyncio.create_task(borrower(i)) for i in range(200)]
        await asyncio.sleep(0.01)
        for task in rng.sample(tasks, 40):
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(o is None or isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        assert served >= 150 and not front._waiters and front._held <= 2
        await pool_is_clean(journal, dsn)
