"""A private primary and a hot standby of it, built with ``pg_basebackup`` (tests of readers on a standby).

The primary is an :class:`EmbeddedServer` of its own (the embedded PostgreSQL 18 binaries; ``wal_level`` is
``replica`` by default) with a replication role and a host rule for it. The standby is a copy made by
``pg_basebackup -R`` (``standby.signal`` and ``primary_conninfo`` written for it), started on its own port with
the same binaries, as the same user the embedded server runs as (as root: its system user, see
:mod:`pgjournal.server.embedded`). Its owner's password is the primary's (the data directory is a copy), so the
primary's password file serves both.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.conninfo

from pgjournal.admin.migrate import upgrade
from pgjournal.server.embedded import SERVER_OPTIONS, EmbeddedServer, _free_port

REPLICATION_ROLE = "pgjournal_replication"


@dataclass
class StandbyPair:
    primary: EmbeddedServer
    standby_dir: Path
    standby_port: int

    @property
    def primary_dsn(self) -> str:
        return self.primary.dsn

    @property
    def standby_dsn(self) -> str:
        return psycopg.conninfo.make_conninfo(self.primary.dsn, port=str(self.standby_port))

    def replay_lsn(self) -> int:
        with psycopg.connect(self.standby_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None and row[0] is not None
        return int(row[0])

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed what the primary has written so far."""
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        target, deadline = int(row[0]), time.monotonic() + timeout
        while self.replay_lsn() < target:
            assert time.monotonic() < deadline, "the standby did not replay the primary's WAL in time"
            time.sleep(0.01)

    def stop_standby(self) -> None:
        with contextlib.suppress(Exception):
            self.primary._pg("pg_ctl", "-D", str(self.standby_dir), "-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def standby_pair() -> Iterator[StandbyPair]:
    """A migrated private primary (database ``pgjournal``) and a running hot standby of it."""
    home = Path(tempfile.mkdtemp(prefix="pgjournal-standby-"))
    home.chmod(0o755)  # the server's own system user (when running as root) must reach its data directory
    primary = EmbeddedServer(home)
    pair: StandbyPair | None = None
    try:
        primary.ensure_running()
        password = secrets.token_urlsafe(24)
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {REPLICATION_ROLE} REPLICATION LOGIN PASSWORD '{password}'")
        # A host rule for replication connections (root may write the server user's file; ownership is kept).
        with open(primary.data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write(f"host replication {REPLICATION_ROLE} 127.0.0.1/32 scram-sha-256\n")
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        upgrade(primary.dsn)
        port = primary.status().port
        standby_dir = primary.server_dir / "standby"
        conninfo = f"host=127.0.0.1 port={port} user={REPLICATION_ROLE} password={password}"
        primary._pg("pg_basebackup", "-D", str(standby_dir), "-d", conninfo, "-R", "-X", "stream",
                    "-c", "fast", timeout=300)
        pair = StandbyPair(primary, standby_dir, _free_port())
        options = " ".join(("-h", "127.0.0.1", "-p", str(pair.standby_port), *SERVER_OPTIONS))
        primary._pg("pg_ctl", "-D", str(standby_dir), "-l", str(primary.server_dir / "standby.log"), "-o", options,
                    "-w", "-t", "60", "start")
        pair.wait_replayed()
        yield pair
    finally:
        if pair is not None:
            pair.stop_standby()
        primary.destroy()
        shutil.rmtree(home, ignore_errors=True)

