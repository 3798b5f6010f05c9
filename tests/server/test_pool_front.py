"""The pool front (pgjournal.server.connections.PoolFront): a returned connection reaches a borrower waiting in the
pool, kept connections go back to the pool on close, one in a transaction is never kept, and one returned
after the close is closed, on both faces."""

from __future__ import annotations

import threading
import time

import pytest
from support import FAST

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.errors import JournalClosed

pytestmark = pytest.mark.mode_independent


def test_a_returned_connection_reaches_a_borrower_waiting_in_the_pool(dsn: str) -> None:
    with Journal.open(dsn, pool_min_size=1, pool_max_size=1, connect_timeout=3, **FAST) as journal:
        got = threading.Event()
        with journal.connection():  # the only connection is out
            waiter = threading.Thread(target=lambda: (journal.connection().__enter__(), got.set()), daemon=True)
            waiter.start()
            deadline = time.monotonic() + 5
            while not journal.connections._waiting:
                assert time.monotonic() < deadline, "the second borrower never waited"
                time.sleep(0.01)
        assert got.wait(2), "the returned connection was kept in front instead of handed to the waiter"


def test_kept_connections_are_reused_and_go_back_to_the_pool_on_close(dsn: str) -> None:
    journal = Journal.open(dsn, pool_min_size=1, pool_max_size=2, **FAST)
    with journal.connection() as first:
        pass
    with journal.connection() as again:
        assert again is first and len(journal.connections) == 0
    assert len(journal.connections) == 1
    with journal.connection() as conn:
        conn.execute("BEGIN")  # returned inside a transaction: the pool resets it, the front never keeps it
    assert len(journal.connections) == 0
    journal.append("Cart|1", ["a"])
    journal.close()
    assert len(journal.connections) == 0


def test_a_connection_returned_after_close_is_closed_and_serves_no_one(dsn: str) -> None:
    """A borrower that had a connection when the journal closed (a live query's poll in flight) returns it
    afterwards: the front must not keep it, or that borrower goes on with it past the close, forever."""
    journal = Journal.open(dsn, **FAST)
    in_flight = journal.connection()
    conn = in_flight.__enter__()
    journal.close()
    in_flight.__exit__(None, None, None)
    assert conn.closed and len(journal.connections) == 0
    with pytest.raises(JournalClosed):
        journal.connection().__enter__()


async def test_the_asyncio_front_closes_a_connection_returned_after_close(dsn: str) -> None:
    journal = await AsyncJournal.open(dsn, **FAST)
    in_flight = journal.connection()
    conn = await in_flight.__aenter__()
    await journal.close()
    await in_flight.__aexit__(None, None, None)
    assert conn.closed and len(journal.connections) == 0
    with pytest.raises(JournalClosed):
        await journal.connection().__aenter__()
