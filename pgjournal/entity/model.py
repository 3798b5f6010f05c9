"""What a user writes: an :class:`Entity` subclass (initial state, command handler, event handler), and what
a command gets back (:class:`CommandResult`).

The command handler validates a command against the current state and returns the events to persist
(``persist(*events, reply=...)``, a plain list, or ``None`` for a read-only command), or raises
:class:`DomainError`, which persists nothing. The event handler folds one event into the state and is used
both after a command and during recovery, so the two can never disagree.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pgjournal.errors import InvalidArgument
from pgjournal.validation import check_name

S = TypeVar("S")


class DomainError(Exception):
    """A command was rejected by the entity's rules (raised by user code; nothing is persisted).

    Not a :class:`~pgjournal.JournalError`: the journal did not fail, the command was refused.
    """


@dataclass(frozen=True, slots=True)
class Effect:
    """Events to persist for a command, and the reply the caller gets once they are written."""

    events: tuple[Any, ...] = ()
    reply: Any = None


def persist(*events: Any, reply: Any = None) -> Effect:
    """``return persist(ItemAdded(...), reply="ok")`` from a command handler."""
    return Effect(events, reply)


class EntityType(Generic[S]):
    """What an entity type declares whatever its handlers take (:class:`Entity`, and the replicated one of
    :mod:`pgjournal.entity.replicated`): its name, initial state, snapshot format and JSON types."""

    #: The entity type: the text before the first ``|`` of every persistence id of this entity.
    name: ClassVar[str]
    #: The state of an entity with no events (copied for each new entity).
    initial_state: ClassVar[Any] = None
    #: Bump when the snapshot format changes: snapshots of another version are ignored (full replay).
    snapshot_version: ClassVar[int] = 1
    #: Dataclasses (events, state) the repository registers as JSON under the manifest "{name}.{class name}".
    types: ClassVar[Sequence[type]] = ()
    #: Tags written with every event of this entity type.
    tags: ClassVar[Sequence[str]] = ()

    def new_state(self) -> S:
        state: S = copy.deepcopy(self.initial_state)
        return state

    def to_snapshot(self, state: S) -> Any:
        """What is stored as the snapshot of ``state`` (default: the state itself, via the serializers)."""
        return state

    def from_snapshot(self, data: Any) -> S:
        """The state stored by :meth:`to_snapshot`."""
        return data  # type: ignore[no-any-return]


class Entity(EntityType[S]):
    """Base class of an event-sourced entity type.

    Set ``name`` (the entity type: the persistence id is ``f"{name}|{entity_id}"``) and
    ``initial_state``; implement :meth:`handle` and :meth:`apply`. States are values: never change one in
    place (frozen dataclasses, tuples and ``dataclasses.replace`` make that natural), because commands
    queued for one entity are decided one after the other on the same state objects, and the repository
    caches them. One instance serves all entities of the type from many threads: keep it stateless.
    """

    def handle(self, state: S, command: Any) -> Effect | Sequence[Any] | None:
        """Validate ``command`` against ``state``: return the events to persist or raise DomainError."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement handle(state, command)")

    def apply(self, state: S, event: Any) -> S:
        """The state after ``event``. Pure: no I/O, no validation (events are facts)."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement apply(state, event)")



def effect_of(entity: Entity[Any], command: Any, result: Any) -> Effect:
    """Normalise what a command handler returned."""
    if isinstance(result, Effect):
        return result
    if result is None:
        return Effect()
    if isinstance(result, list | tuple):
        return Effect(tuple(result))
    raise InvalidArgument(
        f"command handler of entity {entity.name!r} returned {type(result).__name__} {result!r} for "
        f"{type(command).__name__}; expected persist(*events, reply=...), a list of events, or None"
    )


def check_entity_name(entity: Entity[Any]) -> str:
    name = getattr(entity, "name", None)
    check_name(name, f"{type(entity).__qualname__}.name (the entity type)")
    if "|" in name:  # type: ignore[operator]
        raise InvalidArgument(f"{type(entity).__qualname__}.name must not contain '|' (it separates the entity "
                              f"type from the entity id in the persistence id), got {name!r}")
    return name  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class CommandResult(Generic[S]):
    """The outcome of a command whose events (if any) are written."""

    entity_id: str
    reply: Any
    #: The state after the events; treat as read-only.
    state: S
    #: The entity's highest sequence number after the command (unchanged for a read-only command).
    seq_nr: int
    #: The events this command persisted (empty for a read-only command).
    events: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Recovered(Generic[S]):
    """An entity's state read from the journal."""

    state: S
    seq_nr: int
    #: Sequence number of the snapshot recovery started from, ``None`` when it replayed from the start.
    snapshot_seq_nr: int | None = None
    #: Events replayed after the snapshot.
    replayed: int = 0
