"""Projections over a sharded journal keep their offsets beside their slices: a range runs on the journal of
its database (``journal_for_slices``, or the sharded journal itself), whose offset table it writes in the
handler's own transaction; worker processes over every database rescale without losing or repeating."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.projection_handlers import AUDIT_DDL, FAST_PROJECTION, audited_counter
from support.projection_workers import ROOT, Writers, check_no_overlap, stop_all, worker_env
from test_follow import database_id
from test_move import pid_in

from pgjournal.errors import InvalidArgument, ShardLayoutMismatch
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.projections.examples import counter_mismatches, ensure_table
from pgjournal.projections.handlers import ExactlyOnce, Projection
from pgjournal.projections.runner import run_range
from pgjournal.projections.workers import ShardedWorker
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.move import Mover

pytestmark = pytest.mark.mode_independent


def test_each_range_keeps_its_offsets_in_the_database_of_its_slices(
        shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(2)
    seen: set[tuple[str, int]] = set()
    lock = threading.Lock()

    def handle(_conn: psycopg.Connection, env: Any) -> None:
        with lock:
            seen.add((env.persistence_id, env.seq_nr))

    projection = Projection("sharded", "shop", ExactlyOnce(handle), FAST_PROJECTION)
    pids = [f"shop|{i}" for i in range(30)]
    with ShardedJournal.open(dsns, migrate=True, **FAST) as journal:
        for pid in pids:
            journal.append(pid, [1, 2])
        with pytest.raises(InvalidArgument, match="spans 2 databases"):
            run_range(journal, projection, 0, 1023)
        # a range's runner takes the database's journal, or the sharded journal itself
        runners = [run_range(journal.journal_for_slices(0, 511), projection, 0, 511),
                   run_range(journal, projection, 512, 1023)]
        try:
            eventually(lambda: len(seen) == 2 * len(pids) or any(r.failed for r in runners), "every event handled")
        finally:
            for runner in runners:
                runner.stop()
            for runner in runners:
                runner.join(timeout=30)
        assert not any(r.failed for r in runners)
    assert seen == {(pid, n) for pid in pids for n in (1, 2)}
    for dsn, (lo, hi) in zip(dsns, ((0, 511), (512, 1023)), strict=True):
        with psycopg.connect(dsn) as conn:
            slices = {s for (s,) in conn.execute("SELECT slice FROM projection_timestamp_offset_store "
                                                 "WHERE projection_name = 'sharded'")}
        expected = {slice_for_persistence_id(p) for p in pids} & set(range(lo, hi + 1))
        # the events' slices, and markers of idle slices, all of this database's range
        assert expected <= slices <= set(range(lo, hi + 1)), (lo, hi)


SETTINGS = {**FAST, "backtracking_window": 3.0}


def _spawn_sharded(shards: list[str], name: str, entity_type: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgjournal.projections.workers", name, entity_type,
         "--handler", "support.projection_handlers:audited_counter", "--lease-duration", "2", "--renew-interval",
         "0.3", *(arg for shard in shards for arg in ("--shard", shard))],
        env=worker_env(SETTINGS), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _owners(dsn: str, since: datetime | None = None) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {owner for (owner,) in conn.execute(
            "SELECT DISTINCT owner FROM projection_audit WHERE at > %s", (since or datetime.min.replace(tzinfo=UTC),))}


def test_workers_rescaled_from_2_to_4_over_2_databases_neither_lose_nor_repeat(
        shard_databases: Callable[..., list[str]]) -> None:
    """Worker processes of a sharded journal (``--shard`` per database) each join every database; in each, the
    live workers share its range. 2 workers, then 4, while writers append to every slice: afterwards each
    database's exactly-once counters equal its journal, no event was handled twice (an audit row per handling,
    in the handler's transaction), no slice was processed by two workers in overlapping leases, and each
    database's offsets and leases are of its own range."""
    dsns = shard_databases(2)
    shards = [f"0-511={dsns[0]}", f"512-1023={dsns[1]}"]
    name, entity_type = "rescaled", "Acct"
    procs: list[subprocess.Popen[bytes]] = []
    with ShardedJournal.open(dsns, migrate=True, **SETTINGS) as journal:
        for db in journal.journals:
            ensure_table(db, AUDIT_DDL)
        try:
            with Writers(journal, entity_type, entities=60):
                procs += [_spawn_sharded(shards, name, entity_type) for _ in range(2)]
                eventually(lambda: all(len(_owners(dsn)) == 2 for dsn in dsns) or any(p.poll() for p in procs),
                           "2 workers handle events in both databases", timeout=60, interval=0.2)
                with psycopg.connect(dsns[0]) as conn:
                    rescaled_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                procs += [_spawn_sharded(shards, name, entity_type) for _ in range(2)]
                eventually(lambda: all(len(_owners(dsn, rescaled_at)) == 4 for dsn in dsns)
                           or any(p.poll() for p in procs),
                           "4 workers handle events in both databases", timeout=60, interval=0.2)
            with contextlib.suppress(AssertionError):  # the assertions below show what differs
                eventually(lambda: not any(counter_mismatches(db, name, entity_type) for db in journal.journals),
                           "the counters caught up", timeout=60, interval=0.3)
            for db in journal.journals:
                assert counter_mismatches(db, name, entity_type)[:10] == []
        finally:
            stop_all(procs)
    assert [p.returncode for p in procs] == [0] * 4
    for dsn, (lo, hi) in zip(dsns, ((0, 511), (512, 1023)), strict=True):
        assert check_no_overlap(dsn) > 0
        with psycopg.connect(dsn) as conn:
            twice = conn.execute("SELECT persistence_id, seq_nr FROM projection_audit GROUP BY 1, 2 "
                                 "HAVING count(*) > 1 LIMIT 5").fetchall()
            audited = {s for (s,) in conn.execute("SELECT DISTINCT slice FROM projection_audit")}
            offsets = {s for (s,) in conn.execute("SELECT DISTINCT slice FROM projection_timestamp_offset_store "
                                                  "WHERE projection_name = %s", (name,))}
            leased = {s for (s,) in conn.execute("SELECT slice FROM projection_lease WHERE projection_name = %s "
                                                 "AND epoch > 0", (name,))}
        assert twice == [], f"handled twice in {lo}-{hi}: {twice}"
        assert audited and audited <= offsets <= set(range(lo, hi + 1)), (lo, hi)
        assert leased <= set(range(lo, hi + 1)), (lo, hi)



def _audited(dsns: list[str], owner: str) -> list[tuple[str, int, str]]:
    """Every (persistence id, seq_nr, database) the audited projection of ``owner``'s worker handled."""
    rows = []
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            if conn.execute("SELECT to_regclass('projection_audit')").fetchone() != (None,):
                rows += [(pid, seq, dsn) for pid, seq in conn.execute(
                    "SELECT persistence_id, seq_nr FROM projection_audit WHERE owner = %s", (owner,))]
    return rows


def test_a_sharded_worker_follows_a_move_and_its_projection_neither_loses_nor_repeats(
        shard_databases: Callable[..., list[str]]) -> None:
    """Before, a worker kept reading the moved range on the database it left, which no event reaches any more:
    silently quiet. Now it rebuilds its workers for the new layout and resumes there from the copied offsets;
    a worker that cannot reach the target fails once the layout stays unfollowable for ``layout_wait``."""
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    moved = [pid_in(512, 767, f"acct|m{i}-") for i in range(6)]
    kept = [pid_in(768, 1023, f"acct|k{i}-") for i in range(3)] + [pid_in(0, 511, "acct|a-")]
    with ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as journal, \
            ShardedJournal.open(old, layout_wait=0.5, **FAST) as blind:
        workers = {"following": ShardedWorker(journal, lambda db: audited_counter(db, "moved", "acct"),
                                              owner="following", lease_duration=2, renew_interval=0.2),
                   "unfollowing": ShardedWorker(blind, lambda db: audited_counter(db, "blind", "acct"),
                                                owner="unfollowing", lease_duration=2, renew_interval=0.2)}
        stop = threading.Event()
        outcome: dict[str, BaseException | None] = {}

        def run(name: str) -> None:
            try:
                workers[name].run(stop)
                outcome[name] = None
            except BaseException as exc:
                outcome[name] = exc

        threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in workers]
        for thread in threads:
            thread.start()
        try:
            for pid in moved + kept:
                journal.append(pid, [1, 2], expected_seq_nr=0)
            for owner in workers:
                eventually(lambda o=owner: len(_audited([a, b], o)) == 2 * len(moved + kept),
                           f"{owner}: the events before the move")
            with Mover(old, (512, 767), c, keep=0) as mover:
                mover.run()
            for pid in moved + kept:  # the moved ones follow the move to c (the spare)
                journal.append(pid, [3], expected_seq_nr=2)
            eventually(lambda: "unfollowing" in outcome, "the worker without the target fails")
            eventually(lambda: len(_audited([a, b, c], "following")) == 3 * len(moved + kept),
                       "the events after the move handled, the moved range's on the target")
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
    assert outcome["following"] is None
    assert isinstance(outcome["unfollowing"], ShardLayoutMismatch)
    assert f"on database {database_id(c)}, which no DSN" in str(outcome["unfollowing"])
    assert workers["following"].layout.version == 2
    handled = _audited([a, b, c], "following")
    assert sorted((pid, seq) for pid, seq, _ in handled) == sorted(
        (pid, n) for pid in moved + kept for n in (1, 2, 3))  # each event once: none lost, none repeated
    assert {(pid, dsn) for pid, seq, dsn in handled if seq == 3} == {(pid, c) for pid in moved} | {
        (pid, b if slice_for_persistence_id(pid) >= 512 else a) for pid in kept}
