"""Replicated event-sourced entities: one entity written in several locations (replicas) at once.

::

    class Votes(ReplicatedEntity[PNCounter]):
        name = "Votes"
        replicas = ("eu", "us")
        initial_state = PNCounter()

        def handle(self, state, command, context):
            return persist({"delta": command})

        def apply(self, state, event, context):
            return state.update(context.origin_replica, event["delta"])

    votes = ReplicatedRepository(journal, Votes, replica="eu")
    votes.handle("poll-1", 1).state.state.value  # 1

Each replica of entity ``e`` is the persistence id ``Type|e|replica`` (Akka's ``ReplicationId``) in its location's
journal. A command's events are written there with Akka's ``ReplicatedEventMetadata`` (origin: this replica,
the vector with this replica's entry set to the event's sequence number, not concurrent), in the ``meta_*``
columns as Akka R2DBC stores them. Events written elsewhere reach the replica's persistence id through
:func:`apply_replicated` (the replicator's write), with the arrival's vector and concurrent flag; recovery replays
the persistence id, so the event handler sees every event, local or not, with a :class:`ReplicationContext`.

The repository is :class:`~pgjournal.entity.repository.RepositoryRules`' command loop (mailbox, batching,
optimistic concurrency, unknown outcomes, breaker) over a state that carries the replica's
:class:`~pgjournal.model.replication.ReplicaState` beside the entity's: an event that arrived meanwhile makes the
next append conflict, and the command is decided again on the state that includes it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import psycopg

from pgjournal.codec.replicated import MetadataEntry
from pgjournal.entity.aio import AsyncEntityRepository
from pgjournal.entity.crdt import Dot
from pgjournal.entity.errors import ConflictRetriesExhausted
from pgjournal.entity.model import Effect, Entity, EntityType, Recovered, check_entity_name
from pgjournal.entity.recovery import snapshot_metadata
from pgjournal.entity.repository import EntityRepository, RepositoryRules
from pgjournal.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    InvalidArgument,
    LocationRecovering,
    NotSeenInTime,
    SerializationError,
    WriteOutcomeUnknown,
)
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.printable import printable_logger
from pgjournal.model.replication import (
    Arrival,
    Ordering,
    ReplicaState,
    ReplicatedComposite,
    ReplicatedEventMetadata,
    ReplicatedSnapshotMetadata,
    ReplicationId,
    VersionVector,
    arrival,
    register_replication_serializers,
    split_metadata,
)
from pgjournal.query.by_pid import ByPersistenceId
from pgjournal.runtime.steps import Call, Sleep, Step, arun, run, statement
from pgjournal.store import replication as sql

if TYPE_CHECKING:
    from pgjournal.aio import AsyncJournal
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal

S = TypeVar("S")
_log = printable_logger("pgjournal.entity")


@dataclass(frozen=True, slots=True)
class ReplicationContext:
    """What the event handler learns of an event (Akka's ``ReplicationContext``): this replica, all replicas, the
    event's origin and sequence number there, whether it was concurrent with this replica's state when it arrived
    (decided once and stored), and whether the entity is recovering."""

    replica_id: str
    all_replicas: frozenset[str]
    origin_replica: str
    origin_sequence_nr: int
    concurrent: bool
    recovering: bool
    #: The event's sequence number in this replica's persistence id.
    seq_nr: int
    #: This replica's vector after the event.
    version: VersionVector
    #: The vector the event was written with at its origin: what it had seen. For a
    #: :class:`~pgjournal.entity.crdt.ConcurrentVersions` update (the replica's own vector has merged in what this
    #: replica held, so it would seem to have seen the local versions).
    origin_version: VersionVector

    @property
    def from_here(self) -> bool:
        """Whether the event was written by this replica."""
        return self.origin_replica == self.replica_id

    @property
    def dot(self) -> Dot:
        """The event's identity across replicas, (origin replica, origin sequence number): an
        :class:`~pgjournal.entity.crdt.ORSet` addition's dot."""
        return Dot(self.origin_replica, self.origin_sequence_nr)


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What the command handler learns: this replica, all replicas, and the replica's sequence number and vector
    the command is decided on."""

    replica_id: str
    all_replicas: frozenset[str]
    seq_nr: int
    version: VersionVector


@dataclass(frozen=True, slots=True)
class Replicated(Generic[S]):
    """A replicated entity's state: the entity's own (``state``) and the replica's (its vector and what it has
    seen of each other replica)."""

    state: S
    replica: ReplicaState

    @property
    def version(self) -> VersionVector:
        """The replica's vector: what another location must have seen to have seen this state (read-your-writes)."""
        return self.replica.version


class ReplicatedEntity(EntityType[S]):
    """Base class of a replicated entity type: :class:`~pgjournal.entity.Entity`'s settings, with ``replicas`` (every
    replica id) and handlers that take a context.

    ``apply`` must give the same state whatever the order of concurrent events (each replica applies them in its
    own order): build the state of :mod:`pgjournal.entity.crdt` values, or keep conflicting writes as
    :class:`~pgjournal.entity.crdt.ConcurrentVersions` for a later command to resolve.
    """

    #: The entity type: the persistence id of a replica is ``f"{name}|{entity_id}|{replica}"``.
    name: ClassVar[str]
    #: Every replica id (the locations that write this entity type).
    replicas: ClassVar[Sequence[str]] = ()

    def handle(self, state: S, command: Any, context: CommandContext) -> Effect | Sequence[Any] | None:
        """Validate ``command`` against ``state``: return the events to persist or raise DomainError."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement handle(state, command, context)")

    def apply(self, state: S, event: Any, context: ReplicationContext) -> S:
        """The state after ``event`` (local or replicated). Pure; see the class's note on order."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement apply(state, event, context)")


def _check_replicas(entity: ReplicatedEntity[Any], replica: Any) -> frozenset[str]:
    name = f"{type(entity).__qualname__}.replicas"
    replicas = entity.replicas
    if isinstance(replicas, str) or not isinstance(replicas, Sequence | frozenset | set) or not replicas:
        raise ConfigurationError(f"{name} must list the replica ids (a tuple of strings), got {replicas!r}")
    for each in replicas:
        if not isinstance(each, str) or not each or "|" in each:
            raise ConfigurationError(f"{name} must hold non-empty replica ids without '|', got {each!r}")
    if replica not in replicas:
        raise ConfigurationError(f"replica must be one of {name} {sorted(replicas)!r}, got {replica!r}")
    return frozenset(replicas)


def _context(replica: ReplicaState, replicas: frozenset[str], metadata: ReplicatedEventMetadata,
             origin: VersionVector, *, recovering: bool) -> ReplicationContext:
    return ReplicationContext(replica.replica, replicas, metadata.origin_replica, metadata.origin_sequence_nr,
                              metadata.concurrent, recovering, replica.seq_nr, replica.version, origin)


class _Adapter(Entity[Replicated[Any]]):
    """A replicated entity as the repository's :class:`Entity`, for one replica: its state is :class:`Replicated`,
    and applying a command's event is the local-write rule."""

    def __init__(self, entity: ReplicatedEntity[Any], replica: str, replicas: frozenset[str]) -> None:
        self.entity = entity
        self.replica = replica
        self.replicas = replicas
        for setting in ("name", "snapshot_version", "types", "tags"):
            setattr(self, setting, getattr(entity, setting, getattr(Entity, setting, None)))

    def handle(self, state: Replicated[Any], command: Any) -> Effect | Sequence[Any] | None:
        context = CommandContext(self.replica, self.replicas, state.replica.seq_nr, state.replica.version)
        return self.entity.handle(state.state, command, context)

    def apply(self, state: Replicated[Any], event: Any) -> Replicated[Any]:
        replica, metadata = state.replica.write_local()
        context = _context(replica, self.replicas, metadata, metadata.version, recovering=False)
        return Replicated(self.entity.apply(state.state, event, context), replica)

    def replay(self, state: Replicated[Any], envelope: EventEnvelope) -> Replicated[Any]:
        """The state after a stored event, in recovery."""
        metadata, origin = split_metadata(envelope.metadata)
        replica = state.replica.replay(envelope.seq_nr, metadata)
        if metadata is None:  # written before the entity was replicated: a local event
            metadata = ReplicatedEventMetadata(self.replica, envelope.seq_nr, replica.version, False)
        context = _context(replica, self.replicas, metadata, origin or replica.version, recovering=True)
        return Replicated(self.entity.apply(state.state, envelope.event, context), replica)

    def new_state(self) -> Replicated[Any]:
        return Replicated(self.entity.new_state(), ReplicaState(self.replica))

    def to_snapshot(self, state: Replicated[Any]) -> Any:
        return self.entity.to_snapshot(state.state)


def _replay_step(journal: JournalCore, pid: str, initial: Replicated[Any], adapter: _Adapter | None
                 ) -> Step[tuple[Replicated[Any], int, int]]:
    """Replay ``pid`` after ``initial`` (its replica's seq_nr: 0, or a snapshot's): the state (``adapter`` None:
    the replica's alone), the highest sequence number and the number of events replayed, page by page."""
    reader = ByPersistenceId(journal)  # type: ignore[arg-type]  # its steps only
    highest = yield Call(journal.highest_seq_nr, (pid,))  # type: ignore[attr-defined]
    state, replayed, start = initial, 0, initial.replica.seq_nr + 1
    while start <= highest:
        page = yield Call(journal.run, (reader.page_step(pid, start, highest),))  # type: ignore[attr-defined]
        if not page:
            break
        for envelope in page:
            if adapter is not None:
                state = adapter.replay(state, envelope)
            else:
                metadata, _ = split_metadata(envelope.metadata)
                state = Replicated(None, state.replica.replay(envelope.seq_nr, metadata))
        replayed += len(page)
        start = page[-1].seq_nr + 1
    if state.replica.seq_nr < highest:  # the last events were deleted: their numbers stay taken
        state = Replicated(state.state, dataclasses.replace(state.replica, seq_nr=highest))
    return state, highest, replayed


def replica_state_step(journal: JournalCore, replication_id: ReplicationId) -> Step[ReplicaState]:
    """The replica's :class:`~pgjournal.model.replication.ReplicaState` as stored (its vector, the highest origin
    sequence number it holds per other replica), replayed from its events' metadata."""
    register_replication_serializers(journal.serializers)
    state, _, _ = yield from _replay_step(journal, replication_id.persistence_id,
                                          Replicated(None, ReplicaState(replication_id.replica_id)), None)
    return state.replica


def apply_replicated_step(journal: JournalCore, envelope: EventEnvelope, replica: str, *,
                          max_conflict_retries: int = 20) -> Step[Arrival | None]:
    """:func:`apply_replicated` as a step, for either face."""
    metadata, origin = split_metadata(envelope.metadata)
    if metadata is None:
        raise InvalidArgument(f"event {envelope.persistence_id!r} seq_nr {envelope.seq_nr} carries no replicated "
                              f"event metadata (got {type(envelope.metadata).__name__}): it cannot be replicated")
    target = ReplicationId.parse(envelope.persistence_id).with_replica(replica)
    for _ in range(max_conflict_retries + 1):
        state = yield from replica_state_step(journal, target)
        arrived = arrival(state, metadata, origin)
        if arrived is None:
            return None
        try:
            yield Call(journal.append, (target.persistence_id, [envelope.event]),  # type: ignore[attr-defined]
                       {"expected_seq_nr": state.seq_nr, "tags": envelope.tags, "metadata": arrived.stored})
        except ConcurrencyConflict:
            continue  # a local write or another arrival took the number: decide again on the new state
        return arrived
    raise ConflictRetriesExhausted(target.persistence_id, state.seq_nr + 1, max_conflict_retries + 1, None)


def apply_replicated(journal: Journal, envelope: EventEnvelope, replica: str) -> Arrival | None:
    """Write an event read from another replica's persistence id (``envelope``, with its replicated metadata) into
    ``replica``'s persistence id of the same entity, as the replicator does: ``None`` when the replica has seen
    it (nothing written), else the :class:`~pgjournal.model.replication.Arrival`: the metadata stored (the merged
    vector, the concurrent flag decided now against the origin's vector) and the replica's state after it.
    The event's payload is written as the registry serializes ``envelope.event``, its tags kept. A conflict with a
    local write or another arrival decides again."""
    return journal.run(apply_replicated_step(journal, envelope, replica))


async def aapply_replicated(journal: AsyncJournal, envelope: EventEnvelope, replica: str) -> Arrival | None:
    """:func:`apply_replicated`, awaited."""
    return await journal.run(apply_replicated_step(journal, envelope, replica))


def replica_version_step(journal: JournalCore, replication_id: ReplicationId) -> Step[VersionVector]:
    """The replica's version vector now: its last event's (an event without replication metadata counts as
    ``{replica: seq_nr}``, as in recovery), empty for a replica with no event."""
    pid = replication_id.persistence_id
    register_replication_serializers(journal.serializers)
    highest = yield Call(journal.highest_seq_nr, (pid,))  # type: ignore[attr-defined]
    if highest == 0:
        return VersionVector()
    page = yield Call(journal.run, (ByPersistenceId(journal).page_step(pid, highest, highest),))  # type: ignore
    if not page:  # the last event was deleted: only the whole replay knows the vector
        return (yield from replica_state_step(journal, replication_id)).version
    metadata, _ = split_metadata(page[-1].metadata)
    return metadata.version if metadata is not None else VersionVector({replication_id.replica_id: highest})


def _check_timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {value!r}")
    return float(value)


def wait_for_version_step(journal: JournalCore, replication_id: ReplicationId, version: VersionVector,
                          timeout: float) -> Step[VersionVector]:
    """:func:`wait_for_version` as a step, for either face."""
    if not isinstance(replication_id, ReplicationId):
        raise InvalidArgument(f"replication_id must be a ReplicationId, got {replication_id!r}")
    if not isinstance(version, VersionVector):
        raise InvalidArgument(f"version must be a VersionVector, got {version!r}")
    limit = _check_timeout(timeout)
    deadline = time.monotonic() + limit
    pause = 0.01
    while True:
        seen = yield from replica_version_step(journal, replication_id)
        if version.compare(seen) in (Ordering.BEFORE, Ordering.SAME):
            return seen
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotSeenInTime(
                f"replica {replication_id.persistence_id!r} had not seen {version!r} within {limit}s: its vector is "
                f"{seen!r}", waited_for=version, seen=seen, timeout=limit)
        yield Sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def wait_for_version(journal: Journal, replication_id: ReplicationId, version: VersionVector, *,
                     timeout: float) -> VersionVector:
    """Read-your-writes across locations: wait until ``replication_id``'s replica (in ``journal``, this location's)
    holds everything ``version`` covers (the ``state.version`` a command returned in another location: its vector is
    the same or after it), at most ``timeout`` seconds, polling. Returns the replica's vector then; raises
    :class:`~pgjournal.errors.NotSeenInTime` (``waited_for``, ``seen``) otherwise."""
    return journal.run(wait_for_version_step(journal, replication_id, version, timeout))


async def await_for_version(journal: AsyncJournal, replication_id: ReplicationId, version: VersionVector, *,
                            timeout: float) -> VersionVector:
    """:func:`wait_for_version`, awaited."""
    return await journal.run(wait_for_version_step(journal, replication_id, version, timeout))


def writable_step(replica: str) -> Step[None]:
    """In a write's transaction, before it appends to a replica of ``replica``: raise
    :class:`~pgjournal.errors.LocationRecovering` while the location recovers from its peers (its marker row is in,
    docs/replication.md section 8). A recovery, once its marker is in, waits for every transaction in progress, so a
    write that read no marker has ended before the recovery reads anything, and every later write sees it."""
    check_writable((yield statement(sql.is_recovering(replica))), replica)


def check_writable(rows: list[Any], replica: str) -> None:
    """:func:`writable_step`'s rule over the rows of its statement (``sql.is_recovering(replica)``), for a step
    that sends it with others."""
    if rows and rows[0]:
        raise LocationRecovering(f"replica {replica!r} is recovering its events from its peers (restored from a "
                                 "backup): no write before the recovery ends ('pgjournal replication recover' "
                                 "finishes one that stopped)", replica=replica)


class ReplicatedRules(RepositoryRules[Replicated[S]]):
    """What both faces' replicated repositories share over :class:`RepositoryRules`: the replica's persistence
    ids, recovery from the events' metadata, and each event appended with its own metadata.

    ``replica``: this location's replica id, one of the entity's ``replicas``. A snapshot stores Akka's
    ``ReplicatedSnapshotMetadata`` (the vector and what was seen of each replica) as its metadata's first entry
    (34 / ``M``), the entity type and ``snapshot_version`` beside it; recovery starts from the latest usable one."""

    def __init__(self, journal: JournalCore, entity: ReplicatedEntity[S] | type[ReplicatedEntity[S]], *,
                 replica: str, snapshot_every: int | None = None, **settings: Any) -> None:
        user = entity() if isinstance(entity, type) else entity
        if not isinstance(user, ReplicatedEntity):
            raise ConfigurationError(f"a replicated repository takes a ReplicatedEntity, got {type(user).__name__}")
        replicas = _check_replicas(user, replica)
        self.replica = replica
        self.replicas = replicas
        adapter = _Adapter(user, replica, replicas)
        check_entity_name(adapter)
        register_replication_serializers(journal.serializers)
        super().__init__(journal, adapter, snapshot_every=snapshot_every, **settings)
        self._adapter = adapter

    def persistence_id(self, entity_id: str) -> str:
        if not isinstance(entity_id, str) or not entity_id:
            raise InvalidArgument(f"entity id of {self.name!r} must be a non-empty string, got {entity_id!r}")
        return ReplicationId(self.name, entity_id, self.replica).persistence_id

    def replication_id(self, entity_id: str) -> ReplicationId:
        return ReplicationId.parse(self.persistence_id(entity_id))

    def _recover_step(self, pid: str) -> Step[Recovered[Replicated[S]]]:
        snapshot = yield from self._snapshot_step(pid)
        initial = snapshot if snapshot is not None else self._adapter.new_state()
        state, highest, replayed = yield from _replay_step(self.journal, pid, initial, self._adapter)
        return Recovered(state, max(highest, state.replica.seq_nr),
                         snapshot.replica.seq_nr if snapshot is not None else None, replayed)

    def _snapshot_metadata(self, pid: str, state: Replicated[S]) -> Any:
        # Akka's ReplicatedSnapshotMetadata first (Akka reads it), then the entity type and snapshot version that
        # recovery checks, as the registry stores that dict.
        check = self.journal.serializers.serialize(snapshot_metadata(self._adapter), persistence_id=pid)
        return ReplicatedComposite(state.replica.snapshot_metadata(),
                                   (MetadataEntry(check.ser_id, check.manifest, check.payload),))

    def _snapshot_step(self, pid: str) -> Step[Replicated[S] | None]:
        """The state of the latest usable snapshot (``None``: replay from the start). A snapshot of another entity
        type or version, without replication metadata (an Akka snapshot with no version of ours to check), or
        one that does not decode is ignored with a warning: a stale snapshot costs time, never correctness."""
        try:
            selected = yield Call(self.journal.load_snapshot, (pid,))
        except SerializationError as exc:
            _log.warning("ignoring the snapshot of %r: %s; replaying all events", pid, exc)
            return None
        if selected is None:
            return None
        wanted = snapshot_metadata(self._adapter)
        metadata = selected.metadata
        found: Any = None
        if isinstance(metadata, ReplicatedComposite) and isinstance(metadata.metadata, ReplicatedSnapshotMetadata):
            for entry in metadata.others:
                try:
                    found = self.journal.serializers.deserialize(entry.ser_id, entry.manifest, entry.payload,
                                                                 persistence_id=pid)
                except SerializationError:
                    continue
                if found == wanted:
                    break
        if found != wanted:
            _log.warning("ignoring the snapshot of %r at seq_nr %d: its metadata is %r, this entity reads %r; "
                         "replaying all events", pid, selected.seq_nr, metadata, wanted)
            return None
        try:
            state = self._adapter.entity.from_snapshot(selected.snapshot)
        except Exception as exc:
            _log.warning("ignoring the snapshot of %r at seq_nr %d: from_snapshot failed (%s: %s); replaying all "
                         "events", pid, selected.seq_nr, exc.__class__.__name__, exc)
            return None
        assert isinstance(metadata, ReplicatedComposite) and isinstance(metadata.metadata, ReplicatedSnapshotMetadata)
        return Replicated(state, ReplicaState.from_snapshot(self.replica, selected.seq_nr, metadata.metadata))

    def _append_call(self, pid: str, events: tuple[Any, ...], expected: int, before: Any = None) -> Call:
        replica: ReplicaState = before.replica
        if replica.seq_nr != expected:  # the rule the loop keeps: the state is that of the stream at ``expected``
            raise AssertionError(f"replica state at seq_nr {replica.seq_nr}, appending after {expected}")
        metadata = []
        for _ in events:  # the same rule, in the same order, as the adapter's apply
            replica, each = replica.write_local()
            metadata.append(each)
        return Call(self._append_each, (pid, events, tuple(metadata), expected))

    def _append_each(self, pid: str, events: tuple[Any, ...], metadata: tuple[ReplicatedEventMetadata, ...],
                     expected: int) -> Any:
        raise NotImplementedError

    @staticmethod
    def _outcome_unknown(pid: str, count: int, expected: int, exc: psycopg.OperationalError) -> WriteOutcomeUnknown:
        """A connection lost around the transaction of a command's events (its commit included): they may be
        written. The command loop finds out as for an append (:meth:`_settle_unknown_step`)."""
        unknown = WriteOutcomeUnknown(f"the connection was lost while the transaction appending {count} event(s) to "
                                      f"{pid!r} after sequence number {expected} ended: they may or may not be "
                                      f"written ({' '.join(str(exc).split()) or exc.__class__.__name__})")
        unknown.__cause__ = exc
        return unknown


class ReplicatedRepository(ReplicatedRules[S], EntityRepository[Replicated[S]]):
    """Commands in, events persisted with their replication metadata, replies out, for one replicated entity type
    in one replica. ``ReplicatedRepository(journal, Cart, replica="eu")``; other settings: see
    :class:`~pgjournal.entity.repository.RepositoryRules`. ``handle`` returns a
    :class:`~pgjournal.entity.CommandResult` whose ``state`` is a :class:`Replicated`."""

    journal: Journal

    def _append_each(self, pid: str, events: tuple[Any, ...], metadata: tuple[ReplicatedEventMetadata, ...],
                     expected: int) -> Any:
        # One event per append, each with its own metadata, in one transaction (all or nothing, as one append)
        # that first checks the location is not recovering.
        try:
            with self.journal.transaction() as tx:
                run(writable_step(self.replica), tx.connection)
                for offset, (event, meta) in enumerate(zip(events, metadata, strict=True)):
                    tx.append(pid, [event], expected_seq_nr=expected + offset, tags=self._tags, metadata=meta)
        except psycopg.OperationalError as exc:
            raise self._outcome_unknown(pid, len(events), expected, exc) from exc
        return None


class AsyncReplicatedRepository(ReplicatedRules[S], AsyncEntityRepository[Replicated[S]]):
    """:class:`ReplicatedRepository` on an :class:`~pgjournal.aio.AsyncJournal`."""

    journal: AsyncJournal

    async def _append_each(self, pid: str, events: tuple[Any, ...],
                           metadata: tuple[ReplicatedEventMetadata, ...], expected: int) -> Any:
        try:
            async with self.journal.transaction() as tx:
                await arun(writable_step(self.replica), tx.connection)
                for offset, (event, meta) in enumerate(zip(events, metadata, strict=True)):
                    await tx.append(pid, [event], expected_seq_nr=expected + offset, tags=self._tags, metadata=meta)
        except psycopg.OperationalError as exc:
            raise self._outcome_unknown(pid, len(events), expected, exc) from exc
        return None


__all__ = [
    "AsyncReplicatedRepository",
    "CommandContext",
    "Replicated",
    "ReplicatedEntity",
    "ReplicatedRepository",
    "ReplicationContext",
    "aapply_replicated",
    "apply_replicated",
    "apply_replicated_step",
    "await_for_version",
    "check_writable",
    "replica_state_step",
    "replica_version_step",
    "wait_for_version",
    "wait_for_version_step",
    "writable_step",
]
