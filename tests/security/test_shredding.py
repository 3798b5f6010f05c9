"""Crypto-shredding leaves nothing readable: after ``delete_key`` no table holds a shredded persistence id's
plaintext (a projection's dead letter quoting the event included) and the wrapped key's bytes are gone from the
key table's file; the other persistence ids' data and keys keep working. Run as the roles of ``pgjournal roles``
(the writer shreds, as applications do)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from support import FAST, Roles
from support.eventually import eventually
from support.held_writes import prepared_insert_held
from support.projection_handlers import FAST_PROJECTION

from pgjournal import InsufficientPrivilege, Journal, RetriesExhausted
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import Transcoder
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.dead_letters import list_dead_letters
from pgjournal.projections.handlers import ExactlyOnce, Projection
from pgjournal.projections.runner import run_range
from pgjournal.state import keystore
from pgjournal.state.keystore import PostgresKeyStore

GONE, KEPT = "Customer|7", "Customer|8"
SECRET = {GONE: "ann.7@example.com", KEPT: "bob.8@example.com"}


def dump(dsn: str) -> bytes:
    """Every row of every table of the database as text (bytea columns in hex), as a superuser."""
    with psycopg.connect(dsn) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").fetchall()]
        assert "public.projection_dead_letter" in tables and "public.pgjournal_payload_keys" in tables
        return b"\n".join(str(row[0]).encode() for table in tables
                          for row in conn.execute(f"SELECT t::text FROM {table} AS t").fetchall())


def relation_files(dsn: str) -> bytes:
    """The bytes of every table's, index's and TOAST table's file of the database (after a CHECKPOINT), as a
    superuser: what a copy of the data directory would hold."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        paths = [r[0] for r in conn.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'i', 't') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND pg_relation_filepath(c.oid) IS NOT NULL").fetchall()]
        assert any(p for p in paths)
        return b"".join(bytes(conn.execute("SELECT pg_read_binary_file(%s)", (p,)).fetchone()[0]) for p in paths)


def found(haystack: bytes, secret: bytes) -> bool:
    return secret in haystack or secret.hex().encode() in haystack


def maintains(dsn: str) -> bool:
    """Whether the writer may vacuum the key table (``MAINTAIN``, PostgreSQL 17+); before, only its owner can."""
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version >= 170000


@pytest.fixture
def keys(dsn: str, roles: Roles) -> Iterator[PostgresKeyStore]:
    """The key store of the role that can shred: the writer, or before PostgreSQL 17 the key table's owner."""
    role = roles.writer if maintains(dsn) else roles.owner
    with PostgresKeyStore(roles.dsn(dsn, role), master_key=os.urandom(32), cache_ttl=0) as store:
        yield store


def mailer(seen: list[EventEnvelope]) -> ExactlyOnce:
    def handle(conn: psycopg.Connection, env: EventEnvelope) -> None:
        seen.append(env)
        raise ValueError(f"cannot mail {env.event}")  # quotes the event, as handlers' errors do
    return ExactlyOnce(handle)


def test_after_shredding_no_table_and_no_file_holds_the_plaintext_or_the_key(
        dsn: str, roles: Roles, keys: PostgresKeyStore) -> None:
    registry = SerializerRegistry(transcoder=Transcoder(key_store=keys))
    with Journal.open(roles.dsn(dsn, roles.writer), serializers=registry, **FAST) as journal:
        for pid, secret in SECRET.items():
            journal.append(pid, [{"email": secret}, {"email": secret, "n": 2}], tags=["customer"])
            journal.save_snapshot(pid, 2, {"email": secret})
        seen: list[EventEnvelope] = []
        settings = dataclasses.replace(FAST_PROJECTION, attempts=1, backoff=0.01, on_failure="dead-letter")
        runner = run_range(journal, Projection("mailer", "Customer", mailer(seen), settings), 0, 1023)
        try:
            eventually(lambda: runner.stats.dead_lettered == 4, "every event dead-lettered")
        finally:
            runner.stop()
            runner.join(timeout=30)
        # With its key, a dead letter's error reads as the handler raised it; a role without keys reads nothing.
        assert sorted(letter.error for letter in list_dead_letters(journal, "mailer")) == sorted(
            f"ValueError: cannot mail {{'email': '{s}'{n}}}" for s in SECRET.values() for n in ("", ", 'n': 2"))
        with psycopg.connect(roles.dsn(dsn, roles.reader)) as conn:
            errors = " ".join(r[0] for r in conn.execute("SELECT error FROM projection_dead_letter").fetchall())
        assert SECRET[GONE] not in errors and SECRET[KEPT] not in errors
        with psycopg.connect(dsn) as conn:
            [(wrapped,)] = conn.execute("SELECT wrapped_key FROM pgjournal_payload_keys WHERE persistence_id = %s",
                                        (GONE,)).fetchall()
        key = keys.key(GONE)
        assert key is not None and found(dump(dsn), bytes(wrapped))

        assert keys.delete_key(GONE)

        everything, files = dump(dsn), relation_files(dsn)
        for secret in (SECRET[GONE].encode(), bytes(wrapped), key):
            assert not found(everything, secret), f"{secret!r} is still in a table"
            assert not found(files, secret), f"{secret!r} is still in a relation's file"
        # In clear by design (SECURITY.md, "Shredded data"): the shredded persistence id and its tags, for the
        # indexes, routing and the tag view that read them.
        assert found(everything, GONE.encode()) and found(everything, b"customer")
        # What was not shredded keeps working: the other persistence id's events, snapshot and dead letters.
        assert [e.event["email"] for e in journal.query.current_events_by_persistence_id(KEPT)] == [SECRET[KEPT]] * 2
        assert journal.load_snapshot(KEPT).snapshot == {"email": SECRET[KEPT]}
        assert all(e.redacted for e in journal.query.current_events_by_persistence_id(GONE))
        errors_by_pid = {(letter.persistence_id, letter.error) for letter in list_dead_letters(journal, "mailer")}
        assert (KEPT, f"ValueError: cannot mail {{'email': '{SECRET[KEPT]}'}}") in errors_by_pid
        assert {error for pid, error in errors_by_pid if pid == GONE} == {
            "<redacted: no key for this persistence id (crypto-shredded)>"}
        journal.append("Customer|9", [{"email": "new"}])  # keys are made after the key table was rewritten
        assert journal.query.load_envelope("Customer|9", 1).event == {"email": "new"}


def test_shredding_by_a_role_that_may_not_rewrite_the_key_table_says_so(dsn: str, roles: Roles) -> None:
    if maintains(dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'REVOKE MAINTAIN ON pgjournal_payload_keys FROM "{roles.writer}"')
    with PostgresKeyStore(roles.dsn(dsn, roles.writer), master_key=os.urandom(32), cache_ttl=0) as writer_keys:
        writer_keys.create_key(GONE)
        with pytest.raises(InsufficientPrivilege, match=r"key of persistence id 'Customer\|7' is deleted, but this "
                                                        r"role may not vacuum pgjournal_payload_keys.*VACUUM \(FULL\)"):
            writer_keys.delete_key(GONE)
        assert writer_keys.key(GONE) is None


def test_a_transaction_older_than_the_shredding_keeps_the_key_until_it_ends_then_reclaim_takes_it(
        dsn: str, keys: PostgresKeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    keys.create_key(GONE)
    kept = keys.create_key(KEPT)
    with psycopg.connect(dsn) as conn:
        [(wrapped,)] = conn.execute("SELECT wrapped_key FROM pgjournal_payload_keys WHERE persistence_id = %s",
                                    (GONE,)).fetchall()
    monkeypatch.setattr(keystore, "RECLAIM_WAIT", 0.5, raising=False)
    with psycopg.connect(dsn) as old:
        old.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        old.execute("SELECT count(*) FROM event_journal")  # a snapshot taken before the key is deleted
        with pytest.raises(RetriesExhausted, match=r"Customer\|7.*a transaction older than the deletion"):
            keys.delete_key(GONE)
        assert keys.key(GONE) is None  # deleted all the same; only its bytes wait
        assert found(relation_files(dsn), bytes(wrapped))
    keys.reclaim()
    assert not found(relation_files(dsn), bytes(wrapped))
    assert keys.key(KEPT) == kept


@contextlib.contextmanager
def timed_lookups(dsn: str, master: bytes, pid: str) -> Iterator[list[float]]:
    """Another process's key lookups of ``pid`` (no cache), one after another: how long each took."""
    took: list[float] = []
    stop = threading.Event()

    def look_up() -> None:
        with PostgresKeyStore(dsn, master_key=master, cache_ttl=0) as other:
            while not stop.is_set():
                start = time.monotonic()
                other.key(pid)
                took.append(time.monotonic() - start)
                time.sleep(0.01)

    thread = threading.Thread(target=look_up, daemon=True)
    thread.start()
    try:
        eventually(lambda: took, "a first lookup")
        yield took
    finally:
        stop.set()
        thread.join(60)


@contextlib.contextmanager
def lock_taken_once_the_rewrite_tries(dsn: str, role_dsn: str) -> Iterator[list[int]]:
    """A session that takes a lock on the key table in a transaction begun only after the rewrite's first try
    (the moment a key lookup in flight holds one), and keeps it: it did not make the rewrite wait, so the error
    must not name it."""
    stop, ready = threading.Event(), threading.Event()
    backend: list[int] = []

    def hold() -> None:
        with psycopg.connect(dsn, autocommit=True) as watch:
            eventually(lambda: watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'VACUUM%%'"
            ).fetchone() != (0,), "the rewrite's first try", timeout=30)
        with psycopg.connect(role_dsn) as conn:
            conn.execute("SELECT count(*) FROM pgjournal_payload_keys")
            backend.append(conn.info.backend_pid)
            ready.set()
            stop.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield backend
        assert ready.wait(30), "the late session never took its lock"
    finally:
        stop.set()
        thread.join(60)


@pytest.fixture
def master() -> bytes:
    return os.urandom(32)


def shredding_role(dsn: str, roles: Roles) -> str:
    """The role that can shred: the writer where it may vacuum the key table (MAINTAIN, PostgreSQL 17+), else
    the owner. It sees when its own sessions' transactions began, not other roles' (without pg_read_all_stats)."""
    return roles.writer if maintains(dsn) else roles.owner


def shredder(dsn: str, roles: Roles, master: bytes) -> PostgresKeyStore:
    """The key store of the role that can shred (as the ``keys`` fixture), with a given master key."""
    return PostgresKeyStore(roles.dsn(dsn, shredding_role(dsn, roles)), master_key=master,
                            cache_ttl=0)


@pytest.mark.parametrize("holder", ["reader", "loader"])
def test_a_lock_held_on_the_key_table_by_a_reading_role_stops_no_lookup_and_no_shredding(
        dsn: str, roles: Roles, master: bytes, holder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader's (or loader's) prepared INSERT into the key table left open, its role's limit lifted: the key is
    shredded at once, other processes' lookups never wait behind the rewrite, and the rewrite that must wait for
    that transaction names it, then completes once it ended."""
    monkeypatch.setattr(keystore, "RECLAIM_WAIT", 3.0, raising=False)
    with shredder(dsn, roles, master) as keys:
        keys.create_key(GONE)
        kept = keys.create_key(KEPT)
        with psycopg.connect(dsn) as conn:
            [(wrapped,)] = conn.execute("SELECT wrapped_key FROM pgjournal_payload_keys WHERE persistence_id = %s",
                                        (GONE,)).fetchall()
        with prepared_insert_held(roles.dsn(dsn, getattr(roles, holder)), "pgjournal_payload_keys") as held, \
                timed_lookups(roles.dsn(dsn, roles.writer), master, KEPT) as took:
            named = (r"another session holds a lock on pgjournal_payload_keys "
                     rf"\((.*, )?backend {held.info.backend_pid} \(role '{getattr(roles, holder)}'\)")
            with lock_taken_once_the_rewrite_tries(dsn, roles.dsn(dsn, shredding_role(dsn, roles))) as late, \
                    pytest.raises(RetriesExhausted, match=named) as refused:
                keys.delete_key(GONE)
            # A key lookup may be named too when its statement waited long enough; the session whose transaction
            # began after the rewrite's first try never is.
            assert not late or f"backend {late[0]} " not in str(refused.value), str(refused.value)
            assert keys.key(GONE) is None  # shredded all the same; only its bytes wait for the rewrite
            assert len(took) > 10 and max(took) < 1.0, f"a lookup took {max(took):.2f} s"
        keys.reclaim()
        assert not found(relation_files(dsn), bytes(wrapped))
        assert keys.key(KEPT) == kept


@pytest.mark.parametrize("holder", ["reader", "loader"])
def test_shredding_completes_through_a_transaction_a_reading_role_forgot_open(
        dsn: str, roles: Roles, master: bytes, holder: str) -> None:
    """The same lock left open within the role's limits: the server ends that idle transaction, and the
    shredding, waiting for it without stopping anyone, completes."""
    with shredder(dsn, roles, master) as keys:
        keys.create_key(GONE)
        with psycopg.connect(dsn) as conn:
            [(wrapped,)] = conn.execute("SELECT wrapped_key FROM pgjournal_payload_keys WHERE persistence_id = %s",
                                        (GONE,)).fetchall()
        with prepared_insert_held(roles.dsn(dsn, getattr(roles, holder)), "pgjournal_payload_keys",
                                  lift_limits=False) as held, \
                timed_lookups(roles.dsn(dsn, roles.writer), master, KEPT) as took:
            assert keys.delete_key(GONE)
            assert max(took) < 1.0, f"a lookup took {max(took):.2f} s"
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                held.execute("SELECT 1")
        assert not found(relation_files(dsn), bytes(wrapped))
