"""The replication model without I/O: replication ids, version vectors against a port of Akka's comparison, and
the rules of a replica (a local write, an arrival, seen, recovery) run over simulated replicas that exchange
events, where causal order, exactly once and convergence must hold."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgjournal import (
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    SerializationError,
    SerializerRegistry,
    slice_for_persistence_id,
)
from pgjournal.codec.replicated import REPLICATED_EVENT_SOURCING
from pgjournal.model.replication import (
    Ordering,
    ReplicaState,
    ReplicatedEventMetadata,
    ReplicatedEventSourcingSerializer,
    ReplicatedSnapshotMetadata,
    ReplicationId,
    VersionVector,
    is_replication_id,
    java_order,
)

pytestmark = pytest.mark.mode_independent

# -- replication ids ------------------------------------------------------------------------------------


def test_a_replication_id_is_type_entity_replica() -> None:
    rid = ReplicationId("ShoppingCart", "cart-1", "eu-west")
    assert rid.persistence_id == str(rid) == "ShoppingCart|cart-1|eu-west"
    assert ReplicationId.parse("ShoppingCart|cart-1|eu-west") == rid
    assert rid.with_replica("us-east").persistence_id == "ShoppingCart|cart-1|us-east"
    assert is_replication_id(rid.persistence_id)
    assert not is_replication_id("ShoppingCart|cart-1")


@pytest.mark.parametrize("pid, message", [
    ("ShoppingCart|cart-1", r"exactly two '\|'\), got 'ShoppingCart\|cart-1' with 1"),
    ("a|b|c|d", r"got 'a\|b\|c\|d' with 3"),
    ("plain", r"got 'plain' with 0"),
    ("|cart|r", "the entity type of a replication id must not be empty"),
    ("T||r", "the entity id of a replication id must not be empty"),
    # Akka's split drops a trailing empty part and reads this as a replica-less id; here it is refused
    ("T|e|", "the replica id of a replication id must not be empty"),
    ("", "persistence id must not be empty"),
    ("T|e\x00|r", "NUL"),
])
def test_a_persistence_id_that_is_not_a_replication_id_is_refused_by_name(pid: str, message: str) -> None:
    with pytest.raises(InvalidPersistenceId, match=message):
        ReplicationId.parse(pid)


@pytest.mark.parametrize("parts, message", [
    (("A|B", "e", "r"), r"the entity type of a replication id 'A\|B' contains '\|'"),
    (("T", "e|f", "r"), r"the entity id of a replication id 'e\|f' contains '\|'"),
    (("T", "e", "r|s"), r"the replica id of a replication id 'r\|s' contains '\|'"),
    (("T", 5, "r"), "the entity id of a replication id must be a string, got int 5"),
    (("T", "e" * 300, "r"), "at most 255 characters"),
])
def test_a_replication_id_checks_its_parts(parts: tuple[str, str, str], message: str) -> None:
    with pytest.raises(InvalidPersistenceId, match=message):
        ReplicationId(*parts)


part = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="|\x00"), min_size=1, max_size=20)


@given(part, part, part)
def test_parse_and_format_are_inverse(type_name: str, entity_id: str, replica_id: str) -> None:
    rid = ReplicationId(type_name, entity_id, replica_id)
    assert ReplicationId.parse(rid.persistence_id) == rid


# -- version vectors ------------------------------------------------------------------------------------

replicas = st.sampled_from(["A", "B", "C", "D", "\U0001F30D", "\uff21"])
vectors = st.dictionaries(replicas, st.integers(1, 6), max_size=5).map(VersionVector)

END = (None, None)


def akka_compare(a: VersionVector, b: VersionVector) -> Ordering:
    """A port of Akka's ``VersionVector.compareOnlyTo(that, FullOrder)``: both vectors walked in key order."""
    i1, i2 = iter(a.entries), iter(b.entries)
    nt1, nt2 = next(i1, END), next(i2, END)
    order = Ordering.SAME
    while True:
        if order is Ordering.CONCURRENT:
            return order
        if nt1 is END and nt2 is END:
            return order
        if nt1 is END:
            return Ordering.CONCURRENT if order is Ordering.AFTER else Ordering.BEFORE
        if nt2 is END:
            return Ordering.CONCURRENT if order is Ordering.BEFORE else Ordering.AFTER
        k1, k2 = java_order(nt1[0]), java_order(nt2[0])
        if k1 == k2:
            if nt1[1] < nt2[1]:
                order = Ordering.CONCURRENT if order is Ordering.AFTER else Ordering.BEFORE
            elif nt1[1] > nt2[1]:
                order = Ordering.CONCURRENT if order is Ordering.BEFORE else Ordering.AFTER
            nt1, nt2 = next(i1, END), next(i2, END)
        elif k1 < k2:
            order = Ordering.CONCURRENT if order is Ordering.BEFORE else Ordering.AFTER
            nt1 = next(i1, END)
        else:
            order = Ordering.CONCURRENT if order is Ordering.AFTER else Ordering.BEFORE
            nt2 = next(i2, END)


MIRROR = {Ordering.SAME: Ordering.SAME, Ordering.BEFORE: Ordering.AFTER, Ordering.AFTER: Ordering.BEFORE,
          Ordering.CONCURRENT: Ordering.CONCURRENT}


@given(vectors, vectors)
def test_compare_is_akkas(a: VersionVector, b: VersionVector) -> None:
    assert a.compare(b) is akka_compare(a, b)


@given(vectors, vectors)
def test_compare_is_consistent(a: VersionVector, b: VersionVector) -> None:
    order = a.compare(b)
    assert b.compare(a) is MIRROR[order]
    assert (order is Ordering.SAME) == (a == b)
    assert a.compare(a) is Ordering.SAME
    merged = a.merge(b)
    # before means the merge is the other one; concurrent means the merge is above both
    assert (order in (Ordering.BEFORE, Ordering.SAME)) == (merged == b)
    assert (order is Ordering.CONCURRENT) == (merged != a and merged != b)
    assert a.concurrent_with(b) == (order is Ordering.CONCURRENT)
    assert a.dominates(b) == (order is Ordering.AFTER)


@given(vectors, vectors, vectors)
def test_compare_is_transitive(a: VersionVector, b: VersionVector, c: VersionVector) -> None:
    if a.compare(b) is Ordering.BEFORE and b.compare(c) is Ordering.BEFORE:
        assert a.compare(c) is Ordering.BEFORE


@given(vectors, vectors, vectors)
def test_merge_is_commutative_associative_and_idempotent(a: VersionVector, b: VersionVector,
                                                          c: VersionVector) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(a) == a
    assert a.merge(VersionVector()) == a
    for x in (a, b):
        assert x.compare(a.merge(b)) in (Ordering.BEFORE, Ordering.SAME)


@given(vectors, vectors)
def test_merge_is_the_pointwise_maximum_in_javas_key_order(a: VersionVector, b: VersionVector) -> None:
    # merge keeps the keys' order when it only raises versions and sorts again for a new key: as a fresh vector
    expected = {key: max(a.version_at(key), b.version_at(key)) for key in a.as_dict().keys() | b.as_dict().keys()}
    assert a.merge(b).entries == VersionVector(expected).entries


@given(vectors, replicas)
def test_increment_and_updated(a: VersionVector, replica: str) -> None:
    assert a.increment(replica).version_at(replica) == a.version_at(replica) + 1
    assert a.increment(replica).compare(a) is Ordering.AFTER
    assert a.updated(replica, 9).as_dict() == {**a.as_dict(), replica: 9}
    assert a.updated(replica, 9).entries == VersionVector({**a.as_dict(), replica: 9}).entries
    with pytest.raises(InvalidArgument):
        a.increment(replica).updated(replica, 0)  # a key present or not, a version below 1 is refused


def test_entries_are_in_javas_string_order() -> None:
    # U+1F30D is a surrogate pair (D83C DF0D) in Java, so it sorts before U+FF21, unlike Python's code points
    vector = VersionVector({"\uff21": 1, "\U0001F30D": 2, "B": 3, "A": 4})
    assert [k for k, _ in vector] == ["A", "B", "\U0001F30D", "\uff21"]
    assert sorted(["\uff21", "\U0001F30D"]) == ["\uff21", "\U0001F30D"]


@pytest.mark.parametrize("versions, message", [
    ({"A": 0}, "the version of 'A' in a version vector must be an int from 1"),
    ({"A": -1}, "from 1 to 9223372036854775807, got -1"),
    ({"A": 2**63}, "got 9223372036854775808"),
    ({"A": True}, "got True"),
    ({"": 1}, "a version vector's key must be a non-empty string"),
    ({"A|B": 1}, r"without '\|', got 'A\|B'"),
])
def test_a_vector_refuses_what_akka_never_writes(versions: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        VersionVector(versions)


def test_metadata_checks_its_fields() -> None:
    with pytest.raises(InvalidArgument, match="the origin sequence number must be an int from 1"):
        ReplicatedEventMetadata("A", 0, VersionVector(), False)
    with pytest.raises(InvalidArgument, match="concurrent must be a bool, got 1"):
        ReplicatedEventMetadata("A", 1, VersionVector(), 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"version must be a VersionVector, got \{'A': 1\}"):
        ReplicatedEventMetadata("A", 1, {"A": 1}, False)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="the seq_nr seen of 'B'"):
        ReplicatedSnapshotMetadata(VersionVector(), {"B": 0})


# -- a replica's rules ----------------------------------------------------------------------------------


def test_a_local_write_sets_its_own_entry_to_its_seq_nr() -> None:
    state = ReplicaState("A", 4, VersionVector({"A": 2, "B": 3}), {"B": 3})
    after, meta = state.write_local()
    assert meta == ReplicatedEventMetadata("A", 5, VersionVector({"A": 5, "B": 3}), False)
    assert (after.seq_nr, after.version, after.seen) == (5, meta.version, {"B": 3})


def test_an_arrival_merges_and_decides_concurrent_once() -> None:
    state = ReplicaState("A", 1, VersionVector({"A": 1}))
    after, stored = state.receive(ReplicatedEventMetadata("B", 1, VersionVector({"B": 1}), False))  # type: ignore[misc]
    assert stored == ReplicatedEventMetadata("B", 1, VersionVector({"A": 1, "B": 1}), True)
    assert (after.seq_nr, after.seen) == (2, {"B": 1})
    # B had seen A's event: not concurrent, and the stored flag is B's-at-arrival, not what B had stored
    later, stored = after.receive(ReplicatedEventMetadata("B", 3, VersionVector({"A": 1, "B": 3}), True))  # type: ignore[misc]
    assert stored == ReplicatedEventMetadata("B", 3, VersionVector({"A": 1, "B": 3}), False)
    assert later.seen == {"B": 3}


def test_seen_events_and_own_events_are_dropped() -> None:
    state = ReplicaState("A", 5, VersionVector({"A": 2, "B": 4}), {"B": 4})
    assert state.receive(ReplicatedEventMetadata("B", 4, VersionVector({"B": 4}), False)) is None
    assert state.receive(ReplicatedEventMetadata("B", 2, VersionVector({"B": 2}), False)) is None
    assert state.receive(ReplicatedEventMetadata("A", 9, VersionVector({"A": 9}), False)) is None
    assert state.receive(ReplicatedEventMetadata("C", 1, VersionVector({"C": 1}), False)) is not None


def test_replay_and_snapshots_restore_what_was_live() -> None:
    state = ReplicaState("A")
    stored: list[ReplicatedEventMetadata | None] = []
    state, meta = state.write_local()
    stored.append(meta)
    got = state.receive(ReplicatedEventMetadata("B", 2, VersionVector({"B": 2}), False))
    assert got is not None
    state, meta = got
    stored.append(meta)
    replayed = ReplicaState("A")
    for seq_nr, meta in enumerate(stored, 1):
        replayed = replayed.replay(seq_nr, meta)
    assert replayed == state
    snap = state.snapshot_metadata()
    assert ReplicatedSnapshotMetadata.from_bytes(snap.to_bytes()) == snap
    assert ReplicaState.from_snapshot("A", state.seq_nr, snap) == state
    assert ReplicaState.from_snapshot("A", 7, None) == ReplicaState("A", 7)
    with pytest.raises(InvalidArgument, match="a replayed event's seq_nr must be above 2, got 2"):
        state.replay(2, None)


def test_an_event_from_before_replication_replays_as_a_local_one() -> None:
    state = ReplicaState("A").replay(1, None).replay(2, None)
    assert (state.version, state.seen) == (VersionVector({"A": 2}), {})
    assert state.write_local()[1].version == VersionVector({"A": 3})


# -- replicas exchanging events -------------------------------------------------------------------------


class Replica:
    """One replica of one entity: its persistence id's events (metadata only) and a read position per peer."""

    def __init__(self, name: str) -> None:
        self.state = ReplicaState(name)
        self.log: list[ReplicatedEventMetadata] = []
        #: per event, the vector it arrived with (the row read from the peer), None for a local one
        self.arrived: list[VersionVector | None] = []
        self.read: dict[str, int] = {}

    def write(self) -> None:
        self.state, meta = self.state.write_local()
        self.log.append(meta)
        self.arrived.append(None)

    def pull(self, peer: Replica, limit: int, *, origin_filter: bool = False) -> None:
        """Read up to ``limit`` more events of ``peer``'s persistence id in order; with ``origin_filter``, only those
        the peer wrote itself (Akka's gRPC transport's default)."""
        start = self.read.get(peer.state.replica, 0)
        taken = peer.log[start:start + limit]
        self.read[peer.state.replica] = start + len(taken)
        for meta in taken:
            if origin_filter and meta.origin_replica != peer.state.replica:
                continue
            got = self.state.receive(meta)
            if got is not None:
                self.state, stored = got
                self.log.append(stored)
                self.arrived.append(meta.version)


def run(seed: int, names: tuple[str, ...], steps: int, *, origin_filter: bool = False) -> dict[str, Replica]:
    rng = random.Random(seed)
    group = {name: Replica(name) for name in names}
    for _ in range(steps):
        me = group[rng.choice(names)]
        if rng.random() < 0.4:
            me.write()
        else:
            peer = group[rng.choice([n for n in names if n != me.state.replica])]
            me.pull(peer, rng.randint(1, 3), origin_filter=origin_filter)
    return group


def heal(group: dict[str, Replica], *, origin_filter: bool = False) -> None:
    for _ in range(len(group)):
        for me in group.values():
            for peer in group.values():
                if peer is not me:
                    me.pull(peer, 10**6, origin_filter=origin_filter)


def causal_violations(log: list[ReplicatedEventMetadata], logs: dict[str, list[ReplicatedEventMetadata]]
                      ) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """Pairs (effect, cause) in ``log`` where the effect comes first although its vector where it was written
    dominates the cause's: causal order broken."""
    keyed = [(m.origin_replica, m.origin_sequence_nr) for m in log]
    for i, first in enumerate(keyed):
        for later in keyed[i + 1:]:
            if origin_logs_vector(logs, first).dominates(origin_logs_vector(logs, later)):
                yield first, later


def origin_logs_vector(group_logs: dict[str, list[ReplicatedEventMetadata]], key: tuple[str, int]) -> VersionVector:
    """The vector an event was stored with where it was written."""
    for meta in group_logs[key[0]]:
        if (meta.origin_replica, meta.origin_sequence_nr) == key:
            return meta.version
    raise AssertionError(key)


def check_invariants(group: dict[str, Replica]) -> None:
    logs = {name: r.log for name, r in group.items()}
    for replica in group.values():
        keys = [(m.origin_replica, m.origin_sequence_nr) for m in replica.log]
        assert len(keys) == len(set(keys)), "an origin event twice in one replica"
        previous = VersionVector()
        for seq_nr, (meta, arrived) in enumerate(zip(replica.log, replica.arrived, strict=True), 1):
            assert meta.version.compare(previous) is Ordering.AFTER, "a vector did not grow"
            if arrived is None:
                assert meta.origin_replica == replica.state.replica
                assert meta.origin_sequence_nr == seq_nr and not meta.concurrent
            else:
                # the flag is decided against the vector of the row read (Akka's rule); the stored vector is the
                # same whether that row was the origin's or a relay's (what a relay adds, this replica has)
                assert meta.concurrent == arrived.concurrent_with(previous), "stored flag not recomputed"
                origin_vector = origin_logs_vector(logs, (meta.origin_replica, meta.origin_sequence_nr))
                assert meta.version == origin_vector.merge(previous)
                # a relay's vector can only hide a concurrency, never invent one
                if meta.concurrent:
                    assert origin_vector.concurrent_with(previous)
            previous = meta.version
        assert list(causal_violations(replica.log, logs)) == []


@given(st.integers(0, 2**32), st.sampled_from([("A", "B"), ("A", "B", "C"), ("A", "B", "C", "D")]))
def test_replicas_reading_all_of_their_peers_keep_causal_order_and_converge(seed: int,
                                                                           names: tuple[str, ...]) -> None:
    group = run(seed, names, 60)
    check_invariants(group)
    heal(group)
    check_invariants(group)
    everything = {(m.origin_replica, m.origin_sequence_nr) for r in group.values() for m in r.log}
    for replica in group.values():
        assert {(m.origin_replica, m.origin_sequence_nr) for m in replica.log} == everything
    assert len({r.state.version for r in group.values()}) == 1
    # every replica's vector at the end names each origin's last own seq_nr
    final = next(iter(group.values())).state.version
    for name, replica in group.items():
        own = [m.origin_sequence_nr for m in replica.log if m.origin_replica == name]
        assert final.version_at(name) == (own[-1] if own else 0)


def test_a_relayed_event_can_hide_a_concurrency_its_origin_vector_shows() -> None:
    """A writes a1, B writes b1 (concurrent); B takes a1 (flagged concurrent there) and C, which has b1, takes a1
    from B: B's merged vector dominates C's state, so C stores a1 as not concurrent, though a1 never saw b1.
    Akka decides the flag the same way; the design document says what would make it exact."""
    a, b, c = Replica("A"), Replica("B"), Replica("C")
    a.write()
    b.write()
    c.pull(b, 1)
    b.pull(a, 1)
    assert b.log[-1].concurrent
    c.pull(b, 10)
    relayed = c.log[-1]
    assert (relayed.origin_replica, relayed.concurrent) == ("A", False)
    assert a.log[0].version.concurrent_with(c.log[0].version)


def test_the_origin_filter_breaks_causal_order_with_three_replicas() -> None:
    """A writes a1; B reads it and writes b (after a1); C reads only B's own events from B and gets b before a1."""
    a, b, c = Replica("A"), Replica("B"), Replica("C")
    a.write()
    b.pull(a, 10, origin_filter=True)
    b.write()
    c.pull(b, 10, origin_filter=True)
    c.pull(a, 10, origin_filter=True)
    logs = {"A": a.log, "B": b.log, "C": c.log}
    assert [(m.origin_replica, m.origin_sequence_nr) for m in c.log] == [("B", 2), ("A", 1)]
    assert list(causal_violations(c.log, logs)) == [(("B", 2), ("A", 1))]
    # reading every event B holds, C gets a1 first
    c2 = Replica("C")
    c2.pull(b, 10)
    assert [(m.origin_replica, m.origin_sequence_nr) for m in c2.log] == [("A", 1), ("B", 2)]
    assert list(causal_violations(c2.log, {**logs, "C": c2.log})) == []


# -- through the journal --------------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "codec" / "fixtures" / "replicated"


def replicated_registry() -> SerializerRegistry:
    registry = SerializerRegistry()
    registry.register_serializer(REPLICATED_EVENT_SOURCING, ReplicatedEventSourcingSerializer(),
                                 ReplicatedEventMetadata, ReplicatedSnapshotMetadata, VersionVector)
    return registry


def test_a_row_an_akka_replica_wrote_reads_with_its_metadata(dsn: str) -> None:
    """A row as Akka R2DBC inserts it for a replicated event (metadata 40 / RE, protoc's fixture bytes) reads
    back through the queries with its metadata decoded; what this journal appends has the same columns."""
    payload = (FIXTURES / "arrived_concurrent.ReplicatedEventMetadata.bin").read_bytes()
    pid = "ShoppingCart|cart-1|DC-C"
    with Journal.open(dsn, serializers=replicated_registry()) as journal:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
                "event_ser_manifest, event_payload, writer, adapter_manifest, meta_ser_id, meta_ser_manifest, "
                "meta_payload) VALUES (%s, 'ShoppingCart', %s, 1, clock_timestamp(), 20, '', %s, 'akka', '', "
                "40, 'RE', %s)", (slice_for_persistence_id(pid), pid, b"added", payload))
        [envelope] = journal.query.current_events_by_persistence_id(pid)
        assert envelope.metadata == ReplicatedEventMetadata(
            "DC-B", 7, VersionVector({"DC-A": 3, "DC-B": 7, "DC-C": 2**32}), True)
        journal.append(pid, ["removed"], expected_seq_nr=1, metadata=envelope.metadata)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT meta_ser_id, meta_ser_manifest, meta_payload FROM event_journal "
                               "WHERE persistence_id = %s AND seq_nr = 2", (pid,)).fetchone()
        assert row == (40, "RE", payload)


def test_the_serializer_names_what_it_does_not_read() -> None:
    serializer = ReplicatedEventSourcingSerializer()
    with pytest.raises(SerializationError, match="manifest 'CA' of Akka's serializer 40 is not read here"):
        serializer.from_binary(b"", "CA")
    with pytest.raises(SerializationError, match="does not write str values"):
        serializer.to_binary("x")
    assert serializer.from_binary(VersionVector({"A": 1}).to_bytes(), "DA") == VersionVector({"A": 1})
