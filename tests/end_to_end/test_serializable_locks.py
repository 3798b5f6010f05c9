"""A SERIALIZABLE transaction left open (a `psql` session idle in a transaction on a database whose default
isolation is SERIALIZABLE) makes PostgreSQL keep the predicate locks of every serializable transaction that
finished since; once its lock table is full, every statement that reads fails with SQLSTATE 53200 until the old
transaction ends. Appends and durable state writes wait that out under the journal's retry bound, and past it
appends fail typed, naming the setting, with nothing written.

A private server with the smallest lock table (``max_pred_locks_per_transaction = 10``), so it fills in seconds.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import prometheus_client
import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql
from support.eventually import eventually

from pgjournal import Journal, RetriesExhausted
from pgjournal.admin.migrate import upgrade
from pgjournal.server.embedded import EmbeddedServer

pytestmark = [pytest.mark.mode_independent, pytest.mark.servers, pytest.mark.one_worker]


@pytest.fixture(scope="module")
def serializable_server() -> Iterator[EmbeddedServer]:
    """One private server for this module (a start and a restart take seconds), SERIALIZABLE by default."""
    home = Path(tempfile.mkdtemp(prefix="pgjournal-private-"))
    home.chmod(0o755)  # the server's own system user (when running as root) must reach its data directory
    server = EmbeddedServer(home)
    try:
        server.ensure_running()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_pred_locks_per_transaction = 10")
            conn.execute("ALTER SYSTEM SET default_transaction_isolation = 'serializable'")
        server.stop()
        server.ensure_running()
        yield server
    finally:
        server.destroy()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def serializable_dsn(serializable_server: EmbeddedServer) -> str:
    """A fresh, migrated database of its own on the private server."""
    name = f"locks_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(serializable_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(serializable_server.dsn, dbname=name)
    upgrade(dsn)
    return dsn


@pytest.fixture
def idle_in_transaction(serializable_dsn: str) -> Iterator[psycopg.Connection]:
    """A session that read something in a SERIALIZABLE transaction and went idle."""
    with psycopg.connect(serializable_dsn) as conn:
        conn.execute("SELECT count(*) FROM event_journal").fetchone()
        yield conn


def full_table_retries() -> float:
    return prometheus_client.REGISTRY.get_sample_value("pgjournal_write_retries_total", {"sqlstate": "53200"}) or 0.0


def wait_out_a_full_table(write: Callable[[str], None], idle: psycopg.Connection, what: str) -> list[str]:
    """``write(pid)`` on a thread, a new persistence id each time, until a write met the full table and retried,
    the idle transaction rolled back meanwhile, and 100 more went through; the persistence ids written."""
    retries_before = full_table_retries()
    written: list[str] = []
    failure: list[BaseException] = []
    stop = threading.Event()

    def write_until_stopped() -> None:
        try:
            while not stop.is_set():
                pid = f"{what}|{len(written)}"
                write(pid)
                written.append(pid)
        except BaseException as exc:
            failure.append(exc)

    writer = threading.Thread(target=write_until_stopped)
    writer.start()
    try:
        eventually(lambda: full_table_retries() > retries_before or failure,
                   "a write meets the full lock table and retries", timeout=120)
        idle.rollback()  # the old transaction ends while the write waits
        count = len(written)
        eventually(lambda: len(written) > count + 100 or failure, "writes go on", timeout=60)
    finally:
        stop.set()
        writer.join(30)
    assert not failure, failure
    return written


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
def test_appends_wait_out_a_full_predicate_lock_table(serializable_dsn: str, idle_in_transaction: psycopg.Connection,
                                                      portable: bool) -> None:
    # The in-statement tag writer: its tagged append reads (the progress), so it meets the full lock table.
    with Journal.open(serializable_dsn, portable=portable, tag_bucket_size="Hour", tag_batch_writer=False) as journal:
        written = wait_out_a_full_table(
            lambda pid: journal.append(pid, [{"n": 1}], expected_seq_nr=0, tags=["cart"]), idle_in_transaction,
            "Cart")
    with psycopg.connect(serializable_dsn) as conn:
        stored = conn.execute("SELECT count(*), count(DISTINCT persistence_id) FROM event_journal").fetchone()
        tagged = conn.execute("SELECT count(*) FROM tag_views WHERE tag_name = 'cart'").fetchone()
    assert stored == (len(written), len(written)) and tagged == (len(written),), (stored, tagged, len(written))


def test_a_serializable_transaction_held_open_fails_appends_typed_naming_the_setting(
        serializable_dsn: str, idle_in_transaction: psycopg.Connection) -> None:
    # The in-statement tag writer: its tagged append reads (the progress), so it meets the full lock table.
    with Journal.open(serializable_dsn, tag_bucket_size="Hour", tag_batch_writer=False) as journal:
        n = 0
        with pytest.raises(RetriesExhausted) as raised:
            while n < 100_000:
                journal.append(f"Cart|{n}", [{"n": 1}], expected_seq_nr=0, tags=["cart"])
                n += 1
    message = str(raised.value)
    assert "53200" in message and "max_pred_locks_per_transaction" in message and "nothing was written" in message
    idle_in_transaction.rollback()
    with psycopg.connect(serializable_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal").fetchone() == (n,)
        assert conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id = %s",
                            (f"Cart|{n}",)).fetchone() == (0,)


def test_durable_state_upserts_wait_out_a_full_predicate_lock_table(
        serializable_dsn: str, idle_in_transaction: psycopg.Connection) -> None:
    """Durable state's writes (an update reads the row it replaces) wait the full table out too."""
    with Journal.open(serializable_dsn) as journal:
        store = journal.durable_state

        def upsert_twice(pid: str) -> None:
            store.upsert(pid, 1, {"balance": 1})
            store.upsert(pid, 2, {"balance": 2})

        written = wait_out_a_full_table(upsert_twice, idle_in_transaction, "Account")
    with psycopg.connect(serializable_dsn) as conn:
        revisions = dict(conn.execute("SELECT persistence_id, revision FROM durable_state").fetchall())
    # The pid being written when the writer stopped may be at revision 1 or 2; every finished one is at 2.
    assert all(revisions[pid] == 2 for pid in written) and len(revisions) - len(written) <= 1, len(written)
