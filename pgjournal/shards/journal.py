"""``ShardedJournal``: one :class:`~pgjournal.journal.Journal` per database of a slice-range layout, each
operation routed by the slice of its persistence id or range (docs/sharding.md, section 4)."""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pgjournal.core.journal_core import REPLICA_ENV
from pgjournal.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    SchemaNotMigrated,
    ShardLayoutMismatch,
)
from pgjournal.journal import Journal
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.server.dsn import mask_dsn
from pgjournal.settings import Settings
from pgjournal.shards.layout import REPLICA, Layout, Record, ShardSettings, format_range
from pgjournal.shards.migrate import migrate_all
from pgjournal.shards.record import read_record_step
from pgjournal.shards.routing import (
    REREAD_INTERVAL,
    Follow,
    Known,
    Moved,
    P,
    Routed,
    Routing,
    StreamFollow,
    after_conflict,
    found_nothing,
    known_databases,
    once,
    opening_routing,
)

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.query.by_slices import SliceRows
    from pgjournal.query.from_snapshots import SnapshotsThenLive
    from pgjournal.runtime.live import LiveQuery
    from pgjournal.state.durable_state import DurableState, DurableStateChange
    from pgjournal.state.snapshots import SelectedSnapshot

Shards = ShardSettings | Mapping[str, str] | Sequence[str]
T = TypeVar("T")


def shard_settings(shards: Shards | None, settings: Mapping[str, Any] | None = None) -> ShardSettings:
    """``shards`` as :class:`ShardSettings`; ``None``: from ``PGJOURNAL_SHARDS``. ``settings`` (the journals'):
    a single replica (``replica=``, ``PGJOURNAL_REPLICA_DSN``) is refused, since it would be every database's."""
    if settings is not None and ("replica" in settings or os.environ.get(REPLICA_ENV)):
        raise ConfigurationError(f"a sharded journal takes a hot standby per database, not one for all (replica= or "
                                 f"{REPLICA_ENV}): give each as {REPLICA}RANGE=DSN in the shard settings")
    if shards is None:
        return ShardSettings.from_env()
    return shards if isinstance(shards, ShardSettings) else ShardSettings.of(shards)


class ShardedJournal(Routed[Journal]):
    """An event journal over the databases of a slice-range layout. Thread-safe, as each database's journal is;
    open one per process and share it."""

    def __init__(self, known: Sequence[Known[Journal]], routing: Routing[Journal]) -> None:
        super().__init__(known, routing, known[0].journal.settings.layout_wait)
        self.query = ShardedQuery(self)
        self.durable_state = ShardedDurableState(self)

    @classmethod
    def open(cls, shards: Shards | None = None, *, serializers: SerializerRegistry | None = None,
             migrate: bool = False, **settings: Any) -> ShardedJournal:
        """Open a journal on every database and check they record the settings' layout.

        ``shards``: :class:`ShardSettings`, ``{"0-511": dsn, ...}`` or a list of DSNs (``None``:
        ``PGJOURNAL_SHARDS``); ``settings`` apply to every database's journal. ``migrate=True`` runs
        :func:`~pgjournal.shards.migrate.migrate_all` first. Raises :class:`DatabaseUnavailable` naming the
        range of a database that does not answer, :class:`SchemaNotMigrated` for a database without schema or
        layout record, :class:`ShardLayoutMismatch` when the records and the settings disagree (settings a move
        left behind open when their spares reach every database of the recorded layout: it is routed).
        """
        chosen = shard_settings(shards, settings)
        if migrate:
            migrate_all(chosen, Settings.load(**settings))
        journals: list[Journal] = []
        try:
            for index, dsn in enumerate(chosen.dsns):
                try:
                    journals.append(Journal.open(dsn, serializers=serializers, replica=chosen.replica_of(dsn),
                                                 **settings))
                except (DatabaseUnavailable, SchemaNotMigrated) as exc:
                    raise type(exc)(f"the database of slices {format_range(chosen.ranges[index])}: {exc}") from None
            for dsn in chosen.spares:  # opened now, so that following a move to one opens no pool in the pause
                try:
                    journals.append(Journal.open(dsn, serializers=serializers, replica=chosen.replica_of(dsn),
                                                 **settings))
                except (DatabaseUnavailable, SchemaNotMigrated) as exc:
                    raise type(exc)(f"the spare database {mask_dsn(dsn)}: {exc}") from None
            known = known_databases(chosen, journals)
            routing = opening_routing(chosen, known, [journal.run(read_record_step()) for journal in journals])
        except BaseException:
            _close_all(journals)
            raise
        return cls(known, routing)

    def close(self) -> None:
        """:meth:`~pgjournal.faces.JournalFace.close`."""
        _close_all(known.journal for known in self._known)

    def __enter__(self) -> ShardedJournal:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ShardedJournal(version {self.layout.version}: "
                + ", ".join(self.shards.where(i) for i in range(self.shards.count)) + ")")

    # -- routing ---------------------------------------------------------------------------------------

    def check_layout(self) -> Layout:
        """Re-read every known database's record (a long-running process calls it now and then) and return the
        layout routed from now on: a newer layout every one of its databases records, each reached by a DSN of
        this journal (its settings' or a spare's), is followed (docs/sharding.md, section 8); a reader of a
        by-slices stream compares the result with the layout it started under. :class:`ShardLayoutMismatch`
        while the records disagree (not waited for here) or when a database of the newer layout is reached by
        no known DSN (naming its id)."""
        return self._follow(self._routing, None)

    def _follow(self, seen: Routing[Journal], refused: ShardLayoutMismatch | None) -> Layout:
        """Switch from ``seen`` to the layout the records settle on. After a write ``refused`` by a guard, wait
        (re-reading every :data:`REREAD_INTERVAL`, at most ``layout_wait``) while they do not settle yet."""
        follow = Follow(seen, self._known, refused, self.layout_wait)
        while True:
            routing = follow.decide(self._records())
            if routing is not None:
                break
            time.sleep(REREAD_INTERVAL)
        if routing is not seen:
            self._routing = routing
        return routing.layout

    def _write(self, persistence_id: str, write: Callable[[Journal], T]) -> T:
        """``write`` on the journal of ``persistence_id``; refused by a guard (its range moved), once more on the
        journal of the layout followed (a refused write wrote nothing); failing its sequence number check where
        the range is no more, once more where it went (see :func:`~pgjournal.shards.routing.after_conflict`)."""
        routing = self._routing
        try:
            return write(routing.for_persistence_id(persistence_id))
        except ShardLayoutMismatch as refused:
            if self._routing is routing:  # else another caller followed already
                self._follow(routing, refused)
        except ConcurrencyConflict as conflict:
            if self._routing is routing:
                moved = (after_conflict(routing, self._known, self._records(), persistence_id)
                         if found_nothing(conflict) else None)
                if moved is None:
                    raise
                self._routing = moved
        return write(self._routing.for_persistence_id(persistence_id))

    def _records(self) -> list[Record | None]:
        return [known.journal.run(read_record_step()) for known in self._known]

    def migrate(self) -> None:
        """Migrate every database of the layout and record it (:func:`~pgjournal.shards.migrate.migrate_all`)."""
        migrate_all(self.shards, self.journals[0].settings)

    # -- writes, snapshots -----------------------------------------------------------------------------

    def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
               tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """:meth:`Journal.append` in the database of ``persistence_id``."""
        batch, labels = once(events), once(tags)  # a retry appends the same events, with the same tags
        return self._write(persistence_id, lambda journal: journal.append(
            persistence_id, batch, expected_seq_nr=expected_seq_nr, tags=labels, metadata=metadata))

    def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        """:meth:`~pgjournal.faces.JournalFace.delete_events`."""
        return self._write(persistence_id, lambda journal: journal.delete_events(persistence_id, to_seq_nr))

    def highest_seq_nr(self, persistence_id: str) -> int:
        """:meth:`~pgjournal.faces.JournalFace.highest_seq_nr`."""
        return self.journal_for(persistence_id).highest_seq_nr(persistence_id)

    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> None:
        """:meth:`~pgjournal.faces.JournalFace.save_snapshot`."""
        self._write(persistence_id, lambda journal: journal.save_snapshot(persistence_id, seq_nr, snapshot,
                                                                          metadata=metadata, tags=tags))

    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        """:meth:`~pgjournal.faces.JournalFace.load_snapshot`."""
        return self.journal_for(persistence_id).load_snapshot(persistence_id, max_seq_nr=max_seq_nr,
                                                              max_timestamp=max_timestamp)

    def delete_snapshot(self, persistence_id: str) -> None:
        """:meth:`~pgjournal.faces.JournalFace.delete_snapshot`."""
        self._write(persistence_id, lambda journal: journal.delete_snapshot(persistence_id))


class ShardedQuery:
    """``journal.query`` of a sharded journal: by-pid reads in the pid's database, by-slice reads in the one
    database of the range, persistence ids merged from all."""

    def __init__(self, journal: ShardedJournal) -> None:
        self._journal = journal

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> Iterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.current_events_by_persistence_id`."""
        return self._journal.journal_for(persistence_id).query.current_events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> LiveQuery[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.events_by_persistence_id`."""
        return self._journal.journal_for(persistence_id).query.events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """:meth:`~pgjournal.faces.Reads.timestamp_of`."""
        return self._journal.journal_for(persistence_id).query.timestamp_of(persistence_id, seq_nr)

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """:meth:`~pgjournal.faces.Reads.load_envelope`."""
        return self._journal.journal_for(persistence_id).query.load_envelope(persistence_id, seq_nr)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> Iterator[str]:
        """Every database's ids after ``after``, merged in id order (as Akka's ``persistenceIds`` over its data
        partitions), at most ``limit``."""
        merged = heapq.merge(*(journal.query.current_persistence_ids(after, limit, entity_type=entity_type)
                               for journal in self._journal.journals))
        return merged if limit is None else itertools.islice(merged, limit)

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset,
                                 *, tags: Iterable[str] | None = None) -> Iterator[EventEnvelope]:
        """Read from the one database holding ``min_slice..max_slice`` only."""
        return self._journal.journal_for_slices(min_slice, max_slice).query.current_events_by_slices(
            entity_type, min_slice, max_slice, offset, tags=tags)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> FollowingSlices[EventEnvelope]:
        """Live, from the one database holding ``min_slice..max_slice``, following a move of the range by itself
        (:class:`FollowingSlices`)."""
        return FollowingSlices(self._journal, entity_type, min_slice, max_slice, offset, tags=tags)

    def current_events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> Iterator[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.current_events_by_slices_starting_from_snapshots`."""
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return query.current_events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                                      transform=transform)

    def events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> SnapshotsThenLive:
        """:meth:`~pgjournal.faces.Reads.events_by_slices_starting_from_snapshots`."""
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return query.events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                              transform=transform)


class FollowingSlices(Generic[P]):
    """A live by-slices query of a sharded journal (events, or with ``rows`` another table's, such as durable
    state's changes): the range's database's live query, which follows a move of the range (docs/sharding.md,
    section 6) by itself. Every ``LAYOUT_CHECK_INTERVAL`` it re-reads the layout records before a poll; once the
    range's database changed, it reopens there from the last item handed out (the rule:
    :class:`~pgjournal.shards.routing.StreamFollow`). Records that do not settle for ``layout_wait`` (the new
    database reached by no DSN of this journal: list it as a spare) raise :class:`ShardLayoutMismatch`, as does a
    move that leaves the range across two databases. ``close()`` (or leaving ``with``) stops it."""

    def __init__(self, journal: ShardedJournal, entity_type: str, min_slice: int, max_slice: int, offset: Offset,
                 rows: Callable[[Journal], SliceRows] | None = None, *, tags: Iterable[str] | None = None) -> None:
        self._sharded, self._entity_type, self._rows, self._tags = journal, entity_type, rows, tags
        self._follow = StreamFollow(journal, min_slice, max_slice, offset)
        self._closed = False
        self._live = self._open()

    def _open(self) -> LiveQuery[P]:
        follow = self._follow
        by_slices, rows = follow.journal.by_slices, self._rows(follow.journal) if self._rows else None
        query = by_slices.query(self._entity_type, *follow.range, follow.offset, rows, tags=self._tags)
        return by_slices.run_live(query, before_poll=self._check)

    def _check(self) -> None:
        if not self._follow.due():
            return
        try:
            self._sharded.check_layout()
        except Exception as exc:
            self._follow.checked(exc)
        else:
            self._follow.checked(None)

    def __iter__(self) -> Iterator[P]:
        return self

    def __next__(self) -> P:
        while True:
            try:
                item = next(self._live)
            except Moved:
                self._live.close()
                if self._closed:
                    raise StopIteration from None
                self._live = self._open()
                if self._closed:  # closed from another thread meanwhile
                    self._live.close()
                continue
            except BaseException:
                self._live.close()
                raise
            self._follow.offset = item.offset
            return item

    def close(self) -> None:
        """Stop it (from any thread)."""
        self._closed = True
        self._live.close()

    @property
    def closed(self) -> bool:
        return self._closed or self._live.closed

    def __enter__(self) -> FollowingSlices[P]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ShardedDurableState:
    """``journal.durable_state`` of a sharded journal: each persistence id's state in the database of its
    slice; changes by slices from the one database of the range."""

    def __init__(self, journal: ShardedJournal) -> None:
        self._journal = journal

    def get(self, persistence_id: str) -> DurableState | None:
        """:meth:`~pgjournal.faces.DurableStates.get`."""
        return self._journal.journal_for(persistence_id).durable_state.get(persistence_id)

    def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        """:meth:`~pgjournal.faces.DurableStates.upsert`."""
        return self._journal._write(persistence_id, lambda journal: journal.durable_state.upsert(
            persistence_id, revision, value, tag))

    def delete(self, persistence_id: str, revision: int) -> DurableState:
        """:meth:`~pgjournal.faces.DurableStates.delete`."""
        return self._journal._write(persistence_id, lambda journal: journal.durable_state.delete(persistence_id,
                                                                                                 revision))

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> Iterator[DurableStateChange]:
        """:meth:`~pgjournal.faces.DurableStates.current_changes_by_slices`."""
        return self._journal.journal_for_slices(min_slice, max_slice).durable_state.current_changes_by_slices(
            entity_type, min_slice, max_slice, offset)

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> FollowingSlices[DurableStateChange]:
        """Live, following a move of the range by itself, as ``journal.query.events_by_slices``."""
        return FollowingSlices(self._journal, entity_type, min_slice, max_slice, offset,
                               rows=lambda journal: journal.durable_state.rows())


def _close_all(journals: Iterable[Journal]) -> None:
    """Close every journal, even when one fails to; the first failure is raised after."""
    failure: BaseException | None = None
    for journal in journals:
        try:
            journal.close()
        except BaseException as exc:  # the others must still close
            failure = failure or exc
    if failure is not None:
        raise failure
