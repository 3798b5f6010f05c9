"""The entry point: ``with Journal.open() as journal: journal.append(...); journal.query...``."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from . import migrate as migrations
from .buckets import check_bucket_size
from .by_pid import ByPersistenceId
from .by_slices import BySlices
from .capabilities import Capabilities
from .connections import PoolFront, ServerSilent, connection_kwargs, limited_connection_class
from .dialects import Dialect, get_dialect
from .dsn import mask_dsn, resolve_dsn
from .durable_state import DurableStateStore
from .envelope import EventEnvelope
from .errors import ConfigurationError, ConnectionTimedOut, DatabaseUnavailable, InsufficientPrivilege
from .horizon import HorizonTracker
from .notify import Signals
from .polling import LiveQuery, Poll, T
from .query import Query
from .serialization import SerializerRegistry
from .settings import Settings
from .snapshots import SelectedSnapshot, SnapshotStore
from .stored_format import StoredFormat, read_stored_format
from .tag_batcher import TagBatcher
from .validation import check_persistence_id, check_seq_nr
from .write import EventWriter


def connect(dsn: str, settings: Settings) -> psycopg.Connection:
    """One autocommit connection, with an unreachable server reported as :class:`DatabaseUnavailable`."""
    try:
        return psycopg.connect(dsn, autocommit=True, **connection_kwargs(settings))
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or exc.__class__.__name__
        raise DatabaseUnavailable(f"cannot connect to {mask_dsn(dsn)}: {mask_dsn(reason)}") from None


class Journal:
    """An event journal on one database. Thread-safe; open one per process and share it."""

    def __init__(self, dsn: str, settings: Settings, serializers: SerializerRegistry,
                 capabilities: Capabilities, stored: StoredFormat | None = None) -> None:
        self.dsn = dsn
        self.settings = settings
        self.serializers = serializers
        #: How this database's tables were laid out and payloads written (read at open).
        self.stored = stored or StoredFormat()
        self.dialect: Dialect = get_dialect(settings.dialect)
        if self.stored.akka_layout:
            self.dialect.use_akka_layout(self.stored.data_partitions)
        #: The SQL over event_journal (store layer); nothing above it names the table.
        self.events = self.dialect.event_store(frozenset(
            column for column in ("event_payload", "meta_payload") if self.stored.jsonb(column)))
        self.writer_id = settings.writer_id or uuid.uuid4().hex
        #: What this journal may use on this server as this role; every reader takes its horizon from it.
        self.capabilities = capabilities
        self.signals = Signals(dsn, connection_kwargs(settings)) if capabilities.notify else None
        self._pool = ConnectionPool(
            dsn,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            kwargs={"autocommit": True, **connection_kwargs(settings, statement_timeout=True)},
            connection_class=limited_connection_class(settings),
            timeout=settings.connect_timeout,
            name="pgjournal",
            open=False,
        )
        #: Every borrowing of a pool connection goes through this front (a list pop in the common case).
        self.connections = PoolFront(self._pool)
        #: The batched tag writer (``tag_batch_writer=True``, see :mod:`pgjournal.tag_batcher`); None: tag rows
        #: are written in the append's own statement.
        self.tag_writer = TagBatcher(self) if settings.tag_batch_writer else None
        self._writer = EventWriter(self, after_commit=self.signals.written if self.signals else None)
        self.by_pid = ByPersistenceId(self)
        self.by_slices = BySlices(self)
        self.snapshots = SnapshotStore(self)
        self.query = Query(self)
        #: Akka's durable state store: the latest state per persistence id, with revisions and changes.
        self.durable_state = DurableStateStore(self)

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        serializers: SerializerRegistry | None = None,
        migrate: bool = False,
        **settings: Any,
    ) -> Journal:
        """Connect (to the embedded server when no DSN is given or set) and check the schema.

        ``migrate=True`` upgrades the schema first; otherwise an unmigrated database raises
        :class:`~pgjournal.errors.SchemaNotMigrated`.
        """
        loaded = Settings.load(**settings)
        if serializers is not None and not isinstance(serializers, SerializerRegistry):
            raise ConfigurationError(f"serializers must be a SerializerRegistry, got {type(serializers).__name__}")
        if not isinstance(migrate, bool):
            raise ConfigurationError(f"migrate must be True or False, got {migrate!r}")
        resolved = resolve_dsn(dsn)
        with connect(resolved, loaded) as conn:
            if migrate:
                migrations.upgrade(resolved, loaded.dialect)
            try:
                migrations.check_schema(conn)
                check_bucket_size(conn, loaded.tag_bucket_size)
                capabilities = Capabilities.resolve(conn, loaded)
                stored = read_stored_format(conn)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise InsufficientPrivilege(
                    f"the role of {mask_dsn(resolved)} may not read pgjournal's tables ({str(exc).splitlines()[0]}); "
                    "connect as one of the roles `pgjournal roles` sets up, or grant SELECT on them") from None
        journal = cls(resolved, loaded, (serializers or SerializerRegistry()).for_stored_format(stored), capabilities,
                      stored)
        journal._pool.open(wait=False)
        return journal

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the journal; the batched tag writer first writes what is pending (else raises
        :class:`~pgjournal.errors.TagFlushFailed`, after closing the rest)."""
        try:
            if self.tag_writer is not None:
                self.tag_writer.close()
        finally:
            if self.signals is not None:
                self.signals.close()
            self.connections.close()
            self._pool.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({mask_dsn(self.dsn)!r}, dialect={self.settings.dialect!r})"

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Borrow an autocommit connection from the pool (a broken one is discarded on return)."""
        try:
            conn = self.connections.get()
        except PoolTimeout:
            raise DatabaseUnavailable(
                f"no connection to {mask_dsn(self.dsn)} within {self.settings.connect_timeout}s"
            ) from None
        try:
            yield conn
        except psycopg.OperationalError as exc:
            if not (conn.closed or conn.broken or exc.sqlstate is None):
                raise  # the server answered (a serialization failure, a cancelled statement, ...)
            reason = " ".join(str(exc).split()) or exc.__class__.__name__
            kind = ConnectionTimedOut if isinstance(exc, ServerSilent) else DatabaseUnavailable
            raise kind(f"lost the connection to {mask_dsn(self.dsn)}: {mask_dsn(reason)}") from exc
        finally:
            self.connections.put(conn)

    def live_query(self, poll: Poll[T], *, entity_types: Iterable[str] | None = None, settle: float = 0.0
                   ) -> LiveQuery[T]:
        """Wrap ``poll`` in the shared live loop, woken by writers' signals where they are on. ``settle``:
        how long after a signal the new rows may still be hidden from ``poll`` (its margin behind the clock)."""
        return LiveQuery(
            poll,
            buffer_size=self.settings.buffer_size,
            refresh_interval=self.settings.refresh_interval,
            subscribe=self.signals.subscribe(entity_types) if self.signals else None,
            settle=settle,
            max_failures=self.settings.live_query_retries,
        )

    @property
    def read_margin(self) -> float:
        """Seconds by-slice queries stay behind the clock: ``horizon_margin`` below the visibility horizon
        where it is used, else ``behind_current_time``. An event committed less than this ago is not read yet."""
        return self.capabilities.read_margin

    def horizon_tracker(self, relations: tuple[int, ...] | None = None) -> HorizonTracker:
        """A new reader's view of the visibility horizon (see :mod:`pgjournal.horizon`); ``relations``: the
        tables whose writers bound it (default: the journal's)."""
        return HorizonTracker(self.capabilities, relations)

    def migrate(self) -> None:
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
        """Append ``events`` atomically after ``expected_seq_nr`` (the highest sequence number the caller
        has seen, 0 for a new persistence id; ``None``: after whatever is there).

        Raises :class:`~pgjournal.errors.ConcurrencyConflict` when another writer got there first; then
        nothing of the batch is written.
        """
        return self._writer.append(
            persistence_id, events, expected_seq_nr=expected_seq_nr, tags=tags, metadata=metadata
        )

    def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """Mark events up to ``to_seq_nr`` deleted (every read skips them; sequence numbers stay taken)."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(to_seq_nr, "to_seq_nr")
        with self.connection() as conn:
            return conn.execute(*self.events.mark_deleted(pid, to_seq_nr)).rowcount

    def highest_seq_nr(self, persistence_id: str) -> int:
        return self.by_pid.highest_seq_nr(persistence_id)

    # -- snapshots -----------------------------------------------------------------------------------

    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> None:
        self.snapshots.save(persistence_id, seq_nr, snapshot, metadata=metadata, tags=tags)

    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        return self.snapshots.load(persistence_id, max_seq_nr=max_seq_nr, max_timestamp=max_timestamp)

    def delete_snapshot(self, persistence_id: str) -> None:
        self.snapshots.delete(persistence_id)
