"""Test databases and their sessions: a database's DSN, its default isolation, its lock waits, and the fresh
databases made ahead of the tests that take them."""

from __future__ import annotations

import contextlib
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
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


class FreshDatabases:
    """Fresh databases cloned from ``template``, made ahead by a thread and dropped behind by another, so that a
    test waits for neither: creating one (a checkpoint with ``FILE_COPY``) and dropping one took 0.2-0.25 s on
    the embedded server, on every test's critical path, while most tests spend much of their time waiting on
    conditions. ``prepare`` runs on each new database's DSN (the portable pass makes it SERIALIZABLE)."""

    AHEAD = 2

    def __init__(self, server_dsn: str, template: str, prepare: Callable[[str], object] = lambda _dsn: None) -> None:
        self._server_dsn, self._template, self._prepare = server_dsn, template, prepare
        self._ready: queue.Queue[str] = queue.Queue(maxsize=self.AHEAD)
        self._doomed: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._threads = [threading.Thread(target=self._make, name="test-databases-ahead", daemon=True),
                         threading.Thread(target=self._drop, name="test-databases-behind", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _create(self, conn: psycopg.Connection) -> str:
        name = f"pgjournal_t_{uuid.uuid4().hex[:12]}"
        # FILE_COPY (PostgreSQL 15+): a copy of the template's files instead of WAL_LOG's block-by-block copy
        # through the WAL; create + drop 87 ms instead of 153 ms (PostgreSQL 18, fsync on), 22 instead of 53 ms
        # with fsync off (PostgreSQL 15).
        strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"{strategy}')
        self._prepare(database_dsn(self._server_dsn, name))
        return name

    def _make(self) -> None:
        try:
            with psycopg.connect(self._server_dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    name = self._create(conn)
                    while True:
                        try:
                            self._ready.put(name, timeout=0.2)
                            break
                        except queue.Full:
                            if self._stop.is_set():
                                self._doomed.put(name)
                                return
        except BaseException as exc:  # handed to the test that takes a database next
            self._failure = exc

    def _drop(self) -> None:
        with psycopg.connect(self._server_dsn, autocommit=True) as conn:
            while (name := self._doomed.get()) is not None:
                with contextlib.suppress(psycopg.Error):  # a throw-away database: one left behind harms no test
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """The DSN of a fresh database for the caller, dropped (behind) when the block ends."""
        while True:
            try:
                name = self._ready.get(timeout=0.5)
                break
            except queue.Empty:
                if self._failure is not None:
                    raise RuntimeError("making the test databases failed") from self._failure
        try:
            yield database_dsn(self._server_dsn, name)
        finally:
            self._doomed.put(name)

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(30)
        while not self._ready.empty():
            self._doomed.put(self._ready.get_nowait())
        self._doomed.put(None)
        self._threads[1].join(60)
