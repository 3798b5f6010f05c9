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
                 subscribe: Callable[[Any], Callable[[], None]] | None = None, first: Iterable[T] = ()) -> None:
        super().__init__(schedule, asyncio.Event(), subscribe, first)
        self._poll = poll

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        schedule = self._schedule
        while True:
            for item in self._page:  # an item that fails to be made raises here (and stays)
                return item
            if schedule.delay and not self._closed:
                with contextlib.suppress(TimeoutError):  # only this wait's own timeout, not the caller's
                    async with asyncio.timeout(schedule.delay):
                        await self._wakeup.wait()
            if self._closed:
                raise StopAsyncIteration
            signalled = self._signalled()
            try:
                items, rows = await self._poll(schedule.notified(signalled))
            except Exception as exc:
                if self._ends(exc):
                    raise StopAsyncIteration from None
                continue
            self._polled(items, rows, signalled)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncLiveQuery[T]:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()
