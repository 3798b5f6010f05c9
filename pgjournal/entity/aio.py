"""``AsyncEntityRepository(async_journal, Cart)``: the repository of :mod:`pgjournal.entity.repository` for
asyncio code. The same rules run (:class:`~pgjournal.entity.repository.RepositoryRules`: deciding a batch,
conflicts, unknown outcomes, snapshots, the cache and the breaker) with the journal's operations awaited, and
commands to one entity take turns through an asyncio mailbox (the same batching and leadership rules as the
threads' mailbox). Command handlers stay plain functions: they decide, they do no I/O.

Cancelling a caller that waits for its turn withdraws its command if it was not taken yet. Cancelling the
caller whose task is deciding a batch stops it (its append is all or nothing, as any cancelled append); the
other callers of that batch get :class:`~pgjournal.errors.WriteOutcomeUnknown` (check with ``load``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pgjournal.entity.mailbox import Mailboxes, Pending
from pgjournal.entity.model import CommandResult, Recovered
from pgjournal.entity.repository import RepositoryRules
from pgjournal.errors import WriteOutcomeUnknown

if TYPE_CHECKING:
    from pgjournal.aio import AsyncJournal

S = TypeVar("S")
_mailboxes: weakref.WeakKeyDictionary[Any, AsyncMailboxes] = weakref.WeakKeyDictionary()


class AsyncMailboxes(Mailboxes):
    """:class:`Mailboxes` for tasks of one event loop (no lock: the loop runs one task at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self._mutex = contextlib.nullcontext()

    async def asubmit(self, key: str, item: Pending, run: Callable[[str, list[Pending]], Awaitable[None]],
                      max_batch: int) -> None:
        box, lead = self._enqueue(key, item)
        try:
            while not lead:
                await cast(asyncio.Event, item.wake).wait()  # made by handle() below
                item.wake.clear()
                if item.completed:
                    return
                lead = True
        except asyncio.CancelledError:
            if item in box:  # not taken yet: withdraw it, and pass on a leadership handed to it
                first = box[0] is item
                box.remove(item)
                if first and item.wake.is_set():
                    self._hand_over(key, box, [])
            raise
        batch = self._take(box, max_batch)
        try:
            await run(key, batch)
        except BaseException as exc:
            self._fail(batch, exc)
        finally:
            self._hand_over(key, box, batch)


class AsyncEntityRepository(RepositoryRules[S]):
    """Commands in, events persisted, replies out, for one entity type, on an
    :class:`~pgjournal.aio.AsyncJournal`. Share one per event loop. Settings: see
    :class:`~pgjournal.entity.repository.RepositoryRules`."""

    journal: AsyncJournal

    def __init__(self, journal: AsyncJournal, *args: Any, **kwargs: Any) -> None:
        super().__init__(journal, *args, **kwargs)
        found = _mailboxes.get(journal)
        if found is None:
            found = _mailboxes[journal] = AsyncMailboxes()
        self._amailboxes = found

    async def handle(self, entity_id: str, command: Any) -> CommandResult[S]:
        """:meth:`EntityRepository.handle <pgjournal.entity.EntityRepository.handle>`, awaited."""
        item = Pending(self, entity_id, command, wake=asyncio.Event())  # type: ignore[arg-type]
        await self._amailboxes.asubmit(self.persistence_id(entity_id), item, self._batch, self.max_batch)
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[no-any-return]

    async def load(self, entity_id: str) -> Recovered[S]:
        """The entity's state as stored now (snapshot + replay, bypassing the cache)."""
        pid = self.persistence_id(entity_id)
        with self.breaker.guard():
            return self._recovered(pid, await self.journal.run(self._recover_step(pid)))

    async def _batch(self, pid: str, batch: list[Pending]) -> None:
        try:
            with self.breaker.guard():
                await self.journal.run(self._batch_step(pid, batch))
        except asyncio.CancelledError:
            self._cache.drop(pid)
            unknown = WriteOutcomeUnknown(
                f"the task deciding this command's batch for {pid!r} was cancelled; its events may or may not be "
                "written: check with load() before sending the command again")
            for item in batch:
                item.fail(unknown)
            raise
        except BaseException as exc:
            self._batch_failed(pid, batch, exc)
        self._batch_done(batch)


__all__ = ["AsyncEntityRepository", "AsyncMailboxes"]
