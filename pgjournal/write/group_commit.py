"""Group commit, the rules both faces follow: appends that would wait for a pool connection ride together. A
*drain* borrows a connection and sends its share of what is queued in one pipeline (psycopg's pipeline mode) and
**one transaction**: the statements run one after the other and one Sync ends them, so the group commits once
(one commit record, one WAL flush on the server) instead of once per append. Each statement is still the
append's own (its rows, its timestamp rule, its predecessor check, its events stamped while it holds the write
lock, as on a connection of its own).

A statement that fails (a primary-key clash, a deadlock, a timeout) rolls the whole group back, so nothing of it
was written: its own append goes back to its caller, which runs it on a connection of its own through the write
path (its conflict and retry rules, one implementation), and the others are queued again for the next pipeline.
Each failure takes one append out, so a group is tried at most as many times as it has appends. An append whose
statement found no predecessor inserts nothing and goes back to its caller the same way while the others commit.
Groups are sorted by persistence id, so two groups that insert the same keys lock them in one order and never
deadlock each other. Only the first attempt of an untagged append rides in a pipeline (a tagged one may record the
bucket size in a transaction of its own), and only on READ COMMITTED PostgreSQL (a serializable commit may fail
at the Sync, for the whole group). A lost connection leaves the outcome of what was sent unknown
(:class:`~pgjournal.errors.WriteOutcomeUnknown`: the whole group committed or none of it); what was not sent goes
back to its caller.

This module holds those rules without I/O or waiting: :class:`GroupCommit` is the queue and what each outcome
means for its members, each answered through a future. The faces only wait and send:
:mod:`pgjournal.write.pipelining` (threads, a submitting thread drains) and :mod:`pgjournal.aio.pipelining`
(asyncio tasks).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg.pq import ExecStatus

from pgjournal.runtime.steps import Call, Step, first_of
from pgjournal.settings import Settings
from pgjournal.write.append_steps import Rows
from pgjournal.write.event_writer import AppendPlan, failed
from pgjournal.write.failures import Failure, classify

#: Appends sent in one pipeline at most (a drain takes what is queued, up to this).
BATCH = 64
_DONE = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


class Answer(Protocol):
    """How a member of a group hears its outcome: an ``asyncio.Future``, or a thread's
    :class:`pgjournal.write.pipelining.Answer`. The result ``None`` means: not written, run the append on a
    connection of your own."""

    def done(self) -> bool: ...

    def set_result(self, result: Rows | None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


A = TypeVar("A", bound=Answer)


def supported() -> bool:
    """Pipeline mode: libpq 14 or later."""
    return psycopg.Pipeline.is_supported()


def allowed_step(settings: Settings) -> Step[bool]:
    """Whether group commits may run on this database: READ COMMITTED PostgreSQL only (a serializable commit
    may fail at the Sync, which a group cannot hand to one of its appends)."""
    if settings.portable:
        return False
    row = yield from first_of(("SHOW transaction_isolation", None))
    return bool(row) and row[0] == "read committed"


def lost(conn: Any, exc: psycopg.Error) -> bool:
    """The connection is gone (the server never answered), not a statement refused or skipped after one was: any
    other failure rolled the group back, and its append runs on its own (the write path classifies it)."""
    return classify(exc, conn=conn) is Failure.UNKNOWN


def cursors(conn: Any, count: int) -> list[Any]:
    """At least ``count`` cursors kept on the connection (blocking or asyncio) for its pipelines (a new cursor per
    append is client CPU paid on every append)."""
    kept: list[Any] = getattr(conn, "_pgjournal_pipeline_cursors", [])
    if len(kept) < count:
        kept = [cur for cur in kept if not cur.closed]
        kept.extend(conn.cursor() for _ in range(count - len(kept)))
        conn._pgjournal_pipeline_cursors = kept
    return kept


def failing(synced: bool, results: list[Any]) -> int | None:
    """Which statement of a group failed (its index); ``None``: none did. Committed only if the Sync came back
    clean *and* every statement has its result: the error of one (and the skipped ones after it) may have been
    fetched during a later execute, leaving the Sync clean; ``len(results)``: the commit itself failed."""
    for index, result in enumerate(results):
        if result is None or result.status not in _DONE:
            return index
    return None if synced else len(results)


def returned_rows(result: Any) -> bool:
    """Whether a statement's result holds rows to fetch (an append that found its predecessor)."""
    return result is not None and result.status == ExecStatus.TUPLES_OK


def stopped(plan: AppendPlan) -> BaseException:
    """The error of an append sent in a pipeline whose drain was stopped before its outcome came back."""
    return failed(plan.pid, Failure.UNKNOWN, psycopg.OperationalError("the pipeline carrying this append was stopped"))


class GroupCommit(Generic[A]):
    """The queue of appends waiting for a group, and what each group's outcome means for its members. ``guard``:
    held around every use of the queue (a lock where threads share it)."""

    def __init__(self, *, enabled: bool, guard: contextlib.AbstractContextManager[Any] | None = None) -> None:
        self.queue: collections.deque[tuple[AppendPlan, A]] = collections.deque()
        self.enabled = enabled and supported()
        self._guard = guard if guard is not None else contextlib.nullcontext()
        #: Appends sent in a pipeline so far, the pipelines that carried them, and those rolled back.
        self.sent = self.pipelines = self.rolled_back = 0

    def rides(self, plan: AppendPlan, ready: Callable[[], bool]) -> bool:
        """Whether ``plan`` should ride in a group: untagged, and no connection is free right now (``ready``)."""
        return self.enabled and not plan.tags and not ready()

    def take(self, drains: int) -> list[tuple[AppendPlan, A]]:
        """One drain's share of the queue, sorted by persistence id: every drain (connection) gets some, since
        each append waits for its whole group (a commit each on the server) and a drain taking all would leave
        the others idle. An answered member (a cancelled task's) is not sent."""
        batch: list[tuple[AppendPlan, A]] = []
        with self._guard:
            queue = self.queue
            share = min(BATCH, -(-len(queue) // max(1, drains)))
            while queue and len(batch) < share:
                item = queue.popleft()
                if not item[1].done():
                    batch.append(item)
            if batch:
                self.sent += len(batch)
                self.pipelines += 1
        batch.sort(key=lambda item: item[0].pid)
        return batch

    def hand_back(self) -> None:
        """Every queued append goes back to its caller, to run on a connection of its own (no drain will send it)."""
        with self._guard:
            queued = list(self.queue)
            self.queue.clear()
        for _plan, answer in queued:
            _answer(answer, None)

    def on_lost(self, batch: list[tuple[AppendPlan, A]], sent: int, exc: psycopg.Error) -> None:
        """The connection was lost after ``sent`` statements of ``batch`` were sent: their outcome is unknown
        (the whole group committed or none of it); the rest go back to their callers."""
        for index, (plan, answer) in enumerate(batch):
            if not answer.done():
                if index < sent:
                    answer.set_exception(failed(plan.pid, Failure.UNKNOWN, exc))
                else:
                    answer.set_result(None)

    def on_stop(self, batch: list[tuple[AppendPlan, A]]) -> None:
        """The drain sending ``batch`` was stopped (cancelled, interrupted): the outcome is unknown."""
        for plan, answer in batch:
            if not answer.done():
                answer.set_exception(stopped(plan))

    def on_commit(self, batch: list[tuple[AppendPlan, A]], rows: list[Rows | None]) -> None:
        """The group committed: each member's rows (``None``: it found no predecessor and wrote nothing)."""
        for (_plan, answer), its in zip(batch, rows, strict=True):
            _answer(answer, its or None)

    def on_rollback(self, batch: list[tuple[AppendPlan, A]], index: int) -> None:
        """The group rolled back at its statement ``index`` (``len(batch)``: at the commit, nothing to single
        out): that append goes back to its caller, the others are queued again, first."""
        with self._guard:
            self.rolled_back += 1
        if index >= len(batch):
            for _plan, answer in batch:
                _answer(answer, None)
            return
        _plan, answer = batch[index]
        _answer(answer, None)
        rest = batch[:index] + batch[index + 1:]
        with self._guard:
            self.queue.extendleft(reversed(rest))


class Send(Generic[A]):
    """One group sent, for both faces: the statements and Syncs as steps of :class:`~pgjournal.runtime.steps.Call`
    (the blocking driver calls the connection's methods, the asyncio driver awaits them), inside the pipeline the
    face opens (``with``/``async with`` :func:`~pgjournal.runtime.steps.pipeline`, so a drain stopped mid-send
    still leaves it, and a lost connection is raised once it has ended, not logged by psycopg as ignored):

        send = Send(rules, conn, batch)
        with send.guard(), pipeline(conn) as opened:
            run(send.pipeline_step(opened), conn)
        run(send.outcome_step(), conn)
    """

    def __init__(self, rules: GroupCommit[A], conn: Any, batch: list[tuple[AppendPlan, A]]) -> None:
        self._rules = rules
        self._conn = conn
        self._batch = batch
        self._kept = cursors(conn, len(batch))[: len(batch)]
        #: Statements handed to the pipeline so far; whether the Sync came back clean (``None``: not known, the
        #: connection was lost and the members are answered).
        self._sent = 0
        self._synced: bool | None = None

    def pipeline_step(self, pipeline: Any) -> Step[None]:
        """The group's statements and its Sync; an error that is not a lost connection is the group's failure,
        told by its results (:func:`failing`), and the pipeline is synced again to leave it clean."""
        for (plan, _answer), cur in zip(self._batch, self._kept, strict=True):
            self._sent += 1
            try:
                yield Call(cur.execute, (plan.sql, plan.params), _EXECUTE)
            except psycopg.Error as exc:  # an earlier statement's error, fetched now: the group failed
                if lost(self._conn, exc):
                    raise
        try:
            yield Call(pipeline.sync)
            self._synced = True
        except psycopg.Error as exc:  # the first error among the results: sync again to leave it clean
            if lost(self._conn, exc):
                raise
            yield Call(pipeline.sync)
            self._synced = False

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around the pipeline: a lost connection answers the members (:meth:`GroupCommit.on_lost`); any other
        error is raised."""
        try:
            yield
        except psycopg.Error as exc:
            if not lost(self._conn, exc):
                raise
            self._synced = None
            self._rules.on_lost(self._batch, self._sent, exc)

    def outcome_step(self) -> Step[None]:
        """After the pipeline: each member answered by what the group's results say (nothing to do once the
        connection was lost)."""
        if self._synced is None:
            return
        results = [cur.pgresult for cur in self._kept]
        index = failing(self._synced, results)
        if index is not None:
            self._rules.on_rollback(self._batch, index)
            return
        rows: list[Rows | None] = []
        for cur, result in zip(self._kept, results, strict=True):
            rows.append((yield Call(cur.fetchall)) if returned_rows(result) else None)
        self._rules.on_commit(self._batch, rows)


#: How a group's statements run: prepared (each append's statement is one of few shapes), binary results.
_EXECUTE: dict[str, Any] = {"prepare": True, "binary": True}


def _answer(answer: Answer, rows: Rows | None) -> None:
    if not answer.done():
        answer.set_result(rows)
