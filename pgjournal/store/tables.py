"""The names of pgjournal's tables: the one place they are spelled. :mod:`pgjournal.store.schema` builds its
table model (SQLAlchemy Core, for migrations and schema checks) on them; the stores take their names from here,
so reading and writing the journal never imports SQLAlchemy."""

from __future__ import annotations

from typing import Protocol

EVENT_JOURNAL = "event_journal"
SNAPSHOT = "snapshot"
PROJECTION_TIMESTAMP_OFFSET_STORE = "projection_timestamp_offset_store"
PROJECTION_MANAGEMENT = "projection_management"
TAG_VIEWS = "tag_views"
TAG_WRITE_PROGRESS = "tag_write_progress"
TAG_SCANNING = "tag_scanning"
TAG_SETTINGS = "tag_settings"
PROJECTION_LEASE = "projection_lease"
PROJECTION_WORKER = "projection_worker"
PROJECTION_DEAD_LETTER = "projection_dead_letter"
PGJOURNAL_FORMAT = "pgjournal_format"
DURABLE_STATE = "durable_state"
PAYLOAD_KEYS = "pgjournal_payload_keys"
TAG_BATCH_WRITERS = "tag_batch_writers"
REPLICATION_SEEN = "replication_seen"


class Slicing(Protocol):
    """What the stores ask of a dialect (:class:`pgjournal.dialects.Dialect` is one): the table that holds a
    slice's events, and the SQL that keeps a slice range. The stores sit below the dialects, which build them."""

    def slice_condition(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, object]]: ...

    def event_table(self, slice_: int) -> str: ...

    def batch_table(self, slice_: int) -> str: ...
