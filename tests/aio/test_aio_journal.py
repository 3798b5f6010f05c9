"""The asyncio face (``pgjournal.aio.AsyncJournal``) mirrors the blocking one: appends and their conflicts,
reads by persistence id, lookups, by-slice and by-tag queries current and live (LISTEN wake-ups), with the
same results as the blocking face on the same data. Snapshots, reads by persistence id and by slices (current and
live) are tested on both faces (the ``face`` fixture) in test_snapshots.py, test_reads.py and test_by_slices.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from support import FAST
from support.aio import SETTINGS, take
from support.raw_events import MIXED_BATCH, expected_batch, raw_registry, stored_batch

from pgjournal import (
    ConcurrencyConflict,
    EventNotFound,
    InvalidArgument,
    Journal,
    SchemaNotMigrated,
    Source,
    slice_for_persistence_id,
)
from pgjournal.aio import AsyncJournal

PID = "Cart|1"
TAGS: dict[str, Any] = dict(tag_bucket_size="Minute", tag_eventual_consistency_delay=0.05, tag_gap_timeout=0.3)


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **SETTINGS, **TAGS) as opened:
        yield opened


def stored(dsn: str, pid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT seq_nr, writer, tags FROM event_journal WHERE persistence_id = %s "
                            "ORDER BY seq_nr", (pid,)).fetchall()


def keys(envelopes: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.persistence_id, e.seq_nr, e.db_timestamp, e.event, e.offset.timestamp, dict(e.offset.seen))
            for e in envelopes]


async def collect(iterator: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in iterator]


# -- open ---------------------------------------------------------------------------------------------


async def test_open_checks_the_schema(empty_dsn: str) -> None:
    with pytest.raises(SchemaNotMigrated, match="pgjournal migrate"):
        await AsyncJournal.open(empty_dsn)
    async with AsyncJournal.open(empty_dsn, migrate=True, **SETTINGS) as journal:
        assert (await journal.append(PID, [1]))[0].seq_nr == 1


async def test_the_capabilities_are_those_of_the_blocking_face(dsn: str) -> None:
    with Journal.open(dsn, **SETTINGS) as sync:
        async with AsyncJournal.open(dsn, **SETTINGS) as journal:
            assert journal.capabilities == sync.capabilities
            assert journal.read_margin == sync.read_margin


# -- appends ------------------------------------------------------------------------------------------


@pytest.mark.floor
async def test_sequence_numbers_and_conflicts(aj: AsyncJournal, dsn: str) -> None:
    first = await aj.append(PID, [{"n": 1}, {"n": 2}, {"n": 3}])
    second = await aj.append(PID, [{"n": 4}], expected_seq_nr=3)
    assert [e.seq_nr for e in first + second] == [1, 2, 3, 4]
    assert [e.event for e in first] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert {e.slice for e in first} == {slice_for_persistence_id(PID)}
    with pytest.raises(ConcurrencyConflict) as caught:
        await aj.append(PID, ["x", "y"], expected_seq_nr=2)
    assert (caught.value.seq_nr, caught.value.expected_seq_nr, caught.value.actual_seq_nr) == (3, 2, 4)
    with pytest.raises(ConcurrencyConflict):
        await aj.append(PID, ["x"], expected_seq_nr=9)  # above the highest
    assert [r[0] for r in stored(dsn, PID)] == [1, 2, 3, 4]
    assert {r[1] for r in stored(dsn, PID)} == {aj.writer_id}
    assert await aj.highest_seq_nr(PID) == 4
    assert await aj.append(PID, []) == []
    with pytest.raises(InvalidArgument, match="wrap it in a list"):
        await aj.append(PID, "abc")


async def test_many_tasks_without_expectation_lose_nothing(aj: AsyncJournal, dsn: str) -> None:
    await asyncio.gather(*(aj.append(PID, [{"task": t, "i": i}]) for t in range(20) for i in range(5)))
    assert [r[0] for r in stored(dsn, PID)] == list(range(1, 101))


async def test_many_tasks_with_expectations_one_winner_per_seq_nr(aj: AsyncJournal) -> None:
    async def attempt(task: int) -> bool:
        try:
            await aj.append(PID, [task], expected_seq_nr=0)
            return True
        except ConcurrencyConflict:
            return False

    assert sum(await asyncio.gather(*(attempt(t) for t in range(16)))) == 1


async def test_tags_and_metadata_round_trip(aj: AsyncJournal, dsn: str) -> None:
    await aj.append(PID, [{"a": 1}], tags=["blue", "red"], metadata={"by": "me"})
    if aj.tag_writer is not None:
        await aj.tag_writer.flush()
    envelope = await aj.query.load_envelope(PID, 1)
    assert (envelope.event, envelope.metadata, sorted(envelope.tags)) == ({"a": 1}, {"by": "me"}, ["blue", "red"])
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT tag_name, tag_pid_sequence_nr FROM tag_views ORDER BY tag_name").fetchall() == [
            ("blue", 1), ("red", 1)]


async def test_a_batch_stores_every_payload_byte_and_manifest_as_given(dsn: str) -> None:
    registry = raw_registry()
    async with AsyncJournal.open(dsn, serializers=registry, **SETTINGS) as journal:
        written = await journal.append(PID, MIXED_BATCH, expected_seq_nr=0)
        written += await journal.append(PID, MIXED_BATCH[::-1], expected_seq_nr=None)
    assert [e.event for e in written] == MIXED_BATCH + MIXED_BATCH[::-1]
    assert stored_batch(dsn, PID) == expected_batch(registry, MIXED_BATCH + MIXED_BATCH[::-1])


# -- reads by persistence id and lookups ----------------------------------------------------------------


async def test_reads_by_persistence_id_match_the_blocking_face(dsn: str) -> None:
    async with AsyncJournal.open(dsn, **SETTINGS, buffer_size=3) as journal:
        for i in range(4):
            await journal.append(PID, [{"n": 2 * i}, {"n": 2 * i + 1}])
            await journal.append(f"Other|{i}", [i])
        await journal.delete_events(PID, 2)
        with Journal.open(dsn, **SETTINGS, buffer_size=3) as sync:
            expected = list(sync.query.current_events_by_persistence_id(PID, 1, 7))
            ids = list(sync.query.current_persistence_ids(limit=None))
        got = await collect(journal.query.current_events_by_persistence_id(PID, 1, 7))
        assert [(e.seq_nr, e.event) for e in got] == [(e.seq_nr, e.event) for e in expected]
        assert [e.seq_nr for e in got] == [3, 4, 5, 6, 7]
        assert await collect(journal.query.current_persistence_ids(limit=None)) == ids
        assert await collect(journal.query.current_persistence_ids(limit=2, entity_type="Other")) == [
            "Other|0", "Other|1"]
        assert await journal.query.timestamp_of(PID, 3) == got[0].db_timestamp
        assert await journal.query.timestamp_of(PID, 1) is None  # deleted
        assert (await journal.query.load_envelope(PID, 4)).event == {"n": 3}
        with pytest.raises(EventNotFound):
            await journal.query.load_envelope(PID, 99)


# -- by slices ----------------------------------------------------------------------------------------


async def test_current_by_slices_matches_the_blocking_face_and_resumes(aj: AsyncJournal, dsn: str) -> None:
    for i in range(30):
        await aj.append(f"Cart|{i % 7}", [{"n": i}, {"n": i, "second": True}])
    await asyncio.sleep(0.15)
    with Journal.open(dsn, **SETTINGS) as sync:
        expected = list(sync.query.current_events_by_slices("Cart", 0, 1023))
    got = await collect(aj.query.current_events_by_slices("Cart", 0, 1023))
    assert keys(got) == keys(expected) and len(got) == 60
    rest = await collect(aj.query.current_events_by_slices("Cart", 0, 1023, got[24].offset))
    assert keys(rest) == keys(got[25:])
    halves = [await collect(aj.query.current_events_by_slices("Cart", lo, hi)) for lo, hi in ((0, 511), (512, 1023))]
    assert sorted(keys(halves[0] + halves[1]), key=str) == sorted(keys(got), key=str)


async def test_from_snapshots(aj: AsyncJournal, dsn: str) -> None:
    await aj.append(PID, [1, 2, 3])
    await aj.append("Cart|2", [1])
    await aj.save_snapshot(PID, 2, 20)
    await asyncio.sleep(0.15)
    with Journal.open(dsn, **SETTINGS) as sync:
        expected = list(sync.query.current_events_by_slices_starting_from_snapshots(
            "Cart", 0, 1023, transform=lambda s: {"snap": s}))
    got = await collect(aj.query.current_events_by_slices_starting_from_snapshots(
        "Cart", 0, 1023, transform=lambda s: {"snap": s}))
    assert [(e.persistence_id, e.seq_nr, e.event, e.source) for e in got] == [
        (e.persistence_id, e.seq_nr, e.event, e.source) for e in expected]
    assert got[0].source is Source.SNAPSHOT
    live = await aj.query.events_by_slices_starting_from_snapshots("Cart", 0, 1023, transform=lambda s: {"snap": s})
    async with live:
        assert [(e.persistence_id, e.seq_nr, e.event) for e in await take(live, 3)] == [
            (e.persistence_id, e.seq_nr, e.event) for e in expected]
    assert live.closed


# -- by tag -------------------------------------------------------------------------------------------


async def test_by_tag_current_and_live_match_the_blocking_face(aj: AsyncJournal, dsn: str) -> None:
    for i in range(10):
        await aj.append(f"Cart|{i % 3}", [{"n": i}], tags=["t"] if i % 2 else ["t", "u"])
    if aj.tag_writer is not None:  # another journal reads them once they are written
        await aj.tag_writer.flush()
    await asyncio.sleep(0.15)
    with Journal.open(dsn, **SETTINGS, **TAGS) as sync:
        expected = list(sync.query.current_events_by_tag("t"))
    got = await collect(aj.query.current_events_by_tag("t"))
    assert [(e.persistence_id, e.seq_nr, e.offset) for e in got] == [
        (e.persistence_id, e.seq_nr, e.offset) for e in expected]
    assert len(got) == 10
    live = await aj.query.events_by_tag("u")
    async with live:
        assert [e.event["n"] for e in await take(live, 5)] == [0, 2, 4, 6, 8]
        await aj.append("Cart|9", ["late"], tags=["u"])
        assert [e.event for e in await take(live, 1)] == ["late"]


async def test_a_current_tag_query_left_early_leaves_no_page_read_running(dsn: str) -> None:
    """The next page's step runs while the last page's envelopes are taken: a reader that stops gets it
    cancelled, and the pool's one connection is free again."""
    settings = dict(SETTINGS, **TAGS, buffer_size=2, pool_min_size=1, pool_max_size=1, connect_timeout=3)
    async with AsyncJournal.open(dsn, **settings) as journal:
        for i in range(7):
            await journal.append(f"Cart|{i % 2}", [i], tags=["t"])
        if journal.tag_writer is not None:
            await journal.tag_writer.flush()
        await asyncio.sleep(0.15)
        assert [e.event for e in await collect(journal.query.current_events_by_tag("t"))] == list(range(7))
        read = journal.query.current_events_by_tag("t")
        assert [(await anext(read)).event for _ in range(3)] == [0, 1, 2]  # the step of the page after is started
        await read.aclose()
        assert (await asyncio.wait_for(journal.append("Cart|2", ["after"]), 5))[0].seq_nr == 1


async def test_bad_arguments_are_named(aj: AsyncJournal) -> None:
    # (bad slice ranges and offsets: on both faces in tests/query/test_by_slices.py)
    with pytest.raises(InvalidArgument):
        await aj.query.timestamp_of(PID, 0)


def test_fast_settings_are_shared() -> None:
    assert FAST["refresh_interval"] == SETTINGS["refresh_interval"]
