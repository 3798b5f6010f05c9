"""Event-sourced entities on the journal: command handler → events → state, snapshots, recovery.

::

    class Counter(Entity[int]):
        name = "counter"
        initial_state = 0

        def handle(self, state, command):
            if command <= 0:
                raise DomainError(f"can only add a positive number, got {command}")
            return persist({"added": command}, reply=state + command)

        def apply(self, state, event):
            return state + event["added"]

    counters = EntityRepository(journal, Counter)
    counters.handle("c-1", 5).reply  # 5
"""

from pgjournal.entity.aio import AsyncEntityRepository
from pgjournal.entity.breaker import BreakerState, CircuitBreaker
from pgjournal.entity.errors import CircuitOpen, ConflictRetriesExhausted
from pgjournal.entity.model import CommandResult, DomainError, Effect, Entity, Recovered, persist
from pgjournal.entity.replicated import (
    AsyncReplicatedRepository,
    CommandContext,
    Replicated,
    ReplicatedEntity,
    ReplicatedRepository,
    ReplicationContext,
)
from pgjournal.entity.repository import EntityRepository

__all__ = [
    "AsyncEntityRepository",
    "AsyncReplicatedRepository",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "CommandContext",
    "CommandResult",
    "ConflictRetriesExhausted",
    "DomainError",
    "Effect",
    "Entity",
    "EntityRepository",
    "Recovered",
    "Replicated",
    "ReplicatedEntity",
    "ReplicatedRepository",
    "ReplicationContext",
    "persist",
]
