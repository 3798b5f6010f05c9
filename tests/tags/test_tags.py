"""The tag path on a real PostgreSQL: tagged appends of the in-statement writer (same transaction; ``tj``),
events_by_tag current and live, restart from offsets, gap timeout, delayed commits, bucket boundaries, the fixed
bucket size. The reads run on both faces with the default tag writer (``tface``: the ``face`` fixture with the
tag settings); the tests that fake the writer's clock or hold its progress row pin the in-statement writer."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support import PORTABLE
from support.faces import Face, Kind, open_face
from support.tags import IN_STATEMENT, TAGS, collect, progress, tag_rows, tags_written

from pgjournal import (
    ConcurrencyConflict,
    ConfigurationError,
    Journal,
    JournalError,
    NoOffset,
    SerializationError,
    Source,
)
from pgjournal.buckets import BucketSize
from pgjournal.model.timeuuid import GENERATOR, UUID_EPOCH_OFFSET, TimeUUIDGenerator, compare, ms_of_ticks, order_key
from pgjournal.query.by_tag import MissingTaggedEventsError, TagEnvelope, TagStream
from pgjournal.tags import statement_writer as tag_write_module


@pytest.fixture
def tj(dsn: str) -> Iterator[Journal]:
    """A journal of the in-statement tag writer."""
    with Journal.open(dsn, **IN_STATEMENT) as opened:
        yield opened


@pytest.fixture
def tface(face_kind: Kind, dsn: str) -> Iterator[Face]:
    """``tj`` on each face (tests/support/faces.py)."""
    with open_face(face_kind, dsn, **TAGS) as opened:
        yield opened


@pytest.fixture(params=["default", "portable"])
def mode_tface(request: pytest.FixtureRequest, face_kind: Kind, dsn: str) -> Iterator[Face]:
    """The in-statement writer (its progress row is what a test holds), in each mode, on each face."""
    with open_face(face_kind, dsn, portable=request.param == "portable", **IN_STATEMENT) as opened:
        yield opened


def sql(dsn: str, statement: str, params: Any = None) -> Any:
    """One statement on a connection of the test's own (committed), whichever face is tested."""
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchone() if cur.description is not None else None


def settle(journal: Journal | Face) -> None:
    time.sleep(journal.settings.tag_eventual_consistency_delay + 0.05)


def assert_exactly_once_in_order(envs: list[TagEnvelope], expected: dict[str, int]) -> None:
    """Every pid's events 1..n once each, in order (all events tagged, so tag seq == seq nr)."""
    per_pid: dict[str, list[int]] = {}
    for env in envs:
        per_pid.setdefault(env.persistence_id, []).append(env.tag_pid_sequence_nr)
        assert env.tag_pid_sequence_nr == env.seq_nr
    assert per_pid == {pid: list(range(1, n + 1)) for pid, n in expected.items()}


# -- write -------------------------------------------------------------------------------------------


def test_tagged_append_writes_tag_rows_with_per_tag_sequence_numbers(tj: Journal) -> None:
    tj.append("Cart|a", [{"n": 1}, {"n": 2}], tags=["x", "y"])
    tj.append("Cart|a", [{"n": 3}], tags=["x"])
    tj.append("Cart|b", [{"n": 1}], tags=["y"])
    tj.append("Cart|a", [{"n": 4}])  # untagged: no tag row, numbers unchanged
    tj.append("Cart|a", [{"n": 5}], tags=["y"])
    tj.append("Cart|b", [{"n": 2}, {"n": 3}], tags=["y"])  # several events, one tag
    assert tag_rows(tj, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2), ("Cart|a", 3, 3)]
    assert tag_rows(tj, "y") == [("Cart|a", 1, 1), ("Cart|a", 2, 2), ("Cart|a", 5, 3), ("Cart|b", 1, 1),
                                 ("Cart|b", 2, 2), ("Cart|b", 3, 3)]
    assert progress(tj) == {("Cart|a", "x"): (3, 3), ("Cart|a", "y"): (5, 3), ("Cart|b", "y"): (3, 3)}
    with tj.connection() as conn:
        stamps = [r[0] for r in conn.execute(
            "SELECT timestamp FROM tag_views WHERE tag_name = 'y' AND persistence_id = 'Cart|a' "
            "ORDER BY tag_pid_sequence_nr")]
        stamps_b = [r[0] for r in conn.execute(
            "SELECT timestamp FROM tag_views WHERE tag_name = 'y' AND persistence_id = 'Cart|b' "
            "ORDER BY tag_pid_sequence_nr")]
        buckets = {r[0] for r in conn.execute("SELECT timebucket FROM tag_views")}
    assert all(compare(a, b) == -1 for a, b in itertools.pairwise(stamps))
    assert all(compare(a, b) == -1 for a, b in itertools.pairwise(stamps_b))
    assert all(s.version == 1 for s in stamps + stamps_b)
    assert all(b % BucketSize.MINUTE.millis == 0 for b in buckets)


def test_failed_tagged_append_writes_nothing_anywhere(tj: Journal) -> None:
    tj.append("Cart|a", [{"n": 1}], tags=["x"])
    before = (tag_rows(tj, "x"), progress(tj))
    # A tag row that the database rejects must take the journal row down with it: one transaction.
    with tj.connection() as conn:
        conn.execute("ALTER TABLE tag_views ADD CONSTRAINT no_boom CHECK (tag_name <> 'boom')")
    with pytest.raises(JournalError, match="no_boom") as refused:
        tj.append("Cart|a", [{"n": 2}, {"n": 3}], tags=["x", "boom"])
    assert isinstance(refused.value.__cause__, psycopg.errors.CheckViolation)
    assert tj.highest_seq_nr("Cart|a") == 1
    # A stale expectation: nothing of the batch, tag rows included.
    with pytest.raises(ConcurrencyConflict):
        tj.append("Cart|a", [{"n": 2}], expected_seq_nr=0, tags=["x"])
    assert (tag_rows(tj, "x"), progress(tj)) == before
    tj.append("Cart|a", [{"n": 2}], expected_seq_nr=1, tags=["x"])
    assert tag_rows(tj, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2)]


def test_one_tagged_event_rows_for_every_predecessor_form_and_metadata(dsn: str, tj: Journal) -> None:
    """One event with one tag has a statement of its own: after the latest, after a stated expected_seq_nr this
    writer has not appended (looked up), after its own last append (not looked up), with and without
    metadata, its tag view row carries the event and metadata as the journal holds them, numbered on from the
    progress, which moves with it; an append that writes no event (a stale expectation) writes no tag row."""
    tj.append("Cart|m", [{"n": 1}], tags=["x"])  # after the latest (none)
    with Journal.open(dsn, **IN_STATEMENT) as other:  # knows nothing of Cart|m: looks the predecessor up
        other.append("Cart|m", [{"n": 2}], expected_seq_nr=1, tags=["x"], metadata={"m": 2})
    tj.append("Cart|m", [{"n": 3}], expected_seq_nr=2, tags=["x"])  # looked up (tj's last append was 1)
    tj.append("Cart|m", [{"n": 4}], expected_seq_nr=3, tags=["x"], metadata={"m": 4})  # its own last: known
    tj.append("Cart|m", [{"n": 5}], tags=["y"])
    with pytest.raises(ConcurrencyConflict):
        tj.append("Cart|m", [{"n": 6}], expected_seq_nr=7, tags=["x"])
    with pytest.raises(ConcurrencyConflict):
        tj.append("Cart|m", [{"n": 6}], expected_seq_nr=3, tags=["x"])
    assert tag_rows(tj, "x") == [("Cart|m", 1, 1), ("Cart|m", 2, 2), ("Cart|m", 3, 3), ("Cart|m", 4, 4)]
    assert tag_rows(tj, "y") == [("Cart|m", 5, 1)]
    assert progress(tj) == {("Cart|m", "x"): (4, 4), ("Cart|m", "y"): (5, 1)}
    with tj.connection() as conn:
        mismatched = conn.execute("""
            SELECT t.sequence_nr FROM tag_views AS t JOIN event_journal AS e
                ON e.persistence_id = t.persistence_id AND e.seq_nr = t.sequence_nr
            WHERE t.writer_uuid IS DISTINCT FROM e.writer OR t.ser_id IS DISTINCT FROM e.event_ser_id
               OR t.ser_manifest IS DISTINCT FROM e.event_ser_manifest OR t.event IS DISTINCT FROM e.event_payload
               OR t.meta_ser_id IS DISTINCT FROM e.meta_ser_id
               OR t.meta_ser_manifest IS DISTINCT FROM e.meta_ser_manifest
               OR t.meta_payload IS DISTINCT FROM e.meta_payload""").fetchall()
        with_meta = conn.execute("SELECT sequence_nr FROM tag_views WHERE meta_payload IS NOT NULL "
                                 "ORDER BY sequence_nr").fetchall()
    assert mismatched == [] and with_meta == [(2,), (4,)]
    settle(tj)
    envs = list(tj.query.current_events_by_tag("x"))
    assert [(e.seq_nr, e.event) for e in envs] == [(n, {"n": n}) for n in range(1, 5)]
    assert [order_key(e.offset.value) for e in envs] == sorted(order_key(e.offset.value) for e in envs)


def test_new_timeuuid_low_bytes_reach_the_cached_statement(tj: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tagged statement is cached with this process's TimeUUID low bytes written into it: new low bytes
    (drawn after fork) must give a new statement, not the cached one with the old bytes."""
    generator = TimeUUIDGenerator()
    monkeypatch.setattr(tag_write_module, "GENERATOR", generator)
    tj.append("Cart|f", [1], tags=["x"])
    first = generator.lsb
    generator.reseed()
    tj.append("Cart|f", [2], tags=["x"])
    with tj.connection() as conn:
        rows = conn.execute("SELECT ts_lsb, ts_time, timestamp FROM tag_views WHERE persistence_id = 'Cart|f' "
                            "ORDER BY tag_pid_sequence_nr").fetchall()
    assert [lsb for lsb, _, _ in rows] == [first, generator.lsb] and first != generator.lsb
    assert all(order_key(stamp) == (ticks, lsb) for lsb, ticks, stamp in rows)


def test_a_forked_child_draws_new_timeuuid_low_bytes() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # only a pipe write in the child: no locks another thread might have held
        os.write(write, str(GENERATOR.lsb).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        assert int(pipe.read()) != GENERATOR.lsb


@pytest.mark.parametrize("tags", [["x", "y"], ["x"]], ids=["two tags", "one tag"])
def test_racing_appends_keep_tag_sequence_numbers_contiguous(tj: Journal, tags: list[str]) -> None:
    def work() -> None:
        for _ in range(20):
            tj.append("Cart|hot", [{"n": 1}], tags=tags)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tag in tags:
        assert tag_rows(tj, tag) == [("Cart|hot", n, n) for n in range(1, 81)]
    assert progress(tj)[("Cart|hot", "x")] == (80, 80)
    # Racing writers of one pid: the statement raises the TimeUUID above the pid's last one, so TimeUUID
    # order is tag sequence order (the stream's offsets depend on it). The SQL-built UUID matches its keys.
    with tj.connection() as conn:
        rows = conn.execute("SELECT timestamp, ts_time, ts_lsb, timebucket FROM tag_views WHERE tag_name = 'x' "
                            "ORDER BY tag_pid_sequence_nr").fetchall()
    assert all(compare(a[0], b[0]) == -1 for a, b in itertools.pairwise(rows))
    assert all(order_key(stamp) == (ticks, lsb) for stamp, ticks, lsb, _ in rows)
    assert all(bucket == BucketSize.MINUTE.bucket_of(ms_of_ticks(ticks)) for _, ticks, _, bucket in rows)


def test_bucket_size_is_fixed_once_tagged_data_exists(dsn: str) -> None:
    with Journal.open(dsn, tag_bucket_size="Hour") as early:  # opened before any tagged event
        with Journal.open(dsn, tag_bucket_size="Minute") as first:
            first.append("Cart|a", [1], tags=["x"])
        with pytest.raises(ConfigurationError, match="Minute"):
            early.append("Cart|a", [2], tags=["x"])
    with pytest.raises(ConfigurationError, match="tag_bucket_size=Minute"):
        Journal.open(dsn, tag_bucket_size="Hour")
    with Journal.open(dsn, tag_bucket_size="Minute") as again:
        again.append("Cart|a", [2], tags=["x"])


# -- queries -----------------------------------------------------------------------------------------


def test_current_events_by_tag_in_order_and_restart_from_offset(tface: Face) -> None:
    written = {f"Cart|{i}": 0 for i in range(4)}
    for round_ in range(3):
        for pid in written:
            tface.append(pid, [{"r": round_, "k": 1}, {"r": round_, "k": 2}], tags=["x"])
            written[pid] += 2
    tface.append("Other|1", [1], tags=["not-x"])
    settle(tface)
    envs = list(tface.query.current_events_by_tag("x"))
    assert_exactly_once_in_order(envs, written)
    keys = [env.timestamp for env in envs]
    assert all(compare(a, b) == -1 for a, b in itertools.pairwise(keys))
    assert envs[0].event == {"r": 0, "k": 1} and envs[0].tags == ("x",)
    # Restart after every position: exactly the rest, each once.
    for i in (0, 7, len(envs) - 1):
        rest = list(tface.query.current_events_by_tag("x", envs[i].offset))
        assert [(e.persistence_id, e.seq_nr) for e in rest] == [(e.persistence_id, e.seq_nr) for e in envs[i + 1:]]


def test_live_events_by_tag_follows_new_events_and_resumes(tface: Face) -> None:
    tface.append("Cart|1", [1, 2], tags=["x"])
    with tface.query.events_by_tag("x") as stream:
        first = collect(stream, 2)
        tface.append("Cart|2", [1], tags=["x"])
        tface.append("Cart|1", [3], tags=["x"])
        second = collect(stream, 2)
    assert [(e.persistence_id, e.seq_nr) for e in first + second] == [
        ("Cart|1", 1), ("Cart|1", 2), ("Cart|2", 1), ("Cart|1", 3)]
    tface.append("Cart|2", [2], tags=["x"])
    with tface.query.events_by_tag("x", second[0].offset) as resumed:
        rest = collect(resumed, 2)
    assert [(e.persistence_id, e.seq_nr) for e in rest] == [("Cart|1", 3), ("Cart|2", 2)]


def test_gap_fails_after_gap_timeout_naming_tag_pid_and_numbers(tface: Face, dsn: str) -> None:
    tface.append("Cart|g", [1, 2, 3, 4], tags=["x"])
    tags_written(tface)
    sql(dsn, "DELETE FROM tag_views WHERE persistence_id = 'Cart|g' AND tag_pid_sequence_nr IN (2, 3)")
    settle(tface)
    started = time.monotonic()
    seen = []
    with pytest.raises(MissingTaggedEventsError) as failure:
        seen.extend(tface.query.current_events_by_tag("x"))
    assert time.monotonic() - started >= tface.settings.tag_gap_timeout
    assert (failure.value.tag, failure.value.persistence_id, failure.value.missing) == ("x", "Cart|g", [2, 3])
    assert "'Cart|g'" in str(failure.value) and "2, 3" in str(failure.value)


def test_a_live_query_catching_up_reads_the_horizon_once_per_bound(dsn: str) -> None:
    """Full pages below the last bound are read without asking the horizon and the watermark again (what was
    settled stays settled); a page that is not full asks again, so new events are still seen."""
    with Journal.open(dsn, **dict(IN_STATEMENT, buffer_size=10)) as journal:
        for i in range(35):
            journal.append(f"Cart|{i % 4}", [i], tags=["x"])
        settle(journal)
        stream = TagStream(journal, "x", NoOffset, live=True)
        tracker, readings = stream._tracker, []
        real_read = tracker.read_step

        def counted() -> Any:
            readings.append(1)
            return (yield from real_read())

        tracker.read_step = counted  # type: ignore[method-assign]
        events: list[int] = []
        while len(events) < 35:
            made, _rows = stream.poll()
            events.extend(e.event for e in made)
        assert (events, len(readings)) == (list(range(35)), 1)
        journal.append("Cart|9", [35], tags=["x"])
        settle(journal)
        made, _rows = stream.poll()
        assert ([e.event for e in made], len(readings)) == ([35], 2)


def test_first_event_missing_from_no_offset_is_a_gap(tface: Face, dsn: str) -> None:
    tface.append("Cart|g", [1, 2], tags=["x"])
    tags_written(tface)
    sql(dsn, "DELETE FROM tag_views WHERE persistence_id = 'Cart|g' AND tag_pid_sequence_nr = 1")
    settle(tface)
    with pytest.raises(MissingTaggedEventsError) as failure:
        list(tface.query.current_events_by_tag("x"))
    assert failure.value.missing == [1]


@pytest.mark.parametrize("chunk", [1, 2, 50], ids=["whole pages", "2-row chunks", "50-row chunks"])
def test_gap_filled_before_the_timeout_is_delivered_in_order(tface: Face, dsn: str, chunk: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The gap row arrives mid-page (and mid-chunk when streamed); the rows after it are still handled."""
    monkeypatch.setattr("pgjournal.query.by_tag.STREAM_CHUNK", chunk)
    tface.append("Cart|g", [1, 2, 3], tags=["x"])
    tface.append("Cart|h", [1, 2, 3, 4], tags=["x"])
    tface.append("Cart|g", [4, 5], tags=["x"])
    tags_written(tface)
    saved = sql(dsn, "SELECT * FROM tag_views WHERE persistence_id = 'Cart|g' AND tag_pid_sequence_nr = 2")
    sql(dsn, "DELETE FROM tag_views WHERE persistence_id = 'Cart|g' AND tag_pid_sequence_nr = 2")
    settle(tface)
    stream = tface.query.events_by_tag("x")
    restorer = threading.Timer(0.4, lambda: _insert_row(dsn, saved))
    restorer.start()
    envs = collect(stream, 9)
    stream.close()
    assert [e.seq_nr for e in envs if e.persistence_id == "Cart|g"] == [1, 2, 3, 4, 5]
    assert [e.seq_nr for e in envs if e.persistence_id == "Cart|h"] == [1, 2, 3, 4]


def _insert_row(dsn: str, row: tuple[Any, ...]) -> None:
    sql(dsn, f"INSERT INTO tag_views VALUES ({', '.join(['%s'] * len(row))})", row)


def test_new_persistence_id_from_an_offset_in_the_current_bucket(tface: Face) -> None:
    tface.append("Cart|old", [1, 2], tags=["x"])
    tface.append("Cart|mark", [1], tags=["x"])
    settle(tface)
    mark = list(tface.query.current_events_by_tag("x"))[-1]
    # From the offset, Cart|old is new to the stream and continues at 3: accepted (its 1, 2 are before it).
    with tface.query.events_by_tag("x", mark.offset) as stream:
        tface.append("Cart|old", [3], tags=["x"])
        tface.append("Cart|new", [1], tags=["x"])
        envs = collect(stream, 2)
    assert [(e.persistence_id, e.tag_pid_sequence_nr) for e in envs] == [("Cart|old", 3), ("Cart|new", 1)]


def test_delayed_commit_is_delivered_once_and_in_order(mode_tface: Face) -> None:
    """A tagged append held open (its progress row locked by the test) while other writers commit."""
    journal = mode_tface
    journal.append("Cart|slow", [0], tags=["x"])
    with journal.query.events_by_tag("x") as stream:
        got = collect(stream, 1)
        blocker = psycopg.connect(journal.dsn)  # a transaction the test controls
        blocker.execute("SELECT * FROM tag_write_progress WHERE persistence_id = 'Cart|slow' FOR UPDATE")
        held = threading.Thread(target=journal.append, args=("Cart|slow", [1]), kwargs={"tags": ["x"]})
        held.start()
        time.sleep(0.2)  # the held append has its TimeUUID and waits on the lock
        for i in range(5):
            journal.append(f"Cart|fast{i}", [1, 2], tags=["x"])
        got += collect(stream, 10, timeout=5) if journal.settings.portable else []
        time.sleep(0.6)  # far longer than the eventual consistency delay
        blocker.commit()
        blocker.close()
        held.join()
        journal.append("Cart|slow", [2], tags=["x"])
        got += collect(stream, 12 - len(got) + 1)
    expected = {"Cart|slow": 3, **{f"Cart|fast{i}": 2 for i in range(5)}}
    per_pid: dict[str, list[int]] = {}
    for env in got:
        per_pid.setdefault(env.persistence_id, []).append(env.tag_pid_sequence_nr)
    assert per_pid == {pid: list(range(1, n + 1)) for pid, n in expected.items()}
    late = next(e for e in got if e.persistence_id == "Cart|slow" and e.tag_pid_sequence_nr == 2)
    if journal.settings.portable:
        # Passed by the cursor, then found by back tracking (or the gap search of the next event). Under
        # SERIALIZABLE (PGJOURNAL_TEST_PORTABLE=1) the held append may instead be cancelled and retried, with a
        # new TimeUUID taken for the retry: then the cursor simply reads it in order.
        assert late.source is Source.BACKTRACKING or late.offset.value != late.timestamp or PORTABLE
    else:
        # The visibility horizon held the cursor back: everything arrives in TimeUUID order.
        stamps = [e.timestamp for e in got]
        assert all(compare(a, b) == -1 for a, b in itertools.pairwise(stamps))
    offsets = [e.offset for e in got]
    assert all(a <= b for a, b in itertools.pairwise(offsets))


def test_events_straddling_bucket_boundaries(face_kind: Kind, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    boundary_ms = (int(time.time() * 1000) // 60_000 - 10) * 60_000  # a minute boundary 10 minutes ago
    fake = {"ns": 0}
    monkeypatch.setattr(tag_write_module, "GENERATOR", TimeUUIDGenerator(clock=lambda: fake["ns"]))
    plan = [(-30, "Cart|a"), (-25, "Cart|y1"), (-20, "Cart|b"), (-1, "Cart|a"), (0, "Cart|b"), (0, "Cart|c"),
            (1, "Cart|a"), (59_999, "Cart|c"), (60_000, "Cart|a"), (60_005, "Cart|y2")]
    # The writer's clock is faked: the in-statement writer's TimeUUIDs come from it.
    with open_face(face_kind, dsn, **dict(IN_STATEMENT, buffer_size=2)) as journal:  # pages of 2 end on boundaries
        for offset_ms, pid in plan:
            fake["ns"] = (boundary_ms + offset_ms) * 1_000_000
            journal.append(pid, [{"at": offset_ms}], tags=["y" if "y" in pid else "x"])
        envs = list(journal.query.current_events_by_tag("x"))
        assert [e.event["at"] for e in envs] == [at for at, pid in plan if "y" not in pid]
        assert_exactly_once_in_order(envs, {"Cart|a": 4, "Cart|b": 2, "Cart|c": 2})
        buckets = [e.db_timestamp.timestamp() * 1000 // 60_000 * 60_000 for e in envs]
        assert buckets == [boundary_ms - 60_000] * 3 + [boundary_ms] * 4 + [boundary_ms + 60_000]
        # Resume from the last event before the boundary, and from the first after it.
        rest = list(journal.query.current_events_by_tag("x", envs[2].offset))
        assert [e.event["at"] for e in rest] == [0, 0, 1, 59_999, 60_000]
        with journal.query.events_by_tag("x", envs[3].offset) as live:
            assert [e.event["at"] for e in collect(live, 4)] == [0, 1, 59_999, 60_000]
    after = time.strftime("%Y%m%dT%H:%M", time.gmtime(boundary_ms / 1000 + 60))  # the bucket after the boundary
    with open_face(face_kind, dsn, **dict(IN_STATEMENT, tag_first_time_bucket=after)) as late_start:
        assert [e.persistence_id for e in late_start.query.current_events_by_tag("y")] == ["Cart|y2"]
        # From NoOffset a persistence id must start at 1: Cart|a's 4th event alone is a gap.
        with pytest.raises(MissingTaggedEventsError) as failure:
            list(late_start.query.current_events_by_tag("x"))
        assert (failure.value.persistence_id, failure.value.missing) == ("Cart|a", [1, 2, 3])


def test_a_failed_poll_changes_nothing_and_is_retried(tface: Face, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database lost in the middle of a page (streamed in chunks, the first one taken): the live loop
    retries, nothing is lost or repeated."""
    from pgjournal.query.gate import Gate

    monkeypatch.setattr("pgjournal.query.by_tag.STREAM_CHUNK", 2)
    tface.append("Cart|1", [1, 2, 3], tags=["x"])
    tface.append("Cart|2", [1, 2], tags=["x"])
    settle(tface)
    real, calls = Gate.take_leading, {"n": 0}

    def flaky(self: Gate[Any], *args: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(self, *args)

    monkeypatch.setattr(Gate, "take_leading", flaky)
    with tface.query.events_by_tag("x") as stream:
        envs = collect(stream, 5)
    assert calls["n"] > 3
    assert_exactly_once_in_order(envs, {"Cart|1": 3, "Cart|2": 2})


@dataclasses.dataclass(frozen=True)
class Added:
    item: str


def test_a_catch_up_decodes_each_payload_as_deserialize_does(tface: Face, dsn: str) -> None:
    """The catch-up's plain-JSON shortcut gives what ``deserialize`` gives: plain JSON as data (what msgspec
    refuses, NaN, out of float range, gzip, as ``json.loads`` reads it), a registered type as its class, other
    payloads through their own path; a payload that does not decode raises deserialize's error naming the row and
    the tag when the reader takes it, and a live query hands it out again rather than skip it."""
    tface.serializers.register(Added, "cart.added")
    tface.append("Cart|1", [{"n": 1}, Added("sku-1"), 7, {"é": "ü"}, 0, 0, 0], tags=["x"])
    tags_written(tface)
    big = gzip.compress(b'{"big": "' + b"x" * 40_000 + b'"}')
    for seq_nr, payload in ((5, b"NaN"), (6, b'{"x": 1e400}'), (7, big)):
        sql(dsn, "UPDATE tag_views SET ser_id = 31, ser_manifest = 'com.example.Any', event = %s "
                 "WHERE persistence_id = 'Cart|1' AND sequence_nr = %s", (payload, seq_nr))
    settle(tface)
    events = [e.event for e in tface.query.current_events_by_tag("x")]
    assert events[:4] == [{"n": 1}, Added("sku-1"), 7, {"é": "ü"}]
    assert math.isnan(events[4]) and events[5] == json.loads('{"x": 1e400}') and events[6] == {"big": "x" * 40_000}
    sql(dsn, "UPDATE tag_views SET event = %s WHERE persistence_id = 'Cart|1' AND sequence_nr = 2", (b'{"n": \xff',))
    read = iter(tface.query.current_events_by_tag("x"))
    assert next(read).event == {"n": 1}
    with pytest.raises(SerializationError, match=r"'Cart\|1' seq_nr 2 \(tag 'x'\)"):
        next(read)
    with tface.query.events_by_tag("x") as live:
        assert next(live).event == {"n": 1}
        for _ in range(2):
            with pytest.raises(SerializationError, match=r"'Cart\|1' seq_nr 2 \(tag 'x'\)"):
                next(live)


def test_long_back_track_finds_what_the_short_one_cannot(face_kind: Kind, dsn: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A row that appears 15 s behind the cursor: beyond the short back track's period, within "max"."""
    # The writer's clock is faked: the in-statement writer's TimeUUIDs come from it.
    settings = dict(IN_STATEMENT, portable=True, tag_back_track_interval=0.1, tag_back_track_period=1.0,
                    tag_back_track_long_interval=1.5, tag_back_track_long_period="max")
    with open_face(face_kind, dsn, **settings) as journal:
        with monkeypatch.context() as patched:  # an event written 20 s ago
            patched.setattr(tag_write_module, "GENERATOR", TimeUUIDGenerator(clock=lambda: time.time_ns() - 20 * 10**9))
            journal.append("Cart|early", [1], tags=["x"])
        settle(journal)
        start = next(iter(journal.query.current_events_by_tag("x"))).offset
        journal.append("Cart|now", [1], tags=["x"])
        with journal.query.events_by_tag("x", start) as stream:
            assert [e.persistence_id for e in collect(stream, 1)] == ["Cart|now"]
            # Commit, "late", a row whose TimeUUID is 15 s old (but after the query's start offset).
            sql(dsn, """
                    INSERT INTO tag_views SELECT tag_name, ms - mod(ms, 60000), ticks, ts_lsb, timestamp,
                        'Cart|late', 1, 1, writer_uuid, ser_id, ser_manifest, event_manifest, event, meta_ser_id,
                        meta_ser_manifest, meta_payload
                    FROM tag_views, LATERAL (SELECT ts_time + 50000000 AS ticks) AS t,
                        LATERAL (SELECT (ticks - %s) / 10000 AS ms) AS m
                    WHERE persistence_id = 'Cart|early'""", (UUID_EPOCH_OFFSET,))
            started = time.monotonic()
            late = collect(stream, 1, timeout=5)
        assert [(e.persistence_id, e.source) for e in late] == [("Cart|late", Source.BACKTRACKING)]
        assert time.monotonic() - started >= 0.5  # the short back track (every 0.1 s over 1 s) did not find it


def test_bad_tag_and_offset_are_named(tface: Face) -> None:
    from datetime import UTC, datetime

    from pgjournal import InvalidArgument, TimestampOffset

    with pytest.raises(InvalidArgument, match="TimeBasedUUID offset or NoOffset"):
        list(tface.query.current_events_by_tag("x", TimestampOffset(datetime.now(UTC))))
    with pytest.raises(InvalidArgument, match="tag must be a non-empty string"):
        tface.query.events_by_tag("")


def test_reading_an_empty_tag_view_fixes_no_bucket_size(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, **dict(TAGS, tag_bucket_size="Hour")) as reader:
        assert list(reader.query.current_events_by_tag("x")) == []
        with open_face(face_kind, dsn, **TAGS) as writer:  # Minute
            writer.append("Cart|1", [1], tags=["x"])
        with pytest.raises(ConfigurationError, match="Minute"):
            list(reader.query.current_events_by_tag("x"))
