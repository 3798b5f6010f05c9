"""Writers contending for one persistence id under SERIALIZABLE (as CockroachDB always runs), for real.

Threads of one process take turns per persistence id (they never collide in the database), and collisions
across processes, or SERIALIZABLE's false conflicts between neighbouring keys, are retried with backoff
within ``append_retries``. Every database here defaults to SERIALIZABLE, whatever PGJOURNAL_TEST_PORTABLE says.

Attempts are counted by the server: a BEFORE INSERT trigger takes a number from a sequence for every row an
attempt tries to insert, and sequences ignore rollbacks, so ``attempts == rows`` means no attempt failed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from support import FAST, make_serializable
from support.processes import collect
from support.tags import tags_written

from pgjournal import Journal, RevisionConflict
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.runtime.contention import KeyedLocks, RetryPolicy

COUNT_ATTEMPTS = """
CREATE SEQUENCE insert_attempts;
CREATE FUNCTION count_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('insert_attempts'); RETURN NEW; END $$;
CREATE TRIGGER count_attempt BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION count_attempt();
"""


@pytest.fixture
def serializable(dsn: str) -> str:
    """This test's database with SERIALIZABLE as every session's default, and attempts counted."""
    make_serializable(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(COUNT_ATTEMPTS)
    return dsn


def attempts(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM insert_attempts").fetchone()
    return int(row[0])


def seq_nrs(dsn: str, pid: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT seq_nr FROM event_journal WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()]


def check_order(journal: Journal, pid: str, writers: list[str], per_writer: int) -> None:
    """Every writer's events are all there, in the order it appended them."""
    events = [e.event for e in journal.query.current_events_by_persistence_id(pid)]
    for writer in writers:
        assert [e["i"] for e in events if e["w"] == writer] == list(range(per_writer)), writer


@pytest.mark.parametrize("tags", [(), ("hot",)], ids=["untagged", "tagged"])
def test_threads_appending_to_one_persistence_id_take_turns_and_never_collide(serializable: str,
                                                                               tags: tuple[str, ...]) -> None:
    """8 threads, one persistence id, no expected sequence number, SERIALIZABLE and *no* retries allowed:
    before the threads took turns, 4-8 of them exhausted even 5 retries (40001 on every collision)."""
    threads, per_thread, pid = 8, 25, "Cart|hot"
    barrier = threading.Barrier(threads)
    with Journal.open(serializable, append_retries=0, **FAST) as journal:

        def work(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                journal.append(pid, [{"w": str(t), "i": i}], tags=tags)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
        total = threads * per_thread
        assert seq_nrs(serializable, pid) == list(range(1, total + 1))
        assert attempts(serializable) == total  # not one attempt failed in the database
        check_order(journal, pid, [str(t) for t in range(threads)], per_thread)
        if tags:  # one tag view row per event, tag sequence numbers contiguous
            tags_written(journal)
            with psycopg.connect(serializable, autocommit=True) as conn:
                numbers = [r[0] for r in conn.execute(
                    "SELECT tag_pid_sequence_nr FROM tag_views WHERE persistence_id = %s ORDER BY 1", (pid,))]
            assert numbers == list(range(1, total + 1))


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "own-connection"])
async def test_tasks_appending_to_one_persistence_id_take_turns_and_never_collide(serializable: str,
                                                                                 pipeline: bool) -> None:
    """The asyncio face's rule is the threads': 40 tasks of one event loop, one persistence id, no expected
    sequence number, SERIALIZABLE and no retries allowed; a pool of 4, so most appends wait for a connection
    (and ride in a pipeline unless it is off). All succeed, numbered without gaps, each task's events in its
    order, and not one attempt failed in the database."""
    import asyncio

    from pgjournal.aio import AsyncJournal

    tasks, per_task, pid = 40, 10, "Cart|hot"
    async with AsyncJournal.open(serializable, append_retries=0, pool_max_size=4, async_pipeline=pipeline,
                                 **FAST) as journal:

        async def work(t: int) -> None:
            for i in range(per_task):
                await journal.append(pid, [{"w": str(t), "i": i}])

        await asyncio.gather(*(work(t) for t in range(tasks)))
        total = tasks * per_task
        assert seq_nrs(serializable, pid) == list(range(1, total + 1))
        assert attempts(serializable) == total
    with Journal.open(serializable, **FAST) as blocking:
        check_order(blocking, pid, [str(t) for t in range(tasks)], per_task)


def test_threads_with_expectations_on_one_persistence_id_conflict_cleanly(serializable: str) -> None:
    """With expected sequence numbers the losers get ConcurrencyConflict (a clean primary-key clash after the
    winner committed), never a serialization failure, even with no retries allowed."""
    from pgjournal import ConcurrencyConflict

    threads, target, pid = 6, 40, "Cart|race"
    barrier = threading.Barrier(threads)
    conflicts: list[int] = []
    with Journal.open(serializable, append_retries=0, **FAST) as journal:

        def work(t: int) -> None:
            barrier.wait()
            while (seen := journal.highest_seq_nr(pid)) < target:
                try:
                    journal.append(pid, [{"w": str(t)}], expected_seq_nr=seen)
                except ConcurrencyConflict as exc:
                    assert exc.seq_nr == seen + 1
                    conflicts.append(t)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
    assert seq_nrs(serializable, pid) == list(range(1, target + 1))
    assert attempts(serializable) == target + len(conflicts)  # each conflict: one clean attempt, no retry
    assert conflicts, "the race should have produced conflicts"


def test_threads_on_neighbouring_persistence_ids_retry_serializable_conflicts(serializable: str) -> None:
    """Different persistence ids whose keys share index pages (one partition, similar names) conflict under
    SERIALIZABLE too (PostgreSQL tracks reads per index page): those are retried with backoff and jitter, so
    no writer gives up (the torture tests' writers did, with 5 retries and no pause)."""
    partition = slice_for_persistence_id("Torture|fast-0") // 128
    pids = [p for i in range(2000) if slice_for_persistence_id(p := f"Torture|fast-{i}") // 128 == partition][:8]
    per_writer = 40
    barrier = threading.Barrier(len(pids))
    with Journal.open(serializable, **FAST) as journal:

        def work(pid: str) -> None:
            barrier.wait()
            for i in range(per_writer):
                journal.append(pid, [{"w": pid, "i": i}], expected_seq_nr=i)

        with ThreadPoolExecutor(len(pids)) as pool:
            list(pool.map(work, pids))
        for pid in pids:
            assert seq_nrs(serializable, pid) == list(range(1, per_writer + 1))
    print(f"\nCONTENTION neighbouring pids: {attempts(serializable) - len(pids) * per_writer} failed attempts "
          f"retried for {len(pids) * per_writer} appends")


def test_threads_writing_one_durable_state_take_turns(serializable: str) -> None:
    """Durable state upserts to one persistence id from threads: conflicts are RevisionConflict (someone else
    wrote that revision), never an exhausted serialization failure, even with no retries allowed."""
    threads, target, pid = 6, 30, "Account|hot"
    barrier = threading.Barrier(threads)
    with Journal.open(serializable, append_retries=0, **FAST) as journal:
        store = journal.durable_state

        def work(t: int) -> None:
            barrier.wait()
            while True:
                current = store.get(pid)
                revision = current.revision if current else 0
                if revision >= target:
                    return
                with contextlib.suppress(RevisionConflict):  # another thread wrote it: read again
                    store.upsert(pid, revision + 1, {"by": t, "revision": revision + 1})

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
        final = store.get(pid)
        assert final is not None and final.revision == target and final.value["revision"] == target


# -- several processes on one hot persistence id -------------------------------------------------------------

PROCESSES, THREADS, PER_THREAD = 4, 2, 30


def hot_writer(dsn: str, index: int, start: Any, results: Any) -> None:
    from support import FAST

    from pgjournal import Journal
    from pgjournal.errors import JournalError

    failures: list[str] = []
    with Journal.open(dsn, **FAST) as journal:

        def work(t: int) -> None:
            for i in range(PER_THREAD):
                try:
                    journal.append("Cart|hot", [{"w": f"{index}.{t}", "i": i}])
                except JournalError as exc:
                    failures.append(repr(exc))
                    return

        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        start.wait()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    results.put((index, failures))


def test_processes_appending_to_one_hot_persistence_id_back_off_and_lose_nothing(serializable: str) -> None:
    """4 processes of 2 threads append to one persistence id with no expected sequence number under
    SERIALIZABLE: across processes they collide for real (40001), back off with jitter, and every append
    goes in within the default bound, each writer's events in its order."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    processes = [ctx.Process(target=hot_writer, args=(serializable, i, start, results)) for i in range(PROCESSES)]
    for process in processes:
        process.start()
    collected: list[tuple[int, list[str]]] = collect(processes, results, "writer")
    for process in processes:
        process.join(timeout=30)
    assert [f for _, failures in collected for f in failures] == []
    total = PROCESSES * THREADS * PER_THREAD
    assert seq_nrs(serializable, "Cart|hot") == list(range(1, total + 1))
    with Journal.open(serializable, **FAST) as journal:
        check_order(journal, "Cart|hot", [f"{p}.{t}" for p in range(PROCESSES) for t in range(THREADS)], PER_THREAD)
    print(f"\nCONTENTION {PROCESSES} processes x {THREADS} threads on one pid: "
          f"{attempts(serializable) - total} failed attempts retried for {total} appends")


# -- the pieces ------------------------------------------------------------------------------------------------

def test_retry_pauses_grow_with_jitter_up_to_the_ceiling() -> None:
    policy = RetryPolicy(retries=10, backoff=0.002, backoff_max=0.25)
    for retry in range(1, 12):
        ceiling = min(0.25, 0.002 * 2 ** (retry - 1))
        pauses = [policy.pause(retry) for _ in range(200)]
        assert all(ceiling / 2 <= p <= ceiling for p in pauses)
        assert len(set(pauses)) > 100  # jitter: writers that collided together come back apart
    assert policy.longest() == pytest.approx(0.002 + 0.004 + 0.008 + 0.016 + 0.032 + 0.064 + 0.128 + 3 * 0.25)
    assert RetryPolicy(retries=0, backoff=1, backoff_max=1).should_retry(1, "40001") is False


def test_keyed_locks_serialise_one_key_and_not_two() -> None:
    locks = KeyedLocks()
    inside: dict[str, int] = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    both = threading.Event()
    guard = threading.Lock()

    def hold(key: str) -> None:
        with locks[key]:
            with guard:
                inside[key] += 1
                most[key] = max(most[key], inside[key])
                if inside["a"] and inside["b"]:
                    both.set()
            both.wait(0.05)
            with guard:
                inside[key] -= 1

    workers = [threading.Thread(target=hold, args=(k,)) for k in "abababab"]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert most == {"a": 1, "b": 1}  # one holder per key at a time
    assert both.is_set()  # while a holder of "a" and one of "b" were inside together
    small = KeyedLocks(kept=2)
    assert small["a"] is small["a"] and small["a"] is not small["b"]
    held = small["a"]
    small["c"]  # the table starts over past its size: memory stays bounded
    assert small["a"] is not held
