"""Durable state on the asyncio face (``AsyncJournal.durable_state``), where it differs from the blocking one:
tasks writing one persistence id taking turns, and the same rows either face reads. Its behaviour shared with
the blocking face (revisions, conflicts, bad input, changes by slices current and live) is tested on both faces
in test_durable_state.py (the ``face`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib

from support import make_serializable
from support.aio import SETTINGS

from pgjournal import Journal, RevisionConflict
from pgjournal.aio import AsyncJournal


async def test_either_face_reads_the_states_of_the_other(dsn: str) -> None:
    async with AsyncJournal.open(dsn, **SETTINGS) as journal:
        store = journal.durable_state
        await store.upsert("Account|1", 1, {"balance": 10}, tag="vip")
        deleted = await store.delete("Account|1", 2)
        with Journal.open(dsn, **SETTINGS) as blocking:
            assert blocking.durable_state.get("Account|1") == deleted
            blocking.durable_state.upsert("Account|1", 3, "from threads")
        got = await store.get("Account|1")
        assert got is not None and (got.revision, got.value) == (3, "from threads")


async def test_tasks_writing_one_durable_state_take_turns(dsn: str) -> None:
    """Read-then-upsert from 20 tasks under SERIALIZABLE with no retries allowed: conflicts are RevisionConflict
    (another task wrote that revision), never an exhausted serialization failure."""
    make_serializable(dsn)
    target, pid = 60, "Account|hot"
    async with AsyncJournal.open(dsn, **dict(SETTINGS, append_retries=0, pool_max_size=4)) as journal:
        store = journal.durable_state

        async def work(t: int) -> None:
            while True:
                current = await store.get(pid)
                revision = current.revision if current else 0
                if revision >= target:
                    return
                with contextlib.suppress(RevisionConflict):
                    await store.upsert(pid, revision + 1, {"by": t, "revision": revision + 1})

        await asyncio.gather(*(work(t) for t in range(20)))
        final = await store.get(pid)
        assert final is not None and final.revision == target and final.value["revision"] == target
