"""pgjournal: an event journal for PostgreSQL and Postgres-compatible distributed SQL."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:  # the names as type checkers and editors see them; at run time __getattr__ imports them
    from pgjournal.admin.cleanup import JournalCleanup
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
        LocationRecovering,
        MissingEventsError,
        MissingTaggedEventsError,
        NotSeenInTime,
        ProjectionFailed,
        RecoveryFailed,
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
    from pgjournal.query.firehose import Firehose
    from pgjournal.settings import Settings
    from pgjournal.state.durable_state import DurableState, DurableStateChange, DurableStateStore
    from pgjournal.state.keystore import InMemoryKeyStore, PostgresKeyStore
    from pgjournal.state.snapshots import SelectedSnapshot
    from pgjournal.tags.reconciliation import Cleanup, Reconciliation

#: Each public name and the module it lives in, imported on first use (PEP 562): ``import pgjournal`` (and
#: with it every ``pgjournal`` command, ``--version`` included) stays quick, and a worker process loads only
#: what it runs.
_HOMES: dict[str, str] = {
    "JournalCleanup": "pgjournal.admin.cleanup",
    "BucketSize": "pgjournal.buckets",
    "SerializerRegistry": "pgjournal.codec.serialization",
    "CircuitBreaker": "pgjournal.entity",
    "CommandResult": "pgjournal.entity",
    "DomainError": "pgjournal.entity",
    "Entity": "pgjournal.entity",
    "EntityRepository": "pgjournal.entity",
    "persist": "pgjournal.entity",
    "CircuitOpen": "pgjournal.errors",
    "ConcurrencyConflict": "pgjournal.errors",
    "ConfigurationError": "pgjournal.errors",
    "ConflictRetriesExhausted": "pgjournal.errors",
    "ConnectionTimedOut": "pgjournal.errors",
    "DatabaseUnavailable": "pgjournal.errors",
    "DecryptionError": "pgjournal.errors",
    "EventNotFound": "pgjournal.errors",
    "HorizonBlocked": "pgjournal.errors",
    "InsufficientPrivilege": "pgjournal.errors",
    "InvalidArgument": "pgjournal.errors",
    "InvalidPersistenceId": "pgjournal.errors",
    "JournalClosed": "pgjournal.errors",
    "JournalError": "pgjournal.errors",
    "LeaseLost": "pgjournal.errors",
    "LoadConflict": "pgjournal.errors",
    "LocationRecovering": "pgjournal.errors",
    "MissingEventsError": "pgjournal.errors",
    "MissingTaggedEventsError": "pgjournal.errors",
    "NotSeenInTime": "pgjournal.errors",
    "ProjectionFailed": "pgjournal.errors",
    "RecoveryFailed": "pgjournal.errors",
    "RetriesExhausted": "pgjournal.errors",
    "RevisionConflict": "pgjournal.errors",
    "SchemaNotMigrated": "pgjournal.errors",
    "SerializationError": "pgjournal.errors",
    "ShardLayoutMismatch": "pgjournal.errors",
    "SlowConsumer": "pgjournal.errors",
    "TagFlushFailed": "pgjournal.errors",
    "TransactionAborted": "pgjournal.errors",
    "WriteOutcomeUnknown": "pgjournal.errors",
    "Journal": "pgjournal.journal",
    "EventEnvelope": "pgjournal.model.envelope",
    "Source": "pgjournal.model.envelope",
    "NoOffset": "pgjournal.model.offsets",
    "TimeBasedUUID": "pgjournal.model.offsets",
    "TimestampOffset": "pgjournal.model.offsets",
    "entity_type_of": "pgjournal.model.slices",
    "slice_for_persistence_id": "pgjournal.model.slices",
    "slice_ranges": "pgjournal.model.slices",
    "TagEnvelope": "pgjournal.query.by_tag",
    "Firehose": "pgjournal.query.firehose",
    "Settings": "pgjournal.settings",
    "DurableState": "pgjournal.state.durable_state",
    "DurableStateChange": "pgjournal.state.durable_state",
    "DurableStateStore": "pgjournal.state.durable_state",
    "InMemoryKeyStore": "pgjournal.state.keystore",
    "PostgresKeyStore": "pgjournal.state.keystore",
    "SelectedSnapshot": "pgjournal.state.snapshots",
    "Cleanup": "pgjournal.tags.reconciliation",
    "Reconciliation": "pgjournal.tags.reconciliation",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pgjournal' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


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
    "Firehose",
    "HorizonBlocked",
    "InMemoryKeyStore",
    "InsufficientPrivilege",
    "InvalidArgument",
    "InvalidPersistenceId",
    "Journal",
    "JournalCleanup",
    "JournalClosed",
    "JournalError",
    "LeaseLost",
    "LoadConflict",
    "LocationRecovering",
    "MissingEventsError",
    "MissingTaggedEventsError",
    "NoOffset",
    "NotSeenInTime",
    "PostgresKeyStore",
    "ProjectionFailed",
    "Reconciliation",
    "RecoveryFailed",
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
