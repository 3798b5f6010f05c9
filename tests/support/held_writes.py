"""Appends whose transaction the test holds open: the write path's statement on the test's own connection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from pgjournal import slice_for_persistence_id
from pgjournal.store.events import insert_sql


def insert_in(conn: psycopg.Connection, pid: str, after: int, count: int = 1) -> None:
    """The write path's statement on the caller's (non-autocommit) connection; the entity type is ``pid``'s
    prefix (``Busy|held`` is of ``Busy``)."""
    conn.execute(insert_sql("event_journal", after_latest=False, single=False), {
        "slice": slice_for_persistence_id(pid), "entity_type": pid.partition("|")[0], "pid": pid, "writer": "held",
        "tags": None,
        "expected": after, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
        "ser_ids": [4] * count, "manifests": [""] * count, "payloads": [b'{"held":true}'] * count})


@contextlib.contextmanager
def prepared_insert_held(dsn: str, table: str, *, lift_limits: bool = True) -> Iterator[psycopg.Connection]:
    """A session as ``dsn``'s role that prepares an INSERT into ``table`` in a transaction it leaves open: it then
    holds a write lock (RowExclusiveLock) on ``table``, which needs no right on it. ``lift_limits``: it first
    lifts its role's idle-in-transaction limit, as an attacker would (any session may). At READ COMMITTED whatever
    the database's default (SERIALIZABLE in portable test runs): an idle transaction then holds the lock and no
    snapshot, the case under test (one that holds a snapshot too is the key store's "an older transaction may
    still see the key", its own test)."""
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        if lift_limits:
            conn.execute("SET idle_in_transaction_session_timeout = 0")
        conn.execute(f"PREPARE held AS INSERT INTO {table} SELECT * FROM {table}")
        assert holds_write_lock(dsn, conn.info.backend_pid, table)
        yield conn


def holds_write_lock(dsn: str, pid: int, table: str) -> bool:
    """Whether backend ``pid`` holds a RowExclusiveLock on ``table`` (asked through a session of ``dsn``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND relation = %s::regclass "
                           "AND mode = 'RowExclusiveLock' AND granted", (pid, table)).fetchone()
    return bool(row and row[0])
