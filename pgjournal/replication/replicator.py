"""The replicator: one stream per (peer, entity type), each an :class:`~replication.processor.EventProcessor` that
reads the peer's journal by slices and writes each event of a replica ``Type|entityId|peer`` into this
location's replica ``Type|entityId|local`` (docs/replication.md, section 4).

It takes every event the peer holds, whatever its origin, and drops what the local replica has seen (its origin
is this location, or its origin sequence number is at most the highest one held from that origin): that keeps
each replica's persistence id a causal log with three locations or more. Per batch, in one transaction at this
location: the replicas written are locked (the streams from different peers take turns), the seen rows and each
replica's last event read, the arrival rule applied (:func:`pgjournal.model.replication.arrival`: the merged vector
and the concurrent flag decided once, here, the flag against the origin's vector, which is stored beside the
metadata when it is not the stored one, 40 / ``DA``, so relays pass it on), the events appended with the next
sequence numbers (payload and tags copied as stored, never decoded), the seen rows raised and the stream's
offsets stored.

A local writer of the same replica that does not take the lock is met by the journal's key: an append that lost
the race for a sequence number fails. The batch is written from one savepoint (the replicas' last events read in
one statement, their events appended in one, through the dialect's ``batch_table``; the seen rows raised in one);
a race sends it back there, and each replica's events are then read and written again from a savepoint of its
own.

A filter (``accept``) decides, per event read, whether it comes here: it is applied where the batch is read, after
the runner has taken the event in order (so the stream's offsets pass it and the peer's persistence id stays
contiguous for the runner's validation) and before any write. A filtered event is recorded as seen, as if it had
arrived: the same origin event relayed by another peer is then dropped by the seen check whatever that stream's
filter says, and the hole it leaves in the origin's sequence numbers here is the seen rule's ordinary case (an
event is dropped when its origin sequence number is at most the highest held, not unless it is the next).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from pgjournal.aio import AsyncJournal
from pgjournal.codec import replicated as wire
from pgjournal.entity.replicated import check_writable
from pgjournal.errors import InvalidArgument, InvalidPersistenceId
from pgjournal.model.printable import printable_logger
from pgjournal.model.replication import (
    ReplicaState,
    ReplicatedEventMetadata,
    ReplicationId,
    VersionVector,
    event_metadata_columns,
    event_metadata_of,
    peer_row_metadata,
)
from pgjournal.model.replication import arrival as arrival_rule
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.projections.handlers import ProjectionSettings
from pgjournal.runtime.steps import Pipelined, Statement, Step, arun, first_of, run, statement
from pgjournal.store import replication as sql
from pgjournal.validation import check_name, load_attribute

from .processor import EventProcessor, Stored, append_events_step, append_many_with_metadata_step

if TYPE_CHECKING:
    from pgjournal.codec.replicated import MetadataEntry
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal
    from pgjournal.model.envelope import EventEnvelope
    from pgjournal.projections.workers import Worker

log = printable_logger("pgjournal.replication")

#: Attempts of one replica's part of a batch when a local writer took its next sequence number meanwhile.
RACE_ATTEMPTS = 20
SAVEPOINT = "pgjournal_replica"
#: A batch is written once no event has come from the peer for this long (seconds), or after ``max_wait``, or at
#: ``max_count``: what one poll of the peer read goes at once, while a catch-up's batches still fill.
IDLE_WAIT = 0.002


def stream_name(peer: str, entity_type: str) -> str:
    """The projection name of the stream from ``peer`` for ``entity_type`` (its offsets and leases at this
    location)."""
    return f"replication|{peer}|{entity_type}"


def writer_of(peer: str) -> str:
    """The ``writer`` of the events a stream from ``peer`` appends (status counts them by it)."""
    return f"replication:{peer}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """What a replication filter decides on: one event read from the peer, before anything is written here.

    ``envelope`` is the peer's row (its persistence id ``Type|entityId|peer``, its tags, the payload as stored,
    a :class:`~replication.processor.Stored`, not decoded); ``metadata`` the origin's facts. A filter should decide
    on what every copy of the event shares (the origin, the entity, the tags, the payload), not on the peer that
    relays it, so that every stream into this location answers alike."""

    envelope: EventEnvelope
    metadata: ReplicatedEventMetadata
    #: The peer the event is read from, and this location.
    peer: str
    local: str

    @property
    def origin_replica(self) -> str:
        return self.metadata.origin_replica

    @property
    def entity_type(self) -> str:
        return ReplicationId.parse(self.envelope.persistence_id).type_name

    @property
    def entity_id(self) -> str:
        return ReplicationId.parse(self.envelope.persistence_id).entity_id

    @property
    def tags(self) -> frozenset[str]:
        return frozenset(self.envelope.tags or ())


#: A replication filter: ``True`` to bring the event here, ``False`` to leave it out (recorded as seen).
ReplicationFilter = Callable[[Candidate], bool]

#: The tag of :func:`location_private`'s events.
PRIVATE_TAG = "location-private"


def location_private(tag: str = PRIVATE_TAG) -> ReplicationFilter:
    """A filter that leaves out the events tagged ``tag``: written with it, an event stays in the location where it
    was written (every other location's streams refuse it, from its origin and from any relay)."""
    name = check_name(tag, "tag")

    def accept(candidate: Candidate) -> bool:
        return name not in candidate.tags

    accept.__qualname__ = f"location_private({name!r})"
    return accept


def load_filter(spec: str) -> ReplicationFilter:
    """``module:attribute`` to the filter it names: a :data:`ReplicationFilter`, or a function without arguments
    that returns one (as :func:`location_private`)."""
    found = load_attribute(spec, "the replication filter")
    loaded: ReplicationFilter = location_private() if found is location_private else found
    return loaded


@dataclass(frozen=True, slots=True)
class Arrival:
    """An event read from the peer, as the arrival rule needs it."""

    target: str
    envelope: EventEnvelope
    metadata: ReplicatedEventMetadata
    #: The vector the event had at its origin (carried beside the metadata, 40 / ``DA``, by relays).
    origin_version: VersionVector
    #: Other metadata of the row, kept as it is.
    others: tuple[MetadataEntry, ...]
    #: Left out by the stream's filter: recorded as seen, not written.
    filtered: bool = False


@dataclass
class StreamStats:
    """What a stream did (since it was made), for tests and logs."""

    appended: int = 0
    seen: int = 0
    own: int = 0
    skipped: int = 0
    races: int = 0
    #: Left out by the filter (counted once per event read, a copy already seen included).
    filtered: int = 0


class Replicator:
    """The stream from ``peer_replica``'s journal ``peer`` into ``local_replica``'s journal ``local``, for
    ``entity_type``. ``peer`` is read only (a reader role there is enough). ``accept``: a
    :data:`ReplicationFilter`, applied to every event read (give every stream of a location the same one).
    A batch of at most ``max_count`` events is written ``idle_wait`` after the last event read (``None``: not
    before ``max_wait`` after its first), at most ``max_wait`` after its first."""

    def __init__(self, local: Journal | AsyncJournal, local_replica: str, peer: Journal | AsyncJournal,
                 peer_replica: str, entity_type: str, *,
                 max_count: int = 500, max_wait: float = 0.05, idle_wait: float | None = IDLE_WAIT,
                 settings: ProjectionSettings | None = None,
                 accept: ReplicationFilter | None = None) -> None:
        if accept is not None and not callable(accept):
            raise InvalidArgument(f"accept must be a function of a Candidate returning a bool, got {accept!r}")
        self.accept = accept
        self.local_replica = ReplicationId("T", "e", local_replica).replica_id
        self.peer_replica = ReplicationId("T", "e", peer_replica).replica_id
        if self.local_replica == self.peer_replica:
            raise InvalidArgument(f"a replica does not replicate from itself ({local_replica!r})")
        self.entity_type = ReplicationId(check_name(entity_type, "entity type"), "e", local_replica).type_name
        self.local = local
        self.writer = writer_of(self.peer_replica)
        self.stats = StreamStats()
        process = self.aprocess if isinstance(local, AsyncJournal) else self.process
        self.processor = EventProcessor(local, peer, stream_name(self.peer_replica, self.entity_type),
                                        self.entity_type, process, as_stored=True, max_count=max_count,
                                        max_wait=max_wait, idle_wait=idle_wait, settings=settings)

    # -- running -------------------------------------------------------------------------------------

    def run_range(self, min_slice: int = 0, max_slice: int = 1023) -> Any:
        """The stream over one slice range on a daemon thread (no leases); ``stop()`` and ``join()`` it."""
        return self.processor.run_range(min_slice, max_slice)

    def arun_range(self, min_slice: int = 0, max_slice: int = 1023) -> Any:
        """The asyncio face (both journals :class:`~pgjournal.aio.AsyncJournal`\\ s): the stream as a task."""
        return self.processor.arun_range(min_slice, max_slice)

    def worker(self, **lease: Any) -> Worker:
        return self.processor.worker(**lease)

    # -- a batch -------------------------------------------------------------------------------------

    def arrivals(self, envelopes: Sequence[EventEnvelope]) -> dict[str, list[Arrival]]:
        """The events of the batch for the local replicas, per target persistence id in the peer's order; the
        peer's own events of other persistence ids (not replicas of the peer) and this location's are left out."""
        out: dict[str, list[Arrival]] = {}
        targets: dict[str, str | None] = {}  # per persistence id of the peer: the local replica's, or None
        for env in envelopes:
            pid = env.persistence_id
            if pid not in targets:
                targets[pid] = self._target(pid)
            target = targets[pid]
            if target is None:
                self.stats.skipped += 1
                continue
            meta = env.metadata
            columns: tuple[int | None, str | None, bytes | None] = (
                (None, None, None) if meta is None else (meta.ser_id, meta.manifest, meta.payload))
            found, origin_version, kept = peer_row_metadata(*columns, self.peer_replica, env.seq_nr)
            if found.origin_replica == self.local_replica:
                self.stats.own += 1
                continue
            filtered = self.accept is not None and not self.accept(
                Candidate(env, found, self.peer_replica, self.local_replica))
            self.stats.filtered += filtered
            out.setdefault(target, []).append(Arrival(target, env, found, origin_version, kept, filtered))
        return out

    def _target(self, persistence_id: str) -> str | None:
        """The local replica of the peer's replica ``persistence_id``; ``None`` for any other persistence id."""
        try:
            rid = ReplicationId.parse(persistence_id)
        except InvalidPersistenceId:
            return None
        return rid.with_replica(self.local_replica).persistence_id if rid.replica_id == self.peer_replica else None

    def process_step(self, envelopes: Sequence[EventEnvelope]) -> Step[None]:
        """Every arrival of the batch appended or dropped, in the transaction of the connection it runs on (the
        processor's): one step for both faces (:meth:`process`, :meth:`aprocess`)."""
        arrivals = self.arrivals(envelopes)
        if not arrivals:
            return
        targets = sorted(arrivals)
        # Sent together (one round trip on the blocking face): in the batch's transaction they run in this order
        # as if sent one by one, so the seen rows and last events are read once the replicas' locks are held.
        lasts = last_events_statements(self.local, targets)
        recovering, _, seen_rows, *last_rows = yield Pipelined((
            statement(sql.is_recovering(self.local_replica)), statement(sql.lock(targets)),
            statement(sql.seen(targets)), *lasts))
        check_writable(recovering, self.local_replica)  # nothing arrives in a location that recovers (section 8)
        seen: dict[str, dict[str, int]] = {}
        for row in seen_rows:
            seen.setdefault(row.persistence_id, {})[row.origin_replica] = row.origin_seq_nr
        states = replica_states_from(self.local_replica, targets, seen, last_rows)
        # The whole batch from one savepoint; a local writer's race (rare: it would take the lock) sends it back
        # there, and each replica is then written from a savepoint of its own, its state read again.
        yield Statement(f"SAVEPOINT {SAVEPOINT}")
        try:
            written = []
            for target in targets:
                written.append((yield from self._append_step(target, arrivals[target], states[target])))
            yield from self._together_step(dict(zip(targets, written, strict=True)))
        except psycopg.errors.UniqueViolation:
            yield Statement(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            self.stats.races += 1
            for target in targets:
                yield from self._replica_step(target, arrivals[target], seen.get(target, {}))
        else:
            yield Statement(f"RELEASE SAVEPOINT {SAVEPOINT}")
            highest = {}
            for target, done in zip(targets, written, strict=True):
                self.stats.appended += done.appended
                self.stats.seen += done.dropped
                if done.highest:
                    highest[target] = done.highest
            if highest:
                yield statement(sql.record_seen(highest))
        self.processor.wrote(self.entity_type)

    def process(self, conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
        """The blocking processor's function."""
        run(self.process_step(envelopes), conn)

    async def aprocess(self, conn: psycopg.AsyncConnection, envelopes: Sequence[EventEnvelope]) -> None:
        """The asyncio processor's function."""
        await arun(self.process_step(envelopes), conn)

    def _replica_step(self, target: str, arrivals: list[Arrival], seen: dict[str, int]) -> Step[None]:
        for attempt in range(1, RACE_ATTEMPTS + 1):
            yield Statement(f"SAVEPOINT {SAVEPOINT}")
            try:
                state = yield from replica_state_step(self.local, self.local_replica, target, seen)
                done = yield from self._append_step(target, arrivals, state)
                yield from self._together_step({target: done})
            except psycopg.errors.UniqueViolation:
                yield Statement(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
                self.stats.races += 1
                if attempt == RACE_ATTEMPTS:
                    raise
                continue
            yield Statement(f"RELEASE SAVEPOINT {SAVEPOINT}")
            self.stats.appended += done.appended
            self.stats.seen += done.dropped
            if done.highest:
                yield statement(sql.record_seen({target: done.highest}))
            return

    def _append_step(self, target: str, arrivals: list[Arrival], state: ReplicaState) -> Step[_Written]:
        """The arrival rule over ``target``'s arrivals: events with tags, or into a JSONB ``meta_payload``, are
        appended here one by one; the others are left in :attr:`_Written.together` for :meth:`_together_step`."""
        done = _Written(first=state.seq_nr)
        # Without tags, and with a BYTEA meta_payload, the batch's arrivals go in one statement.
        together = "meta_payload" not in self.local.events.jsonb and not any(a.envelope.tags for a in arrivals)
        for arrival in arrivals:
            if arrival.filtered:
                meta = arrival.metadata
                if not state.has_seen(meta):  # seen from now on, so no other path brings it
                    state = ReplicaState(state.replica, state.seq_nr, state.version,
                                         {**state.seen, meta.origin_replica: meta.origin_sequence_nr})
                    done.highest[meta.origin_replica] = meta.origin_sequence_nr
                continue
            received = arrival_rule(state, arrival.metadata, arrival.origin_version)
            if received is None:
                done.dropped += 1
                continue
            after, stored = received.state, received.metadata
            beside = [] if received.origin_version == stored.version else [wire.MetadataEntry(
                wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR, received.origin_version.to_bytes())]
            ser_id, manifest, payload = event_metadata_columns(stored, (*beside, *arrival.others))
            event = arrival.envelope.event
            assert isinstance(event, Stored)
            if together:
                done.together.append((event, Stored(ser_id, manifest, payload)))
            else:
                [(seq_nr, _)] = yield from append_events_step(
                    self.local, target, [event], expected=state.seq_nr, metadata=Stored(ser_id, manifest, payload),
                    tags=arrival.envelope.tags, writer=self.writer)
                if seq_nr != after.seq_nr:
                    raise psycopg.errors.UniqueViolation(f"{target!r} got seq_nr {seq_nr}, not {after.seq_nr}")
            state = after
            done.highest[stored.origin_replica] = stored.origin_sequence_nr
            done.appended += 1
        return done

    def _together_step(self, written: dict[str, _Written]) -> Step[None]:
        """The arrivals :meth:`_append_step` left together, in one statement; a persistence id that did
        not get the next numbers lost a race (raised as the key's violation would be)."""
        appends = {target: (done.first, done.together) for target, done in written.items() if done.together}
        if not appends:
            return
        numbers = yield from append_many_with_metadata_step(self.local, appends, writer=self.writer)
        for target, (first, events) in appends.items():
            if numbers[target] != list(range(first + 1, first + len(events) + 1)):
                raise psycopg.errors.UniqueViolation(
                    f"{target!r} got seq_nrs {numbers[target][:3]}..., not from {first + 1}")


@dataclass
class _Written:
    """What the arrival rule made of one replica's arrivals in a batch."""

    #: The sequence number the events in :attr:`together` follow.
    first: int
    appended: int = 0
    dropped: int = 0
    #: The highest origin sequence number now held, per origin (the seen rows to raise).
    highest: dict[str, int] = field(default_factory=dict)
    #: Events (and their metadata) for one statement with the batch's other replicas.
    together: list[tuple[Stored, Stored]] = field(default_factory=list)


def replica_state_step(journal: JournalCore, replica: str, persistence_id: str,
                       seen: dict[str, int] | None = None) -> Step[ReplicaState]:
    """The state of the replica ``persistence_id`` of ``replica`` after its last event, read in the transaction
    of the connection the step runs on: that event's vector (``{replica: seq_nr}`` for one stored without
    replication metadata) and ``seen``."""
    slice_ = slice_for_persistence_id(persistence_id)
    last = yield from first_of(sql.last_event(journal.events.table(slice_), persistence_id, slice_))
    if last is None:
        return ReplicaState(replica, 0, VersionVector(), seen or {})
    return _state_after(replica, last, seen or {})


def last_events_statements(journal: JournalCore, persistence_ids: Sequence[str]) -> list[Statement]:
    """The statements reading the last event of each of ``persistence_ids``, one per ``batch_table``; their rows
    go to :func:`replica_states_from`."""
    by_table: dict[str, list[tuple[str, int]]] = {}
    for pid in persistence_ids:
        slice_ = slice_for_persistence_id(pid)
        by_table.setdefault(journal.events.batch_table(slice_), []).append((pid, slice_))
    return [statement(sql.last_events(table, [p for p, _ in of_table], [s for _, s in of_table]))
            for table, of_table in by_table.items()]


def replica_states_from(replica: str, persistence_ids: Sequence[str], seen: dict[str, dict[str, int]],
                        answers: Sequence[Sequence[sql.LastEvent]]) -> dict[str, ReplicaState]:
    """The state of each of ``persistence_ids`` (``seen``: theirs) from the rows of
    :func:`last_events_statements`, as :func:`replica_state_step` reads one."""
    states = {pid: ReplicaState(replica, 0, VersionVector(), seen.get(pid, {})) for pid in persistence_ids}
    for rows in answers:
        for last in rows:
            states[last.persistence_id] = _state_after(replica, last, seen.get(last.persistence_id, {}))
    return states


def _state_after(replica: str, last: sql.LastEvent, seen: dict[str, int]) -> ReplicaState:
    """The state after ``last``: its vector (``{replica: seq_nr}`` for one stored without replication metadata)
    and ``seen``."""
    meta: ReplicatedEventMetadata | None = None
    if last.meta_ser_id is not None and last.meta_payload is not None:
        meta = event_metadata_of(last.meta_ser_id, last.meta_ser_manifest, bytes(last.meta_payload))[0]
    version = meta.version if meta is not None else VersionVector({replica: last.seq_nr})
    return ReplicaState(replica, last.seq_nr, version, seen)


def replica_state(conn: psycopg.Connection, journal: JournalCore, replica: str, persistence_id: str,
                  seen: dict[str, int] | None = None) -> ReplicaState:
    """:func:`replica_state_step` on a blocking connection."""
    return run(replica_state_step(journal, replica, persistence_id, seen), conn)
