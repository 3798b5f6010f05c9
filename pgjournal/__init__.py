"""pgjournal: an event journal for PostgreSQL and Postgres-compatible distributed SQL."""

__version__ = "0.2.0"

from pgjournal.buckets import BucketSize
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.entity import (
    CircuitBreaker,
    CommandResult,
    DomainError,
    Entity,
    EntityRepository,
    persist,
)
from pgjournal.errors import (
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
    JournalClosed,
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
    ShardLayoutMismatch,
    SlowConsumer,
    TagFlushFailed,
    TransactionAborted,
    WriteOutcomeUnknown,
)
from pgjournal.journal import Journal
from pgjournal.model.envelope import EventEnvelope, Source
from pgjournal.model.offsets import NoOffset, TimeBasedUUID, TimestampOffset
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id, slice_ranges
from pgjournal.query.by_tag import TagEnvelope
from pgjournal.settings import Settings
from pgjournal.state.durable_state import DurableState, DurableStateChange, DurableStateStore
from pgjournal.state.snapshots import SelectedSnapshot
from pgjournal.tags.reconciliation import Cleanup, Reconciliation

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
    "JournalClosed",
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
    "ShardLayoutMismatch",
    "SlowConsumer",
    "Source",
    "TagEnvelope",
    "TagFlushFailed",
    "TimeBasedUUID",
    "TimestampOffset",
    "TransactionAborted",
    "WriteOutcomeUnknown",
    "__version__",
    "entity_type_of",
    "persist",
    "slice_for_persistence_id",
    "slice_ranges",
]
