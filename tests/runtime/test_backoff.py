"""The one backoff rule: delays that grow by a factor to a ceiling, their random part drawn from a source the
caller may give, and the retry loops' work driver (a step retried on a fresh connection under a pause rule)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from pgjournal.errors import InvalidArgument
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.contention import RetryPolicy
from pgjournal.runtime.steps import Step, Work, arun_work, run_work


def test_the_delay_grows_by_its_factor_up_to_the_maximum() -> None:
    curve = Backoff(0.1, 2.0, 1.0)
    assert [curve.delay(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert Backoff(0.5, 3.0).delay(3) == pytest.approx(4.5)
    assert Backoff(0.25, 1.0).delay(40) == 0.25  # factor 1: a constant delay
    assert Backoff(0.001, 2.0, 7.0).delay(10**9) == 7.0  # far attempts do not overflow
    assert Backoff(1.0, 1e6).delay(500) == math.inf  # no maximum: it grows without bound, never raises
    assert Backoff(0.1, 2.0, 1.0).total(6) == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.0 + 1.0)


def test_jitter_takes_its_share_of_the_delay_from_the_random_source() -> None:
    equal, full = Backoff(0.2, 2.0, 5.0, jitter=0.5), Backoff(0.2, 2.0, 5.0, jitter=1.0)
    assert equal.delay(2, lambda: 0.0) == pytest.approx(0.4)  # the draw 0: all of the delay
    assert equal.delay(2, lambda: 0.5) == pytest.approx(0.3)
    assert equal.delay(2, lambda: 0.999999) == pytest.approx(0.2, abs=1e-6)  # half of it at the least
    assert full.delay(2, lambda: 0.75) == pytest.approx(0.1)
    assert equal.ceiling(2) == pytest.approx(0.4)
    drawn = [equal.delay(3) for _ in range(200)]  # the default source: spread, within its bounds
    assert all(0.4 <= d <= 0.8 for d in drawn) and len(set(drawn)) > 100


@pytest.mark.parametrize(("kwargs", "named"), [
    (dict(initial=-1.0), "initial"), (dict(initial=math.inf), "initial"), (dict(initial=0.1, factor=0.5), "factor"),
    (dict(initial=0.1, maximum=-2), "maximum"), (dict(initial=0.1, jitter=1.5), "jitter"),
    (dict(initial=0.1, jitter=-0.1), "jitter"), (dict(initial=True), "initial"), (dict(initial="1"), "initial"),
    (dict(initial=math.nan), "initial"),
])
def test_a_curve_that_makes_no_sense_is_refused_by_name(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        Backoff(**kwargs)


def test_attempts_count_from_one() -> None:
    with pytest.raises(InvalidArgument, match="from 1, got 0"):
        Backoff(0.1).delay(0)


def test_the_retry_policy_keeps_its_settings_and_draws_from_the_one_curve() -> None:
    policy = RetryPolicy(retries=3, backoff=0.01, backoff_max=0.03)
    assert policy.curve == Backoff(0.01, 2.0, 0.03, jitter=0.5)
    assert policy.longest() == pytest.approx(0.01 + 0.02 + 0.03)


# -- the work driver ------------------------------------------------------------------------------------------


class Flaky(Exception):
    pass


def _work(log: list[str], fail: int) -> Callable[[], Work[list[Any]]]:
    """Two steps; the first fails ``fail`` times before it answers; a refused one is caught by the work."""
    def first() -> Step[str]:
        if len(log) < fail:
            log.append("failed")
            raise Flaky(len(log))
        log.append("ran")
        return "one"
        yield  # a step (a generator) that asks for nothing

    def refused() -> Step[str]:
        raise KeyError("not retried")
        yield

    def work() -> Work[list[Any]]:
        got = [(yield first)]
        try:
            yield refused
        except KeyError as exc:
            got.append(str(exc))
        return got

    return work


def _pause(pauses: list[tuple[int, str]]) -> Callable[[int, BaseException], float | None]:
    def pause(attempt: int, exc: BaseException) -> float | None:
        if not isinstance(exc, Flaky):
            return None
        pauses.append((attempt, str(exc)))
        return 0.0
    return pause


def test_work_steps_are_retried_under_the_pause_rule_on_both_drivers() -> None:
    borrowed: list[str] = []

    @contextlib.contextmanager
    def connection() -> Iterator[Any]:
        borrowed.append("sync")
        yield None

    @contextlib.asynccontextmanager
    async def aconnection() -> AsyncIterator[Any]:
        borrowed.append("async")
        yield None

    log: list[str] = []
    pauses: list[tuple[int, str]] = []
    assert run_work(_work(log, 2)(), connection, _pause(pauses)) == ["one", "'not retried'"]
    assert log == ["failed", "failed", "ran"] and pauses == [(1, "1"), (2, "2")]
    log.clear(), pauses.clear()
    assert asyncio.run(arun_work(_work(log, 1)(), aconnection, _pause(pauses))) == ["one", "'not retried'"]
    assert log == ["failed", "ran"] and pauses == [(1, "1")]
    assert borrowed == []  # steps that run no statement borrow no connection


def test_a_step_that_keeps_failing_raises_into_the_work_and_out() -> None:
    def pause(attempt: int, exc: BaseException) -> float | None:
        return 0.0 if attempt < 3 else None

    log: list[str] = []
    with pytest.raises(Flaky, match="3"):
        run_work(_work(log, 10)(), contextlib.nullcontext, pause)
    assert log == ["failed"] * 3
