"""Projections in one process: exactly-once and grouped read models across restarts, rescaling 4 -> 8 -> 2 with
writers running, retries then fail or skip, pause/resume, the event processor."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from test_projections_workers import Writers

from pgjournal import Journal, ProjectionFailed, slice_ranges
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections import management
from pgjournal.projections.examples import EventProcessor, counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import AtLeastOnce, ExactlyOnce, Grouped, Handler, Projection, ProjectionSettings
from pgjournal.projections.runner import RangeRunner, run_range


def run_until(journal: Journal, projection: Projection, ranges: Sequence[tuple[int, int]],
              done: Callable[[], bool], timeout: float = 20.0) -> list[RangeRunner]:
    runners = [run_range(journal, projection, lo, hi) for lo, hi in ranges]
    try:
        with contextlib.suppress(AssertionError):  # the caller's assertions say what is missing
            eventually(lambda: done() or any(r.failed for r in runners), "done, or a range failed", timeout,
                       interval=0.05)
    finally:
        for r in runners:
            r.stop()
        for r in runners:
            r.join(timeout=30)
    return runners


def caught_up(journal: Journal, name: str, entity_type: str) -> Callable[[], bool]:
    return lambda: not counter_mismatches(journal, name, entity_type)


def append_many(journal: Journal, entity_type: str, entities: int, events: int, start: int = 0) -> None:
    for i in range(entities):
        journal.append(f"{entity_type}|e{i}", [{"n": start + k} for k in range(events)])


def counters(journal: Journal, name: str) -> dict[str, tuple[int, int]]:
    with journal.connection() as conn:
        rows = conn.execute("SELECT persistence_id, events, last_seq_nr FROM projection_counter "
                            "WHERE projection_name = %s", (name,)).fetchall()
    return {pid: (n, seq) for pid, n, seq in rows}


@pytest.mark.floor
@pytest.mark.parametrize("grouped", [False, True], ids=["exactly-once", "grouped"])
def test_read_model_equals_journal_across_restarts(journal: Journal, grouped: bool) -> None:
    ensure_counter_table(journal)
    projection = Projection("counts", "Cart", counter_writer("counts", grouped=grouped, max_count=7, max_wait=0.05),
                            FAST_PROJECTION)
    append_many(journal, "Cart", 20, 5)
    runners = run_until(journal, projection, slice_ranges(2), caught_up(journal, "counts", "Cart"))
    assert sum(r.stats.handled for r in runners) == 100
    append_many(journal, "Cart", 25, 3)
    runners = run_until(journal, projection, slice_ranges(2), caught_up(journal, "counts", "Cart"))
    assert counter_mismatches(journal, "counts", "Cart") == []
    # The restart read the old events again (lookback) and dropped them as duplicates.
    assert sum(r.stats.handled for r in runners) == 75
    assert sum(r.stats.duplicates for r in runners) >= 100


def test_rescale_4_to_8_to_2_with_writers_running(mode_journal: Journal) -> None:
    """Default mode (visibility horizon) and portable mode (clock minus a delay, backtracking finds late commits)."""
    journal = mode_journal
    ensure_counter_table(journal)
    projection = Projection("scaled", "Acct", counter_writer("scaled", max_count=50, max_wait=0.05),
                            FAST_PROJECTION)
    handled = 0
    with Writers(journal, "Acct", entities=80) as writers:
        for n in (4, 8, 2):
            runners = run_until(journal, projection, slice_ranges(n), lambda: False, timeout=2.0)
            assert not any(r.failed for r in runners)
            handled += sum(r.stats.handled for r in runners)
        assert writers.count > 0
    runners = run_until(journal, projection, slice_ranges(2), caught_up(journal, "scaled", "Acct"))
    assert counter_mismatches(journal, "scaled", "Acct") == []
    with journal.connection() as conn:
        total = conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = 'Acct'").fetchone()[0]
    assert handled + sum(r.stats.handled for r in runners) == total


class Flaky:
    """Fails on one (pid, seq_nr) the first ``failures`` times (``None``: always); records what it handled."""

    def __init__(self, pid: str, seq_nr: int, failures: int | None) -> None:
        self.pid, self.seq_nr, self.failures = pid, seq_nr, failures
        self.calls = 0
        self.handled: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def check(self, env: EventEnvelope) -> None:
        if (env.persistence_id, env.seq_nr) == (self.pid, self.seq_nr):
            with self.lock:
                self.calls += 1
                if self.failures is None or self.calls <= self.failures:
                    raise RuntimeError(f"boom on {env.persistence_id} {env.seq_nr}")

    def handler(self, mode: str) -> Handler:
        if mode == "exactly-once":
            def one(_conn: Any, env: EventEnvelope) -> None:
                self.check(env)
                self.handled.append((env.persistence_id, env.seq_nr))
            return ExactlyOnce(one)
        if mode == "grouped":
            def many(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
                for env in envs:
                    self.check(env)
                self.handled.extend((e.persistence_id, e.seq_nr) for e in envs)
            return Grouped(many, max_count=10, max_wait=0.05)

        def each(env: EventEnvelope) -> None:
            self.check(env)
            self.handled.append((env.persistence_id, env.seq_nr))
        return AtLeastOnce(each, save_every=3, save_interval=0.1)


def stored_seq_nrs(journal: Journal, name: str) -> dict[str, int]:
    with journal.connection() as conn:
        return dict(conn.execute("SELECT persistence_id, max(seq_nr) FROM projection_timestamp_offset_store "
                                 "WHERE projection_name = %s GROUP BY 1", (name,)).fetchall())


MODES = ["exactly-once", "grouped", "at-least-once"]


@pytest.mark.parametrize("mode", MODES)
def test_handler_failure_is_retried_with_backoff(journal: Journal, mode: str) -> None:
    append_many(journal, "Cart", 3, 4)
    flaky = Flaky("Cart|e1", 3, failures=2)
    settings = ProjectionSettings(attempts=3, backoff=0.05, management_interval=0.2)
    projection = Projection("retry", "Cart", flaky.handler(mode), settings)
    run_until(journal, projection, [(0, 1023)], lambda: len(set(flaky.handled)) == 12)
    assert flaky.calls >= 3
    assert sorted(set(flaky.handled)) == sorted((f"Cart|e{i}", s) for i in range(3) for s in range(1, 5))


@pytest.mark.parametrize("mode", MODES)
def test_handler_failure_fails_and_the_offset_stays_before_the_event(journal: Journal, mode: str) -> None:
    append_many(journal, "Cart", 1, 6)
    flaky = Flaky("Cart|e0", 3, failures=None)
    settings = ProjectionSettings(attempts=2, backoff=0.01, management_interval=0.2)
    projection = Projection("failing", "Cart", flaky.handler(mode), settings)
    [runner] = run_until(journal, projection, [(0, 1023)], lambda: False, timeout=3)
    assert isinstance(runner.failed, ProjectionFailed)
    assert (runner.failed.persistence_id, runner.failed.seq_nr) == ("Cart|e0", 3)
    assert "'Cart|e0' seq_nr 3" in str(runner.failed)
    assert stored_seq_nrs(journal, "failing").get("Cart|e0", 0) <= 2
    assert ("Cart|e0", 3) not in flaky.handled and ("Cart|e0", 4) not in flaky.handled
    # Fixed: the next run starts at the failed event and handles the rest exactly once (in order).
    flaky.failures = 0
    flaky.handled.clear()
    run_until(journal, projection, [(0, 1023)], lambda: ("Cart|e0", 6) in flaky.handled)
    assert [s for _, s in flaky.handled] == [3, 4, 5, 6]


@pytest.mark.parametrize("mode", MODES)
def test_skip_is_logged_with_pid_and_seq_nr(journal: Journal, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    append_many(journal, "Cart", 2, 5)
    flaky = Flaky("Cart|e1", 2, failures=None)
    settings = ProjectionSettings(attempts=2, backoff=0.01, on_failure="skip", management_interval=0.2)
    projection = Projection("skipping", "Cart", flaky.handler(mode), settings)
    with caplog.at_level(logging.ERROR, logger="projections"):
        [runner] = run_until(journal, projection, [(0, 1023)], lambda: len(set(flaky.handled)) == 9)
    assert runner.failed is None and runner.stats.skipped == 1
    assert sorted(set(flaky.handled)) == sorted({(f"Cart|e{i}", s) for i in range(2) for s in range(1, 6)}
                                                - {("Cart|e1", 2)})
    assert "SKIPPED 'Cart|e1' seq_nr 2" in caplog.text


def test_pause_and_resume_are_honoured_by_a_running_range(journal: Journal,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    ensure_counter_table(journal)
    projection = Projection("pausing", "Cart", counter_writer("pausing", max_wait=0.05), FAST_PROJECTION)
    append_many(journal, "Cart", 5, 2)
    runner = run_range(journal, projection, 0, 1023)
    try:
        eventually(lambda: not counter_mismatches(journal, "pausing", "Cart"), "caught up")
        with caplog.at_level(logging.INFO, logger="projections"):
            management.pause(journal, "pausing")
            assert management.status(journal, "pausing").paused
            eventually(lambda: "projection pausing 0-1023 paused" in caplog.text, "the range noticed the pause")
        journal.append("Cart|late", [{"n": 1}])
        time.sleep(1.0)  # the scenario: a paused range leaves a new event alone for a while (an absence)
        assert "Cart|late" not in counters(journal, "pausing")
        management.resume(journal, "pausing")
        eventually(lambda: "Cart|late" in counters(journal, "pausing"), "the range resumed")
        assert counters(journal, "pausing")["Cart|late"] == (1, 1)
    finally:
        runner.stop()
        runner.join()
    assert counter_mismatches(journal, "pausing", "Cart") == []


def test_set_offset_skips_earlier_events_and_clear_replays_all(journal: Journal) -> None:
    append_many(journal, "Cart", 4, 2)
    with journal.connection() as conn:
        cut = conn.execute("SELECT max(db_timestamp) FROM event_journal").fetchone()[0]
    append_many(journal, "Cart", 4, 1, start=2)
    seen: list[tuple[str, int]] = []
    projection = Projection("setting", "Cart", ExactlyOnce(lambda _c, e: seen.append((e.persistence_id, e.seq_nr))),
                            FAST_PROJECTION)
    management.set_offset(journal, "setting", cut + timedelta(microseconds=1))
    run_until(journal, projection, slice_ranges(4), lambda: len(seen) >= 4, timeout=5)  # stopped and joined
    assert sorted(seen) == [(f"Cart|e{i}", 3) for i in range(4)]
    assert management.clear_offset(journal, "setting") > 0
    seen.clear()
    run_until(journal, projection, slice_ranges(4), lambda: len(seen) >= 12)
    assert sorted(seen) == sorted((f"Cart|e{i}", s) for i in range(4) for s in (1, 2, 3))


def test_status_shows_ranges_and_lag(journal: Journal) -> None:
    ensure_counter_table(journal)
    projection = Projection("lagging", "Cart", counter_writer("lagging", max_wait=0.05), FAST_PROJECTION)
    append_many(journal, "Cart", 30, 1)
    run_until(journal, projection, slice_ranges(2), caught_up(journal, "lagging", "Cart"))
    state = management.status(journal, "lagging")
    assert not state.paused and state.ranges
    assert {r.key for r in state.ranges} <= {"0-511", "512-1023"}
    assert all(r.lag is not None and 0 <= r.lag < 30 for r in state.ranges)
    assert "lagging" in management.list_projections(journal)


def test_event_processor_writes_one_event_per_source_event(journal: Journal) -> None:
    processor = EventProcessor(journal, "CartLog", lambda env: {"from": env.persistence_id, "seq": env.seq_nr})
    projection = Projection("to-log", "Cart", processor.handler(), FAST_PROJECTION)
    append_many(journal, "Cart", 10, 3)

    def logged() -> list[tuple[Any, ...]]:
        with journal.connection() as conn:
            return conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = 'CartLog'"
                                ).fetchall()

    run_until(journal, projection, slice_ranges(2), lambda: len(logged()) >= 30)
    append_many(journal, "Cart", 10, 2, start=3)
    run_until(journal, projection, slice_ranges(4), lambda: len(logged()) >= 50)  # stopped and joined
    rows = logged()
    assert len(rows) == 50
    events = [e.event for i in range(10) for e in journal.query.current_events_by_persistence_id(f"CartLog|e{i}")]
    assert sorted((e["from"], e["seq"]) for e in events) == sorted(
        (f"Cart|e{i}", s) for i in range(10) for s in range(1, 6))


def test_a_group_with_idle_wait_goes_once_nothing_more_comes_not_after_its_max_wait(journal: Journal) -> None:
    """``idle_wait``: a group is handed over once no envelope has come for that long. Its ``max_wait`` is an
    hour here, so that the events are handled at all shows the rule."""
    groups: list[list[int]] = []
    handler = Grouped(lambda _conn, envs: groups.append([e.seq_nr for e in envs]), max_count=100, max_wait=3600,
                      idle_wait=0.05)
    journal.append("Cart|e1", [{"n": k} for k in range(5)])
    run_until(journal, Projection("idle", "Cart", handler, FAST_PROJECTION), [(0, 1023)],
              lambda: sum(map(len, groups)) == 5)
    assert [n for group in groups for n in group] == [1, 2, 3, 4, 5]


def test_a_stop_is_seen_after_each_envelope_of_a_chunk(journal: Journal) -> None:
    """The reader hands over what one poll read as one chunk (ten envelopes here); a stop asked while the first
    is handled ends the run after it, and the rest of the chunk is read again by the next run, from the offsets."""
    journal.append("Cart|e1", [{"n": k} for k in range(10)])
    handled: list[int] = []
    runner: list[RangeRunner] = []

    def handle(_conn: Any, env: EventEnvelope) -> None:
        handled.append(env.seq_nr)
        runner[0].stop()

    projection = Projection("stop-in-chunk", "Cart", ExactlyOnce(handle), FAST_PROJECTION)
    runner.append(RangeRunner(journal, projection, 0, 1023))
    runner[0].start()
    runner[0].join(30)
    assert not runner[0].alive and handled == [1]
    rest = RangeRunner(journal, Projection("stop-in-chunk", "Cart", ExactlyOnce(
        lambda _conn, env: handled.append(env.seq_nr)), FAST_PROJECTION), 0, 1023)
    rest.start()
    try:
        eventually(lambda: len(handled) == 10, "the rest of the chunk handled by the next run")
    finally:
        rest.stop()
        rest.join(30)
    assert handled == list(range(1, 11))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ProjectionSettings(on_failure="ignore"),
     "on_failure must be one of stop, fail, skip, dead-letter, got 'ignore'"),
    (lambda: ProjectionSettings(attempts=0), "attempts must be an integer >= 1, got 0"),
    (lambda: Grouped(lambda c, e: None, max_count=0), "Grouped.max_count must be an integer >= 1, got 0"),
    (lambda: AtLeastOnce(lambda e: None, save_interval=-1), "AtLeastOnce.save_interval must be a number > 0"),
    (lambda: Grouped(lambda c, e: None, idle_wait=0), "Grouped.idle_wait must be a number > 0"),
    (lambda: Projection("", "Cart", ExactlyOnce(lambda c, e: None)), "projection name must be a non-empty"),
    (lambda: Projection("p", "Cart", lambda c, e: None), "handler must be ExactlyOnce, Grouped or AtLeastOnce"),
])
def test_bad_settings_are_refused_with_the_value(make: Callable[[], object], message: str) -> None:
    from pgjournal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=re.escape(message)):
        make()


def test_bad_lease_settings_and_factory_are_refused(journal: Journal) -> None:
    from pgjournal.errors import ConfigurationError, InvalidArgument
    from pgjournal.projections.leases import LeaseManager
    from pgjournal.projections.workers import load_factory

    with pytest.raises(InvalidArgument, match="lease duration must be a number of seconds > 0, got 0"):
        LeaseManager(journal, "p", duration=0)
    with pytest.raises(InvalidArgument, match="renew_interval must be > 0 and below half the duration"):
        LeaseManager(journal, "p", duration=2, renew_interval=1.5)
    with pytest.raises(ConfigurationError, match=re.escape("must look like package.module:function, got 'nocolon'")):
        load_factory("nocolon")
    missing = re.escape("cannot load handler factory 'pgjournal.projections.examples:nothing'")
    with pytest.raises(ConfigurationError, match=missing):
        load_factory("pgjournal.projections.examples:nothing")
