"""What the modules below the journal's core (the tag view, admin's checks) use of a blocking journal: its
settings and stores, and a connection of its pool. Typed here, below them, so that they name no face above
them; :class:`~pgjournal.Journal` is what meets it (and :class:`~pgjournal.core.journal_core.BlockingCore`, the
form the reads and writes above the core see)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import psycopg

    from pgjournal.dialects import Dialect
    from pgjournal.settings import Settings
    from pgjournal.store.events import EventStore
    from pgjournal.store.snapshots import SnapshotSQL


class Configured(Protocol):
    """A journal of either face, without its connections: where it is, its settings and its stores (what
    :class:`~pgjournal.core.journal_core.JournalCore` holds)."""

    @property
    def dsn(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def writer_id(self) -> str: ...
    @property
    def dialect(self) -> Dialect: ...
    @property
    def events(self) -> EventStore: ...
    @property
    def snapshot_sql(self) -> SnapshotSQL: ...


class _Batch(Protocol):
    @property
    def key(self) -> str: ...


class PendingTags(Protocol):
    """The batched tag writer as readers and cleanups see it: what it holds can be written now."""

    @property
    def batch(self) -> _Batch: ...

    def flush(self) -> None: ...


class Connected(Configured, Protocol):
    """A blocking journal of one database: :class:`Configured`, its batched tag writer (``None``: tag rows go in
    the append's own statement) and a connection of its pool."""

    @property
    def tag_writer(self) -> PendingTags | None: ...

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """Borrow an autocommit connection from the pool (a broken one is discarded on return)."""
        ...
