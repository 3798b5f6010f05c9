"""Private embedded PostgreSQL servers for one bench run (``scale-out``): each its own postmaster, data directory
(mode 0700, as the project's embedded servers are) and port, started together and stopped and deleted
afterwards, as the sharded torture test's second server is (tests/shards/test_torture.py)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
import psycopg.conninfo
from psycopg import sql

from pgjournal.admin.migrate import upgrade
from pgjournal.server.embedded import EmbeddedServer

TEMPLATE = "pgjournal_bench_template"


@contextmanager
def private_servers(count: int) -> Iterator[list[EmbeddedServer]]:
    """``count`` running servers of this run's own, each with a migrated template database (:func:`database`
    clones it); every one started is destroyed on the way out, also when another failed to start."""
    homes = [Path(tempfile.mkdtemp(prefix="pgjournal-bench-")) for _ in range(count)]
    servers = [EmbeddedServer(home) for home in homes]
    try:
        with ThreadPoolExecutor(count) as pool:  # initdb and start of each overlap: about one server's time
            list(pool.map(EmbeddedServer.ensure_running, servers))
        for server in servers:  # Alembic's context is process-global: one migration at a time
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
            upgrade(_dsn(server, TEMPLATE))
        yield servers
    finally:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(_discard, servers, homes))


def _discard(server: EmbeddedServer, home: Path) -> None:
    """Stop without the shutdown checkpoint (an immediate shutdown, SIGQUIT to the postmaster: its data is
    deleted next, and a checkpoint of freshly created databases takes seconds), then delete everything."""
    status = server.status()
    if status.running and status.pid is not None:
        os.kill(status.pid, signal.SIGQUIT)
        deadline = time.monotonic() + 60
        while _alive(status.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    server.destroy()  # stops it the usual way if it is somehow still up; deletes its data directory
    shutil.rmtree(home, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def database(server: EmbeddedServer, name: str) -> str:
    """A new database ``name`` on ``server``, at the schema's head (a copy of the template); its DSN."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE)))
    return _dsn(server, name)


def postmaster(server: EmbeddedServer) -> int:
    pid = server.status().pid
    assert pid is not None, f"the bench's server in {server.data_dir} is not running"
    return pid


def _dsn(server: EmbeddedServer, name: str) -> str:
    return psycopg.conninfo.make_conninfo(server.dsn, dbname=name)
