"""The online move of a slice range to another database (docs/sharding.md, section 6): the guards by which each
database refuses rows of slices it does not hold, the move's steps under load, a kill -9 of the mover after each
step (old layout or new, never a mix; resumed or rolled back), and a stale journal refused until it reopens."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import psycopg
import pytest
from support import FAST

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.errors import ShardLayoutMismatch
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.aio import AsyncShardedJournal
from pgjournal.store.shard_guard import GUARD

Databases = Callable[..., list[str]]


def pid_in(lo: int, hi: int, prefix: str = "acct|p") -> str:
    return next(pid for n in itertools.count() if lo <= slice_for_persistence_id(pid := f"{prefix}{n}") <= hi)


def guards(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint "
                                 "WHERE conname = %s ORDER BY 1", (GUARD,)).fetchall())


def test_migrate_all_guards_each_database_and_a_misplaced_write_is_a_layout_mismatch(
        shard_databases: Databases) -> None:
    a, b = shard_databases(2)
    migrate_all(ShardSettings.of([a, b]))
    assert guards(a)["snapshot"] == "CHECK (((slice >= 0) AND (slice <= 511))) NOT VALID"
    assert guards(b)["event_journal_s0512_0639"] == "CHECK (((slice >= 512) AND (slice <= 1023))) NOT VALID"
    assert {"durable_state", "projection_timestamp_offset_store"} <= guards(b).keys()
    migrate_all(ShardSettings.of([a, b]))  # again: the guards are kept, not added twice
    stray = pid_in(512, 1023)
    with Journal.open(a, **FAST) as journal:  # a process that believes slice 512+ lives in a
        with pytest.raises(ShardLayoutMismatch, match=rf"slice {slice_for_persistence_id(stray)} is not held"):
            journal.append(stray, ["x"])
        with pytest.raises(ShardLayoutMismatch, match=rf"slice {slice_for_persistence_id(stray)} is not held"):
            journal.durable_state.upsert(stray, 1, "s")
        journal.append(pid_in(0, 511), ["fine"])
    with psycopg.connect(a) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal WHERE slice > 511").fetchone() == (0,)


async def test_the_asyncio_face_maps_a_guard_refusal_the_same_way(shard_databases: Databases) -> None:
    a, b = shard_databases(2)
    migrate_all(ShardSettings.of([a, b]))
    stray = pid_in(0, 511)
    async with AsyncJournal.open(b, **FAST) as journal:
        with pytest.raises(ShardLayoutMismatch, match=rf"slice {slice_for_persistence_id(stray)} is not held"):
            await journal.append(stray, ["x"])
        with pytest.raises(ShardLayoutMismatch, match="is not held"):
            await journal.durable_state.upsert(stray, 1, "s")
    async with AsyncShardedJournal.open([a, b], **FAST) as sharded:
        await sharded.append(stray, ["routed"])
