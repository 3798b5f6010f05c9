"""Serialization failures (40001) and deadlocks (40P01), raised for real by the server.

A BEFORE INSERT trigger on ``event_journal`` (cloned to every partition) raises the chosen SQLSTATE for the
first N rows it sees. Its counter is a sequence, so it survives the rollback of the failed statement, and
it counts the attempts exactly: an attempt fails at its first row, so each failed attempt takes one number.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import psycopg
import psycopg.conninfo
import pytest
from support.eventually import eventually

from pgjournal import Journal, JournalError
from pgjournal.errors import RetriesExhausted

INJECT = """
CREATE SEQUENCE fault_attempts;
CREATE TABLE fault_plan (sqlstate text NOT NULL, budget int NOT NULL, pid text NOT NULL);
CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE plan fault_plan;
BEGIN
  SELECT * INTO plan FROM fault_plan WHERE pid = NEW.persistence_id;
  IF FOUND AND nextval('fault_attempts') <= plan.budget THEN
    RAISE EXCEPTION 'injected failure %', plan.sqlstate USING ERRCODE = plan.sqlstate;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER inject_fault BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION inject_fault();
"""


@pytest.fixture
def inject(dsn: str) -> Iterator:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(INJECT)

    def plan(pid: str, sqlstate: str, budget: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM fault_plan")
            conn.execute("SELECT setval('fault_attempts', 1, false)")
            conn.execute("INSERT INTO fault_plan VALUES (%s, %s, %s)", (sqlstate, budget, pid))

    yield plan


def attempts(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fault_attempts").fetchone()
    return int(row[0])


def stored(dsn: str, pid: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            "SELECT seq_nr FROM event_journal WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()]


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
@pytest.mark.parametrize("expected_seq_nr", [0, None], ids=["expected", "after-latest"])
def test_an_append_is_retried_within_the_bound_and_written_once(
        dsn: str, inject, sqlstate: str, expected_seq_nr: int | None) -> None:
    pid = "Cart|retry"
    with Journal.open(dsn, append_retries=4) as journal:
        inject(pid, sqlstate, 4)  # fails 4 times: the 5th attempt (the last allowed) succeeds
        written = journal.append(pid, ["a", "b", "c"], expected_seq_nr=expected_seq_nr)
    assert [e.seq_nr for e in written] == [1, 2, 3]
    assert attempts(dsn) == 4 + 3  # 4 failed attempts (one row each) + the 3 rows that went in
    assert stored(dsn, pid) == [1, 2, 3]


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_past_the_bound_the_append_fails_clearly_and_writes_nothing(dsn: str, inject, sqlstate: str) -> None:
    pid = "Cart|exhausted"
    with Journal.open(dsn, append_retries=3) as journal:
        journal.append(pid, ["first"], expected_seq_nr=0)
        inject(pid, sqlstate, 100)
        with pytest.raises(RetriesExhausted) as failed:
            journal.append(pid, ["x", "y"], expected_seq_nr=1)
        assert isinstance(failed.value, JournalError)
        message = str(failed.value)
        assert sqlstate in message and "'Cart|exhausted'" in message and "4 attempts" in message
        assert "nothing was written" in message
        assert attempts(dsn) == 4  # the first try and 3 retries, no more
        inject(pid, sqlstate, 0)
        journal.append(pid, ["x", "y"], expected_seq_nr=1)  # once the cause is gone, the same call works
    assert stored(dsn, pid) == [1, 2, 3]


def test_zero_retries_means_one_attempt(dsn: str, inject) -> None:
    pid = "Cart|once"
    with Journal.open(dsn, append_retries=0) as journal:
        inject(pid, "40001", 1)
        with pytest.raises(RetriesExhausted, match="1 attempt"):
            journal.append(pid, ["x"], expected_seq_nr=0)
    assert attempts(dsn) == 1 and stored(dsn, pid) == []


def test_other_sql_errors_are_not_retried(dsn: str, inject) -> None:
    """A non-transient error (here: a check violation raised by the same trigger) is not retried."""
    pid = "Cart|check"
    with Journal.open(dsn, append_retries=5) as journal:
        inject(pid, "23514", 100)
        with pytest.raises(JournalError, match="23514"):
            journal.append(pid, ["x"], expected_seq_nr=0)
    assert attempts(dsn) == 1 and stored(dsn, pid) == []


def test_a_real_deadlock_between_two_sessions_is_retried(dsn: str) -> None:
    """Not injected: a real lock cycle. Another session holds a row of ``lock_me``. An AFTER INSERT trigger
    makes the append, once its row is in, pause and then wait for that row; meanwhile the other session
    inserts the same (pid, seq_nr) and waits for the append's uncommitted row. The append waits last and
    checks first (deadlock_timeout 50 ms against 10 s), so it is the victim: 40P01, retried, and it goes
    through after the other session rolls back."""
    pid = "Cart|deadlock"
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("""
            CREATE SEQUENCE append_attempts;
            CREATE TABLE lock_me (id int PRIMARY KEY); INSERT INTO lock_me VALUES (1);
            CREATE FUNCTION take_lock() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.writer <> 'holder' THEN PERFORM nextval('append_attempts'); PERFORM pg_sleep(0.5); END IF;
              PERFORM 1 FROM lock_me WHERE id = 1 FOR UPDATE;
              RETURN NEW;
            END $$;
            CREATE TRIGGER take_lock AFTER INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION take_lock();""")
        setup.execute(f'ALTER DATABASE "{name}" SET deadlock_timeout = \'50ms\'')
    with Journal.open(dsn, append_retries=5, pool_min_size=1, pool_max_size=1) as journal:
        journal.append(pid, ["seed"], expected_seq_nr=0)
        with psycopg.connect(dsn) as holder:
            holder.execute("SET deadlock_timeout = '10s'")
            holder.execute("SELECT 1 FROM lock_me WHERE id = 1 FOR UPDATE")
            result: list[object] = []

            def append() -> None:
                try:
                    result.append(journal.append(pid, ["after"], expected_seq_nr=1))
                except Exception as exc:  # asserted below
                    result.append(exc)

            worker = threading.Thread(target=append)
            worker.start()
            with psycopg.connect(dsn, autocommit=True) as monitor:  # the append's row is in: its trigger runs
                eventually(lambda: monitor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND (wait_event = 'PgSleep' OR wait_event_type = 'Lock')").fetchone()[0] > 0,  # type: ignore[index]
                    "the append's trigger pausing, then waiting for lock_me")
            # Waits for the append's uncommitted row: a cycle. The append is cancelled and retried; its retry
            # then waits for this row, which goes away with the rollback.
            holder.execute(
                "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
                "event_ser_manifest, event_payload, writer) SELECT slice, entity_type, persistence_id, 2, now(), "
                "event_ser_id, event_ser_manifest, event_payload, 'holder' FROM event_journal "
                "WHERE persistence_id = %s AND seq_nr = 1", (pid,))
            holder.rollback()
            worker.join(10)
    assert result and not isinstance(result[0], Exception), result
    assert stored(dsn, pid) == [1, 2]
    with psycopg.connect(dsn) as conn:
        tries = conn.execute("SELECT last_value FROM append_attempts").fetchone()[0]
    # The seed, at least one deadlocked attempt, the one that went through. (The retry may race the other
    # session to the row and deadlock once more: still within append_retries.)
    assert 3 <= tries <= 1 + 6


# -- projections: the offset commit ------------------------------------------------------------------

OFFSET_FAULTS = """
CREATE SEQUENCE offset_attempts;
CREATE TABLE offset_fault_plan (sqlstate text NOT NULL, budget int NOT NULL);
CREATE FUNCTION inject_offset_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE plan offset_fault_plan;
BEGIN
  SELECT * INTO plan FROM offset_fault_plan;
  IF FOUND AND nextval('offset_attempts') <= plan.budget THEN
    RAISE EXCEPTION 'injected failure %', plan.sqlstate USING ERRCODE = plan.sqlstate;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER inject_offset_fault BEFORE INSERT ON projection_timestamp_offset_store
  FOR EACH ROW EXECUTE FUNCTION inject_offset_fault();
"""


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_an_offset_commit_that_fails_transiently_is_retried_and_counts_each_event_once(
        dsn: str, sqlstate: str) -> None:
    """The projection's handler writes and its offsets commit in one transaction; the offset INSERT fails
    with 40001/40P01 three times. The transaction rolls back each time (handler writes included), the
    work is retried, and the read model counts every event exactly once."""
    from support import FAST
    from support.projection_handlers import FAST_PROJECTION

    from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
    from pgjournal.projections.handlers import Projection
    from pgjournal.projections.runner import run_range

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(OFFSET_FAULTS)
        conn.execute("INSERT INTO offset_fault_plan VALUES (%s, 3)", (sqlstate,))
    with Journal.open(dsn, **FAST) as journal:
        ensure_counter_table(journal)
        for i in range(5):
            journal.append(f"Cart|{i}", ["a", "b", "c"], expected_seq_nr=0)
        projection = Projection("retried", "Cart", counter_writer("retried", grouped=False), FAST_PROJECTION)
        runner = run_range(journal, projection, 0, 1023)
        with contextlib.suppress(AssertionError):  # the assertions below say what went wrong
            eventually(lambda: not counter_mismatches(journal, "retried", "Cart") or runner.failed,
                       "the read model caught up", timeout=30, interval=0.1)
        runner.stop()
        runner.join(30)
        assert runner.failed is None
        assert counter_mismatches(journal, "retried", "Cart") == []
        # A deadlock is retried in place (up to 10 times); a serialization failure restarts the range, which
        # reloads its offsets and reads again (unbounded, with restart_backoff between).
        assert runner.stats.restarts == (3 if sqlstate == "40001" else 0)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT last_value FROM offset_attempts").fetchone()[0] >= 3 + 15
    print(f"\nFAULTS offset commit {sqlstate}: 3 injected, {runner.stats.restarts} range restarts, "
          f"15 events counted once")
