"""An Akka R2DBC journal spread over two databases by its data partitions (``number-of-partitions = 4``,
``number-of-databases = 2``: database 0 holds ``event_journal_0..1``, database 1 ``event_journal_2..3``) adopted as
a sharded journal by ``migrate_all``: pgjournal reads Akka's rows where Akka put them and writes into the same
tables, where Akka's own queries find them; misplaced or missing partition tables are refused before any
database changes."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from support import FAST
from support.akka_schema import akka_events_by_pid, akka_events_by_slices, akka_insert, akka_table, create_akka_database
from support.eventually import eventually

from pgjournal import SchemaNotMigrated, slice_for_persistence_id
from pgjournal.admin.migrate import upgrade
from pgjournal.admin.stored_format import read_stored_format
from pgjournal.codec import akka_formats as akka
from pgjournal.shards import ShardedJournal, migrate_all
from pgjournal.shards.layout import ShardSettings

pytestmark = pytest.mark.mode_independent

PARTITIONS, DATABASES = 4, 2
PER_PARTITION = 1024 // PARTITIONS


def covering_pids() -> list[str]:
    """Two persistence ids in every data partition."""
    found: dict[int, list[str]] = {}
    k = 0
    while any(len(found.get(p, [])) < 2 for p in range(PARTITIONS)):
        pid = f"ShoppingCart|{k}"
        found.setdefault(slice_for_persistence_id(pid) // PER_PARTITION, []).append(pid)
        k += 1
    return [pid for p in range(PARTITIONS) for pid in found[p][:2]]


def database_of(pid: str) -> int:
    return slice_for_persistence_id(pid) // (1024 // DATABASES)


def akka_deployment(dsns: list[str], pids: list[str]) -> None:
    """Akka's tables in each database, and one event per persistence id as Akka's journal inserts it."""
    for index, dsn in enumerate(dsns):
        create_akka_database(dsn, partitions=PARTITIONS, database=(index, DATABASES))
    for pid in pids:
        with psycopg.connect(dsns[database_of(pid)], autocommit=True) as conn, conn.transaction():
            akka_insert(conn, pid, 1, akka.STRING, "", f"akka {pid}".encode(), partitions=PARTITIONS,
                        tags=["cart"])


def test_akka_data_partitions_over_two_databases_are_adopted_as_shards(
        shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(DATABASES, migrated=False)
    pids = covering_pids()
    akka_deployment(dsns, pids)

    migrate_all(ShardSettings.of(dsns))
    for index, dsn in enumerate(dsns):
        with psycopg.connect(dsn) as conn:
            stored = read_stored_format(conn)
            assert stored.akka_layout and stored.data_partitions == PARTITIONS
            tables = {name for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relname ~ '^event_journal_[0-9]+$' AND relkind = 'r'")}
            assert tables == {f"event_journal_{p}" for p in (2 * index, 2 * index + 1)}

    with ShardedJournal.open(dsns, **FAST) as journal:
        for pid in pids:
            assert [e.event for e in journal.query.current_events_by_persistence_id(pid)] == [f"akka {pid}"]
            journal.append(pid, [f"ours {pid}"], expected_seq_nr=1, tags=["cart"])
        for lo, hi in ((0, 511), (512, 1023)):
            want = sorted((pid, seq) for pid in pids if lo <= slice_for_persistence_id(pid) <= hi for seq in (1, 2))
            eventually(lambda lo=lo, hi=hi, want=want: sorted(
                (e.persistence_id, e.seq_nr) for e in journal.query.current_events_by_slices(
                    "ShoppingCart", lo, hi)) == want, f"slices {lo}-{hi}")

    for pid in pids:  # Akka's queries, on the database Akka routes the pid to, find pgjournal's event
        with psycopg.connect(dsns[database_of(pid)], autocommit=True) as conn:
            rows = akka_events_by_pid(conn, akka_table(pid, PARTITIONS), pid)
            assert [(r[3], r[6]) for r in rows] == [(1, akka.STRING), (2, akka.STRING)]
            assert bytes(rows[1][8]) == f"ours {pid}".encode()
            partition = slice_for_persistence_id(pid) // PER_PARTITION
            lo = partition * PER_PARTITION
            epoch = conn.execute("SELECT 'epoch'::timestamptz").fetchone()[0]
            eventually(lambda conn=conn, pid=pid, partition=partition, lo=lo, epoch=epoch: {
                (r[1], r[2]) for r in akka_events_by_slices(conn, f"event_journal_{partition}", "ShoppingCart", lo,
                                                            lo + PER_PARTITION - 1, epoch)} >= {(pid, 1), (pid, 2)},
                       f"Akka's by-slices query over {pid}")  # Akka's query stays a margin behind the clock


def test_a_later_run_of_partitions_alone_or_in_the_wrong_place_is_refused_and_nothing_changes(
        shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(DATABASES, migrated=False)
    pids = covering_pids()
    akka_deployment(dsns, pids)

    with pytest.raises(SchemaNotMigrated, match=r"later run of an Akka journal's data partitions.*shard migrate"):
        upgrade(dsns[1])  # database 1 alone: its partitions 2..3 say the journal is spread over databases

    swapped = ShardSettings.of({"0-511": dsns[1], "512-1023": dsns[0]})
    with pytest.raises(SchemaNotMigrated, match=r"0-511.*must hold Akka's data partitions event_journal_0 \.\. "
                                                r"event_journal_1.*found event_journal_2, event_journal_3"):
        migrate_all(swapped)
    for dsn in dsns:  # refused before any database changed
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT to_regclass('pgjournal_version')").fetchone() == (None,)
