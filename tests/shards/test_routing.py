"""Routing over 2 and 4 databases on the test server: every persistence id's events, snapshots and durable
state land in the database Akka R2DBC's data partitions put its slice in; by-slice reads read one database."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from test_settings import akka_table

from pgjournal.errors import ConcurrencyConflict, InvalidArgument, JournalClosed, RevisionConflict
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import ShardedJournal, migrate_all
from pgjournal.shards.layout import ShardSettings

ENTITY_TYPES = ("polygenelubricants", "cart", "order", "user", "shop", "acct")


def rows_by_database(dsns: list[str], table: str) -> list[set[str]]:
    found = []
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            found.append({pid for (pid,) in conn.execute(f"SELECT persistence_id FROM {table}")})
    return found


@pytest.mark.parametrize("n", [2, 4])
def test_each_persistence_id_lands_in_the_database_of_its_slice(
        n: int, shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(n)
    migrate_all(ShardSettings.of(dsns))
    table = akka_table()
    with ShardedJournal.open(dsns, **FAST) as journal:
        for pid, *_ in table:
            journal.append(pid, [{"n": 1}, {"n": 2}], expected_seq_nr=0)
            journal.save_snapshot(pid, 2, {"state": pid})
            journal.durable_state.upsert(pid, 1, {"value": pid})
        for pid, *_ in table:
            assert [e.event for e in journal.query.current_events_by_persistence_id(pid)] == [{"n": 1}, {"n": 2}]
            assert journal.highest_seq_nr(pid) == 2
            assert journal.query.load_envelope(pid, 2).seq_nr == 2
            snapshot = journal.load_snapshot(pid)
            assert snapshot is not None and snapshot.snapshot == {"state": pid}
            state = journal.durable_state.get(pid)
            assert state is not None and state.value == {"value": pid}
        ids = list(journal.query.current_persistence_ids(limit=None))
        assert ids == sorted(pid for pid, *_ in table)
        assert list(journal.query.current_persistence_ids("cart|10", limit=3)) == ids[ids.index("cart|10") + 1:][:3]
    expected = [{pid for pid, _, _, db2, db4 in table if (db2 if n == 2 else db4) == i} for i in range(n)]
    assert all(expected)  # every database holds some
    for name in ("event_journal", "snapshot", "durable_state"):
        assert rows_by_database(dsns, name) == expected, name


def test_events_by_slices_inside_one_database_read_only_that_one(shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(4)
    migrate_all(ShardSettings.of(dsns))
    pids = [f"shop|{i}" for i in range(40)]
    with ShardedJournal.open(dsns, **FAST) as journal:
        for pid in pids:
            journal.append(pid, [pid])
            journal.durable_state.upsert(pid, 1, pid)
        in_second = sorted(p for p in pids if 256 <= slice_for_persistence_id(p) <= 511)
        assert in_second
        for other in (0, 2, 3):  # a read that touched another database would fail now
            journal.journals[other].close()
        def read(lo: int, hi: int) -> list[str]:
            return sorted(e.persistence_id for e in journal.query.current_events_by_slices("shop", lo, hi))

        # a current query ends at the visibility horizon: the last appends show once it passes them
        eventually(lambda: read(256, 511) == in_second, "the second database's events")
        sub = [p for p in in_second if slice_for_persistence_id(p) <= 383]
        assert read(256, 383) == sub
        with journal.query.events_by_slices("shop", 256, 511) as live:
            assert sorted(next(live).persistence_id for _ in in_second) == in_second
        changes = journal.durable_state.current_changes_by_slices("shop", 256, 511)
        assert sorted(c.persistence_id for c in changes) == in_second
        assert journal.journal_for_slices(300, 400) is journal.journals[1]
        with pytest.raises(JournalClosed):
            list(journal.query.current_events_by_slices("shop", 0, 255))


def test_a_range_across_databases_is_refused_with_the_databases_named(
        shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(2)
    with ShardedJournal.open(dsns, migrate=True, **FAST) as journal:
        for query in (lambda: journal.query.current_events_by_slices("shop", 0, 1023),
                      lambda: journal.query.events_by_slices("shop", 500, 520),
                      lambda: journal.durable_state.current_changes_by_slices("shop", 0, 1023)):
            with pytest.raises(InvalidArgument, match=r"spans 2 databases \(0-511, 512-1023\)"):
                query()
        assert journal.ranges_within(500, 520) == [(500, 511), (512, 520)]
        journal.append("shop|0", ["x"])  # slice 854
        journal.append("shop|10", ["y"])  # slice 229
        eventually(lambda: [e.event for lo, hi in journal.ranges_within(0, 1023)
                            for e in journal.query.current_events_by_slices("shop", lo, hi)] == ["y", "x"],
                   "both databases' events, one query each")


def test_a_conflict_among_writers_of_one_entity_reads_no_other_database(
        shard_databases: Callable[..., list[str]]) -> None:
    """A conflict whose check found the entity's rows where the write went is the writers', not a move's: the
    journal reads no layout record (with the other database closed, any read there would fail)."""
    dsns = shard_databases(2)
    migrate_all(ShardSettings.of(dsns))
    pid = next(p for p in (f"shop|{i}" for i in range(100)) if slice_for_persistence_id(p) <= 511)
    with ShardedJournal.open(dsns, **FAST) as journal:
        journal.append(pid, ["a"], expected_seq_nr=0)
        journal.durable_state.upsert(pid, 1, "a")
        journal.journals[1].close()
        with pytest.raises(ConcurrencyConflict) as conflict:
            journal.append(pid, ["b"], expected_seq_nr=0)
        assert conflict.value.actual_seq_nr == 1
        with pytest.raises(RevisionConflict):
            journal.durable_state.upsert(pid, 1, "b")
