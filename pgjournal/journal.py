"""The entry point: ``with Journal.open() as journal: journal.append(...); journal.query...``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from pgjournal.admin import migrate as migrations
from pgjournal.admin.stored_format import StoredFormat
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.core.capabilities import Capabilities
from pgjournal.core.journal_core import (
    BlockingCore,
    lost_connection,
    no_connection,
    open_step,
    opening,
    pool_options,
    primary_step,
    registry,
    replica_of,
    replica_step,
)
from pgjournal.model.envelope import EventEnvelope
from pgjournal.query import Query
from pgjournal.query.by_pid import ByPersistenceId
from pgjournal.query.by_slices import BySlices
from pgjournal.runtime.live import LiveQuery, Poll, T
from pgjournal.runtime.signals import Signals
from pgjournal.runtime.steps import R, Step, count_of, run, run_pooled
from pgjournal.server.connections import PoolFront, connect, connection_kwargs, limited_connection_class, unreachable
from pgjournal.settings import Settings
from pgjournal.state.durable_state import DurableStateStore
from pgjournal.state.snapshots import SelectedSnapshot, SnapshotStore
from pgjournal.validation import check_persistence_id, check_seq_nr
from pgjournal.write.event_writer import EventWriter
from pgjournal.write.group_commit import allowed_step
from pgjournal.write.pipelining import AppendPipeline
from pgjournal.write.tag_batcher import TagBatcher
from pgjournal.write.transaction import Transaction, transaction


class Journal(BlockingCore):
    """An event journal on one database. Thread-safe; open one per process and share it."""

    def __init__(self, dsn: str, settings: Settings, serializers: SerializerRegistry,
                 capabilities: Capabilities, stored: StoredFormat | None = None, replica: str | None = None) -> None:
        super().__init__(dsn, settings, serializers, capabilities, stored, replica)
        self.signals: Signals | None = Signals(dsn, connection_kwargs(settings)) if capabilities.notify else None
        self._pool = ConnectionPool(dsn, connection_class=limited_connection_class(settings), name="pgjournal",
                                    **pool_options(settings, dsn))
        #: Every borrowing of a pool connection goes through this front (a list pop in the common case).
        self.connections = PoolFront(self._pool)
        #: By-slice reads on a hot standby (``replica``): its own pool, the same limits.
        self._replica_pool = None if replica is None else ConnectionPool(
            replica, connection_class=limited_connection_class(settings), name="pgjournal-replica",
            **pool_options(settings, replica))
        self.replica_connections = None if self._replica_pool is None else PoolFront(self._replica_pool)
        #: The batched tag writer (``tag_batch_writer`` resolved True, see :mod:`pgjournal.write.tag_batcher`); None:
        #: tag rows are written in the append's own statement.
        self.tag_writer: TagBatcher | None = TagBatcher(self) if settings.batched_tags else None
        #: Appends of threads that would wait for a connection ride together (pgjournal.write.pipelining).
        self._pipeline = AppendPipeline(self, settings.pool_max_size, enabled=settings.pipeline)
        self._writer = EventWriter(self, after_commit=self.signals.written if self.signals else None,
                                   pipeline=self._pipeline, tag_writer=self.tag_writer)
        self.by_pid = ByPersistenceId(self)
        self.by_slices = BySlices(self)
        self.snapshots = SnapshotStore(self)
        self.query = Query(self)
        #: Akka's durable state store: the latest state per persistence id, with revisions and changes.
        self.durable_state = DurableStateStore(self, self.by_slices)

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        serializers: SerializerRegistry | None = None,
        migrate: bool = False,
        replica: str | None = None,
        **settings: Any,
    ) -> Journal:
        """Connect (to the embedded server when no DSN is given or set) and check the schema.

        ``migrate=True`` upgrades the schema first; otherwise an unmigrated database raises
        :class:`~pgjournal.errors.SchemaNotMigrated`. ``replica`` (or ``$PGJOURNAL_REPLICA_DSN``): a hot standby
        of ``dsn`` that by-slice reads (live and current, projections through them) use; everything else stays on
        ``dsn`` (see :mod:`pgjournal.core.replica`).
        """
        resolved, loaded = opening(dsn, serializers, migrate, settings)
        standby = replica_of(replica)
        with connect(resolved, loaded) as conn:
            if migrate:
                migrations.upgrade(resolved, loaded.dialect)
            capabilities, stored, loaded = run(open_step(resolved, loaded), conn)
            if loaded.pipeline and not run(allowed_step(loaded), conn):
                loaded = replace(loaded, pipeline=False)
            primary = run(primary_step(), conn) if standby is not None else None
        if standby is not None:
            with connect(standby, loaded) as conn:
                run(replica_step(standby, primary), conn)
        journal = cls(resolved, loaded, registry(serializers, stored), capabilities, stored, standby)
        journal._pool.open(wait=False)
        if journal._replica_pool is not None:
            journal._replica_pool.open(wait=False)
        return journal

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the journal; the batched tag writer first writes what is pending (else raises
        :class:`~pgjournal.errors.TagFlushFailed`, after closing the rest)."""
        try:
            if self.tag_writer is not None:
                self.tag_writer.close()
        finally:
            self._pipeline.close()
            if self.signals is not None:
                self.signals.close()
            self.connections.close()
            self._pool.close()
            if self._replica_pool is not None and self.replica_connections is not None:
                self.replica_connections.close()
                self._replica_pool.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """Borrow an autocommit connection from the pool (a broken one is discarded on return)."""
        return _borrowed(self.connections, self.dsn, self.settings)

    def read_connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """A connection for by-slice reads: to the replica when the journal has one, else :meth:`connection`."""
        if self.replica_connections is None or self.replica_dsn is None:
            return self.connection()
        return _borrowed(self.replica_connections, self.replica_dsn, self.settings)

    def open_connection(self) -> psycopg.Connection:
        """A connection of its own, made as the pool's are (autocommit, pgjournal's limits), for a background
        writer that runs one heavy statement over and over (:mod:`pgjournal.write.tag_batcher`). The caller closes
        it."""
        options = pool_options(self.settings, self.dsn)
        try:
            return limited_connection_class(self.settings).connect(self.dsn, **options["kwargs"])
        except psycopg.OperationalError as exc:
            raise unreachable(self.dsn, exc) from None

    def run(self, step: Step[R]) -> R:
        """Run a step (:mod:`pgjournal.runtime.steps`) on a connection of the pool."""
        return run_pooled(step, self.connection)

    run_on_primary = run

    def live_query(self, poll: Poll[T], *, entity_types: Iterable[str] | None = None, settle: float = 0.0,
                   ahead: Callable[[bool], Step[tuple[Iterable[T], int]]] | None = None) -> LiveQuery[T]:
        """Wrap ``poll`` in the shared live loop, woken by writers' signals where they are on. ``settle``:
        how long after a signal the new rows may still be hidden from ``poll`` (its margin behind the clock).
        ``ahead``: ``poll`` as a step, for a query whose next poll may run while this one's items are handed out
        (read ahead in a catch-up when the pool has a second connection)."""
        return LiveQuery(poll, self.schedule(settle), self.signals.subscribe(entity_types) if self.signals else None,
                         (ahead, self.connection) if ahead is not None and self.reads_ahead else None)

    def migrate(self) -> None:
        """:meth:`~pgjournal.faces.JournalFace.migrate`."""
        migrations.upgrade(self.dsn, self.settings.dialect)

    # -- writes --------------------------------------------------------------------------------------

    def append(
        self,
        persistence_id: str,
        events: Iterable[Any],
        *,
        expected_seq_nr: int | None = None,
        tags: Iterable[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        """:meth:`~pgjournal.faces.JournalFace.append`."""
        return self._writer.append(
            persistence_id, events, expected_seq_nr=expected_seq_nr, tags=tags, metadata=metadata
        )

    def transaction(self, *, savepoints: bool = False) -> contextlib.AbstractContextManager[Transaction]:
        """``with journal.transaction() as tx:`` appends (``tx.append``) and your own SQL (``tx.connection``)
        that commit or roll back together; see :mod:`pgjournal.write.transaction` for the rules. ``savepoints``: each
        append in a savepoint, so a conflict leaves the transaction usable."""
        return transaction(self, self._writer.count, savepoints=savepoints)

    def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """Mark events up to ``to_seq_nr`` deleted (every read skips them; sequence numbers stay taken)."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(to_seq_nr, "to_seq_nr")
        return self.run(count_of(self.events.mark_deleted(pid, to_seq_nr)))

    def highest_seq_nr(self, persistence_id: str) -> int:
        """:meth:`~pgjournal.faces.JournalFace.highest_seq_nr`."""
        return self.run(self.by_pid.highest_seq_nr_step(check_persistence_id(persistence_id)))

    # -- snapshots -----------------------------------------------------------------------------------

    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> None:
        """:meth:`~pgjournal.faces.JournalFace.save_snapshot`."""
        self.snapshots.save(persistence_id, seq_nr, snapshot, metadata=metadata, tags=tags)

    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """:meth:`~pgjournal.faces.JournalFace.load_snapshot`."""
        return self.snapshots.load(persistence_id, max_seq_nr=max_seq_nr, max_timestamp=max_timestamp)

    def delete_snapshot(self, persistence_id: str) -> None:
        """:meth:`~pgjournal.faces.JournalFace.delete_snapshot`."""
        self.snapshots.delete(persistence_id)


@contextlib.contextmanager
def _borrowed(front: PoolFront, dsn: str, settings: Settings) -> Iterator[psycopg.Connection]:
    """A connection of ``front`` (the pool of ``dsn``) for a ``with`` block; a lost one is a typed error."""
    try:
        conn = front.get()
    except PoolTimeout:
        raise no_connection(dsn, settings) from None
    try:
        yield conn
    except psycopg.OperationalError as exc:
        lost = lost_connection(dsn, conn, exc)
        if lost is None:
            raise  # the server answered (a serialization failure, a cancelled statement, ...)
        raise lost from exc
    finally:
        front.put(conn)
