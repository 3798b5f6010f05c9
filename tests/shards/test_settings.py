"""Shard settings: Akka R2DBC's data-partition mapping, and bad layouts refused with the value named (no
database needed)."""

from __future__ import annotations

import pytest

from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import ShardSettings, akka_data_partition, akka_database_index
from pgjournal.shards.layout import SHARDS_ENV

A, B, C, D = (f"postgresql://u@host{i}/journal" for i in range(4))

#: Output of tests/shards/java/AkkaDataPartitions.java (Akka's R2dbcSettings arithmetic transcribed) for these
#: persistence ids: pid, slice, table with number-of-partitions = 8, connection factory with 8 partitions over
#: 2 databases, and over 4 databases.
AKKA = """
polygenelubricants 0 event_journal_0 connection-factory-0-3 connection-factory-0-1
cart|1 427 event_journal_3 connection-factory-0-3 connection-factory-2-3
cart|10 123 event_journal_0 connection-factory-0-3 connection-factory-0-1
order|a 205 event_journal_1 connection-factory-0-3 connection-factory-0-1
user|bob 508 event_journal_3 connection-factory-0-3 connection-factory-2-3
user|carol 704 event_journal_5 connection-factory-4-7 connection-factory-4-5
user|dave 381 event_journal_2 connection-factory-0-3 connection-factory-2-3
shop|0 854 event_journal_6 connection-factory-4-7 connection-factory-6-7
shop|10 229 event_journal_1 connection-factory-0-3 connection-factory-0-1
shop|20 260 event_journal_2 connection-factory-0-3 connection-factory-2-3
shop|190 766 event_journal_5 connection-factory-4-7 connection-factory-4-5
acct|20080 255 event_journal_1 connection-factory-0-3 connection-factory-0-1
acct|31090 256 event_journal_2 connection-factory-0-3 connection-factory-2-3
acct|7098 511 event_journal_3 connection-factory-0-3 connection-factory-2-3
acct|7097 512 event_journal_4 connection-factory-4-7 connection-factory-4-5
acct|5074 767 event_journal_5 connection-factory-4-7 connection-factory-4-5
acct|5073 768 event_journal_6 connection-factory-4-7 connection-factory-6-7
acct|2082 1023 event_journal_7 connection-factory-4-7 connection-factory-6-7
"""
#: Akka's connection factories in database order (8 partitions).
FACTORIES = {2: ["connection-factory-0-3", "connection-factory-4-7"],
             4: ["connection-factory-0-1", "connection-factory-2-3", "connection-factory-4-5",
                 "connection-factory-6-7"]}


def akka_table() -> list[tuple[str, int, str, int, int]]:
    """(pid, slice, table, database of 2, database of 4) from Akka's output."""
    rows = []
    for line in AKKA.strip().splitlines():
        pid, slice_, table, two, four = line.split()
        rows.append((pid, int(slice_), table, FACTORIES[2].index(two), FACTORIES[4].index(four)))
    return rows


def test_the_database_and_table_of_each_slice_are_akkas() -> None:
    two, four = ShardSettings.of([A, B]), ShardSettings.of([A, B, C, D])
    for pid, slice_, table, db2, db4 in akka_table():
        assert slice_for_persistence_id(pid) == slice_
        assert f"event_journal_{akka_data_partition(slice_, 8)}" == table
        assert (akka_database_index(slice_, 2), two.index_of(slice_)) == (db2, db2), pid
        assert (akka_database_index(slice_, 4), four.index_of(slice_)) == (db4, db4), pid


def test_a_list_of_dsns_takes_akkas_ranges_in_order_and_a_mapping_is_sorted() -> None:
    assert ShardSettings.of([A, B, C, D]).ranges == ((0, 255), (256, 511), (512, 767), (768, 1023))
    mapped = ShardSettings.of({"512-1023": B, "0-511": A})
    assert (mapped.ranges, mapped.dsns) == (((0, 511), (512, 1023)), (A, B))
    assert ShardSettings.of([A]).ranges == ((0, 1023),)


@pytest.mark.parametrize(("databases", "named"), [
    ({"0-511": A, "256-1023": B}, "shard ranges 0-511 and 256-1023 overlap (slices 256-511"),
    ({"0-511": A, "600-1023": B}, "slices 512-599 are in no shard range"),
    ({"0-511": A, "512-1000": B}, "slices 1001-1023 are in no shard range"),
    ({"1-511": A, "512-1023": B}, "slices 0-0 are in no shard range"),
    ({"0-340": A, "341-681": B, "682-1023": C}, "shard range 0-340 is not aligned"),
    ([A, B, C], "3 databases: the number of databases must be a power of two"),
    ({"0-255": A, "256-1023": B}, "shard range 256-1023 is not aligned"),
    ({"0-511": A, "512-1023": A}, "name the same DSN"),
    ({"0-5x": A}, "shard range '0-5x'"),
    ({"0-1023": ""}, "DSN must be a non-empty connection string"),
    ([], "0 databases: the number of databases must be a power of two"),
    ({}, "needs at least one database"),
    ("postgresql://u:secret@h/db", "got the string"),
])
def test_bad_settings_are_refused_naming_the_value(databases: object, named: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        ShardSettings.of(databases)  # type: ignore[arg-type]
    assert named in str(raised.value)
    assert "secret" not in str(raised.value)


def test_the_environment_form_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARDS_ENV, f"0-511={A}\n512-1023={B}")
    assert ShardSettings.from_env().dsns == (A, B)
    assert ShardSettings.parse(f"0-511={A}; 512-1023={B}").ranges == ((0, 511), (512, 1023))
    with pytest.raises(ConfigurationError, match="must look like RANGE=DSN"):
        ShardSettings.parse("postgresql://u:pw@h/db")
    with pytest.raises(ConfigurationError, match="given twice"):
        ShardSettings.parse(f"0-511={A}\n0-511={B}")
    monkeypatch.delenv(SHARDS_ENV)
    with pytest.raises(ConfigurationError, match=SHARDS_ENV):
        ShardSettings.from_env()


def test_a_range_across_databases_is_refused_and_can_be_cut() -> None:
    four = ShardSettings.of([A, B, C, D])
    assert four.index_of_range(256, 383) == 1
    with pytest.raises(InvalidArgument, match=r"slice range 200-600 spans 3 databases \(0-255, 256-511, 512-767\)"):
        four.index_of_range(200, 600)
    assert four.ranges_within(200, 600) == [(200, 255), (256, 511), (512, 600)]
    with pytest.raises(InvalidArgument, match="max_slice"):
        four.index_of_range(0, 1024)


def test_a_layout_after_a_move_routes_each_slice_to_its_range() -> None:
    moved = ShardSettings.parse(f"0-511={A};512-767={C};768-1023={B}")
    assert not moved.akka_compatible and ShardSettings.of([A, B]).akka_compatible
    assert [moved.index_of(s) for s in (0, 511, 512, 767, 768, 1023)] == [0, 0, 1, 1, 2, 2]
    assert moved.index_of_range(600, 700) == 1
    with pytest.raises(InvalidArgument, match="spans 2 databases"):
        moved.index_of_range(700, 800)


def test_a_database_s_hot_standby_is_given_by_its_range_and_bad_ones_are_refused() -> None:
    sa, sb = "postgresql://u@standby0/journal", "postgresql://u@standby1/journal"
    parsed = ShardSettings.parse(f"512-1023={B};0-511={A};replica:0-511={sa};replica:512-1023={sb};spare={C}")
    assert parsed.replicas == ((A, sa), (B, sb)) and parsed.spares == (C,)
    assert (parsed.replica_of(A), parsed.replica_of(B), parsed.replica_of(C)) == (sa, sb, None)
    assert ShardSettings.of([A, B], replicas={"512-1023": sb}).replica_of(B) == sb
    refused = [
        (f"0-511={A};512-1023={B};replica:0-255={sa}", r"replica of shard range '0-255': no database holds that"),
        (f"0-511={A};512-1023={B};replica:0-511={sa};replica:0-511={sb}", r"replica of range '0-511' is given twice"),
        (f"0-511={A};512-1023={B};replica:0-511={sa};replica:512-1023={sa}", "is given twice, or is also a"),
        (f"0-511={A};512-1023={B};replica:0-511={B}", "is given twice, or is also a database's DSN"),
        (f"0-511={A};512-1023={B};replica:east={sa}", r"shard range 'east'.*replica:RANGE=DSN"),
        (f"0-511={A};512-1023={B};replica:0-511=", "DSN"),
    ]
    for text, message in refused:
        with pytest.raises(ConfigurationError, match=message):
            ShardSettings.parse(text)
