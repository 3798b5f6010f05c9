"""What readers receive: an event with its persistence id, sequence number, slice, time and offset."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .offsets import TimestampOffset
from .serialization import SerializerRegistry
from .transcoding import Redacted


class Source(enum.StrEnum):
    """How an envelope reached the reader."""

    #: Read by the regular query (a poll on the refresh interval, or a catch-up page).
    QUERY = "query"
    #: Read by a poll that a writer's signal triggered.
    NOTIFIED = "notified"
    #: Found by the backtracking query: it committed after the main cursor had passed its timestamp.
    BACKTRACKING = "backtracking"
    #: A snapshot standing in for a persistence id's events up to its sequence number
    #: (``events_by_slices_starting_from_snapshots``).
    SNAPSHOT = "snapshot"


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    persistence_id: str
    seq_nr: int
    slice: int
    entity_type: str
    db_timestamp: datetime
    offset: TimestampOffset
    event: Any
    tags: tuple[str, ...] = ()
    metadata: Any = None
    source: Source = Source.QUERY

    @property
    def redacted(self) -> bool:
        """The event's payload was encrypted with a key that is gone (crypto-shredded): ``event`` is a
        :class:`~pgjournal.transcoding.Redacted` marker, not the event."""
        return isinstance(self.event, Redacted)


#: Column list that :func:`envelope_from_row` expects, in order.
EVENT_COLUMNS = (
    "slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, event_ser_manifest, "
    "event_payload, tags, meta_ser_id, meta_ser_manifest, meta_payload"
)


def envelope_from_row(
    row: Sequence[Any],
    serializers: SerializerRegistry,
    *,
    offset: TimestampOffset | None = None,
    source: Source = Source.QUERY,
    read_timestamp: datetime | None = None,
) -> EventEnvelope:
    """Decode one row selected with :data:`EVENT_COLUMNS`."""
    slice_, entity_type, pid, seq_nr, ts, ser_id, manifest, payload, tags, meta_id, meta_manifest, meta = row
    event = serializers.deserialize(ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr)
    metadata = None if meta_id is None else serializers.deserialize(
        meta_id, meta_manifest or "", meta, where=f" of the metadata of persistence id {pid!r} seq_nr {seq_nr}",
        persistence_id=pid, seq_nr=seq_nr)
    if offset is None:
        offset = TimestampOffset(ts, read_timestamp or ts, {pid: seq_nr})
    envelope = _new(EventEnvelope)
    _set_pid(envelope, pid)
    _set_seq_nr(envelope, seq_nr)
    _set_slice(envelope, slice_)
    _set_entity_type(envelope, entity_type)
    _set_db_timestamp(envelope, ts)
    _set_offset(envelope, offset)
    _set_event(envelope, event)
    _set_tags(envelope, tuple(tags) if tags else ())
    _set_metadata(envelope, metadata)
    _set_source(envelope, source)
    return envelope


# A reader makes one envelope per event: filling its slots directly costs ~0.6 us less than the frozen
# dataclass's __init__ (which sets each field through object.__setattr__).
_new = object.__new__
(_set_pid, _set_seq_nr, _set_slice, _set_entity_type, _set_db_timestamp, _set_offset, _set_event, _set_tags,
 _set_metadata, _set_source) = (getattr(EventEnvelope, name).__set__ for name in (
    "persistence_id", "seq_nr", "slice", "entity_type", "db_timestamp", "offset", "event", "tags", "metadata",
    "source"))
