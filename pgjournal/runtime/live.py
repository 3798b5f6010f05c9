"""The one live-polling loop, shared by every live query (by persistence id, by slices, by tag).

A query supplies ``poll(notified) -> (items, rows_read)``; the loop yields the items and decides when to
poll again, as Akka does: a nearly full page (>= 90 % of the buffer) polls again at once, a nearly empty
one (<= 10 %) waits ``refresh_interval``, anything between waits half of it. A writer's signal ends the
wait early (and, when a query reads a margin behind the clock, ``settle`` seconds after a signal the loop
looks once more, so an event signalled before it became readable is not left for the next refresh); a
lost signal costs only latency.

A poll that fails because the database is unreachable is retried with exponential backoff (0.1 s up to
5 s, with jitter so many queries do not retry in step) until it succeeds or the query is closed; ``poll``
must leave its state unchanged when it raises, so the query resumes exactly where it was. After
``max_failures`` failed polls in a row (setting ``live_query_retries``) the query raises
:class:`DatabaseUnavailable` naming the count. When the journal is closed under it, the query ends.

The decisions (when to poll next, whether a poll counts as notified, how a failure is retried) are a
:class:`Schedule` that neither waits nor listens; :class:`LiveQuery` is the blocking loop around it (a
``threading.Event`` set by writers' signals), and an asyncio loop takes the same schedule around an
``asyncio.Event`` and a poll step run with :func:`pgjournal.runtime.steps.arun_pooled`. A poll may return its items
as :class:`Made` (each made when it is taken), which the loop hands out one by one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import PoolClosed

from pgjournal.errors import DatabaseUnavailable, JournalClosed
from pgjournal.model.printable import printable_logger
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Abandoned, ReadAhead, Step

T = TypeVar("T")
D = TypeVar("D")
_log = printable_logger(__name__)
#: A read cancelled by a concurrent write (serialization failure, deadlock): run it again, it is not down.
CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
#: A poll cancelled by a serialization conflict runs again soon: anything up to 10 ms, doubling to 250 ms.
CONFLICT_BACKOFF = Backoff(0.01, 2.0, 0.25, jitter=1.0)
#: After a failed poll (the database gone, a connection lost): half to all of 100 ms, doubling to 5 s.
FAILURE_BACKOFF = Backoff(0.1, 2.0, 5.0, jitter=0.5)
RETRYABLE = (psycopg.OperationalError, DatabaseUnavailable)
_END = object()

#: ``poll(notified) -> (items, rows read)``; the items may be :class:`Made` (made as they are taken).
Poll = Callable[[bool], tuple[Iterable[T], int]]
Subscribe = Callable[[threading.Event], Callable[[], None]]


class Made(Generic[D, T]):
    """A poll's items, each made (``make(datum)``) only when it is taken, so a page of thousands is not kept
    alive at once (the garbage collector's cost). One whose making raises (a payload that does not decode)
    stays first: taken again, it is made again, so nothing is skipped, as when the whole poll failed."""

    def __init__(self, data: Iterable[D], make: Callable[[D], T]) -> None:
        self._data = deque(data)
        self._make = make

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._data:
            raise StopIteration
        item = self._make(self._data[0])
        self._data.popleft()
        return item

    def __len__(self) -> int:
        return len(self._data)


class Schedule:
    """The live loop's decisions, without waiting or listening: after each poll (or failed poll), how long to
    wait before the next one (:attr:`delay`) and whether the next one counts as notified."""

    def __init__(self, *, buffer_size: int, refresh_interval: float, settle: float = 0.0,
                 max_failures: int | None = None) -> None:
        self._buffer_size = buffer_size
        self._refresh_interval = refresh_interval
        self._settle = settle
        self._max_failures = max_failures
        #: Seconds to wait (a writer's signal ends the wait early) before the next poll.
        self.delay = 0.0
        self._settling = False
        self._failures = 0
        self._failing_since = 0.0
        self._conflicts = 0

    def notified(self, signalled: bool) -> bool:
        """Whether the next poll counts as notified: a signal came, or it is the look after a signal."""
        return signalled or self._settling

    def polled(self, rows: int, signalled: bool) -> None:
        """A poll read ``rows`` rows (``signalled``: a signal had come before it)."""
        self._failures = self._conflicts = 0
        self.delay = self.delay_after(rows)
        # A signal can arrive before the new rows are readable (a query stays a margin behind the clock):
        # look again once that margin has passed instead of a whole refresh interval later.
        self._settling = signalled and self._settle > 0
        if self._settling:
            self.delay = min(self.delay, self._settle)

    def delay_after(self, rows: int) -> float:
        """Akka's rule: a nearly full page polls again at once, a nearly empty one waits the refresh interval,
        anything between half of it."""
        if rows >= 0.9 * self._buffer_size:
            return 0.0
        if rows <= 0.1 * self._buffer_size:
            return self._refresh_interval
        return self._refresh_interval / 2

    def failed(self, exc: BaseException) -> DatabaseUnavailable | None:
        """A poll failed with a retryable ``exc``: back off (:attr:`delay`), or, past ``max_failures`` in a
        row, the error that ends the query. A read cancelled by a serialization conflict (40001/40P01: routine
        under SERIALIZABLE, CockroachDB's default) is no failure: it runs again after a short jittered pause."""
        if getattr(exc, "sqlstate", None) in CONFLICT_SQLSTATES:
            self._conflicts += 1
            self.delay = CONFLICT_BACKOFF.delay(self._conflicts)
            _log.debug("live query poll cancelled by a serialization conflict (%d in a row); again in %.3f s",
                       self._conflicts, self.delay)
            return None
        self._failures += 1
        if self._failures == 1:
            self._failing_since = time.monotonic()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if self._max_failures is not None and self._failures > self._max_failures:
            return DatabaseUnavailable(
                f"live query gave up after {self._failures} failed polls in a row over "
                f"{time.monotonic() - self._failing_since:.1f} s (live_query_retries is "
                f"{self._max_failures}); last: {type(exc).__name__}: {first_line}")
        self.delay = FAILURE_BACKOFF.delay(self._failures)
        _log.warning("live query poll failed (%s: %s); retrying in %.2f s (failure %d in a row)",
                     type(exc).__name__, first_line, self.delay, self._failures)
        return None


class LoopState(Generic[T]):
    """What the blocking and the asyncio live loop share besides the :class:`Schedule`: the page being handed
    out, the wake-up event (``threading.Event`` or ``asyncio.Event``: a writer's signal sets it), closing, and
    what a failed poll means. A driver only waits and polls in its own way."""

    def __init__(self, schedule: Schedule, wakeup: Any, subscribe: Callable[[Any], Callable[[], None]] | None,
                 first: Iterable[T] = ()) -> None:
        self._schedule = schedule
        #: What is handed out before the next poll (``first``: before the first one).
        self._page: Iterator[T] = iter(first)
        self._closed = False
        self._wakeup = wakeup
        self._unsubscribe = subscribe(wakeup) if subscribe else None

    def ready(self, most: int) -> list[T]:
        """Up to ``most`` more items of the page being handed out, those there without a poll (a consumer that
        takes them in chunks: one hand-over between threads or tasks for many items). An item whose making
        raises ends the list and stays first, raised by the next take."""
        out: list[T] = []
        page = self._page
        try:
            while len(out) < most:
                out.append(next(page))
        except StopIteration:
            pass
        except Exception:
            if not isinstance(page, Made):
                raise  # not kept: raised now, as a take would
        return out

    def _signalled(self) -> bool:
        """Whether a signal came since the last poll (and forget it)."""
        signalled: bool = self._wakeup.is_set()
        self._wakeup.clear()
        return signalled

    def _polled(self, items: Iterable[T], rows: int, signalled: bool) -> None:
        self._page = iter(items)
        self._schedule.polled(rows, signalled)

    def _reads_ahead(self) -> bool:
        """Whether the next poll starts now, before this page is handed out: the schedule polls again at once
        (a nearly full page, a catch-up), so the server reads the next page while the reader takes this one."""
        return self._schedule.delay == 0 and not self._closed

    def _ends(self, exc: Exception) -> bool:
        """A poll raised ``exc``: ``True`` when the query ends quietly (its journal was closed), ``False`` to
        poll again after the schedule's backoff; ``exc`` itself, or past ``max_failures`` a
        :class:`DatabaseUnavailable`, is raised (a fatal one closes the query)."""
        if isinstance(exc, PoolClosed | JournalClosed):
            _log.info("live query ends: its journal was closed")
            self.close()
            return True
        if isinstance(exc, Abandoned):  # closed (from another thread) while its next poll ran ahead
            return True
        if not isinstance(exc, RETRYABLE):
            raise exc
        fatal = self._schedule.failed(exc)
        if fatal is not None:
            self.close()
            raise fatal from exc
        return False

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def closed(self) -> bool:
        return self._closed


#: ``poll_step(notified)``: a poll as a step, for a query whose next poll may run while this one's items are
#: handed out (its state is the stream's, not the items'), with the pool it borrows from.
PollAhead = tuple[Callable[[bool], Step[tuple[Iterable[T], int]]],
                  Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]]


class LiveQuery(LoopState[T]):
    """An iterator that never ends by itself; ``close()`` (or leaving ``with``) stops it, from any thread.
    With ``ahead``, a poll that the schedule runs at once (a catch-up) is started by a :class:`ReadAhead` before
    the last one's items are handed out."""

    def __init__(self, poll: Poll[T], schedule: Schedule, subscribe: Subscribe | None = None,
                 ahead: PollAhead[T] | None = None) -> None:
        super().__init__(schedule, threading.Event(), subscribe)
        self._poll = poll
        self._ahead = None if ahead is None else (ahead[0], ReadAhead(ahead[1]))
        self._next: tuple[concurrent.futures.Future[tuple[Iterable[T], int]], bool] | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        # The page first, with no loop set up: a catch-up takes most items here.
        item = next(self._page, _END)  # an item that fails to be made raises here (and stays, see Made)
        if item is not _END:
            return item  # type: ignore[return-value]
        return self._after_page()

    def _after_page(self) -> T:
        schedule = self._schedule
        while True:
            for item in self._page:
                return item
            if self._next is None and schedule.delay and not self._closed:
                self._wakeup.wait(schedule.delay)
            if self._closed:
                raise StopIteration
            try:
                if self._next is not None:
                    (started, signalled), self._next = self._next, None
                    items, rows = started.result()
                else:
                    signalled = self._signalled()
                    items, rows = self._poll(schedule.notified(signalled))
            except Exception as exc:
                if self._ends(exc):
                    raise StopIteration from None
                continue
            self._polled(items, rows, signalled)
            if self._ahead is not None and self._reads_ahead():
                signalled = self._signalled()
                poll_step, reader = self._ahead
                self._next = reader.start(poll_step(schedule.notified(signalled))), signalled

    def close(self) -> None:
        super().close()
        if self._ahead is not None:
            self._ahead[1].close()

    def __enter__(self) -> LiveQuery[T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
