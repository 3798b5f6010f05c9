"""The event processor: events read from another database, written here with the offsets in one transaction."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from support.eventually import eventually
from support.settings import FAST

from pgjournal import Journal
from pgjournal.errors import InvalidArgument
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import EventProcessor, Stored, append_events
from pgjournal.replication.processor import append_many_with_metadata_step
from pgjournal.runtime.steps import run

SETTINGS = ProjectionSettings(restart_backoff=0.1, management_interval=0.2, attempts=2, backoff=0.01)


@pytest.fixture
def two(shard_databases: Any) -> Iterator[tuple[Journal, Journal]]:
    source_dsn, target_dsn = shard_databases(2)
    with Journal.open(source_dsn, **FAST) as source, Journal.open(target_dsn, **FAST) as target:
        yield source, target


def events_of(journal: Journal, pid: str) -> list[Any]:
    return [e.event for e in journal.query.current_events_by_persistence_id(pid)]


def test_a_processor_copies_another_databases_events_once_each_and_resumes(two: tuple[Journal, Journal]) -> None:
    source, target = two
    for i in range(30):
        source.append(f"Order|{i % 3}", [f"order {i}"])

    def process(conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
        for env in envelopes:
            append_events(conn, target, "Audit|" + env.persistence_id.split("|")[1], [f"saw {env.event}"])
        processor.wrote("Audit")

    processor = EventProcessor(target, source, "audit", "Order", process, settings=SETTINGS, max_count=7)
    runner = processor.run_range()
    eventually(lambda: sum(len(events_of(target, f"Audit|{k}")) for k in range(3)) == 30, "the first 30")
    runner.stop()
    runner.join(10)
    for i in range(30, 45):
        source.append(f"Order|{i % 3}", [f"order {i}"])
    runner = processor.run_range()  # from the stored offsets, in the target
    try:
        eventually(lambda: sum(len(events_of(target, f"Audit|{k}")) for k in range(3)) == 45, "all 45")
    finally:
        runner.stop()
        runner.join(10)
    for k in range(3):
        assert events_of(target, f"Audit|{k}") == [f"saw order {i}" for i in range(45) if i % 3 == k]
    with target.connection() as conn:
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store WHERE projection_name = "
                            "'audit'").fetchone()[0] > 0
    with source.connection() as conn:  # nothing written at the source
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = 'Audit'").fetchone()[0] == 0


def test_a_failing_batch_writes_nothing_and_stores_no_offset(two: tuple[Journal, Journal]) -> None:
    source, target = two
    source.append("Order|1", ["a", "b", "boom", "c"])

    def process(conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
        for env in envelopes:
            append_events(conn, target, "Copy|1", [env.event])
            if env.event == "boom":
                raise RuntimeError("boom")

    processor = EventProcessor(target, source, "copy", "Order", process, settings=SETTINGS, max_count=10)
    runner = processor.run_range()
    runner.join(30)
    assert runner.failed is not None or not runner.alive
    runner.stop()
    # The batches before the failing event (groups are tried one event at a time after failing) are stored,
    # the failing one and what follows are not.
    assert events_of(target, "Copy|1") == ["a", "b"]


def test_as_stored_copies_bytes_without_decoding(two: tuple[Journal, Journal]) -> None:
    source, target = two
    with source.connection() as conn:  # a serializer id this registry does not know
        conn.execute("INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
                     "adapter_manifest, event_ser_id, event_ser_manifest, event_payload) VALUES "
                     "(%s, 'Blob', 'Blob|1', 1, now(), 'w', '', 4242, 'Opaque', '\\x00ff'::bytea)",
                     (__import__("pgjournal").model.slices.slice_for_persistence_id("Blob|1"),))

    def process(conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
        for env in envelopes:
            assert isinstance(env.event, Stored)
            append_events(conn, target, env.persistence_id, [env.event])

    processor = EventProcessor(target, source, "blobs", "Blob", process, as_stored=True, settings=SETTINGS)
    runner = processor.run_range()
    try:
        def copied() -> Any:
            with target.connection() as conn:
                return conn.execute("SELECT event_ser_id, event_ser_manifest, event_payload FROM event_journal "
                                    "WHERE persistence_id = 'Blob|1'").fetchone()
        assert eventually(copied, "the copy") == (4242, "Opaque", b"\x00\xff")
    finally:
        runner.stop()
        runner.join(10)


def test_many_persistence_ids_in_one_statement_each_after_its_own_predecessor(journal: Journal) -> None:
    """``append_many_with_metadata_step``: several persistence ids of several partitions in one statement, each
    numbered after its ``expected``, stamped after its predecessor; an ``expected`` that does not exist writes
    nothing and is named; one already taken raises the key's violation."""
    meta = Stored(40, "RE", b"\x0a\x02eu")
    journal.append("Many|a", ["a1"])
    before = journal.query.load_envelope("Many|a", 1)
    pids = ["Many|a", "Many|b", "Many|c", "Many|d"]  # four slices, several partitions
    appends = {"Many|a": (1, [(Stored(1, "x", b"a2"), meta), (Stored(1, "x", b"a3"), meta)]),
               **{pid: (0, [(Stored(1, "x", pid.encode()), meta)]) for pid in pids[1:]}}
    with journal.connection() as conn, conn.transaction():
        numbers = run(append_many_with_metadata_step(journal, appends, writer="w"), conn)
    assert numbers == {"Many|a": [2, 3], "Many|b": [1], "Many|c": [1], "Many|d": [1]}
    with journal.connection() as conn:
        rows = {(pid, seq_nr): rest for pid, seq_nr, *rest in conn.execute(
            "SELECT persistence_id, seq_nr, db_timestamp, meta_ser_id, meta_ser_manifest, meta_payload, writer "
            "FROM event_journal WHERE persistence_id LIKE 'Many|%%'").fetchall()}
    assert sorted(rows) == [("Many|a", 1), ("Many|a", 2), ("Many|a", 3), ("Many|b", 1), ("Many|c", 1), ("Many|d", 1)]
    assert rows[("Many|a", 2)][0] > before.db_timestamp
    assert rows[("Many|a", 2)][0] == rows[("Many|a", 3)][0]  # one append's stamp
    assert rows[("Many|c", 1)][1:] == [40, "RE", b"\x0a\x02eu", "w"]

    missing = pytest.raises(InvalidArgument, match=r"'Many\|b' after seq_nr 5")
    with journal.connection() as conn, conn.transaction(), missing:
        run(append_many_with_metadata_step(journal, {"Many|b": (5, [(Stored(1, "x", b"b"), meta)])}), conn)
    with journal.connection() as conn, conn.transaction(), pytest.raises(psycopg.errors.UniqueViolation):
        run(append_many_with_metadata_step(journal, {"Many|c": (0, [(Stored(1, "x", b"c"), meta)])}), conn)
    assert journal.highest_seq_nr("Many|b") == 1 and journal.highest_seq_nr("Many|c") == 1
