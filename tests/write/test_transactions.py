"""Appends inside the caller's transaction (``journal.transaction()``, on both faces): several
persistence ids and the caller's own SQL commit or roll back together; a conflict raises at its append;
without savepoints it aborts the transaction, with them the caller goes on; signals only after the commit;
and a transaction that waits 5 s between its appends, with a live consumer running all the while and a
restart from an offset taken during the wait, delivers every event exactly once, in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from support import FAST
from support.aio import check_once_in_order, eventually
from support.faces import Face, Kind, open_face

from pgjournal import ConcurrencyConflict, NoOffset, TransactionAborted
from pgjournal.aio import AsyncJournal
from pgjournal.model.offsets import Offset
from pgjournal.runtime.signals import CHANNEL


def outbox(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM outbox ORDER BY v").fetchall()]


def make_outbox(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE outbox (v int)")


def test_appends_and_own_sql_commit_or_roll_back_together(face: Face, dsn: str) -> None:
    make_outbox(dsn)
    with face.transaction() as tx:
        a = tx.append("A|1", [{"x": 1}], expected_seq_nr=0)
        b = tx.append("B|1", [{"y": 1}, {"y": 2}], tags=["t"], metadata={"m": 1})
        tx.connection.execute("INSERT INTO outbox VALUES (1)")
        assert [e.seq_nr for e in a + b] == [1, 1, 2]
        assert face.highest_seq_nr("B|1") == 0, "not visible before the commit"
    assert (face.highest_seq_nr("A|1"), face.highest_seq_nr("B|1"), outbox(dsn)) == (1, 2, [1])
    assert [e.metadata for e in face.query.current_events_by_persistence_id("B|1")] == [{"m": 1}, {"m": 1}]
    with pytest.raises(RuntimeError), face.transaction() as tx:
        tx.append("A|1", [{"x": 2}], expected_seq_nr=1)
        tx.connection.execute("INSERT INTO outbox VALUES (2)")
        raise RuntimeError("the caller's own failure")
    assert (face.highest_seq_nr("A|1"), outbox(dsn)) == (1, [1])


def test_a_conflict_raises_at_its_append_and_aborts_the_transaction(face: Face, dsn: str) -> None:
    make_outbox(dsn)
    face.append("A|1", ["a"])
    with pytest.raises(TransactionAborted) as aborted, face.transaction() as tx:
        tx.append("B|1", ["b"])
        with pytest.raises(ConcurrencyConflict) as conflict:
            tx.append("A|1", ["late"], expected_seq_nr=0)
        assert (conflict.value.persistence_id, conflict.value.expected_seq_nr) == ("A|1", 0)
        with pytest.raises(TransactionAborted):
            tx.append("C|1", ["c"])
    assert isinstance(aborted.value.cause, ConcurrencyConflict)
    assert (face.highest_seq_nr("A|1"), face.highest_seq_nr("B|1"), face.highest_seq_nr("C|1")) == (1, 0, 0)
    # Every kind of failed append, on both faces, with and without savepoints: tests/write/test_transaction_aborts.py


def test_with_savepoints_the_caller_goes_on_after_a_conflict(face: Face, dsn: str) -> None:
    make_outbox(dsn)
    face.append("A|1", ["a"])
    with face.transaction(savepoints=True) as tx:
        tx.append("B|1", ["b"])
        with pytest.raises(ConcurrencyConflict):
            tx.append("A|1", ["late"], expected_seq_nr=0)
        tx.append("A|1", ["next"], expected_seq_nr=1)
        tx.connection.execute("INSERT INTO outbox VALUES (1)")
    assert (face.highest_seq_nr("A|1"), face.highest_seq_nr("B|1"), outbox(dsn)) == (2, 1, [1])


def test_signals_go_out_only_after_the_commit(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, **FAST) as journal, psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with journal.transaction() as tx:
            tx.append("Signal|1", ["a"])
            time.sleep(0.2)  # a signal sent now would arrive within this window
            assert list(listener.notifies(timeout=0.3)) == []
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in notes] == ["Signal"]


# -- a long transaction, a live consumer all the while, a restart from an offset taken during the wait -------

ENTITY = "Long"


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
async def test_a_transaction_waiting_5_s_between_appends(dsn: str, portable: bool) -> None:
    # Portable mode has no visibility horizon: readers must stay behind the clock longer than the longest
    # writing transaction (README, "Transactions"); default mode needs nothing.
    settings: dict[str, Any] = dict(FAST, portable=portable, buffer_size=20)
    if portable:
        settings.update(behind_current_time=6.0, backtracking_behind_current_time=7.0)
    async with AsyncJournal.open(dsn, **settings) as journal:
        delivered: list[tuple[str, int]] = []
        offsets: list[Offset] = []

        async def consume() -> None:
            async for envelope in journal.query.events_by_slices(ENTITY, 0, 1023):
                delivered.append((envelope.persistence_id, envelope.seq_nr))
                offsets.append(envelope.offset)

        async def write(stop: asyncio.Event) -> None:
            i = 0
            while not stop.is_set():
                await journal.append(f"{ENTITY}|w{i % 5}", [{"i": i}])
                i += 1
                await asyncio.sleep(0.02)

        consumer = asyncio.create_task(consume())
        stop = asyncio.Event()
        writer = asyncio.create_task(write(stop))
        await journal.append(f"{ENTITY}|tx-a", ["before"])

        async def delivering() -> bool:
            return bool(delivered)

        await eventually(delivering, "the consumer delivers (portable: once behind_current_time has passed)")
        restart_at: Offset = NoOffset
        async with journal.transaction() as tx:
            await tx.append(f"{ENTITY}|tx-a", ["first"], expected_seq_nr=1)
            await tx.append(f"{ENTITY}|tx-b", ["first"])
            for tenth in range(50):  # 5 s between the first and the last append
                await asyncio.sleep(0.1)
                if tenth == 25:  # an offset taken during the wait
                    restart_at, restart_index = offsets[-1], len(offsets)
            await tx.append(f"{ENTITY}|tx-b", ["last"], expected_seq_nr=1)
            await tx.append(f"{ENTITY}|tx-a", ["last"], expected_seq_nr=2)
        await asyncio.sleep(0.5)
        stop.set()
        await writer
        with psycopg.connect(dsn) as conn:
            written = set(conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s",
                                       (ENTITY,)).fetchall())
        assert len(written) > 100 and (f"{ENTITY}|tx-a", 3) in written

        async def all_delivered() -> bool:
            return set(delivered) >= written

        await eventually(all_delivered, "the live consumer delivered every event", timeout=30)
        consumer.cancel()
        check_once_in_order(delivered, written, "live consumer")
        assert restart_at is not NoOffset, "the consumer delivered nothing during the wait"
        before = delivered[:restart_index]
        again = [(e.persistence_id, e.seq_nr) async for e in
                 journal.query.current_events_by_slices(ENTITY, 0, 1023, restart_at)]
        check_once_in_order(before + again, written, "restart from an offset taken during the wait")
