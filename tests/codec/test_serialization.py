"""Serializer registry: JSON by default, raw bytes, registered types, custom binary formats, clear errors.

Akka's ids, bytes, legacy databases and corrupt payloads: tests/codec/test_akka_serializers.py."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pgjournal import Journal, SerializationError, SerializerRegistry, slice_for_persistence_id
from pgjournal.codec.serialization import BYTES_SER_ID, JSON_SER_ID

pytestmark = pytest.mark.mode_independent

PID = "Cart|1"


@dataclass(frozen=True)
class ItemAdded:
    item: str
    quantity: int


@dataclass(frozen=True)
class Point:
    x: float
    y: float


class Money:
    """Not a dataclass: registered with explicit functions."""

    def __init__(self, cents: int) -> None:
        self.cents = cents

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and other.cents == self.cents


class PointSerializer:
    """A custom binary format: two doubles."""

    def to_binary(self, obj: Any) -> tuple[str, bytes]:
        return "point-v1", struct.pack(">dd", obj.x, obj.y)

    def from_binary(self, payload: bytes, manifest: str) -> Any:
        assert manifest == "point-v1"
        return Point(*struct.unpack(">dd", payload))


def registry() -> SerializerRegistry:
    reg = SerializerRegistry()
    reg.register(ItemAdded, "cart.item-added")
    reg.register(Money, to_dict=lambda m: {"cents": m.cents}, from_dict=lambda d: Money(d["cents"]))
    reg.register_serializer(1001, PointSerializer(), Point)
    return reg


def stored(dsn: str, pid: str) -> list[tuple[int, str, bytes]]:
    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1], bytes(r[2])) for r in conn.execute(
            "SELECT event_ser_id, event_ser_manifest, event_payload FROM event_journal "
            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()]


# -- unit level ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None, True]}, 2.5, 2**64, None, [], {"nested": {"k": "v"}}])
def test_json_is_the_default(value: Any) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert (encoded.ser_id, encoded.manifest) == (JSON_SER_ID, "")
    assert JSON_SER_ID == 31  # Akka's jackson-json
    assert reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) == value


@pytest.mark.parametrize(("value", "ser_id"), [("text ünïcode", 20), (42, 18), (False, 35)])
def test_scalars_use_akkas_primitive_serializers(value: Any, ser_id: int) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert (encoded.ser_id, encoded.manifest) == (ser_id, "")
    decoded = reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload)
    assert decoded == value and type(decoded) is type(value)


def test_raw_bytes() -> None:
    reg = SerializerRegistry()
    for value in (b"\x00\x01\xff", bytearray(b"ab"), memoryview(b"cd")):
        encoded = reg.serialize(value)
        assert (encoded.ser_id, encoded.manifest, encoded.payload) == (BYTES_SER_ID, "", bytes(value))
        assert reg.deserialize(BYTES_SER_ID, "", encoded.payload) == bytes(value)


def test_registered_types_carry_their_manifest() -> None:
    reg = registry()
    encoded = reg.serialize(ItemAdded("apple", 3))
    assert (encoded.ser_id, encoded.manifest, encoded.payload) == (
        JSON_SER_ID, "cart.item-added", b'{"item":"apple","quantity":3}')
    assert reg.serialize(Money(5)).manifest == "Money"  # default manifest: the class name
    assert reg.deserialize(JSON_SER_ID, "Money", b'{"cents":5}') == Money(5)
    # an unknown manifest (written by another application) decodes to plain JSON
    assert reg.deserialize(JSON_SER_ID, "other.Type", b'{"a":1}') == {"a": 1}


def test_register_rejects_what_it_cannot_handle() -> None:
    reg = registry()
    with pytest.raises(SerializationError, match=r"Money.* is neither a dataclass nor a pydantic model: pass to_dict "):
        SerializerRegistry().register(Money)
    with pytest.raises(SerializationError, match=r"manifest 'cart\.item-added' is already registered for ItemAdded"):
        reg.register(Point, "cart.item-added")
    for bad_id in (JSON_SER_ID, BYTES_SER_ID, 18, 19, 20, 21, 32, 33, 35, 0, -1, 2**31):
        with pytest.raises(SerializationError, match=f"ser_id must be a positive int32.*got {bad_id}"):
            reg.register_serializer(bad_id, PointSerializer(), Point)


@pytest.mark.parametrize(("value", "type_name"), [
    (object(), "object"), ({1, 2}, "set"), (datetime(2026, 1, 1, tzinfo=UTC), "datetime"),
    (float("nan"), "float"), ({"k": {1, 2}}, "dict"), (ItemAdded("a", 1), "ItemAdded"),
])
def test_unencodable_values_name_their_type(value: Any, type_name: str) -> None:
    with pytest.raises(SerializationError) as caught:
        SerializerRegistry().serialize(value)
    message = str(caught.value)
    assert f"cannot serialize {type_name} value" in message
    assert "expected a JSON value" in message and "registered type" in message


def test_custom_serializer_failures_are_serialization_errors() -> None:
    class Broken:
        def to_binary(self, obj: Any) -> tuple[str, bytes]:
            raise ValueError("boom")

        def from_binary(self, payload: bytes, manifest: str) -> Any:
            raise ValueError("bang")

    reg = SerializerRegistry()
    reg.register_serializer(2000, Broken(), Point)
    with pytest.raises(SerializationError, match="serializer 2000 could not encode Point: boom"):
        reg.serialize(Point(1, 2))
    with pytest.raises(SerializationError, match="serializer 2000 could not decode manifest 'm' of 'p' seq_nr 3: bang"):
        reg.deserialize(2000, "m", b"", where=" of 'p' seq_nr 3")
    with pytest.raises(SerializationError, match="cannot decode payload"):
        reg.deserialize(JSON_SER_ID, "", b"{not json")


@pytest.mark.parametrize(("returned", "types"), [
    (("m", "text, not bytes"), "(str, str)"), ((None, b"x"), "(NoneType, bytes)"), ((7, 8), "(int, int)"),
])
def test_custom_serializer_returning_the_wrong_types(returned: tuple, types: str) -> None:
    class Sloppy:
        def to_binary(self, obj: Any) -> tuple[str, bytes]:
            return returned  # type: ignore[return-value]

        def from_binary(self, payload: bytes, manifest: str) -> Any:
            return None

    reg = SerializerRegistry()
    reg.register_serializer(3000, Sloppy(), Point)
    with pytest.raises(SerializationError) as caught:
        reg.serialize(Point(0, 0))
    assert f"serializer 3000 returned {types} for Point" in str(caught.value)
    assert "expected to_binary to return (str manifest, bytes payload)" in str(caught.value)


# -- through the database --------------------------------------------------------------------------


def test_round_trip_of_every_kind_through_the_journal(dsn: str) -> None:
    events = [{"plain": True}, b"\x00raw\xff", ItemAdded("pear", 2), Money(199), Point(1.5, -2.0), "text"]
    with Journal.open(dsn, serializers=registry()) as journal:
        written = journal.append(PID, events, metadata=ItemAdded("meta", 0))
        assert [e.event for e in written] == events
        read = list(journal.query.current_events_by_persistence_id(PID))
        assert [e.event for e in read] == events
        assert {e.metadata for e in read} == {ItemAdded("meta", 0)}
    rows = stored(dsn, PID)
    assert [(r[0], r[1]) for r in rows] == [
        (JSON_SER_ID, ""), (BYTES_SER_ID, ""), (JSON_SER_ID, "cart.item-added"), (JSON_SER_ID, "Money"),
        (1001, "point-v1"), (20, ""),
    ]
    assert rows[1][2] == b"\x00raw\xff"
    assert rows[4][2] == struct.pack(">dd", 1.5, -2.0)


def test_unencodable_event_writes_nothing(journal: Journal, dsn: str) -> None:
    with pytest.raises(SerializationError, match="cannot serialize set value"):
        journal.append(PID, [{"ok": 1}, {"ok": 2}, {1, 2}])
    with pytest.raises(SerializationError, match="cannot serialize object value"):
        journal.append(PID, ["fine"], metadata=object())
    assert stored(dsn, PID) == []
    assert journal.highest_seq_nr(PID) == 0


def test_unknown_ser_id_on_read_names_it_with_pid_and_seq_nr(journal: Journal, dsn: str) -> None:
    journal.append(PID, ["fine"])
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES (%s, 'Cart', %s, 2, now(), 777, 'v9', 'x', 'akka')",
            (slice_for_persistence_id(PID), PID),
        )
    with pytest.raises(SerializationError) as caught:
        list(journal.query.current_events_by_persistence_id(PID))
    message = str(caught.value)
    assert "unknown serializer id 777" in message and "'v9'" in message
    assert repr(PID) in message and "seq_nr 2" in message
    assert "register_serializer" in message
    # the same registry learns the id and the row reads
    journal.serializers.register_serializer(777, PointSerializer())
    with pytest.raises(SerializationError, match="serializer 777 could not decode manifest 'v9'"):
        list(journal.query.current_events_by_persistence_id(PID))
    assert [e.event for e in journal.query.current_events_by_persistence_id(PID, 1, 1)] == ["fine"]
