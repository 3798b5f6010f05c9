"""Disaster recovery of a location from its peers (docs/replication.md, section 8).

A location restored from an old backup has lost the tail of its replicas: its own events after the backup, which
its peers hold, and the events it had received from them. A new local write would take a sequence number that the
lost events had, so an origin sequence number the peers have seen already: they would drop it as seen. So:

1. the location is marked recovering (a row of ``replication_seen``), and the recovery waits for every
   transaction then in progress (a write that read no marker ends first): from then on the replicated
   repositories and the replicator's streams refuse to write here (:class:`~pgjournal.errors.LocationRecovering`),
   and a crash leaves the mark;
2. each replica is rebuilt from the peers' copies: its own events at their own sequence numbers with their own
   vectors (the copies carry the origin's vector), and between them the events of other origins that vector says
   came before each, in a causal order, with the arrival rule; up to the latest own event any peer holds, and on
   as far as any peer's stream from here has read this replica (so the next event written here has a sequence
   number no peer's offsets count as read already, and what a peer has read at a position is what it holds);
3. the mark is removed; the streams start again (their seen check drops what the peers send again).

Every replica is rebuilt in one transaction, so recovery can be run again after a failure or a crash: a replica
done already is left as it is. Every peer must answer (the latest own event is the latest *any* of them holds).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgjournal.codec import replicated as wire
from pgjournal.entity.replicated import replica_state_step
from pgjournal.errors import InvalidArgument, RecoveryFailed
from pgjournal.model.printable import printable_logger
from pgjournal.model.replication import (
    ReplicaState,
    ReplicatedEventMetadata,
    ReplicationId,
    VersionVector,
    event_metadata_columns,
    peer_row_metadata,
)
from pgjournal.model.replication import arrival as arrival_rule
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.runtime.steps import Call, Sleep, Statement, Step, count_of, first_of, rows_of, statement
from pgjournal.store import replication as sql
from pgjournal.validation import check_name

from .processor import Stored, append_events_step
from .replicator import stream_name

if TYPE_CHECKING:
    from pgjournal.aio import AsyncJournal
    from pgjournal.codec.replicated import MetadataEntry
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal

log = printable_logger("pgjournal.replication.recovery")

#: Rows read per page of a peer's copy of a replica.
PAGE = 1000

Key = tuple[str, int]


def writer_of_recovery(peer: str) -> str:
    """The ``writer`` of the events recovery writes from ``peer``'s copy."""
    return f"recovery:{peer}"


@dataclass(frozen=True, slots=True)
class ReplicaRecovered:
    """One replica rebuilt: how many of its own events and of other origins' came back, from which peers' copies,
    and its sequence number after."""

    persistence_id: str
    own: int
    arrived: int
    seq_nr: int
    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :func:`recover` did: the replicas rebuilt (those that had lost nothing are not listed)."""

    replica: str
    replicas: tuple[ReplicaRecovered, ...]

    @property
    def events(self) -> int:
        return sum(r.own + r.arrived for r in self.replicas)


@dataclass(frozen=True, slots=True)
class _Copy:
    """An event of a peer's copy of the replica, as the rebuild needs it."""

    key: Key
    metadata: ReplicatedEventMetadata
    #: The vector it had at its origin (40 / ``DA`` beside the metadata, else the metadata's own).
    origin_version: VersionVector
    others: tuple[MetadataEntry, ...]
    event: Stored
    tags: list[str] | None
    peer: str


def _copy_of(row: sql.ReplicaRow, peer: str) -> _Copy:
    meta, origin, kept = peer_row_metadata(row.meta_ser_id, row.meta_ser_manifest,
                                           None if row.meta_payload is None else bytes(row.meta_payload), peer,
                                           row.seq_nr)
    return _Copy((meta.origin_replica, meta.origin_sequence_nr), meta, origin, kept,
                 Stored(row.ser_id, row.manifest, bytes(row.payload)), row.tags, peer)


def _copy_step(peer: JournalCore, peer_replica: str, rid: ReplicationId) -> Step[list[_Copy]]:
    """Every event of ``rid`` (a peer's replica) in its order, read page by page at the peer."""
    pid = rid.persistence_id
    slice_ = slice_for_persistence_id(pid)
    out: list[_Copy] = []
    after = 0
    while True:
        page = yield Call(peer.run, (rows_of(sql.replica_rows(peer.events.table(slice_), pid, slice_, after,  # type: ignore[attr-defined]
                                                              PAGE)),))
        out.extend(_copy_of(row, peer_replica) for row in page)
        if len(page) < PAGE:
            return out
        after = page[-1].seq_nr


@dataclass
class _Plan:
    """The events to append after the replica's last one, decided without I/O."""

    state: ReplicaState
    events: list[tuple[ReplicatedEventMetadata, tuple[MetadataEntry, ...], _Copy]]
    own: int = 0
    arrived: int = 0


def plan_replica(state: ReplicaState, copies: Mapping[str, Sequence[_Copy]], read: Mapping[str, int]) -> _Plan:
    """What to append to the replica in ``state`` (this location's, as restored) from the peers' ``copies`` of
    it: every own event the copies hold after the replica's last own one, each at its own sequence number with
    its own vector, and before each exactly the events that vector covers; then events of other origins up to the
    highest sequence number a peer's stream has ``read`` of the replica. The events of other origins are taken in
    a causal order (the fullest copy's), and a position a peer has read is given an event that peer holds."""
    replica = state.replica
    held = {p: {c.key for c in cs} for p, cs in copies.items()}
    pool: dict[Key, _Copy] = {}
    order: list[Key] = []
    for peer in sorted(copies, key=lambda p: (-len(copies[p]), p)):
        for copy in copies[peer]:
            if copy.key not in pool:
                pool[copy.key] = copy
                order.append(copy.key)
    own_before = state.version.version_at(replica)
    own = {k[1]: pool[k] for k in pool if k[0] == replica and k[1] > own_before}
    own_positions = sorted(own)
    if own_positions and own_positions[0] <= state.seq_nr:
        raise RecoveryFailed(f"the replica of {replica!r} holds other events at the sequence numbers of its own "
                             f"events the peers hold ({own_positions[0]} <= {state.seq_nr}): it is not an earlier "
                             "state of the replica the peers replicated")
    by_origin: dict[str, list[int]] = {}
    for origin, seq in sorted(k for k in pool if k[0] != replica):
        by_origin.setdefault(origin, []).append(seq)
    goal = max([*own_positions, *read.values(), state.seq_nr])
    plan = _Plan(state, [])

    def ready(s: ReplicaState, key: Key, limit: VersionVector | None) -> bool:
        origin, seq = key
        if origin == replica:
            return False
        held_from = s.seen.get(origin, 0)
        if seq <= held_from or (limit is not None and seq > limit.version_at(origin)):
            return False
        seqs = by_origin[origin]
        if seqs[bisect.bisect_right(seqs, held_from)] != seq:  # not the next one of its origin
            return False
        # Its causes are here: every entry of the vector it was written with, but its own.
        return all(v <= s.version.version_at(r) for r, v in pool[key].origin_version if r != origin)

    # The candidates in the fullest copy's order (causal), those held already left out; the first ready one that
    # fits is nearly always near the front.
    order = [k for k in order if k[0] != replica and k[1] > state.seen.get(k[0], 0)]
    s = state
    for position in range(state.seq_nr + 1, goal + 1):
        if position in own:
            copy = own[position]
            s, meta = s.write_local()
            if meta.version != copy.origin_version:
                raise RecoveryFailed(
                    f"cannot rebuild {copy.key[0]!r}'s event {position} of the replica: the peers' copies give it the "
                    f"vector {copy.origin_version!r}, the events before it here make {meta.version!r}")
            plan.events.append((meta, copy.others, copy))
            plan.own += 1
            continue
        following = bisect.bisect_right(own_positions, position)
        limit = own[own_positions[following]].origin_version if following < len(own_positions) else None
        required = [p for p, h in read.items() if h >= position and p in held]
        key = next((k for k in order if ready(s, k, limit) and all(k in held[p] for p in required)), None)
        if key is None:
            what = (f"the events before the own event {own_positions[following]}" if limit is not None
                    else f"position {position}, which peer(s) {sorted(required)} have read already")
            raise RecoveryFailed(f"cannot rebuild the replica of {replica!r} at sequence number {position}: the "
                                 f"peers' copies do not hold {what}")
        order.remove(key)
        copy = pool[key]
        received = arrival_rule(s, ReplicatedEventMetadata(key[0], key[1], copy.origin_version,
                                                           copy.metadata.concurrent), copy.origin_version)
        assert received is not None  # ready: not seen
        stored = received.metadata
        beside = () if received.origin_version == stored.version else (wire.MetadataEntry(
            wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR, received.origin_version.to_bytes()),)
        plan.events.append((stored, (*beside, *copy.others), copy))
        plan.arrived += 1
        s = received.state
    plan.state = s
    return plan


def _write_step(local: JournalCore, pid: str, expected: int, plan: _Plan) -> Step[None]:
    """The plan appended in one transaction at this location, after ``expected`` (the replica's last event when
    the plan was made), with the seen rows."""
    slice_ = slice_for_persistence_id(pid)
    yield Statement("BEGIN")
    try:
        yield statement(sql.lock([pid]))
        last = yield from first_of(sql.last_event(local.events.table(slice_), pid, slice_))
        if (last.seq_nr if last is not None else 0) != expected:
            raise RecoveryFailed(f"{pid!r} moved while it was being recovered (at sequence number "
                                 f"{last.seq_nr if last else 0}, not {expected}): run the recovery again")
        highest: dict[str, int] = {}
        seq_nr = expected
        for meta, others, copy in plan.events:
            ser_id, manifest, payload = event_metadata_columns(meta, others)
            [(seq_nr, _)] = yield from append_events_step(
                local, pid, [copy.event], expected=seq_nr, metadata=Stored(ser_id, manifest, payload),
                tags=copy.tags, writer=writer_of_recovery(copy.peer))
            if meta.origin_replica != plan.state.replica:
                highest[meta.origin_replica] = max(highest.get(meta.origin_replica, 0), meta.origin_sequence_nr)
        if highest:
            yield statement(sql.record_seen({pid: highest}))
    except GeneratorExit:
        raise  # the connection goes back inside the transaction: the pool rolls it back
    except BaseException:
        with contextlib.suppress(Exception):
            yield Statement("ROLLBACK")
        raise
    yield Statement("COMMIT")


def _replica_step(local: JournalCore, peers: Mapping[str, JournalCore], rid: ReplicationId, latest_own: int,
                  read: Mapping[str, int]) -> Step[ReplicaRecovered | None]:
    state = yield from replica_state_step(local, rid)
    if latest_own <= state.version.version_at(rid.replica_id) and max(read.values(), default=0) <= state.seq_nr:
        return None
    copies: dict[str, list[_Copy]] = {}
    for peer, journal in peers.items():
        copies[peer] = yield from _copy_step(journal, peer, rid.with_replica(peer))
    plan = plan_replica(state, copies, read)
    if not plan.events:
        return None
    yield Call(local.run, (_write_step(local, rid.persistence_id, state.seq_nr, plan),))  # type: ignore[attr-defined]
    peers_used = tuple(sorted({copy.peer for _, _, copy in plan.events}))
    log.info("recovered %r: %d own and %d other event(s) from %s, now at sequence number %d", rid.persistence_id,
             plan.own, plan.arrived, ", ".join(peers_used), plan.state.seq_nr)
    return ReplicaRecovered(rid.persistence_id, plan.own, plan.arrived, plan.state.seq_nr, peers_used)


def recover_step(local: JournalCore, replica: str, peers: Mapping[str, JournalCore],
                 entity_types: Sequence[str]) -> Step[RecoveryReport]:
    """:func:`recover` as a step, for either face (every journal of one face)."""
    replica = ReplicationId("T", "e", replica).replica_id
    if not peers:
        raise InvalidArgument("recovery needs the peers that hold this location's events, got none")
    for peer in peers:
        if ReplicationId("T", "e", peer).replica_id == replica:
            raise InvalidArgument(f"{replica!r} is this location's replica id, not a peer's")
    types = [ReplicationId(check_name(t, "entity type"), "e", replica).type_name for t in entity_types]
    if not types:
        raise InvalidArgument("recovery needs the replicated entity types, got none")
    yield Call(local.run, (mark_recovering_step(replica),))  # type: ignore[attr-defined]
    log.info("replica %r marked recovering: writes and arrivals refused until its recovery ends", replica)
    done: list[ReplicaRecovered] = []
    for entity_type in types:
        # From each peer: the latest event of this location each of its replicas holds, and how far its stream
        # from here has read each of this location's replicas.
        latest: dict[str, int] = {}
        read: dict[str, dict[str, int]] = {}
        for peer, journal in peers.items():
            seen = yield Call(journal.run, (rows_of(sql.seen_from(replica, entity_type)),))  # type: ignore[attr-defined]
            for row in seen:
                rid = ReplicationId.parse(row.persistence_id)
                if rid.replica_id == peer:
                    latest[rid.entity_id] = max(latest.get(rid.entity_id, 0), row.origin_seq_nr)
            offsets = yield Call(journal.run, (rows_of(sql.stream_highest(stream_name(replica, entity_type),  # type: ignore[attr-defined]
                                                                          entity_type)),))
            for row in offsets:
                rid = ReplicationId.parse(row.persistence_id)
                if rid.replica_id == replica:
                    read.setdefault(rid.entity_id, {})[peer] = row.seq_nr
        for entity_id in sorted(set(latest) | set(read)):
            recovered = yield from _replica_step(local, peers, ReplicationId(entity_type, entity_id, replica),
                                                 latest.get(entity_id, 0), read.get(entity_id, {}))
            if recovered is not None:
                done.append(recovered)
    yield Call(local.run, (count_of(sql.unmark_recovering(replica)),))  # type: ignore[attr-defined]
    log.info("replica %r recovered: %d replica(s) rebuilt", replica, len(done))
    return RecoveryReport(replica, tuple(done))


def mark_recovering_step(replica: str, *, poll: float = 0.05) -> Step[None]:
    """Mark ``replica`` recovering, then wait until every transaction that was in progress has ended: a write that
    read no marker (in its transaction) has ended then, and every later one sees it."""
    yield statement(sql.mark_recovering(replica))
    ids = yield from first_of(sql.in_progress())
    while ids and (yield from first_of(sql.still_in_progress(ids))):
        yield Sleep(poll)


def recover(local: Journal, replica: str, peers: Mapping[str, Journal], entity_types: Sequence[str]
            ) -> RecoveryReport:
    """Recover this location (``local``, replica id ``replica``) from its ``peers`` (replica id to journal, a
    reader role there is enough) after a restore from an old backup, for ``entity_types``: mark it recovering
    (its writes refused from then on), rebuild each replica that lost events the peers hold, then remove the mark.
    Run it before the location's writers and streams start; run it again after a failure (the location stays
    recovering until one run ends)."""
    return local.run(recover_step(local, replica, peers, entity_types))


async def arecover(local: AsyncJournal, replica: str, peers: Mapping[str, AsyncJournal],
                   entity_types: Sequence[str]) -> RecoveryReport:
    """:func:`recover` on the asyncio face."""
    return await local.run(recover_step(local, replica, peers, entity_types))


def is_recovering_step(replica: str) -> Step[bool]:
    return bool((yield from first_of(sql.is_recovering(replica))))


def recovering(journal: Journal, replica: str) -> bool:
    """Whether ``replica`` is marked recovering in ``journal`` (a recovery started and has not ended)."""
    return journal.run(is_recovering_step(replica))


__all__ = ["RecoveryReport", "ReplicaRecovered", "arecover", "is_recovering_step", "mark_recovering_step",
           "plan_replica", "recover", "recovering", "writer_of_recovery"]
