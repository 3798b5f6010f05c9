"""The slice torture's writers (tests/end_to_end/test_torture_slices.py), shared with the firehose's tests, and how
long every torture runs: its length, then on until its writers wrote what proves something."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable

import psycopg

from pgjournal import ConcurrencyConflict, Journal, slice_for_persistence_id
from pgjournal.store.events import insert_sql
from support.eventually import eventually

ENTITY = "Torture"
#: How long a torture run may go on past its length to write what proves something (a busy machine's writers).
ENOUGH_WITHIN = 180.0


def written_rows(dsn: str, sql: str, *params: object) -> int:
    """How many rows ``sql`` (a ``SELECT count(*)``) counts on the database at ``dsn``."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def run_for_at_least(seconds: float, enough: Callable[[], bool], what: str) -> None:
    """The scenario runs ``seconds``, then on until ``enough()`` (the writers wrote what proves something): on a
    busy machine the run takes longer, it does not fail for having written little."""
    time.sleep(seconds)
    eventually(enough, what, timeout=ENOUGH_WITHIN, interval=0.2)


async def arun_for_at_least(seconds: float, enough: Callable[[], bool], what: str) -> None:
    """:func:`run_for_at_least` in a coroutine, ``enough`` run in a thread (it may query the database)."""
    await asyncio.sleep(seconds)
    deadline = time.monotonic() + ENOUGH_WITHIN
    while not await asyncio.to_thread(enough):
        assert time.monotonic() < deadline, f"not within {ENOUGH_WITHIN}s: {what}"
        await asyncio.sleep(0.2)


def fast_writer(journal: Journal, stop: threading.Event, rng: random.Random, pids: list[str]) -> None:
    while not stop.is_set():
        pid = rng.choice(pids)
        with contextlib.suppress(ConcurrencyConflict):
            journal.append(pid, [{"w": "fast"}] * rng.randint(1, 3))
        time.sleep(rng.uniform(0, 0.01))


def slow_writer(dsn: str, stop: threading.Event, rng: random.Random, pids: list[str]) -> None:
    """Own persistence ids; each append runs in a transaction held open 0-2 s around its insert (before it:
    the transaction starts early; after it: its events commit 'in the past')."""
    highest = dict.fromkeys(pids, 0)
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            pid = rng.choice(pids)
            slice_ = slice_for_persistence_id(pid)
            count = rng.randint(1, 3)
            conn.execute("SELECT 1")  # the transaction and its CURRENT_TIMESTAMP start now
            time.sleep(rng.uniform(0, 1.0))
            conn.execute(insert_sql("event_journal", after_latest=False, single=False), {
                "slice": slice_, "entity_type": ENTITY, "pid": pid, "writer": "slow", "tags": None,
                "expected": highest[pid], "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
                "ser_ids": [31] * count, "manifests": [""] * count, "payloads": [b'{"w":"slow"}'] * count})
            time.sleep(rng.uniform(0, 1.0))  # stamped at the insert, committed later
            conn.commit()
            highest[pid] += count
