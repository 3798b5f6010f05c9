"""The pool front (pgjournal.server.connections.PoolFront): a returned connection reaches a borrower waiting in the
pool, kept connections go back to the pool on close, and one in a transaction is never kept."""

from __future__ import annotations

import threading
import time

from support import FAST

from pgjournal import Journal


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
