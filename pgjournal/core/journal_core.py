"""What the blocking :class:`~pgjournal.Journal` and the asyncio :class:`~pgjournal.aio.AsyncJournal` share:
the resolved settings, dialect, stores, serializers and :class:`~pgjournal.core.capabilities.Capabilities` of one
database (:class:`JournalCore`), and the rules of opening one (:func:`opening`, :func:`open_step`) and of
reporting a lost connection (:func:`lost_connection`). No I/O here: each face runs the steps on its own
connections."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol

import psycopg
import psycopg.errors

from pgjournal.admin import migrate as migrations
from pgjournal.admin.stored_format import StoredFormat, read_stored_format_step
from pgjournal.buckets import check_bucket_size_step
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.core.capabilities import Capabilities
from pgjournal.core.horizon import HorizonTracker
from pgjournal.core.replica import ReplicaHorizon
from pgjournal.dialects import Dialect, get_dialect
from pgjournal.errors import (
    ConfigurationError,
    ConnectionTimedOut,
    DatabaseUnavailable,
    InsufficientPrivilege,
    JournalError,
)
from pgjournal.runtime.live import LiveQuery, Poll, Schedule, T
from pgjournal.runtime.steps import R, Step, first_of
from pgjournal.server.connections import PoolFront, ServerSilent, connection_kwargs, quiet_pool_warnings
from pgjournal.server.dsn import check_dsn, mask_dsn, redact, resolve_dsn
from pgjournal.server.face import PendingTags
from pgjournal.settings import Settings
from pgjournal.store import catalog
from pgjournal.store.snapshots import SnapshotSQL
from pgjournal.tags.writer_mode import resolve_mode_step

#: The environment variable naming a hot standby for by-slice reads (``replica=`` of ``open``).
REPLICA_ENV = "PGJOURNAL_REPLICA_DSN"


class WriteSignals(Protocol):
    """What a face's signals (``notify.Signals``, ``aio.signals.AsyncSignals``) offer code shared by both: a
    write committed, so the live queries of its entity type may poll at once."""

    def written(self, _slice: int, entity_type: str) -> None: ...


class JournalCore:
    """One database as both faces see it: settings, serializers, the dialect and its stores, the writer id and
    the capabilities resolved at open. Every query's logic (steps, the gate, the live loop's schedule) reads
    these and nothing else of the face that runs it."""

    #: The face's signals after commit (``None`` where notifications are off); set by each face.
    signals: WriteSignals | None

    def __init__(self, dsn: str, settings: Settings, serializers: SerializerRegistry,
                 capabilities: Capabilities, stored: StoredFormat | None = None, replica: str | None = None) -> None:
        self.dsn = dsn
        #: A hot standby of ``dsn`` that by-slice reads use (pgjournal.core.replica); ``None``: they use ``dsn``.
        self.replica_dsn = replica
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
        #: The SQL over ``snapshot`` (store layer).
        self.snapshot_sql = SnapshotSQL(self.dialect, self.events, jsonb=self.stored.jsonb("snapshot", "snapshot"),
                                        meta_jsonb=self.stored.jsonb("meta_payload", "snapshot"))
        self.writer_id = settings.writer_id or uuid.uuid4().hex
        #: What this journal may use on this server as this role; every reader takes its horizon from it.
        self.capabilities = capabilities

    @property
    def read_margin(self) -> float:
        """Seconds by-slice queries stay behind the clock: ``horizon_margin`` below the visibility horizon
        where it is used, else ``behind_current_time``. An event committed less than this ago is not read yet."""
        return self.capabilities.read_margin

    def horizon_tracker(self, relations: tuple[int, ...] | None = None) -> HorizonTracker:
        """A new reader's view of the visibility horizon (see :mod:`pgjournal.core.horizon`); ``relations``: the
        tables whose writers bound it (default: the journal's)."""
        return HorizonTracker(self.capabilities, relations)

    def reader_horizon(self, relations: tuple[int, ...] | None = None) -> HorizonTracker | ReplicaHorizon:
        """The horizon of a by-slice reader: :meth:`horizon_tracker`, or with a replica the primary's, fenced by
        the standby's replay (see :mod:`pgjournal.core.replica`); its statements run where the reader reads."""
        tracker = self.horizon_tracker(relations)
        if self.replica_dsn is None:
            return tracker
        return ReplicaHorizon(tracker, self.run_on_primary, replay_wait=self.settings.replica_replay_wait,
                              replica=self.replica_dsn)

    def check_live_by_slices(self) -> None:
        """Refuse a live by-slice read on a hot standby opened as if it were the journal (no ``replica=``): the
        standby's ``pg_locks`` show none of the primary's writers, so its horizon is the clock and a commit later
        than the backtracking window is never delivered. Setting ``standby_live_reads`` reads there anyway."""
        if self.capabilities.in_recovery and self.replica_dsn is None and not self.settings.standby_live_reads:
            raise ConfigurationError(
                f"{mask_dsn(self.dsn)} is a hot standby (in recovery): a live by-slice read there could miss "
                "commits later than the backtracking window, since the standby shows none of the primary's "
                "writers. Open the journal on the primary with replica= naming the standby "
                f"(Journal.open(primary_dsn, replica=standby_dsn), or {REPLICA_ENV}), or set standby_live_reads="
                "True to read here anyway")

    def run_on_primary(self, step: Step[Any]) -> Any:
        """Run ``step`` on a connection to ``dsn`` (the face's ``run``: its result, or an awaitable of it)."""
        raise NotImplementedError

    def schedule(self, settle: float = 0.0) -> Schedule:
        """The decisions of a new live query's loop (:mod:`pgjournal.runtime.live`); ``settle``: how long after a
        signal the new rows may still be hidden from its polls (their margin behind the clock)."""
        return Schedule(buffer_size=self.settings.buffer_size, refresh_interval=self.settings.refresh_interval,
                        settle=settle, max_failures=self.settings.live_query_retries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({mask_dsn(self.dsn)!r}, dialect={self.settings.dialect!r})"


class BlockingCore(JournalCore):
    """:class:`JournalCore` with what the blocking face adds that the shared modules below it use: its pool's
    connections, a connection of its own, running a step, and its live loop. :class:`~pgjournal.Journal` is the
    one implementation; the reads, writes and stores below it are typed against this, never against it."""

    #: The batched tag writer (``None``: tag rows are written in the append's own statement); set by the face.
    tag_writer: PendingTags | None
    #: Every borrowing of a pool connection goes through this front; set by the face.
    connections: PoolFront

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """Borrow an autocommit connection from the pool (a broken one is discarded on return)."""
        raise NotImplementedError

    def read_connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """A connection for by-slice reads: to the replica when the journal has one, else :meth:`connection`."""
        raise NotImplementedError

    def open_connection(self) -> psycopg.Connection:
        """A connection of its own, made as the pool's are; the caller closes it."""
        raise NotImplementedError

    def run(self, step: Step[R]) -> R:
        """Run a step (:mod:`pgjournal.runtime.steps`) on a connection of the pool."""
        raise NotImplementedError

    @property
    def reads_ahead(self) -> bool:
        """Whether a query may read its next page on a second connection while the reader takes this one
        (:class:`~pgjournal.runtime.steps.ReadAhead`): not with a pool of one, where a reader holding that
        connection in its loop would wait for itself."""
        return self.settings.pool_max_size > 1

    def live_query(self, poll: Poll[T], *, entity_types: Iterable[str] | None = None, settle: float = 0.0,
                   ahead: Callable[[bool], Step[tuple[Iterable[T], int]]] | None = None) -> LiveQuery[T]:
        """Wrap ``poll`` in the shared live loop, woken by writers' signals where they are on."""
        raise NotImplementedError


#: How long a pool keeps trying to replace a lost connection before it gives up (the next borrower starts a new
#: attempt, at once). psycopg_pool doubles the pause between attempts without a bound until this timeout (300 s by
#: default): after a 30 s outage its next attempt could be 30 s away, and a replicator whose peer was cut off
#: waited 11-14 s after the link healed (python -m bench replication-lag).
RECONNECT_TIMEOUT = 5.0


def pool_options(settings: Settings, dsn: str) -> dict[str, Any]:
    """What both faces' connection pools of ``dsn`` are made with (autocommit, pgjournal's limits, sizes,
    timeouts); their repeated warnings while a server is unreachable are thinned out (``PoolWarnings``)."""
    quiet_pool_warnings()
    return {"min_size": settings.pool_min_size, "max_size": settings.pool_max_size,
            "kwargs": {"autocommit": True, **connection_kwargs(settings, statement_timeout=True, dsn=dsn)},
            "timeout": settings.connect_timeout, "reconnect_timeout": RECONNECT_TIMEOUT, "open": False}


def opening(dsn: str | None, serializers: SerializerRegistry | None, migrate: bool, settings: dict[str, Any]
            ) -> tuple[str, Settings]:
    """The checked arguments of ``open``: the DSN to use and the settings."""
    loaded = Settings.load(**settings)
    if serializers is not None and not isinstance(serializers, SerializerRegistry):
        raise ConfigurationError(f"serializers must be a SerializerRegistry, got {type(serializers).__name__}")
    if not isinstance(migrate, bool):
        raise ConfigurationError(f"migrate must be True or False, got {migrate!r}")
    return resolve_dsn(dsn), loaded


def replica_of(replica: str | None) -> str | None:
    """The standby DSN given, else ``$PGJOURNAL_REPLICA_DSN``, else ``None`` (reads on the primary)."""
    chosen = replica if replica is not None else os.environ.get(REPLICA_ENV) or None
    return check_dsn(chosen) if chosen is not None else None


def primary_step() -> Step[catalog.ClusterDatabase | None]:
    """What :func:`replica_step` compares the replica with, read on the primary."""
    found: catalog.ClusterDatabase | None = yield from first_of(catalog.cluster_database())
    return found


def replica_step(replica: str, primary: catalog.ClusterDatabase | None) -> Step[None]:
    """What opening a journal checks of its replica: a standby (in recovery) of the primary's cluster (its system
    identifier), reaching the same database, with the schema at head."""
    found = yield from first_of(catalog.replayed())
    if found is None or found.position is None or not found.recovering:
        raise ConfigurationError(
            f"replica {mask_dsn(replica)} is not a standby (pg_is_in_recovery() is false): readers there could not "
            "tell which of the primary's commits it shows; give the DSN of a hot standby of the primary")
    there = yield from first_of(catalog.cluster_database())
    if there is None or primary is None or there.system_identifier != primary.system_identifier:
        raise ConfigurationError(
            f"replica {mask_dsn(replica)} is a standby of another cluster (system identifier "
            f"{there.system_identifier if there else '?'}, the primary's "
            f"{primary.system_identifier if primary else '?'}): its rows are not the primary's; give the DSN of a "
            "hot standby of the primary")
    if there.database != primary.database:
        raise ConfigurationError(
            f"replica {mask_dsn(replica)} reaches database {there.database!r}, the primary's is "
            f"{primary.database!r}: give the standby's DSN of the same database")
    yield from migrations.check_schema_step()


def open_step(dsn: str, settings: Settings) -> Step[tuple[Capabilities, StoredFormat, Settings]]:
    """What opening a journal reads (after any migration): the schema is at head, the tag bucket size and tag
    writer agree, the capabilities and the stored format; ``settings`` with the tag writer resolved
    (:func:`pgjournal.tags.writer_mode.resolve_mode_step`)."""
    try:
        yield from migrations.check_schema_step()
        yield from check_bucket_size_step(settings.tag_bucket_size)
        batched = yield from resolve_mode_step(settings.tag_batch_writer)
        if batched is not settings.tag_batch_writer:
            settings = replace(settings, tag_batch_writer=batched)
        capabilities = yield from Capabilities.resolve_step(settings)
        stored = yield from read_stored_format_step()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise InsufficientPrivilege(
            f"the role of {mask_dsn(dsn)} may not read pgjournal's tables ({str(exc).splitlines()[0]}); "
            "connect as one of the roles `pgjournal roles` sets up, or grant SELECT on them") from None
    return capabilities, stored, settings


def registry(serializers: SerializerRegistry | None, stored: StoredFormat) -> SerializerRegistry:
    """The serializers a journal opened on a database with ``stored`` reads and writes with."""
    return (serializers or SerializerRegistry()).for_stored_format(stored)


def no_connection(dsn: str, settings: Settings) -> DatabaseUnavailable:
    """A pool that handed out no connection in time."""
    return DatabaseUnavailable(f"no connection to {mask_dsn(dsn)} within {settings.connect_timeout}s")


def lost_connection(dsn: str, conn: Any, exc: psycopg.OperationalError) -> JournalError | None:
    """The typed error of a pool connection lost under ``exc``; ``None`` when the server answered (a
    serialization failure, a cancelled statement, ...) and ``exc`` stands as it is."""
    if not (conn.closed or conn.broken or exc.sqlstate is None):
        return None
    reason = " ".join(str(exc).split()) or exc.__class__.__name__
    kind = ConnectionTimedOut if isinstance(exc, ServerSilent) else DatabaseUnavailable
    return kind(f"lost the connection to {mask_dsn(dsn)}: {redact(reason, dsn)}")
