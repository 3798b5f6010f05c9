"""Sans-I/O steps: query logic that *describes* its statements, and the thin drivers that run them.

A *step* is a generator. It yields a request and receives the answer:

* :class:`Statement` (SQL, parameters and the fetch options: binary, prepared or not, streamed in chunks)
  → the rows (a list of tuples), or the row count for a statement that returns no rows;
* :data:`MORE` → the next chunk of the statement being streamed (``[]`` once it is exhausted, and at
  once for a statement that was not streamed);
* :class:`Pipelined` → the answers of several statements sent together, in one round trip (a horizon reading
  and the page below it);
* :class:`Sleep` → ``None`` after that many seconds (a settle poll, a gap search waiting a moment);
* :class:`Call` → what a function of the face returns (awaited by the asyncio driver when it is awaitable):
  an operation of the face inside shared logic (the journal's ``append``, a user's handler), optionally
  given the step's connection.

Its return value is the step's result. A statement that fails raises inside the step, at its ``yield``,
as a ``conn.execute`` would; a step that is abandoned (its driver cancelled) is closed, so its ``finally``
and ``except BaseException`` blocks run. The logic never touches a connection, so the same step runs on
a blocking connection with :func:`run` and on an asyncio one with :func:`arun`: one implementation of the
SQL and the rules, two thin drivers (as psycopg generates its sync code from its async code).

A query that needs several connections in turn (a current query: one per page) is a sequence of steps,
each returning a list of items (:data:`Steps`); :func:`drive` and :func:`adrive` run such a sequence, each
step on a connection borrowed for it, and yield the items. The sequence is lazy: it makes the next step
after the previous one ran, from what it returned or the state it left.

Logic that runs one step after another, each on a fresh borrowing of a connection of its own and tried again
after a transient failure (the batched tag writer's statements, the signals' listener), is :data:`Work`, run by
:func:`run_work` and :func:`arun_work`: the rule of when to try again is the work's, the waiting the driver's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg.pq import Format
from psycopg.rows import tuple_row

from pgjournal.store import Read

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement to run and fetch."""

    sql: str
    params: Any = None
    #: Binary results (timestamps, bytea and integers parse faster).
    binary: bool = False
    #: ``None``: psycopg's default (prepared once it ran ``prepare_threshold`` times); ``False``: never
    #: (a generic plan cannot prune partitions or use the bounds: the by-slice page runs many times slower).
    prepare: bool | None = None
    #: ``> 1``: stream the rows in chunks of this size (libpq 17+), the first chunk as the answer and the
    #: next ones for :data:`MORE`; the step must read to the end (an empty chunk) before its next statement.
    stream: int = 0
    #: How a row decodes (a store :class:`~pgjournal.store.Read`'s row factory); ``None``: tuples.
    row: Any = None
    #: With ``binary``: ``timestamptz`` values as :data:`datetime.UTC` datetimes whatever the session's
    #: ``TimeZone`` (see :func:`utc_timestamps`).
    utc: bool = False


@dataclass(frozen=True, slots=True)
class Pipelined:
    """Statements sent together and answered together by the blocking driver: one round trip for all of them, run
    in order. Outside a transaction they run in the pipeline's one implicit transaction, under the session's
    isolation: each has a snapshot of its own, taken after the one before it ran, only under READ COMMITTED (the
    caller checks; it may read ``current_setting('transaction_isolation')`` in the first). Inside a step's own
    transaction (after its ``BEGIN``) they run in it, exactly as if sent one by one. The asyncio driver runs them
    one after another (outside a transaction, each in one of its own): a pipeline cancelled mid-way (a live query
    closed, a projection stopped) can leave psycopg's asyncio connection believing it is still in pipeline mode,
    and the pool would lend it out so. Reads (advisory locks included) only; none may be streamed."""

    statements: tuple[Statement, ...]

    def __post_init__(self) -> None:
        if any(s.stream > 1 for s in self.statements):
            raise ValueError("a pipelined statement cannot be streamed")


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait this many seconds (the connection stays with the step)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Call:
    """Call ``fn(*args, **kwargs)``; with ``connection``, ``fn(conn, *args, **kwargs)`` on the step's connection.
    The asyncio driver awaits a result that is awaitable; the blocking driver refuses one."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    connection: bool = False


class _UtcTimestamptz:
    """A loader "class" for binary ``timestamptz`` (psycopg calls it as ``(oid, context)``): psycopg's own
    loader made without the context, so in UTC, not in the connection's time zone."""

    format = Format.BINARY

    def __init__(self) -> None:
        self.oid = psycopg.postgres.types["timestamptz"].oid
        self.loader = psycopg.adapters.get_loader(self.oid, Format.BINARY)

    def __call__(self, oid: int, context: Any = None) -> Any:
        assert self.loader is not None
        return self.loader(oid)


_UTC_TIMESTAMPTZ = _UtcTimestamptz()


def utc_timestamps(cur: Any) -> Any:
    """``cur`` (a new cursor, sync or asyncio) with its binary ``timestamptz`` values loaded as
    :data:`datetime.UTC` datetimes. psycopg makes them in the session's time zone, and a zone that is not
    exactly ``UTC`` (``Etc/UTC``, a server's local zone) costs a conversion per value: a large part of reading
    a by-slice page's rows. Instants are unchanged; only the ``tzinfo`` differs."""
    cur.adapters.register_loader(_UTC_TIMESTAMPTZ.oid, _UTC_TIMESTAMPTZ)
    return cur


class _More:
    def __repr__(self) -> str:
        return "MORE"


#: Ask for the next chunk of the statement being streamed.
MORE = _More()

Request = Statement | Pipelined | Sleep | Call | _More
Step = Generator[Request, Any, R]
#: A query that runs on several connections in turn: its steps, each returning its items (a list, or an
#: iterator that makes them as they are read, after the connection went back). A generator of steps receives
#: what each step returned (``items = yield step``) and may read the state it left.
Steps = Iterable[Step[Iterable[T]]]


def statement(query: tuple[str, Any] | Read[Any], **options: Any) -> Statement:
    """A store's ``(sql, params)`` or :class:`~pgjournal.store.Read` (rows decoded by its row factory) as a
    :class:`Statement` with fetch ``options``."""
    if isinstance(query, Read):
        return Statement(query.sql, query.params, row=query.row, **options)
    return Statement(query[0], query[1], **options)


def rows_of(query: tuple[str, Any] | Read[Any], **options: Any) -> Step[list[Any]]:
    """A step of one statement: its rows."""
    rows: list[Any] = yield statement(query, **options)
    return rows


def first_of(query: tuple[str, Any] | Read[Any], **options: Any) -> Step[Any]:
    """A step of one statement: its first row (``None`` when there is none)."""
    rows: list[Any] = yield statement(query, **options)
    return rows[0] if rows else None


def count_of(query: tuple[str, Any] | Read[Any], **options: Any) -> Step[int]:
    """A step of one statement that returns no rows: its row count."""
    count: int = yield statement(query, **options)
    return count


def joined(steps: Steps[T]) -> Step[list[T]]:
    """A sequence of steps as one step (all on one connection): the items of all of them."""
    out: list[T] = []
    sequence = iter(steps)
    step = next(sequence, None)
    while step is not None:
        items = yield from step
        out.extend(items)
        step = _following(sequence, items)
    return out


# -- the blocking driver -------------------------------------------------------------------------------


class _SyncFetch:
    """Runs the requests of one step on a blocking connection (borrowed at its first statement, when the step
    is given a ``connection`` factory instead)."""

    def __init__(self, conn: psycopg.Connection | None,
                 connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]] | None = None
                 ) -> None:
        self.conn = conn
        self._connection = connection
        self._borrowed = contextlib.ExitStack()
        self.chunks: Iterator[list[Any]] | None = None
        self._stream: Any = None

    def answer(self, request: Request) -> Any:
        if request is MORE:
            return next(self.chunks, []) if self.chunks is not None else []
        self.close_stream()
        if isinstance(request, Sleep):
            time.sleep(request.seconds)
            return None
        if self.conn is None and (not isinstance(request, Call) or request.connection):
            assert self._connection is not None
            self.conn = self._borrowed.enter_context(self._connection())
        if isinstance(request, Call):
            result = request.fn(*_arguments(request, self.conn), **request.kwargs)
            if inspect.isawaitable(result):
                _discard(result)
                raise TypeError(f"{request.fn!r} returned an awaitable: run this step with the asyncio driver")
            return result
        conn = self.conn
        assert conn is not None, "a statement borrows a connection above"
        if isinstance(request, Pipelined):
            return _pipelined(conn, request)
        assert isinstance(request, Statement), request
        if request.stream > 1:
            cur = conn.cursor(binary=request.binary, row_factory=request.row)
            if request.utc:
                utc_timestamps(cur)
            stream = cur.stream(request.sql, request.params, size=request.stream)
            self._stream = stream
            self.chunks = iter(lambda: list(itertools.islice(stream, request.stream)), [])
            return next(self.chunks, [])
        with conn.cursor(binary=request.binary, row_factory=request.row) as cur:
            if request.utc:
                utc_timestamps(cur)
            cur.execute(request.sql, request.params, prepare=request.prepare)
            return cur.fetchall() if cur.description is not None else cur.rowcount

    def outcome(self, request: Request) -> tuple[Any, BaseException | None]:
        """``(answer, None)``, or ``(None, error)`` to raise inside the step, where it asked."""
        try:
            return self.answer(request), None
        except Exception as exc:
            self.close_stream()
            return None, exc

    def close_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream, self.chunks = self._stream, None, None
            stream.close()  # psycopg cancels and drains what is left


@contextlib.contextmanager
def pipeline(conn: psycopg.Connection) -> Iterator[psycopg.Pipeline]:
    """``conn.pipeline()``, with a database error raised inside it held until the pipeline has ended and raised
    then (the first one, if its end failed too). Raised through the end, psycopg would log the end's own failure
    (on a lost link it fails as well) as an error it ignored: a line per poll, or per group commit, while a link
    is down."""
    held: psycopg.Error | None = None
    try:
        with conn.pipeline() as opened:
            try:
                yield opened
            except psycopg.Error as exc:
                held = exc
    except psycopg.Error as ended:
        held = held or ended
    if held is not None:
        raise held


@contextlib.asynccontextmanager
async def apipeline(conn: psycopg.AsyncConnection) -> AsyncIterator[psycopg.AsyncPipeline]:
    """:func:`pipeline` on an asyncio connection."""
    held: psycopg.Error | None = None
    try:
        async with conn.pipeline() as opened:
            try:
                yield opened
            except psycopg.Error as exc:
                held = exc
    except psycopg.Error as ended:
        held = held or ended
    if held is not None:
        raise held


def _pipelined(conn: psycopg.Connection, request: Pipelined) -> list[Any]:
    """:class:`Pipelined` on a blocking connection: its statements' rows (or row counts), in order. A failed
    statement aborts the transaction it runs in (the pipeline's implicit one, which its end rolls back)."""
    cursors = []
    with pipeline(conn):
        for one in request.statements:
            cur = conn.cursor(binary=one.binary, row_factory=one.row)
            if one.utc:
                utc_timestamps(cur)
            cursors.append(cur.execute(one.sql, one.params, prepare=one.prepare))
    return [cur.fetchall() if cur.description is not None else cur.rowcount for cur in cursors]


def run(step: Step[R], conn: psycopg.Connection) -> R:
    """Run ``step`` on a blocking connection and return its result."""
    return _run(step, _SyncFetch(conn))


def run_pooled(step: Step[R], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]) -> R:
    """Run ``step`` on a connection borrowed from ``connection()`` (e.g. ``journal.connection``) at its first
    statement and returned when it ends (a step that only sleeps borrows none)."""
    return _run(step, _SyncFetch(None, connection))


def run_calls(step: Step[R]) -> R:
    """Run a step that asks for no connection, only :class:`Call` and :class:`Sleep` (logic over a face's own
    operations, such as a sharded journal's routing)."""
    return _run(step, _SyncFetch(None))


def _advance(step: Step[R], answer: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the step its answer (or raise ``error`` where it asked): ``(False, its next request)``, or
    ``(True, its result)``."""
    try:
        return False, step.throw(error) if error is not None else step.send(answer)
    except StopIteration as finished:
        return True, finished.value


def _run(step: Step[R], fetch: _SyncFetch) -> R:
    outcome: tuple[Any, BaseException | None] = (None, None)
    with fetch._borrowed:
        try:
            while True:
                finished, request = _advance(step, *outcome)
                if finished:
                    return request  # type: ignore[no-any-return]
                outcome = fetch.outcome(request)
        finally:
            fetch.close_stream()
            step.close()


def drive(steps: Steps[T], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]
          ) -> Iterator[T]:
    """Run each step of ``steps`` on a connection borrowed for it; the items each returns, in order. The items are
    handed out by :func:`itertools.chain` (one Python frame less per item than a generator: a catch-up's cost),
    the next step run when the last one's items are all taken."""
    return itertools.chain.from_iterable(_pages(steps, connection))


def _pages(steps: Steps[T], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]
           ) -> Iterator[Iterable[T]]:
    sequence = iter(steps)
    step = next(sequence, None)
    while step is not None:
        items = run_pooled(step, connection)
        yield items
        step = _following(sequence, items)


def drive_ahead(steps: Steps[T], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]
                ) -> Iterator[T]:
    """:func:`drive`, each step after the first run by a :class:`ReadAhead` while the reader takes the last one's
    items: the server reads the next page while the client hands out this one. For a sequence whose next step
    depends on the state the previous one left, not on its items being taken (as :func:`adrive_ahead`); a step's
    error is raised where its items would come; a reader that stops waits for the step then running and drops its
    items. The journal calls it only with a pool of two connections or more: a reader holding the only one would
    wait for itself."""
    return itertools.chain.from_iterable(_pages_ahead(steps, connection))


def _pages_ahead(steps: Steps[T], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]
                 ) -> Iterator[Iterable[T]]:
    sequence = iter(steps)
    step = next(sequence, None)
    if step is None:
        return
    items: Iterable[T] = run_pooled(step, connection)
    with ReadAhead(connection) as ahead:
        while (step := _following(sequence, items)) is not None:
            page = ahead.start(step)
            try:
                yield items
            except GeneratorExit:  # the reader stopped: the step ends before its connection goes back
                with contextlib.suppress(Exception):
                    page.result()
                raise
            items = page.result()
    yield items


class Abandoned(Exception):
    """A step read ahead ended at a request because its reader was closed."""


def _until_closed(step: Step[R], closed: threading.Event) -> Step[R]:
    """``step``, ended (:class:`Abandoned`) at its next request once ``closed`` is set."""
    outcome: tuple[Any, BaseException | None] = (None, None)
    while True:
        finished, request = _advance(step, *outcome)
        if finished:
            return request  # type: ignore[no-any-return]
        if closed.is_set():
            step.close()
            raise Abandoned
        try:
            outcome = (yield request), None
        except BaseException as exc:  # the request's error, raised where the step asked
            outcome = None, exc


class ReadAhead:
    """Runs blocking steps in a thread of its own, each on a connection borrowed there for its own statements
    only (nothing is held open between them): libpq waits for the server's answer without the GIL, so the server
    runs a step's statement while the caller's thread goes on."""

    def __init__(self, connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]) -> None:
        self._connection = connection
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = threading.Event()

    def start(self, step: Step[R]) -> concurrent.futures.Future[R]:
        """``step`` started; returns once it holds its connection (or is done). Without that wait the thread
        would wait for the GIL until the caller's loop lets it go (a switch interval, longer than a page takes),
        and its statement would not overlap with anything; from there it runs up to libpq's wait for the answer,
        which lets the GIL go."""
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pgjournal-read-ahead")
        started = threading.Event()

        @contextlib.contextmanager
        def borrowed() -> Iterator[psycopg.Connection]:
            with self._connection() as conn:
                started.set()
                yield conn

        future = self._thread.submit(run_pooled, _until_closed(step, self._closed), borrowed)
        future.add_done_callback(lambda _: started.set())
        started.wait()
        return future

    def close(self) -> None:
        """No more steps; one still running ends in its thread at its next statement (nobody will take what it
        reads: a live query's back track after a catch-up could otherwise run on), its connection given back."""
        self._closed.set()
        if self._thread is not None:
            self._thread.shutdown(wait=False)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# -- the asyncio driver --------------------------------------------------------------------------------


class _AsyncFetch:
    """Runs the requests of one step on an asyncio connection (borrowed at its first statement, when the step
    is given a ``connection`` factory instead)."""

    def __init__(self, conn: psycopg.AsyncConnection | None,
                 connection: Callable[[], contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]] | None
                 = None) -> None:
        self.conn = conn
        self._connection = connection
        self._borrowed = contextlib.AsyncExitStack()
        self._stream: Any = None
        self._size = 0

    async def answer(self, request: Request) -> Any:
        if request is MORE:
            return await self._chunk() if self._stream is not None else []
        if self._stream is not None:
            await self.close_stream()
        if request.__class__ is Statement and self.conn is not None and request.stream <= 1:
            return await _execute(self.conn, request)  # the common case, first
        if request.__class__ is Call and not request.connection:  # a face's operation (a group's statements)
            result = request.fn(*request.args, **request.kwargs)
            return await result if inspect.isawaitable(result) else result
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return None
        if self.conn is None and (not isinstance(request, Call) or request.connection):
            assert self._connection is not None
            self.conn = await self._borrowed.enter_async_context(self._connection())
        if isinstance(request, Call):
            result = request.fn(*_arguments(request, self.conn), **request.kwargs)
            return await result if inspect.isawaitable(result) else result
        conn = self.conn
        assert conn is not None, "a statement borrows a connection above"
        if isinstance(request, Pipelined):  # one after another (see Pipelined)
            return [await _execute(conn, one) for one in request.statements]
        assert isinstance(request, Statement), request
        if request.stream > 1:
            cur = conn.cursor(binary=request.binary, row_factory=request.row)
            if request.utc:
                utc_timestamps(cur)
            self._stream, self._size = cur.stream(request.sql, request.params, size=request.stream), request.stream
            return await self._chunk()
        return await _execute(conn, request)

    async def _chunk(self) -> list[Any]:
        chunk: list[Any] = []
        async for row in self._stream:
            chunk.append(row)
            if len(chunk) >= self._size:
                break
        return chunk

    async def close_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


async def arun(step: Step[R], conn: psycopg.AsyncConnection) -> R:
    """Run ``step`` on an asyncio connection and return its result (cancelling it closes the step)."""
    return await _arun(step, _AsyncFetch(conn))


async def arun_pooled(step: Step[R], connection: Callable[[], contextlib.AbstractAsyncContextManager[
        psycopg.AsyncConnection]]) -> R:
    """:func:`run_pooled` for asyncio: ``connection()`` is e.g. an ``AsyncConnectionPool``'s ``connection``."""
    return await _arun(step, _AsyncFetch(None, connection))


async def arun_calls(step: Step[R]) -> R:
    """:func:`run_calls` for asyncio: the operations it calls are awaited."""
    return await _arun(step, _AsyncFetch(None))


async def _arun(step: Step[R], fetch: _AsyncFetch) -> R:
    outcome: tuple[Any, BaseException | None] = (None, None)
    async with fetch._borrowed:
        try:
            finished, request = _advance(step, *outcome)
            while not finished:
                try:
                    outcome = await fetch.answer(request), None
                except Exception as exc:
                    await fetch.close_stream()
                    outcome = None, exc
                finished, request = _advance(step, *outcome)
            return request  # type: ignore[no-any-return]
        finally:
            if fetch._stream is not None:
                await fetch.close_stream()
            step.close()


async def _execute(conn: psycopg.AsyncConnection, request: Statement) -> Any:
    """One statement on the connection's cursor kept for steps (a new cursor per statement is client CPU paid
    on every statement): its rows, or its row count."""
    kept = "_pgjournal_utc_cursor" if request.utc else "_pgjournal_cursor"  # loaders stay with a cursor
    cur: psycopg.AsyncCursor[Any] | None = getattr(conn, kept, None)
    if cur is None or cur.closed:
        cur = utc_timestamps(conn.cursor()) if request.utc else conn.cursor()
        with contextlib.suppress(AttributeError):  # a connection class with __slots__: a cursor each time
            setattr(conn, kept, cur)
    cur.row_factory = request.row or tuple_row
    await cur.execute(request.sql, request.params, prepare=request.prepare, binary=request.binary)
    return await cur.fetchall() if cur.pgresult is not None and cur.description is not None else cur.rowcount


async def adrive(steps: Steps[T],
                 connection: Callable[[], contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]]
                 ) -> AsyncIterator[T]:
    """:func:`drive` for asyncio."""
    sequence = iter(steps)
    step = next(sequence, None)
    while step is not None:
        items = await arun_pooled(step, connection)
        for item in items:
            yield item
        step = _following(sequence, items)


async def adrive_ahead(steps: Steps[T] | Awaitable[Steps[T]],
                       connection: Callable[[], contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]]
                       ) -> AsyncIterator[T]:
    """:func:`adrive`, each step after the first started as a task before the previous one's items are handed out,
    so the server reads the next page while the reader takes the last one's (the blocking face has no such
    overlap: a thread for it cost more client CPU than it saved). For a sequence whose next step depends on the
    state the previous one left, not on its items being taken; a step's error is raised where its items would
    come, and a step still running when the reader stops is cancelled. ``steps`` may be awaitable (what a query
    awaits before its first step): awaited at the first item, so that a query is one async generator, not two
    stacked, per item."""
    sequence = iter(await steps if inspect.isawaitable(steps) else steps)
    step = next(sequence, None)
    if step is None:
        return
    items = await arun_pooled(step, connection)
    ahead: asyncio.Task[Iterable[T]] | None = None
    try:
        while True:
            step = _following(sequence, items)
            if step is None:
                for item in items:
                    yield item
                return
            ahead = asyncio.ensure_future(arun_pooled(step, connection))
            await asyncio.sleep(0)  # the task runs up to its first wait: its statement is sent
            for item in items:
                yield item
            items = await ahead
            ahead = None
    finally:
        if ahead is not None:
            ahead.cancel()  # nothing when it is done (its error, if any, is still read below)
            with contextlib.suppress(BaseException):
                await ahead


# -- work: steps each on a connection of its own, retried ---------------------------------------------------

#: Logic that runs several steps, each on a fresh borrowing of one connection factory, and may try a step again
#: after a failure: a generator that yields a factory of a fresh step for each (the driver runs it, retrying
#: under the work's pause rule, and sends back its result or throws its error in) and returns the work's result.
Work = Generator[Callable[[], Step[Any]], Any, R]
#: The pause rule of a work: after failed try ``attempt`` (1 for the first) of a step with an error, the seconds
#: to wait before trying it again, or ``None`` to give up (the error goes into the work).
Pause = Callable[[int, BaseException], float | None]


def run_work(work: Work[R], connection: Callable[[], contextlib.AbstractContextManager[psycopg.Connection]],
             pause: Pause) -> R:
    """Run ``work`` on blocking connections: each step on one borrowed from ``connection()`` for it (a lost one
    is given back, the next try borrows another), retried under ``pause``."""
    return run_pooled(_retried(work, pause, run_pooled, connection), connection)


async def arun_work(work: Work[R], connection: Callable[[], contextlib.AbstractAsyncContextManager[
        psycopg.AsyncConnection]], pause: Pause) -> R:
    """:func:`run_work` for asyncio."""
    return await arun_pooled(_retried(work, pause, arun_pooled, connection), connection)


def _retried(work: Work[R], pause: Pause, runner: Callable[..., Any], connection: Any) -> Step[R]:
    """``work`` as one step that borrows nothing itself: each of its steps a :class:`Call` of ``runner`` (the
    face's :func:`run_pooled` or :func:`arun_pooled`) on ``connection``, a failed one tried again after a
    :class:`Sleep` of what ``pause`` says."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                make = work.throw(error) if error is not None else work.send(result)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            attempt = 0
            while True:
                attempt += 1
                try:
                    result, error = (yield Call(runner, (make(), connection))), None
                    break
                except Exception as exc:
                    wait = pause(attempt, exc)
                    if wait is None:
                        result, error = None, exc
                        break
                yield Sleep(wait)
    finally:
        work.close()


def _arguments(call: Call, conn: Any) -> tuple[Any, ...]:
    return (conn, *call.args) if call.connection else call.args


def _discard(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:  # a coroutine never awaited: close it quietly
        close()


def _following(sequence: Iterator[Step[Iterable[T]]], items: Iterable[T]) -> Step[Iterable[T]] | None:
    """The step after one that returned ``items`` (a generator of steps receives them), ``None`` at the end."""
    try:
        return sequence.send(items) if isinstance(sequence, Generator) else next(sequence)
    except StopIteration:
        return None
