"""``journal.query``: every read, in a *current* form (ends at the tail seen at start) and a *live* form.

``Query(journal, serializers=...)`` is the same reads decoding payloads with another registry (a projection
reads through one that turns a payload it cannot decode into a value instead of an error); it shares the
journal's pool, settings and signals."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.query.by_pid import ByPersistenceId
from pgjournal.query.by_slices import BySlices
from pgjournal.runtime.live import LiveQuery

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.journal import Journal
    from pgjournal.query.by_tag import TagEnvelope
    from pgjournal.query.from_snapshots import SnapshotsThenLive


class Query:
    def __init__(self, journal: Journal, *, serializers: SerializerRegistry | None = None) -> None:
        self._journal = journal
        self._serializers = serializers
        self._by_pid = journal.by_pid if serializers is None else ByPersistenceId(journal, serializers)
        self._by_slices = journal.by_slices if serializers is None else BySlices(journal, serializers)

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Iterator[EventEnvelope]:
        return self._by_pid.current(persistence_id, from_seq_nr, to_seq_nr)

    def events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> LiveQuery[EventEnvelope]:
        return self._by_pid.live(persistence_id, from_seq_nr, to_seq_nr)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000, *,
                                entity_type: str | None = None) -> Iterator[str]:
        """Persistence ids after ``after`` in id order, at most ``limit`` (``None``: all), keyset-paged;
        with ``entity_type`` only that type's (Akka's ``currentPersistenceIds(entityType, afterId, limit)``)."""
        return self._by_pid.persistence_ids(after, limit, entity_type=entity_type)

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of event ``seq_nr`` of ``persistence_id``; ``None`` when there is none (or it is
        deleted). Akka's ``timestampOf``."""
        return self._by_pid.timestamp_of(persistence_id, seq_nr)

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """Event ``seq_nr`` of ``persistence_id``; raises :class:`~pgjournal.errors.EventNotFound` when there
        is none (or it is deleted). Akka's ``loadEnvelope``."""
        return self._by_pid.load_envelope(persistence_id, seq_nr)

    def current_events_by_slices(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        tags: Iterable[str] | None = None,
    ) -> Iterator[EventEnvelope]:
        """Events of ``entity_type`` in slices ``min_slice..max_slice`` after ``offset``, up to the tail seen
        when the query starts; each once, per persistence id in sequence order. ``tags``: only the events
        carrying any of them, filtered by the database (see :mod:`pgjournal.query.by_slices`)."""
        return self._by_slices.current(entity_type, min_slice, max_slice, offset, tags=tags)

    def events_by_slices(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        tags: Iterable[str] | None = None,
    ) -> LiveQuery[EventEnvelope]:
        """Like :meth:`current_events_by_slices`, but keeps polling; ``close()`` (or ``with``) stops it."""
        return self._by_slices.live(entity_type, min_slice, max_slice, offset, tags=tags)

    def current_events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> Iterator[EventEnvelope]:
        """Like :meth:`current_events_by_slices`, but a persistence id with a snapshot taken after ``offset``
        starts with that snapshot (an envelope with ``source`` ``snapshot``, its sequence number, and
        ``transform(snapshot)`` as its event) and continues with its events after it. Akka's
        ``currentEventsBySlicesStartingFromSnapshots``; see :mod:`pgjournal.query.from_snapshots`."""
        from pgjournal.query import from_snapshots

        return from_snapshots.current(self._journal, entity_type, min_slice, max_slice, offset, transform=transform,
                                      serializers=self._serializers)

    def events_by_slices_starting_from_snapshots(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
        transform: Callable[[Any], Any],
    ) -> SnapshotsThenLive:
        """Like :meth:`current_events_by_slices_starting_from_snapshots`, but keeps polling; ``close()`` (or
        ``with``) stops it."""
        from pgjournal.query import from_snapshots

        return from_snapshots.live(self._journal, entity_type, min_slice, max_slice, offset, transform=transform,
                                   serializers=self._serializers)

    def current_events_by_tag(self, tag: str, offset: Offset = NoOffset) -> Iterator[TagEnvelope]:
        """Events tagged ``tag`` after ``offset`` (a :class:`~pgjournal.model.offsets.TimeBasedUUID` or ``NoOffset``:
        from ``tag_first_time_bucket``) up to now minus ``tag_eventual_consistency_delay``; Cassandra semantics.
        With the batched tag writer, this journal's own tagged appends are written first (read-your-writes in
        the process); other processes' are read once their writer's watermark passed them."""
        from pgjournal.query.by_tag import ByTag
        from pgjournal.tags.watermark import flushed_before_reading

        if self._journal.tag_writer is not None:
            with flushed_before_reading():
                self._journal.tag_writer.flush()
        return ByTag(self._journal, self._serializers).current(tag, offset)

    def events_by_tag(self, tag: str, offset: Offset = NoOffset) -> LiveQuery[TagEnvelope]:
        """Like :meth:`current_events_by_tag`, but keeps polling; ``close()`` (or ``with``) stops it."""
        from pgjournal.query.by_tag import ByTag

        return ByTag(self._journal, self._serializers).live(tag, offset)
