"""The asyncio live loop: the same :class:`~pgjournal.runtime.live.Schedule` and loop state as the blocking
:class:`~pgjournal.runtime.live.LiveQuery`, waiting on an ``asyncio.Event`` (set by LISTEN wake-ups, see
:mod:`pgjournal.aio.signals`) and awaiting each poll (a step run with :func:`pgjournal.runtime.steps.arun_pooled`).

Cancelling the task that iterates (``asyncio.timeout``, ``task.cancel()``) stops it at once, in a wait or in a
poll: the poll's statement is cancelled on the server, its step closed and its connection returned to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

from pgjournal.runtime.live import LoopState, Schedule

T = TypeVar("T")
#: ``await poll(notified) -> (items, rows read)``
AsyncPoll = Callable[[bool], Awaitable[tuple[Iterable[T], int]]]


class AsyncLiveQuery(LoopState[T]):
    """An async iterator that never ends by itself; ``close()`` (or leaving ``async with``) stops it. Use it
    from the event loop it runs on."""

    def __init__(self, poll: AsyncPoll[T], schedule: Schedule,
                 subscribe: Callable[[Any], Callable[[], None]] | None = None, first: Iterable[T] = (),
                 *, ahead: bool = False) -> None:
        """``ahead``: a poll that the schedule runs at once (a catch-up) starts as a task before the last one's
        items are handed out (for a query whose state is the stream's, not the items')."""
        super().__init__(schedule, asyncio.Event(), subscribe, first)
        self._poll = poll
        self._ahead = ahead
        self._next: tuple[asyncio.Future[tuple[Iterable[T], int]], bool] | None = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self._items()

    async def _items(self) -> AsyncIterator[T]:
        # What ``async for`` runs: a catch-up takes most items from a page, and an async generator's step there
        # costs a fraction of a coroutine per ``__anext__`` call. The loop itself is ``__anext__``'s.
        while True:
            for item in self._page:  # an item that fails to be made raises here (and stays)
                yield item
            try:
                item = await self.__anext__()
            except StopAsyncIteration:
                return
            yield item

    async def __anext__(self) -> T:
        schedule = self._schedule
        while True:
            for item in self._page:  # an item that fails to be made raises here (and stays)
                return item
            if self._next is None and schedule.delay and not self._closed:
                with contextlib.suppress(TimeoutError):  # only this wait's own timeout, not the caller's
                    async with asyncio.timeout(schedule.delay):
                        await self._wakeup.wait()
            if self._closed:
                raise StopAsyncIteration
            try:
                if self._next is not None:
                    (started, signalled), self._next = self._next, None
                    items, rows = await started
                else:
                    signalled = self._signalled()
                    items, rows = await self._poll(schedule.notified(signalled))
            except Exception as exc:
                if self._ends(exc):
                    raise StopAsyncIteration from None
                continue
            self._polled(items, rows, signalled)
            if self._ahead and self._reads_ahead():
                signalled = self._signalled()
                self._next = asyncio.ensure_future(self._poll(schedule.notified(signalled))), signalled
                await asyncio.sleep(0)  # the task runs up to its first wait: its statement is sent

    def close(self) -> None:
        super().close()
        if self._next is not None:
            self._next[0].cancel()  # a poll leaves the stream as it was when it does not finish
            self._next = None

    async def aclose(self) -> None:
        """:meth:`close`, then waits until a poll started ahead has ended: cancelled, its statement is cancelled on
        the server and its connection given back (not cut off by a second cancellation when the loop ends)."""
        pending = None if self._next is None else self._next[0]
        self.close()
        if pending is not None:
            await asyncio.gather(pending, return_exceptions=True)

    async def __aenter__(self) -> AsyncLiveQuery[T]:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
