"""Adopting an Akka/Pekko Persistence R2DBC database: ``pgjournal migrate --check`` and ``migrate`` on Akka's
documented schema (PostgreSQL form, Yugabyte form with its Yugabyte-only clauses dropped, data partitions,
JSONB payloads); pgjournal's reads over rows Akka's journal inserted, Akka's queries over rows pgjournal
wrote, and projections continuing from each other's offsets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import cbor2
import psycopg
import pytest
from support import FAST
from support.akka_schema import (
    akka_events_by_pid,
    akka_events_by_slices,
    akka_highest_seq_nr,
    akka_insert,
    akka_offsets_per_slice,
    akka_table,
    create_akka_database,
)
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from typer.testing import CliRunner

from pgjournal import Journal, SchemaNotMigrated, SerializationError, SerializerRegistry, slice_for_persistence_id
from pgjournal.admin.migrate import VERSION_TABLE, check_schema, current_revision, head_revision, plan, upgrade
from pgjournal.admin.stored_format import read_stored_format
from pgjournal.cli.commands import app
from pgjournal.codec import akka_formats as akka
from pgjournal.model.offsets import NoOffset
from pgjournal.projections.dead_letters import store_dead_letter
from pgjournal.projections.handlers import AtLeastOnce, Projection, ProjectionSettings
from pgjournal.projections.runner import run_range
from pgjournal.store.timestamp_offsets import AKKA_OFFSET_TABLE

FORMS = {
    "postgres": ("postgres", {}),
    "yugabyte": ("yugabyte", {}),
    "partitions": ("postgres", {"partitions": 4}),
}


@dataclass(frozen=True)
class CartItemAdded:
    itemId: str
    quantity: int


def registry() -> SerializerRegistry:
    reg = SerializerRegistry()
    reg.register(CartItemAdded, "com.example.CartItemAdded")
    return reg


# (pid, ser_id, manifest, payload, what pgjournal reads) for each of Akka's serializers in the acceptance
AKKA_EVENTS = [
    ("ShoppingCart|json", akka.JACKSON_JSON, "com.example.CartItemAdded",
     b'{"itemId":"socks","quantity":2}', CartItemAdded("socks", 2)),
    ("ShoppingCart|cbor", akka.JACKSON_CBOR, "com.example.CartItemAdded",
     cbor2.dumps({"itemId": "mug", "quantity": 1}), CartItemAdded("mug", 1)),
    ("ShoppingCart|string", akka.STRING, "", b"checked out", "checked out"),
    ("ShoppingCart|long", akka.LONG, "", akka.encode_long(-42), -42),
    ("ShoppingCart|bytes", akka.BYTES, "", b"\x00\x01\xfe", b"\x00\x01\xfe"),
]


def akka_catalog(dsn: str) -> dict[str, Any]:
    """Akka's tables as the catalog shows them: columns and types, indexes, constraints."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_schema = 'public' AND (table_name LIKE 'event_journal%' OR table_name IN ('snapshot', "
            "'durable_state') OR table_name LIKE 'akka_%') ORDER BY 1, 2").fetchall()
        indexes = conn.execute("SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'public' AND "
                               "(tablename LIKE 'event_journal%' OR tablename LIKE 'akka_%') ORDER BY 1, 2").fetchall()
    return {"columns": columns, "indexes": indexes}


def write_as_akka(dsn: str, partitions: int = 1, jsonb: bool = False) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid, ser_id, manifest, payload, _ in AKKA_EVENTS:
            if jsonb and ser_id != akka.JACKSON_JSON:
                continue
            with conn.transaction():  # Akka: one transaction per write, CURRENT_TIMESTAMP its start
                akka_insert(conn, pid, 1, ser_id, manifest, payload, partitions=partitions, jsonb=jsonb,
                            tags=["cart"])
        with conn.transaction():
            akka_insert(conn, "ShoppingCart|json", 2, akka.JACKSON_JSON, "com.example.CartItemAdded",
                        b'{"itemId":"hat","quantity":1}', partitions=partitions, jsonb=jsonb)


def test_check_shows_the_adoption_and_changes_nothing(empty_dsn: str) -> None:
    create_akka_database(empty_dsn)
    before = akka_catalog(empty_dsn)
    steps = plan(empty_dsn)
    actions = [(s.action, s.target) for s in steps]
    assert ("keep", "event_journal") in actions and ("keep", "snapshot") in actions
    assert ("keep", "akka_projection_timestamp_offset_store") in actions
    for table in ("projection_timestamp_offset_store", "tag_views", "projection_lease", "projection_dead_letter",
                  "pgjournal_format"):
        assert ("create table", table) in actions
    assert ("record", "pgjournal_format") in actions and ("stamp", VERSION_TABLE) in actions
    result = CliRunner().invoke(app, ["migrate", "--check", "--dsn", empty_dsn])
    assert result.exit_code == 0, result.output
    assert "create table" in result.output and "stamp" in result.output and "tag_views" in result.output
    assert akka_catalog(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        assert current_revision(conn) is None
        assert conn.execute("SELECT to_regclass('tag_views')").fetchone() == (None,)


def test_check_on_pgjournal_databases(empty_dsn: str, dsn: str) -> None:
    assert [s.target for s in plan(empty_dsn)] == [f"revision {i:04d}" for i in range(1, int(head_revision()) + 1)]
    assert [s.action for s in plan(dsn)] == ["nothing"]


@pytest.mark.parametrize("form", list(FORMS))
def test_adopted_akka_database_reads_and_writes_both_ways(empty_dsn: str, form: str) -> None:
    dialect, options = FORMS[form]
    partitions = options.get("partitions", 1)
    create_akka_database(empty_dsn, dialect, **options)
    write_as_akka(empty_dsn, partitions)
    before = akka_catalog(empty_dsn)

    steps = upgrade(empty_dsn)
    assert steps and upgrade(empty_dsn) == []  # adopted once; then an ordinary upgrade with nothing to do
    after = akka_catalog(empty_dsn)
    view_columns = [c for c in after["columns"] if c[0] == "event_journal" and partitions > 1]
    assert [c for c in after["columns"] if c not in view_columns] == before["columns"], "Akka's tables unaltered"
    assert after["indexes"] == before["indexes"], "Akka's indexes untouched, none added"
    with psycopg.connect(empty_dsn) as conn:
        check_schema(conn)
        assert current_revision(conn) == head_revision()
        stored = read_stored_format(conn)
        assert stored.akka_layout and stored.data_partitions == partitions and not stored.legacy_json_33
        kinds = dict(conn.execute("SELECT relname, relkind::text FROM pg_class WHERE relname ~ "
                                  "'^event_journal(_[0-9]+)?$'").fetchall())
    assert kinds == ({"event_journal": "r"} if partitions == 1 else
                     {"event_journal": "v", **{f"event_journal_{i}": "r" for i in range(partitions)}})

    with Journal.open(empty_dsn, serializers=registry(), **FAST) as journal:
        assert journal.dialect.event_table(1000) == ("event_journal" if partitions == 1 else "event_journal_3")
        # per persistence id, every serializer
        for pid, _, _, _, value in AKKA_EVENTS:
            got = [e.event for e in journal.query.current_events_by_persistence_id(pid)]
            assert got[0] == value, pid
        assert journal.highest_seq_nr("ShoppingCart|json") == 2
        # by slices: all of Akka's rows, each once, per pid in order
        eventually(lambda: len(list(journal.query.current_events_by_slices("ShoppingCart", 0, 1023))) == 6)
        by_slices = list(journal.query.current_events_by_slices("ShoppingCart", 0, 1023, NoOffset))
        assert sorted((e.persistence_id, e.seq_nr) for e in by_slices) == sorted(
            [(p, 1) for p, *_ in AKKA_EVENTS] + [("ShoppingCart|json", 2)])
        assert by_slices[0].tags == ("cart",)
        # pgjournal writes after Akka's rows, into Akka's table (the partition of the slice)
        written = journal.append("ShoppingCart|json", [CartItemAdded("scarf", 3)], expected_seq_nr=2,
                                 tags=["cart"])
        assert written[0].seq_nr == 3
        journal.append("ShoppingCart|py", [{"itemId": "sock"}, "text", 7, b"\x01"], expected_seq_nr=0)
        journal.save_snapshot("ShoppingCart|json", 3, {"items": ["socks", "hat", "scarf"]})
        assert journal.load_snapshot("ShoppingCart|json").snapshot == {"items": ["socks", "hat", "scarf"]}
        writer = journal.writer_id

    # Akka's queries over the rows pgjournal wrote
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        table = akka_table("ShoppingCart|json", partitions)
        rows = akka_events_by_pid(conn, table, "ShoppingCart|json")
        assert [r[3] for r in rows] == [1, 2, 3]
        ours = rows[2]
        assert ours[6:11] == (akka.JACKSON_JSON, "com.example.CartItemAdded",
                              b'{"itemId":"scarf","quantity":3}', writer, "")
        assert ours[14] == ["cart"] and ours[4] > rows[1][4]
        assert akka_highest_seq_nr(conn, table, "ShoppingCart|json") == 3
        py_table = akka_table("ShoppingCart|py", partitions)
        assert [(r[6], r[7]) for r in akka_events_by_pid(conn, py_table, "ShoppingCart|py")] == [
            (akka.JACKSON_JSON, ""), (akka.STRING, ""), (akka.LONG, ""), (akka.BYTES, "")]
        # Akka's by-slices query reads one data partition's slice range at a time
        per = 1024 // partitions
        epoch = conn.execute("SELECT 'epoch'::timestamptz").fetchone()[0]
        expected = sorted([(p, 1) for p, *_ in AKKA_EVENTS] + [("ShoppingCart|json", 2), ("ShoppingCart|json", 3)]
                          + [("ShoppingCart|py", s) for s in range(1, 5)])

        def akka_by_slices() -> list[tuple[str, int]]:
            found = []
            for p in range(partitions):
                source = "event_journal" if partitions == 1 else f"event_journal_{p}"
                found += akka_events_by_slices(conn, source, "ShoppingCart", p * per, (p + 1) * per - 1, epoch)
            return sorted((r[1], r[2]) for r in found)

        eventually(lambda: akka_by_slices() == expected)
        # and Akka writes on after pgjournal's events: time keeps going forward per pid
        with conn.transaction():
            akka_insert(conn, "ShoppingCart|json", 4, akka.STRING, "", b"akka again", partitions=partitions)
    with Journal.open(empty_dsn, serializers=registry(), **FAST) as journal:
        events = list(journal.query.current_events_by_persistence_id("ShoppingCart|json"))
        assert [e.event for e in events][2:] == [CartItemAdded("scarf", 3), "akka again"]
        assert events[3].db_timestamp > events[2].db_timestamp


def test_adoption_refuses_an_old_akka_journal(empty_dsn: str) -> None:
    """Akka R2DBC 1.0's journal has no tags column: pgjournal names it and changes nothing."""
    create_akka_database(empty_dsn, old_journal=True)
    before = akka_catalog(empty_dsn)
    with pytest.raises(SchemaNotMigrated, match=r"event_journal lacks column tags \(Akka's schema since 1.1"):
        upgrade(empty_dsn)
    assert akka_catalog(empty_dsn) == before
    result = CliRunner().invoke(app, ["migrate", "--check", "--dsn", empty_dsn])
    assert result.exit_code == 1 and "refuse" in result.output
    with psycopg.connect(empty_dsn) as conn:
        assert current_revision(conn) is None
        assert conn.execute("SELECT to_regclass('tag_views')").fetchone() == (None,)


def test_adoption_refuses_data_partitions_that_do_not_divide_the_slices(empty_dsn: str) -> None:
    create_akka_database(empty_dsn, partitions=3)
    with pytest.raises(SchemaNotMigrated, match=r"n dividing 1024, found event_journal_0, event_journal_1, "
                                                r"event_journal_2"):
        upgrade(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        assert current_revision(conn) is None


def test_jsonb_payloads(empty_dsn: str) -> None:
    """Akka's ``payload-column-type = JSONB``: events and snapshots are JSONB both ways, SQL filters on fields."""
    create_akka_database(empty_dsn, payload="JSONB")
    write_as_akka(empty_dsn, jsonb=True)
    upgrade(empty_dsn)
    with Journal.open(empty_dsn, serializers=registry(), **FAST) as journal:
        assert journal.events.jsonb == {"event_payload"}
        assert [e.event for e in journal.query.current_events_by_persistence_id("ShoppingCart|json")] == [
            CartItemAdded("socks", 2), CartItemAdded("hat", 1)]
        journal.append("ShoppingCart|json", [CartItemAdded("socks", 5)], expected_seq_nr=2)
        journal.append("ShoppingCart|json", [{"itemId": "pen", "quantity": 1}], tags=["t"])  # the tagged append
        with pytest.raises(SerializationError, match=r"JSONB.*ser_id 20 and manifest '' and is not JSON"):
            journal.append("ShoppingCart|json", ["plain text"])
        assert journal.highest_seq_nr("ShoppingCart|json") == 4, "nothing of the refused append was written"
        journal.save_snapshot("ShoppingCart|json", 4, {"items": 4})
        assert journal.load_snapshot("ShoppingCart|json").snapshot == {"items": 4}
        eventually(lambda: len(list(journal.query.current_events_by_slices("ShoppingCart", 0, 1023))) == 4)
        from_snapshots = list(journal.query.current_events_by_slices_starting_from_snapshots(
            "ShoppingCart", 0, 1023, transform=lambda snapshot: snapshot))  # the JSONB snapshot read as its bytes
        assert [(e.persistence_id, e.seq_nr, e.event) for e in from_snapshots] == [
            ("ShoppingCart|json", 4, {"items": 4})]
        env = next(iter(journal.query.current_events_by_persistence_id("ShoppingCart|json", 3, 3)))
        with journal.connection() as conn:  # a projection's dead letter keeps the JSONB payload as its bytes
            store_dead_letter(conn, journal, "carts", "0-1023", env, RuntimeError("boom"))
            payload = conn.execute("SELECT payload FROM projection_dead_letter").fetchone()[0]
        assert json.loads(payload) == {"itemId": "socks", "quantity": 5}
    with psycopg.connect(empty_dsn) as conn:
        socks = conn.execute("SELECT seq_nr FROM event_journal WHERE event_payload->>'itemId' = 'socks' "
                             "ORDER BY seq_nr").fetchall()
        assert socks == [(1,), (3,)]
        assert conn.execute("SELECT jsonb_typeof(snapshot) FROM snapshot").fetchall() == [("object",)]
        # Akka reads the JSONB column as JSON text and hands its bytes to Jackson
        row = akka_events_by_pid(conn, "event_journal", "ShoppingCart|json", 3, 3)[0]
        assert row[6:8] == (akka.JACKSON_JSON, "com.example.CartItemAdded")
        assert row[8] == {"itemId": "socks", "quantity": 5}


def test_projection_continues_from_akka_offsets_and_back(empty_dsn: str) -> None:
    create_akka_database(empty_dsn)
    pids = ["Cart|a", "Cart|b", "Cart|c"]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for pid, count in zip(pids, (3, 1, 2), strict=True):
            for seq in range(1, count + 1):
                with conn.transaction():
                    akka_insert(conn, pid, seq, akka.STRING, "", f"{pid}-{seq}".encode())
        # Akka Projection "carts" (one range, key "0-1023") processed a up to 2 and b: its rows, as it stores them
        for pid, seq in (("Cart|a", 2), ("Cart|b", 1)):
            conn.execute(
                "INSERT INTO akka_projection_timestamp_offset_store (projection_name, projection_key, slice, "
                "persistence_id, seq_nr, timestamp_offset, timestamp_consumed) SELECT 'carts', '0-1023', slice, "
                "persistence_id, seq_nr, db_timestamp, CURRENT_TIMESTAMP FROM event_journal "
                "WHERE persistence_id = %s AND seq_nr = %s", (pid, seq))
    upgrade(empty_dsn)
    handled: list[tuple[str, int]] = []
    settings = ProjectionSettings(**{**FAST_PROJECTION.__dict__, "offset_table": AKKA_OFFSET_TABLE})
    projection = Projection("carts", "Cart", AtLeastOnce(lambda env: handled.append((env.persistence_id, env.seq_nr)),
                                                         save_every=1, save_interval=0.05), settings)
    with Journal.open(empty_dsn, **FAST) as journal:
        runner = run_range(journal, projection, 0, 1023)
        try:
            eventually(lambda: len(handled) >= 3)
            journal.append("Cart|b", ["b-2"], expected_seq_nr=1)
            eventually(lambda: ("Cart|b", 2) in handled)
        finally:
            runner.stop()
            runner.join(timeout=30)
        assert not runner.failed
    assert sorted(handled) == [("Cart|a", 3), ("Cart|b", 2), ("Cart|c", 1), ("Cart|c", 2)]
    # Akka's start from the rows pgjournal stored: per slice the latest event handled, with its pid and seq_nr
    with psycopg.connect(empty_dsn) as conn:
        latest = akka_offsets_per_slice(conn, "carts", 0, 1023)
        for pid, seq in (("Cart|a", 3), ("Cart|b", 2), ("Cart|c", 2)):
            ts = conn.execute("SELECT db_timestamp FROM event_journal WHERE persistence_id = %s AND seq_nr = %s",
                              (pid, seq)).fetchone()[0]
            assert latest[slice_for_persistence_id(pid)] == (ts, {pid: seq})
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone() == (0,)


def test_offset_table_names_only_known_tables() -> None:
    from pgjournal import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"offset_table must be one of .* got 'offsets; DROP TABLE x'"):
        ProjectionSettings(offset_table="offsets; DROP TABLE x")



def test_writer_horizon_watches_akka_data_partitions(empty_dsn: str) -> None:
    """Journal writers hold their lock on a data partition (the view is never written): the visibility horizon
    must watch those tables, or a live query could pass an open Akka or pgjournal transaction."""
    create_akka_database(empty_dsn, partitions=4)
    upgrade(empty_dsn)
    with Journal.open(empty_dsn, **FAST) as journal, psycopg.connect(empty_dsn) as conn:
        oids = {conn.execute("SELECT %s::regclass::oid", (f"event_journal_{i}",)).fetchone()[0] for i in range(4)}
        assert journal.capabilities.writer_horizon
        assert oids <= set(journal.capabilities.journal_relations)


def test_reads_wait_for_an_open_akka_transaction(empty_dsn: str) -> None:
    """An Akka writer stamps its transaction start; while it is open on a data partition, by-slice reads stop
    before that start (the horizon), so the later pgjournal event is not passed; after commit both come, the
    Akka event (earlier timestamp) first."""
    create_akka_database(empty_dsn, partitions=4)
    upgrade(empty_dsn)
    akka_tx = psycopg.connect(empty_dsn)  # not autocommit: one open transaction
    try:
        akka_insert(akka_tx, "Cart|akka", 1, akka.STRING, "", b"early", partitions=4)
        with Journal.open(empty_dsn, **FAST) as journal:
            written = journal.append("Cart|py", ["later"])[0].db_timestamp
            with journal.connection() as conn:  # past every margin behind the clock: only the horizon holds it
                eventually(lambda: (conn.execute("SELECT clock_timestamp()").fetchone()[0] - written
                                    ).total_seconds() > 1.0)
            held = [e.persistence_id for e in journal.query.current_events_by_slices("Cart", 0, 1023)]
            assert held == [], "the horizon is the open Akka transaction's start"
            akka_tx.commit()
            eventually(lambda: [e.persistence_id for e in journal.query.current_events_by_slices(
                "Cart", 0, 1023)] == ["Cart|akka", "Cart|py"])
    finally:
        akka_tx.close()


def test_jsonb_metadata_column(empty_dsn: str) -> None:
    """A JSONB ``meta_payload`` (some Akka setups make every payload column JSONB) round-trips too."""
    create_akka_database(empty_dsn, payload="JSONB")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE event_journal ALTER COLUMN meta_payload TYPE jsonb USING NULL")
    upgrade(empty_dsn)
    with Journal.open(empty_dsn, **FAST) as journal:
        assert journal.events.jsonb == {"event_payload", "meta_payload"}
        journal.append("Cart|m", [{"n": 1}], metadata={"trace": "abc"})
        env = next(iter(journal.query.current_events_by_persistence_id("Cart|m")))
        assert (env.event, env.metadata) == ({"n": 1}, {"trace": "abc"})
        with pytest.raises(SerializationError, match="meta_payload of event_journal is JSONB"):
            journal.append("Cart|m", [{"n": 2}], metadata=b"\x00binary")
