"""Schema changes go through Alembic only: upgrade, print the DDL, and tell whether a database is current.

Every journal's open asks whether its database is current, so that question is answered without Alembic (and
SQLAlchemy, and the revision scripts): the revisions are read from the scripts' source (:func:`_revisions`).
Alembic is imported when something migrates."""

from __future__ import annotations

import ast
import functools
import io
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from pgjournal.dialects import Dialect, get_dialect
from pgjournal.errors import DatabaseUnavailable, SchemaNotMigrated
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Statement, run
from pgjournal.runtime.steps import Step as IOStep
from pgjournal.server.dsn import mask_dsn
from pgjournal.store.catalog import LOCK_HOLDERS_SQL, lock_timeout

if TYPE_CHECKING:
    from alembic.config import Config

    from pgjournal.admin import adopt as adoption

VERSION_TABLE = "pgjournal_version"
MIGRATE_COMMAND = "pgjournal migrate"
#: Seconds a migration's statement waits for a lock before the migration steps aside (rolled back whole) and tries
#: again. DDL waiting in a table's lock queue stops every append and read queued behind it for as long as the
#: session in its way keeps its transaction open (a long export, a transaction a client forgot): it queues
#: briefly instead, as the key store's rewrite does.
LOCK_WAIT = 1.0
#: Seconds :func:`upgrade` tries for, by default, before it gives up naming the sessions in the way.
MIGRATE_WAIT = 60.0
MIGRATE_BACKOFF = Backoff(0.2, 2.0, 2.0, jitter=0.5)


def _script_location() -> str:
    """The ``migrations`` folder shipped in this package (``pgjournal.migrations``; in a checkout, the link to the
    repository's ``migrations/``), found by path: Alembic reads its scripts from files."""
    here = Path(__file__).resolve().parent.parent / "migrations"
    if not (here / "env.py").is_file():
        raise SchemaNotMigrated(f"pgjournal's migrations are not installed in {here.parent}")
    return str(here)


def alembic_config(dsn: str | None = None, dialect: str = "postgres", lock_wait: float | None = None) -> Config:
    """Alembic's configuration for ``dsn``; ``lock_wait``: the migration's ``lock_timeout`` (seconds)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", _script_location())
    config.attributes["dsn"] = dsn
    config.attributes["dialect"] = dialect
    config.attributes["lock_wait"] = lock_wait
    return config


def migration_dialect() -> Dialect:
    """The dialect the running migration targets (set by :func:`alembic_config` or ``-x dialect=``)."""
    from alembic import context

    name = context.config.attributes.get("dialect")
    if name is None:
        name = context.get_x_argument(as_dictionary=True).get("dialect", "postgres")
    return get_dialect(name)


def upgrade(dsn: str, dialect: str = "postgres", shard: tuple[int, int] | None = None, *,
            wait: float = MIGRATE_WAIT) -> list[adoption.Step]:
    """Bring the database at ``dsn`` to the newest schema (idempotent). A database with Akka R2DBC's tables
    and no pgjournal schema is adopted first (:mod:`pgjournal.admin.adopt`; ``shard``: ``(i, n)`` for database
    ``i`` of ``n`` of a sharded journal); the adoption's steps are returned.

    A statement that waits :data:`LOCK_WAIT` for a lock (another session's transaction holds one on its table)
    rolls the migration back, so the appends and reads queued behind it go on; it is tried again for up to
    ``wait`` seconds.

    Raises :class:`DatabaseUnavailable` when the server cannot be reached and :class:`SchemaNotMigrated`
    when the migration fails (the database's revision is unknown, a statement is refused, or the locks it needs
    stayed held for ``wait`` seconds: the error names the sessions holding them; nothing was changed).
    """
    import sqlalchemy.exc
    from alembic import command
    from alembic.util import CommandError

    chosen = get_dialect(dialect)
    deadline, tries = time.monotonic() + wait, 0
    while True:
        tries += 1
        try:
            adopted = _adopt_akka(dsn, chosen, shard)
            command.upgrade(alembic_config(dsn, dialect, LOCK_WAIT), "head")
            return adopted
        except (sqlalchemy.exc.DBAPIError, psycopg.errors.LockNotAvailable) as exc:
            orig = exc.orig if isinstance(exc, sqlalchemy.exc.DBAPIError) else exc
            if isinstance(orig, psycopg.errors.LockNotAvailable):
                pause = MIGRATE_BACKOFF.delay(tries)
                if time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    continue
                raise SchemaNotMigrated(
                    f"cannot migrate {mask_dsn(dsn)}: another session holds a lock on a table the migration "
                    f"changes ({_lock_holders(dsn) or 'gone since'}), tried for {wait:.0f} s; nothing was "
                    f"changed; run `{MIGRATE_COMMAND}` again once that transaction ended") from None
            reason = mask_dsn(" ".join(str(orig).split()) or exc.__class__.__name__)
            if isinstance(orig, psycopg.OperationalError):
                raise DatabaseUnavailable(f"cannot migrate {mask_dsn(dsn)}: {reason}") from None
            raise SchemaNotMigrated(f"migrating {mask_dsn(dsn)} failed: {reason}") from None
        except CommandError as exc:
            raise SchemaNotMigrated(f"cannot migrate {mask_dsn(dsn)}: {exc}; {_unknown_hint()}") from None


def _lock_holders(dsn: str) -> str:
    """The sessions holding a lock on the schema's tables, as an error names them (best effort)."""
    try:
        with _connect(dsn) as conn:
            found = conn.execute(LOCK_HOLDERS_SQL).fetchall()
    except (psycopg.Error, DatabaseUnavailable):
        return ""
    return ", ".join(_holder(*row) for row in found)


def _holder(pid: int | None, role: str | None, open_s: float | None) -> str:
    if pid is None:
        return "a prepared transaction"
    how_long = "an unknown time" if open_s is None else f"{open_s:.0f} s"
    return f"backend {pid} (role {role!r}, its transaction open for {how_long})"


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
        conn.execute(*lock_timeout(LOCK_WAIT, local=False))
        try:
            return adoption.adopt(conn, schema, dialect, VERSION_TABLE)
        except psycopg.errors.LockNotAvailable:
            raise  # rolled back: upgrade() tries again
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
