"""pgjournal: an event journal for PostgreSQL and Postgres-compatible distributed SQL."""

from .buckets import BucketSize
from .by_tag import TagEnvelope
from .durable_state import DurableState, DurableStateChange, DurableStateStore
from .entity import (
    CircuitBreaker,
    CommandResult,
    DomainError,
    Entity,
    EntityRepository,
    persist,
)
from .envelope import EventEnvelope, Source
from .errors import (
    CircuitOpen,
    ConcurrencyConflict,
    ConfigurationError,
    ConflictRetriesExhausted,
    ConnectionTimedOut,
    DatabaseUnavailable,
    DecryptionError,
    EventNotFound,
    HorizonBlocked,
    InsufficientPrivilege,
    InvalidArgument,
    InvalidPersistenceId,
    JournalError,
    LeaseLost,
    LoadConflict,
    MissingEventsError,
    MissingTaggedEventsError,
    ProjectionFailed,
    RetriesExhausted,
    RevisionConflict,
    SchemaNotMigrated,
    SerializationError,
    SlowConsumer,
    TagFlushFailed,
    TransactionAborted,
    WriteOutcomeUnknown,
)
from .journal import Journal
from .offsets import NoOffset, TimeBasedUUID, TimestampOffset
from .reconciliation import Cleanup, Reconciliation
from .serialization import SerializerRegistry
from .settings import Settings
from .slices import entity_type_of, slice_for_persistence_id, slice_ranges
from .snapshots import SelectedSnapshot

__all__ = [
    "BucketSize",
    "CircuitBreaker",
    "CircuitOpen",
    "Cleanup",
    "CommandResult",
    "ConcurrencyConflict",
    "ConfigurationError",
    "ConflictRetriesExhausted",
    "ConnectionTimedOut",
    "DatabaseUnavailable",
    "DecryptionError",
    "DomainError",
    "DurableState",
    "DurableStateChange",
    "DurableStateStore",
    "Entity",
    "EntityRepository",
    "EventEnvelope",
    "EventNotFound",
    "HorizonBlocked",
    "InsufficientPrivilege",
    "InvalidArgument",
    "InvalidPersistenceId",
    "Journal",
    "JournalError",
    "LeaseLost",
    "LoadConflict",
    "MissingEventsError",
    "MissingTaggedEventsError",
    "NoOffset",
    "ProjectionFailed",
    "Reconciliation",
    "RetriesExhausted",
    "RevisionConflict",
    "SchemaNotMigrated",
    "SelectedSnapshot",
    "SerializationError",
    "SerializerRegistry",
    "Settings",
    "SlowConsumer",
    "Source",
    "TagEnvelope",
    "TagFlushFailed",
    "TimeBasedUUID",
    "TimestampOffset",
    "TransactionAborted",
    "WriteOutcomeUnknown",
    "entity_type_of",
    "persist",
    "slice_for_persistence_id",
    "slice_ranges",
]
