"""Durable state on the asyncio face (``AsyncJournal.durable_state``): the blocking store's rules awaited, the
same rows either face reads, changes by slices current and live, and tasks writing one persistence id taking
turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from support import make_serializable
from support.aio import SETTINGS, eventually, take

from pgjournal import DurableStateChange, InvalidArgument, Journal, RevisionConflict
from pgjournal.aio import AsyncJournal


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **SETTINGS) as opened:
        yield opened


async def test_upsert_get_delete_and_conflicts(aj: AsyncJournal, dsn: str) -> None:
    store = aj.durable_state
    assert await store.get("Account|1") is None
    first = await store.upsert("Account|1", 1, {"balance": 10}, tag="vip")
    assert await store.get("Account|1") == first
    assert (first.revision, first.value, first.tags, first.deleted) == (1, {"balance": 10}, ("vip",), False)
    second = await store.upsert("Account|1", 2, {"balance": 15})
    assert second.db_timestamp > first.db_timestamp
    for revision in (1, 2, 4):
        with pytest.raises(RevisionConflict) as caught:
            await store.upsert("Account|1", revision, "stale")
        assert (caught.value.revision, caught.value.actual_revision) == (revision, 2)
    deleted = await store.delete("Account|1", 3)
    assert await store.get("Account|1") == deleted and deleted.deleted and deleted.value is None
    with pytest.raises(InvalidArgument, match="revision"):
        await store.upsert("Account|1", 0, "x")
    with Journal.open(dsn, **SETTINGS) as blocking:  # the same rows either face reads
        assert blocking.durable_state.get("Account|1") == deleted
        blocking.durable_state.upsert("Account|1", 4, "from threads")
    assert (await store.get("Account|1")).value == "from threads"  # type: ignore[union-attr]


async def test_changes_by_slices_current_and_live(aj: AsyncJournal) -> None:
    store = aj.durable_state
    written = [await store.upsert(f"Account|{i}", 1, {"v": 1}) for i in range(5)]
    written.append(await store.upsert("Account|0", 2, {"v": 2}))
    await store.upsert("Order|1", 1, "another entity type")

    async def current() -> list[DurableStateChange]:
        return [c async for c in store.current_changes_by_slices("Account", 0, 1023)]

    changes = await eventually(lambda: _all_of(current, 5), "the five states readable")
    assert {c.persistence_id: c.revision for c in changes} == {f"Account|{i}": 2 if i == 0 else 1 for i in range(5)}
    assert [c.db_timestamp for c in changes] == sorted(c.db_timestamp for c in changes)
    async with store.changes_by_slices("Account", 0, 1023, changes[-1].offset) as live:
        later = [await store.upsert("Account|1", 2, "b"), await store.delete("Account|7", 1)]
        got = await take(live, 2)
    assert [(c.persistence_id, c.revision, c.deleted) for c in got] == [
        (s.persistence_id, s.revision, s.deleted) for s in later]


async def _all_of(query, count: int) -> list[DurableStateChange] | None:  # type: ignore[no-untyped-def]
    changes = await query()
    return changes if len(changes) >= count else None


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
