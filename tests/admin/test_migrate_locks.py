"""A migration meets a transaction held open on the journal: it waits for its locks only briefly at a time, so the
appends queued behind its DDL go on, and it completes once that transaction ended, or gives up naming it, with
nothing changed.

Revision 0009 builds an index on ``event_journal`` (a SHARE lock: writers' ROW EXCLUSIVE conflicts with it). A
session that took a writer's lock and keeps its transaction open is in its way; without the bounded wait, the
DDL's request would sit in the table's lock queue and every writer after it would wait behind it for as long."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from support.eventually import eventually

from pgjournal.admin import migrate
from pgjournal.errors import SchemaNotMigrated

BEFORE = "0008"


def revision(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT version_num FROM {migrate.VERSION_TABLE}").fetchone()
    assert row is not None
    return str(row[0])


@contextlib.contextmanager
def writer_held(dsn: str) -> Iterator[psycopg.Connection]:
    """A transaction holding a writer's lock on the journal, open until the block ends (or the test closes it)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("LOCK TABLE event_journal IN ROW EXCLUSIVE MODE")
        yield conn


@contextlib.contextmanager
def writers_timed(dsn: str) -> Iterator[list[float]]:
    """Writers, one after another, each taking the lock an append takes and committing: how long each waited."""
    took: list[float] = []
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                start = time.monotonic()
                with conn.transaction():
                    conn.execute("LOCK TABLE event_journal IN ROW EXCLUSIVE MODE")
                took.append(time.monotonic() - start)
                stop.wait(0.02)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield took
    finally:
        stop.set()
        thread.join(30)


@pytest.fixture
def old_dsn(empty_dsn: str) -> str:
    command.upgrade(migrate.alembic_config(empty_dsn), BEFORE)
    return empty_dsn


def test_a_migration_in_the_way_of_a_held_transaction_gives_up_naming_it_and_the_writers_go_on(
        old_dsn: str) -> None:
    with writer_held(old_dsn) as held, writers_timed(old_dsn) as took:
        # Ended after 10 s whatever happens: a migration that waited in the lock queue would complete then (and
        # fail the test) instead of waiting for this block forever.
        ending = threading.Timer(10.0, held.close)
        ending.start()
        eventually(lambda: len(took) >= 3, "the writers writing")
        with pytest.raises(SchemaNotMigrated, match=rf"backend {held.info.backend_pid} \(role '[^']+', its "
                                                    r"transaction open for \d+ s\).*nothing was changed"):
            migrate.upgrade(old_dsn, wait=3.0)
        ending.cancel()
    assert revision(old_dsn) == BEFORE
    assert max(took) < migrate.LOCK_WAIT + 1.0, f"a writer waited {max(took):.2f} s behind the migration"


def test_a_migration_completes_once_the_transaction_in_its_way_ended(old_dsn: str) -> None:
    with writers_timed(old_dsn) as took, writer_held(old_dsn) as held:
        threading.Timer(2.5, held.close).start()  # ends it (rolled back) while the migration tries
        migrate.upgrade(old_dsn, wait=30.0)
    assert revision(old_dsn) == migrate.head_revision()
    assert max(took) < migrate.LOCK_WAIT + 1.0, f"a writer waited {max(took):.2f} s behind the migration"
