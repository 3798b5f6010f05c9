"""Spark's ``read_events`` and the native ``format("pgjournal")`` source over adopted Akka R2DBC databases:
JSONB payloads as a struct, data partitions read through the ``event_journal`` view."""

from __future__ import annotations

from typing import Any

import cbor2
import psycopg
import pytest
from support.akka_schema import akka_insert, create_akka_database

from pgjournal import Journal
from pgjournal.admin.migrate import upgrade
from pgjournal.codec import akka_formats as akka
from pgjournal.spark.read import read_events
from pgjournal.spark.system import SKIP_ENV, spark_skipped

pytestmark = pytest.mark.spark
if spark_skipped():
    pytest.skip(f"{SKIP_ENV} is set", allow_module_level=True)

MANIFEST = "com.example.CartItemAdded"


def test_jsonb_payloads_are_a_struct(empty_dsn: str, spark: Any) -> None:
    create_akka_database(empty_dsn, payload="JSONB")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for i, item in enumerate(["socks", "mug", "socks"]):
            with conn.transaction():
                akka_insert(conn, f"ShoppingCart|a{i}", 1, akka.JACKSON_JSON, MANIFEST,
                            f'{{"itemId":"{item}","quantity":{i + 1}}}'.encode(), jsonb=True)
    upgrade(empty_dsn)
    with Journal.open(empty_dsn) as journal:
        journal.append("ShoppingCart|p1", [{"itemId": "socks", "quantity": 10}])
    frame = read_events(spark, empty_dsn, entity_type="ShoppingCart", slice_ranges=4,
                        payload_schema="itemId STRING, quantity INT")
    assert dict(frame.dtypes)["event_payload"] == "binary"
    socks = frame.where("event.itemId = 'socks'").select("persistence_id", "event.quantity").collect()
    assert sorted((r[0], r[1]) for r in socks) == [("ShoppingCart|a0", 1), ("ShoppingCart|a2", 3),
                                                    ("ShoppingCart|p1", 10)]
    inferred = read_events(spark, empty_dsn, entity_type="ShoppingCart", slice_ranges=2)
    assert "itemId" in inferred.schema["event"].dataType.fieldNames()
    assert inferred.where("event.quantity > 2").count() == 2
    native = (spark.read.format("pgjournal").option("dsn", empty_dsn).option("entityType", "ShoppingCart")
              .option("payloadSchema", "itemId STRING, quantity INT").load())
    assert dict(native.dtypes)["event_payload"] == "binary"
    assert sorted(tuple(r) for r in native.where("event.itemId = 'socks'").select("persistence_id", "event.quantity")
                  .collect()) == sorted((r[0], r[1]) for r in socks)


def test_data_partitions_read_through_the_view(empty_dsn: str, spark: Any) -> None:
    """Rows of every serializer Akka writes: JSON and CBOR decode into ``event``; string, long and bytes rows come
    with their payload bytes as Akka stored them and a null ``event`` (not an object). JDBC and native agree."""
    create_akka_database(empty_dsn, partitions=4)
    others = {"Cart|cbor": (akka.JACKSON_CBOR, MANIFEST, cbor2.dumps({"n": 99})),
              "Cart|string": (akka.STRING, "", b"text"), "Cart|long": (akka.LONG, "", akka.encode_long(7)),
              "Cart|bytes": (akka.BYTES, "", b"\x00\xff")}
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for i in range(20):
            with conn.transaction():
                akka_insert(conn, f"Cart|{i}", 1, akka.JACKSON_JSON, MANIFEST, f'{{"n":{i}}}'.encode(), partitions=4)
        for pid, (ser_id, manifest, payload) in others.items():
            with conn.transaction():
                akka_insert(conn, pid, 1, ser_id, manifest, payload, partitions=4)
    upgrade(empty_dsn)
    frame = read_events(spark, empty_dsn, entity_type="Cart", slice_ranges=4, payload_schema="n INT")
    rows = {r[0]: (r[1], bytes(r[2]), r[3]) for r in
            frame.select("persistence_id", "event_ser_id", "event_payload", "event.n").collect()}
    assert sorted(rows[f"Cart|{i}"][2] for i in range(20)) == list(range(20))
    assert {pid: rows[pid] for pid in others} == {pid: (ser_id, payload, 99 if pid == "Cart|cbor" else None)
                                                  for pid, (ser_id, _, payload) in others.items()}
    native = (spark.read.format("pgjournal").option("dsn", empty_dsn).option("entityType", "Cart")
              .option("sliceRanges", 4).option("payloadSchema", "n INT").load())
    assert {r[0]: (r[1], bytes(r[2]), r[3]) for r in native.select("persistence_id", "event_ser_id", "event_payload",
                                                                   "event.n").collect()} == rows
