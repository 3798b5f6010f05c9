"""Test databases and their sessions: a database's DSN, its default isolation, its lock waits."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo

from pgjournal.server.embedded import EmbeddedServer


def database_dsn(server_dsn: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(server_dsn, dbname=name)


def waits_on_a_lock(dsn: str) -> bool:
    """Whether a session on the database at ``dsn`` waits on a lock (a statement the test's own open transaction
    holds back)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()").fetchone()
    return bool(row and row[0])


def make_serializable(dsn: str) -> str:
    """Every new session on the database at ``dsn`` runs SERIALIZABLE transactions (as on CockroachDB)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET default_transaction_isolation = \'serializable\'')
    return dsn


@contextlib.contextmanager
def own_embedded_server(prefix: str) -> Iterator[EmbeddedServer]:
    """A running embedded server of the caller's own (a second server of a sharded journal, one to kill),
    destroyed with its home afterwards."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o755)  # the server's own system user (when running as root) must reach its data directory
    server = EmbeddedServer(home)
    try:
        server.ensure_running()
        yield server
    finally:
        server.destroy()
        shutil.rmtree(home, ignore_errors=True)
