"""Appends inside the caller's transaction: ``with journal.transaction() as tx:`` (and ``async with`` on the
asyncio face). ``tx.append(...)`` for any number of persistence ids and the caller's own SQL on
``tx.connection`` commit or roll back together.

Rules (the same on both faces, written once in :class:`TransactionRules`):

* each ``tx.append`` runs the write path's statement (:func:`pgjournal.write.event_writer.plan_append`) at once, so a
  conflict raises :class:`~pgjournal.errors.ConcurrencyConflict` at that call, before anything commits;
* without savepoints (the default) a failed append aborts the transaction, as any failed statement does in
  PostgreSQL, whatever made it fail (:func:`pgjournal.write.failures.classify`: also a conflict where no
  statement failed, an ``expected_seq_nr`` above the highest): later appends and the end of the block raise
  :class:`~pgjournal.errors.TransactionAborted` and nothing commits. ``savepoints=True`` runs each append in a
  savepoint, so the caller may catch the failure and go on; it costs two more round trips per append
  (the savepoint and its release), in time and in client CPU;
* inside a transaction a clash is always a conflict, also with ``expected_seq_nr=None`` (the write path
  outside transactions numbers after the new highest and tries again);
* writers' signals (NOTIFY) go out only after the commit; metrics count only committed appends;
* timestamps: each append stamps ``clock_timestamp()`` taken after its statement holds the journal's write
  lock, and the visibility horizon stays below the start of every open transaction holding that lock, so a
  transaction that waits between appends never lets a reader pass its events (portable mode: readers stay
  ``behind_current_time`` behind the clock, which must exceed the longest such transaction; see README);
* pgjournal's ``statement_timeout`` does not apply to the caller's statements in the transaction;
* with the batched tag writer (:mod:`pgjournal.write.tag_batcher`), a tagged append counts as in flight for it
  from before its insert (its watermark cannot pass the events while the transaction is open), its events are
  handed to the writer after the commit, and forgotten when the transaction rolls back (a commit whose outcome
  is unknown hands over whatever the journal holds of their persistence ids).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import TransactionAborted
from pgjournal.model.envelope import EventEnvelope
from pgjournal.runtime.steps import Step, run
from pgjournal.server.connections import user_statements
from pgjournal.write.append_steps import Rows, attempt_step, failure_step
from pgjournal.write.event_writer import AppendPlan, plan_append
from pgjournal.write.failures import Failure, classify

if TYPE_CHECKING:
    from pgjournal.core.journal_core import BlockingCore, JournalCore


class TransactionRules:
    """What both faces' transactions do around the connection they run on."""

    def __init__(self, journal: JournalCore, connection: Any, *, savepoints: bool) -> None:
        self.journal = journal
        #: The connection of the transaction: run your own SQL here, it commits with the appends.
        self.connection = connection
        self.savepoints = bool(savepoints)
        self._appended: list[tuple[AppendPlan, Rows]] = []
        self._aborted: TransactionAborted | None = None
        #: The batched tag writer (None: tag rows in the append's statement), and the tickets of this
        #: transaction's tagged appends that wrote their events (pgjournal.write.tag_batcher).
        self.tag_writer: Any = getattr(journal, "tag_writer", None)
        self._tickets: list[tuple[int, AppendPlan, Rows]] = []

    def _plan(self, persistence_id: str, events: Iterable[Any], expected_seq_nr: int | None, tags: Iterable[str],
              metadata: Any) -> AppendPlan | None:
        self.check()
        return plan_append(self.journal, persistence_id, events, expected_seq_nr, tags, metadata)

    def _batched(self, plan: AppendPlan) -> bool:
        """Whether the batched tag writer writes ``plan``'s tag rows (the face calls its ``begin`` first)."""
        return bool(plan.tags) and self.tag_writer is not None

    def _append_step(self, plan: AppendPlan, ticket: int | None = None) -> Step[list[EventEnvelope]]:
        """The append; ``ticket``: the batched tag writer's for it (forgotten if the append fails: nothing of it
        can commit)."""
        try:
            return (yield from self._attempt_step(plan, ticket))
        except BaseException:
            if ticket is not None:
                self.tag_writer.batch.failed(ticket, plan.pid, plan.slice, plan.tags, unknown=False)
            raise

    def _attempt_step(self, plan: AppendPlan, ticket: int | None) -> Step[list[EventEnvelope]]:
        error: psycopg.Error | None
        try:
            rows = yield from attempt_step(self.journal, plan, own_transaction=False, savepoint=self.savepoints)
        except psycopg.Error as exc:  # inside a transaction a clash is a conflict, whatever was expected
            failure, error = classify(exc, retryable=self.journal.dialect.retryable_sqlstates), exc
        else:
            if rows:
                self._appended.append((plan, rows))
                if ticket is not None:
                    self._tickets.append((ticket, plan, rows))
                return plan.envelopes(rows)
            failure, error = classify(None), None  # expected_seq_nr is above the highest: nothing was written
        # Every failure aborts the transaction, also one where no statement failed (no row written).
        if failure is Failure.RETRY:  # a serialization failure: the caller retries the whole transaction
            assert error is not None
            raise self._abort(error)
        raise self._abort((yield from failure_step(self.journal, plan, failure, error)))

    def _abort(self, error: BaseException) -> BaseException:
        """Note that ``error`` aborted the transaction (unless the append had its own savepoint)."""
        if not self.savepoints and self._aborted is None:
            self._aborted = TransactionAborted(
                f"the transaction was aborted by a failed append ({type(error).__name__}: {error}); nothing of it "
                "commits. Use journal.transaction(savepoints=True) to go on after a failed append", cause=error)
        return error

    def check(self) -> None:
        """Raise :class:`TransactionAborted` if a failed append aborted the transaction."""
        if self._aborted is not None:
            raise self._aborted

    def ended(self, *, committing: bool) -> None:
        """The transaction did not commit: the batched tag writer forgets its tagged appends, unless the commit
        was under way (``committing``: its outcome is unknown), then it writes whatever the journal holds."""
        tickets, self._tickets = self._tickets, []
        for ticket, plan, _ in tickets:
            self.tag_writer.batch.failed(ticket, plan.pid, plan.slice, plan.tags, unknown=committing)

    def committed(self, count: Any) -> None:
        """After the commit: hand the tagged appends to the batched tag writer, count the appends
        (``count(plan, rows)``) and signal live queries."""
        tickets, self._tickets = self._tickets, []
        for ticket, plan, rows in tickets:
            self.tag_writer.written(ticket, plan.pid, plan.slice, plan.tags, rows)
        signals = getattr(self.journal, "signals", None)
        for plan, rows in self._appended:
            count(plan, rows)
        if signals is not None:
            for slice_, entity_type in {(plan.slice, plan.entity_type) for plan, _ in self._appended}:
                signals.written(slice_, entity_type)


class Transaction(TransactionRules):
    """A unit of work on one connection of the journal's pool (see the module docstring)."""

    connection: psycopg.Connection[Any]

    def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
               tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """Like :meth:`Journal.append`, inside this transaction: visible to others once it commits."""
        plan = self._plan(persistence_id, events, expected_seq_nr, tags, metadata)
        if plan is None:
            return []
        ticket = self.tag_writer.begin(plan.entity_type) if self._batched(plan) else None
        return run(self._append_step(plan, ticket), self.connection)


@contextlib.contextmanager
def transaction(journal: BlockingCore, count: Callable[[AppendPlan, Rows], None], *,
                savepoints: bool = False) -> Iterator[Transaction]:
    """:meth:`Journal.transaction`; ``count``: the journal's writer's, given what committed."""
    with journal.connection() as conn:
        tx = Transaction(journal, conn, savepoints=savepoints)
        committing = False
        try:
            with conn.transaction(), user_statements(conn):
                yield tx
                tx.check()
                committing = True
        except BaseException:
            tx.ended(committing=committing)
            raise
        tx.committed(count)
