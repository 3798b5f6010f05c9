"""Restarts cost what is new: one idle persistence id alone in a slice, last written a week ago, no longer
holds every restart back to its event (the range marks its idle slices, see OffsetStore.advance_markers);
events written to that slice after its old offset, while stopped and while running, are each handled once."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from test_projections import counters

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.projections import management
from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.projections.offset_store import OffsetStore, Record
from pgjournal.projections.runner import RangeRunner, run_range

IDLE = "Cart|idle"
IDLE2 = next(p for p in (f"Cart|quiet{i}" for i in range(1000))
             if slice_for_persistence_id(p) != slice_for_persistence_id(IDLE))
LOOKBACK = 2.0
# Spread the busy events one second apart over the hour before ten minutes ago (ordered per pid).
SPREAD = """
UPDATE event_journal AS e SET db_timestamp = now() - interval '70 minutes' + r.rn * interval '1 second'
FROM (SELECT persistence_id, seq_nr, row_number() OVER (ORDER BY db_timestamp, seq_nr, persistence_id) AS rn
      FROM event_journal WHERE entity_type = 'Cart' AND persistence_id <> ALL(%(idle)s)) AS r
WHERE e.persistence_id = r.persistence_id AND e.seq_nr = r.seq_nr"""
WEEK_AGO = "UPDATE event_journal SET db_timestamp = now() - interval '7 days' WHERE persistence_id = ANY(%s)"
# A late commit into an idle slice: the quiet pid's second event, stamped a second before the newest busy
# event (inside the restart lookback, after the quiet slice's week-old offset), written while stopped.
LATE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id,
                           event_ser_manifest, event_payload)
SELECT slice, entity_type, persistence_id, 2,
       (SELECT max(db_timestamp) FROM event_journal WHERE persistence_id LIKE 'Cart|b%%') - interval '1 second',
       writer, event_ser_id, event_ser_manifest, event_payload
FROM event_journal WHERE persistence_id = %s AND seq_nr = 1"""


def window_rows(journal: Journal) -> int:
    """Events at or after the newest one minus the lookback: what a restart reads again at least."""
    with journal.connection() as conn:
        return conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = 'Cart' AND db_timestamp >= "
                            "(SELECT max(db_timestamp) FROM event_journal WHERE entity_type = 'Cart') - %s "
                            "* interval '1 second'", (LOOKBACK,)).fetchone()[0]


def busy_pids(n: int) -> list[str]:
    idle_slices = {slice_for_persistence_id(IDLE), slice_for_persistence_id(IDLE2)}
    pids = (f"Cart|b{i}" for i in range(10 * n))
    return [p for p in pids if slice_for_persistence_id(p) not in idle_slices][:n]


def start_run(journal: Journal, projection: Projection) -> RangeRunner:
    return run_range(journal, projection, 0, 1023)


def stop(runner: RangeRunner) -> RangeRunner:
    runner.stop()
    runner.join(timeout=30)
    assert runner.failed is None, runner.failed
    return runner


def caught_up(journal: Journal, name: str) -> Any:
    return lambda: not counter_mismatches(journal, name, "Cart")


def test_restart_reads_what_is_new_and_the_idle_slice_loses_nothing(journal: Journal) -> None:
    ensure_counter_table(journal)
    name = "restart"
    settings = dataclasses.replace(FAST_PROJECTION, restart_lookback=LOOKBACK)
    projection = Projection(name, "Cart", counter_writer(name, grouped=False), settings)
    journal.append(IDLE, [{"n": 0}])
    journal.append(IDLE2, [{"n": 0}])
    busy = busy_pids(40)
    for pid in busy:
        journal.append(pid, [{"n": k} for k in range(10)])
    with journal.connection() as conn:
        conn.execute(WEEK_AGO, ([IDLE, IDLE2],))
        assert conn.execute(SPREAD, {"idle": [IDLE, IDLE2]}).rowcount == 400

    first = start_run(journal, projection)
    eventually(caught_up(journal, name), "first run counted 402 events")
    stop(first)
    assert first.stats.read == 402
    window = window_rows(journal)
    assert window <= 3  # one busy event a second

    # While stopped: new events elsewhere, one in the idle slice after its week-old offset, and a late commit
    # in the other idle slice, older than the newest offset but within the lookback.
    for pid in busy[:5]:
        journal.append(pid, [{"n": 10}])
    journal.append(IDLE, [{"n": 1}])
    with journal.connection() as conn:
        assert conn.execute(LATE, (IDLE2,)).rowcount == 1
    second = start_run(journal, projection)
    eventually(caught_up(journal, name), "restart counted the 7 new events")
    # Still running: the idle pid again.
    journal.append(IDLE, [{"n": 2}])
    eventually(caught_up(journal, name), "the idle pid's third event counted")
    stop(second)
    assert second.stats.handled == 8
    # Read: the 8 new events plus the busy events within the lookback (2 s) before the newest one, one per
    # second; the old code read all 400 busy events again (the week-old slices held the start back).
    assert second.stats.read <= 8 + window, second.stats

    # Nothing new: the restart reads only the lookback before the newest offset (the events just written lie
    # within it) and handles nothing.
    window = window_rows(journal)
    third = start_run(journal, projection)
    eventually(lambda: third.stats.read >= window, "third run read the lookback")
    stop(third)
    assert third.stats.handled == 0 and third.stats.read == window, third.stats
    assert counters(journal, name)[IDLE] == (3, 3) and counters(journal, name)[IDLE2] == (2, 2)
    assert counter_mismatches(journal, name, "Cart") == []


def test_start_is_the_earliest_safe_point_and_markers_move_it(journal: Journal) -> None:
    """A week-old slice holds the start back until a run marks it; a cleared slice starts at its first event."""
    journal.append(IDLE, [{"n": 0}])
    busy = busy_pids(3)
    for pid in busy:
        journal.append(pid, [{"n": 0}, {"n": 1}])
    with journal.connection() as conn:
        conn.execute(WEEK_AGO, ([IDLE],))
        conn.execute(SPREAD, {"idle": [IDLE]})
    rows = {e.persistence_id: e for pid in (IDLE, *busy)
            for e in journal.query.current_events_by_persistence_id(pid)}
    store = OffsetStore(journal, "m", "Cart", 0, 1023, time_window=10, lookback=LOOKBACK)
    with journal.connection() as conn, conn.transaction():
        store.load(conn)
        pending = {pid: Record(env.slice, env.seq_nr, env.db_timestamp) for pid, env in rows.items()}
        store.save(conn, pending, fenced=True)
        store.commit(pending)
    newest = max(e.db_timestamp for e in rows.values())

    def start() -> Any:
        s = OffsetStore(journal, "m", "Cart", 0, 1023, time_window=10, lookback=LOOKBACK)
        with journal.connection() as conn:
            offset = s.load(conn)
        return offset.timestamp if offset else None

    # Without markers: 1019 slices have no row (never processed) and the idle slice is a week old.
    assert start() == rows[IDLE].db_timestamp - timedelta(seconds=LOOKBACK)
    with journal.connection() as conn:
        assert store.advance_markers(conn) == 1024 - 1  # every slice but the newest one's
        assert store.advance_markers(conn) == 0  # nothing older left
    assert start() == newest - timedelta(seconds=LOOKBACK)
    # A cleared slice starts again at its first event (never processed as far as the store knows).
    management.clear_offset(journal, "m", rows[IDLE].slice, rows[IDLE].slice)
    assert start() == rows[IDLE].db_timestamp



def test_a_running_range_marks_its_idle_slices_so_a_crash_restart_is_bounded_too(journal: Journal) -> None:
    """Markers are also written every delete_interval (1 s here), not only on a clean stop: the start a
    restart after a crash would compute, read while the range still runs, is already near the newest offset."""
    ensure_counter_table(journal)
    name = "marked"
    projection = Projection(name, "Cart", counter_writer(name, grouped=False),
                            dataclasses.replace(FAST_PROJECTION, restart_lookback=LOOKBACK))
    journal.append(IDLE, [{"n": 0}])
    for pid in busy_pids(10):
        journal.append(pid, [{"n": k} for k in range(5)])
    with journal.connection() as conn:
        conn.execute(WEEK_AGO, ([IDLE],))
        conn.execute(SPREAD, {"idle": [IDLE]})
        newest = conn.execute("SELECT max(db_timestamp) FROM event_journal").fetchone()[0]

    def start() -> Any:
        store = OffsetStore(journal, name, "Cart", 0, 1023, time_window=10, lookback=LOOKBACK)
        with journal.connection() as conn:
            offset = store.load(conn)
        return offset.timestamp if offset else None

    runner = start_run(journal, projection)
    try:
        eventually(caught_up(journal, name), "51 events counted")
        eventually(lambda: start() == newest - timedelta(seconds=LOOKBACK), "markers written while running")
    finally:
        stop(runner)
