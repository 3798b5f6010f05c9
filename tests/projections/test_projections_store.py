"""The offset store on its own: validation verdicts, the missing events a rejected envelope loads, the start
offset from rows of several old keys and never-processed slices, eviction and deletion of old rows."""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime

import pytest
from support import FAST
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.projections.offset_store import OffsetStore, Record, Verdict
from pgjournal.projections.runner import RangeRunner, run_range

ROW = """INSERT INTO projection_timestamp_offset_store (projection_name, projection_key, slice, persistence_id,
seq_nr, timestamp_offset, timestamp_consumed) VALUES (%s, %s, %s, %s, %s, %s, now())"""


def events(journal: Journal, pid: str) -> list[EventEnvelope]:
    return list(journal.query.current_events_by_persistence_id(pid))


def store_row(journal: Journal, name: str, key: str, env: EventEnvelope) -> None:
    with journal.connection() as conn:
        conn.execute(ROW, (name, key, env.slice, env.persistence_id, env.seq_nr, env.db_timestamp))


def test_validation_verdicts_and_missing_events_loaded_first(journal: Journal) -> None:
    journal.append("Cart|x", [{"n": k} for k in range(5)])
    journal.append("Cart|y", [{"n": k} for k in range(3)])
    x, y = events(journal, "Cart|x"), events(journal, "Cart|y")
    store_row(journal, "v", "0-1023", x[1])  # x processed up to 2
    if y[0].slice == x[0].slice:
        pytest.skip("needs x and y in different slices")
    store_row(journal, "v", "0-1023", y[2])  # y's slice has a row, but at y's last event only
    with journal.connection() as conn:
        conn.execute("DELETE FROM projection_timestamp_offset_store WHERE persistence_id = 'Cart|y'")
    journal.append("Cart|z", [{"n": 0}, {"n": 1}])
    store = OffsetStore(journal, "v", "Cart", 0, 1023, time_window=300)
    with journal.connection() as conn:
        store.load(conn)
        verdicts = [store.validate(conn, e, {}) for e in x]
        assert [v.verdict for v in verdicts] == [Verdict.DUPLICATE, Verdict.DUPLICATE, Verdict.ACCEPTED,
                                                 Verdict.REJECTED, Verdict.REJECTED]
        assert verdicts[4].after == 2
        # What an open transaction accepted counts: x3 pending makes x4 the next one.
        assert store.validate(conn, x[3], {"Cart|x": Record(x[2].slice, 3, x[2].db_timestamp)}).verdict \
            is Verdict.ACCEPTED
        # Unknown pid in a never-processed slice: seq 1 accepted; seq 2 rejected (its predecessor is not done).
        z = events(journal, "Cart|z")
        assert store.validate(conn, z[0], {}).verdict is Verdict.ACCEPTED
        rejected = store.validate(conn, z[1], {})
        assert (rejected.verdict, rejected.after) == (Verdict.REJECTED, 0)
        runner = RangeRunner(journal, Projection("v", "Cart", counter_writer("v")), 0, 1023)
        pending: dict[str, Record] = {}
        loaded = runner._admit(conn, store, x[4], pending)
        assert [(e.persistence_id, e.seq_nr) for e in loaded] == [("Cart|x", 3), ("Cart|x", 4), ("Cart|x", 5)]
        assert pending["Cart|x"].seq_nr == 5
        assert runner.stats.rejected == 1


def test_start_offset_is_the_earliest_latest_offset_of_the_slices(journal: Journal) -> None:
    pids: dict[int, str] = {}
    i = 0
    while len(pids) < 3:  # three pids in three different slices, in ascending slice order
        pid = f"Cart|s{i}"
        pids.setdefault(slice_for_persistence_id(pid), pid)
        i += 1
    a, b, c = (pids[s] for s in sorted(pids))
    for pid in (a, c, b):  # time order: a, c, b (each append is stamped later than the one before returned)
        journal.append(pid, [{"n": 1}])
    ea, eb, ec = events(journal, a)[0], events(journal, b)[0], events(journal, c)[0]
    assert ea.db_timestamp < ec.db_timestamp < eb.db_timestamp
    store_row(journal, "s", "old-key-1", ea)  # rows from two old layouts
    store_row(journal, "s", "old-key-2", eb)

    def start(lo: int, hi: int) -> datetime | None:
        store = OffsetStore(journal, "s", "Cart", lo, hi, time_window=300)
        with journal.connection() as conn:
            offset = store.load(conn)
        return offset.timestamp if offset else None

    sa, sb, sc = ea.slice, eb.slice, ec.slice
    assert start(sa, sb) == ea.db_timestamp  # the earliest of the latest offsets
    assert start(sb, sb) == eb.db_timestamp
    assert start(sc, sc) is None  # never processed: from the beginning
    lo, hi = min(sb, sc), max(sb, sc)
    # Slice c has no row: its first event, earlier than b's offset, lowers the start.
    assert start(lo, hi) == ec.db_timestamp


def test_old_rows_are_deleted_and_old_events_stay_duplicates(dsn: str) -> None:
    settings = {**FAST, "backtracking_window": 0.5, "backtracking_behind_current_time": 0.5}
    with Journal.open(dsn, **settings) as journal:
        ensure_counter_table(journal)
        # No periodic deletion during the runs (under load a run can outlast 1 s): this test deletes itself.
        projection = Projection("evict", "Cart", counter_writer("evict", grouped=False),
                                dataclasses.replace(FAST_PROJECTION, delete_interval=600.0))
        for i in range(10):
            journal.append(f"Cart|e{i}", [{"n": k} for k in range(4)])

        def run() -> RangeRunner:
            runner = run_range(journal, projection, 0, 1023)
            with contextlib.suppress(AssertionError):  # the assertions after each run say what is missing
                eventually(lambda: not counter_mismatches(journal, "evict", "Cart"), "caught up", interval=0.1)
            runner.stop()
            runner.join()
            return runner

        run()
        rows = ("SELECT count(*) FILTER (WHERE persistence_id <> ''), count(DISTINCT slice) "
                "FROM projection_timestamp_offset_store WHERE projection_name = 'evict'")
        with journal.connection() as conn:
            # One per envelope in exactly-once mode; on stop every slice got a row (a marker where needed).
            assert conn.execute(rows).fetchone() == (40, 1024)
            # The next events come more than the window (2 x lookback = 2 s) after every stored one.
            eventually(lambda: conn.execute("SELECT clock_timestamp() > max(db_timestamp) + interval '2.1 s' "
                                            "FROM event_journal").fetchone()[0], "the window passed", timeout=10)
        for i in range(3):
            journal.append(f"Cart|e{i}", [{"n": 9}])
        run()
        store = OffsetStore(journal, "evict", "Cart", 0, 1023, time_window=2.0)
        with journal.connection() as conn:
            deleted = store.delete_old(conn)
            assert deleted > 0
            remaining = conn.execute("SELECT slice, persistence_id, seq_nr FROM projection_timestamp_offset_store "
                                     "WHERE projection_name = 'evict' AND persistence_id <> ''").fetchall()
        # Superseded rows are gone; of the old ones only each slice's latest stays.
        assert len({pid for _, pid, _ in remaining}) == len(remaining)
        assert {(pid, seq) for _, pid, seq in remaining} >= {(f"Cart|e{i}", 5) for i in range(3)}
        # A run after the deletion reads old events again and still counts nothing twice.
        runner = run()
        assert counter_mismatches(journal, "evict", "Cart") == []
        assert runner.stats.handled == 0
