"""Live delivery in a busy production database: readers that are not journal writers never hold live
consumers back; writers that are slow are waited for (never skipped), also across restarts, also when the
reading role may not see them. Every consumer gets every event of its range once, in sequence order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from support import FAST, Roles, role_dsn
from support.eventually import eventually
from support.held_writes import holds_write_lock, insert_in, prepared_insert_held

from pgjournal import HorizonBlocked, Journal
from pgjournal.aio import AsyncJournal
from pgjournal.core.horizon import HorizonTracker
from pgjournal.model.offsets import NoOffset, Offset

pytestmark = [pytest.mark.timing, pytest.mark.postgres_only("the visibility horizon in a busy database")]

ENTITY = "Busy"
#: A live event must arrive within this (refresh 0.2 s); one open transaction held delivery 10 s before.
LATENCY_BOUND = 2.0


@dataclass
class Recorder:
    """A live events_by_slices consumer over all slices, recording when each event arrived."""

    journal: Journal
    offset: Offset = NoOffset
    arrived: dict[tuple[str, int], float] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)
    last_offset: Offset = NoOffset
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._query = self.journal.query.events_by_slices(ENTITY, 0, 1023, self.offset)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for env in self._query:
                self.arrived.setdefault((env.persistence_id, env.seq_nr), time.monotonic())
                self.order.append((env.persistence_id, env.seq_nr))
                self.last_offset = env.offset
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        self._query.close()
        self._thread.join(10)

    def assert_exactly_once_in_order(self, expected: set[tuple[str, int]]) -> None:
        assert self.error is None, self.error
        assert len(self.order) == len(set(self.order)), "an event was delivered twice"
        assert set(self.order) == expected, f"missing {sorted(expected - set(self.order))[:5]}"
        last: dict[str, int] = {}
        for pid, seq in self.order:
            assert seq == last.get(pid, 0) + 1, f"{pid} seq_nr {seq} after {last.get(pid, 0)}"
            last[pid] = seq


@contextlib.contextmanager
def recording(journal: Journal, offset: Offset = NoOffset) -> Iterator[Recorder]:
    recorder = Recorder(journal, offset)
    try:
        yield recorder
    finally:
        recorder.close()


def stored(dsn: str) -> set[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s",
                                (ENTITY,)).fetchall())


def append_timed(journal: Journal, pid: str, n: int) -> dict[tuple[str, int], float]:
    """Append ``n`` single-event appends to ``pid``; when each returned (committed)."""
    committed = {}
    for _ in range(n):
        (env,) = journal.append(pid, [{"p": "x" * 40}])
        committed[(pid, env.seq_nr)] = time.monotonic()
        time.sleep(0.01)  # the scenario: a writer's pace (appends spread over time, not one burst)
    return committed


# -- transactions that are not journal writers ----------------------------------------------------------


def _idle_in_transaction(dsn: str) -> Iterator[None]:
    with psycopg.connect(dsn) as conn:  # psql: BEGIN; SELECT ...; and then lunch
        conn.execute("SELECT count(*) FROM event_journal")
        yield


def _repeatable_read_cursor(dsn: str) -> Iterator[None]:
    with psycopg.connect(dsn) as conn:  # a report or a Spark JDBC read: one snapshot, a cursor fetched slowly
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with conn.cursor(name="spark_like") as cur:
            cur.itersize = 10
            cur.execute("SELECT * FROM event_journal ORDER BY db_timestamp")
            cur.fetchmany(10)
            yield


def _pg_dump(dsn: str) -> Iterator[None]:
    """A real pg_dump of the database, stalled on a full pipe that nobody reads (its snapshot stays open)."""
    from pgjournal.server.embedded import _bin_dir

    dump = subprocess.Popen([str(_bin_dir() / "pg_dump"), "--dbname", dsn], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            def dumping() -> bool:
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump' "
                                   "AND xact_start IS NOT NULL AND datname = current_database()").fetchone()
                return bool(row and row[0])

            eventually(dumping)
        yield
        assert dump.poll() is None, "pg_dump finished: the test did not keep its transaction open"
    finally:
        dump.kill()
        dump.wait()


OTHER_TRANSACTIONS = {"idle in transaction": _idle_in_transaction, "repeatable read cursor": _repeatable_read_cursor,
                      "pg_dump": _pg_dump}


@pytest.mark.parametrize("other", list(OTHER_TRANSACTIONS))
def test_readers_and_dumps_do_not_hold_back_live_delivery(dsn: str, other: str) -> None:
    with Journal.open(dsn, **FAST) as journal:
        for i in range(30):  # ~1 MB, more than a pipe holds: pg_dump blocks writing it
            journal.append(f"Fill|{i}", [{"pad": "y" * 300}] * 100)
        with contextlib.contextmanager(OTHER_TRANSACTIONS[other])(dsn), recording(journal) as recorder:
            committed = {}
            for i in range(4):
                committed.update(append_timed(journal, f"{ENTITY}|{i}", 10))
            eventually(lambda: set(recorder.arrived) >= set(committed), timeout=15)
        latencies = sorted(recorder.arrived[key] - at for key, at in committed.items())
        assert latencies[-1] < LATENCY_BOUND, f"{other}: slowest delivery {latencies[-1]:.2f} s"
        recorder.assert_exactly_once_in_order(stored(dsn))


# -- a write lock taken without the right to write ------------------------------------------------------


@pytest.mark.parametrize("viewer", ["writer", "superuser", "reader"])
@pytest.mark.parametrize("holder", ["reader", "loader"])
def test_a_write_lock_of_a_role_that_cannot_write_the_journal_holds_no_reader_back(
        dsn: str, roles: Roles, holder: str, viewer: str) -> None:
    """A reader's (or loader's) prepared INSERT left open holds a RowExclusiveLock on the journal: live readers
    as every role still deliver within their bound through a hold many times longer, one-shot reads neither
    wait nor fail."""
    viewer_dsn = dsn if viewer == "superuser" else roles.dsn(dsn, getattr(roles, viewer))
    holder_dsn = roles.dsn(dsn, getattr(roles, holder))
    with Journal.open(roles.dsn(dsn, roles.writer), **FAST) as writer, \
            Journal.open(viewer_dsn, **{**FAST, "backtracking_behind_current_time": 0.5}) as journal, \
            prepared_insert_held(holder_dsn, "event_journal") as held, recording(journal) as recorder:
        started = time.monotonic()
        committed: dict[tuple[str, int], float] = {}
        for round_ in range(5):
            committed.update(append_timed(writer, f"{ENTITY}|{round_}", 5))
            eventually(lambda: set(recorder.arrived) >= set(committed), timeout=15)
            time.sleep(1.0)  # the scenario: appends spread through the hold
        assert list(journal.query.current_events_by_slices(ENTITY, 0, 1023)), "a one-shot read through the hold"
        assert holds_write_lock(dsn, held.info.backend_pid, "event_journal")
        hold = time.monotonic() - started
    latencies = sorted(recorder.arrived[key] - at for key, at in committed.items())
    assert latencies[-1] < LATENCY_BOUND < hold / 2, f"slowest delivery {latencies[-1]:.2f} s in a {hold:.1f} s hold"
    recorder.assert_exactly_once_in_order(stored(dsn))


async def test_asyncio_a_write_lock_of_a_reader_holds_no_reader_back(dsn: str, roles: Roles) -> None:
    arrived: dict[tuple[str, int], float] = {}

    async def read(live: object) -> None:
        async for env in live:  # type: ignore[attr-defined]
            arrived.setdefault((env.persistence_id, env.seq_nr), time.monotonic())

    with prepared_insert_held(roles.dsn(dsn, roles.reader), "event_journal") as held:
        async with AsyncJournal.open(roles.dsn(dsn, roles.writer), **FAST) as journal:
            live = journal.query.events_by_slices(ENTITY, 0, 1023)
            task = asyncio.create_task(read(live))
            committed = {}
            for i in range(5):
                (env,) = await journal.append(f"{ENTITY}|aio", [{"n": i}])
                committed[(env.persistence_id, env.seq_nr)] = time.monotonic()
                deadline = time.monotonic() + 15
                while (env.persistence_id, env.seq_nr) not in arrived and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.5)  # the scenario: appends spread through the hold
            live.close()
            await asyncio.wait_for(task, 5)
        assert holds_write_lock(dsn, held.info.backend_pid, "event_journal")
    assert set(arrived) == set(committed), "events not delivered through the reader's lock"
    slowest = max(arrived[key] - at for key, at in committed.items())
    assert slowest < LATENCY_BOUND, f"slowest delivery {slowest:.2f} s"


def writers_seen(dsn: str) -> set[int | None]:
    """The backends the visibility horizon waits for, as a superuser reads it."""
    with Journal.open(dsn) as journal, psycopg.connect(dsn, autocommit=True) as conn:
        return {w.pid for w in HorizonTracker(journal.capabilities).read(conn).writers}


def test_a_lock_holder_that_can_write_through_another_role_a_definer_function_or_a_view_is_waited_for(
        dsn: str, roles: Roles, server_dsn: str) -> None:
    """Who may write the journal in some way is a writer, whatever its login role holds itself: a member of the
    writer role that does not inherit its rights (it may SET ROLE), a role that may call a SECURITY DEFINER
    function of the writer's, a role that may insert into a view of the writer's over the journal."""
    member = f"{roles.writer}_member"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE \"{member}\" LOGIN NOINHERIT PASSWORD 'x' IN ROLE \"{roles.writer}\"")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'GRANT CONNECT ON DATABASE "{conn.info.dbname}" TO "{member}"')
        with prepared_insert_held(role_dsn(dsn, member, "x"), "event_journal") as held:
            assert held.info.backend_pid in writers_seen(dsn)
        assert not writers_seen(dsn)
        with prepared_insert_held(roles.dsn(dsn, roles.reader), "event_journal") as held:
            assert held.info.backend_pid not in writers_seen(dsn)  # a reader's lock alone is no write
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE FUNCTION append_for_others() RETURNS void LANGUAGE sql SECURITY DEFINER "
                             "AS 'SELECT 1'")
                conn.execute(f'ALTER FUNCTION append_for_others() OWNER TO "{roles.writer}"')
            assert held.info.backend_pid in writers_seen(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP FUNCTION append_for_others()")
            assert held.info.backend_pid not in writers_seen(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE VIEW journal_inbox AS SELECT * FROM event_journal")
                conn.execute(f'ALTER VIEW journal_inbox OWNER TO "{roles.writer}"')
                conn.execute(f'GRANT INSERT ON journal_inbox TO "{roles.reader}"')
            assert held.info.backend_pid in writers_seen(dsn)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{member}"')
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{member}"')


# -- slow journal writers: waited for, never skipped ---------------------------------------------------


def test_a_transaction_that_waits_before_appending_is_delivered_after_a_restart(dsn: str) -> None:
    """Opened, idle 5 s, then appends: its events are stamped at the append, so an offset taken while it
    waited is still before them (a transaction-start stamp would put them behind every reader)."""
    with Journal.open(dsn, **{**FAST, "backtracking_enabled": False}) as journal, psycopg.connect(dsn) as held:
        held.execute("SELECT 1")  # the transaction starts
        with recording(journal) as first:
            committed = append_timed(journal, f"{ENTITY}|fast", 5)
            eventually(lambda: set(first.arrived) >= set(committed))
            time.sleep(max(0.0, 5.0 - 0.3))  # the scenario: a transaction open 5 s before its first append
            offset = first.last_offset
        insert_in(held, f"{ENTITY}|held", 0, 2)
        held.commit()
        journal.append(f"{ENTITY}|fast", [{"after": True}])
        with recording(journal, offset) as resumed:
            eventually(lambda: (f"{ENTITY}|held", 2) in resumed.arrived and (f"{ENTITY}|fast", 6) in resumed.arrived)
        assert set(resumed.order) == {(f"{ENTITY}|held", 1), (f"{ENTITY}|held", 2), (f"{ENTITY}|fast", 6)}


def stall_trigger(dsn: str, pattern: str, seconds: str) -> None:
    """A BEFORE INSERT trigger on the journal's partitions that sleeps for persistence ids LIKE ``pattern``:
    the writer holds its lock with its timestamp already taken (a slow trigger, a lock wait, a GC pause)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.persistence_id LIKE '{pattern}' THEN PERFORM pg_sleep({seconds}); END IF;
            RETURN NEW; END $$""")
        partitions = conn.execute("SELECT inhrelid::regclass::text FROM pg_inherits "
                                  "WHERE inhparent = 'event_journal'::regclass").fetchall()
        for (partition,) in partitions:
            conn.execute(f"CREATE TRIGGER stall BEFORE INSERT ON {partition} FOR EACH ROW EXECUTE FUNCTION stall()")


@pytest.mark.parametrize("stall", [pytest.param(4.0, id="4s"), pytest.param(30.0, id="30s", marks=pytest.mark.slow)])
def test_a_writer_stalled_inside_its_insert_is_waited_for_and_reported(dsn: str, stall: float,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    stall_trigger(dsn, f"{ENTITY}|stalled", str(stall))
    # The stalled INSERT must outlast neither pgjournal's statement_timeout (30 s by default) nor its client limit.
    settings = {**FAST, "backtracking_enabled": False, "backtracking_behind_current_time": 1.0,
                "statement_timeout": stall + 30}
    with Journal.open(dsn, **settings) as journal, recording(journal) as live, \
            caplog.at_level(logging.WARNING, logger="pgjournal.core.horizon"):
        stalled = threading.Thread(target=journal.append, args=(f"{ENTITY}|stalled", [{"slow": 1}]))
        stalled.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            eventually(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                                            ).fetchone()[0] == 1)  # type: ignore[index]
            backend = conn.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'").fetchone()[0]
        others = append_timed(journal, f"{ENTITY}|other", 5)  # committed while the stalled one is open
        eventually(lambda: f"backend {backend}" in caplog.text, timeout=stall)
        assert not set(live.arrived) & set(others), "a reader passed a writer that may still commit below it"
        offset_during_stall = live.last_offset
        stalled.join()
        eventually(lambda: set(live.arrived) >= set(others) | {(f"{ENTITY}|stalled", 1)}, timeout=10)
        live.assert_exactly_once_in_order(stored(dsn))
        with recording(journal, offset_during_stall) as resumed:
            eventually(lambda: set(resumed.arrived) >= stored(dsn))
        resumed.assert_exactly_once_in_order(stored(dsn))
    assert "longer than longest_transaction" in caplog.text


# -- a reading role that may not see the writers' sessions -------------------------------------------------


def test_a_restricted_reader_waits_out_other_roles_writers(dsn: str, roles: Roles) -> None:
    stall_trigger(dsn, f"{ENTITY}|stall%", "0.05 + random() * 0.3")
    writer_dsn, reader_dsn = roles.dsn(dsn, roles.writer), roles.dsn(dsn, roles.reader)
    stop = threading.Event()

    def write(journal: Journal, pid: str) -> None:
        while not stop.is_set():
            journal.append(pid, [{"w": pid}] * 2)

    with Journal.open(writer_dsn, **FAST) as writer, Journal.open(reader_dsn, **FAST) as reader:
        assert reader.capabilities.writer_horizon and not reader.capabilities.sees_all_sessions
        with recording(reader) as live:
            threads = [threading.Thread(target=write, args=(writer, f"{ENTITY}|{name}"))
                       for name in ("stall-a", "stall-b", "stall-c", "plain-a", "plain-b")]
            for thread in threads:
                thread.start()
            time.sleep(3)  # the scenario: 3 s of writers committing out of timestamp order
            current = set((e.persistence_id, e.seq_nr) for e in reader.query.current_events_by_slices(ENTITY, 0, 1023))
            stop.set()
            for thread in threads:
                thread.join()
            expected = stored(dsn)
            eventually(lambda: set(live.arrived) >= expected, timeout=15)
        live.assert_exactly_once_in_order(expected)
        assert current <= expected and len(current) > 10
        with recording(reader, live.last_offset) as resumed:  # nothing redelivered before a new event
            writer.append(f"{ENTITY}|after", [{"w": "after"}])
            eventually(lambda: (f"{ENTITY}|after", 1) in resumed.arrived, "the new event delivered")
        assert resumed.order == [(f"{ENTITY}|after", 1)]


def test_a_restricted_one_shot_read_names_the_writer_it_cannot_wait_out(dsn: str, roles: Roles) -> None:
    writer_dsn, reader_dsn = roles.dsn(dsn, roles.writer), roles.dsn(dsn, roles.reader)
    with psycopg.connect(writer_dsn) as held, \
            Journal.open(reader_dsn, **{**FAST, "backtracking_behind_current_time": 0.5}) as reader:
        insert_in(held, f"{ENTITY}|open", 0)  # inserted, never committed while the reader reads
        backend = held.info.backend_pid
        with pytest.raises(HorizonBlocked, match=f"backend {backend}") as blocked:
            list(reader.query.current_events_by_slices(ENTITY, 0, 1023))
        assert blocked.value.backends == (backend,)
        held.rollback()
        assert list(reader.query.current_events_by_slices(ENTITY, 0, 1023)) == []


def test_info_names_the_journal_writer_that_holds_the_horizon_back(dsn: str) -> None:
    from typer.testing import CliRunner

    from pgjournal.cli.commands import app

    with psycopg.connect(dsn) as held, psycopg.connect(dsn) as idle:
        idle.execute("SELECT count(*) FROM event_journal")  # a reader: not listed
        insert_in(held, f"{ENTITY}|open", 0)
        result = CliRunner().invoke(app, ["info", "--dsn", dsn], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "Journal writers with an open transaction" in result.output
        assert str(held.info.backend_pid) in result.output and str(idle.info.backend_pid) not in result.output
        held.rollback()
