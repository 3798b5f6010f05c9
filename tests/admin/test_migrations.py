"""Schema through Alembic only: upgrade is idempotent, head equals the model, the DDL per dialect."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool
from support import database_dsn

from pgjournal import ConfigurationError, DatabaseUnavailable, Journal, SchemaNotMigrated
from pgjournal.admin.migrate import VERSION_TABLE, current_revision, head_revision, upgrade, upgrade_sql
from pgjournal.dialects.postgres import PARTITIONS, partition_name
from pgjournal.store.schema import metadata


def schema_diff(dsn: str) -> list:
    """What alembic's autogenerate finds between the database and the model (the partitions of
    event_journal are physical layout, not part of the model)."""
    partitions = {partition_name(i) for i in range(PARTITIONS)}

    def include(obj, name, type_, reflected, compare_to) -> bool:
        return not (type_ == "table" and name in partitions | {VERSION_TABLE})

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include})
            return compare_metadata(context, metadata)
    finally:
        engine.dispose()


def table_names(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_upgrade_from_empty_and_idempotent(empty_dsn: str) -> None:
    upgrade(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        assert current_revision(conn) == head_revision()
    tables = table_names(empty_dsn)
    upgrade(empty_dsn)  # again: nothing to do, nothing fails
    upgrade(empty_dsn)
    assert table_names(empty_dsn) == tables
    with psycopg.connect(empty_dsn) as conn:
        assert current_revision(conn) == head_revision()
        assert conn.execute(f"SELECT count(*) FROM {VERSION_TABLE}").fetchone() == (1,)
    with Journal.open(empty_dsn) as journal:
        assert [e.seq_nr for e in journal.append("Cart|1", ["a"])] == [1]


def test_the_revisions_read_from_the_scripts_are_alembics() -> None:
    # a journal's open checks currency against revisions read from the scripts' source, not through Alembic
    from alembic.script import ScriptDirectory

    from pgjournal.admin.migrate import alembic_config, known_revisions

    script = ScriptDirectory.from_config(alembic_config())
    assert head_revision() == script.get_current_head()
    assert known_revisions() == {revision.revision for revision in script.walk_revisions()}


def test_journal_open_with_migrate(empty_dsn: str) -> None:
    with Journal.open(empty_dsn, migrate=True) as journal:
        journal.append("Cart|1", ["a"])
        journal.migrate()  # idempotent on an open journal too
        assert journal.highest_seq_nr("Cart|1") == 1


def test_head_schema_equals_the_model(dsn: str) -> None:
    assert schema_diff(dsn) == []
    expected = {t.name for t in metadata.sorted_tables}
    partitions = {partition_name(i) for i in range(PARTITIONS)}
    assert table_names(dsn) == expected | partitions | {VERSION_TABLE}


def test_schema_diff_would_notice_a_drift(dsn: str) -> None:
    """The comparison above is not vacuous: a dropped column and an extra index are found."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE snapshot DROP COLUMN tags")
        conn.execute("CREATE INDEX stray_idx ON projection_management (paused)")
    found = repr(schema_diff(dsn))
    assert "add_column" in found and "'tags'" in found
    assert "remove_index" in found and "stray_idx" in found


def test_event_journal_is_partitioned_by_slice(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        bounds = conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'event_journal'::regclass ORDER BY 1"
        ).fetchall()
    assert [name for name, _ in bounds] == [partition_name(i) for i in range(PARTITIONS)]
    assert bounds[0][1] == "FOR VALUES FROM (0) TO (128)"
    assert bounds[-1][1] == "FOR VALUES FROM (896) TO (1024)"


def test_postgres_ddl() -> None:
    sql = upgrade_sql("postgres")
    assert sql == upgrade_sql()
    assert "CREATE TABLE event_journal" in sql and "PARTITION BY RANGE (slice)" in sql
    assert f"CREATE TABLE {partition_name(0)} PARTITION OF event_journal" in sql
    assert "CREATE INDEX event_journal_slice_idx" in sql
    for table in metadata.sorted_tables:
        assert f"CREATE TABLE {table.name} " in sql
    assert f"CREATE TABLE {VERSION_TABLE}" in sql


def test_yugabyte_ddl() -> None:
    sql = upgrade_sql("yugabyte")
    assert "PRIMARY KEY (persistence_id HASH, seq_nr ASC)" in sql
    split = re.search(r"CREATE INDEX event_journal_slice_idx ON event_journal .*SPLIT AT VALUES \(([^;]*)\)", sql)
    assert split, sql
    assert split.group(1) == ", ".join(f"({s})" for s in range(127, 1023, 128))
    assert "PARTITION" not in sql


def test_cockroach_ddl() -> None:
    sql = upgrade_sql("cockroach")
    assert "PRIMARY KEY (persistence_id, seq_nr)" in sql
    journal_table = sql.split("CREATE TABLE event_journal")[1].split(";")[0]
    assert "HASH" not in journal_table and "PARTITION" not in sql  # the slice index is hash-sharded, not the key
    assert "CREATE TABLE event_journal" in sql


@pytest.mark.parametrize("dialect", ["oracle", "", "Postgres", None])
def test_unknown_dialect(dialect: str | None) -> None:
    with pytest.raises(ConfigurationError, match="dialect must be one of postgres, yugabyte, cockroach"):
        upgrade_sql(dialect)  # type: ignore[arg-type]


def test_upgrade_with_unknown_dialect_touches_nothing(empty_dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="got 'oracle'"):
        upgrade(empty_dsn, "oracle")
    assert table_names(empty_dsn) == set()


def test_upgrade_of_an_unreachable_server() -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        upgrade("postgresql://app:s3cr3t@127.0.0.1:1/db")
    assert "cannot migrate postgresql://app:***@127.0.0.1:1/db" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_failed_upgrade_leaves_nothing_half_written(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE snapshot (x int)")  # someone else's table in the way
    with pytest.raises(SchemaNotMigrated, match='failed: relation "snapshot" already exists'):
        upgrade(empty_dsn)
    assert table_names(empty_dsn) == {"snapshot"}, "the migration runs in one transaction"


def test_database_from_a_newer_pgjournal(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(SchemaNotMigrated, match=r"revision 9999, which this pgjournal does not know.*upgrade pgj"):
        Journal.open(dsn)
    with pytest.raises(SchemaNotMigrated, match=r"Can't locate revision identified by '9999'.*upgrade pgjournal"):
        upgrade(dsn)


def test_a_database_not_in_utf8_is_refused_before_any_change(server_dsn: str) -> None:
    """SQL_ASCII stores any bytes unchecked and its text reads back as bytes: refused with the encoding named,
    nothing created (before: a TypeError from deep inside the migration)."""
    name = f"pgjournal_ascii_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    dsn = database_dsn(server_dsn, name)
    try:
        with pytest.raises(SchemaNotMigrated, match="encoding SQL_ASCII, pgjournal needs UTF8; nothing was changed"):
            upgrade(dsn)
        assert table_names(dsn) == set()
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
