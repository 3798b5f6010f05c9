"""The layout record: written by migrate_all in every database, agreed by every process that opens the
journal, and any disagreement (settings, swapped DSNs, a half-done or later change) refused with what differs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from support import FAST

import pgjournal
from pgjournal import Journal
from pgjournal.admin.migrate import current_revision, head_revision
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.shards import SHARDS_ENV, ShardedJournal, ShardSettings, migrate_all
from pgjournal.store.shard_layout import LAYOUT_TABLE

ROOT = Path(__file__).resolve().parents[2]
Databases = Callable[..., list[str]]

OTHER_PROCESS = """
from pgjournal.shards import ShardedJournal
with ShardedJournal.open() as journal:
    print(journal.layout.version, journal.layout.text())
"""


def execute(dsn: str, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.encode())


def has_record(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", (LAYOUT_TABLE,)).fetchone() == (None,):
            return False
        return conn.execute(f"SELECT count(*) FROM {LAYOUT_TABLE}").fetchone() == (1,)


def down_dsn() -> str:
    """A DSN to a port nothing listens on (with a password that must never be shown)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://someone:hunter2secret@127.0.0.1:{port}/journal"


def test_migrate_all_records_one_layout_that_another_process_agrees_on(shard_databases: Databases) -> None:
    dsns = shard_databases(2, migrated=False)
    shards = ShardSettings.of(dsns)
    layout = migrate_all(shards)
    assert layout.version == 1 and layout.ranges == ((0, 511), (512, 1023))
    assert len({member for _, member in layout.members}) == 2
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            assert current_revision(conn) == head_revision()
    assert migrate_all(shards) == layout  # idempotent: the ids are kept
    env = {**os.environ, SHARDS_ENV: f"0-511={dsns[0]}\n512-1023={dsns[1]}", "PYTHONPATH": str(ROOT)}
    other = subprocess.run([sys.executable, "-c", OTHER_PROCESS], env=env, capture_output=True, text=True,
                           timeout=60, check=True)
    with ShardedJournal.open(shards, **FAST) as journal:
        assert journal.layout == layout
        assert other.stdout.strip() == f"1 {layout.text()}"


def test_a_mismatch_with_the_settings_or_between_databases_is_refused(shard_databases: Databases) -> None:
    dsns = shard_databases(4)
    migrate_all(ShardSettings.of(dsns[:2]))
    with pytest.raises(ShardLayoutMismatch, match=r"the DSN given for 0-511 .* reaches the database the layout puts "
                                                  "on 512-1023"):
        ShardedJournal.open({"0-511": dsns[1], "512-1023": dsns[0]}, **FAST)
    with pytest.raises(ShardLayoutMismatch, match="the settings name ranges 0-1023 but the databases record 0-511, "
                                                  r"512-1023 \(version 1\)"):
        ShardedJournal.open([dsns[0]], **FAST)
    with pytest.raises(ShardLayoutMismatch, match="migrate does not change a layout"):
        migrate_all(ShardSettings.of([dsns[0]]))
    # The public name, caught by meaning: a configuration that does not match the databases (still a ValueError
    # for callers that catch bad settings that way).
    with pytest.raises(pgjournal.ShardLayoutMismatch) as refused:
        ShardedJournal.open([dsns[0]], **FAST)
    assert isinstance(refused.value, ConfigurationError) and isinstance(refused.value, ValueError)
    assert "ShardLayoutMismatch" in pgjournal.__all__
    migrate_all(ShardSettings.of(dsns[2:]))  # another journal's pair
    with pytest.raises(ShardLayoutMismatch, match="the databases disagree"):
        ShardedJournal.open([dsns[0], dsns[3]], **FAST)


def test_a_layout_changed_after_open_is_detected(shard_databases: Databases) -> None:
    dsns = shard_databases(2)
    with ShardedJournal.open(dsns, migrate=True, **FAST) as journal:
        assert journal.check_layout() == journal.layout
        execute(dsns[1], f"UPDATE {LAYOUT_TABLE} SET version = 2")  # a change half done
        with pytest.raises(ShardLayoutMismatch, match=r"disagree.*records version 1.*records version 2"):
            journal.check_layout()
        with pytest.raises(ShardLayoutMismatch, match="half done"):
            ShardedJournal.open(dsns, **FAST)
        execute(dsns[0], f"UPDATE {LAYOUT_TABLE} SET version = 2")
        assert journal.check_layout().version == 2 == journal.layout.version  # settled, both reached: followed
    with ShardedJournal.open(dsns, **FAST) as reopened:
        assert reopened.layout.version == 2


def test_a_missing_record_is_refused_and_an_interrupted_recording_finished(shard_databases: Databases) -> None:
    dsns = shard_databases(2)
    with pytest.raises(SchemaNotMigrated, match=r"no shard layout record in the database\(s\) of 0-511 .*, "
                                                "512-1023 .*pgjournal shard migrate"):
        ShardedJournal.open(dsns, **FAST)
    layout = migrate_all(ShardSettings.of(dsns))
    execute(dsns[1], f"DELETE FROM {LAYOUT_TABLE}")  # as if killed between the two databases
    with pytest.raises(SchemaNotMigrated, match="512-1023"):
        ShardedJournal.open(dsns, **FAST)
    assert migrate_all(ShardSettings.of(dsns)) == layout
    with ShardedJournal.open(dsns, **FAST) as journal:
        assert journal.layout == layout


def test_rows_outside_a_database_range_refuse_the_first_recording(shard_databases: Databases) -> None:
    dsns = shard_databases(2)
    with Journal.open(dsns[0], **FAST) as single:  # a one-database journal holding every slice
        single.append("shop|10", ["kept"])  # slice 229: in 0-511
        single.append("shop|0", ["elsewhere"])  # slice 854: belongs in 512-1023
    with pytest.raises(ConfigurationError, match="holds rows of slice 854 in event_journal, outside its range 0-511"):
        migrate_all(ShardSettings.of(dsns))
    assert not has_record(dsns[0]) and not has_record(dsns[1])


def test_a_dsn_that_is_down_is_refused_naming_its_range(shard_databases: Databases) -> None:
    migrated, up = shard_databases(1)[0], shard_databases(1, migrated=False)[0]
    down = down_dsn()
    for attempt in (lambda: ShardedJournal.open({"0-511": migrated, "512-1023": down}, connect_timeout=2, **FAST),
                    lambda: migrate_all(ShardSettings.of([up, down]))):
        with pytest.raises(DatabaseUnavailable) as refused:
            attempt()
        assert "the database of slices 512-1023" in str(refused.value)
        assert "hunter2secret" not in str(refused.value)
    with psycopg.connect(up) as conn:  # nothing was migrated
        assert current_revision(conn) is None
