"""Akka's replicated metadata bytes: fixtures protoc made from Akka's ``.proto`` decode here and these encoders
write the same bytes; random messages agree with protoc's generated code both ways; bytes Akka could not have
written raise."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgjournal import SerializationError
from pgjournal.codec import replicated as wire
from pgjournal.model.replication import (
    ReplicatedEventMetadata,
    ReplicatedSnapshotMetadata,
    VersionVector,
    event_metadata_columns,
    event_metadata_of,
)

pytestmark = pytest.mark.mode_independent

HERE = Path(__file__).resolve().parent
PROTO = HERE / "akka_replicated.proto"
FIXTURES = HERE / "fixtures" / "replicated"
BINS = sorted(FIXTURES.glob("*.bin"))


def protoc(*args: str, stdin: bytes | None = None) -> bytes:
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", *args], input=stdin,
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """protoc's Python code for Akka's messages, generated for this run (nothing generated is committed)."""
    out = tmp_path_factory.mktemp("akka_pb2")
    protoc(f"--python_out={out}", str(PROTO))
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("akka_replicated_pb2")
    finally:
        sys.path.remove(str(out))


def message_of(path: Path) -> str:
    return path.name.split(".")[1]


# -- the fixtures ---------------------------------------------------------------------------------------

EXPECTED: dict[str, Any] = {
    "local_first": ReplicatedEventMetadata("DC-A", 1, VersionVector({"DC-A": 1}), False),
    "arrived_concurrent": ReplicatedEventMetadata(
        "DC-B", 7, VersionVector({"DC-A": 3, "DC-B": 7, "DC-C": 2**32}), True),
    "unicode_keys": ReplicatedEventMetadata(
        "Zürich", 2**63 - 1, VersionVector({"Ａ": 5, "🌍": 2, "Zürich": 2**63 - 1}), False),
    "empty_vector": ReplicatedSnapshotMetadata(VersionVector(), {}),
    "two_replicas": ReplicatedSnapshotMetadata(VersionVector({"DC-A": 1, "DC-B": 1}), {"DC-B": 1, "DC-A": 1}),
    "negative": -129,
    "big": 2**63,
}


@pytest.mark.parametrize("path", BINS, ids=[p.stem for p in BINS])
def test_a_fixture_decodes_to_its_values_and_encodes_to_its_bytes(path: Path) -> None:
    data = path.read_bytes()
    name, message = path.name.split(".")[:2]
    if message == "ReplicatedEventMetadata":
        value: Any = ReplicatedEventMetadata.from_bytes(data)
        again = value.to_bytes()
    elif message == "ReplicatedSnapshotMetadata":
        value = ReplicatedSnapshotMetadata.from_bytes(data)
        again = value.to_bytes()
    elif message == "Counter":
        value = wire.decode_counter(data)
        again = wire.encode_counter(value)
    elif message == "CounterUpdate":
        value = wire.decode_counter_updated(data)
        again = wire.encode_counter_updated(value)
    else:
        assert message == "CompositeMetadata"
        found, others = event_metadata_of(wire.PAYLOAD, wire.COMPOSITE_METADATA, data)
        assert found == EXPECTED["local_first"]
        assert others == (wire.MetadataEntry(20, "", b"trace-1"),)
        assert event_metadata_columns(found, others) == (34, "M", data)
        return
    assert value == EXPECTED[name]
    assert again == data


def test_the_fixtures_are_what_protoc_makes_of_their_text() -> None:
    for path in BINS:
        text = path.with_suffix(".txtpb").read_bytes()
        assert protoc(f"--encode={message_of(path)}", PROTO.name, stdin=text) == path.read_bytes(), path.name


def test_every_fixture_is_checked() -> None:
    assert {p.name.split(".")[0] for p in BINS} == {*EXPECTED, "with_other"}
    assert {p.with_suffix(".bin") for p in FIXTURES.glob("*.txtpb")} == set(BINS)


def test_the_columns_of_metadata_alone_are_40_RE() -> None:
    meta = EXPECTED["local_first"]
    assert event_metadata_columns(meta) == (40, "RE", (FIXTURES / "local_first.ReplicatedEventMetadata.bin")
                                            .read_bytes())
    assert event_metadata_of(*event_metadata_columns(meta)) == (meta, ())
    assert event_metadata_of(None, None, None) == (None, ())
    # metadata of another kind: no replication metadata, the entry handed back as it is
    assert event_metadata_of(20, "", b"x") == (None, (wire.MetadataEntry(20, "", b"x"),))


# -- against protoc's generated code --------------------------------------------------------------------

keys = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="|"), min_size=1, max_size=6)
versions = st.integers(1, 2**63 - 1)
vectors = st.dictionaries(keys, versions, max_size=5).map(VersionVector)
event_metadata = st.builds(ReplicatedEventMetadata, keys, versions, vectors, st.booleans())
snapshot_metadata = st.builds(ReplicatedSnapshotMetadata, vectors, st.dictionaries(keys, versions, max_size=5))


def pb_event(pb: ModuleType, meta: ReplicatedEventMetadata) -> Any:
    message = pb.ReplicatedEventMetadata(originReplica=meta.origin_replica, originSequenceNr=meta.origin_sequence_nr,
                                         concurrent=meta.concurrent)
    message.versionVector.SetInParent()
    for key, version in meta.version:
        message.versionVector.entries.add(key=key, version=version)
    return message


@given(meta=event_metadata)
def test_event_metadata_agrees_with_protoc_code_both_ways(pb: ModuleType, meta: ReplicatedEventMetadata) -> None:
    theirs = pb_event(pb, meta).SerializeToString()
    assert meta.to_bytes() == theirs
    assert ReplicatedEventMetadata.from_bytes(theirs) == meta
    parsed = pb.ReplicatedEventMetadata.FromString(meta.to_bytes())
    assert (parsed.originReplica, parsed.originSequenceNr, parsed.concurrent) == (
        meta.origin_replica, meta.origin_sequence_nr, meta.concurrent)
    assert [(e.key, e.version) for e in parsed.versionVector.entries] == list(meta.version)


@given(meta=snapshot_metadata)
def test_snapshot_metadata_agrees_with_protoc_code_both_ways(pb: ModuleType,
                                                             meta: ReplicatedSnapshotMetadata) -> None:
    message = pb.ReplicatedSnapshotMetadata()
    message.version.SetInParent()
    for key, version in meta.version:
        message.version.entries.add(key=key, version=version)
    for replica, seq_nr in sorted(meta.seen_per_replica.items(), key=lambda kv: kv[0].encode("utf-16-be")):
        message.seenPerReplica.add(replicaId=replica, sequenceNr=seq_nr)
    assert meta.to_bytes() == message.SerializeToString()
    # Akka writes its map's order: any order of the seen entries decodes the same
    message.seenPerReplica.reverse()
    assert ReplicatedSnapshotMetadata.from_bytes(message.SerializeToString()) == meta


@given(entries=st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.text(max_size=4), st.binary(max_size=20)),
                        max_size=4))
def test_composite_metadata_agrees_with_protoc_code(pb: ModuleType, entries: list[tuple[int, str, bytes]]) -> None:
    message = pb.CompositeMetadata()
    for ser_id, manifest, payload in entries:
        entry = message.payloads.add(serializerId=ser_id, payload=payload)
        if manifest:
            entry.payloadManifest = manifest.encode()
    ours = wire.encode_composite(wire.MetadataEntry(*e) for e in entries)
    assert ours == message.SerializeToString()
    assert wire.decode_composite(ours) == tuple(wire.MetadataEntry(*e) for e in entries)


@given(value=st.integers(-(2**200), 2**200))
def test_counters_are_java_big_integers(pb: ModuleType, value: int) -> None:
    data = wire.encode_counter(value)
    raw = pb.Counter.FromString(data).value
    # Java's toByteArray: ceil((bitLength() + 1) / 8) bytes, bitLength counting no sign bit (of ~x when negative)
    bit_length = (value if value >= 0 else ~value).bit_length()
    assert len(raw) == -(-(bit_length + 1) // 8)
    assert int.from_bytes(raw, "big", signed=True) == value
    assert wire.decode_counter(data) == value
    assert wire.decode_counter_updated(wire.encode_counter_updated(value)) == value


def test_java_big_integer_lengths() -> None:
    for value, raw in [(0, "00"), (1, "01"), (-1, "ff"), (127, "7f"), (128, "0080"), (-128, "80"), (-129, "ff7f"),
                       (255, "00ff"), (256, "0100"), (-256, "ff00"), (-257, "feff")]:
        assert wire.encode_counter(value) == b"\n" + bytes([len(raw) // 2]) + bytes.fromhex(raw), value


# -- proto2 reading rules, each against protoc's runtime -------------------------------------------------


def test_unknown_fields_are_skipped(pb: ModuleType) -> None:
    base = EXPECTED["local_first"].to_bytes()
    # field 9 varint, field 10 fixed64, field 11 bytes, field 12 fixed32, group 13 holding a field: all unknown
    extra = bytes.fromhex("4805" "510102030405060708" "5a03616263" "6501020304" "6b" "0801" "6c")
    assert ReplicatedEventMetadata.from_bytes(extra + base) == EXPECTED["local_first"]
    assert pb.ReplicatedEventMetadata.FromString(extra + base).originReplica == "DC-A"


def test_a_repeated_scalar_takes_the_last_and_a_repeated_message_merges(pb: ModuleType) -> None:
    first = ReplicatedEventMetadata("A", 1, VersionVector({"A": 1}), True).to_bytes()
    second = ReplicatedEventMetadata("B", 2, VersionVector({"B": 2}), False).to_bytes()
    theirs = pb.ReplicatedEventMetadata.FromString(first + second)
    ours = wire.decode_event_metadata(first + second)
    assert ours == wire.EventMetadataFields(theirs.originReplica, theirs.originSequenceNr,
                                            tuple((e.key, e.version) for e in theirs.versionVector.entries),
                                            theirs.concurrent)
    assert ours == wire.EventMetadataFields("B", 2, (("A", 1), ("B", 2)), False)


def test_fields_in_any_order_decode(pb: ModuleType) -> None:
    meta = EXPECTED["arrived_concurrent"]
    data = meta.to_bytes()
    # concurrent (field 4, the last two bytes) moved to the front
    assert ReplicatedEventMetadata.from_bytes(data[-2:] + data[:-2]) == meta


@pytest.mark.parametrize("data, message", [
    (bytes.fromhex("0a0141"), "lacks its required originSequenceNr, versionVector, concurrent"),
    (bytes.fromhex("0a014110011a002000")[:-1], "truncated varint"),
    (bytes.fromhex("0a05"), "truncated field 1"),
    (bytes.fromhex("0801"), "field 1 of ReplicatedEventMetadata has wire type 0, expected 2"),
    (bytes.fromhex("0a0141100120001a040a020a00"), "lacks its required version"),
    (bytes.fromhex("0a014110" + "ff" * 10 + "01"), "varint longer than ten bytes"),
    (bytes.fromhex("0f"), "wire type 7"),
    (bytes.fromhex("0b"), "never ends"),
    (bytes.fromhex("0c"), "unmatched end of group"),
    (bytes.fromhex("00"), "field number 0"),
])
def test_bytes_akka_could_not_write_raise_naming_what_is_wrong(pb: ModuleType, data: bytes, message: str) -> None:
    with pytest.raises(SerializationError, match=message) as raised:
        ReplicatedEventMetadata.from_bytes(data)
    assert (raised.value.ser_id, raised.value.manifest) == (40, "RE")
    # protoc's runtime refuses the same bytes too (Java's parseFrom also checks the required fields; Python's
    # leaves that to IsInitialized)
    try:
        parsed = pb.ReplicatedEventMetadata.FromString(data)
    except Exception:
        return
    assert not parsed.IsInitialized()


@pytest.mark.parametrize("meta, message", [
    (wire.EventMetadataFields("A", 0, (), False), "origin sequence number must be an int from 1"),
    (wire.EventMetadataFields("A", -5, (), False), "origin sequence number must be an int from 1"),
    (wire.EventMetadataFields("A", 1, (("B", 0),), False), "the version of 'B' in a version vector"),
    (wire.EventMetadataFields("", 1, (), False), "the origin replica must be a non-empty string"),
    (wire.EventMetadataFields("A|B", 1, (), False), "the origin replica must be a non-empty string without"),
])
def test_values_akka_never_writes_are_refused_on_reading(meta: wire.EventMetadataFields, message: str) -> None:
    data = wire.encode_event_metadata(meta)
    assert wire.decode_event_metadata(data) == meta  # the wire holds them; the model refuses them
    with pytest.raises(SerializationError, match=message):
        ReplicatedEventMetadata.from_bytes(data)


def test_a_string_that_is_not_utf8_is_refused(pb: ModuleType) -> None:
    data = bytes.fromhex("0a02ff4110011a002000")
    # proto2 does not check UTF-8 (protoc's runtime takes it, Java would decode it with replacement characters);
    # Akka only writes strings Java encoded, always valid, so such bytes are not Akka's
    assert pb.ReplicatedEventMetadata.FromString(data).IsInitialized()
    with pytest.raises(SerializationError, match=r"the origin replica is not UTF-8: b'\\xffA'"):
        ReplicatedEventMetadata.from_bytes(data)


def test_a_negative_int64_is_ten_bytes_as_java_writes_it(pb: ModuleType) -> None:
    fields = wire.EventMetadataFields("A", -1, (), False)
    theirs = pb.ReplicatedEventMetadata(originReplica="A", originSequenceNr=-1, concurrent=False)
    theirs.versionVector.SetInParent()
    assert wire.encode_event_metadata(fields) == theirs.SerializeToString()
    assert wire.decode_event_metadata(theirs.SerializeToString()) == fields


def test_a_negative_serializer_id_reads_back_from_its_ten_bytes(pb: ModuleType) -> None:
    message = pb.CompositeMetadata()
    message.payloads.add(serializerId=-7, payload=b"")
    assert wire.decode_composite(message.SerializeToString()) == (wire.MetadataEntry(-7, "", b""),)


@pytest.mark.parametrize("bad, message", [
    (wire.EventMetadataFields("A", 2**63, (), False), "origin sequence number must be an int64"),
    (wire.EventMetadataFields("A", 1, (("B", True),), False), "the version of 'B' must be an int64"),
    (wire.EventMetadataFields("\udc80", 1, (), False), "no lone surrogates"),
    (wire.EventMetadataFields("A", 1, (), 1), "concurrent must be a bool"),  # type: ignore[arg-type]
])
def test_encoding_refuses_what_protobuf_cannot_hold(bad: wire.EventMetadataFields, message: str) -> None:
    with pytest.raises(wire.ProtobufError, match=message):
        wire.encode_event_metadata(bad)


def test_an_empty_big_integer_is_refused() -> None:
    with pytest.raises(wire.ProtobufError, match="empty BigInteger"):
        wire.decode_counter(b"\n\x00")
    with pytest.raises(wire.ProtobufError, match="lacks its required value"):
        wire.decode_counter_updated(b"")
