"""Writers that contend for the same rows: kept apart in the process, retried with backoff across processes.

Two appends to one persistence id cannot both commit: the second finds the first's row (a primary-key
clash, or under SERIALIZABLE, as CockroachDB always runs, a serialization failure 40001). Retrying at once
lets the same writers collide again, so threads of one process that write the same key are serialised
*before* the database (:class:`KeyedLocks`): they never fight there at all. What remains, writers in other
processes and the false conflicts of SERIALIZABLE (PostgreSQL tracks reads per index page, so keys that
share a page conflict too), is retried under one :class:`RetryPolicy`: a bounded number of retries with
exponential backoff and jitter, so writers that collided spread out instead of colliding in step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg.errors

from pgjournal.runtime import metrics
from pgjournal.runtime.backoff import Backoff

#: Errors after which a write's whole transaction may be run again, if the dialect lists their SQLSTATE
#: (:attr:`~pgjournal.dialects.base.Dialect.retryable_sqlstates`).
TRANSIENT_ERRORS = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected, psycopg.errors.OutOfMemory)

R = TypeVar("R")


class KeyedLocks:
    """A lock per key (a persistence id): threads writing different keys never wait for each other, threads
    writing the same key take turns. Taking a key's lock is a dict lookup (``setdefault`` is atomic), so it
    costs next to nothing per append. Past ``kept`` keys the table starts over; a thread still holding a lock
    of the old table may then overlap one holding the new lock of its key, which the database settles (a
    clash or a serialization failure, retried) — never a wrong write.

    ``lock``: what a key's lock is: ``threading.Lock`` for threads, ``asyncio.Lock`` for the tasks of one event
    loop (the asyncio face: same rule, its primitive; both take turns in the order they asked)."""

    def __init__(self, kept: int = 100_000, lock: Callable[[], Any] = threading.Lock) -> None:
        self._locks: dict[str, Any] = {}
        self._kept = kept
        self._lock = lock

    def __getitem__(self, key: str) -> Any:
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) >= self._kept:
                self._locks = {}
            lock = self._locks.setdefault(key, self._lock())
        return lock


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``retries`` more attempts after the first; before retry *n*, a random pause between half and
    all of ``min(backoff_max, backoff * 2**(n-1))`` seconds (:attr:`curve`, "equal jitter": it grows, and
    writers that collided together come back apart)."""

    retries: int
    backoff: float
    backoff_max: float

    @property
    def curve(self) -> Backoff:
        """The pauses as a :class:`~pgjournal.runtime.backoff.Backoff`."""
        return Backoff(self.backoff, 2.0, self.backoff_max, jitter=0.5)

    def pause(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        return self.curve.delay(retry)

    def should_retry(self, attempt: int, sqlstate: str | None) -> bool:
        """After failed attempt number ``attempt`` (1 for the first) with ``sqlstate``: retry (after the
        pause, counted in ``pgjournal_write_retries``), or give up."""
        pause = self.next_pause(attempt, sqlstate)
        if pause is None:
            return False
        time.sleep(pause)
        return True

    def next_pause(self, attempt: int, sqlstate: str | None) -> float | None:
        """:meth:`should_retry` without the waiting (for a step, which yields the pause): the seconds to wait
        before the retry, counted as one, or ``None`` to give up."""
        if attempt > self.retries:
            return None
        metrics.WRITE_RETRIES.labels(sqlstate or "").inc()
        return self.pause(attempt)

    def run(self, transaction: Callable[[], R], retryable: Collection[str]) -> R:
        """``transaction()``, run again after a transient failure whose SQLSTATE is in ``retryable`` (the
        dialect's), until the retries are spent. For idempotent bookkeeping (settings rows, leases) whose
        statements may simply run again; not for appends, whose retries must tell a conflict from a retry."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return transaction()
            except TRANSIENT_ERRORS as exc:
                if exc.sqlstate not in retryable or not self.should_retry(attempt, exc.sqlstate):
                    raise

    def longest(self) -> float:
        """The longest all retries can wait in total (what a caller may wait before the final error)."""
        return self.curve.total(self.retries)
