"""The asyncio face of pgjournal: :class:`AsyncJournal` (appends, transactions, reads, snapshots, live
queries as async iterators woken by LISTEN) on psycopg's ``AsyncConnectionPool``. It runs the same steps,
stores, gate and schedule as the blocking :class:`~pgjournal.Journal` (see ARCHITECTURE.md)."""

from .durable_state import AsyncDurableStateStore
from .journal import AsyncJournal
from .live import AsyncLiveQuery
from .query import AsyncQuery
from .transaction import AsyncTransaction

__all__ = ["AsyncDurableStateStore", "AsyncJournal", "AsyncLiveQuery", "AsyncQuery", "AsyncTransaction"]
