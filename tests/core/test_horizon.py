"""The horizon tracker's reading with the page below it (:meth:`HorizonTracker.read_with_step`), driven by hand:
the step's requests and the rows they get are the test's, so each case is built, not waited for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pgjournal.core.capabilities import Capabilities
from pgjournal.core.horizon import PIPELINE_HELD_BACK, HorizonTracker
from pgjournal.model.timeuuid import LATEST
from pgjournal.runtime.steps import Pipelined, Statement
from pgjournal.store.catalog import WRITERS_SQL

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
MARGIN = 0.01
CAPS = Capabilities(notify=True, writer_horizon=True, sees_all_sessions=True, journal_relations=(1,),
                    read_margin=MARGIN, longest_transaction=60.0)


def page(until: datetime) -> Statement:
    return Statement("SELECT page", {"until": until})


def rows_at(*offsets_ms: float) -> list[tuple[Any, ...]]:
    """Page rows (their timestamp in column 1) at these offsets from NOW."""
    return [("row", NOW + timedelta(milliseconds=ms)) for ms in offsets_ms]


def finish(step: Any, answer: Any) -> Any:
    """Send the step its last answer; what it returns."""
    try:
        step.send(answer)
    except StopIteration as done:
        return done.value
    raise AssertionError("the step asked for more")


def writers(now: datetime, *started: datetime, isolation: str = "read committed") -> list[tuple[Any, ...]]:
    """What WRITERS_SQL answers: the clock, and one row per open writer (the clock alone when none), each with the
    isolation the reading ran under."""
    if not started:
        return [(now, None, None, None, isolation)]
    return [(now, 100 + i, f"3/{i}", at, isolation) for i, at in enumerate(started)]


def test_the_first_reading_goes_first_and_bounds_the_page() -> None:
    step = HorizonTracker(CAPS).read_with_step(page, 1)
    reading = next(step)
    assert isinstance(reading, Statement) and reading.sql == WRITERS_SQL
    below = step.send(writers(NOW))
    assert below == page(NOW - timedelta(seconds=MARGIN))
    horizon, rows = finish(step, rows_at(-50, -20))
    assert horizon.safe == NOW - timedelta(seconds=MARGIN) and rows == rows_at(-50, -20)


def _after_one_reading(held_back_by: datetime | None = None) -> HorizonTracker:
    tracker = HorizonTracker(CAPS)
    step = tracker.read_with_step(page, 1)
    next(step)
    step.send(writers(NOW - timedelta(seconds=1), *([held_back_by] if held_back_by else [])))
    finish(step, [])
    return tracker


def test_then_the_page_rides_with_the_reading_and_what_is_past_the_new_bound_is_dropped() -> None:
    """Sent together, the page is bounded by nothing; a writer open at the reading bounds it at its start, so the
    rows the page read at or past that start (committed between the two snapshots) are dropped, read again later."""
    step = _after_one_reading().read_with_step(page, 1)
    together = next(step)
    assert together == Pipelined((Statement(WRITERS_SQL, {"relations": [1]}), page(LATEST)))
    open_since = NOW - timedelta(milliseconds=30)
    horizon, rows = finish(step, [writers(NOW, open_since), rows_at(-60, -31, -30, -5)])
    assert horizon.safe == open_since
    assert rows == rows_at(-60, -31)


def test_under_another_isolation_the_page_sent_with_the_reading_is_read_again_and_then_after_it() -> None:
    """The session's default is REPEATABLE READ (the reading says so): the reading and the page shared one
    snapshot, so the page is read again after it, below its bound; later pages go after their readings."""
    tracker = _after_one_reading()
    step = tracker.read_with_step(page, 1)
    assert isinstance(next(step), Pipelined)
    again = step.send([writers(NOW, isolation="repeatable read"), rows_at(-60, -20)])
    assert again == page(NOW - timedelta(seconds=MARGIN))
    _, rows = finish(step, rows_at(-60, -30, -20))
    assert rows == rows_at(-60, -30, -20)
    later = next(tracker.read_with_step(page, 1))
    assert isinstance(later, Statement) and later.sql == WRITERS_SQL


def test_a_reading_held_back_sends_the_next_page_after_its_reading_below_the_bound() -> None:
    """A writer open longer than PIPELINE_HELD_BACK: sent together, the page would read (and drop) every row
    committed since it began, so the next page goes after the reading, bounded by it."""
    long_writer = NOW - timedelta(seconds=1 + 2 * PIPELINE_HELD_BACK)
    step = _after_one_reading(held_back_by=long_writer).read_with_step(page, 1)
    reading = next(step)
    assert isinstance(reading, Statement) and reading.sql == WRITERS_SQL
    assert step.send(writers(NOW, long_writer)) == page(long_writer)


def test_the_clock_horizon_never_pipelines() -> None:
    portable = Capabilities(notify=False, writer_horizon=False, sees_all_sessions=False, journal_relations=(),
                            read_margin=0.1, longest_transaction=60.0)
    tracker = HorizonTracker(portable)
    for _ in range(2):
        step = tracker.read_with_step(page, 1)
        assert isinstance(next(step), Statement)
        assert step.send([(NOW,)]) == page(NOW - timedelta(seconds=0.1))
        finish(step, [])
