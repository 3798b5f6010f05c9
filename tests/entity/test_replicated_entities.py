"""Replicated entities on a real PostgreSQL, both faces: a command's events stored with Akka's replication metadata
in the meta_* columns, recovery from a replica's persistence id, and replicas of one entity simulated in one
database (the test moves events between replicas' persistence ids with apply_replicated, as the replicator does):
concurrent writes detected and converging, seen events dropped, conflicts kept until resolved."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.faces import Face, _Sync
from test_crdt import Document, Labels, Votes

from pgjournal import ConfigurationError, Journal
from pgjournal.codec import replicated as wire
from pgjournal.entity.crdt import PNCounter
from pgjournal.entity.replicated import (
    AsyncReplicatedRepository,
    ReplicatedEntity,
    ReplicatedRepository,
    ReplicationContext,
    aapply_replicated,
    apply_replicated,
    await_for_version,
    wait_for_version,
)
from pgjournal.errors import InvalidArgument, InvalidPersistenceId, NotSeenInTime
from pgjournal.model.replication import (
    ReplicaState,
    ReplicatedComposite,
    ReplicatedEventMetadata,
    ReplicatedSnapshotMetadata,
    ReplicationId,
    VersionVector,
    event_metadata_of,
)


def repository(face: Face, entity: Any, replica: str, **options: Any) -> Any:
    if face.kind == "blocking":
        return ReplicatedRepository(face.journal, entity, replica=replica, **options)  # type: ignore[arg-type]

    async def making() -> Any:
        return AsyncReplicatedRepository(face.journal, entity, replica=replica, **options)  # type: ignore[arg-type]

    return _Sync(face._runner.run(making()), face._runner)  # type: ignore[union-attr]


def replicate(face: Face, source_pid: str, replica: str, from_seq_nr: int = 1) -> list[Any]:
    """Every event of ``source_pid`` from ``from_seq_nr`` written into ``replica``'s persistence id."""
    envelopes = list(face.query.current_events_by_persistence_id(source_pid, from_seq_nr))
    if face.kind == "blocking":
        return [apply_replicated(face.journal, e, replica) for e in envelopes]  # type: ignore[arg-type]
    return [face._runner.run(aapply_replicated(face.journal, e, replica)) for e in envelopes]  # type: ignore


def meta_columns(face: Face, pid: str) -> list[tuple[int, str, bytes]]:
    with face.connection() as conn:
        rows = conn.execute("SELECT meta_ser_id, meta_ser_manifest, meta_payload FROM event_journal "
                            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()
    return [(r[0], r[1], bytes(r[2])) for r in rows]


def stored_metadata(face: Face, pid: str) -> list[ReplicatedEventMetadata]:
    found = []
    for columns in meta_columns(face, pid):
        metadata, _ = event_metadata_of(*columns)
        assert metadata is not None
        found.append(metadata)
    return found


class Recorder(ReplicatedEntity[tuple[Any, ...]]):
    """Keeps every (event, context) it applied, to show what the handler was told."""

    name = "Recorder"
    replicas = ("A", "B", "C")
    initial_state: tuple[Any, ...] = ()

    def handle(self, state: tuple[Any, ...], command: Any, context: Any) -> Any:
        return list(command)

    def apply(self, state: tuple[Any, ...], event: Any, context: ReplicationContext) -> tuple[Any, ...]:
        return (*state, (event, context))


def test_local_events_are_stored_with_akkas_replication_metadata(face: Face) -> None:
    votes = repository(face, Votes, "A")
    first = votes.handle("poll-1", 2)
    second = votes.handle("poll-1", 3)
    assert (first.reply, second.reply, second.seq_nr) == (2, 5, 2)
    assert second.state.version == VersionVector({"A": 2})
    columns = meta_columns(face, "Votes|poll-1|A")
    assert [(c[0], c[1]) for c in columns] == [(40, "RE"), (40, "RE")]
    assert columns[0][2] == ReplicatedEventMetadata("A", 1, VersionVector({"A": 1}), False).to_bytes()
    assert stored_metadata(face, "Votes|poll-1|A")[1] == ReplicatedEventMetadata(
        "A", 2, VersionVector({"A": 2}), False)


def test_the_events_of_one_command_each_get_their_own_metadata(face: Face) -> None:
    recorder = repository(face, Recorder, "B")
    result = recorder.handle("r-1", ["x", "y", "z"])
    assert result.seq_nr == 3
    assert [m.version for m in stored_metadata(face, "Recorder|r-1|B")] == [
        VersionVector({"B": n}) for n in (1, 2, 3)]
    assert [c.recovering for _, c in result.state.state] == [False] * 3
    recovered = repository(face, Recorder, "B").load("r-1")
    assert [(e, c.seq_nr, c.recovering, c.from_here) for e, c in recovered.state.state] == [
        ("x", 1, True, True), ("y", 2, True, True), ("z", 3, True, True)]
    assert recovered.state.version == VersionVector({"B": 3})


def test_concurrent_writes_in_two_replicas_are_detected_and_converge(face: Face) -> None:
    a, b = repository(face, Votes, "A"), repository(face, Votes, "B")
    a.handle("poll-2", 1)
    b.handle("poll-2", 10)
    b.handle("poll-2", 20)
    [into_a1, into_a2] = replicate(face, "Votes|poll-2|B", "A")
    into_b, *back = replicate(face, "Votes|poll-2|A", "B")
    assert back == [None, None]  # B's own events, which A holds now
    assert into_a1.metadata == ReplicatedEventMetadata("B", 1, VersionVector({"A": 1, "B": 1}), True)
    assert into_a2.metadata == ReplicatedEventMetadata("B", 2, VersionVector({"A": 1, "B": 2}), True)
    assert into_b.metadata == ReplicatedEventMetadata("A", 1, VersionVector({"A": 1, "B": 2}), True)
    states = {replica: repository(face, Votes, replica).load("poll-2").state for replica in "AB"}
    assert states["A"].state.value == states["B"].state.value == 31
    assert states["A"].version == states["B"].version == VersionVector({"A": 1, "B": 2})
    # A cached state is not trusted after an arrival: the next command is decided on the stored one.
    replicate(face, "Votes|poll-2|B", "A")  # all seen: nothing written
    b.handle("poll-2", 100)
    assert replicate(face, "Votes|poll-2|B", "A", 4)[0].metadata.concurrent is False
    assert a.handle("poll-2", 1000).reply == 1131


def test_a_seen_event_is_dropped(face: Face) -> None:
    a = repository(face, Votes, "A")
    a.handle("poll-3", 1)
    assert replicate(face, "Votes|poll-3|A", "B")[0] is not None
    assert replicate(face, "Votes|poll-3|A", "B") == [None]
    assert replicate(face, "Votes|poll-3|B", "A") == [None]  # A's own event, back from B
    assert [m.origin_replica for m in stored_metadata(face, "Votes|poll-3|B")] == ["A"]
    assert len(meta_columns(face, "Votes|poll-3|A")) == 1


def test_the_handler_is_told_origin_concurrency_and_replicas(face: Face) -> None:
    repository(face, Recorder, "A").handle("r-2", ["a1"])
    repository(face, Recorder, "C").handle("r-2", ["c1"])
    replicate(face, "Recorder|r-2|C", "A")
    [(_, local), (_, arrived)] = repository(face, Recorder, "A").load("r-2").state.state
    assert (local.origin_replica, local.concurrent, local.from_here) == ("A", False, True)
    assert (arrived.origin_replica, arrived.origin_sequence_nr, arrived.concurrent, arrived.from_here) == (
        "C", 1, True, False)
    assert arrived.all_replicas == frozenset("ABC") and arrived.replica_id == "A" and arrived.recovering
    assert arrived.version == VersionVector({"A": 1, "C": 1})
    assert arrived.origin_version == VersionVector({"C": 1})


def test_a_relayed_event_keeps_its_origins_vector_beside_the_metadata(face: Face) -> None:
    """A and C write at once; B receives both and relays C's to A. B's row of it carries the origin's vector
    (composite 34 / M: Akka's metadata first, then 40 / DA), so A flags it concurrent, as it is."""
    repository(face, Document, "A").handle("d-1", ("set", "a1"))
    repository(face, Document, "C").handle("d-1", ("set", "c1"))
    replicate(face, "Document|d-1|A", "B")
    replicate(face, "Document|d-1|C", "B")
    relayed = meta_columns(face, "Document|d-1|B")[1]
    assert (relayed[0], relayed[1]) == (wire.PAYLOAD, wire.COMPOSITE_METADATA)
    metadata, others = event_metadata_of(*relayed)
    assert metadata == ReplicatedEventMetadata("C", 1, VersionVector({"A": 1, "C": 1}), True)
    assert ReplicatedComposite(metadata, others).origin_version == VersionVector({"C": 1})
    own, relayed_here = replicate(face, "Document|d-1|B", "A")
    assert own is None  # a1, A's own
    assert relayed_here.metadata == ReplicatedEventMetadata("C", 1, VersionVector({"A": 1, "C": 1}), True)
    assert sorted(repository(face, Document, "A").load("d-1").state.state.values) == ["a1", "c1"]


def test_a_conflict_is_kept_as_concurrent_versions_until_a_command_resolves_it(face: Face) -> None:
    docs = {r: repository(face, Document, r) for r in "AB"}
    docs["A"].handle("d-2", ("set", "v0"))
    replicate(face, "Document|d-2|A", "B")
    docs["A"].handle("d-2", ("set", "from A"))
    docs["B"].handle("d-2", ("set", "from B"))
    replicate(face, "Document|d-2|A", "B", 2)
    replicate(face, "Document|d-2|B", "A", 2)
    for replica in "AB":
        assert sorted(docs[replica].handle("d-2", ("get",)).reply) == ["from A", "from B"]
    resolved = docs["B"].handle("d-2", ("resolve", "both"))
    assert resolved.state.state.values == ("both",)
    replicate(face, "Document|d-2|B", "A", 4)
    assert docs["A"].handle("d-2", ("get",)).reply == ("both",)
    assert docs["A"].load("d-2").state.state.values == ("both",)


def test_sets_converge_with_an_add_concurrent_with_a_remove(face: Face) -> None:
    sets = {r: repository(face, Labels, r) for r in "AB"}
    sets["A"].handle("s-1", ("add", "x"))
    replicate(face, "Labels|s-1|A", "B")
    sets["A"].handle("s-1", ("remove", "x"))
    sets["B"].handle("s-1", ("add", "x"))
    replicate(face, "Labels|s-1|A", "B", 2)
    replicate(face, "Labels|s-1|B", "A", 2)
    assert {sets[r].load("s-1").state.state.elements for r in "AB"} == {frozenset({"x"})}


def test_bad_settings_and_ids_are_refused(face: Face) -> None:
    with pytest.raises(ConfigurationError, match=r"replica must be one of Votes.replicas \['A', 'B', 'C'\], got 'D'"):
        repository(face, Votes, "D")
    with pytest.raises(InvalidPersistenceId, match=r"contains '\|'"):
        repository(face, Votes, "A").handle("a|b", 1)


def wait(face: Face, replication_id: ReplicationId, version: VersionVector, timeout: float) -> VersionVector:
    if face.kind == "blocking":
        return wait_for_version(face.journal, replication_id, version, timeout=timeout)  # type: ignore[arg-type]
    return face._runner.run(  # type: ignore[union-attr, no-any-return]
        await_for_version(face.journal, replication_id, version, timeout=timeout))  # type: ignore[arg-type]


def test_read_your_writes_waits_until_the_replica_has_seen_the_version(face: Face) -> None:
    written = repository(face, Votes, "A").handle("poll-4", 7)
    at_b = ReplicationId("Votes", "poll-4", "B")
    with pytest.raises(NotSeenInTime, match=r"replica 'Votes\|poll-4\|B' had not seen VersionVector\(\{'A': 1\}\) "
                                            r"within 0.2s: its vector is VersionVector\(\{\}\)") as timed_out:
        wait(face, at_b, written.state.version, 0.2)
    assert (timed_out.value.waited_for, timed_out.value.seen) == (written.state.version, VersionVector())
    repository(face, Votes, "B").handle("poll-4", 1)  # B's own write is not what A's reader waits for
    with pytest.raises(NotSeenInTime):
        wait(face, at_b, written.state.version, 0.1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait, face, at_b, written.state.version, 60)
        replicate(face, "Votes|poll-4|A", "B")
        assert waiting.result(timeout=60) == VersionVector({"A": 1, "B": 1})
    assert wait(face, at_b, VersionVector(), 0) == VersionVector({"A": 1, "B": 1})  # nothing to wait for
    with pytest.raises(InvalidArgument, match="timeout must be a number of seconds >= 0, got -1"):
        wait(face, at_b, written.state.version, -1)


def test_a_command_of_several_events_after_an_arrival_is_decided_again_on_the_stored_state(face: Face) -> None:
    a, b = repository(face, Recorder, "A"), repository(face, Recorder, "B")
    a.handle("r-3", ["a1"])  # A's state is cached at seq_nr 1
    b.handle("r-3", ["b1"])
    replicate(face, "Recorder|r-3|B", "A")  # A's persistence id moves on behind the cache
    result = a.handle("r-3", ["a3", "a4"])  # its append conflicts, recovers, decides again
    assert [e for e, _ in result.state.state] == ["a1", "b1", "a3", "a4"]
    assert stored_metadata(face, "Recorder|r-3|A")[2:] == [
        ReplicatedEventMetadata("A", 3, VersionVector({"A": 3, "B": 1}), False),
        ReplicatedEventMetadata("A", 4, VersionVector({"A": 4, "B": 1}), False)]
    assert a.status()["conflicts"] == 1


def test_a_connection_lost_as_a_commands_events_commit_is_settled_not_reported_unwritten(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events of one command commit, then the connection is reported lost: the repository finds out they are
    written (its retry conflicts with its own events) instead of telling the caller nothing was written."""
    real = journal.transaction
    lost = []

    @contextlib.contextmanager
    def commit_then_lose(**options: Any) -> Iterator[Any]:
        with real(**options) as tx:
            yield tx
        if not lost:
            lost.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(journal, "transaction", commit_then_lose)
    recorder = ReplicatedRepository(journal, Recorder, replica="A")
    result = recorder.handle("r-4", ["x", "y"])
    assert lost and result.seq_nr == 2
    assert [m.origin_sequence_nr for m in stored_metadata_of(journal, "Recorder|r-4|A")] == [1, 2]
    assert recorder.status()["unknown_outcomes"] == 1


def stored_metadata_of(journal: Journal, pid: str) -> list[ReplicatedEventMetadata]:
    return [e.metadata for e in journal.query.current_events_by_persistence_id(pid)]


class SnapshotVotes(Votes):
    """Votes whose counter is stored in snapshots as plain JSON."""

    name = "SnapshotVotes"

    def to_snapshot(self, state: PNCounter) -> Any:
        return {"increments": dict(state.increments), "decrements": dict(state.decrements)}

    def from_snapshot(self, data: Any) -> PNCounter:
        return PNCounter(data["increments"], data["decrements"])


class SnapshotVotesV2(SnapshotVotes):
    snapshot_version = 2


def test_snapshots_store_akkas_snapshot_metadata_and_recovery_starts_from_them(face: Face) -> None:
    a = repository(face, SnapshotVotes, "A", snapshot_every=3)
    a.handle("p-1", 1)
    repository(face, SnapshotVotes, "B").handle("p-1", 10)
    replicate(face, "SnapshotVotes|p-1|B", "A")  # seq_nr 2 at A: an arrival
    a.handle("p-1", 100)  # seq_nr 3: crosses 3, a snapshot
    a.handle("p-1", 1000)
    with face.connection() as conn:
        row = conn.execute("SELECT seq_nr, meta_ser_id, meta_ser_manifest, meta_payload FROM snapshot WHERE "
                           "persistence_id = 'SnapshotVotes|p-1|A'").fetchone()
    assert row is not None and row[:3] == (3, 34, "M")
    first, check = wire.decode_composite(bytes(row[3]))
    assert (first.ser_id, first.manifest) == (40, "RS")
    assert ReplicatedSnapshotMetadata.from_bytes(first.payload) == ReplicatedSnapshotMetadata(
        VersionVector({"A": 3, "B": 1}), {"B": 1})
    assert face.serializers.deserialize(check.ser_id, check.manifest, check.payload) == {
        "entity": "SnapshotVotes", "version": 1}
    recovered = repository(face, SnapshotVotes, "A").load("p-1")
    assert (recovered.seq_nr, recovered.snapshot_seq_nr, recovered.replayed) == (4, 3, 1)
    assert recovered.state.state.value == 1111
    assert recovered.state.replica == ReplicaState("A", 4, VersionVector({"A": 4, "B": 1}), {"B": 1})
    other = repository(face, SnapshotVotesV2, "A").load("p-1")  # another snapshot version: ignored
    assert (other.snapshot_seq_nr, other.replayed, other.state.replica) == (None, 4, recovered.state.replica)
