"""An append as steps (:mod:`pgjournal.runtime.steps`): the asyncio face's appends and appends inside a caller's
transaction (:mod:`pgjournal.write.transaction`) run the statement of :func:`pgjournal.write.event_writer.plan_append`
through
these, with the write path's rules (:func:`pgjournal.write.failures.classify`): a primary-key clash is a
:class:`~pgjournal.errors.ConcurrencyConflict` when an ``expected_seq_nr`` was stated (else the append numbers
after the new highest and tries again), serialization failures and deadlocks are retried where the dialect says
so, anything else the server refused rolled back and is reported as such, and a lost connection leaves the
outcome unknown.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

from pgjournal.buckets import ensure_bucket_size_step
from pgjournal.errors import ConcurrencyConflict, JournalError
from pgjournal.runtime.contention import RetryPolicy
from pgjournal.runtime.steps import Sleep, Statement, Step, first_of
from pgjournal.tags.statement_writer import record_bucket_size
from pgjournal.tags.writer_mode import ensure_mode_step
from pgjournal.write.event_writer import AppendPlan, conflict, exhausted, failed
from pgjournal.write.failures import Failure, classify

if TYPE_CHECKING:
    from pgjournal.core.journal_core import JournalCore

Rows = list[tuple[int, datetime]]
SAVEPOINT = "pgjournal_append"


def attempt_step(journal: JournalCore, plan: AppendPlan, *, own_transaction: bool, savepoint: bool = False
                 ) -> Step[Rows]:
    """One attempt of ``plan``. ``own_transaction``: on an autocommit connection, a tagged append that still has
    to record the tag view's bucket size does so in one transaction with its insert. ``savepoint``: inside the
    caller's transaction, in a savepoint, so a failed append leaves that transaction usable. No rows: the
    ``expected_seq_nr`` is above the highest stored one (a conflict; nothing of the attempt stays)."""
    record = bool(plan.tags) and record_bucket_size(journal) is not None
    begin, keep, undo = (("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT") if savepoint
                         else ("BEGIN", "COMMIT", "ROLLBACK"))
    if savepoint:
        begin, keep, undo = (f"{verb} {SAVEPOINT}" for verb in (begin, keep, undo))
    wrapped = savepoint or (own_transaction and record)
    if plan.stamp is not None:
        plan.stamp(plan.params)  # the writer's clock right before each attempt (see pgjournal.tags.statement_writer)
    if wrapped:
        yield Statement(begin)
    try:
        if record:
            yield from ensure_bucket_size_step(journal.settings.tag_bucket_size)
            yield from ensure_mode_step(journal.settings.batched_tags)
        rows: Rows = yield Statement(plan.sql, plan.params, prepare=True)
    except psycopg.Error:
        if wrapped:
            with contextlib.suppress(psycopg.Error):  # a lost connection: the original error tells more
                yield Statement(undo)
        raise
    if wrapped:
        yield Statement(keep if rows else undo)
    return rows


def append_step(journal: JournalCore, plan: AppendPlan) -> Step[Rows]:
    """The append on an autocommit connection, retried under the write path's
    :class:`~pgjournal.runtime.contention.RetryPolicy` (the pause yielded as a :class:`~pgjournal.runtime.steps.Sleep`);
    returns its rows."""
    policy = journal.settings.retry_policy
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        error: psycopg.Error | None
        try:
            rows = yield from attempt_step(journal, plan, own_transaction=True)
        except psycopg.Error as exc:
            failure, error = classify(exc, retryable=journal.dialect.retryable_sqlstates,
                                      clash_retries=plan.expected is None), exc
        else:
            if rows:
                return rows
            failure, error = classify(None), None
        if failure is Failure.RETRY:  # one transaction: running it again is safe
            assert error is not None
            yield Sleep(_pause_or_raise(policy, plan, attempt, started, error))
            continue
        raise (yield from failure_step(journal, plan, failure, error))


def _pause_or_raise(policy: RetryPolicy, plan: AppendPlan, attempt: int, started: float, exc: psycopg.Error
                    ) -> float:
    pause = policy.next_pause(attempt, exc.sqlstate)
    if pause is None:
        raise exhausted(plan.pid, attempt, started, exc, policy.retries) from exc
    return pause


def failure_step(journal: JournalCore, plan: AppendPlan, failure: Failure, error: psycopg.Error | None
                 ) -> Step[JournalError]:
    """The error to raise for an attempt of ``plan`` that failed as ``failure`` (not a retry) with ``error``
    (``None``: it wrote no row): a conflict naming the highest sequence number where it can be read, or
    :func:`pgjournal.write.event_writer.failed`'s error, caused by ``error``."""
    if failure is Failure.CONFLICT:
        return (yield from conflict_step(journal, plan))
    assert error is not None
    reported = failed(plan.pid, failure, error)
    reported.__cause__ = error
    return reported


def conflict_step(journal: JournalCore, plan: AppendPlan) -> Step[ConcurrencyConflict]:
    """The conflict of ``plan``, naming the highest sequence number stored where it can be read."""
    try:
        row = yield from first_of(journal.events.highest_seq_nr(plan.pid))
        actual: int | None = int(row[0]) if row else 0
    except psycopg.Error:  # e.g. inside a transaction the conflict aborted
        actual = None
    return conflict(plan.pid, plan.expected, actual)
