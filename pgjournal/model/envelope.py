"""What readers receive: an event with its persistence id, sequence number, slice, time and offset."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, make_dataclass
from datetime import datetime
from typing import Any

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import Redacted
from pgjournal.model.offsets import TimestampOffset
from pgjournal.model.slots import filled, setters


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
        :class:`~pgjournal.codec.transcoding.Redacted` marker, not the event."""
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
    slice_, entity_type, pid, seq_nr, ts, ser_id, manifest, payload, tags, meta_id, _, _ = row
    event = serializers.deserialize(ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr)
    metadata = None if meta_id is None else metadata_of(row, serializers)
    if offset is None:
        offset = TimestampOffset(ts, read_timestamp or ts, {pid: seq_nr})
    return new_envelope(pid, seq_nr, slice_, entity_type, ts, offset, event, tuple(tags) if tags else (), metadata,
                        source)


def metadata_of(row: Sequence[Any], serializers: SerializerRegistry) -> Any:
    """The decoded metadata of a row selected with :data:`EVENT_COLUMNS` that has some."""
    pid, seq_nr = row[2], row[3]
    return serializers.deserialize(row[9], row[10] or "", row[11],
                                   where=f" of the metadata of persistence id {pid!r} seq_nr {seq_nr}",
                                   persistence_id=pid, seq_nr=seq_nr)


#: :class:`EventEnvelope`'s twin without ``frozen``, made from its fields: the same slots in the same order, so an
#: instance can take :class:`EventEnvelope` as its class once filled (its ``__init__`` stores each slot
#: directly, where the frozen one calls ``object.__setattr__`` per field).
_Unfrozen = make_dataclass("_Unfrozen", [(f.name, f.type) for f in fields(EventEnvelope)], slots=True)


def _recast(pid: str, seq_nr: int, slice_: int, entity_type: str, ts: datetime, offset: TimestampOffset,
            event: Any, tags: tuple[str, ...], metadata: Any, source: Source) -> EventEnvelope:
    envelope: Any = _Unfrozen(pid, seq_nr, slice_, entity_type, ts, offset, event, tags, metadata, source)
    envelope.__class__ = EventEnvelope
    recast: EventEnvelope = envelope
    return recast


# A reader makes one envelope per event (``python -m bench by-slices``): filling its slots directly spares the
# frozen dataclass's __init__, which sets each field through object.__setattr__.
_SETTERS = setters(EventEnvelope, "persistence_id", "seq_nr", "slice", "entity_type", "db_timestamp", "offset",
                   "event", "tags", "metadata", "source")


def _filled(*fields: Any) -> EventEnvelope:
    return filled(EventEnvelope, _SETTERS, *fields)


def _pick() -> Callable[..., EventEnvelope]:
    """The recast twin (cheaper than filling the slots one by one: its generated ``__init__`` stores them, then
    one class change), where the interpreter allows a class change between the two layouts (CPython does); else
    the slots filled one by one."""
    probe: tuple[Any, ...] = ("probe", 1, 0, "", datetime(1970, 1, 1), None, None, (), None, Source.QUERY)
    try:
        made = _recast(*probe)
    except TypeError:
        return _filled
    return _recast if made == _filled(*probe) and type(made) is EventEnvelope else _filled


#: ``new_envelope(pid, seq_nr, slice, entity_type, db_timestamp, offset, event, tags, metadata, source)``: an
#: :class:`EventEnvelope` of trusted values (no checks; ``tags`` a tuple), the cheapest way there is.
new_envelope = _pick()
