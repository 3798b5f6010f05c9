"""``ShardedJournal``: one :class:`~pgjournal.journal.Journal` per database of a slice-range layout, each
operation routed by the slice of its persistence id or range (docs/sharding.md, section 4). The routing is written
once for both faces (:mod:`pgjournal.shards.routed`); here is what the blocking face runs it with."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pgjournal.faces import DurableStates, Reads
from pgjournal.journal import Journal
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.runtime.steps import run_calls
from pgjournal.shards.routed import (
    Following,
    RoutedDurableState,
    RoutedJournal,
    RoutedParts,
    Shards,
    blocking,
    by_pid,
    by_range,
    close_all,
    merged,
    opening_step,
    shard_settings,
)
from pgjournal.shards.routing import Known, Moved, P, Routing

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.runtime.live import LiveQuery
    from pgjournal.state.durable_state import DurableStateChange

__all__ = ["FollowingSlices", "ShardedDurableState", "ShardedJournal", "ShardedQuery", "Shards", "shard_settings"]


class ShardedJournal(RoutedJournal[Journal]):
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
        journals: list[Journal] = []
        try:
            known, routing = run_calls(opening_step(chosen, migrate, settings, lambda dsn: Journal.open(
                dsn, serializers=serializers, replica=chosen.replica_of(dsn), **settings), cls._in_thread, journals))
        except BaseException:
            close_all(journals)
            raise
        return cls(known, routing)

    def close(self) -> None:
        """:meth:`~pgjournal.faces.JournalFace.close`: every database's journal."""
        close_all(known.journal for known in self._known)

    def __enter__(self) -> ShardedJournal:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    check_layout = blocking(RoutedJournal.check_layout_step)
    migrate = blocking(RoutedJournal.migrate_step)
    append = blocking(RoutedJournal.append_step)
    delete_events = blocking(RoutedJournal.delete_events_step)
    highest_seq_nr = blocking(RoutedJournal.highest_seq_nr_step)
    save_snapshot = blocking(RoutedJournal.save_snapshot_step)
    load_snapshot = blocking(RoutedJournal.load_snapshot_step)
    delete_snapshot = blocking(RoutedJournal.delete_snapshot_step)


class ShardedQuery(RoutedParts[Journal]):
    """``journal.query`` of a sharded journal: by-pid reads in the pid's database, by-slice reads in the one
    database of the range, persistence ids merged from all."""

    current_events_by_persistence_id = by_pid(Reads.current_events_by_persistence_id)
    events_by_persistence_id = by_pid(Reads.events_by_persistence_id)
    timestamp_of = by_pid(Reads.timestamp_of)
    load_envelope = by_pid(Reads.load_envelope)
    current_events_by_slices = by_range(Reads.current_events_by_slices)
    current_events_by_slices_starting_from_snapshots = by_range(Reads.current_events_by_slices_starting_from_snapshots)
    events_by_slices_starting_from_snapshots = by_range(Reads.events_by_slices_starting_from_snapshots)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> Iterator[str]:
        """:meth:`~pgjournal.faces.Reads.current_persistence_ids`: every database's, merged in id order."""
        return merged([journal.query.current_persistence_ids(after, limit, entity_type=entity_type)
                       for journal in self._journal.journals], limit)

    def events_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
                         tags: Iterable[str] | None = None) -> FollowingSlices[EventEnvelope]:
        """:meth:`~pgjournal.faces.Reads.events_by_slices`, following a move of the range (:class:`FollowingSlices`)."""
        return FollowingSlices(self._journal, entity_type, min_slice, max_slice, offset, tags=tags)


class ShardedDurableState(RoutedDurableState[Journal]):
    """``journal.durable_state`` of a sharded journal (see :class:`~pgjournal.shards.routed.RoutedDurableState`)."""

    get = by_pid(DurableStates.get, "durable_state")
    upsert = blocking(RoutedDurableState.upsert_step)
    delete = blocking(RoutedDurableState.delete_step)
    current_changes_by_slices = by_range(DurableStates.current_changes_by_slices, "durable_state")

    def changes_by_slices(self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset
                          ) -> FollowingSlices[DurableStateChange]:
        """:meth:`~pgjournal.faces.DurableStates.changes_by_slices`, following a move of the range by itself."""
        return FollowingSlices(self._journal, entity_type, min_slice, max_slice, offset,
                               rows=lambda journal: journal.durable_state.rows())


class FollowingSlices(Following[Journal, P]):
    """A live by-slices stream of a sharded journal (:class:`~pgjournal.shards.routed.Following`) for the
    blocking face: an iterator."""

    _live: LiveQuery[P]

    _check = blocking(Following._check_step)

    def __iter__(self) -> Iterator[P]:
        return self

    def __next__(self) -> P:
        while True:
            try:
                item = next(self._live)
            except Moved:
                if self._reopened():
                    continue
                raise StopIteration from None
            except BaseException:
                self._live.close()
                raise
            return self._handed(item)

    def __enter__(self) -> FollowingSlices[P]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

