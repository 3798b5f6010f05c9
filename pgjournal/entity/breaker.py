"""A circuit breaker: after repeated database failures, fail commands fast instead of letting every caller
wait for a connection timeout; let one trial through after a pause, and close again when it succeeds.

closed --(max_failures consecutive failures)--> open --(reset_timeout)--> half-open
half-open --(trial succeeds)--> closed;  half-open --(trial fails)--> open, with the pause doubled
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Iterator

import psycopg
import psycopg.errors

from pgjournal.entity.errors import CircuitOpen
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, WriteOutcomeUnknown
from pgjournal.model.printable import printable_logger
from pgjournal.runtime.backoff import Backoff

_log = printable_logger("pgjournal.entity")


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


def is_unavailability(exc: BaseException) -> bool:
    """Does ``exc`` say the database is unreachable (rather than that a statement was refused)?"""
    if isinstance(exc, CircuitOpen):
        return False  # our own fast failure says nothing new about the database
    if isinstance(exc, DatabaseUnavailable | WriteOutcomeUnknown):
        return True
    # Serialization failures and deadlocks are OperationalErrors too, but the server answered.
    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.TransactionRollback)


class CircuitBreaker:
    """Thread-safe. Guard each unit of work with ``with breaker.guard(): ...``."""

    def __init__(self, name: str = "pgjournal", *, max_failures: int = 3, reset_timeout: float = 1.0,
                 max_reset_timeout: float = 30.0) -> None:
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 1:
            raise ConfigurationError(f"max_failures must be a positive integer, got {max_failures!r}")
        for what, value in (("reset_timeout", reset_timeout), ("max_reset_timeout", max_reset_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"{what} must be a number of seconds > 0, got {value!r}")
        self.name = name
        self.max_failures = max_failures
        self.reset_timeout = float(reset_timeout)
        self.max_reset_timeout = max(float(max_reset_timeout), self.reset_timeout)
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        #: How long it stays open: ``reset_timeout``, doubled by each failed trial, to ``max_reset_timeout``.
        self._reopen = Backoff(self.reset_timeout, 2.0, self.max_reset_timeout)
        #: Times it opened since it last closed (the failed trials plus one).
        self._openings = 0
        self._pause = self.reset_timeout
        self._opened_at = 0.0
        self._trial_running = False
        self._last_error = ""

    @property
    def state(self) -> BreakerState:
        """``closed`` (normal), ``open`` (failing fast) or ``half-open`` (a trial is allowed)."""
        with self._lock:
            return self._current_state()

    def status(self) -> dict[str, object]:
        """State, consecutive failures, seconds until the next trial and the last error: for health checks."""
        with self._lock:
            state = self._current_state()
            retry_after = max(0.0, self._opened_at + self._pause - time.monotonic()) if state is BreakerState.OPEN \
                else 0.0
            return {"name": self.name, "state": str(state), "failures": self._failures,
                    "retry_after": round(retry_after, 3), "last_error": self._last_error or None}

    def _current_state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and time.monotonic() >= self._opened_at + self._pause:
            self._state = BreakerState.HALF_OPEN
            _log.info("circuit breaker %r half-open: letting a trial through", self.name)
        return self._state

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Raise :class:`CircuitOpen` at once while open; otherwise run the body and record how it went."""
        trial = self._before()
        try:
            yield
        except BaseException as exc:
            if is_unavailability(exc):
                self._failure(exc, trial)
            else:
                self._answered(trial, success=False)
            raise
        self._answered(trial, success=True)

    def _before(self) -> bool:
        with self._lock:
            state = self._current_state()
            if state is BreakerState.CLOSED:
                return False
            if state is BreakerState.HALF_OPEN and not self._trial_running:
                self._trial_running = True
                return True
            retry_after = max(0.0, self._opened_at + self._pause - time.monotonic())
            failures, last = self._failures, self._last_error
        raise CircuitOpen(self.name, failures, retry_after, last)

    def _failure(self, exc: BaseException, trial: bool) -> None:
        with self._lock:
            self._failures += 1
            self._last_error = " ".join(f"{exc.__class__.__name__}: {exc}".split())[:300]
            if trial:
                self._trial_running = False
                self._open()
            elif self._state is BreakerState.CLOSED and self._failures >= self.max_failures:
                self._openings = 0
                self._open()

    def _open(self) -> None:
        self._openings += 1
        self._pause = self._reopen.delay(self._openings)
        self._state = BreakerState.OPEN
        self._opened_at = time.monotonic()
        _log.warning("circuit breaker %r open after %d consecutive database failures (last: %s); failing fast "
                     "for %.1fs", self.name, self._failures, self._last_error, self._pause)

    def _answered(self, trial: bool, *, success: bool) -> None:
        """The unit of work succeeded (the database answered), or failed for another reason (neutral: a
        domain error may not have needed the database at all, so it proves nothing either way)."""
        with self._lock:
            if trial:
                self._trial_running = False
            if not success:
                return
            if self._state is BreakerState.CLOSED:
                self._failures = 0
            elif trial:
                _log.info("circuit breaker %r closed: the database answers again", self.name)
                self._state = BreakerState.CLOSED
                self._failures = 0
                self._pause = self.reset_timeout
