"""events_by_slices meets an event whose predecessor it has not delivered yet (a gap), made on purpose, on both
faces: the gate loads the missing events and delivers them first (marked backtracked), so each event comes once
and in sequence order. Turning the fill off (passing the later event through) fails every test here.

Where a gap comes from:

* portable mode (and distributed databases) bound the main cursor by the clock minus ``behind_current_time``.
  A transaction that stays open longer than that commits its event "in the past", behind a main cursor that
  already passed it; the next event of the same persistence id, appended after the commit, is newer than the
  cursor and read first, while backtracking (``backtracking_behind_current_time`` behind the clock) reaches the
  old one only later. The tests hold a ``journal.transaction()`` open until the reader delivered a newer event.
* with the visibility horizon (PostgreSQL's default mode) the write path cannot make one: the main cursor never
  passes an open writer, and each event is stamped after its predecessor. Rows written around the write path
  can, e.g. a writer of an adopted journal whose clock stamps an event before its predecessor: the last test
  writes such rows with plain SQL.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from support import FAST
from support.aio import eventually as aeventually
from support.eventually import eventually

from pgjournal import Journal, Source, slice_for_persistence_id
from pgjournal.aio import AsyncJournal

#: The main cursor 50 ms behind the clock; backtracking far behind it, so only the gap fill can deliver an event
#: committed behind the main cursor within a test.
LATE_COMMITS: dict[str, Any] = dict(FAST, portable=True, behind_current_time=0.05,
                                    backtracking_behind_current_time=30.0)


def collect(live: Any, got: list[Any]) -> None:
    for envelope in live:
        got.append(envelope)


def filled(got: list[Any], pid: str) -> list[tuple[int, bool]]:
    """``pid``'s deliveries: (seq_nr, whether it came backtracked, as the gap fill delivers it)."""
    return [(e.seq_nr, e.source is Source.BACKTRACKING) for e in got if e.persistence_id == pid]


def test_a_transaction_outlasting_behind_current_time_leaves_a_gap_the_fill_closes(dsn: str) -> None:
    got: list[Any] = []
    with Journal.open(dsn, **LATE_COMMITS) as journal, journal.query.events_by_slices("Cart", 0, 1023) as live:
        reader = threading.Thread(target=collect, args=(live, got), daemon=True)
        reader.start()
        with journal.transaction() as tx:
            (first,) = tx.append("Cart|late", [{"n": 1}], expected_seq_nr=0)
            journal.append("Cart|early", [{"n": 1}])
            early = eventually(lambda: [e for e in got if e.persistence_id == "Cart|early"], "Cart|early read")
            assert early[0].offset.timestamp > first.db_timestamp, "the main cursor passed the open event"
        journal.append("Cart|late", [{"n": 2}], expected_seq_nr=1)
        eventually(lambda: (2, False) in filled(got, "Cart|late"), "Cart|late 2 read")
        live.close()
        reader.join(5)
    assert filled(got, "Cart|late") == [(1, True), (2, False)]


async def test_asyncio_a_transaction_outlasting_behind_current_time_leaves_a_gap_the_fill_closes(dsn: str
                                                                                                 ) -> None:
    got: list[Any] = []

    async def read(live: Any) -> None:
        async for envelope in live:
            got.append(envelope)

    async def seen(pid: str, seq_nr: int) -> list[Any]:
        return [e for e in got if (e.persistence_id, e.seq_nr) == (pid, seq_nr)]

    async with AsyncJournal.open(dsn, **LATE_COMMITS) as journal:
        live = journal.query.events_by_slices("Cart", 0, 1023)
        reader = asyncio.create_task(read(live))
        async with journal.transaction() as tx:
            (first,) = await tx.append("Cart|late", [{"n": 1}], expected_seq_nr=0)
            await journal.append("Cart|early", [{"n": 1}])
            early = await aeventually(lambda: seen("Cart|early", 1), "Cart|early read")
            assert early[0].offset.timestamp > first.db_timestamp, "the main cursor passed the open event"
        await journal.append("Cart|late", [{"n": 2}], expected_seq_nr=1)
        await aeventually(lambda: seen("Cart|late", 2), "Cart|late 2 read")
        live.close()
        await asyncio.wait_for(reader, 5)
    assert filled(got, "Cart|late") == [(1, True), (2, False)]


def write_out_of_order(dsn: str, pid: str) -> None:
    """Events 1 and 2 of ``pid`` in one transaction, event 2 stamped at the transaction's start and event 1
    later, at its insert: what a writer around the write path whose clock went back between them would store
    (never older than its transaction, so the horizon still holds)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
            "adapter_manifest, event_ser_id, event_ser_manifest, event_payload) VALUES "
            "(%(slice)s, 'Cart', %(pid)s, 1, GREATEST(clock_timestamp(), now() + interval '1 microsecond'), "
            "'skewed', '', 31, '', '{\"n\": 1}'), "
            "(%(slice)s, 'Cart', %(pid)s, 2, now(), 'skewed', '', 31, '', '{\"n\": 2}')",
            {"slice": slice_for_persistence_id(pid), "pid": pid})


@pytest.mark.postgres_only
@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_default_mode_events_stamped_out_of_order_come_in_sequence_order(dsn: str, face: str) -> None:
    """The main cursor meets event 2 first (the older timestamp) and the gate fills event 1; the main cursor
    reading event 1 next drops it as a duplicate."""
    got: list[Any] = []
    settings = dict(FAST, portable=False)
    if face == "blocking":
        with Journal.open(dsn, **settings) as journal, journal.query.events_by_slices("Cart", 0, 1023) as live:
            reader = threading.Thread(target=collect, args=(live, got), daemon=True)
            reader.start()
            journal.append("Cart|first", [{"n": 1}])
            eventually(lambda: got, "the reader runs")
            write_out_of_order(dsn, "Cart|skew")
            journal.append("Cart|after", [{"n": 1}])  # stamped after event 1: read once the cursor passed it
            eventually(lambda: [e for e in got if e.persistence_id == "Cart|after"], "Cart|after read")
            live.close()
            reader.join(5)
    else:
        async def run() -> None:
            async with AsyncJournal.open(dsn, **settings) as journal:
                live = journal.query.events_by_slices("Cart", 0, 1023)

                async def read() -> None:
                    async for envelope in live:
                        got.append(envelope)

                async def after() -> bool:
                    return any(e.persistence_id == "Cart|after" for e in got)

                async def any_read() -> bool:
                    return bool(got)

                reader = asyncio.create_task(read())
                await journal.append("Cart|first", [{"n": 1}])
                await aeventually(any_read, "the reader runs")
                await asyncio.to_thread(write_out_of_order, dsn, "Cart|skew")
                await journal.append("Cart|after", [{"n": 1}])
                await aeventually(after, "Cart|after read")
                live.close()
                await asyncio.wait_for(reader, 5)

        asyncio.run(run())
    assert filled(got, "Cart|skew") == [(1, True), (2, False)]
