"""Faults injected for real, through a TCP proxy (tests/support/faultproxy.py) or by restarting a private server.

What must hold: a cut append is all-or-nothing and the caller is told "unknown" (never a raw driver
error); retrying it with the same ``expected_seq_nr`` never writes twice; live queries reconnect with
backoff and resume without loss or duplicates. Each test prints its fault counts (``-s`` shows them;
the report in the issue quotes them).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faultproxy import FaultProxy, fault_proxy

from pgjournal import (
    ConcurrencyConflict,
    DatabaseUnavailable,
    Journal,
    JournalError,
    WriteOutcomeUnknown,
)
from pgjournal.model.slices import slice_ranges
from pgjournal.server.embedded import EmbeddedServer

pytestmark = [pytest.mark.timing, pytest.mark.timeout(180), pytest.mark.mode_independent, pytest.mark.servers]


@pytest.fixture
def proxied(dsn: str) -> Iterator[tuple[FaultProxy, str]]:
    with fault_proxy(dsn) as pair:
        yield pair


def stored(dsn: str, pid: str) -> list[tuple[int, str]]:
    """(seq_nr, event id) of ``pid`` as stored, read directly (not through the proxy)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT seq_nr, convert_from(event_payload, 'UTF8') FROM event_journal "
                            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()
    return [(seq, payload.strip('"')) for seq, payload in rows]


def append_surely(journal: Journal, pid: str, events: list[str], expected: int, faults: dict[str, int],
                  deadline: float = 60.0) -> None:
    """Append ``events`` after ``expected`` whatever the network does, the way a caller should: on
    "unknown" or "unavailable" retry the same append; a conflict after an unknown outcome means the first
    attempt had been written (checked: the stored events are exactly these)."""
    unknown = False
    stop = time.monotonic() + deadline
    while True:
        try:
            journal.append(pid, events, expected_seq_nr=expected)
            return
        except WriteOutcomeUnknown:
            faults["unknown"] += 1
            unknown = True
        except DatabaseUnavailable:
            faults["unavailable"] += 1
        except ConcurrencyConflict as conflict:
            assert unknown, f"conflict without an earlier unknown outcome: {conflict}"
            assert conflict.actual_seq_nr in (None, expected + len(events)), conflict
            if conflict.actual_seq_nr is None:
                continue  # could not read it back (network again): ask once more
            faults["settled_by_conflict"] += 1
            return
        if time.monotonic() > stop:
            raise AssertionError(f"append to {pid} did not get through in {deadline}s: {faults}")
        time.sleep(0.01)  # the writer's pacing between attempts (a client retrying), not a wait for a condition


# -- 1. cut mid-append -----------------------------------------------------------------------------


@pytest.mark.parametrize("forward", [False, True], ids=["cut-before-server", "cut-after-server"])
def test_a_cut_append_is_all_or_nothing_reported_unknown_and_safe_to_retry(
        proxied: tuple[FaultProxy, str], dsn: str, forward: bool) -> None:
    proxy, via = proxied
    pid, rounds, batch = "Cart|cut", 12, 3
    with Journal.open(via, notify=False, connect_timeout=2) as journal:
        for r in range(rounds):
            expected = r * batch
            events = [f"r{r}-e{i}" for i in range(batch)]
            # The persistence id, not the statement text: a connection that ran the statement 5 times has it
            # prepared and sends only its name, so a text marker missed 1 run in ~20.
            proxy.cut_on(pid.encode(), forward=forward)
            with pytest.raises(WriteOutcomeUnknown, match=r"may or may not be written.*same expected_seq_nr"):
                journal.append(pid, events, expected_seq_nr=expected)
            assert proxy.sprung.is_set()
            ids = [event for _, event in stored(dsn, pid)]
            written = sum(event in ids for event in events)
            assert written in (0, batch), f"half a batch written: {written} of {batch}"
            assert written == (batch if forward else 0)
            if forward:  # it was written: the retry must refuse, and write nothing
                with pytest.raises(ConcurrencyConflict) as conflict:
                    journal.append(pid, events, expected_seq_nr=expected)
                assert conflict.value.actual_seq_nr == expected + batch
            else:
                journal.append(pid, events, expected_seq_nr=expected)
    rows = stored(dsn, pid)
    assert [seq for seq, _ in rows] == list(range(1, rounds * batch + 1))
    assert [event for _, event in rows] == [f"r{r}-e{i}" for r in range(rounds) for i in range(batch)]
    print(f"\nFAULTS cut-mid-append forward={forward}: {proxy.traps_sprung} injected, {rounds} retried, "
          f"0 lost, 0 duplicated")


def test_appends_survive_random_cuts_with_no_loss_and_no_duplicate(
        proxied: tuple[FaultProxy, str], dsn: str) -> None:
    """A writer appends at least 150 batches while the network is cut at random moments (before, during and after
    statements), and goes on until more than 10 cuts have hit its appends: on a quick machine 150 appends can end
    between two cuts. Every batch ends up written exactly once, in order."""
    proxy, via = proxied
    pid, least, most = "Cart|chaos", 150, 20_000
    faults = {"unknown": 0, "unavailable": 0, "settled_by_conflict": 0}
    stop = threading.Event()

    def chaos() -> None:
        rng = random.Random(7)
        while not stop.wait(rng.uniform(0.005, 0.04)):
            # Logins are spared (a SCRAM login is three round trips and a key derivation; cut during one, the
            # pool's reconnect backoff, not the writer's handling of cuts, decides how long an append waits):
            # a logged-in connection is cut at any moment, before, during or after a statement.
            proxy.cut(logged_in=True)

    cutter = threading.Thread(target=chaos, daemon=True)
    with Journal.open(via, notify=False, connect_timeout=2, pool_max_size=2) as journal:
        cutter.start()
        try:
            batches = 0
            while batches < least or faults["unknown"] + faults["unavailable"] <= 10:
                assert batches < most, f"{most} batches and too few faults hit the writer: {faults}"
                append_surely(journal, pid, [f"b{batches}-0", f"b{batches}-1"], expected=2 * batches, faults=faults)
                batches += 1
        finally:
            stop.set()
            cutter.join()
    rows = stored(dsn, pid)
    assert [seq for seq, _ in rows] == list(range(1, 2 * batches + 1))
    assert [event for _, event in rows] == [f"b{b}-{i}" for b in range(batches) for i in range(2)]
    print(f"\nFAULTS random cuts during appends: {proxy.cuts} connections cut, writer saw {faults}; "
          f"{2 * batches} events, 0 lost, 0 duplicated")


def test_a_stalled_network_delays_an_append_but_it_completes_once(
        proxied: tuple[FaultProxy, str], dsn: str) -> None:
    proxy, via = proxied
    with Journal.open(via, notify=False, connect_timeout=2) as journal:
        journal.append("Cart|stall", ["warm"], expected_seq_nr=0)
        proxy.stall(True)
        done: list[object] = []
        worker = threading.Thread(target=lambda: done.append(
            journal.append("Cart|stall", ["slow"], expected_seq_nr=1)), daemon=True)
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not done  # held up by the network, not failed
        proxy.stall(False)
        worker.join(10)
        assert done
    assert stored(dsn, "Cart|stall") == [(1, "warm"), (2, "slow")]


# -- 2. cut mid-query: live queries reconnect and resume -------------------------------------------


def _write_in_background(dsn: str, pids: list[str], per_pid: int, pause: float) -> threading.Thread:
    """Write ``per_pid`` events to each pid, round-robin, directly (not through the proxy)."""

    def run() -> None:
        with Journal.open(dsn, notify=False) as writer:
            for n in range(per_pid):
                for pid in pids:
                    writer.append(pid, [f"{pid}#{n + 1}"], expected_seq_nr=n)
                time.sleep(pause)  # the scenario: a writer's pace, so the faults fall between its appends

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _consume(query: Iterator, want: int, timeout: float) -> tuple[list[tuple[str, int, str]], Callable[[], None]]:
    got: list[tuple[str, int, str]] = []
    finished = threading.Event()

    def run() -> None:
        for env in query:
            got.append((env.persistence_id, env.seq_nr, env.event))
            if len(got) >= want:
                break
        finished.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> None:
        finished.wait(timeout)
        query.close()  # type: ignore[attr-defined]
        thread.join(5)

    return got, wait


@contextlib.contextmanager
def _chaos(proxy: FaultProxy, *, marker: bytes, seed: int) -> Iterator[None]:
    """While the block runs: cut every connection now and then, and arm a trap that cuts in the middle of a
    query. Stopped when the block ends, however it ends, before the proxy closes."""
    stop = threading.Event()

    def run() -> None:
        rng = random.Random(seed)
        while not stop.wait(rng.uniform(0.1, 0.3)):
            if rng.random() < 0.5:
                proxy.cut()
            else:
                proxy.cut_on(marker, forward=True)  # the query reaches the server; its rows never come back

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def polled(dsn: str) -> bool:
    """Whether a session of this database has run a by-slice query (it shows as its last statement)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND query LIKE '%ORDER BY db_timestamp, seq_nr%' AND pid <> pg_backend_pid()").fetchone()
    return bool(row and row[0])


def _check_exactly_once(got: list[tuple[str, int, str]], pids: list[str], per_pid: int) -> None:
    keys = [(pid, seq) for pid, seq, _ in got]
    assert len(keys) == len(set(keys)), f"duplicates: {len(keys) - len(set(keys))}"
    missing = {(pid, n) for pid in pids for n in range(1, per_pid + 1)} - set(keys)
    assert not missing, f"{len(missing)} events lost, e.g. {sorted(missing)[:5]}"
    for pid in pids:
        seqs = [seq for p, seq, _ in got if p == pid]
        assert seqs == sorted(seqs), f"{pid} out of order"
    assert all(event == f"{pid}#{seq}" for pid, seq, event in got)


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
def test_live_events_by_slices_survive_cuts_mid_query(
        proxied: tuple[FaultProxy, str], dsn: str, portable: bool, caplog: pytest.LogCaptureFixture) -> None:
    proxy, via = proxied
    pids = [f"Cart|{i}" for i in range(12)]
    per_pid = 25
    with caplog.at_level(logging.WARNING, logger="pgjournal.runtime.live"), \
            Journal.open(via, portable=portable, connect_timeout=2, **FAST) as consumer:
        query = consumer.query.events_by_slices("Cart", 0, 1023)
        got, wait = _consume(query, len(pids) * per_pid, timeout=60)
        with _chaos(proxy, marker=b"FROM event_journal", seed=1):
            writer = _write_in_background(dsn, pids, per_pid, pause=0.08)
            writer.join(60)
            time.sleep(1.0)  # the scenario: the faults go on for a while after the last write
        wait()
    retries = caplog.text.count("live query poll failed")
    _check_exactly_once(got, pids, per_pid)
    assert retries >= 3, f"the faults did not reach the query ({retries} failed polls)"
    print(f"\nFAULTS events_by_slices portable={portable}: {proxy.cuts} connections cut, "
          f"{proxy.traps_sprung} mid-query cuts, {retries} failed polls retried; {len(got)} events, 0 lost, "
          "0 duplicated")


def test_live_events_by_persistence_id_survives_cuts_mid_query(
        proxied: tuple[FaultProxy, str], dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    proxy, via = proxied
    pid, per_pid = "Cart|solo", 200
    with caplog.at_level(logging.WARNING, logger="pgjournal.runtime.live"), \
            Journal.open(via, connect_timeout=2, buffer_size=7, **FAST) as consumer:
        query = consumer.query.events_by_persistence_id(pid)
        got, wait = _consume(query, per_pid, timeout=60)
        with _chaos(proxy, marker=b"seq_nr >= ", seed=2):
            writer = _write_in_background(dsn, [pid], per_pid, pause=0.01)
            writer.join(60)
            time.sleep(1.0)  # the scenario: the faults go on for a while after the last write
        wait()
    retries = caplog.text.count("live query poll failed")
    _check_exactly_once(got, [pid], per_pid)
    assert retries >= 3, f"the faults did not reach the query ({retries} failed polls)"
    print(f"\nFAULTS events_by_persistence_id: {proxy.cuts} connections cut, {proxy.traps_sprung} mid-query cuts, "
          f"{retries} failed polls retried; {len(got)} events, 0 lost, 0 duplicated")


def test_a_live_query_waits_out_an_unreachable_server_with_backoff(
        proxied: tuple[FaultProxy, str], dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    proxy, via = proxied
    with caplog.at_level(logging.WARNING, logger="pgjournal.runtime.live"), \
            Journal.open(via, connect_timeout=1, **FAST) as consumer:
        query = consumer.query.events_by_slices("Cart", 0, 1023)
        got, wait = _consume(query, 2, timeout=30)
        with Journal.open(dsn) as writer:
            writer.append("Cart|a", ["Cart|a#1"], expected_seq_nr=0)
            eventually(lambda: len(got) == 1, "the first event delivered")
            proxy.refuse(True)
            proxy.cut()
            writer.append("Cart|a", ["Cart|a#2"], expected_seq_nr=1)
            eventually(lambda: caplog.text.count("retrying in") >= 3, "three retries, backing off", timeout=30)
            assert len(got) == 1  # the second event waits for the server
            proxy.refuse(False)
        wait()
    delays = [float(line.rsplit("retrying in ", 1)[1].split()[0]) for line in caplog.text.splitlines()
              if "retrying in" in line]
    assert len(delays) >= 3 and delays[:3] == sorted(delays[:3]) and delays[1] > delays[0], delays
    assert [(p, s) for p, s, _ in got] == [("Cart|a", 1), ("Cart|a", 2)]
    print(f"\nFAULTS unreachable server: {proxy.refused} connections refused, backoff {delays}; 0 lost")


# -- 3. server restart mid-stream (a PRIVATE embedded server, never the shared one) ------------------


def test_live_queries_and_a_writer_survive_server_restarts(
        private_server: EmbeddedServer, caplog: pytest.LogCaptureFixture) -> None:
    """Stop and start the (private) server twice while a writer appends and two live queries follow.

    The embedded server starts again on the port it had, so every client keeps its DSN: its pool reconnects
    to the same address, restarted."""
    direct = private_server.dsn
    port = private_server.status().port
    Journal.open(direct, migrate=True).close()
    pids = [f"Cart|r{i}" for i in range(6)]
    per_pid = 30
    restarts = 2
    faults = {"unknown": 0, "unavailable": 0, "settled_by_conflict": 0}
    with caplog.at_level(logging.WARNING, logger="pgjournal.runtime.live"), \
            Journal.open(direct, connect_timeout=2, **FAST) as consumer:
        by_slices, wait_slices = _consume(consumer.query.events_by_slices("Cart", 0, 1023), len(pids) * per_pid, 90)
        by_pid, wait_pid = _consume(consumer.query.events_by_persistence_id(pids[0]), per_pid, 90)
        done = threading.Event()

        def write() -> None:
            with Journal.open(direct, notify=False, connect_timeout=2) as writer:
                for n in range(per_pid):
                    for pid in pids:
                        append_surely(writer, pid, [f"{pid}#{n + 1}"], expected=n, faults=faults)
                    time.sleep(0.03)  # the scenario: a writer's pace, so the restarts fall mid-stream
            done.set()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        for _ in range(restarts):
            eventually(lambda: len(by_slices) > 0, "events delivered before the restart")
            private_server.stop()
            private_server.ensure_running()
            assert private_server.status().port == port, "the restarted server moved to another port"
        writer.join(90)
        assert done.is_set(), f"the writer did not finish: {faults}"
        wait_slices()
        wait_pid()
    retries = caplog.text.count("live query poll failed")
    _check_exactly_once(by_slices, pids, per_pid)
    _check_exactly_once(by_pid, pids[:1], per_pid)
    with psycopg.connect(private_server.dsn) as conn:
        total = conn.execute("SELECT count(*), count(DISTINCT (persistence_id, seq_nr)) FROM event_journal").fetchone()
    assert total == (len(pids) * per_pid, len(pids) * per_pid)
    assert retries >= 1 and sum(faults.values()) >= 1, "the restarts did not happen mid-stream"
    print(f"\nFAULTS server restarts: {restarts} restarts on port {port}, writer saw {faults}, {retries} failed polls "
          f"retried; {len(by_slices)} + {len(by_pid)} events delivered, 0 lost, 0 duplicated")


def test_no_raw_driver_error_escapes_an_append_when_the_server_is_gone(
        proxied: tuple[FaultProxy, str], dsn: str) -> None:
    proxy, via = proxied
    with Journal.open(via, notify=False, connect_timeout=1) as journal:
        journal.append("Cart|gone", ["a"], expected_seq_nr=0)
        proxy.refuse(True)
        proxy.cut()
        outcomes = []
        for n in range(5):
            with pytest.raises(JournalError) as failed:
                journal.append("Cart|gone", [f"x{n}"], expected_seq_nr=1)
            outcomes.append(type(failed.value).__name__)
        assert set(outcomes) <= {"WriteOutcomeUnknown", "DatabaseUnavailable"}, outcomes
        proxy.refuse(False)
        # The pool reconnects with its own backoff: within a few seconds appends go through again.
        faults = {"unknown": 0, "unavailable": 0, "settled_by_conflict": 0}
        append_surely(journal, "Cart|gone", ["b"], expected=1, faults=faults, deadline=15)
    assert stored(dsn, "Cart|gone") == [(1, "a"), (2, "b")]


def test_reads_on_a_lost_connection_raise_database_unavailable_not_a_driver_error(
        proxied: tuple[FaultProxy, str]) -> None:
    """Fix proved here: a read on a pooled connection the network had cut raised psycopg.OperationalError."""
    proxy, via = proxied
    with Journal.open(via, notify=False, connect_timeout=1, pool_min_size=2, pool_max_size=2) as journal:
        journal.append("Cart|r", ["a"], expected_seq_nr=0)
        reads = [lambda: journal.highest_seq_nr("Cart|r"),
                 lambda: list(journal.query.current_events_by_persistence_id("Cart|r")),
                 lambda: list(journal.query.current_events_by_slices("Cart", 0, 1023)),
                 lambda: list(journal.query.current_persistence_ids()),
                 lambda: journal.load_snapshot("Cart|r")]
        for read in reads:
            assert proxy.cut() >= 1  # the pool's idle connections die under it
            with pytest.raises(DatabaseUnavailable, match=r"lost the connection|no connection"):
                read()
            # The pool discards a broken connection when it comes back (it does not test idle ones before
            # handing them out), so at most one more call meets a dead one; then reads work again.
            for _ in range(2):
                try:
                    read()
                    break
                except DatabaseUnavailable:
                    continue
            read()


def test_a_live_query_ends_when_its_journal_is_closed(dsn: str) -> None:
    """Fix proved here: after Journal.close() a live query retried 'pool closed' forever."""
    journal = Journal.open(dsn, **FAST)
    query = journal.query.events_by_slices("Cart", 0, 1023)
    got, wait = _consume(query, 10, timeout=3)
    eventually(lambda: polled(dsn), "the live query's first poll")
    journal.close()
    started = time.monotonic()
    wait()
    assert query.closed and time.monotonic() - started < 2.5 and got == []


# -- 4. projections: cut mid-stream and mid-commit, and a server restart ----------------------------


def _run_projection_until_caught_up(consumer: Journal, direct: Journal, name: str, writer: threading.Thread,
                                    stop_chaos: threading.Event, chaos: threading.Thread | None) -> list:
    """Run the counter projection over two ranges until its read model equals the journal (or 60 s after
    the writer finished), with ``chaos`` running meanwhile."""
    from support.projection_handlers import FAST_PROJECTION

    from pgjournal.projections.examples import counter_mismatches, counter_writer
    from pgjournal.projections.handlers import Projection
    from pgjournal.projections.runner import run_range

    projection = Projection(name, "Cart", counter_writer(name, grouped=True, max_count=7, max_wait=0.05),
                            FAST_PROJECTION)
    runners = [run_range(consumer, projection, lo, hi) for lo, hi in slice_ranges(2)]

    def behind() -> bool:
        try:
            return bool(counter_mismatches(direct, name, "Cart"))
        except JournalError:  # the database is away (restart): not caught up yet
            return True

    try:
        if chaos is not None:
            chaos.start()
        writer.join(120)
        if chaos is not None:
            chaos.join(120)
        with contextlib.suppress(AssertionError):  # the assertion below shows what differs
            eventually(lambda: not behind(), "the read model caught up", timeout=60, interval=0.1)
    finally:
        stop_chaos.set()
        for runner in runners:
            runner.stop()
        for runner in runners:
            runner.join(30)
    assert not any(r.failed for r in runners), [r.failed for r in runners]
    assert counter_mismatches(direct, name, "Cart") == []  # every event counted once: none lost, none twice
    return runners


def test_a_projection_survives_cuts_mid_stream_and_mid_commit(
        proxied: tuple[FaultProxy, str], dsn: str) -> None:
    """Cut the network at random, and right after a projection sends COMMIT (it cannot know whether its
    handler's writes and offsets committed): the read model still counts every event exactly once."""
    from pgjournal.admin.verify import verify
    from pgjournal.projections.examples import ensure_counter_table

    proxy, via = proxied
    pids = [f"Cart|p{i}" for i in range(10)]
    stop = threading.Event()

    def chaos() -> None:
        rng = random.Random(3)
        while not stop.wait(rng.uniform(0.1, 0.3)) and writer.is_alive():
            choice = rng.random()
            if choice < 0.4:
                proxy.cut()
            else:
                proxy.cut_on(b"COMMIT" if choice < 0.8 else b"projection_timestamp_offset_store", forward=True)

    with Journal.open(dsn) as direct, Journal.open(via, connect_timeout=2, **FAST) as consumer:
        ensure_counter_table(direct)
        writer = _write_in_background(dsn, pids, 25, pause=0.05)
        cutter = threading.Thread(target=chaos, daemon=True)
        runners = _run_projection_until_caught_up(consumer, direct, "faulty", writer, stop, cutter)
        assert verify(direct).ok
    restarts = sum(r.stats.restarts for r in runners)
    assert restarts >= 3, f"the faults did not reach the projection ({restarts} restarts)"
    print(f"\nFAULTS projection: {proxy.cuts} connections cut, {proxy.traps_sprung} cut at COMMIT/offset write, "
          f"{restarts} range restarts, {sum(r.stats.duplicates for r in runners)} duplicates dropped; "
          f"{len(pids) * 25} events counted once, 0 lost, 0 twice")


def test_a_projection_survives_server_restarts(private_server: EmbeddedServer) -> None:
    from pgjournal.projections.examples import ensure_counter_table

    direct_dsn = private_server.dsn
    Journal.open(direct_dsn, migrate=True).close()
    pids = [f"Cart|q{i}" for i in range(6)]
    faults = {"unknown": 0, "unavailable": 0, "settled_by_conflict": 0}
    stop = threading.Event()
    port = private_server.status().port
    with Journal.open(direct_dsn, connect_timeout=2, **FAST) as consumer:  # the server restarts on its port
        with Journal.open(direct_dsn) as setup:
            ensure_counter_table(setup)

        failures: list[BaseException] = []

        def write() -> None:
            try:
                with Journal.open(direct_dsn, notify=False, connect_timeout=2) as writer:
                    for n in range(20):
                        for pid in pids:
                            append_surely(writer, pid, [f"{pid}#{n + 1}"], expected=n, faults=faults)
                        time.sleep(0.05)  # the scenario: a writer's pace, so the restarts fall mid-stream
            except BaseException as exc:  # asserted below, like the restarter's
                failures.append(exc)

        def restart() -> None:
            try:
                for _ in range(2):
                    if stop.wait(1.0):
                        return
                    private_server.stop()
                    time.sleep(0.3)  # the scenario: the server stays down a moment
                    private_server.ensure_running()
                    assert private_server.status().port == port, "the restarted server moved to another port"
            except BaseException as exc:  # asserted below: a failed restart must fail the test, not hang it
                failures.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        restarter = threading.Thread(target=restart, daemon=True)
        runners = _run_projection_until_caught_up(consumer, consumer, "restarted", writer, stop, restarter)
        assert failures == []
    restarts = sum(r.stats.restarts for r in runners)
    assert restarts + sum(faults.values()) >= 1, "the server restarts did not happen while the projection ran"
    print(f"\nFAULTS projection across 2 server restarts: {restarts} range restarts, writer saw {faults}; "
          f"{len(pids) * 20} events counted once, 0 lost, 0 twice")
