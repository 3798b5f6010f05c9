"""Schema changes go through Alembic only: upgrade, print the DDL, and tell whether a database is current.

Every journal's open asks whether its database is current, so that question is answered without Alembic (and
SQLAlchemy, and the revision scripts): the revisions are read from the scripts' source (:func:`_revisions`).
Alembic is imported when something migrates."""

from __future__ import annotations

import ast
import functools
import io
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from pgjournal.dialects import Dialect, get_dialect
from pgjournal.errors import DatabaseUnavailable, SchemaNotMigrated
from pgjournal.runtime.steps import Statement, run
from pgjournal.runtime.steps import Step as IOStep
from pgjournal.server.dsn import mask_dsn

if TYPE_CHECKING:
    from alembic.config import Config

    from pgjournal.admin import adopt as adoption

VERSION_TABLE = "pgjournal_version"
MIGRATE_COMMAND = "pgjournal migrate"


def _script_location() -> str:
    """The ``migrations`` folder shipped in this package (``pgjournal.migrations``; in a checkout, the link to the
    repository's ``migrations/``), found by path: Alembic reads its scripts from files."""
    here = Path(__file__).resolve().parent.parent / "migrations"
    if not (here / "env.py").is_file():
        raise SchemaNotMigrated(f"pgjournal's migrations are not installed in {here.parent}")
    return str(here)


def alembic_config(dsn: str | None = None, dialect: str = "postgres") -> Config:
    from alembic.config import Config

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


def upgrade(dsn: str, dialect: str = "postgres", shard: tuple[int, int] | None = None) -> list[adoption.Step]:
    """Bring the database at ``dsn`` to the newest schema (idempotent). A database with Akka R2DBC's tables
    and no pgjournal schema is adopted first (:mod:`pgjournal.admin.adopt`; ``shard``: ``(i, n)`` for database
    ``i`` of ``n`` of a sharded journal); the adoption's steps are returned.

    Raises :class:`DatabaseUnavailable` when the server cannot be reached and :class:`SchemaNotMigrated`
    when the migration fails (the database's revision is unknown, or a statement is refused).
    """
    import sqlalchemy.exc
    from alembic import command
    from alembic.util import CommandError

    chosen = get_dialect(dialect)
    try:
        adopted = _adopt_akka(dsn, chosen, shard)
        command.upgrade(alembic_config(dsn, dialect), "head")
    except sqlalchemy.exc.DBAPIError as exc:
        reason = mask_dsn(" ".join(str(exc.orig).split()) or exc.__class__.__name__)
        if isinstance(exc.orig, psycopg.OperationalError):
            raise DatabaseUnavailable(f"cannot migrate {mask_dsn(dsn)}: {reason}") from None
        raise SchemaNotMigrated(f"migrating {mask_dsn(dsn)} failed: {reason}") from None
    except CommandError as exc:
        raise SchemaNotMigrated(f"cannot migrate {mask_dsn(dsn)}: {exc}; {_unknown_hint()}") from None
    return adopted


def _connect(dsn: str) -> psycopg.Connection:
    from pgjournal.server.connections import connect

    conn = connect(dsn, doing="migrate")  # no statement timeout: DDL may wait for locks
    try:
        check_encoding(conn, dsn)
    except BaseException:
        conn.close()
        raise
    return conn


def check_encoding(conn: psycopg.Connection, dsn: str) -> None:
    """Refuse a database whose encoding is not UTF8 before anything is changed. Persistence ids, tags and
    manifests are checked as UTF-8 text (:mod:`pgjournal.validation`); another encoding cannot hold all of
    them, and ``SQL_ASCII`` stores any bytes unchecked (the server converts nothing, drivers read its text
    back as bytes), so names that are not text would be accepted and fail their readers later."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding != "UTF8":
        raise SchemaNotMigrated(
            f"cannot migrate {mask_dsn(dsn)}: its database has encoding {encoding or 'unknown'}, pgjournal needs "
            "UTF8; nothing was changed. Create the database with UTF8, e.g. CREATE DATABASE name ENCODING "
            "'UTF8' TEMPLATE template0")


def _adopt_akka(dsn: str, dialect: Dialect, shard: tuple[int, int] | None) -> list[adoption.Step]:
    """Adopt Akka's tables when the database has them and no pgjournal schema (see :mod:`pgjournal.admin.adopt`)."""
    from pgjournal.admin import adopt as adoption

    with _connect(dsn) as conn:
        schema = adoption.inspect(conn, VERSION_TABLE, shard)
        if schema is None:
            return []
        if schema.problems:
            raise SchemaNotMigrated(f"cannot adopt the Akka R2DBC schema of {mask_dsn(dsn)}: "
                                    + "; ".join(schema.problems))
        try:
            return adoption.adopt(conn, schema, dialect, VERSION_TABLE)
        except psycopg.Error as exc:
            raise SchemaNotMigrated(f"adopting the Akka R2DBC schema of {mask_dsn(dsn)} failed (nothing was "
                                    f"changed): {mask_dsn(' '.join(str(exc).split()))}") from None


def plan(dsn: str, dialect: str = "postgres", shard: tuple[int, int] | None = None) -> list[adoption.Step]:
    """What ``upgrade`` would do to the database at ``dsn``, step by step, without doing it: the adoption of
    an Akka R2DBC schema (with ``problems`` as ``refuse`` steps), then the Alembic revisions to run."""
    from alembic.script import ScriptDirectory

    from pgjournal.admin import adopt as adoption

    chosen = get_dialect(dialect)
    steps: list[adoption.Step] = []
    with _connect(dsn) as conn:
        schema = adoption.inspect(conn, VERSION_TABLE, shard)
        if schema is not None:
            if schema.problems:
                return [adoption.Step("refuse", "event_journal", problem) for problem in schema.problems]
            steps = [step for step, _ in adoption.adoption_steps(schema, chosen, VERSION_TABLE)]
            current: str | None = adoption.ADOPTED_REVISION
        else:
            current = current_revision(conn)
    script = ScriptDirectory.from_config(alembic_config())
    if current is not None and current not in known_revisions():
        return [*steps, adoption.Step("refuse", VERSION_TABLE, f"revision {current} is unknown; {_unknown_hint()}")]
    pending = list(reversed(list(script.iterate_revisions(head_revision(), current))))
    for revision in pending:
        doc = (revision.doc or "").strip().splitlines()[0] if revision.doc else ""
        steps.append(adoption.Step("upgrade", f"revision {revision.revision}", doc))
    if not steps:
        steps.append(adoption.Step("nothing", VERSION_TABLE, f"already at revision {current}"))
    return steps


def upgrade_sql(dialect: str = "postgres") -> str:
    """The DDL that ``upgrade`` would run on an empty database, for a DBA to review."""
    from alembic import command

    get_dialect(dialect)
    config = alembic_config(None, dialect)
    buffer = io.StringIO()
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()


@functools.cache
def _revisions() -> dict[str, tuple[str, ...]]:
    """Each revision this pgjournal ships and the revisions it follows, read from the scripts' ``revision`` and
    ``down_revision`` assignments as Alembic reads them, without importing a script."""
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted((Path(_script_location()) / "versions").glob("*.py")):
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target: ast.expr
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                values[target.id] = ast.literal_eval(value)
        revision, down = values.get("revision"), values.get("down_revision")
        if isinstance(revision, str):
            found[revision] = (down,) if isinstance(down, str) else tuple(down) if isinstance(down, tuple) else ()
    return found


@functools.cache
def head_revision() -> str:
    """The newest revision this pgjournal ships (read once per process: every journal's open checks it)."""
    followed = {down for downs in _revisions().values() for down in downs}
    heads = sorted(set(_revisions()) - followed)
    if len(heads) != 1:
        raise SchemaNotMigrated(f"pgjournal's migrations have {len(heads)} heads ({', '.join(heads)}), expected one")
    return heads[0]


@functools.cache
def known_revisions() -> frozenset[str]:
    return frozenset(_revisions())


def _unknown_hint() -> str:
    return f"it was probably migrated by a newer pgjournal (this one knows up to {head_revision()}): upgrade pgjournal"


def current_revision(conn: psycopg.Connection) -> str | None:
    return run(current_revision_step(), conn)


def current_revision_step() -> IOStep[str | None]:
    """:func:`current_revision` as a step (:mod:`pgjournal.runtime.steps`)."""
    exists = yield Statement("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,))
    if not exists or not exists[0][0]:
        return None
    rows = yield Statement(f"SELECT version_num FROM {VERSION_TABLE}")
    return rows[0][0] if rows else None


def check_schema(conn: psycopg.Connection) -> None:
    """Raise :class:`SchemaNotMigrated`, naming the command to run, unless the schema is at head."""
    run(check_schema_step(), conn)


def check_schema_step() -> IOStep[None]:
    """:func:`check_schema` as a step, for a blocking or an asyncio connection."""
    current, head = (yield from current_revision_step()), head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaNotMigrated(f"the database has no pgjournal schema; run `{MIGRATE_COMMAND}` first")
    if current not in known_revisions():
        raise SchemaNotMigrated(f"the database schema is at revision {current}, which this pgjournal does not "
                                f"know; {_unknown_hint()}")
    raise SchemaNotMigrated(
        f"the database schema is at revision {current} but this pgjournal needs {head}; "
        f"run `{MIGRATE_COMMAND}`"
    )
