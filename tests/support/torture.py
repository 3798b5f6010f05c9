"""The slice torture's writers (tests/end_to_end/test_torture_slices.py), shared with the firehose's tests."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import psycopg

from pgjournal import ConcurrencyConflict, Journal, slice_for_persistence_id
from pgjournal.store.events import insert_sql

ENTITY = "Torture"


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
