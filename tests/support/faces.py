"""One synchronous handle on either face of the journal, so one test body exercises both.

``Face`` (the ``face`` fixture of conftest.py) is, for ``kind == "blocking"``, the :class:`~pgjournal.Journal`
itself behind a thin attribute pass-through. For ``kind == "asyncio"`` it holds an
:class:`~pgjournal.aio.AsyncJournal` opened on a private event loop that runs in a thread of its own, and no
blocking journal at all: every attribute is looked up on the asyncio face's objects, and every call runs on that
loop (the loop the journal was opened on, and closed on), its awaitable awaited there. What an asyncio object
hands back is made synchronous the same way:

- an awaitable is awaited (``upsert``, ``get``, ``append``, ...);
- an async iterator (``current_changes_by_slices``, a live query) iterates with ``for``, each ``__anext__``
  awaited on the loop; an async context manager (a live query, ``transaction()``, a connection) works with
  ``with``; a method of an object of :mod:`pgjournal.aio` (``durable_state``, ``query``, a transaction) is
  wrapped again;
- anything else (a setting, a row, a :class:`~pgjournal.DurableState`, an error) is returned as it is.

:meth:`Face.entities` gives the face's entity repository (``EntityRepository`` or ``AsyncEntityRepository``),
seen the same way.

So a test that passes on ``face`` in its asyncio variant passed through the asyncio face's code: there is no
fallback to the blocking one. Several threads may call at once (each call waits for its own result), as they
call a blocking journal: their calls run as concurrent tasks on the one loop. Plain (non-method) attributes
the asyncio face lacks raise ``AttributeError``, as they would in an asyncio program.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.entity import AsyncEntityRepository, Entity, EntityRepository

Kind = Literal["blocking", "asyncio"]
KINDS: tuple[Kind, ...] = ("blocking", "asyncio")
T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread; :meth:`run` runs a coroutine on it from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="face-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a Face call from the face's own loop would wait for itself")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        async def cancel_the_rest() -> None:  # a reader thread still waiting on a task gets CancelledError
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


_END = object()


class _Sync:
    """An object of the asyncio face seen synchronously, every use of it run on ``runner``'s loop."""

    __slots__ = ("_runner", "_target")

    def __init__(self, target: Any, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if callable(value):
            return lambda *args, **kwargs: self._call(value, *args, **kwargs)
        return _synchronous(value, self._runner)

    def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def on_the_loop() -> Any:
            result = function(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return _synchronous(self._runner.run(on_the_loop()), self._runner)

    def __enter__(self) -> Any:
        return _synchronous(self._runner.run(self._target.__aenter__()), self._runner)

    def __exit__(self, *exc: Any) -> Any:
        return self._runner.run(self._target.__aexit__(*exc))

    def __iter__(self) -> Any:
        if hasattr(self._target, "__anext__"):
            return self

        async def start() -> Any:
            return self._target.__aiter__()

        return _Sync(self._runner.run(start()), self._runner)

    def __next__(self) -> Any:
        async def step() -> Any:
            try:
                return await anext(self._target)
            except StopAsyncIteration:  # a future cannot carry it across threads as an ending
                return _END

        item = self._runner.run(step())
        if item is _END:
            raise StopIteration
        return _synchronous(item, self._runner)

    def __repr__(self) -> str:
        return f"<synchronous {self._target!r}>"


def _synchronous(value: Any, runner: _LoopThread) -> Any:
    """``value`` wrapped in :class:`_Sync` when using it takes the loop (see the module's docstring)."""
    asynchronous = (hasattr(value, "__anext__") or hasattr(value, "__aenter__") or hasattr(value, "__aiter__")
                    or type(value).__module__.startswith("pgjournal.aio"))
    return _Sync(value, runner) if asynchronous and not isinstance(value, type) else value


class Face:
    """A journal of either face behind one synchronous interface (see the module's docstring). ``kind`` says
    which; ``journal`` is the face's own object (a ``Journal`` or an ``AsyncJournal``), for what only it has."""

    def __init__(self, kind: Kind, journal: Journal | AsyncJournal, runner: _LoopThread | None) -> None:
        self.kind = kind
        self.journal = journal
        self._runner = runner
        self._view: Any = journal if runner is None else _Sync(journal, runner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def entities(self, entity: type[Entity[Any]], **options: Any) -> Any:
        """The face's repository of ``entity``: an ``EntityRepository`` of the blocking journal, or an
        ``AsyncEntityRepository`` of the asyncio one, made on its loop and seen synchronously like the journal."""
        if self._runner is None:
            return EntityRepository(self.journal, entity, **options)  # type: ignore[arg-type]

        async def making() -> AsyncEntityRepository[Any]:
            return AsyncEntityRepository(self.journal, entity, **options)  # type: ignore[arg-type]

        return _Sync(self._runner.run(making()), self._runner)

    def __repr__(self) -> str:
        return f"Face({self.kind!r}, {self.journal!r})"


@contextlib.contextmanager
def open_face(kind: Kind, dsn: str, **options: Any) -> Iterator[Face]:
    """``Journal.open(dsn, **options)`` or ``AsyncJournal.open(dsn, **options)`` on a private loop, as a
    :class:`Face`; closed (and the loop stopped) when the block ends."""
    if kind == "blocking":
        with Journal.open(dsn, **options) as journal:
            yield Face(kind, journal, None)
        return
    runner = _LoopThread()
    try:
        async def opening() -> AsyncJournal:
            return await AsyncJournal.open(dsn, **options)

        journal = runner.run(opening())
        try:
            yield Face(kind, journal, runner)
        finally:
            runner.run(journal.close())
    finally:
        runner.stop()
