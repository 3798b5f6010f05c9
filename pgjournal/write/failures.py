"""What a failed write means: the one classification every write path uses (the blocking append, the append as
steps, appends in a caller's transaction, the asyncio pipeline, durable state), and the errors it reports.

A write is one statement whose expectation (an ``expected_seq_nr``, a revision) the statement itself checks, so
a failure is one of four :class:`Failure` kinds. Each path decides only what to *do* with a kind: a retry is a
pause and another attempt for a write on a connection of its own, but in a caller's transaction it aborts the
transaction and is the caller's to retry; every kind aborts a caller's transaction (without savepoints).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Any

import psycopg
import psycopg.errors

from pgjournal.errors import ConfigurationError, JournalError, ShardLayoutMismatch, WriteOutcomeUnknown
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.runtime.contention import TRANSIENT_ERRORS
from pgjournal.store.shard_guard import GUARD


class Failure(enum.Enum):
    """The kinds of failed write."""

    #: Nothing was written and the same statement may succeed when run again: a transient error the dialect lists
    #: as retryable, a clash with another writer of a write that stated no expectation, or a statement skipped
    #: because an earlier one of its pipeline failed.
    RETRY = "retry"
    #: Nothing was written: the stated expectation does not hold (the statement clashed with a row stored
    #: first, or found no row to follow and wrote none).
    CONFLICT = "conflict"
    #: The server refused the statement for a reason running it again will not change (privileges, a trigger, a
    #: constraint); it rolled back, so nothing was written.
    REFUSED = "refused"
    #: The server never answered (a lost connection): the write may or may not have committed.
    UNKNOWN = "unknown"


def classify(error: BaseException | None, *, retryable: Collection[str] = (), clash_retries: bool = False,
             conn: Any = None) -> Failure:
    """What a write's failure means. ``error``: what its statement raised, ``None`` when it ran and wrote no row
    (its expectation does not hold). ``retryable``: the dialect's retryable SQLSTATEs. ``clash_retries``: a
    primary-key clash means "number after the new highest and run again" (an append that stated no
    ``expected_seq_nr``, on a connection of its own), else it is a conflict. ``conn``: the connection it ran on,
    where known (a broken one means the server may not have answered)."""
    if error is None:
        return Failure.CONFLICT
    if isinstance(error, psycopg.errors.PipelineAborted):
        return Failure.RETRY
    if isinstance(error, psycopg.Error) and (
            (isinstance(error, psycopg.OperationalError) and error.sqlstate is None)  # the server never answered
            or (conn is not None and (conn.closed or conn.broken))):
        return Failure.UNKNOWN
    if isinstance(error, psycopg.errors.UniqueViolation):
        return Failure.RETRY if clash_retries else Failure.CONFLICT
    if isinstance(error, TRANSIENT_ERRORS) and error.sqlstate in retryable:
        return Failure.RETRY
    return Failure.REFUSED


def refused(what: str, exc: psycopg.Error, persistence_id: str | None = None) -> JournalError:
    """The error of a :attr:`Failure.REFUSED` write; ``what`` says what was written (``"appending to 'A|1'"``).
    A missing privilege is a :class:`~pgjournal.errors.ConfigurationError`; a row the database's shard guard
    refuses (its slice is not this database's any more) is :class:`~pgjournal.errors.ShardLayoutMismatch`."""
    misplaced = guard_refusal(what, exc, persistence_id)
    if misplaced is not None:
        return misplaced
    kind = ConfigurationError if isinstance(exc, psycopg.errors.InsufficientPrivilege) else JournalError
    return kind(f"{what} was refused by the database: SQLSTATE {exc.sqlstate} ({server_message(exc)}); "
                "nothing was written")


def guard_refusal(what: str, exc: BaseException, persistence_id: str | None = None) -> ShardLayoutMismatch | None:
    """The error of a row refused by the database's shard guard (:mod:`pgjournal.store.shard_guard`: its slice is
    not this database's any more); ``None`` for any other error."""
    if not (isinstance(exc, psycopg.errors.CheckViolation) and exc.diag.constraint_name == GUARD):
        return None
    where = f"slice {slice_for_persistence_id(persistence_id)}" if persistence_id is not None else "its slice"
    return ShardLayoutMismatch(
        f"{what} was refused by the database: {where} is not held by this database any more (its shard guard "
        f"{GUARD} refused the row; the range moved or is moving); nothing was written: reopen the journal with "
        "the layout the databases record, and retry")


def unknown(what: str, written: str, retry: str, exc: BaseException) -> WriteOutcomeUnknown:
    """The error of a :attr:`Failure.UNKNOWN` write: ``written`` what may or may not be, ``retry`` how to retry
    it safely."""
    return WriteOutcomeUnknown(f"the connection was lost while {what}; {written} may or may not be written. "
                               f"{retry} ({exc.__class__.__name__})")


def server_message(exc: BaseException) -> str:
    """The server's message, and its hint when it gave one (e.g. which setting to raise)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    hint = exc.diag.message_hint if isinstance(exc, psycopg.Error) else None
    return f"{line}; hint: {hint}" if hint else line
