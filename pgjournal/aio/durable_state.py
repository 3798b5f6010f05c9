"""``journal.durable_state`` on :class:`~pgjournal.aio.AsyncJournal`: the blocking store's rules
(:class:`~pgjournal.state.durable_state.DurableStateRules`: the SQL, the write and its retries as steps, decoding, the
by-slice rows) awaited, with the asyncio face's turns per persistence id and its by-slice queries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from pgjournal.aio.live import AsyncLiveQuery
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.runtime.contention import KeyedLocks
from pgjournal.runtime.steps import Step
from pgjournal.state.durable_state import DurableState, DurableStateChange, DurableStateRules
from pgjournal.validation import check_persistence_id

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal


class AsyncDurableStateStore(DurableStateRules):
    """:class:`~pgjournal.DurableStateStore` for asyncio code; use it from the journal's event loop."""

    journal: AsyncJournal

    def __init__(self, journal: AsyncJournal) -> None:
        super().__init__(journal)
        #: Writes of this journal's tasks to one persistence id take turns (pgjournal.runtime.contention).
        self._turns = KeyedLocks(lock=asyncio.Lock)

    async def get(self, persistence_id: str) -> DurableState | None:
        """The current state (``deleted`` set after :meth:`delete`), ``None`` when never written."""
        return await self.journal.run(self.get_step(check_persistence_id(persistence_id)))

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> AsyncIterator[DurableStateChange]:
        """:meth:`DurableStateStore.current_changes_by_slices <pgjournal.DurableStateStore.current_changes_by_slices>`
        as an async iterator."""
        return self.journal.by_slices.current(entity_type, min_slice, max_slice, offset, rows=self.rows())

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> AsyncLiveQuery[DurableStateChange]:
        """Like :meth:`current_changes_by_slices`, but keeps polling (woken by writers' signals); ``close()`` or
        leaving ``async with`` stops it."""
        return self.journal.by_slices.live(entity_type, min_slice, max_slice, offset, rows=self.rows())

    async def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """:meth:`DurableStateStore.upsert <pgjournal.DurableStateStore.upsert>`: revision ``revision`` (the
        current one + 1) or :class:`~pgjournal.errors.RevisionConflict`, nothing written."""
        return await self._run(*self.upsert_write(persistence_id, revision, value, tag))

    async def delete(self, persistence_id: str, revision: int) -> DurableState:
        """:meth:`DurableStateStore.delete <pgjournal.DurableStateStore.delete>`: Akka's deleted state at
        ``revision``."""
        return await self._run(*self.delete_write(persistence_id, revision))

    async def _run(self, pid: str, write: Step[DurableState]) -> DurableState:
        async with self._turns[pid]:
            state = await self.journal.run(write)
        self.written(pid)
        return state
