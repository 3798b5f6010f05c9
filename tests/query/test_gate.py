"""The ordering/dedup gate and the live loop's schedule: the rules alone, without a database (the queries
that use them are tested end to end in test_by_slices, test_tags*, test_projections*)."""

from __future__ import annotations

from datetime import timedelta

import psycopg.errors
import pytest

from pgjournal import DatabaseUnavailable
from pgjournal.model.timeuuid import EPOCH
from pgjournal.query.gate import DUPLICATE, GAP, NEXT, Gate, Verdict, judge
from pgjournal.runtime.live import Made, Schedule


def never(_pid: str, _seq_nr: int) -> int:
    raise AssertionError("the policy is asked only about unknown persistence ids")


def test_a_known_persistence_id_is_duplicate_next_or_gap() -> None:
    gate: Gate[None] = Gate()
    gate.deliver("a", 3, None)
    assert gate.judge("a", 2, never) == (DUPLICATE, 3)
    assert gate.judge("a", 3, never) == (DUPLICATE, 3)
    assert gate.judge("a", 4, never) == (NEXT, 3)
    assert gate.judge("a", 7, never) == (GAP, 3)


def test_an_unknown_persistence_id_is_resolved_by_the_callers_policy() -> None:
    gate: Gate[None] = Gate()
    asked: list[tuple[str, int]] = []

    def policy(answer: int | Verdict | None) -> object:
        def unknown(pid: str, seq_nr: int) -> int | Verdict | None:
            asked.append((pid, seq_nr))
            return answer
        return unknown

    assert gate.judge("b", 5, policy(4)) == (NEXT, 4)  # its predecessor counts as delivered
    assert gate.judge("b", 5, policy(2)) == (GAP, 2)  # 3 and 4 missing
    assert gate.judge("b", 5, policy(None)) == (GAP, None)  # not known: back to the caller's floor
    assert gate.judge("b", 5, policy(DUPLICATE)) == (DUPLICATE, DUPLICATE)
    assert asked == [("b", 5)] * 4
    assert judge(0, 1) is NEXT and judge(5, 5) is DUPLICATE and judge(None, 1) is GAP


def test_projection_words_are_the_gates_verdicts() -> None:
    assert Verdict.ACCEPTED is NEXT and Verdict.REJECTED is GAP


def test_forgetting_by_time_window_and_by_a_bound_per_entry() -> None:
    gate: Gate[object] = Gate()
    t0 = EPOCH + timedelta(days=1)
    gate.deliver("old", 1, t0)
    gate.deliver("new", 1, t0 + timedelta(seconds=10))
    gate.forget(t0 + timedelta(seconds=5))
    assert (gate.last("old"), gate.last("new"), gate.forgotten_before) == (None, 1, t0 + timedelta(seconds=5))
    gate.forget(t0)  # the bound never moves back
    assert gate.forgotten_before == t0 + timedelta(seconds=5)
    gate.deliver("x", 2, ("slice 1", 0))
    gate.deliver("y", 2, ("slice 2", 9))
    gate.forget_where(lambda stamp: isinstance(stamp, tuple) and stamp[1] < 5)
    assert (gate.last("x"), gate.last("y")) == (None, 2)


def test_assume_keeps_what_is_known_and_restore_undoes_a_failed_poll() -> None:
    gate: Gate[None] = Gate()
    gate.deliver("a", 4, None)
    gate.assume("a", 1, None)
    gate.assume("b", 6, None)
    assert (gate.last("a"), gate.last("b")) == (4, 6)
    saved = gate.checkpoint()
    gate.deliver("a", 5, None)
    gate.deliver("c", 1, None)
    gate.restore(saved)
    assert (gate.last("a"), gate.last("c")) == (4, None)
    gate.deliver("a", 5, None)
    gate.restore(saved)  # a checkpoint can be restored again
    assert gate.last("a") == 4


def test_undo_takes_back_exactly_what_changed_since_begin_and_commit_keeps_it() -> None:
    t0 = EPOCH + timedelta(days=1)
    gate: Gate[object] = Gate()
    for pid, seq_nr in (("a", 4), ("b", 1), ("gone", 2)):
        gate.deliver(pid, seq_nr, ("before", pid))
    before = dict(gate.delivered)
    gate.begin()
    rows = [(0, 0, "a", 5), (0, 0, "new", 1), (0, 0, "a", 6), (0, 0, "b", 3), (0, 0, "a", 7)]
    assert gate.take_leading(rows, "page") == 3  # "b" 3 is a gap: the run stops there
    gate.deliver("b", 2, "gap fill")
    gate.assume("late", 9, None)
    gate.assume("a", 1, None)  # known: unchanged
    gate.drop("gone")
    gate.forget(t0, when=lambda _stamp: EPOCH)  # the map replaced, nothing kept
    gate.deliver("after forget", 1, t0)
    gate.undo()
    assert gate.delivered == before and gate.forgotten_before == EPOCH
    gate.begin()
    assert gate.take_leading(rows, "page") == 3
    gate.commit()
    assert (gate.last("a"), gate.last("new"), gate.last("b")) == (6, 1, 1)
    assert gate.take_leading([(0, 0, "a", 7)], "page") == 1  # after commit nothing is recorded
    assert gate._log is None


def test_schedule_buffer_rule_signal_look_and_retries() -> None:
    schedule = Schedule(buffer_size=100, refresh_interval=2.0, settle=0.05, max_failures=2)
    schedule.polled(95, signalled=False)
    assert schedule.delay == 0.0  # >= 90 %: at once
    schedule.polled(10, signalled=False)
    assert schedule.delay == 2.0  # <= 10 %: the refresh interval
    schedule.polled(50, signalled=False)
    assert schedule.delay == 1.0  # between: half of it
    schedule.polled(0, signalled=True)
    assert schedule.delay == 0.05 and schedule.notified(False)  # look again once the margin has passed
    schedule.polled(0, signalled=False)
    assert not schedule.notified(False) and schedule.notified(True)
    assert schedule.failed(OSError("down")) is None and 0.05 <= schedule.delay <= 0.1
    assert schedule.failed(OSError("down")) is None and 0.1 <= schedule.delay <= 0.2
    fatal = schedule.failed(OSError("still down"))
    assert isinstance(fatal, DatabaseUnavailable) and "3 failed polls" in str(fatal)
    schedule.polled(0, signalled=False)  # a poll that works resets the count
    assert schedule.failed(OSError("down")) is None


def test_a_serialization_conflict_is_retried_soon_and_never_ends_the_query() -> None:
    schedule = Schedule(buffer_size=100, refresh_interval=2.0, max_failures=1)
    conflict = psycopg.errors.SerializationFailure("could not serialize access")
    for _ in range(50):  # past max_failures many times over: conflicts are not failures
        assert schedule.failed(conflict) is None and schedule.delay <= 0.25
    assert schedule.failed(OSError("down")) is None  # the first real failure
    assert isinstance(schedule.failed(OSError("down")), DatabaseUnavailable)


@pytest.mark.parametrize("rows", [0, 10, 11, 89, 90, 100])
def test_delay_after_matches_akka(rows: int) -> None:
    expected = 0.0 if rows >= 90 else 3.0 if rows <= 10 else 1.5
    assert Schedule(buffer_size=100, refresh_interval=3.0).delay_after(rows) == expected


def test_take_next_and_take_leading_deliver_only_the_common_case() -> None:
    gate: Gate[int] = Gate()
    assert gate.take_next("a", 1, 10) and gate.delivered["a"] == (1, 10)
    assert not gate.take_next("a", 1, 11) and not gate.take_next("a", 3, 11)  # a duplicate, a gap: judge them
    assert not gate.take_next("b", 2, 11)  # an unknown persistence id's later event: its policy decides
    assert gate.delivered == {"a": (1, 10)}
    rows = [(0, 0, "a", 2), (0, 0, "c", 1), (0, 0, "a", 3), (0, 0, "c", 3), (0, 0, "a", 4)]
    assert gate.take_leading(rows, 12) == 3  # stops at c's 3 (a gap), delivers nothing after it
    assert gate.delivered == {"a": (3, 12), "c": (1, 12)}
    assert gate.take_leading([("a", 4), ("a", 5)], 13, pid_at=0, seq_at=1) == 2


def test_drop_forgets_one_persistence_id_which_its_policy_then_judges() -> None:
    gate: Gate[int] = Gate()
    gate.deliver("a", 3, 10)
    gate.deliver("b", 5, 10)
    gate.drop("a")
    gate.drop("never met")  # nothing to forget: no error
    assert gate.delivered == {"b": (5, 10)}
    assert gate.judge("a", 2, lambda _pid, seq_nr: seq_nr - 1) == (NEXT, 1)


def test_made_items_are_made_when_taken_and_one_that_fails_stays_first() -> None:
    made: list[int] = []
    broken = {2}

    def make(n: int) -> str:
        made.append(n)
        if n in broken:
            raise ValueError(f"cannot make {n}")
        return f"item {n}"

    page = Made([1, 2, 3], make)
    assert (next(page), made) == ("item 1", [1])
    with pytest.raises(ValueError):
        next(page)
    with pytest.raises(ValueError):  # taken again: made again, not skipped
        next(page)
    broken.clear()
    assert list(page) == ["item 2", "item 3"] and len(page) == 0
