"""The arrival rule with the origin's vector (``arrival``) and the composite metadata that carries it (34 / M with
Akka's ReplicatedEventMetadata first, then its VersionVector, 40 / DA), without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgjournal import SerializationError, SerializerRegistry
from pgjournal.codec import replicated as wire
from pgjournal.model.replication import (
    CompositeMetadataSerializer,
    ReplicaState,
    ReplicatedComposite,
    ReplicatedEventMetadata,
    ReplicatedSnapshotMetadata,
    VersionVector,
    arrival,
    event_metadata_of,
    register_replication_serializers,
    split_metadata,
)

pytestmark = pytest.mark.mode_independent


def test_an_event_read_from_its_origin_is_stored_with_the_metadata_alone() -> None:
    at_a = ReplicaState("A").write_local()[0]
    arrived = arrival(at_a, ReplicatedEventMetadata("B", 1, VersionVector({"B": 1}), False))
    assert arrived is not None
    assert arrived.metadata == ReplicatedEventMetadata("B", 1, VersionVector({"A": 1, "B": 1}), True)
    assert arrived.origin_version == VersionVector({"B": 1})
    assert arrived.stored == ReplicatedComposite(arrived.metadata, (wire.MetadataEntry(
        wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR, VersionVector({"B": 1}).to_bytes()),))
    empty = arrival(ReplicaState("A"), ReplicatedEventMetadata("B", 1, VersionVector({"B": 1}), False))
    assert empty is not None and empty.stored == empty.metadata  # the stored vector is the origin's: 40 / RE
    assert empty.columns() == (40, "RE", empty.metadata.to_bytes())


def test_a_relayed_event_is_judged_against_its_origins_vector_and_keeps_it() -> None:
    """A wrote a1 and C c1 at once; B holds both, and A reads c1 from B with B's merged vector {A:1, C:1}."""
    at_a = ReplicaState("A").write_local()[0]
    relayed = ReplicatedEventMetadata("C", 1, VersionVector({"A": 1, "C": 1}), True)
    akka = arrival(at_a, relayed)  # without the origin's vector: Akka's rule, the conflict hidden
    exact = arrival(at_a, relayed, VersionVector({"C": 1}))
    assert akka is not None and exact is not None
    assert akka.metadata.concurrent is False and exact.metadata.concurrent is True
    assert akka.metadata.version == exact.metadata.version == VersionVector({"A": 1, "C": 1})
    assert akka.state == exact.state
    ser_id, manifest, payload = exact.columns()
    assert (ser_id, manifest) == (wire.PAYLOAD, wire.COMPOSITE_METADATA)
    assert wire.decode_composite(payload) == (
        wire.MetadataEntry(40, "RE", exact.metadata.to_bytes()),
        wire.MetadataEntry(40, "DA", VersionVector({"C": 1}).to_bytes()))
    metadata, others = event_metadata_of(ser_id, manifest, payload)
    assert split_metadata(ReplicatedComposite(metadata, others)) == (exact.metadata, VersionVector({"C": 1}))  # type: ignore[arg-type]


def test_a_seen_event_does_not_arrive() -> None:
    state, first = ReplicaState("A").write_local()
    assert arrival(state, first) is None
    arrived = arrival(state, ReplicatedEventMetadata("B", 2, VersionVector({"B": 2}), False))
    assert arrived is not None
    assert arrival(arrived.state, ReplicatedEventMetadata("B", 1, VersionVector({"B": 1}), False)) is None


versions = st.dictionaries(st.sampled_from("ABC"), st.integers(1, 5), max_size=3).map(VersionVector)


@given(versions, st.sampled_from("BC"), st.integers(1, 5))
def test_without_the_origins_vector_the_rule_is_akkas(version: VersionVector, origin: str, seq_nr: int) -> None:
    state = ReplicaState("A", 3, VersionVector({"A": 3, "B": 1}), {"B": 1})
    metadata = ReplicatedEventMetadata(origin, seq_nr, version.updated(origin, seq_nr), False)
    received, arrived = state.receive(metadata), arrival(state, metadata)
    assert (received is None) == (arrived is None)
    if received is not None and arrived is not None:
        assert (arrived.state, arrived.metadata) == received


def test_the_composite_serializer_reads_and_writes_akkas_composite() -> None:
    registry = SerializerRegistry()
    register_replication_serializers(registry)
    metadata = ReplicatedEventMetadata("C", 1, VersionVector({"A": 1, "C": 1}), True)
    value = ReplicatedComposite(metadata, (wire.MetadataEntry(40, "DA", VersionVector({"C": 1}).to_bytes()),
                                           wire.MetadataEntry(7, "", b"other")))
    stored = registry.serialize(value)
    assert (stored.ser_id, stored.manifest) == (34, "M")
    assert registry.deserialize(stored.ser_id, stored.manifest, stored.payload) == value
    assert value.origin_version == VersionVector({"C": 1})
    assert split_metadata(registry.deserialize(40, "RE", metadata.to_bytes())) == (metadata, metadata.version)
    assert split_metadata(None) == (None, None)
    serializer = CompositeMetadataSerializer()
    with pytest.raises(SerializationError, match="manifest 'X' of Akka's serializer 34 is not read here"):
        serializer.from_binary(stored.payload, "X")
    without = wire.encode_composite((wire.MetadataEntry(7, "", b"other"),))
    with pytest.raises(SerializationError, match="without a ReplicatedEventMetadata or ReplicatedSnapshotMetadata"):
        serializer.from_binary(without, "M")
    with pytest.raises(SerializationError, match="writes ReplicatedComposite values here, not dict"):
        serializer.to_binary({})


def test_a_snapshots_composite_has_akkas_snapshot_metadata_first() -> None:
    registry = SerializerRegistry()
    register_replication_serializers(registry)
    snapshot = ReplicatedSnapshotMetadata(VersionVector({"A": 3, "B": 1}), {"B": 1})
    value = ReplicatedComposite(snapshot, (wire.MetadataEntry(7, "", b"check"),))
    stored = registry.serialize(value)
    assert (stored.ser_id, stored.manifest) == (34, "M")
    assert wire.decode_composite(stored.payload) == (wire.MetadataEntry(40, "RS", snapshot.to_bytes()),
                                                     wire.MetadataEntry(7, "", b"check"))
    assert registry.deserialize(34, "M", stored.payload) == value
    assert split_metadata(value) == (None, None)
