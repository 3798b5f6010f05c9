"""Worker processes with leases, killed with SIGKILL at random points while writers keep appending.

Proves: the exactly-once read model equals the journal afterwards (nothing lost, nothing counted twice);
two workers never processed one slice in overlapping leases (audit rows written in the handler's
transaction: per slice, in database-clock order, lease epochs never go back and each epoch has one owner);
at-least-once handles every event, and re-handles only what was processed after the last stored batch.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import psycopg.errors
import pytest
from support import FAST, make_serializable, waits_on_a_lock
from support.eventually import eventually
from support.projection_handlers import AUDIT_DDL
from support.projection_workers import Writers, check_no_overlap, stop_all, worker_env

from pgjournal import Journal
from pgjournal.projections.examples import counter_mismatches, counter_projection, ensure_table
from pgjournal.projections.leases import LeaseManager
from pgjournal.projections.workers import Worker, _Balancing
from pgjournal.store.leases import live_leases

pytestmark = [pytest.mark.timing, pytest.mark.mode_independent]

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {**FAST, "backtracking_window": 3.0}
LEASE = ["--lease-duration", "2", "--renew-interval", "0.3"]


def _spawn(dsn: str, name: str, entity_type: str, handler: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgjournal.projections.workers", name, entity_type, "--dsn", dsn, "--handler", handler,
         *LEASE],
        env=worker_env(SETTINGS, **env), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def leases_held(journal: Journal, name: str) -> bool:
    with journal.connection() as conn:
        return bool(live_leases(name).all(conn))


def run_kill_test(dsn: str, kills: int, workers: int = 4) -> None:
    name, entity_type = "killed", "Acct"
    handler = "support.projection_handlers:audited_counter"
    rng = random.Random(4)
    with Journal.open(dsn, **SETTINGS) as journal, Writers(journal, entity_type, entities=60):
        ensure_table(journal, AUDIT_DDL)
        procs = [_spawn(dsn, name, entity_type, handler) for _ in range(workers)]
        try:
            done = 0
            while done < kills:
                time.sleep(rng.uniform(0.2, 0.6))  # the scenario: kills at random moments of the work
                # Victims that processed envelopes in the last half second: they die in the middle of their work.
                with journal.connection() as conn:
                    active = {int(owner.split(":")[1]) for (owner,) in conn.execute(
                        "SELECT DISTINCT owner FROM projection_audit WHERE at > now() - interval '0.5 s'")}
                working = [p for p in procs if p.poll() is None and p.pid in active]
                if not working:
                    continue
                victim = rng.choice(working)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                done += 1
                procs.remove(victim)
                procs.append(_spawn(dsn, name, entity_type, handler))
            time.sleep(0.5)  # the scenario: writers go on a while after the last kill
        except BaseException:
            stop_all(procs)
            raise
    # Writers stopped: the surviving workers must converge on exactly the journal.
    with Journal.open(dsn, **SETTINGS) as journal:
        try:
            with contextlib.suppress(AssertionError):  # the assertion below shows what differs
                eventually(lambda: not counter_mismatches(journal, name, entity_type), "caught up", timeout=60,
                           interval=0.3)
            assert counter_mismatches(journal, name, entity_type)[:10] == []
        finally:
            stop_all(procs)
        assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
        assert counter_mismatches(journal, name, entity_type) == []
    audited = check_no_overlap(dsn)
    assert audited > 0
    with psycopg.connect(dsn) as conn:
        owners, handovers = conn.execute(
            "SELECT count(DISTINCT owner), count(DISTINCT (slice, epoch)) - count(DISTINCT slice) FROM projection_audit"
        ).fetchone()
    # The kills really moved slices between processes while they were processing.
    assert owners >= kills // 2 and handovers >= kills, (owners, handovers)


# `make test` kills 8 workers; CI's first pass 20 (``crash_states``), `make test-all` 80 as well.
@pytest.mark.parametrize("kills", [8, pytest.param(20, marks=pytest.mark.crash_states)])
def test_sigkilled_workers_lose_nothing_and_never_share_a_slice(dsn: str, kills: int) -> None:
    run_kill_test(dsn, kills=kills)


@pytest.mark.slow
def test_sigkilled_workers_many_kills(dsn: str) -> None:
    run_kill_test(dsn, kills=80, workers=6)


def test_at_least_once_replays_only_the_unsaved_batch(dsn: str) -> None:
    name, entity_type = "alo", "Meter"
    handler = "support.projection_handlers:audited_at_least_once"
    save_every = 20
    with Journal.open(dsn, **SETTINGS) as journal:
        for i in range(30):
            journal.append(f"{entity_type}|m{i}", [{"n": k} for k in range(10)])
        with journal.connection() as conn:
            total = conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = %s", (entity_type,)
                                 ).fetchone()[0]
        seen = "SELECT count(*) FROM projection_seen"
        for round_ in range(3):
            proc = _spawn(dsn, name, entity_type, handler, TEST_SAVE_EVERY=str(save_every))
            try:
                def progressed(target: int = (round_ + 1) * 70) -> bool:
                    with journal.connection() as conn:
                        return conn.execute("SELECT to_regclass('projection_seen') IS NOT NULL").fetchone()[0] \
                            and conn.execute(seen).fetchone()[0] >= target
                eventually(progressed, f"round {round_} handled {(round_ + 1) * 70}", timeout=30, interval=0.05)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            with journal.connection() as conn:
                stored = dict(conn.execute(
                    "SELECT persistence_id, max(seq_nr) FROM projection_timestamp_offset_store "
                    "WHERE projection_name = %s GROUP BY 1", (name,)).fetchall())
                handled = conn.execute("SELECT persistence_id, seq_nr FROM projection_seen").fetchall()
            # Everything handled but not stored is what the next run may handle again: less than a batch.
            unsaved = [(p, s) for p, s in handled if s > stored.get(p, 0)]
            assert len(set(unsaved)) < save_every + 1, (round_, len(unsaved))
            before_restart = Counter(handled)
            eventually(lambda: not leases_held(journal, name), "the killed worker's leases expired", timeout=10)
        proc = _spawn(dsn, name, entity_type, handler, TEST_SAVE_EVERY=str(save_every))
        try:
            def complete() -> bool:
                with journal.connection() as conn:
                    return conn.execute("SELECT count(DISTINCT (persistence_id, seq_nr)) FROM projection_seen"
                                        ).fetchone()[0] >= total
            eventually(complete, "every event handled", timeout=30, interval=0.3)
        finally:
            stop_all([proc])
        with journal.connection() as conn:
            handled = Counter(conn.execute("SELECT persistence_id, seq_nr FROM projection_seen").fetchall())
    assert len(handled) == total  # every event at least once
    duplicates = {k: n for k, n in handled.items() if n > 1}
    # Each of the 3 kills can re-handle at most one unsaved batch.
    assert sum(n - 1 for n in duplicates.values()) <= 3 * save_every, duplicates
    assert before_restart  # the last kill happened after some handling
    by_pid: defaultdict[str, list[int]] = defaultdict(list)
    for (pid, seq), _n in handled.items():
        by_pid[pid].append(seq)
    assert all(sorted(seqs) == list(range(1, 11)) for seqs in by_pid.values())


def test_overlap_check_detects_interleaved_owners(dsn: str) -> None:
    """The audit check itself fails on a slice processed under an older lease after a newer one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE projection_audit (slice INT, owner TEXT, epoch BIGINT, at TIMESTAMPTZ, "
                     "persistence_id TEXT, seq_nr BIGINT)")
        conn.execute("INSERT INTO projection_audit VALUES (7, 'a', 1, now(), 'p', 1), "
                     "(7, 'b', 2, now() + interval '1 s', 'p', 2), (7, 'a', 1, now() + interval '2 s', 'p', 3)")
    with pytest.raises(AssertionError, match="slice 7: epoch 1"):
        check_no_overlap(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM projection_audit WHERE seq_nr = 3")
        conn.execute("INSERT INTO projection_audit VALUES (7, 'c', 2, now() + interval '3 s', 'p', 3)")
    with pytest.raises(AssertionError, match="two owners"):
        check_no_overlap(dsn)


def test_a_lease_cycle_meeting_another_workers_insert_on_a_serializable_database_runs_again(dsn: str) -> None:
    """Workers starting together insert the projection's lease rows at once; under SERIALIZABLE all but the
    first fail 40001 (the cycle used to give up until its next interval, logging a warning). Here the first is
    the test's own transaction, committed while the worker's insert waits on it: the cycle runs again and takes
    every slice."""
    make_serializable(dsn)
    with Journal.open(dsn) as journal, psycopg.connect(dsn) as first:
        first.execute("INSERT INTO projection_lease (projection_name, slice, owner, epoch, expires_at) "
                      "SELECT 'p', s, NULL, 0, now() FROM generate_series(0, 1023) AS s")
        leases = LeaseManager(journal, "p", duration=10.0)
        outcome: list[object] = []

        def cycle() -> None:
            try:
                outcome.append(leases.cycle())
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=cycle)
        worker.start()

        eventually(lambda: waits_on_a_lock(dsn), "the worker's insert waits on the test's transaction")
        first.commit()
        worker.join()
    assert not isinstance(outcome[0], BaseException), outcome[0]
    held, target = outcome[0]  # type: ignore[misc]
    assert (len(held), target) == (1024, range(1024))


def test_cycles_start_an_interval_apart_however_long_one_takes(dsn: str) -> None:
    """A cycle that took most of the interval (a loaded database) is followed by a short wait, not by a whole
    interval: the next renewal comes in time for the lease's deadline."""
    with Journal.open(dsn) as journal:
        worker = Worker(journal, counter_projection(journal, "paced", "Acct"), lease_duration=8.0)
        assert worker.interval == 2.0 and not worker.settling()
        assert worker.pause(100.0, 100.5) == 1.5
        assert worker.pause(100.0, 101.9) == pytest.approx(0.1)
        assert worker.pause(100.0, 103.0) == 0.0


def test_a_new_worker_gets_its_share_while_the_shares_settle_not_at_the_next_renewal(dsn: str) -> None:
    """Driven cycle by cycle: a second worker lacks its share after its first cycle, so both cycle at a quarter of
    the interval (it waiting for slices, the first holding slices it must give up) until the shares are settled;
    then at the interval again."""
    with Journal.open(dsn, **SETTINGS) as journal:
        first = Worker(journal, counter_projection(journal, "shared", "Acct"), lease_duration=8.0)
        second = Worker(journal, counter_projection(journal, "shared", "Acct"), lease_duration=8.0)
        try:
            first.step()
            assert len(first.leases.held) == 1024 and not first.settling()
            second.step()
            assert second.leases.held == {} and len(second.leases.target) == 512 and second.settling()
            assert second.pause(0.0, 0.0) == first.interval / 4
            for _ in range(20):  # each worker's cycles while the shares settle
                first.step()
                second.step()
                if not (first.settling() or second.settling()):
                    break
            assert set(first.leases.held) == set(range(512)) and set(second.leases.held) == set(range(512, 1024))
            assert first.pause(0.0, 0.0) == second.pause(0.0, 0.0) == first.interval
        finally:
            first.shutdown()
            second.shutdown()


class _Cycles(_Balancing):
    """A worker whose lease cycle raises what it is given, counting its cycles and its shutdowns."""

    owner, failure, interval = "cycles", None, 0.001

    def __init__(self, error: Exception) -> None:
        self.error, self.cycles, self.shutdowns = error, 0, 0

    def step(self) -> None:
        self.cycles += 1
        if self.cycles > 3:  # a passing failure is met three times, then the worker is asked to stop
            self.stop.set()
        raise self.error

    def settling(self) -> bool:
        return False

    def shutdown(self) -> None:
        self.shutdowns += 1

    def run_once(self) -> None:
        self.stop = threading.Event()
        self.run(self.stop)


@pytest.mark.parametrize("error", [psycopg.OperationalError("server closed the connection"), ConnectionResetError()],
                         ids=["database", "network"])
def test_a_worker_outlives_a_failed_cycle_of_the_database_or_the_network(error: Exception) -> None:
    worker = _Cycles(error)
    worker.run_once()
    assert (worker.cycles, worker.shutdowns) == (4, 1)


def test_a_worker_fails_on_a_bug_in_its_cycle_instead_of_retrying_it_forever() -> None:
    # a name missing when `python -m` runs the module is the same failure on every cycle: the worker used to log
    # it as a failed cycle, forever, while its leases ran out
    worker = _Cycles(NameError("name 'step_each' is not defined"))
    with pytest.raises(NameError, match="step_each"):
        worker.run_once()
    assert (worker.cycles, worker.shutdowns) == (1, 1)
