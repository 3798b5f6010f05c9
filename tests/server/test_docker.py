"""The journal on a throwaway PostgreSQL container (testcontainers), where a Docker engine answers.

The engine is asked with a short timeout before testcontainers is touched, so a machine without Docker
skips these tests at once instead of hanging or erroring.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from pgjournal import ConcurrencyConflict, Journal

pytestmark = pytest.mark.mode_independent

PING = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"
IMAGE = os.environ.get("PGJOURNAL_TEST_DOCKER_IMAGE", "postgres:16-alpine")


def docker_answers(timeout: float = 1.0) -> bool:
    """Does a Docker engine answer ``/_ping`` at ``$DOCKER_HOST`` (or the default socket)?"""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    url = urlparse(host)
    try:
        if url.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(url.path)
        elif url.scheme in ("tcp", "http"):
            sock = socket.create_connection((url.hostname, url.port or 2375), timeout=timeout)
        else:
            return False
        with sock:
            sock.sendall(PING)
            return b" 200 " in sock.recv(1024)
    except OSError:
        return False


def test_docker_probe_is_quick_and_false_for_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The probe itself (runs everywhere): an absent socket or closed port is 'no engine', not an error."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
    assert docker_answers() is False
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    assert docker_answers() is False
    monkeypatch.setenv("DOCKER_HOST", "ssh://somewhere")
    assert docker_answers() is False


@pytest.fixture(scope="module")
def container_dsn() -> Iterator[str]:
    if not docker_answers():
        pytest.skip("no Docker engine answers (DOCKER_HOST or /var/run/docker.sock)")
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before the community split
        from testcontainers.postgres import PostgresContainer

    with PostgresContainer(IMAGE, driver=None) as postgres:
        yield postgres.get_connection_url()


def test_journal_on_a_postgres_container(container_dsn: str) -> None:
    with Journal.open(container_dsn, migrate=True) as journal:
        written = journal.append("Cart|1", [{"n": 1}, {"n": 2}], tags=["t"])
        assert [e.seq_nr for e in written] == [1, 2]
        with pytest.raises(ConcurrencyConflict):
            journal.append("Cart|1", ["x"], expected_seq_nr=0)
        assert [e.event for e in journal.query.current_events_by_persistence_id("Cart|1")] == [{"n": 1}, {"n": 2}]
        assert list(journal.query.current_persistence_ids()) == ["Cart|1"]
