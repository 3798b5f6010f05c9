"""The example service (pgjournal.examples.fastapi_cart) started with uvicorn on loopback and driven with httpx:
cart commands, conflicts (refused commands, racing clients), and the live SSE feed receiving what was
appended, resumable from the last event id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import psycopg.conninfo
import pytest
import support
import uvicorn
from support import FAST, role_dsn
from support.eventually import eventually
from support.faultproxy import fault_proxy

from pgjournal import errors
from pgjournal.examples import fastapi_cart
from pgjournal.examples.fastapi_cart import create_app
from pgjournal.server.dsn import mask_dsn

pytestmark = pytest.mark.mode_independent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def service(dsn: str) -> Iterator[str]:
    port = free_port()
    app = create_app(dsn, **FAST)
    server = fastapi_cart.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                lifespan="on", timeout_graceful_shutdown=5), app)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    eventually(lambda: server.started or not thread.is_alive(), "uvicorn started")
    assert thread.is_alive(), "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


class Feed:
    """Reads the SSE feed on a thread: every event's (id, type, data), until it has ``count`` of them (then it
    disconnects)."""

    def __init__(self, base: str, count: int, last_event_id: str | None = None) -> None:
        self.count = count
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.connected = threading.Event()
        self._client = httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=None))
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self._thread = threading.Thread(target=self._read, args=(headers,), daemon=True)
        self._thread.start()
        assert self.connected.wait(15), "the feed did not connect"

    def _read(self, headers: dict[str, str]) -> None:
        import json

        with self._client.stream("GET", "/events", headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            fields: dict[str, str] = {}
            try:
                for line in response.iter_lines():
                    if line.startswith(": connected"):
                        self.connected.set()
                    elif line == "":
                        if "id" in fields:
                            self.events.append((fields["id"], fields["event"], json.loads(fields["data"])))
                            if len(self.events) >= self.count:
                                return
                        fields = {}
                    else:
                        name, _, value = line.partition(": ")
                        fields[name] = value
            except httpx.HTTPError:
                pass  # closed by the test

    def close(self) -> None:
        self._thread.join(timeout=20)
        self._client.close()


def test_cart_commands_and_refusals(service: str, dsn: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as http:
        added = http.post("/carts/c1/items", json={"item_id": "socks", "quantity": 2})
        assert added.status_code == 201, added.text
        assert added.json() == {"cart_id": "c1", "items": {"socks": 2}, "checked_out": False, "seq_nr": 1,
                                "reply": "added"}
        assert http.put("/carts/c1/items/socks", json={"quantity": 5}).json()["items"] == {"socks": 5}
        http.post("/carts/c1/items", json={"item_id": "mug", "quantity": 1})
        assert http.delete("/carts/c1/items/socks").json()["items"] == {"mug": 1}
        again = http.post("/carts/c1/items", json={"item_id": "mug", "quantity": 1})
        assert again.status_code == 409 and "already in the cart" in again.json()["error"]
        assert http.post("/carts/c1/items", json={"item_id": "x", "quantity": 0}).status_code == 422
        assert http.post("/carts/empty/checkout").status_code == 409
        done = http.post("/carts/c1/checkout")
        assert done.json()["checked_out"] and done.json()["seq_nr"] == 5
        assert http.post("/carts/c1/items", json={"item_id": "cap", "quantity": 1}).status_code == 409
        assert http.get("/carts/c1").json()["seq_nr"] == 5
        assert http.get("/events", params={"offset": "not an offset"}).status_code == 400
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id = 'cart|c1'").fetchone() == (5,)


def test_racing_clients_one_wins_the_rest_conflict(service: str, dsn: str) -> None:
    def add(i: int) -> int:
        with httpx.Client(base_url=service, timeout=30) as http:
            return http.post("/carts/race/items", json={"item_id": "poster", "quantity": 1 + i % 3}).status_code

    with ThreadPoolExecutor(max_workers=12) as pool:
        codes = list(pool.map(add, range(24)))
    assert sorted(set(codes)) == [201, 409] and codes.count(201) == 1
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id = 'cart|race'").fetchone() == (1,)


def test_the_sse_feed_receives_what_was_appended_and_resumes(service: str) -> None:
    feed = Feed(service, 5)
    try:
        with httpx.Client(base_url=service, timeout=30) as http:
            for cart in ("a", "b"):
                http.post(f"/carts/{cart}/items", json={"item_id": "socks", "quantity": 1})
                http.put(f"/carts/{cart}/items/socks", json={"quantity": 3})
            http.post("/carts/a/checkout")
        eventually(lambda: len(feed.events) >= 5, "the feed received the five events")
    finally:
        feed.close()
    got = [(data["persistence_id"], data["seq_nr"], kind) for _, kind, data in feed.events]
    assert sorted(got) == sorted([("cart|a", 1, "ItemAdded"), ("cart|a", 2, "QuantityAdjusted"),
                                  ("cart|a", 3, "CheckedOut"), ("cart|b", 1, "ItemAdded"),
                                  ("cart|b", 2, "QuantityAdjusted")])
    for pid in ("cart|a", "cart|b"):
        assert [s for p, s, _ in got if p == pid] == sorted(s for p, s, _ in got if p == pid)
    assert feed.events[0][2]["event"] == {"item_id": "socks", "quantity": 1}
    resumed = Feed(service, 3, last_event_id=feed.events[1][0])
    try:
        eventually(lambda: len(resumed.events) >= 3, "the resumed feed received the rest")
    finally:
        resumed.close()
    def keys(events: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, int]]:
        return [(data["persistence_id"], data["seq_nr"]) for _, _, data in events]

    assert keys(resumed.events) == keys(feed.events[2:])


SECRET = "Sup3r$ecret@horse"


def test_a_cart_id_too_long_is_a_400_naming_the_problem(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as http:
        for answer in (http.get(f"/carts/{'x' * 300}"),
                       http.post(f"/carts/{'x' * 300}/items", json={"item_id": "socks", "quantity": 1})):
            assert answer.status_code == 400, answer.text
            assert "at most 255 characters" in answer.json()["error"]
            assert answer.json()["kind"] == "InvalidPersistenceId"


def every_journal_error() -> list[type[errors.JournalError]]:
    """pgjournal's typed errors, the ones the service can meet. The add-ons' subclasses (Spark's) are left out: they
    exist only once another test module imported them, which made this list depend on collection order."""
    found, todo = [], [errors.JournalError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo += kind.__subclasses__()
    return [kind for kind in found if kind.__module__.partition(".")[0] == "pgjournal"]


@pytest.mark.parametrize("kind", every_journal_error(), ids=lambda kind: kind.__name__)
def test_every_typed_error_is_a_4xx_or_503_without_the_dsn(kind: type[errors.JournalError]) -> None:
    """Whatever message a typed error carries (the core's quote the DSN, masked or, from a driver, not), the
    answer is a client error naming the client's value, or a 503 that names no server and no password."""
    dsn = f"postgresql://app:{SECRET}@db.internal:6543/carts"
    exc = kind.__new__(kind)
    Exception.__init__(exc, f"cannot connect to {mask_dsn(dsn)}: {dsn} refused; cart id 'cart|c1'")
    exc.retry_after = 2.0  # type: ignore[attr-defined]  # what CircuitOpen carries
    answer = fastapi_cart.answer(exc)
    assert answer.status_code in (400, 404, 409, 503), (kind, answer.status_code)
    body = answer.body.decode()
    assert "Sup3r" not in body and "horse" not in body
    if answer.status_code == 503:
        assert "db.internal" not in body and "6543" not in body and answer.headers["Retry-After"]


def test_an_unreachable_database_is_a_503_without_the_dsn(dsn: str, secret_role: str) -> None:
    with fault_proxy(dsn) as (proxy, proxied):
        secret_dsn = role_dsn(proxied, secret_role, support.SECRET)  # a role whose password is the secret
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(secret_dsn, **FAST), host="127.0.0.1", port=port,
                                               log_level="critical", lifespan="on", timeout_graceful_shutdown=5))
        thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
        thread.start()
        try:
            eventually(lambda: server.started or not thread.is_alive(), "uvicorn started")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                assert http.get("/carts/c1").status_code == 200
                proxy.refuse(True)
                proxy.cut()
                answer = http.get("/carts/c2")
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"]
            params = psycopg.conninfo.conninfo_to_dict(proxied)
            for leak in (support.SECRET, "s3cr3t", "password", f"{params['port']}", str(params["dbname"])):
                assert leak not in answer.text, answer.text
            assert answer.json()["kind"] in ("DatabaseUnavailable", "CircuitOpen", "ConnectionTimedOut")
        finally:
            server.should_exit = True
            thread.join(timeout=15)


def test_sigterm_ends_the_sse_streams_and_the_service_at_once(dsn: str) -> None:
    """A deploy stops the service with SIGTERM: uvicorn's graceful shutdown waits for open connections, and an
    SSE client never hangs up by itself, so the streams end when the shutdown starts."""
    port = free_port()
    env = {**os.environ, **{f"PGJOURNAL_{k.upper()}": str(v) for k, v in FAST.items()}}
    proc = subprocess.Popen([sys.executable, "-m", "pgjournal.examples.fastapi_cart", "--port", str(port),
                             "--dsn", dsn], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                return httpx.get(f"{base}/carts/c1", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        eventually(serving, "the service answers", timeout=60, interval=0.1)
        # no event comes: after the comment that opens the stream, a read returns only when the server ends it
        with httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=10)) as client, \
                client.stream("GET", "/events") as feed:
            lines = feed.iter_lines()
            assert next(lines).startswith(": connected")
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            try:
                ended = [line for line in lines if line]
            except httpx.ReadTimeout:
                pytest.fail("the SSE stream was still open 10 s after SIGTERM")
            exit_code = proc.wait(timeout=30)
            took = time.monotonic() - sent
        assert ended == [], ended
        assert exit_code in (0, -signal.SIGTERM)  # uvicorn raises the signal again once it has shut down
        assert took < 1.5, f"{took:.2f} s from SIGTERM to exit"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_an_item_id_that_is_not_text_is_a_422_naming_it(service: str, dsn: str) -> None:
    """``"\\ud800"`` in JSON is a lone surrogate, not text: refused as bad input naming the field, nothing written
    (FastAPI's own 422 quoted the input back and could not encode it: a 500)."""
    with httpx.Client(base_url=service, timeout=30) as http:
        answer = http.post("/carts/c9/items", content=b'{"item_id": "\\ud800", "quantity": 1}',
                           headers={"content-type": "application/json"})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"].startswith("body.item_id: Input should be a valid string")
        assert "\\ud800" not in answer.text  # the input is not quoted back
        assert http.post("/carts/c9/items", json={"item_id": "socks", "quantity": 1}).status_code == 201
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id = 'cart|c9'").fetchone() == (1,)
