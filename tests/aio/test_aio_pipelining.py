"""Appends that wait for a connection ride in a pipeline (pgjournal.aio.pipelining), one transaction for the
group: it commits once, yet each append keeps its own outcome (its conflict is its own, the others commit), a
cancelled one is all or nothing, groups never deadlock each other, and the connections come back clean."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import psycopg
import pytest
from support import make_serializable
from support.aio import SETTINGS, eventually
from test_aio_cancel import counts, pool_is_clean, slow_inserts

from pgjournal import ConcurrencyConflict, JournalError, WriteOutcomeUnknown
from pgjournal.aio import AsyncJournal


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=2, async_pipeline=True)) as opened:
        yield pipelined(opened)


async def first_append(journal: AsyncJournal, pid: str, event: str) -> str:
    """Append ``event`` as the first event of ``pid``: "written", or "conflict" when it had one already."""
    try:
        await journal.append(pid, [event], expected_seq_nr=0)
        return "written"
    except ConcurrencyConflict:
        return "conflict"


def pipelined(journal: AsyncJournal) -> AsyncJournal:
    if not journal._pipeline.enabled:
        pytest.skip("no pipelines on a SERIALIZABLE database (PGJOURNAL_TEST_PORTABLE=1)")
    return journal


async def test_no_pipelines_where_a_commit_may_fail(dsn: str) -> None:
    """Under SERIALIZABLE a commit may fail at its Sync (a serialization failure found at commit), which a
    pipeline cannot hand back to its append: appends go one per connection, as without the setting."""
    make_serializable(dsn)
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=2, async_pipeline=True)) as opened:
        assert not opened._pipeline.enabled
        await asyncio.gather(*(opened.append(f"Ser|{t}", [t]) for t in range(40)))
        assert opened._pipeline.sent == 0
    assert len(counts(dsn, "Ser|")) == 40


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
    assert aj._pipeline.rolled_back > 0, "a conflict rolled its group back and the others went again"
    written = counts(dsn, "Pipe|")
    assert written == {f"Pipe|{t}": 1 if t % 4 == 0 else 3 for t in range(80)}
    await pool_is_clean(aj, dsn)


async def test_many_conflicts_in_one_pipeline_leave_the_others_their_outcome(aj: AsyncJournal, dsn: str) -> None:
    """Every second append conflicts, ten rounds. psycopg's sync() raises the first error among the results it
    fetched and leaves the rest, so a second conflict used to surface at the pipeline's exit and end every append
    of the pipeline WriteOutcomeUnknown (about one round in four)."""
    for round_ in range(10):
        for t in range(0, 80, 2):
            await aj.append(f"Many{round_}|{t}", ["first"])
        outcomes = await asyncio.gather(*(first_append(aj, f"Many{round_}|{t}", "again") for t in range(80)))
        assert outcomes == ["conflict" if t % 2 == 0 else "written" for t in range(80)], f"round {round_}"
    assert aj._pipeline.pipelines > 10
    assert set(counts(dsn, "Many").values()) == {1}
    await pool_is_clean(aj, dsn)


async def test_a_pipeline_commits_its_appends_in_one_transaction(dsn: str) -> None:
    """60 tasks on one connection: the appends of a pipeline share a transaction (one xmin, one commit), each
    append's events keep one timestamp of their own (stamped while its statement holds the write lock)."""
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=1, async_pipeline=True)) as journal:
        pipelined(journal)
        await asyncio.gather(*(journal.append(f"Group|{t}", [t, t]) for t in range(60)))
        assert journal._pipeline.sent > 40
        pipelines = journal._pipeline.pipelines
    with psycopg.connect(dsn) as conn:
        groups = conn.execute("SELECT xmin::text, count(*), count(DISTINCT persistence_id) FROM event_journal "
                              "WHERE persistence_id LIKE 'Group|%%' GROUP BY 1").fetchall()
        stamps = conn.execute("SELECT count(DISTINCT db_timestamp) FROM event_journal "
                              "WHERE persistence_id LIKE 'Group|%%' GROUP BY persistence_id").fetchall()
    assert sum(rows for _xmin, rows, _pids in groups) == 120
    assert len(groups) <= 60 - journal._pipeline.sent + pipelines, "a transaction per pipeline, not per append"
    assert max(pids for *_rest, pids in groups) > 1
    assert stamps == [(1,)] * 60


async def test_groups_inserting_the_same_ids_never_deadlock(dsn: str) -> None:
    """Two journals (two processes' worth) append to the same 40 new persistence ids, one in the opposite order
    of the other. Groups are sorted by persistence id, so they lock in one order: one writes each id, the other
    gets a conflict, with no deadlock to wait out (the database's deadlock_timeout is 60 s here)."""
    slow_inserts(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET deadlock_timeout = '60s'")
    pids = [f"Dead|{t}" for t in range(40)]

    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=1, async_pipeline=True)) as one, \
            AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=1, async_pipeline=True)) as other:
        pipelined(one)
        async with asyncio.timeout(30):
            won = await asyncio.gather(*(first_append(one, pid, "mine") for pid in pids),
                                       *(first_append(other, pid, "mine") for pid in reversed(pids)))
        assert one._pipeline.sent > 20 and other._pipeline.sent > 20
    by_pid = dict(zip(pids, won[:40], strict=True))
    for pid, second in zip(reversed(pids), won[40:], strict=True):
        assert by_pid[pid] != second, f"{pid}: exactly one journal writes it"
    assert counts(dsn, "Dead|") == dict.fromkeys(pids, 1)


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


async def test_a_connection_lost_under_a_pipeline_leaves_outcomes_unknown_never_half(dsn: str) -> None:
    """The server ends the pool's sessions while pipelines are running: what was on the wire is
    WriteOutcomeUnknown (written whole or not at all), what was not sent is appended on a new connection, and an
    append reported written is there, whole."""
    slow_inserts(dsn)
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=2, async_pipeline=True)) as journal:
        pipelined(journal)
        tasks = [asyncio.create_task(journal.append(f"Lost|{t}", [{"t": t}] * 5, expected_seq_nr=0))
                 for t in range(60)]

        def inserting() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND state = 'active' AND query ILIKE '%INSERT%'").fetchone()[0])

        async def in_flight() -> bool:
            return journal._pipeline.pipelines > 0 and await asyncio.to_thread(inserting)

        await eventually(in_flight, "a pipeline running on the server")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        results = await asyncio.gather(*tasks, return_exceptions=True)
    written = counts(dsn, "Lost|")
    assert set(written.values()) <= {5}, "an append was half written"
    for t, result in enumerate(results):
        if isinstance(result, list):
            assert written.get(f"Lost|{t}") == 5
        else:
            assert isinstance(result, JournalError), repr(result)
    assert any(isinstance(r, WriteOutcomeUnknown) for r in results), "appends in flight have an unknown outcome"
    assert sum(isinstance(r, list) for r in results) > 0, "what was not sent was appended on a new connection"


async def test_tasks_appending_in_a_row_on_one_connection_never_stall(dsn: str) -> None:
    """Each task's next append is queued right after its previous one came back, while the drain that carried
    it ends: some drain must always take what is queued."""
    async with AsyncJournal.open(dsn, **dict(SETTINGS, pool_max_size=1, async_pipeline=True)) as journal:
        pipelined(journal)

        async def task(t: int) -> None:
            for i in range(20):
                await journal.append(f"Row|{t}", [i], expected_seq_nr=i)

        async with asyncio.timeout(30):
            await asyncio.gather(*(task(t) for t in range(20)))
        assert journal._pipeline.sent > 100
    assert counts(dsn, "Row|") == {f"Row|{t}": 20 for t in range(20)}
