"""The asyncio face of pgjournal: :class:`AsyncJournal` (appends, transactions, reads, snapshots, live
queries as async iterators woken by LISTEN) on psycopg's ``AsyncConnectionPool``. It runs the same steps,
stores, gate and schedule as the blocking :class:`~pgjournal.Journal` (see ARCHITECTURE.md)."""

from pgjournal.aio.durable_state import AsyncDurableStateStore
from pgjournal.aio.journal import AsyncJournal
from pgjournal.aio.live import AsyncLiveQuery
from pgjournal.aio.query import AsyncQuery
from pgjournal.aio.transaction import AsyncTransaction

__all__ = ["AsyncDurableStateStore", "AsyncJournal", "AsyncLiveQuery", "AsyncQuery", "AsyncTransaction"]
