"""Role boundaries: each role of ``pgjournal roles`` tried with SQL beyond its line, as that role (SECURITY.md,
"Roles"): the loader writes only the Spark load's watermark rows, never a projection's offsets; the wrapped
data keys are not the reader's."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
from support import Roles

from pgjournal.spark.watermarks import ledger_name, watermark_name
from pgjournal.state.keystore import PostgresKeyStore
from pgjournal.store.timestamp_offsets import MARKER_PID, OffsetRow, offsets

OTHER = "orders-projection"  # a projection the loader has no business with, and the writer does not run
OTHER_ROWS = 1043


def refused(dsn: str, statement: str, params: object = None) -> bool:
    """Whether the role of ``dsn`` is refused ``statement`` (SQLSTATE 42501); anything else fails the test."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement, params)  # type: ignore[arg-type]
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def rowcount(dsn: str, statement: str, params: object = None) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).rowcount  # type: ignore[arg-type]


def offset_rows(dsn: str, name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM projection_timestamp_offset_store WHERE projection_name = %s",
                           (name,)).fetchone()
    return row[0] if row else 0


def store_offsets(dsn: str, name: str, count: int, at: datetime) -> None:
    rows = [OffsetRow(i % 1024, f"Order|{i}", 1, at) for i in range(count)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(*offsets().insert(name, "0-1023", rows, fenced=True))


def test_the_loader_writes_its_watermarks_and_never_a_projections_offsets(dsn: str, roles: Roles) -> None:
    now = datetime.now(UTC)
    writer, loader = roles.dsn(dsn, roles.writer), roles.dsn(dsn, roles.loader)
    store_offsets(writer, OTHER, OTHER_ROWS, now)
    job = watermark_name("nightly")

    # Its own rows: a load's watermarks and ledger, written and replaced as spark.watermarks.commit_load does.
    store_offsets(loader, job, 3, now)
    with psycopg.connect(loader, autocommit=True) as conn:
        conn.execute(*offsets().insert(ledger_name("nightly"), "*", [OffsetRow(0, "000001-ab", 1, now)], fenced=True))
        assert conn.execute(*offsets().delete_slices(job, [0, 1])).rowcount == 2
    assert offset_rows(dsn, job) == 1

    # Another projection's rows: no marker dated tomorrow (it would skip that projection's new events) ...
    tomorrow = now + timedelta(days=1)
    for slice_ in (0, 511, 1023):
        assert refused(loader, *offsets().insert(OTHER, "0-1023", [OffsetRow(slice_, MARKER_PID, 0, tomorrow)],
                                                 fenced=False))
    assert refused(loader, "INSERT INTO projection_timestamp_offset_store (projection_name, projection_key, slice, "
                           "persistence_id, seq_nr, timestamp_offset, timestamp_consumed) "
                           "SELECT %s, projection_key, slice, '', 0, now() + interval '1 day', now() "
                           "FROM projection_timestamp_offset_store", (OTHER,))
    # ... no delete: a whole-table DELETE takes only the load's rows, a targeted one nothing ...
    assert rowcount(loader, "DELETE FROM projection_timestamp_offset_store WHERE projection_name = %s", (OTHER,)) == 0
    assert rowcount(loader, *offsets().clear(OTHER, 0, 1023)) == 0
    assert rowcount(loader, "DELETE FROM projection_timestamp_offset_store") == 2  # its watermark and ledger rows
    assert offset_rows(dsn, OTHER) == OTHER_ROWS
    # ... no other write, and no way around the policy.
    assert refused(loader, "UPDATE projection_timestamp_offset_store SET timestamp_offset = now() + interval '1 day'")
    assert refused(loader, "TRUNCATE projection_timestamp_offset_store")
    assert refused(loader, "ALTER TABLE projection_timestamp_offset_store DISABLE ROW LEVEL SECURITY")
    assert refused(loader, "ALTER TABLE projection_timestamp_offset_store NO FORCE ROW LEVEL SECURITY")
    assert refused(loader, f'DROP POLICY "{roles.loader}" ON projection_timestamp_offset_store')
    assert refused(loader, "CREATE POLICY anything ON projection_timestamp_offset_store USING (true)")
    assert refused(loader, "SET row_security = off; SELECT * FROM projection_timestamp_offset_store")
    with psycopg.connect(loader) as conn:  # nor does it see them (it has no use for them)
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone() == (0,)
    assert offset_rows(dsn, OTHER) == OTHER_ROWS

    # The writer is the projection workers' role: it sees and manages every projection's offsets, run here or
    # elsewhere (row-level security confines the loader only).
    store_offsets(loader, job, 2, now)
    with psycopg.connect(writer) as conn:
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone() == (OTHER_ROWS + 2,)
    assert rowcount(writer, *offsets().clear(OTHER, 0, 511)) == sum(i % 1024 <= 511 for i in range(OTHER_ROWS))
    store_offsets(writer, OTHER, 1, tomorrow)
    # The reader writes none.
    assert refused(roles.dsn(dsn, roles.reader), *offsets().clear(OTHER, 0, 1023))
    assert refused(roles.dsn(dsn, roles.reader), *offsets().insert(job, "*", [OffsetRow(0, "", 0, now)], fenced=True))


def test_the_wrapped_data_keys_are_read_by_the_writer_and_the_loader_never_by_the_reader(
        dsn: str, roles: Roles) -> None:
    master = os.urandom(32)
    with PostgresKeyStore(roles.dsn(dsn, roles.writer), master_key=master, cache_ttl=0) as keys:
        key = keys.create_key("Customer|7")
    statement = "SELECT wrapped_key FROM pgjournal_payload_keys WHERE persistence_id = 'Customer|7'"
    assert refused(roles.dsn(dsn, roles.reader), statement)
    assert refused(roles.dsn(dsn, roles.reader), "SELECT count(*) FROM pgjournal_payload_keys")
    assert refused(roles.dsn(dsn, roles.reader), "DELETE FROM pgjournal_payload_keys")
    # Spark's load decrypts payloads with the key store: the loader reads them (useless without the master key).
    with PostgresKeyStore(roles.dsn(dsn, roles.loader), master_key=master, cache_ttl=0) as keys:
        assert keys.key("Customer|7") == key
    assert refused(roles.dsn(dsn, roles.loader), "DELETE FROM pgjournal_payload_keys")
    assert refused(roles.dsn(dsn, roles.loader), "INSERT INTO pgjournal_payload_keys VALUES ('x', '\\x00', now())")


def test_the_reader_and_the_loader_have_limits_and_no_role_makes_large_objects(dsn: str, roles: Roles) -> None:
    for role in (roles.reader, roles.loader):
        with psycopg.connect(roles.dsn(dsn, role)) as conn:
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("5s",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("1h",)
            if conn.info.server_version >= 170000:
                assert conn.execute("SHOW transaction_timeout").fetchone() == ("1h",)
    for role in roles.all:  # a large object is a row of pg_largeobject: an INSERT nobody was granted
        for statement in ("SELECT lo_from_bytea(0, '\\x00')", "SELECT lo_create(0)", "SELECT lo_creat(-1)"):
            assert refused(roles.dsn(dsn, role), statement), f"{role}: {statement}"
    with psycopg.connect(dsn) as conn:  # what a superuser does is not changed
        assert conn.execute("SELECT lo_unlink(lo_from_bytea(0, '\\x00'))").fetchone() == (1,)
