"""The embedded default: a second, private server in a temporary PGJOURNAL_HOME, started by two processes at
once, found again, reported, stopped and deleted (the shared server of the other tests is never touched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgjournal.cli.commands import app
from pgjournal.server.embedded import DATABASE, HOME_ENV, EmbeddedServer

pytestmark = [pytest.mark.mode_independent, pytest.mark.servers]

STARTER = """
import json
from pgjournal.server.embedded import EmbeddedServer
server = EmbeddedServer.default().ensure_running()
status = server.status()
import psycopg
with psycopg.connect(server.dsn) as conn:  # usable at once: the database exists
    conn.execute("SELECT 1")
print(json.dumps({"pid": status.pid, "port": status.port, "dsn": server.dsn}))
"""


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("pgjournal-home")
    try:
        yield path
    finally:
        EmbeddedServer(path).destroy()


def start_in_processes(home: Path, count: int) -> list[dict]:
    env = {**os.environ, HOME_ENV: str(home)}
    env.pop("PGJOURNAL_DSN", None)
    procs = []
    for i in range(count):  # the later ones arrive while the first is starting the server
        procs.append(subprocess.Popen([sys.executable, "-c", STARTER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(0.3 * (i % 2))  # the scenario: staggered starts, some while the first is starting the server
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_processes_share_one_server(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmbeddedServer(home)
    assert not server.status().running
    first, *others = start_in_processes(home, 4)
    assert all(o == first for o in others), "every process must find the same server"
    status = server.status()
    assert status.running and (status.pid, status.port) == (first["pid"], first["port"])
    assert status.version == "18"
    assert status.dsn == first["dsn"] == (f"postgresql://postgres@127.0.0.1:{first['port']}/{DATABASE}"
                                          f"?require_auth=scram-sha-256&passfile={home}/pgpass")
    assert status.data_dir == server.server_dir / "pgdata"

    # a later call (here, in this process) reuses it
    monkeypatch.setenv(HOME_ENV, str(home))
    again = EmbeddedServer.default().ensure_running().status()
    assert (again.pid, again.port) == (status.pid, status.port)
    with psycopg.connect(status.dsn) as conn:
        host, port = conn.execute("SELECT inet_server_addr()::text, inet_server_port()").fetchone()
    assert host.startswith("127.0.0.1") and port == status.port

    # the CLI reports and stops the same server
    runner = CliRunner()
    shown = runner.invoke(app, ["server", "status"], env={HOME_ENV: str(home)}, terminal_width=300)
    assert shown.exit_code == 0 and "yes" in shown.output and str(status.port) in shown.output

    assert server.stop() is True
    stopped = server.status()
    assert not stopped.running and stopped.pid is None and stopped.port is None
    assert server.stop() is False
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(status.dsn, connect_timeout=2)

    # and starts again on demand, with the data kept
    restarted = server.ensure_running().status()
    assert restarted.running and restarted.pid != status.pid
    shown = runner.invoke(app, ["server", "stop"], env={HOME_ENV: str(home)})
    assert shown.exit_code == 0 and "stopped" in shown.output
    assert not server.status().running


def test_a_server_being_started_is_not_handed_out_before_its_database_exists(home: Path) -> None:
    """Play the first process by hand: the server is up but the database not yet created. A second
    process must wait for it (it would otherwise get a DSN to a database that does not exist)."""
    server = EmbeddedServer(home)
    env = {**os.environ, HOME_ENV: str(home)}
    env.pop("PGJOURNAL_DSN", None)
    with server._lock():
        server._init_if_needed()
        server._secure()
        server._start()
        assert server.status().running
        second = subprocess.Popen([sys.executable, "-c", STARTER], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=3)  # waits for the lock instead of returning a half-made server
        server._create_database()
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["port"] == server.status().port


def test_destroy_deletes_the_data_directory(home: Path) -> None:
    server = EmbeddedServer(home).ensure_running()
    assert (server.data_dir / "PG_VERSION").exists()
    server.destroy()
    assert not server.status().running
    assert not server.data_dir.exists()
