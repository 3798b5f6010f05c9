"""The embedded default admits only its owner (SECURITY.md): a password for TCP, files no one else can plant
or read, no folder outside pgjournal's own chmodded, the server without root's groups, and homes of earlier
versions (trust, root's data inside the home) secured on their next start. Each test runs a private server."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from support.eventually import eventually
from support.impostor import MODES, Impostor
from typer.testing import CliRunner

from pgjournal import Journal
from pgjournal.cli.commands import app
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, JournalError
from pgjournal.server.connections import connect
from pgjournal.server.embedded import HBA_CONF, EmbeddedServer, _bin_dir, _stop_legacy

pytestmark = [pytest.mark.mode_independent, pytest.mark.servers]

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgjournal-sec-"))
    try:
        yield path
    finally:
        EmbeddedServer(path).destroy()
        shutil.rmtree(path, ignore_errors=True)


def without_password(dsn: str, **extra: str) -> str:
    """``dsn`` as another local user would use it: no password file, any authentication the server asks for."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params.pop("passfile", None)
    params.pop("require_auth", None)
    return psycopg.conninfo.make_conninfo("", **{**params, **extra})  # type: ignore[arg-type]


def refused(dsn: str) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn, connect_timeout=5, passfile="/dev/null").close()
    return str(caught.value)


def test_only_the_owner_gets_in(home: Path) -> None:
    server = EmbeddedServer(home).ensure_running()
    with psycopg.connect(server.dsn) as conn:  # the owner: nothing to configure
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    assert "password" not in server.dsn.split("?")[0]  # the DSN names the password file, not the secret
    # Anyone else on the machine: the port is the same, the secret is not theirs.
    assert "no password supplied" in refused(without_password(server.dsn))
    for guess in ("", "postgres", "pgjournal", "trust"):
        assert "password authentication failed" in refused(without_password(server.dsn, password=guess or " "))
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        rules = conn.execute("SELECT type, auth_method FROM pg_hba_file_rules").fetchall()
        encrypted = conn.execute("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid "
                                 "WHERE rolname = 'postgres'").fetchone()
    assert set(rules) == {("host", "scram-sha-256")}
    assert encrypted == (True,)


@pytest.mark.skipif(not AS_ROOT or not shutil.which("psql") or not shutil.which("runuser"),
                    reason="needs root (to act as another user) and psql")
def test_another_local_user_gets_an_authentication_error(home: Path) -> None:
    server = EmbeddedServer(home).ensure_running()
    for password in (None, "postgres"):
        env = {"PATH": os.environ["PATH"], **({"PGPASSWORD": password} if password else {})}
        other = subprocess.run(["runuser", "-u", "nobody", "--", "psql", without_password(server.dsn), "-Atc",
                                "SELECT 1"],
                               capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=30)
        assert other.returncode != 0 and other.stdout == ""
        assert "no password supplied" in other.stderr or "password authentication failed" in other.stderr


def test_files_are_private_and_no_folder_outside_pgjournal_is_chmodded(home: Path) -> None:
    watched = [*home.parents, *_bin_dir().parents, _bin_dir()]
    before = {p: stat.S_IMODE(p.stat().st_mode) for p in watched}
    server = EmbeddedServer(home).ensure_running()
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in watched} == before
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for path in (server.passfile, server.port_file, server.lock_file, server.log_file):
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600, path
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.server_dir.stat().st_mode) == 0o700


@pytest.mark.skipif(not AS_ROOT, reason="the server runs as a system user only when started by root")
def test_as_root_the_server_has_its_own_folder_and_none_of_roots_groups(home: Path) -> None:
    server = EmbeddedServer(home).ensure_running()
    system_user = pwd.getpwnam("embedded_postgres")
    assert server.server_dir != home and server.server_dir.stat().st_uid == system_user.pw_uid
    status = Path(f"/proc/{server.status().pid}/status").read_text()
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in status.splitlines() if ":" in line}
    assert fields["Uid"][0] == str(system_user.pw_uid)
    assert fields["Gid"][0] == str(system_user.pw_gid) and "0" not in fields["Groups"]


@pytest.mark.parametrize("planted", ["pgpass", "port", "server.lock", "server.log"])
def test_links_planted_in_the_home_are_never_followed(home: Path, tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    (home / planted).symlink_to(victim)
    try:
        EmbeddedServer(home).ensure_running()
    except ConfigurationError as exc:  # refusing is as good as replacing the link
        assert "symbolic link" in str(exc)
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and victim.stat().st_uid == os.geteuid()
    if (home / planted).is_symlink():  # refused: the fixture's clean-up would be refused too
        (home / planted).unlink()


def test_a_home_that_is_a_link_or_not_ours_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "home-link"
    link.symlink_to(target)
    with pytest.raises(ConfigurationError, match="not a folder"):
        EmbeddedServer(link).ensure_running()
    if AS_ROOT:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(ConfigurationError, match="belongs to uid"):
            EmbeddedServer(theirs).ensure_running()
        assert list(theirs.iterdir()) == []


def test_a_home_of_an_earlier_version_is_secured_on_its_next_start(home: Path) -> None:
    """What an earlier pgjournal left: ``trust`` for every TCP connection, no password file, and as root the
    data directory inside the home. The next start secures it and keeps the data."""
    # The earlier version's server is running when the new one arrives: it must not be left open.
    legacy = _trust_era_home(home)
    assert "kept" in "".join(map(str, psycopg.connect(without_password(legacy.dsn)).execute(
        "SELECT relname FROM pg_class WHERE relname = 'kept'").fetchone() or ()))  # open: trust

    again = EmbeddedServer(home).ensure_running()
    assert (again.data_dir / "pg_hba.conf").read_text() == HBA_CONF
    assert "no password supplied" in refused(without_password(again.dsn))
    with psycopg.connect(again.dsn) as conn:
        assert conn.execute("SELECT n FROM kept").fetchone() == (42,)
    if AS_ROOT:
        assert not (home / "pgdata").exists() and again.data_dir.is_dir()


@pytest.mark.skipif(psycopg.pq.version() < 160000, reason="libpq 16 or later reads require_auth")
@pytest.mark.parametrize("mode", MODES)
def test_an_impostor_on_the_port_during_a_restart_gets_nothing_it_can_use(home: Path, mode: str) -> None:
    """Another user binds the port the server freed and asks for the password: in clear (R 3), as MD5 (R 5), or
    by a SCRAM exchange it cannot finish without the verifier (a made-up server signature, or "OK" in place of
    it). A live reader alive across the stop, the journal, the CLI and psycopg on the DSN pgjournal built all
    reconnect to it; none sends the password or its MD5 hash, and none is fooled into sending a statement."""
    server = EmbeddedServer(home).ensure_running()
    dsn, port, password = server.dsn, server.status().port, server._password()
    assert port is not None and password
    journal = Journal.open(dsn, migrate=True, connect_timeout=2)
    delivered: list[object] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def follow() -> None:
        try:
            with journal.query.events_by_slices("Cart", 0, 1023) as live:
                for envelope in live:
                    delivered.append(envelope)
                    if stop.is_set():
                        return
        except Exception as exc:  # the journal closed under it, or the server gone for good: a typed error
            failures.append(exc)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    journal.append("Cart|1", [{"added": "socks"}], expected_seq_nr=0)
    eventually(lambda: delivered, "the live reader delivers before the restart")

    server.stop()  # the live reader and the journal's pool are still open: they reconnect to whatever answers
    try:
        with Impostor(port, mode) as impostor:
            eventually(lambda: impostor.connections >= 1, "the live reader reconnects to the impostor", timeout=60)
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(dsn, connect_timeout=5).close()
            with pytest.raises(DatabaseUnavailable):
                connect(dsn).close()
            with pytest.raises(JournalError):
                journal.append("Cart|1", [{"added": "mug"}], expected_seq_nr=1)
            shown = CliRunner().invoke(app, ["info", "--dsn", dsn], terminal_width=300)
            assert shown.exit_code != 0 and password not in shown.output
            reached = impostor.connections
        sent = impostor.everything_sent()
        assert reached >= 4, "every client above reached the impostor"
        assert password.encode() not in sent
        assert not impostor.kinds_sent() & {b"Q", b"P", b"B", b"E", b"F"}, "a statement reached the impostor"
        if mode in ("cleartext", "md5"):
            assert impostor.kinds_sent() == set(), "an answer to a password request"
        else:
            # The SCRAM answers carry a nonce and a proof bound to the impostor's own salt and nonce: useless
            # against the real server, which picks its own, and no way to the 256-bit secret.
            assert impostor.kinds_sent() <= {b"p", b"X"}
    finally:
        stop.set()
        journal.close()
        reader.join(30)
    assert not reader.is_alive()


def _trust_era_home(home: Path) -> EmbeddedServer:
    """A home as an earlier pgjournal left it (every TCP connection trusted, no password file, as root the data
    directory inside the home), its server running: open to every local user."""
    server = EmbeddedServer(home).ensure_running()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    server.stop()
    (server.data_dir / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n")
    server.passfile.unlink()
    server.checked_file.unlink()
    if AS_ROOT:
        shutil.move(str(server.data_dir), str(home / "pgdata"))
    legacy = EmbeddedServer(home)
    if AS_ROOT:
        legacy.data_dir = home / "pgdata"
        home.chmod(0o755)
    legacy._start()
    return legacy


def test_who_got_into_a_trust_era_home_is_locked_out_by_its_upgrade(home: Path) -> None:
    """While the home was open, a local user made the server read a rule file of hers saying ``trust``, created
    a superuser of her own, gave one of the owner's login roles a password she knows and a way to run
    programs, and set a per-role setting. The next start undoes each of them before the server listens."""
    legacy = _trust_era_home(home)
    hers = Path(tempfile.mkdtemp(prefix="pgjournal-attacker-"))
    try:
        hers.chmod(0o755)
        rules = hers / "hba.conf"
        rules.write_text("host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n")
        rules.chmod(0o644)
        with psycopg.connect(without_password(legacy.dsn), autocommit=True) as conn:  # trust: no password
            conn.execute(f"ALTER SYSTEM SET hba_file = '{rules}'")
            conn.execute("ALTER SYSTEM SET fsync = off")  # harmless: kept
            conn.execute("CREATE ROLE backdoor SUPERUSER LOGIN PASSWORD 'letmein'")
            conn.execute("CREATE ROLE journal_writer LOGIN PASSWORD 'letmein'")  # as if the owner's
            conn.execute("GRANT pg_execute_server_program TO journal_writer")
            conn.execute("ALTER ROLE postgres SET search_path = 'attacker, public'")

        again = EmbeddedServer(home).ensure_running()
        dsn = again.dsn
        assert "no password supplied" in refused(without_password(dsn))
        for role in ("backdoor", "journal_writer"):
            message = refused(without_password(dsn, user=role, password="letmein"))
            assert "password authentication failed" in message or "not permitted to log in" in message
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW hba_file").fetchone() == (str(again.data_dir / "pg_hba.conf"),)
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
            assert conn.execute("SELECT n FROM kept").fetchone() == (42,)
            assert conn.execute("SELECT rolname FROM pg_authid WHERE oid >= 16384 AND (rolcanlogin OR rolsuper "
                                "OR rolpassword IS NOT NULL) AND rolname <> 'postgres'").fetchall() == []
            assert conn.execute("SELECT count(*) FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member "
                                "WHERE m.rolname = 'journal_writer'").fetchone() == (0,)
        assert "hba_file" not in (again.data_dir / "postgresql.auto.conf").read_text()
        # Checked once: the next start finds it private and leaves the owner's roles alone.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER ROLE journal_writer LOGIN PASSWORD 'the owner''s'")
        again.stop()
        EmbeddedServer(home).ensure_running()
        with psycopg.connect(without_password(dsn, user="journal_writer", password="the owner's")) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("journal_writer",)
    finally:
        shutil.rmtree(hers, ignore_errors=True)


def test_a_start_that_cannot_make_the_server_private_stops_it_and_says_what_to_fix(home: Path) -> None:
    """A rule the server reads that is not pgjournal's (here: a setting pgjournal does not reset, planted in
    postgresql.conf) is never reported secured: the server is stopped and the error names the file and line."""
    legacy = _trust_era_home(home)
    _stop_legacy(legacy.data_dir)
    conf = legacy.data_dir / "postgresql.conf"
    conf.write_text(conf.read_text() + "\narchive_mode = on\narchive_command = 'cp %p /tmp/theirs/%f'\n")
    with pytest.raises(ConfigurationError, match=r"archive_command is set in .*postgresql\.conf line \d+") as caught:
        EmbeddedServer(home).ensure_running()
    assert "not private" in str(caught.value)
    assert not EmbeddedServer(home).status().running


@pytest.mark.parametrize("parent", ["world-writable, ours", "sticky, another user's", "another user's"])
def test_a_home_in_a_folder_another_user_could_rename_it_in_is_refused(parent: str) -> None:
    """Another user could rename the home away (and put one of hers in its place) when its folder is writable
    by everyone without the sticky bit, whoever owns it, or belongs to her: the owner of a folder renames what
    it holds, sticky bit or not. Refused before anything is written in it."""
    if parent != "world-writable, ours" and not AS_ROOT:
        pytest.skip("needs root to give a folder to another user")
    folder = Path(tempfile.mkdtemp(prefix="pgjournal-parent-"))
    try:
        mode = {"world-writable, ours": 0o777, "sticky, another user's": 0o1777, "another user's": 0o755}[parent]
        folder.chmod(mode)
        if parent != "world-writable, ours":
            os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)
        home = folder / "home"
        with pytest.raises(ConfigurationError, match=rf"{folder} \(a parent of {home}\)"):
            EmbeddedServer(home).ensure_running()
        assert not (home / "pgpass").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_home_in_a_sticky_folder_of_roots_or_ours_is_accepted(home: Path) -> None:
    """/tmp (root's, sticky, writable by all) holds the fixture's home: only the owner of an entry renames it."""
    assert stat.S_IMODE(home.parent.stat().st_mode) & stat.S_ISVTX and home.parent.stat().st_uid == 0
    EmbeddedServer(home).ensure_running()


def _relay(listener: socket.socket, target: Callable[[], int | None], sessions: list[int]) -> None:
    """Pass every connection to ``listener`` on to 127.0.0.1:``target()``, both ways: all an impostor on the
    old port needs to hand a client's SCRAM exchange to the real server and then read and write its session."""
    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        port = target()
        if port is None:
            client.close()
            continue
        sessions.append(port)
        upstream = socket.create_connection(("127.0.0.1", port))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def test_a_restart_never_moves_the_server_away_from_clients_an_impostor_could_relay(home: Path) -> None:
    """Another user holds the port while the server is down. Were the server to start elsewhere, its clients
    (which reconnect to the old port) would talk through her: SCRAM keeps the password, not the session. So
    within one boot the start refuses, naming the port, and takes it again once it is free."""
    server = EmbeddedServer(home).ensure_running()
    dsn, port = server.dsn, server.status().port
    assert port is not None
    server.stop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    sessions: list[int] = []
    relay = threading.Thread(target=_relay, args=(listener, lambda: EmbeddedServer(home).status().port, sessions),
                             daemon=True)
    relay.start()
    try:
        with pytest.raises(DatabaseUnavailable, match=rf"port {port} .* is taken by another process"):
            EmbeddedServer(home).ensure_running()
        assert not EmbeddedServer(home).status().running
        with pytest.raises(psycopg.OperationalError):  # the owner's client finds nothing to be relayed to
            psycopg.connect(dsn, connect_timeout=5).close()
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        relay.join(5)
    assert sessions == []
    assert EmbeddedServer(home).ensure_running().status().port == port


def test_after_a_reboot_a_taken_port_is_left_for_another(home: Path) -> None:
    """No client of an earlier boot is alive: the server moves to a free port."""
    server = EmbeddedServer(home).ensure_running()
    port = server.status().port
    server.stop()
    server.port_file.write_text(f"{port} an-earlier-boot\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        moved = EmbeddedServer(home).ensure_running().status().port
    assert moved != port
    with psycopg.connect(EmbeddedServer(home).dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
