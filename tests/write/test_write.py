"""The write path against a real PostgreSQL: numbering, atomicity, conflicts, timestamps, writer, signals."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import psycopg
import pytest
from support.raw_events import MIXED_BATCH, Raw, expected_batch, raw_registry, stored_batch
from support.tags import tags_written

from pgjournal import ConcurrencyConflict, Journal, slice_for_persistence_id
from pgjournal.runtime.signals import CHANNEL
from pgjournal.store.events import insert_sql

PID = "Cart|1"


def rows(dsn: str, pid: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT seq_nr, db_timestamp, writer, tags, deleted FROM event_journal WHERE persistence_id = %s "
            "ORDER BY seq_nr", (pid,)
        ).fetchall()


def insert_row(dsn: str, pid: str, seq_nr: int, ts_sql: str = "now()", ser_id: int = 31,
               payload: bytes = b"{}") -> None:
    """Write a row behind the journal's back (another writer, a gap, a future timestamp...)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            f"event_ser_manifest, event_payload, writer) VALUES (%s, %s, %s, %s, {ts_sql}, %s, '', %s, 'sql')",
            (slice_for_persistence_id(pid), pid.partition("|")[0], pid, seq_nr, ser_id, payload),
        )


@pytest.mark.floor
def test_sequence_numbers_are_contiguous_across_appends(journal: Journal, dsn: str) -> None:
    first = journal.append(PID, [{"n": 1}, {"n": 2}, {"n": 3}])
    second = journal.append(PID, [{"n": 4}], expected_seq_nr=3)
    third = journal.append(PID, [{"n": 5}, {"n": 6}])
    assert [e.seq_nr for e in first + second + third] == [1, 2, 3, 4, 5, 6]
    assert [r[0] for r in rows(dsn, PID)] == [1, 2, 3, 4, 5, 6]
    assert journal.highest_seq_nr(PID) == 6
    assert [e.event for e in first] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert {e.slice for e in first} == {slice_for_persistence_id(PID)}
    assert {e.entity_type for e in first} == {"Cart"}


def test_empty_batch_writes_nothing(journal: Journal, dsn: str) -> None:
    assert journal.append(PID, []) == []
    assert rows(dsn, PID) == []


def test_a_clash_on_the_third_event_of_five_writes_nothing(journal: Journal, dsn: str) -> None:
    insert_row(dsn, PID, 3)  # another writer already holds seq nr 3
    with pytest.raises(ConcurrencyConflict) as caught:
        journal.append(PID, [{"n": i} for i in range(1, 6)], expected_seq_nr=0)
    assert caught.value.persistence_id == PID
    assert [r[0] for r in rows(dsn, PID)] == [3], "events 1 and 2 of the failed batch must not be written"


def test_conflict_carries_pid_seq_nr_expected_and_actual(journal: Journal, dsn: str) -> None:
    journal.append(PID, ["a", "b"])
    with pytest.raises(ConcurrencyConflict) as caught:
        journal.append(PID, ["c", "d"], expected_seq_nr=1)
    conflict = caught.value
    assert (conflict.persistence_id, conflict.seq_nr) == (PID, 2)
    assert (conflict.expected_seq_nr, conflict.actual_seq_nr) == (1, 2)
    message = str(conflict)
    assert PID in message and "expected" in message and "1" in message and "2" in message
    assert "nothing of this batch was written" in message
    assert [r[0] for r in rows(dsn, PID)] == [1, 2]


def test_expected_seq_nr_zero_on_existing_pid_conflicts(journal: Journal, dsn: str) -> None:
    journal.append(PID, ["a"])
    with pytest.raises(ConcurrencyConflict) as caught:
        journal.append(PID, ["b"], expected_seq_nr=0)
    assert (caught.value.seq_nr, caught.value.expected_seq_nr, caught.value.actual_seq_nr) == (1, 0, 1)
    assert len(rows(dsn, PID)) == 1


@pytest.mark.parametrize("count", [1, 3])
def test_expected_seq_nr_above_the_highest_conflicts_and_writes_nothing(journal: Journal, dsn: str,
                                                                       count: int) -> None:
    journal.append(PID, ["a", "b"])
    with pytest.raises(ConcurrencyConflict) as caught:
        journal.append(PID, ["x"] * count, expected_seq_nr=5)
    assert (caught.value.seq_nr, caught.value.expected_seq_nr, caught.value.actual_seq_nr) == (6, 5, 2)
    assert [r[0] for r in rows(dsn, PID)] == [1, 2]


def test_append_without_expectation_continues_after_a_gap(journal: Journal, dsn: str) -> None:
    insert_row(dsn, PID, 3)
    written = journal.append(PID, ["a", "b"])
    assert [e.seq_nr for e in written] == [4, 5]


def test_many_threads_without_expectation_lose_nothing(journal: Journal, dsn: str) -> None:
    threads, per_thread = 8, 25
    barrier = threading.Barrier(threads)

    def work(t: int) -> list[int]:
        barrier.wait()
        return [e.seq_nr for i in range(per_thread) for e in journal.append(PID, [{"t": t, "i": i}])]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    total = threads * per_thread
    assert sorted(s for r in results for s in r) == list(range(1, total + 1))
    assert [r[0] for r in rows(dsn, PID)] == list(range(1, total + 1))
    # each thread's own events are in the order it wrote them
    events = list(journal.query.current_events_by_persistence_id(PID))
    for t in range(threads):
        assert [e.event["i"] for e in events if e.event["t"] == t] == list(range(per_thread))


def test_many_threads_with_expectations_one_winner_per_seq_nr(journal: Journal, dsn: str) -> None:
    threads, target = 6, 60
    barrier = threading.Barrier(threads)
    wins: dict[int, int] = {}
    conflicts = Counter()
    lock = threading.Lock()

    def work(t: int) -> None:
        barrier.wait()
        while True:
            seen = journal.highest_seq_nr(PID)
            if seen >= target:
                return
            try:
                written = journal.append(PID, [{"t": t, "after": seen}], expected_seq_nr=seen)
            except ConcurrencyConflict as exc:
                assert exc.seq_nr == seen + 1 and exc.expected_seq_nr == seen
                with lock:
                    conflicts[t] += 1
                continue
            with lock:
                for env in written:
                    assert env.seq_nr not in wins, f"seq nr {env.seq_nr} won twice"
                    wins[env.seq_nr] = t

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    stored = list(journal.query.current_events_by_persistence_id(PID))
    assert [e.seq_nr for e in stored] == list(range(1, len(stored) + 1))
    assert sorted(wins) == [e.seq_nr for e in stored]
    for env in stored:  # the stored event is the winner's, written right after what it saw
        assert env.event == {"t": wins[env.seq_nr], "after": env.seq_nr - 1}
    assert sum(conflicts.values()) > 0, "the race should have produced conflicts"


def test_db_timestamps_never_go_backwards(journal: Journal, dsn: str) -> None:
    for i in range(20):
        journal.append(PID, [i], expected_seq_nr=i if i % 2 else None)
    stamps = [r[1] for r in rows(dsn, PID)]
    assert all(a < b for a, b in itertools.pairwise(stamps))


@pytest.mark.parametrize("expected", [None, 1])
@pytest.mark.parametrize("count", [1, 3])
def test_timestamp_after_a_future_previous_event(journal: Journal, dsn: str, expected: int | None,
                                                 count: int) -> None:
    insert_row(dsn, PID, 1, ts_sql="now() + interval '1 hour'")
    previous = rows(dsn, PID)[0][1]
    written = journal.append(PID, ["x"] * count, expected_seq_nr=expected)
    assert {e.db_timestamp for e in written} == {previous + timedelta(microseconds=1)}
    assert [r[1] for r in rows(dsn, PID)][1:] == [previous + timedelta(microseconds=1)] * count


def test_all_events_of_one_append_share_one_timestamp(journal: Journal, dsn: str) -> None:
    written = journal.append(PID, list(range(10)))
    assert len({e.db_timestamp for e in written}) == 1
    assert len({r[1] for r in rows(dsn, PID)}) == 1
    assert written[0].offset.timestamp == written[0].db_timestamp
    assert dict(written[3].offset.seen) == {PID: 4}


def test_writer_column_is_the_journal_writer_id(journal: Journal, dsn: str) -> None:
    journal.append(PID, ["a", "b"])
    assert {r[2] for r in rows(dsn, PID)} == {journal.writer_id}
    with Journal.open(dsn, writer_id="node-7") as other:
        other.append("Cart|2", ["c"])
        assert other.writer_id == "node-7"
    assert {r[2] for r in rows(dsn, "Cart|2")} == {"node-7"}
    assert journal.writer_id and journal.writer_id != "node-7"


@pytest.mark.floor
def test_tags_and_metadata_round_trip(journal: Journal, dsn: str) -> None:
    written = journal.append(PID, [{"a": 1}, {"b": 2}], tags=["red", "blue", "red"],
                             metadata={"trace": "abc", "n": [1, 2]})
    assert written[0].tags == ("red", "blue")
    assert {tuple(r[3]) for r in rows(dsn, PID)} == {("red", "blue")}
    read = list(journal.query.current_events_by_persistence_id(PID))
    assert [e.event for e in read] == [{"a": 1}, {"b": 2}]
    assert {e.tags for e in read} == {("red", "blue")}
    assert {str(e.metadata) for e in read} == {str({"trace": "abc", "n": [1, 2]})}
    journal.append("Cart|2", ["untagged"])
    (plain,) = journal.query.current_events_by_persistence_id("Cart|2")
    assert plain.tags == () and plain.metadata is None


def test_tags_with_array_syntax_characters_are_stored_as_given(journal: Journal, dsn: str) -> None:
    """Tags go to the server as one array-literal parameter: quotes, backslashes, braces, commas, spaces
    and the word NULL must come back unchanged, in the journal row and in the tag view."""
    tags = ['say "hi"', "back\\slash", "{braces,comma}", "NULL", " padded ", "ünï", "'; DROP TABLE x; --"]
    journal.append(PID, [{"a": 1}], tags=tags)
    assert {tuple(r[3]) for r in rows(dsn, PID)} == {tuple(tags)}
    tags_written(journal)
    with psycopg.connect(dsn) as conn:
        stored = {r[0] for r in conn.execute("SELECT tag_name FROM tag_views WHERE persistence_id = %s", (PID,))}
    assert stored == set(tags)


def test_a_batch_stores_every_payload_byte_and_manifest_as_given(dsn: str) -> None:
    """After none, after the writer's own last append, after the latest and inside a transaction: one batch
    statement each way, the same rows."""
    registry = raw_registry()
    n = len(MIXED_BATCH)
    with Journal.open(dsn, serializers=registry) as journal:
        written = journal.append(PID, MIXED_BATCH, expected_seq_nr=0)
        written += journal.append(PID, MIXED_BATCH[::-1], expected_seq_nr=n)
        written += journal.append(PID, MIXED_BATCH, expected_seq_nr=None)
        with journal.transaction() as tx:
            written += tx.append(PID, MIXED_BATCH[::-1], expected_seq_nr=3 * n)
        read = list(journal.query.current_events_by_persistence_id(PID))
    batches = [MIXED_BATCH, MIXED_BATCH[::-1]] * 2
    assert [e.seq_nr for e in written] == list(range(1, 4 * n + 1))
    assert [e.event for e in written] == [event for batch in batches for event in batch]
    assert stored_batch(dsn, PID) == [row for batch in batches for row in expected_batch(registry, batch)]
    assert [(e.event.manifest, e.event.payload) if isinstance(e.event, Raw) else e.event for e in read] == [
        (e.manifest, e.payload) if isinstance(e, Raw) else e for batch in batches for e in batch]


def test_insert_statement_has_no_notify_and_no_lock() -> None:
    for after_latest in (True, False):
        for single in (True, False):
            sql = insert_sql("event_journal", after_latest=after_latest, single=single).upper()
            assert "NOTIFY" not in sql and "LOCK " not in sql and "FOR UPDATE" not in sql
            assert "CLOCK_TIMESTAMP()" in sql and "CURRENT_TIMESTAMP" not in sql  # stamped after the lock


def test_notification_comes_after_commit_from_another_session(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener, Journal.open(dsn) as journal:
        listener.execute(f"LISTEN {CHANNEL}")
        journal.append(PID, ["a"])
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in notes] == ["Cart"]
        writers = {r[0] for r in listener.execute(  # the backends whose last statement was the INSERT
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE '%%INSERT INTO event_journal%%' AND pid <> pg_backend_pid()").fetchall()}
        assert writers, "the writing backend should be visible in pg_stat_activity"
        assert notes[0].pid not in writers, "NOTIFY must not run in the writing session"
        assert len(rows(dsn, PID)) == 1  # the event was committed when the signal arrived


def test_a_stream_of_appends_shares_signals(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most one round of signals per SEND_INTERVAL, however fast the appends come (an interval of 50 ms, so
    the appends are faster than it even on a busy machine or under SERIALIZABLE)."""
    interval = 0.05
    monkeypatch.setattr("pgjournal.runtime.signals.SEND_INTERVAL", interval)
    with psycopg.connect(dsn, autocommit=True) as listener, Journal.open(dsn) as journal:
        listener.execute(f"LISTEN {CHANNEL}")
        started = time.monotonic()
        for i in range(200):
            journal.append(PID, [i], expected_seq_nr=i)
        elapsed = time.monotonic() - started
        notes = list(listener.notifies(timeout=1))
        assert 1 <= len(notes) <= elapsed / interval + 2  # one round per interval, and the one after the last
        assert len(notes) < 200
        assert {n.payload for n in notes} == {"Cart"}


def test_a_signal_held_back_by_the_rate_limit_is_sent_late_not_dropped(dsn: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender's clock is the test's: the second append is inside the interval however slow the machine is,
    and the interval ends when the test says so."""
    now = [1000.0]
    monkeypatch.setattr("pgjournal.runtime.signals.time", SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    monkeypatch.setattr("pgjournal.runtime.signals.SEND_INTERVAL", 0.05)
    with psycopg.connect(dsn, autocommit=True) as listener, Journal.open(dsn) as journal:
        listener.execute(f"LISTEN {CHANNEL}")
        journal.append("Cart|1", ["a"])  # after a quiet spell: sent at once
        assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["Cart"]
        journal.append("Order|1", ["b"])  # within the interval (the clock has not moved): held back
        assert list(listener.notifies(timeout=0.5)) == []
        now[0] += 1.0  # the interval is over: the held-back signal goes
        assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["Order"]


def test_portable_mode_sends_no_notification(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener, Journal.open(dsn, portable=True) as journal:
        listener.execute(f"LISTEN {CHANNEL}")
        journal.append(PID, ["a"])
        assert list(listener.notifies(timeout=1, stop_after=1)) == []


def test_append_does_not_wait_for_another_open_writing_transaction(journal: Journal, dsn: str) -> None:
    """A table lock (SHARE, EXCLUSIVE, ...) would conflict with the ROW EXCLUSIVE lock of an open insert."""
    partition = slice_for_persistence_id(PID) // 128  # same partition of event_journal as PID
    other = next(p for i in range(10_000) if slice_for_persistence_id(p := f"Cart|o{i}") // 128 == partition)
    with psycopg.connect(dsn) as blocker:  # a transaction that inserted and has not committed
        blocker.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES (%s, 'Cart', %s, 1, now(), 31, '', '{}', 'x')",
            (slice_for_persistence_id(other), other),
        )
        done = threading.Event()

        def write() -> None:
            journal.append(PID, ["a"])
            journal.append(PID, ["b", "c"], expected_seq_nr=1)
            done.set()

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        assert done.wait(10), "append blocked behind another writer's open transaction"
        blocker.rollback()
    assert [r[0] for r in rows(dsn, PID)] == [1, 2, 3]


def test_an_append_after_its_own_last_event_reads_nothing_and_still_conflicts(dsn: str) -> None:
    """A journal that wrote a persistence id's last event knows its sequence number and timestamp, so its next
    append with that expected_seq_nr inserts a plain row (no read of the predecessor). Another journal's
    append in between still makes it a ConcurrencyConflict (the primary key), with nothing written, and time
    stays monotonic across writers."""
    known = insert_sql("event_journal_s0000_0127", single=True, after="known", tags=False, meta=False)
    assert "FROM" not in known.upper() and "GREATEST(clock_timestamp(), %(prev_ts)s" in known
    assert "tags" not in known and "meta_" not in known  # no parameters for columns left NULL
    tagged = insert_sql("event_journal_s0000_0127", single=True, after="known", tags=True, meta=False)
    assert "%(tags)s::text[]" in tagged and "meta_" not in tagged  # the batched tag writer's append
    with Journal.open(dsn) as first, Journal.open(dsn) as second:
        a = first.append(PID, ["a"], expected_seq_nr=0)[0]
        b = second.append(PID, ["b"], expected_seq_nr=1)[0]
        with pytest.raises(ConcurrencyConflict) as caught:
            first.append(PID, ["stale"], expected_seq_nr=1)  # first's own last event is 1; 2 is taken
        assert (caught.value.seq_nr, caught.value.actual_seq_nr) == (2, 2)
        c = first.append(PID, ["c"], expected_seq_nr=2)[0]  # looked up again: after second's event
        d = first.append(PID, ["d"], expected_seq_nr=3)[0]  # its own again
    stored = rows(dsn, PID)
    assert [r[0] for r in stored] == [1, 2, 3, 4]
    assert [r[1] for r in stored] == [a.db_timestamp, b.db_timestamp, c.db_timestamp, d.db_timestamp]
    assert all(x < y for x, y in itertools.pairwise(r[1] for r in stored))


def test_expected_seq_nr_zero_needs_no_lookup_and_conflicts_on_an_existing_pid(journal: Journal, dsn: str) -> None:
    insert_row(dsn, PID, 1)
    with pytest.raises(ConcurrencyConflict) as caught:
        journal.append(PID, ["x"], expected_seq_nr=0)
    assert caught.value.seq_nr == 1 and caught.value.actual_seq_nr == 1
    assert [r[0] for r in rows(dsn, PID)] == [1]
