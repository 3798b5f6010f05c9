"""The asyncio face of a sharded journal: the same routing and the same layout checks as the blocking one."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from support import FAST
from test_settings import akka_table

from pgjournal.errors import InvalidArgument, ShardLayoutMismatch
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import ShardSettings, migrate_all
from pgjournal.shards.aio import AsyncShardedJournal


async def test_asyncio_routing_matches_akkas_and_reads_one_database(shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(4)
    migrate_all(ShardSettings.of(dsns))
    table = akka_table()
    async with AsyncShardedJournal.open(dsns, **FAST) as journal:
        for pid, *_ in table:
            await journal.append(pid, ["a", "b"], expected_seq_nr=0)
            await journal.save_snapshot(pid, 2, pid)
            await journal.durable_state.upsert(pid, 1, pid)
        for pid, *_ in table:
            assert [e.event async for e in journal.query.current_events_by_persistence_id(pid)] == ["a", "b"]
            assert await journal.highest_seq_nr(pid) == 2
            snapshot = await journal.load_snapshot(pid)
            assert snapshot is not None and snapshot.snapshot == pid
            state = await journal.durable_state.get(pid)
            assert state is not None and state.value == pid
        ids = [pid async for pid in journal.query.current_persistence_ids(limit=None)]
        assert ids == sorted(pid for pid, *_ in table)
        assert [pid async for pid in journal.query.current_persistence_ids(ids[2], limit=4)] == ids[3:7]
        with pytest.raises(InvalidArgument, match=r"spans 2 databases \(0-255, 256-511\)"):
            journal.query.current_events_by_slices("acct", 0, 511)
        assert journal.journal_for_slices(512, 767) is journal.journals[2]
        expected = [p for p, *_ in table if p.startswith("acct|") and 512 <= slice_for_persistence_id(p) <= 767]
        async with journal.query.events_by_slices("acct", 512, 767) as live:  # only the third database's
            got = sorted([(await live.__anext__()).persistence_id for _ in range(2 * len(expected))])
            assert got == sorted(expected * 2)
        await journal.check_layout()
    for i, dsn in enumerate(dsns):
        with psycopg.connect(dsn) as conn:
            found = {pid for (pid,) in conn.execute("SELECT persistence_id FROM event_journal")}
        assert found == {pid for pid, _, _, _, db4 in table if db4 == i}


async def test_asyncio_open_refuses_swapped_dsns(shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(2)
    async with AsyncShardedJournal.open(dsns, migrate=True, **FAST):
        pass
    with pytest.raises(ShardLayoutMismatch, match="DSNs swapped"):
        await AsyncShardedJournal.open(list(reversed(dsns)), **FAST)
