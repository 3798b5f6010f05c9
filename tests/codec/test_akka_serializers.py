"""Akka's standard serializers: ids, the exact bytes Akka writes, rows Akka inserts read back through the
queries, the legacy JSON-under-33 databases, and corrupt payloads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import cbor2
import psycopg
import pytest
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FAST

from pgjournal import Journal, SerializationError, SerializerRegistry, slice_for_persistence_id
from pgjournal.admin.migrate import alembic_config
from pgjournal.admin.stored_format import FORMAT_TABLE, StoredFormat, read_stored_format
from pgjournal.codec import akka_formats as akka

pytestmark = pytest.mark.mode_independent

PID = "ShoppingCart|c1"


@dataclass(frozen=True)
class CartItemAdded:
    itemId: str
    quantity: int


@dataclass(frozen=True)
class Later:
    pass


def akka_registry() -> SerializerRegistry:
    reg = SerializerRegistry()
    reg.register(CartItemAdded, "com.example.CartItemAdded")
    return reg


def legacy(reg: SerializerRegistry) -> SerializerRegistry:
    return reg.for_stored_format(StoredFormat(legacy_json_33=True))


def insert(conn: psycopg.Connection, pid: str, seq_nr: int, ser_id: int, manifest: str, payload: bytes, *,
           meta: tuple[int, str, bytes] | None = None) -> None:
    """A row as Akka's R2DBC journal inserts it: a plain INSERT, db_timestamp from the database clock."""
    meta_id, meta_manifest, meta_payload = meta or (None, None, None)
    conn.execute(
        "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
        "event_ser_manifest, event_payload, writer, adapter_manifest, tags, meta_ser_id, meta_ser_manifest, "
        "meta_payload) VALUES (%s, %s, %s, %s, clock_timestamp() - interval '2 seconds', %s, %s, %s, "
        "'3f1c-akka-writer', '', NULL, %s, %s, %s)",
        (slice_for_persistence_id(pid), pid.partition("|")[0], pid, seq_nr, ser_id, manifest, payload, meta_id,
         meta_manifest, meta_payload),
    )


def stored_ids(dsn: str, pid: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT event_ser_id, event_ser_manifest FROM event_journal WHERE persistence_id = %s ORDER BY seq_nr",
            (pid,)).fetchall()]


# -- the bytes Akka writes -------------------------------------------------------------------------


# (ser_id, value, payload) as Akka's serializers write them: LongSerializer/IntSerializer.toBinary put the
# low byte first and always all 8 / 4 bytes; BooleanSerializer one byte 1/0; StringSerializer UTF-8.
AKKA_BYTES = [
    (akka.LONG, 1, "01 00 00 00 00 00 00 00"),
    (akka.LONG, 0, "00 00 00 00 00 00 00 00"),
    (akka.LONG, -1, "ff ff ff ff ff ff ff ff"),
    (akka.LONG, 0x0102030405060708, "08 07 06 05 04 03 02 01"),
    (akka.LONG, 2**63 - 1, "ff ff ff ff ff ff ff 7f"),
    (akka.LONG, -(2**63), "00 00 00 00 00 00 00 80"),
    (akka.INT, 1, "01 00 00 00"),
    (akka.INT, -2, "fe ff ff ff"),
    (akka.INT, 0x01020304, "04 03 02 01"),
    (akka.INT, -(2**31), "00 00 00 80"),
    (akka.BOOLEAN, True, "01"),
    (akka.BOOLEAN, False, "00"),
    (akka.STRING, "abc", "61 62 63"),
    (akka.STRING, "ü€😀", "c3 bc e2 82 ac f0 9f 98 80"),
    (akka.STRING, "", ""),
    (akka.BYTES, b"\x00\xff", "00 ff"),
    (akka.BYTESTRING, b"\x00\xff", "00 ff"),
]


@pytest.mark.parametrize(("ser_id", "value", "hex_bytes"), AKKA_BYTES)
def test_primitives_decode_the_bytes_akka_writes(ser_id: int, value: Any, hex_bytes: str) -> None:
    reg = SerializerRegistry()
    decoded = reg.deserialize(ser_id, "", bytes.fromhex(hex_bytes))
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize(("ser_id", "value", "hex_bytes"), [r for r in AKKA_BYTES if r[0] != akka.BYTESTRING])
def test_values_encode_to_the_bytes_akka_writes(ser_id: int, value: Any, hex_bytes: str) -> None:
    encoders = {akka.LONG: akka.encode_long, akka.INT: akka.encode_int, akka.BOOLEAN: akka.encode_boolean,
                akka.STRING: akka.encode_string, akka.BYTES: bytes}
    assert encoders[ser_id](value).hex(" ") == hex_bytes
    if ser_id != akka.INT:  # a Python int is written as Akka's Long, the way Akka binds java.lang.Long
        encoded = SerializerRegistry().serialize(value)
        assert (encoded.ser_id, encoded.manifest, encoded.payload.hex(" ")) == (ser_id, "", hex_bytes)


def test_default_bindings_follow_akka() -> None:
    reg = akka_registry()
    kinds = [("text", akka.STRING), ("", akka.STRING), (7, akka.LONG), (True, akka.BOOLEAN), (b"raw", akka.BYTES),
             (bytearray(b"r"), akka.BYTES), (memoryview(b"m"), akka.BYTES), (2**63, akka.JACKSON_JSON),
             (1.5, akka.JACKSON_JSON), (None, akka.JACKSON_JSON)]
    for value, ser_id in kinds:
        assert reg.serialize(value).ser_id == ser_id, value
    assert reg.serialize({"a": 1}).ser_id == reg.serialize([1]).ser_id == akka.JACKSON_JSON
    encoded = reg.serialize(CartItemAdded("apple", 2))
    assert (encoded.ser_id, encoded.manifest, encoded.payload) == (
        31, "com.example.CartItemAdded", b'{"itemId":"apple","quantity":2}')


def test_jackson_payloads_as_akka_writes_them() -> None:
    reg = akka_registry()
    # Jackson JSON: compact text, field order of the class
    assert reg.deserialize(31, "com.example.CartItemAdded", b'{"itemId":"apple","quantity":2}') == CartItemAdded(
        "apple", 2)
    # Jackson CBOR writes objects as indefinite-length maps (0xbf ... 0xff) with definite-length keys
    jackson_cbor = bytes.fromhex("bf 66 69 74 65 6d 49 64 65 61 70 70 6c 65 68 71 75 61 6e 74 69 74 79 02 ff")
    for ser_id in (akka.JACKSON_CBOR, akka.JACKSON_CBOR_264):
        assert reg.deserialize(ser_id, "com.example.CartItemAdded", jackson_cbor) == CartItemAdded("apple", 2)
        assert reg.deserialize(ser_id, "com.example.Unknown", jackson_cbor) == {"itemId": "apple", "quantity": 2}
    # Akka gzips Jackson payloads above compress-larger-than and recognises them by the gzip magic bytes
    import gzip

    big = {"items": ["x" * 100] * 400}
    assert reg.deserialize(31, "", gzip.compress(akka.encode_json(big))) == big
    assert reg.deserialize(33, "", gzip.compress(cbor2.dumps(big))) == big


def test_manifest_versions_and_upcasting() -> None:
    @dataclass(frozen=True)
    class ItemAdded:
        item: str
        count: int

    reg = SerializerRegistry()
    reg.register(ItemAdded, "com.example.ItemAdded", version=3,
                 upcast=lambda data, v: {"item": data["name"], "count": 1} if v == 1 else data)
    encoded = reg.serialize(ItemAdded("a", 2))
    assert encoded.manifest == "com.example.ItemAdded#3"
    assert reg.deserialize(31, encoded.manifest, encoded.payload) == ItemAdded("a", 2)
    # no '#': version 1, as Jackson reads it
    assert reg.deserialize(31, "com.example.ItemAdded", b'{"name":"b"}') == ItemAdded("b", 1)
    assert reg.deserialize(31, "com.example.ItemAdded#2", b'{"item":"c","count":5}') == ItemAdded("c", 5)
    with pytest.raises(SerializationError, match=r"written by version 4 of 'com\.example\.ItemAdded'.* version 3"):
        reg.deserialize(31, "com.example.ItemAdded#4", b'{"item":"c","count":5}')
    # an unregistered manifest with a version still decodes to plain JSON
    assert reg.deserialize(31, "com.example.Other#2", b'{"a":1}') == {"a": 1}
    assert reg.deserialize(31, "weird#name", b'{"a":1}') == {"a": 1}
    with pytest.raises(SerializationError, match="without '#'"):
        reg.register(ItemAdded, "com.example.ItemAdded#3")


def test_pydantic_style_models_register_without_functions() -> None:
    class Model:
        """The two methods pydantic v2 models have."""

        def __init__(self, name: str) -> None:
            self.name = name

        def model_dump(self, mode: str = "python") -> dict:
            return {"name": self.name}

        @classmethod
        def model_validate(cls, data: Any) -> Model:
            return cls(data["name"])

    reg = SerializerRegistry()
    reg.register(Model, "com.example.Model", ser_id=akka.JACKSON_CBOR)
    encoded = reg.serialize(Model("m"))
    assert (encoded.ser_id, cbor2.loads(encoded.payload)) == (33, {"name": "m"})
    assert reg.deserialize(33, "com.example.Model", encoded.payload).name == "m"


# -- round trips, every id -------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=st.integers(akka.LONG_MIN, akka.LONG_MAX))
def test_round_trip_primitive_long(value: int) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert encoded.ser_id == akka.LONG and len(encoded.payload) == 8
    assert reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) == value


@settings(max_examples=150, deadline=None)
@given(value=st.integers(akka.INT_MIN, akka.INT_MAX))
def test_round_trip_primitive_int(value: int) -> None:
    assert SerializerRegistry().deserialize(akka.INT, "", akka.encode_int(value)) == value


@settings(max_examples=150, deadline=None)
@given(value=st.text())
def test_round_trip_primitive_string(value: str) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert (encoded.ser_id, encoded.payload) == (akka.STRING, value.encode())
    assert reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) == value


@given(value=st.booleans())
def test_round_trip_primitive_boolean(value: bool) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert encoded.ser_id == akka.BOOLEAN
    assert reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) is value


@settings(max_examples=150, deadline=None)
@given(value=st.binary())
def test_round_trip_bytes_and_bytestring(value: bytes) -> None:
    reg = SerializerRegistry()
    encoded = reg.serialize(value)
    assert encoded.ser_id == akka.BYTES
    assert reg.deserialize(akka.BYTES, "", encoded.payload) == value
    assert reg.deserialize(akka.BYTESTRING, "", value) == value


@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_round_trip_jackson_json(value: Any) -> None:
    reg = akka_registry()
    wrapped = {"v": value}  # top-level scalars go to the primitive serializers
    encoded = reg.serialize(wrapped)
    assert encoded.ser_id == akka.JACKSON_JSON
    assert reg.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) == wrapped
    assert reg.deserialize(akka.JACKSON_JSON, "com.example.Anything", akka.encode_json(value)) == value


@settings(max_examples=150, deadline=None)
@given(value=cbor_values, ser_id=st.sampled_from([akka.JACKSON_CBOR, akka.JACKSON_CBOR_264]))
def test_round_trip_jackson_cbor(value: Any, ser_id: int) -> None:
    assert SerializerRegistry().deserialize(ser_id, "", akka.encode_cbor(value)) == value


@settings(max_examples=100, deadline=None)
@given(item=st.text(), quantity=st.integers(akka.INT_MIN, akka.INT_MAX),
       ser_id=st.sampled_from(sorted(akka.JACKSON_IDS)))
def test_round_trip_registered_types_in_every_jackson_format(item: str, quantity: int, ser_id: int) -> None:
    reg = SerializerRegistry()
    reg.register(CartItemAdded, "com.example.CartItemAdded", ser_id=ser_id)
    encoded = reg.serialize(CartItemAdded(item, quantity))
    assert (encoded.ser_id, encoded.manifest) == (ser_id, "com.example.CartItemAdded")
    for reader in (reg, legacy(reg)):
        assert reader.deserialize(encoded.ser_id, encoded.manifest, encoded.payload) == CartItemAdded(item, quantity)


@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_legacy_33_reads_old_json_and_akka_cbor(value: Any) -> None:
    reg = legacy(akka_registry())
    assert reg.deserialize(33, "", akka.encode_json(value)) == value  # what pgjournal wrote before 0005
    as_object = {"v": value}  # what Akka's jackson-cbor writes: an object
    assert reg.deserialize(33, "", akka.encode_cbor(as_object)) == as_object


@dataclass(frozen=True)
class Boxed:
    value: Any


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.one_of(
    st.text(), st.integers(akka.LONG_MIN, akka.LONG_MAX), st.booleans(), st.binary(),
    st.dictionaries(st.text(max_size=8), json_values, max_size=3), st.builds(Boxed, json_values),
    st.builds(CartItemAdded, st.text(), st.integers(akka.INT_MIN, akka.INT_MAX)),
), min_size=1, max_size=6))
def test_round_trip_of_every_id_through_postgres(journal: Journal, events: list[Any]) -> None:
    """bytea keeps every payload byte: what is appended reads back equal, whichever serializer wrote it."""
    journal.serializers.register(Boxed, "com.example.Boxed", ser_id=akka.JACKSON_CBOR)  # again: no-op
    journal.serializers.register(CartItemAdded, "com.example.CartItemAdded", ser_id=akka.JACKSON_CBOR_264)
    pid = f"ShoppingCart|{uuid.uuid4().hex}"
    journal.append(pid, events)
    assert [e.event for e in journal.query.current_events_by_persistence_id(pid)] == events


# -- corrupt payloads --------------------------------------------------------------------------------

CORRUPT = [
    (akka.JACKSON_JSON, "com.example.CartItemAdded", b'{"itemId":', "Expecting value"),
    (akka.JACKSON_JSON, "", b"\xff\xfe", "utf-8"),
    (akka.JACKSON_JSON, "", b"\x1f\x8bnot gzip", "gzip"),
    (akka.JACKSON_CBOR, "", b"\xbf\x61", "not CBOR"),
    (akka.JACKSON_CBOR, "", b"\x01\x02", "1 byte(s) after the first data item"),
    (akka.JACKSON_CBOR_264, "", b"", "not CBOR"),
    (akka.LONG, "", b"\x01\x00", "exactly 8 bytes, got 2"),
    (akka.INT, "", b"\x01\x00\x00\x00\x00", "exactly 4 bytes, got 5"),
    (akka.BOOLEAN, "", b"\x02", "0x00 or 0x01, got 02"),
    (akka.BOOLEAN, "", b"", "got no bytes"),
    (akka.STRING, "", b"\xc3", "utf-8"),
    (akka.JACKSON_JSON, "com.example.CartItemAdded", b'{"wrong":1}', "unexpected keyword argument 'wrong'"),
    (akka.JACKSON_JSON, "com.example.CartItemAdded", b"[1]", "expected an object for CartItemAdded"),
]


@pytest.mark.parametrize(("ser_id", "manifest", "payload", "reason"), CORRUPT)
def test_corrupt_payload_names_the_row(ser_id: int, manifest: str, payload: bytes, reason: str) -> None:
    with pytest.raises(SerializationError) as caught:
        akka_registry().deserialize(ser_id, manifest, payload, persistence_id=PID, seq_nr=7)
    error = caught.value
    message = str(error)
    assert f"persistence id {PID!r} seq_nr 7" in message
    assert f"ser_id {ser_id}" in message and f"manifest {manifest!r}" in message
    assert reason in message
    assert (error.persistence_id, error.seq_nr, error.ser_id, error.manifest) == (PID, 7, ser_id, manifest)


def test_corrupt_payloads_in_the_database_fail_every_read_path(journal: Journal, dsn: str) -> None:
    journal.append(PID, [{"fine": 1}])
    journal.save_snapshot(PID, 1, {"state": 1})
    with psycopg.connect(dsn) as conn:
        insert(conn, PID, 2, akka.JACKSON_CBOR, "com.example.CartItemAdded", b"\xbf\x66itemI")
        conn.execute("UPDATE snapshot SET ser_id = 18, snapshot = '\\x0102' WHERE persistence_id = %s", (PID,))
    for read in (lambda: list(journal.query.current_events_by_persistence_id(PID)),
                 lambda: list(journal.query.current_events_by_slices("ShoppingCart", 0, 1023))):
        with pytest.raises(SerializationError) as caught:
            read()
        message = str(caught.value)
        assert f"persistence id {PID!r} seq_nr 2" in message
        assert "ser_id 33 jackson-cbor" in message and "manifest 'com.example.CartItemAdded'" in message
    with pytest.raises(SerializationError, match=r"snapshot of persistence id 'ShoppingCart\|c1' at seq_nr 1 "
                                                 r"\(ser_id 18 primitive-long, manifest ''.*exactly 8 bytes"):
        journal.load_snapshot(PID)
    # the rows before the broken one still read
    assert [e.event for e in journal.query.current_events_by_persistence_id(PID, 1, 1)] == [{"fine": 1}]


def test_corrupt_metadata_is_named_as_metadata(journal: Journal, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        insert(conn, PID, 1, akka.STRING, "", b"ok", meta=(akka.LONG, "", b"\x01"))
    with pytest.raises(SerializationError, match=r"metadata of persistence id 'ShoppingCart\|c1' seq_nr 1 "
                                                 r"\(ser_id 18"):
        list(journal.query.current_events_by_persistence_id(PID))


# -- rows Akka inserts, read through the queries -------------------------------------------------------

AKKA_ROWS = [
    (akka.JACKSON_JSON, "com.example.CartItemAdded", b'{"itemId":"apple","quantity":2}', CartItemAdded("apple", 2)),
    (akka.JACKSON_JSON, "com.example.CartCheckedOut#2", b'{"at":"2026-11-23"}', {"at": "2026-11-23"}),
    (akka.JACKSON_CBOR, "com.example.CartItemAdded",
     bytes.fromhex("bf 66 69 74 65 6d 49 64 64 70 65 61 72 68 71 75 61 6e 74 69 74 79 05 ff"),
     CartItemAdded("pear", 5)),
    (akka.JACKSON_CBOR_264, "com.example.Other", cbor2.dumps({"k": [1, 2]}), {"k": [1, 2]}),
    (akka.STRING, "", "grüße".encode(), "grüße"),
    (akka.LONG, "", bytes.fromhex("2a 00 00 00 00 00 00 00"), 42),
    (akka.INT, "", bytes.fromhex("ff ff ff ff"), -1),
    (akka.BOOLEAN, "", b"\x01", True),
    (akka.BYTES, "", b"\x00\x01\xfe", b"\x00\x01\xfe"),
]


def test_rows_akka_inserts_read_through_the_queries(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        for seq_nr, (ser_id, manifest, payload, _) in enumerate(AKKA_ROWS, 1):
            meta = (akka.STRING, "", b"meta") if seq_nr == 1 else None
            insert(conn, PID, seq_nr, ser_id, manifest, payload, meta=meta)
    expected = [row[3] for row in AKKA_ROWS]
    with Journal.open(dsn, serializers=akka_registry(), **FAST) as journal:
        by_pid = list(journal.query.current_events_by_persistence_id(PID))
        assert [e.event for e in by_pid] == expected
        assert by_pid[0].metadata == "meta"
        by_slices = list(journal.query.current_events_by_slices("ShoppingCart", 0, 1023))
        assert [e.event for e in by_slices] == expected
        got = []
        with journal.query.events_by_slices("ShoppingCart", 0, 1023) as live:
            for envelope in live:
                got.append(envelope.event)
                if len(got) == len(expected):
                    break
        assert got == expected
        # and pgjournal's own writes next to them use the same ids
        journal.append(PID, [CartItemAdded("fig", 1), "s", 3, True, b"b", {"plain": 1}], expected_seq_nr=len(expected))
    assert stored_ids(dsn, PID)[len(expected):] == [
        (31, "com.example.CartItemAdded"), (20, ""), (18, ""), (35, ""), (4, ""), (31, "")]


# -- databases pgjournal wrote before Akka's ids (legacy JSON under 33) ----------------------------------


def migrate_to(dsn: str, revision: str) -> None:
    command.upgrade(alembic_config(dsn), revision)


def format_rows(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT name, value FROM {FORMAT_TABLE}").fetchall()]


def test_fresh_database_reads_33_as_cbor(dsn: str) -> None:
    assert format_rows(dsn) == []
    with psycopg.connect(dsn) as conn:
        added = cbor2.dumps({"itemId": "a", "quantity": 1})
        insert(conn, PID, 1, akka.JACKSON_CBOR, "com.example.CartItemAdded", added)
        insert(conn, PID, 2, akka.JACKSON_CBOR, "", b'{"old":"json"}')
        assert read_stored_format(conn) == StoredFormat(legacy_json_33=False)
    with Journal.open(dsn, serializers=akka_registry(), **FAST) as journal:
        assert not journal.serializers.legacy_json_33
        assert [e.event for e in journal.query.current_events_by_persistence_id(PID, 1, 1)] == [CartItemAdded("a", 1)]
        with pytest.raises(SerializationError, match=r"seq_nr 2 \(ser_id 33 jackson-cbor, manifest ''"):
            list(journal.query.current_events_by_persistence_id(PID))


def test_database_with_legacy_json_33_keeps_reading_after_the_migration(empty_dsn: str) -> None:
    migrate_to(empty_dsn, "0003")
    with psycopg.connect(empty_dsn) as conn:  # what pgjournal before revision 0005 wrote
        insert(conn, PID, 1, 33, "com.example.CartItemAdded", b'{"itemId":"old","quantity":1}')
        insert(conn, PID, 2, 33, "", b'{"plain":[1,2]}')
        insert(conn, PID, 3, 33, "", b'"a string"', meta=(33, "", b'{"m":1}'))
        insert(conn, PID, 4, 4, "", b"raw")
        conn.execute(
            "INSERT INTO snapshot (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "ser_manifest, snapshot) VALUES (%s, 'ShoppingCart', %s, 3, now(), 0, 33, '', '{\"total\":2}')",
            (slice_for_persistence_id(PID), PID))
    migrate_to(empty_dsn, "head")
    assert format_rows(empty_dsn) == [("legacy_json_ser_id", "33")]
    old = [CartItemAdded("old", 1), {"plain": [1, 2]}, "a string", b"raw"]
    with Journal.open(empty_dsn, serializers=akka_registry(), **FAST) as journal:
        assert journal.serializers.legacy_json_33
        events = list(journal.query.current_events_by_persistence_id(PID))
        assert [e.event for e in events] == old and events[2].metadata == {"m": 1}
        assert [e.event for e in journal.query.current_events_by_slices("ShoppingCart", 0, 1023)] == old
        assert journal.load_snapshot(PID).snapshot == {"total": 2}
        # new writes use Akka's ids; Akka's CBOR under 33 written after the migration reads as CBOR
        journal.append(PID, [{"new": True}, CartItemAdded("new", 2)], expected_seq_nr=4)
        with psycopg.connect(empty_dsn) as conn:
            insert(conn, PID, 7, 33, "com.example.CartItemAdded", cbor2.dumps({"itemId": "akka", "quantity": 3}))
        assert [e.event for e in journal.query.current_events_by_persistence_id(PID, 5)] == [
            {"new": True}, CartItemAdded("new", 2), CartItemAdded("akka", 3)]
    assert stored_ids(empty_dsn, PID)[4:6] == [(31, ""), (31, "com.example.CartItemAdded")]
    # the user's registry is not changed by a journal opened on a legacy database
    reg = akka_registry()
    with Journal.open(empty_dsn, serializers=reg, **FAST) as journal:
        assert journal.serializers is not reg and not reg.legacy_json_33
        journal.serializers.register(Later, "com.example.Later")  # registrations stay shared
        assert reg.serialize(Later()).manifest == "com.example.Later"


def test_database_without_33_rows_gets_no_marker(empty_dsn: str) -> None:
    migrate_to(empty_dsn, "0003")
    with psycopg.connect(empty_dsn) as conn:
        insert(conn, PID, 1, 4, "", b"raw")
        insert(conn, PID, 2, 20, "", b"text", meta=(31, "", b"{}"))
    migrate_to(empty_dsn, "head")
    assert format_rows(empty_dsn) == []


def test_the_marker_is_found_in_tag_views_too(empty_dsn: str) -> None:
    migrate_to(empty_dsn, "0003")
    with psycopg.connect(empty_dsn) as conn:  # a tagged event's tag view row; its journal row was deleted
        conn.execute(
            "INSERT INTO tag_views (tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id, "
            "tag_pid_sequence_nr, sequence_nr, writer_uuid, ser_id, ser_manifest, event) VALUES ('t', 0, 1, 1, "
            "gen_random_uuid(), %s, 1, 1, 'w', 33, '', '{\"tagged\":1}')", (PID,))
    migrate_to(empty_dsn, "head")
    assert format_rows(empty_dsn) == [("legacy_json_ser_id", "33")]
