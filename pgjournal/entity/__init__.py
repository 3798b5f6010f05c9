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

from .aio import AsyncEntityRepository
from .breaker import BreakerState, CircuitBreaker
from .errors import CircuitOpen, ConflictRetriesExhausted
from .model import CommandResult, DomainError, Effect, Entity, Recovered, persist
from .repository import EntityRepository

__all__ = [
    "AsyncEntityRepository",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "CommandResult",
    "ConflictRetriesExhausted",
    "DomainError",
    "Effect",
    "Entity",
    "EntityRepository",
    "Recovered",
    "persist",
]
