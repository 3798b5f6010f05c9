"""``async with journal.transaction() as tx:``: the asyncio face of :mod:`pgjournal.write.transaction` (same rules)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.model.envelope import EventEnvelope
from pgjournal.runtime.steps import arun
from pgjournal.write.transaction import TransactionRules

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal


class AsyncTransaction(TransactionRules):
    """A unit of work on one connection of the asyncio pool."""

    connection: psycopg.AsyncConnection[Any]

    async def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
                     tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """Like :meth:`AsyncJournal.append`, inside this transaction: visible to others once it commits."""
        plan = self._plan(persistence_id, events, expected_seq_nr, tags, metadata)
        if plan is None:
            return []
        ticket = await self.tag_writer.begin(plan.entity_type) if self._batched(plan) else None
        return await arun(self._append_step(plan, ticket), self.connection)


@contextlib.asynccontextmanager
async def transaction(journal: AsyncJournal, *, savepoints: bool = False) -> AsyncIterator[AsyncTransaction]:
    async with journal.connection() as conn:
        tx = AsyncTransaction(journal, conn, savepoints=savepoints)
        committing = False
        try:
            async with conn.transaction(), user_statements(conn):
                yield tx
                tx.check()
                committing = True
        except BaseException:
            tx.ended(committing=committing)
            raise
        tx.committed(journal._writer.count)


@contextlib.asynccontextmanager
async def user_statements(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """:func:`pgjournal.server.connections.user_statements` for asyncio: the caller's statements in the transaction
    run without pgjournal's statement timeout and client-side limit."""
    if getattr(conn, "limit", None) is None:
        yield
        return
    await conn.execute("SET LOCAL statement_timeout = 0")
    conn.limit = None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del conn.limit  # type: ignore[attr-defined]
