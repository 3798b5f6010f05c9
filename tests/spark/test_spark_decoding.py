"""Spark reads decode payloads as the journal does: the journal's serializer registry travels to the tasks
(upcasters, registered types and serializers, a transcoder's key store), the database's legacy JSON-33 marker
is honoured, and a crypto-shredded payload reads as ``redacted``. The native source (batch and stream) and the
JDBC reader give the same rows.

The types and upcasters (support.upcasting's) and the serializer below live in test modules, which Spark's Python
workers cannot import: :mod:`spark.shipping` sends them by value, as it does for a user's script and its
sibling modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2
import psycopg
import pytest
from alembic import command
from support import upcasting
from support.upcasting import NAME, ItemAdded, ItemAddedV1, ItemAddedV2

from pgjournal import Journal, SerializerRegistry, slice_for_persistence_id
from pgjournal.admin.migrate import alembic_config
from pgjournal.codec.transcoding import Transcoder
from pgjournal.spark.datasource import register
from pgjournal.spark.read import read_events
from pgjournal.spark.system import SKIP_ENV, spark_skipped
from pgjournal.state.keystore import InMemoryKeyStore, PostgresKeyStore

pytestmark = pytest.mark.spark
if spark_skipped():
    pytest.skip(f"{SKIP_ENV} is set", allow_module_level=True)

ENTITY = "Cart"


def registry_v(version: int, transcoder: Transcoder | None = None) -> SerializerRegistry:
    """The registry of the application at ``version`` (support.upcasting's), with ``transcoder``."""
    return upcasting.registry_v(version).with_transcoder(transcoder)


@dataclass(frozen=True)
class Point:
    x: int
    y: int


class PointSerializer:
    """A format of its own: ``b"x,y"`` under ser_id 7001."""

    def to_binary(self, obj: Point) -> tuple[str, bytes]:
        return "point", f"{obj.x},{obj.y}".encode()

    def from_binary(self, payload: bytes, manifest: str) -> Point:
        x, y = payload.decode().split(",")
        return Point(int(x), int(y))


@pytest.fixture
def registered(spark: Any) -> Iterator[Callable[[SerializerRegistry], None]]:
    """Register the source with a registry for one test; the plain source again afterwards."""
    yield lambda registry: register(spark, serializers=registry)
    register(spark)


def write_three_versions(dsn: str, pids: int = 4) -> None:
    for version in (1, 2, 3):
        with Journal.open(dsn, serializers=registry_v(version)) as journal:
            event = {1: ItemAddedV1("old"), 2: ItemAddedV2("mid"), 3: ItemAdded("new", 5)}[version]
            for p in range(pids):
                journal.append(f"{ENTITY}|{p}", [event])


def native(spark: Any, dsn: str, **options: Any) -> Any:
    reader = spark.read.format("pgjournal").option("dsn", dsn)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def events_of(frame: Any) -> dict[tuple[str, int], tuple[Any, bool]]:
    rows = frame.select("persistence_id", "seq_nr", "event", "redacted").collect()
    return {(r[0], r[1]): (r[2].asDict(recursive=True) if r[2] is not None else None, r[3]) for r in rows}


CURRENT = {1: {"item": "old", "quantity": 1}, 2: {"item": "mid", "quantity": 1}, 3: {"item": "new", "quantity": 5}}


def test_upcasters_apply_in_batch_stream_and_jdbc_reads(spark: Any, dsn: str, registered: Any,
                                                        tmp_path: Path) -> None:
    write_three_versions(dsn)
    expected = {(f"{ENTITY}|{p}", v): (CURRENT[v], False) for p in range(4) for v in (1, 2, 3)}
    # without the registry: the rows as stored, each version in its own shape
    plain = native(spark, dsn, entityType=ENTITY, payloadSchema="name STRING, item STRING, quantity INT")
    assert {tuple(r) for r in plain.select("seq_nr", "event.*").distinct().collect()} == {
        (1, "old", None, None), (2, None, "mid", None), (3, None, "new", 5)}
    registered(registry_v(3))
    inferred = native(spark, dsn, entityType=ENTITY, decode="true")
    assert dict(inferred.dtypes)["event"] == "struct<item:string,quantity:bigint>"
    assert dict(inferred.dtypes)["redacted"] == "boolean"
    assert events_of(inferred) == expected
    # a stream query (availableNow into a memory sink) decodes alike
    query = (spark.readStream.format("pgjournal").option("dsn", dsn).option("entityType", ENTITY)
             .option("payloadSchema", "item STRING, quantity INT").option("maxEventsPerTrigger", 5).load()
             .writeStream.format("memory").queryName("upcast_stream").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    query.awaitTermination(300)
    assert events_of(spark.table("upcast_stream")) == expected
    # the JDBC reader, given the registry, gives the same rows
    jdbc = read_events(spark, dsn, entity_type=ENTITY, slice_ranges=2, serializers=registry_v(3))
    assert events_of(jdbc) == expected


def test_registered_types_custom_serializers_and_cbor_decode(spark: Any, dsn: str, registered: Any
                                                             ) -> None:
    registry = registry_v(3)
    registry.register(Point, "com.example.Point", ser_id=33)  # Jackson CBOR
    registry.register_serializer(7001, PointSerializer())
    with Journal.open(dsn, serializers=registry) as journal:
        journal.append(f"{ENTITY}|a", [ItemAdded("mug", 2), Point(1, 2), {"item": "plain", "quantity": 3}])
    with psycopg.connect(dsn) as conn:  # a row of the custom serializer, as another writer would store it
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES (%s, %s, %s, 1, now(), 7001, 'point', '7,8', 'w')",
            (slice_for_persistence_id(f"{ENTITY}|b"), ENTITY, f"{ENTITY}|b"))
    schema = "item STRING, quantity INT, x INT, y INT"
    plain = events_of(native(spark, dsn, entityType=ENTITY, payloadSchema=schema))
    assert plain[(f"{ENTITY}|b", 1)] == (None, False)  # a plain registry knows no serializer 7001
    registered(registry)
    got = events_of(native(spark, dsn, entityType=ENTITY, payloadSchema=schema))
    blank = dict.fromkeys(("item", "quantity", "x", "y"))
    assert got == {(f"{ENTITY}|a", 1): ({**blank, "item": "mug", "quantity": 2}, False),
                   (f"{ENTITY}|a", 2): ({**blank, "x": 1, "y": 2}, False),
                   (f"{ENTITY}|a", 3): ({**blank, "item": "plain", "quantity": 3}, False),
                   (f"{ENTITY}|b", 1): ({**blank, "x": 7, "y": 8}, False)}
    assert events_of(read_events(spark, dsn, entity_type=ENTITY, payload_schema=schema, serializers=registry)) == got


def insert(conn: psycopg.Connection, pid: str, seq_nr: int, ser_id: int, manifest: str, payload: bytes) -> None:
    conn.execute(
        "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
        "event_ser_manifest, event_payload, writer) VALUES (%s, %s, %s, %s, now(), %s, %s, %s, 'old')",
        (slice_for_persistence_id(pid), pid.partition("|")[0], pid, seq_nr, ser_id, manifest, payload))


def test_a_database_migrated_from_0003_reads_its_json_under_33(spark: Any, empty_dsn: str,
                                                               registered: Any) -> None:
    command.upgrade(alembic_config(empty_dsn), "0003")
    with psycopg.connect(empty_dsn) as conn:  # what pgjournal before revision 0005 wrote: JSON under 33
        for p in range(3):
            insert(conn, f"{ENTITY}|old{p}", 1, 33, "", b'{"item":"old","quantity":%d}' % p)
        insert(conn, f"{ENTITY}|old0", 2, 33, NAME, b'{"name":"v1"}')  # version 1 of the registered type
    command.upgrade(alembic_config(empty_dsn), "head")
    with psycopg.connect(empty_dsn) as conn:  # Akka's CBOR under 33 after the migration reads as CBOR
        insert(conn, f"{ENTITY}|akka", 1, 33, "", cbor2.dumps({"item": "cbor", "quantity": 9}))
    with Journal.open(empty_dsn) as journal:
        journal.append(f"{ENTITY}|new", [{"item": "new", "quantity": 4}])  # written as 31 now
    expected = {(f"{ENTITY}|old{p}", 1): ({"item": "old", "quantity": p}, False) for p in range(3)}
    expected |= {(f"{ENTITY}|akka", 1): ({"item": "cbor", "quantity": 9}, False),
                 (f"{ENTITY}|new", 1): ({"item": "new", "quantity": 4}, False),
                 (f"{ENTITY}|old0", 2): ({"item": None, "quantity": None}, False)}  # {"name": "v1"} as stored
    schema = "item STRING, quantity INT"
    assert events_of(native(spark, empty_dsn, entityType=ENTITY, payloadSchema=schema)) == expected
    assert events_of(read_events(spark, empty_dsn, entity_type=ENTITY, payload_schema=schema)) == expected
    registered(registry_v(3))  # and the version 1 row under 33 is upcast
    upcast = {**expected, (f"{ENTITY}|old0", 2): ({"item": "v1", "quantity": 1}, False)}
    assert events_of(native(spark, empty_dsn, entityType=ENTITY, payloadSchema=schema)) == upcast
    assert events_of(read_events(spark, empty_dsn, entity_type=ENTITY, payload_schema=schema,
                                 serializers=registry_v(3))) == upcast


def write_secrets(dsn: str, keys: Any) -> None:
    """Encrypted (and, when large enough, compressed) events of three pids; ``Cart|gone`` is then shredded."""
    registry = registry_v(3, Transcoder(compression="zlib", compress_min_size=40, key_store=keys))
    with Journal.open(dsn, serializers=registry) as journal:
        for pid in ("kept", "gone", "also"):
            journal.append(f"{ENTITY}|{pid}", [ItemAdded(pid, 1), {"item": pid * 20, "quantity": 2}])
    keys.delete_key(f"{ENTITY}|gone")


SECRETS = {(f"{ENTITY}|{pid}", n): (None, True) if pid == "gone" else
           ({"item": pid if n == 1 else pid * 20, "quantity": n}, False)
           for pid in ("kept", "gone", "also") for n in (1, 2)}


def test_encrypted_payloads_decode_with_the_registry_key_store_and_shredded_ones_are_redacted(
        spark: Any, dsn: str, registered: Any) -> None:
    keys = InMemoryKeyStore()
    write_secrets(dsn, keys)
    with pytest.raises(Exception, match=r"ConfigurationError: the payload of persistence id 'Cart\|.*' is encrypted "
                                        r"and this Spark read has no key store"):
        native(spark, dsn, entityType=ENTITY, decode="true")  # inferring the schema needs the keys: at load()
    schema = "item STRING, quantity INT"
    with pytest.raises(Exception, match=r"is encrypted and this Spark read has no key store"):
        native(spark, dsn, entityType=ENTITY, payloadSchema=schema).collect()  # in the task
    registered(registry_v(3, Transcoder(key_store=keys)))  # the in-memory keys, copied to the workers
    frame = native(spark, dsn, entityType=ENTITY, decode="true")
    assert dict(frame.dtypes)["event"] == "struct<item:string,quantity:bigint>"
    assert events_of(frame) == SECRETS
    assert frame.where("redacted").select("persistence_id").distinct().collect()[0][0] == f"{ENTITY}|gone"
    only_flag = native(spark, dsn, entityType=ENTITY, columns="persistence_id,redacted")
    assert sorted(tuple(r) for r in only_flag.where("redacted").collect()) == [(f"{ENTITY}|gone", True)] * 2
    assert events_of(read_events(spark, dsn, entity_type=ENTITY, payload_schema=schema,
                                 serializers=registry_v(3, Transcoder(key_store=keys)))) == SECRETS


def test_encrypted_payloads_decode_with_a_postgres_key_store_by_option_or_registry(
        spark: Any, dsn: str, registered: Any) -> None:
    master = os.urandom(32)
    with PostgresKeyStore(dsn, master_key=master, cache_ttl=0) as keys:
        write_secrets(dsn, keys)
        schema = "item STRING, quantity INT"
        by_option = native(spark, dsn, entityType=ENTITY, payloadSchema=schema, masterKey=master.hex())
        assert events_of(by_option) == SECRETS
        plan = by_option._jdf.queryExecution().toString() + by_option._jdf.queryExecution().executedPlan().toString()
        assert master.hex() not in plan
        import base64

        assert events_of(native(spark, dsn, entityType=ENTITY, decode="true",
                                masterKey=base64.b64encode(master).decode())) == SECRETS
        with pytest.raises(Exception, match=r"DecryptionError: cannot unwrap the payload key of persistence id"):
            native(spark, dsn, entityType=ENTITY, payloadSchema=schema, masterKey=os.urandom(32).hex()).collect()
        with pytest.raises(Exception, match=r"InvalidArgument: option masterKey must be 32 bytes .*got 6 characters"):
            native(spark, dsn, entityType=ENTITY, payloadSchema=schema, masterKey="abcdef")
        registered(registry_v(3, Transcoder(key_store=keys)))  # reopened on the workers from its DSN
        assert events_of(native(spark, dsn, entityType=ENTITY, payloadSchema=schema)) == SECRETS
        with pytest.raises(Exception, match=r"ConfigurationError: option masterKey gives a key store, and so does"):
            native(spark, dsn, entityType=ENTITY, payloadSchema=schema, masterKey=master.hex())
