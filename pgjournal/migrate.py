"""Schema changes go through Alembic only: upgrade, print the DDL, and tell whether a database is current."""

from __future__ import annotations

import io
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from .dialects import Dialect, get_dialect
from .errors import SchemaNotMigrated

VERSION_TABLE = "pgjournal_version"
MIGRATE_COMMAND = "pgjournal migrate"


def _script_location() -> str:
    import migrations

    return str(Path(migrations.__file__).parent)


def alembic_config(dsn: str | None = None, dialect: str = "postgres") -> Config:
    config = Config()
    config.set_main_option("script_location", _script_location())
    config.attributes["dsn"] = dsn
    config.attributes["dialect"] = dialect
    return config


def migration_dialect() -> Dialect:
    """The dialect the running migration targets (set by :func:`alembic_config` or ``-x dialect=``)."""
    from alembic import context

    name = context.config.attributes.get("dialect")
    if name is None:
        name = context.get_x_argument(as_dictionary=True).get("dialect", "postgres")
    return get_dialect(name)


def upgrade(dsn: str, dialect: str = "postgres") -> None:
    """Bring the database at ``dsn`` to the newest schema (idempotent)."""
    get_dialect(dialect)
    command.upgrade(alembic_config(dsn, dialect), "head")


def upgrade_sql(dialect: str = "postgres") -> str:
    """The DDL that ``upgrade`` would run on an empty database, for a DBA to review."""
    get_dialect(dialect)
    config = alembic_config(None, dialect)
    buffer = io.StringIO()
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head() or ""


def current_revision(conn: psycopg.Connection) -> str | None:
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
    return row[0] if row else None


def check_schema(conn: psycopg.Connection) -> None:
    """Raise :class:`SchemaNotMigrated`, naming the command to run, unless the schema is at head."""
    current, head = current_revision(conn), head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaNotMigrated(f"the database has no pgjournal schema; run `{MIGRATE_COMMAND}` first")
    raise SchemaNotMigrated(
        f"the database schema is at revision {current} but this pgjournal needs {head}; "
        f"run `{MIGRATE_COMMAND}`"
    )
