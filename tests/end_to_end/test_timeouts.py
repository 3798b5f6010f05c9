"""Nothing hangs on a dead network: a blackholed connection (the proxy keeps every socket open and stops
forwarding bytes, so TCP on the client still sees a live peer) ends in a typed pgjournal error within the
client-side limit, ``statement_timeout + tcp_user_timeout`` (here 1 s + 1 s).

Also: the libpq keywords every connection gets (pgjournal/server/connections.py), and that a projection handler's
own statements are not cut by pgjournal's limits.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faultproxy import FaultProxy, fault_proxy

from pgjournal import (
    ConcurrencyConflict,
    ConfigurationError,
    ConnectionTimedOut,
    DatabaseUnavailable,
    Journal,
    WriteOutcomeUnknown,
)
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.handlers import ExactlyOnce, Projection, ProjectionSettings
from pgjournal.projections.offset_store import OffsetStore, Record
from pgjournal.projections.runner import run_range
from pgjournal.server.connections import connection_kwargs, round_trip_limit
from pgjournal.settings import Settings

pytestmark = [pytest.mark.timing, pytest.mark.timeout(120), pytest.mark.mode_independent, pytest.mark.servers]

LIMITS = {"statement_timeout": 1.0, "tcp_user_timeout": 1.0, "connect_timeout": 1.0}
LIMIT = 2.0  # statement_timeout + tcp_user_timeout
#: What the test allows beyond the limit: the pool discarding the connection, a loaded 2-core machine.
SLACK = 1.5


@pytest.fixture
def blackholed(dsn: str) -> Iterator[tuple[FaultProxy, Journal]]:
    """A migrated journal behind a fault proxy, connected and warmed up, with the small limits."""
    with fault_proxy(dsn) as (proxy, proxied), Journal.open(proxied, pool_min_size=1, pool_max_size=2,
                                                             **FAST, **LIMITS) as journal:
        journal.append("Cart|warm", ["w"], expected_seq_nr=0)
        try:
            yield proxy, journal
        finally:
            proxy.stall(False)


def timed(fn: object) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        return exc, time.monotonic() - started
    raise AssertionError("no error although the network is blackholed")


def test_every_connection_gets_connect_timeout_keepalives_and_tcp_user_timeout() -> None:
    settings = Settings(connect_timeout=5, tcp_user_timeout=30, statement_timeout=12.5)
    kwargs = connection_kwargs(settings)
    assert kwargs == {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                      "keepalives_count": 3, "tcp_user_timeout": 30000}
    assert connection_kwargs(settings, statement_timeout=True)["options"] == "-c statement_timeout=12500"
    assert "options" not in connection_kwargs(Settings(statement_timeout=0), statement_timeout=True)
    assert round_trip_limit(settings) == 42.5 and round_trip_limit(Settings(statement_timeout=0)) is None


@pytest.mark.parametrize(("name", "value"), [("statement_timeout", -1), ("tcp_user_timeout", "soon"),
                                             ("statement_timeout", float("nan")), ("tcp_user_timeout", 1e9)])
def test_bad_limits_are_refused_with_the_value(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=name) as caught:
        Settings(**{name: value})
    assert repr(value) in str(caught.value)


def test_the_pool_runs_with_the_statement_timeout_and_the_server_enforces_it(dsn: str) -> None:
    with Journal.open(dsn, **LIMITS) as journal, journal.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1s",)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(1.5)")
        # keepalives and tcp_user_timeout are the client socket's options (the server GUCs are its own)
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1000
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
        finally:
            sock.close()


@pytest.mark.floor
def test_an_append_on_a_blackholed_network_is_unknown_within_the_limit(
        blackholed: tuple[FaultProxy, Journal]) -> None:
    proxy, journal = blackholed
    proxy.stall(True)
    error, took = timed(lambda: journal.append("Cart|a", ["x"], expected_seq_nr=0))
    print(f"\nTIMEOUT append: {type(error).__name__} after {took:.2f} s (limit {LIMIT} s)")
    assert isinstance(error, WriteOutcomeUnknown | ConnectionTimedOut), repr(error)
    assert "ServerSilent" in str(error) or "within 2 s" in str(error)
    assert LIMIT - 0.2 <= took < LIMIT + SLACK
    proxy.stall(False)
    # Unknown for real: the proxy held the INSERT and may deliver it now. Retrying the same append settles it.
    try:
        journal.append("Cart|a", ["x"], expected_seq_nr=0)
    except ConcurrencyConflict as conflict:
        assert conflict.actual_seq_nr == 1  # the first attempt was written after all
    assert journal.highest_seq_nr("Cart|a") == 1


@pytest.mark.floor
def test_a_by_slices_query_on_a_blackholed_network_times_out_and_a_live_one_gives_up_after_its_retries(
        blackholed: tuple[FaultProxy, Journal], caplog: pytest.LogCaptureFixture) -> None:
    proxy, journal = blackholed
    proxy.stall(True)
    error, took = timed(lambda: list(journal.query.current_events_by_slices("Cart", 0, 1023)))
    print(f"\nTIMEOUT current events_by_slices: {type(error).__name__} after {took:.2f} s")
    assert isinstance(error, ConnectionTimedOut) and "within 2 s" in str(error), repr(error)
    assert took < LIMIT + SLACK
    proxy.stall(False)

    live_journal = Journal.open(journal.dsn, live_query_retries=2, **FAST, **LIMITS)
    try:
        got: list[EventEnvelope] = []
        outcome: list[BaseException] = []
        stalled_at: list[float] = []
        live = live_journal.query.events_by_slices("Cart", 0, 1023)

        def consume() -> None:
            try:
                for env in live:
                    got.append(env)
                    if not stalled_at:
                        proxy.stall(True)
                        stalled_at.append(time.monotonic())
            except BaseException as exc:
                outcome.append(exc)
                stalled_at.append(time.monotonic())

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the live query hung on the blackholed network"
    finally:
        proxy.stall(False)
        live_journal.close()
    took = stalled_at[1] - stalled_at[0]
    print(f"TIMEOUT live events_by_slices: {type(outcome[0]).__name__} after {took:.2f} s: {outcome[0]}")
    assert [e.persistence_id for e in got] == ["Cart|warm"]
    assert isinstance(outcome[0], DatabaseUnavailable) and "3 failed polls in a row" in str(outcome[0])
    # three polls, each bounded (the first by the round-trip limit, then by connect_timeout), plus backoff
    assert took < 3 * LIMIT + 1.0 + SLACK


def test_a_projection_offset_commit_on_a_blackholed_network_times_out(
        blackholed: tuple[FaultProxy, Journal]) -> None:
    proxy, journal = blackholed
    env = next(iter(journal.query.current_events_by_persistence_id("Cart|warm")))
    store = OffsetStore(journal, "timeouts", "Cart", 0, 1023, time_window=300)
    pending = {env.persistence_id: Record(env.slice, env.seq_nr, env.db_timestamp)}

    def commit() -> None:
        with journal.connection() as conn, conn.transaction():
            proxy.stall(True)
            store.save(conn, pending, fenced=True)

    error, took = timed(commit)
    print(f"\nTIMEOUT projection offset commit: {type(error).__name__} after {took:.2f} s")
    assert isinstance(error, ConnectionTimedOut) and "within 2 s" in str(error), repr(error)
    assert took < LIMIT + SLACK


def test_a_projection_handler_is_not_cut_by_pgjournals_statement_limits(dsn: str) -> None:
    done = threading.Event()

    def slow(conn: psycopg.Connection, env: EventEnvelope) -> None:
        conn.execute("SELECT pg_sleep(%s)", (LIMIT + 0.5,))  # longer than statement_timeout and the limit
        done.set()

    settings = ProjectionSettings(attempts=1, on_failure="fail", restart_backoff=0.2)
    with Journal.open(dsn, **FAST, **LIMITS) as journal:
        journal.append("Slow|1", ["e"], expected_seq_nr=0)
        runner = run_range(journal, Projection("slow", "Slow", ExactlyOnce(slow), settings), 0, 1023)
        try:
            assert done.wait(30), "the handler never completed"
            eventually(lambda: runner.stats.handled >= 1 or runner.failed, "the envelope handled", timeout=10)
            assert runner.stats.handled == 1 and not runner.failed
        finally:
            runner.stop()
            runner.join(timeout=30)


@pytest.mark.floor
def test_both_faces_cut_a_round_trip_past_the_limit_and_keep_every_other_answer(dsn: str) -> None:
    """The client-side limit on its own (no proxy): a server that takes longer than the limit to answer, with
    its statement timeout off, is cut by the watchdog within the limit on both faces; the connection is closed;
    the answers before it, a pipeline's included, and the answers of connections without a limit are kept.
    This also checks that the installed psycopg routes statements, pipelines and streamed rows through
    ``Connection.wait``, the hook the limit rests on."""
    import asyncio

    from pgjournal.aio.connections import AsyncLimitedConnection
    from pgjournal.server.connections import WATCHDOG, LimitedConnection, ServerSilent

    limit = 0.5
    sync_class = type("Limited", (LimitedConnection,), {"limit": limit})
    async_class = type("AsyncLimited", (AsyncLimitedConnection,), {"limit": limit})
    cuts = WATCHDOG.cuts

    with sync_class.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_sleep(0.1), 1").fetchone() == ("", 1)  # within the limit
        with conn.pipeline():
            first, second = conn.execute("SELECT 1"), conn.execute("SELECT 2")
        assert (first.fetchone(), second.fetchone()) == ((1,), (2,))
        with conn.cursor() as cursor:
            assert [row for (row,) in cursor.stream("SELECT generate_series(1, 3)")] == [1, 2, 3]
        started = time.monotonic()
        with pytest.raises(ServerSilent, match=r"within 0\.5 s"):
            conn.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < limit + SLACK
        assert conn.closed
    assert WATCHDOG.cuts == cuts + 1

    async def async_face() -> None:
        async with await async_class.connect(dsn, autocommit=True) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
            started = time.monotonic()
            with pytest.raises(ServerSilent):
                await conn.execute("SELECT pg_sleep(5)")
            assert time.monotonic() - started < limit + SLACK
            assert conn.closed

    asyncio.run(async_face())
    assert WATCHDOG.cuts == cuts + 2
    with psycopg.connect(dsn, autocommit=True) as plain:  # no limit: waits as long as it takes
        assert plain.execute("SELECT pg_sleep(0.8), 2").fetchone() == ("", 2)
