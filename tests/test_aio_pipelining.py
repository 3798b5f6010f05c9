"""Appends that wait for a connection ride in a pipeline (pgjournal.aio.pipelining), each still its own
transaction: its conflict is its own, the others in the same pipeline commit, a cancelled one is all or nothing,
and the connections come back clean."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from aio_support import SETTINGS
from test_aio_cancel import counts, pool_is_clean

from pgjournal import ConcurrencyConflict, JournalError
from pgjournal.aio import AsyncJournal


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=2, async_pipeline=True)) as opened:
        yield opened


async def test_each_append_in_a_pipeline_keeps_its_own_outcome(aj: AsyncJournal, dsn: str) -> None:
    """80 tasks on 2 connections; every fourth states a stale expected_seq_nr for an entity that has events."""
    for t in range(0, 80, 4):
        await aj.append(f"Pipe|{t}", ["first"])
    sent = aj._pipeline.sent

    async def task(t: int) -> str:
        try:
            await aj.append(f"Pipe|{t}", [f"e{i}" for i in range(3)], expected_seq_nr=0)
            return "written"
        except ConcurrencyConflict as exc:
            assert (exc.persistence_id, exc.expected_seq_nr, exc.actual_seq_nr) == (f"Pipe|{t}", 0, 1)
            return "conflict"

    outcomes = await asyncio.gather(*(task(t) for t in range(80)))
    assert outcomes == ["conflict" if t % 4 == 0 else "written" for t in range(80)]
    assert aj._pipeline.sent - sent > 20, "most appends waited for a connection and rode in a pipeline"
    assert aj._pipeline.pipelines > 1
    written = counts(dsn, "Pipe|")
    assert written == {f"Pipe|{t}": 1 if t % 4 == 0 else 3 for t in range(80)}
    await pool_is_clean(aj, dsn)


async def test_the_envelopes_and_the_next_append_after_a_pipeline(aj: AsyncJournal) -> None:
    """What a pipelined append returns is what a direct one returns, and the writer's knowledge of the last event
    (the next append's fast path) is right."""
    first = await asyncio.gather(*(aj.append(f"Env|{t}", [t, t + 1]) for t in range(30)))
    assert [[e.seq_nr for e in envs] for envs in first] == [[1, 2]] * 30
    assert all(envs[0].db_timestamp <= envs[1].db_timestamp for envs in first)
    second = await asyncio.gather(*(aj.append(f"Env|{t}", [t], expected_seq_nr=2) for t in range(30)))
    assert [envs[0].seq_nr for envs in second] == [3] * 30
    assert all(s[0].db_timestamp > f[1].db_timestamp for f, s in zip(first, second, strict=True))
    assert [e.event for envs in second for e in envs] == list(range(30))


async def test_cancelled_appends_in_pipelines_are_all_or_nothing(aj: AsyncJournal, dsn: str) -> None:
    rng = random.Random(5)
    tasks = [asyncio.create_task(aj.append(f"Cut|{t}", [{"t": t}] * 5)) for t in range(120)]
    await asyncio.sleep(0)
    for _ in range(40):
        await asyncio.sleep(rng.uniform(0, 0.005))
        rng.choice(tasks).cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
    assert cancelled > 0
    written = counts(dsn, "Cut|")
    assert set(written.values()) <= {5}, "an append was half written"
    assert len(written) >= 120 - cancelled
    await pool_is_clean(aj, dsn)
    assert (await aj.append("Cut|after", [1]))[0].seq_nr == 1


async def test_closing_hands_queued_appends_back(dsn: str) -> None:
    """Appends still queued when the journal closes end with an error, not a wait forever."""
    journal = await AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=1, async_pipeline=True))
    tasks = [asyncio.create_task(journal.append(f"Close|{t}", [t])) for t in range(200)]
    await asyncio.sleep(0)
    await journal.close()
    async with asyncio.timeout(5):  # well within connect_timeout: nobody waits for a connection
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r).__name__ for r in results if not isinstance(r, list | JournalError)] == []
    assert any(isinstance(r, JournalError) for r in results), "some were still queued when it closed"
