"""``ShardedJournal``: one :class:`~pgjournal.journal.Journal` per database of a slice-range layout, each
operation routed by the slice of its persistence id or range (docs/sharding.md, section 4)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.errors import DatabaseUnavailable, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.journal import Journal
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.settings import Settings
from pgjournal.shards.layout import Layout, ShardSettings, SliceRange, agreed_layout, format_range
from pgjournal.shards.migrate import migrate_all
from pgjournal.shards.record import read_record_step
from pgjournal.validation import check_persistence_id

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.query.from_snapshots import SnapshotsThenLive
    from pgjournal.runtime.live import LiveQuery
    from pgjournal.state.durable_state import DurableState, DurableStateChange
    from pgjournal.state.snapshots import SelectedSnapshot

Shards = ShardSettings | Mapping[str, str] | Sequence[str]


def shard_settings(shards: Shards | None) -> ShardSettings:
    """``shards`` as :class:`ShardSettings`; ``None``: from ``PGJOURNAL_SHARDS``."""
    if shards is None:
        return ShardSettings.from_env()
    return shards if isinstance(shards, ShardSettings) else ShardSettings.of(shards)


class ShardedJournal:
    """An event journal over the databases of a slice-range layout. Thread-safe, as each database's journal is;
    open one per process and share it."""

    def __init__(self, shards: ShardSettings, journals: Sequence[Journal], layout: Layout) -> None:
        self.shards = shards
        #: ``journals[i]`` is the journal of ``shards.ranges[i]``.
        self.journals = tuple(journals)
        #: The layout every database recorded when this journal opened (see :meth:`check_layout`).
        self.layout = layout
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
        layout record, :class:`ShardLayoutMismatch` when the records and the settings disagree.
        """
        chosen = shard_settings(shards)
        if migrate:
            migrate_all(chosen, Settings.load(**settings))
        journals: list[Journal] = []
        try:
            for index, dsn in enumerate(chosen.dsns):
                try:
                    journals.append(Journal.open(dsn, serializers=serializers, **settings))
                except (DatabaseUnavailable, SchemaNotMigrated) as exc:
                    raise type(exc)(f"the database of slices {format_range(chosen.ranges[index])}: {exc}") from None
            layout = agreed_layout(chosen, [journal.run(read_record_step()) for journal in journals])
        except BaseException:
            _close_all(journals)
            raise
        return cls(chosen, journals, layout)

    def close(self) -> None:
        _close_all(self.journals)

    def __enter__(self) -> ShardedJournal:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ShardedJournal(version {self.layout.version}: "
                + ", ".join(self.shards.where(i) for i in range(self.shards.count)) + ")")

    # -- routing ---------------------------------------------------------------------------------------

    def journal_for(self, persistence_id: str) -> Journal:
        """The journal of the database holding ``persistence_id``'s slice: its transactions, and anything of the
        one-database API, are that database's."""
        return self.journals[self.shards.index_of(slice_for_persistence_id(check_persistence_id(persistence_id)))]

    def journal_for_slices(self, min_slice: int, max_slice: int) -> Journal:
        """The journal of the one database holding ``min_slice..max_slice`` (a range across databases is
        :class:`~pgjournal.errors.InvalidArgument`). A projection of the range runs on it, so its offsets are
        stored beside its slices."""
        return self.journals[self.shards.index_of_range(min_slice, max_slice)]

    def ranges_within(self, min_slice: int, max_slice: int) -> list[SliceRange]:
        """``min_slice..max_slice`` cut at the databases' boundaries: one query per sub-range reads it all."""
        return self.shards.ranges_within(min_slice, max_slice)

    def check_layout(self) -> Layout:
        """Re-read every database's record; :class:`ShardLayoutMismatch` when the layout is no longer the one
        this journal opened with (a long-running process calls it now and then)."""
        current = agreed_layout(self.shards, [journal.run(read_record_step()) for journal in self.journals])
        if current != self.layout:
            raise ShardLayoutMismatch(f"the shard layout changed since this journal opened: version "
                                      f"{self.layout.version} then, {current.version} now; reopen with the new one")
        return current

    def migrate(self) -> None:
        migrate_all(self.shards, self.journals[0].settings)

    # -- writes, snapshots -----------------------------------------------------------------------------

    def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
               tags: Iterable[str] = (), metadata: Any = None) -> list[EventEnvelope]:
        """:meth:`Journal.append` in the database of ``persistence_id``."""
        return self.journal_for(persistence_id).append(persistence_id, events, expected_seq_nr=expected_seq_nr,
                                                       tags=tags, metadata=metadata)

    def delete_events(self, persistence_id: str, to_seq_nr: int) -> int:
        return self.journal_for(persistence_id).delete_events(persistence_id, to_seq_nr)

    def highest_seq_nr(self, persistence_id: str) -> int:
        return self.journal_for(persistence_id).highest_seq_nr(persistence_id)

    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> None:
        self.journal_for(persistence_id).save_snapshot(persistence_id, seq_nr, snapshot, metadata=metadata, tags=tags)

    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> SelectedSnapshot | None:
        return self.journal_for(persistence_id).load_snapshot(persistence_id, max_seq_nr=max_seq_nr,
                                                              max_timestamp=max_timestamp)

    def delete_snapshot(self, persistence_id: str) -> None:
        self.journal_for(persistence_id).delete_snapshot(persistence_id)


class ShardedQuery:
    """``journal.query`` of a sharded journal: by-pid reads in the pid's database, by-slice reads in the one
    database of the range, persistence ids merged from all."""

    def __init__(self, journal: ShardedJournal) -> None:
        self._journal = journal

    def current_events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1,
                                         to_seq_nr: int | None = None) -> Iterator[EventEnvelope]:
        return self._journal.journal_for(persistence_id).query.current_events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                                 ) -> LiveQuery[EventEnvelope]:
        return self._journal.journal_for(persistence_id).query.events_by_persistence_id(
            persistence_id, from_seq_nr, to_seq_nr)

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        return self._journal.journal_for(persistence_id).query.timestamp_of(persistence_id, seq_nr)

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        return self._journal.journal_for(persistence_id).query.load_envelope(persistence_id, seq_nr)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> Iterator[str]:
        """Every database's ids after ``after``, merged in id order (as Akka's ``persistenceIds`` over its data
        partitions), at most ``limit``."""
        merged = heapq.merge(*(journal.query.current_persistence_ids(after, limit, entity_type=entity_type)
                               for journal in self._journal.journals))
        return merged if limit is None else itertools.islice(merged, limit)

    def current_events_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                 offset: Offset = NoOffset) -> Iterator[EventEnvelope]:
        """Read from the one database holding ``min_slice..max_slice`` only."""
        return self._journal.journal_for_slices(min_slice, max_slice).query.current_events_by_slices(
            entity_type, min_slice, max_slice, offset)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                         ) -> LiveQuery[EventEnvelope]:
        return self._journal.journal_for_slices(min_slice, max_slice).query.events_by_slices(
            entity_type, min_slice, max_slice, offset)

    def current_events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> Iterator[EventEnvelope]:
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return query.current_events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                                      transform=transform)

    def events_by_slices_starting_from_snapshots(
            self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Callable[[Any], Any]) -> SnapshotsThenLive:
        query = self._journal.journal_for_slices(min_slice, max_slice).query
        return query.events_by_slices_starting_from_snapshots(entity_type, min_slice, max_slice, offset,
                                                              transform=transform)


class ShardedDurableState:
    """``journal.durable_state`` of a sharded journal: each persistence id's state in the database of its
    slice; changes by slices from the one database of the range."""

    def __init__(self, journal: ShardedJournal) -> None:
        self._journal = journal

    def get(self, persistence_id: str) -> DurableState | None:
        return self._journal.journal_for(persistence_id).durable_state.get(persistence_id)

    def upsert(self, persistence_id: str, revision: int, value: Any, tag: str | None = None) -> DurableState:
        return self._journal.journal_for(persistence_id).durable_state.upsert(persistence_id, revision, value, tag)

    def delete(self, persistence_id: str, revision: int) -> DurableState:
        return self._journal.journal_for(persistence_id).durable_state.delete(persistence_id, revision)

    def current_changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int,
                                  offset: Offset = NoOffset) -> Iterator[DurableStateChange]:
        return self._journal.journal_for_slices(min_slice, max_slice).durable_state.current_changes_by_slices(
            entity_type, min_slice, max_slice, offset)

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> LiveQuery[DurableStateChange]:
        return self._journal.journal_for_slices(min_slice, max_slice).durable_state.changes_by_slices(
            entity_type, min_slice, max_slice, offset)


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
