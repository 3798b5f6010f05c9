"""Projections over a sharded journal keep their offsets beside their slices: a range runs on the journal of
its database (``journal_for_slices``), whose offset table it writes in the handler's own transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from support import FAST
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION

from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.projections.handlers import ExactlyOnce, Projection
from pgjournal.projections.runner import run_range
from pgjournal.shards import ShardedJournal


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
        runners = [run_range(journal.journal_for_slices(lo, hi), projection, lo, hi)
                   for lo, hi in journal.shards.ranges]
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
