"""pgjournal: an event journal for PostgreSQL and Postgres-compatible distributed SQL."""

from .envelope import EventEnvelope, Source
from .errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidPersistenceId,
    JournalError,
    MissingEventsError,
    SchemaNotMigrated,
    SerializationError,
    WriteOutcomeUnknown,
)
from .journal import Journal
from .offsets import NoOffset, TimestampOffset
from .serialization import SerializerRegistry
from .settings import Settings
from .slices import entity_type_of, slice_for_persistence_id, slice_ranges
from .snapshots import SelectedSnapshot

__all__ = [
    "ConcurrencyConflict",
    "ConfigurationError",
    "DatabaseUnavailable",
    "EventEnvelope",
    "InvalidArgument",
    "InvalidPersistenceId",
    "Journal",
    "JournalError",
    "MissingEventsError",
    "NoOffset",
    "SchemaNotMigrated",
    "SelectedSnapshot",
    "SerializationError",
    "SerializerRegistry",
    "Settings",
    "Source",
    "TimestampOffset",
    "WriteOutcomeUnknown",
    "entity_type_of",
    "slice_for_persistence_id",
    "slice_ranges",
]
