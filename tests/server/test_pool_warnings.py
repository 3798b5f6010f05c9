"""While a server is unreachable, a pgjournal pool's repeated psycopg_pool warnings are thinned out to one per pool,
error and minute (``server.connections.PoolWarnings``); other pools' records pass untouched."""

from __future__ import annotations

import logging
import time

import pytest
from support import FAST
from support.eventually import eventually
from support.faultproxy import fault_proxy

from pgjournal import DatabaseUnavailable, Journal
from pgjournal.errors import ConnectionTimedOut
from pgjournal.server.connections import PoolWarnings

FAILED = "error connecting in %r: %s"
GAVE_UP = "reconnection attempt in pool %r failed after %s sec"


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, msg, args, None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_warning_per_pool_and_error_a_minute_and_the_next_says_how_many_were_left_out() -> None:
    clock = Clock()
    warnings = PoolWarnings(interval=60, clock=clock)
    refused = "connection to server at 127.0.0.1, port 1 failed: Connection refused"
    assert warnings.filter(record(FAILED, "pgjournal", refused))
    for _ in range(3):
        clock.now += 10
        assert not warnings.filter(record(FAILED, "pgjournal", refused))
    assert warnings.filter(record(FAILED, "pgjournal", "another error"))  # another error: its own first
    assert warnings.filter(record(GAVE_UP, "pgjournal", 5.0))  # another kind
    assert warnings.filter(record(FAILED, "pgjournal-replica", refused))  # another pool
    clock.now += 31  # 61 s after the first passed
    again = record(FAILED, "pgjournal", refused)
    assert warnings.filter(again)
    assert again.getMessage() == f"error connecting in 'pgjournal': {refused} (and 3 more like it in 61 s, left out)"
    clock.now += 1
    assert not warnings.filter(record(FAILED, "pgjournal", refused))


def test_other_pools_and_other_messages_pass_untouched() -> None:
    warnings = PoolWarnings(interval=60, clock=Clock())
    for _ in range(3):
        theirs = record(FAILED, "pool-7", "refused")
        assert warnings.filter(theirs) and theirs.getMessage() == "error connecting in 'pool-7': refused"
        assert warnings.filter(record("discarding closed connection: %s", "<conn>"))
        assert warnings.filter(record("a message without arguments"))


def test_it_forgets_the_oldest_error_past_its_bound() -> None:
    warnings = PoolWarnings(interval=60, clock=Clock())
    for n in range(PoolWarnings.KEPT + 1):
        assert warnings.filter(record(FAILED, "pgjournal", f"error {n}"))
    assert warnings.filter(record(FAILED, "pgjournal", "error 0"))  # forgotten: passes as a first again
    assert not warnings.filter(record(FAILED, "pgjournal", f"error {PoolWarnings.KEPT}"))


def test_an_unreachable_server_gives_one_warning_per_error_and_the_journal_comes_back(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    with fault_proxy(dsn) as (proxy, via), Journal.open(
            via, notify=False, pool_min_size=2, pool_max_size=4, **{**FAST, "connect_timeout": 1}) as journal:
        journal.append("Quiet|1", ["a"])
        caplog.set_level(logging.WARNING, logger="psycopg.pool")
        proxy.refuse(True)
        proxy.cut()
        failures = 0
        until = time.monotonic() + 4  # reconnect attempts at about 1, 2 and 4 s, then it gives up (5 s)
        while time.monotonic() < until or failures < 3:
            try:
                journal.highest_seq_nr("Quiet|1")
            except (DatabaseUnavailable, ConnectionTimedOut):
                failures += 1
        proxy.refuse(False)

        def reads() -> bool:
            try:
                return journal.highest_seq_nr("Quiet|1") == 1
            except (DatabaseUnavailable, ConnectionTimedOut):
                return False  # a borrower that was waiting when the server came back

        eventually(reads, what="the journal reads again")
    failed = [r.getMessage() for r in caplog.records
              if r.msg == FAILED and r.args and str(r.args[0]) == "pgjournal"]  # args shown escaped
    assert failed, "the outage was not seen by the pool"
    assert len(failed) == len(set(failed)), f"an error was warned of more than once: {failed}"
