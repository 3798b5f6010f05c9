"""Akka's Replicated Event Sourcing metadata as bytes: the protobuf messages of ``ReplicatedEventSourcing.proto``
(akka/akka, ``akka-persistence-typed/src/main/protobuf``) and the composite metadata of ``MessageFormats.proto``
(``akka-persistence``), bit-exact with what Akka's serializers write.

=========================================  ====  ========  ==================================================
what                                       id    manifest  message
=========================================  ====  ========  ==================================================
an event's replication metadata            40    ``RE``    ``ReplicatedEventMetadata``
a snapshot's replication metadata          40    ``RS``    ``ReplicatedSnapshotMetadata``
a version vector alone                     40    ``DA``    ``VersionVector``
Akka's ``Counter`` / ``Counter.Updated``   40    ``AA`` /  ``Counter`` / ``CounterUpdate``
                                                 ``AB``
several metadata entries on one row        34    ``M``     ``CompositeMetadata`` (``PersistentPayload`` each)
=========================================  ====  ========  ==================================================

Akka R2DBC stores an event's metadata in ``meta_ser_id``/``meta_ser_manifest``/``meta_payload`` as the serializer
of the metadata object says: a replicated event with no other metadata is 40 / ``RE``; with other metadata beside
it, Akka's ``CompositeMetadata`` is 34 / ``M`` whose first entry is the ``ReplicatedEventMetadata`` (Akka puts it
at the head). Snapshots likewise: 40 / ``RS``, or 34 / ``M`` with ``ReplicatedSnapshotMetadata`` first.

The wire format is written here by hand rather than through the ``protobuf`` package: five small proto2 messages
of strings, int64s, a bool and nested repeated entries, where the runtime dependency (and its generated-code
version checks) would outweigh the code. What keeps it honest is the tests: ``tests/codec/test_replicated.py``
encodes fixtures from a transcription of Akka's ``.proto`` with ``protoc --encode`` (``grpcio-tools``, a
development dependency), decodes them here and compares these encoders' bytes to them, and checks random
messages both ways against protoc's generated Python code. To follow a change of Akka's ``.proto``, update the
transcription there (``tests/codec/akka_replicated.proto``) and the fixtures (``tests/codec/fixtures/``).

What Java's protobuf writes, and so what these encoders write: fields in field-number order whatever order the
builder set them in, every required field even at its default (``concurrent = false`` is ``20 00``), an empty
vector as an empty ``VersionVector`` message, int64 as a plain varint (ten bytes when negative). Decoding is
proto2's: fields in any order, unknown fields skipped, the last value of a repeated singular scalar wins and a
repeated singular message merges, a missing required field is an error.

The values here are the messages' fields as they are; their meaning and rules (vectors ordered by key, versions
of at least 1) are :mod:`pgjournal.model.replication`'s. Every ``decode_*`` raises :class:`ProtobufError` (a
``ValueError``) on bytes Akka could not have written.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

#: Akka's ``ReplicatedEventSourcingSerializer`` (``akka.actor.serialization-identifiers`` in akka-persistence-typed)
REPLICATED_EVENT_SOURCING = 40
#: Akka's ``PayloadSerializer`` (akka-persistence), whose manifest ``M`` is ``CompositeMetadata``
PAYLOAD = 34

EVENT_METADATA = "RE"
SNAPSHOT_METADATA = "RS"
VERSION_VECTOR = "DA"
COUNTER = "AA"
COUNTER_UPDATED = "AB"
COMPOSITE_METADATA = "M"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


class ProtobufError(ValueError):
    """Bytes that are not the protobuf message they were read as."""


class EventMetadataFields(NamedTuple):
    """``ReplicatedEventMetadata``: the version vector's entries in the order they were on the wire."""

    origin_replica: str
    origin_sequence_nr: int
    version: tuple[tuple[str, int], ...]
    concurrent: bool


class SnapshotMetadataFields(NamedTuple):
    """``ReplicatedSnapshotMetadata``: the vector, and the highest origin seq_nr seen per replica."""

    version: tuple[tuple[str, int], ...]
    seen_per_replica: tuple[tuple[str, int], ...]


class MetadataEntry(NamedTuple):
    """One ``PersistentPayload`` of a ``CompositeMetadata``; ``manifest`` is ``""`` when absent (Akka leaves the field
    out for an empty manifest)."""

    ser_id: int
    manifest: str
    payload: bytes


# -- writing --------------------------------------------------------------------------------------------


#: One-byte varints, the common case (small sequence numbers, lengths, tags), made once.
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


# The tags of the fields these messages have (1 to 4), made once: every field of every event is written with one.
_VARINT_TAGS = tuple(_tag(field, _VARINT) for field in range(5))
_LEN_TAGS = tuple(_tag(field, _LEN) for field in range(5))


def _int64(field: int, value: int, what: str, of: str | None = None) -> bytes:
    """``value`` as field ``field``; the error names it ``what`` (``what`` of ``of``: the message is only formatted
    for a value that is not an int64)."""
    if isinstance(value, bool) or not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX:
        named = what if of is None else f"{what} of {of!r}"
        raise ProtobufError(f"{named} must be an int64, got {value!r}")
    return _VARINT_TAGS[field] + _varint(value)


def _bytes(field: int, value: bytes) -> bytes:
    return _LEN_TAGS[field] + _varint(len(value)) + value


def _string(field: int, value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise ProtobufError(f"{what} must be a string, got {value!r}")
    try:
        return _bytes(field, value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtobufError(f"{what} must be valid Unicode (no lone surrogates), got {value!r}") from None


# A replica id is encoded the same way in every event of a location, and there are few of them: encoded once.
_REPLICA_IDS = 4096


@functools.lru_cache(maxsize=_REPLICA_IDS)
def _key_field(key: str) -> bytes:
    return _string(1, key, "a version vector's key")


@functools.lru_cache(maxsize=_REPLICA_IDS)
def _origin_field(origin: str) -> bytes:
    return _string(1, origin, "the origin replica")


_CONCURRENT, _NOT_CONCURRENT = _VARINT_TAGS[4] + b"\x01", _VARINT_TAGS[4] + b"\x00"


def _vector(entries: Iterable[tuple[str, int]]) -> bytes:
    return b"".join([_bytes(1, _key_field(key) + _int64(2, version, "the version", key)) for key, version in entries])


def encode_version_vector(entries: Iterable[tuple[str, int]]) -> bytes:
    """``VersionVector`` (manifest ``DA``) with ``entries`` in the given order (Akka's is its keys' order)."""
    return _vector(entries)


def encode_event_metadata(fields: EventMetadataFields) -> bytes:
    """``ReplicatedEventMetadata`` (manifest ``RE``), the bytes Akka's serializer writes for the same fields."""
    if not isinstance(fields.concurrent, bool):
        raise ProtobufError(f"concurrent must be a bool, got {fields.concurrent!r}")
    return (_origin_field(fields.origin_replica)
            + _int64(2, fields.origin_sequence_nr, "the origin sequence number")
            + _bytes(3, _vector(fields.version))
            + (_CONCURRENT if fields.concurrent else _NOT_CONCURRENT))


def encode_snapshot_metadata(fields: SnapshotMetadataFields) -> bytes:
    """``ReplicatedSnapshotMetadata`` (manifest ``RS``) with the seen entries in the given order."""
    seen = b"".join(
        _bytes(2, _string(1, replica, "a seen replica id") + _int64(2, seq_nr, "the seq_nr seen", replica))
        for replica, seq_nr in fields.seen_per_replica)
    return _bytes(1, _vector(fields.version)) + seen


def encode_composite(entries: Iterable[MetadataEntry]) -> bytes:
    """``CompositeMetadata`` (34 / ``M``): each entry a ``PersistentPayload``, its manifest left out when empty."""
    out = bytearray()
    for entry in entries:
        if isinstance(entry.ser_id, bool) or not isinstance(entry.ser_id, int) or not (
                INT32_MIN <= entry.ser_id <= INT32_MAX):
            raise ProtobufError(f"a metadata entry's serializer id must be an int32, got {entry.ser_id!r}")
        body = _VARINT_TAGS[1] + _varint(entry.ser_id) + _bytes(2, bytes(entry.payload))
        if entry.manifest:
            body += _string(3, entry.manifest, "a metadata entry's manifest")
        out += _bytes(1, body)
    return bytes(out)


def _big_integer(value: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: two's complement, big-endian, the fewest bytes that keep the sign."""
    length = (value + (value < 0)).bit_length() // 8 + 1
    return value.to_bytes(length, "big", signed=True)


def encode_counter(value: int) -> bytes:
    """Akka's ``crdt.Counter`` (manifest ``AA``): the value as Java's ``BigInteger`` bytes."""
    return _bytes(1, _big_integer(value))


def encode_counter_updated(delta: int) -> bytes:
    """Akka's ``crdt.Counter.Updated`` (manifest ``AB``)."""
    return _bytes(1, _big_integer(delta))


# -- reading --------------------------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError("varint longer than ten bytes")


def _fields(data: bytes, what: str) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field, wire type, value)`` for each field of one message: a varint as an unsigned int, a length-delimited
    field as its bytes; fixed-width fields and groups are skipped (none of these messages has one)."""
    pos = 0
    depth: list[int] = []
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtobufError(f"field number 0 in {what}")
        value: int | bytes
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire == _LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError(f"truncated field {field} in {what}")
            value, pos = data[pos:pos + length], pos + length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(data):
                raise ProtobufError(f"truncated field {field} in {what}")
            continue
        elif wire == _SGROUP:
            depth.append(field)
            continue
        elif wire == _EGROUP:
            if not depth or depth.pop() != field:
                raise ProtobufError(f"unmatched end of group {field} in {what}")
            continue
        else:
            raise ProtobufError(f"wire type {wire} of field {field} in {what} does not exist")
        if depth:
            continue  # inside an unknown group: skipped
        yield field, wire, value
    if depth:
        raise ProtobufError(f"group {depth[-1]} in {what} never ends")


def _expect(wire: int, want: int, field: int, what: str) -> None:
    if wire != want:
        raise ProtobufError(f"field {field} of {what} has wire type {wire}, expected {want}")


def _as_int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _as_int32(value: int) -> int:
    # Java writes a negative int32 as a ten-byte varint; its low 32 bits are the value
    value &= (1 << 32) - 1
    return value - (1 << 32) if value >= 1 << 31 else value


def _as_string(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtobufError(f"{what} is not UTF-8: {value[:40]!r}") from None


def _pair(data: bytes, what: str, key_name: str, value_name: str) -> tuple[str, int]:
    """A message ``{required string = 1; required int64 = 2}``: a vector's entry or a snapshot's seen entry."""
    key: str | None = None
    number: int | None = None
    for field, wire, value in _fields(data, what):
        if field == 1:
            _expect(wire, _LEN, field, what)
            assert isinstance(value, bytes)
            key = _as_string(value, f"the {key_name} of {what}")
        elif field == 2:
            _expect(wire, _VARINT, field, what)
            assert isinstance(value, int)
            number = _as_int64(value)
    if key is None or number is None:
        raise ProtobufError(f"{what} lacks its required {key_name if key is None else value_name}")
    return key, number


def _read_vector(data: bytes) -> tuple[tuple[str, int], ...]:
    entries = []
    for field, wire, value in _fields(data, "a VersionVector"):
        if field == 1:
            _expect(wire, _LEN, field, "a VersionVector")
            assert isinstance(value, bytes)
            entries.append(_pair(value, "a VersionVector entry", "key", "version"))
    return tuple(entries)


def decode_version_vector(payload: bytes) -> tuple[tuple[str, int], ...]:
    """``VersionVector`` (manifest ``DA``): its entries as on the wire (duplicates included)."""
    return _read_vector(bytes(payload))


def decode_event_metadata(payload: bytes) -> EventMetadataFields:
    """``ReplicatedEventMetadata`` (manifest ``RE``)."""
    what = "ReplicatedEventMetadata"
    origin: str | None = None
    seq_nr: int | None = None
    vector: bytes | None = None
    concurrent: bool | None = None
    for field, wire, value in _fields(bytes(payload), what):
        if field == 1:
            _expect(wire, _LEN, field, what)
            assert isinstance(value, bytes)
            origin = _as_string(value, "the origin replica")
        elif field == 2:
            _expect(wire, _VARINT, field, what)
            assert isinstance(value, int)
            seq_nr = _as_int64(value)
        elif field == 3:
            _expect(wire, _LEN, field, what)
            assert isinstance(value, bytes)
            vector = value if vector is None else vector + value  # a repeated message field merges
        elif field == 4:
            _expect(wire, _VARINT, field, what)
            concurrent = value != 0
    missing = [name for name, got in (("originReplica", origin), ("originSequenceNr", seq_nr),
                                      ("versionVector", vector), ("concurrent", concurrent)) if got is None]
    if missing:
        raise ProtobufError(f"{what} lacks its required {', '.join(missing)}")
    assert origin is not None and seq_nr is not None and vector is not None and concurrent is not None
    return EventMetadataFields(origin, seq_nr, _read_vector(vector), concurrent)


def decode_snapshot_metadata(payload: bytes) -> SnapshotMetadataFields:
    """``ReplicatedSnapshotMetadata`` (manifest ``RS``)."""
    what = "ReplicatedSnapshotMetadata"
    vector: bytes | None = None
    seen = []
    for field, wire, value in _fields(bytes(payload), what):
        if field == 1:
            _expect(wire, _LEN, field, what)
            assert isinstance(value, bytes)
            vector = value if vector is None else vector + value
        elif field == 2:
            _expect(wire, _LEN, field, what)
            assert isinstance(value, bytes)
            seen.append(_pair(value, "a ReplicatedSnapshotMetadata.Seen", "replicaId", "sequenceNr"))
    if vector is None:
        raise ProtobufError(f"{what} lacks its required version")
    return SnapshotMetadataFields(_read_vector(vector), tuple(seen))


def decode_composite(payload: bytes) -> tuple[MetadataEntry, ...]:
    """``CompositeMetadata`` (34 / ``M``): its entries in order."""
    entries = []
    for field, wire, value in _fields(bytes(payload), "CompositeMetadata"):
        if field != 1:
            continue
        _expect(wire, _LEN, field, "CompositeMetadata")
        assert isinstance(value, bytes)
        what = "a PersistentPayload"
        ser_id: int | None = None
        body: bytes | None = None
        manifest = ""
        for f, w, v in _fields(value, what):
            if f == 1:
                _expect(w, _VARINT, f, what)
                assert isinstance(v, int)
                ser_id = _as_int32(v)
            elif f == 2:
                _expect(w, _LEN, f, what)
                assert isinstance(v, bytes)
                body = v
            elif f == 3:
                _expect(w, _LEN, f, what)
                assert isinstance(v, bytes)
                manifest = _as_string(v, "a metadata entry's manifest")
        if ser_id is None or body is None:
            raise ProtobufError(f"{what} lacks its required {'serializerId' if ser_id is None else 'payload'}")
        entries.append(MetadataEntry(ser_id, manifest, body))
    return tuple(entries)


def _read_big_integer(payload: bytes, what: str) -> int:
    value: bytes | None = None
    for field, wire, v in _fields(bytes(payload), what):
        if field == 1:
            _expect(wire, _LEN, field, what)
            assert isinstance(v, bytes)
            value = v
    if value is None:
        raise ProtobufError(f"{what} lacks its required value")
    if not value:
        raise ProtobufError(f"{what} holds an empty BigInteger (Java writes at least one byte)")
    return int.from_bytes(value, "big", signed=True)


def decode_counter(payload: bytes) -> int:
    """Akka's ``crdt.Counter`` (manifest ``AA``): its value."""
    return _read_big_integer(payload, "Counter")


def decode_counter_updated(payload: bytes) -> int:
    """Akka's ``crdt.Counter.Updated`` (manifest ``AB``): its delta."""
    return _read_big_integer(payload, "CounterUpdate")
