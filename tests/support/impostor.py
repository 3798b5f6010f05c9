"""A fake PostgreSQL server that asks every client for its password: what another local user could bind on the
embedded server's port while it is down (a restart), to see what the project's clients hand over.

It speaks the start of the protocol (SSL and GSS requests refused, the startup packet read) and then asks, by
``mode``:

* ``cleartext``: AuthenticationCleartextPassword (R 3), the password itself in the answer;
* ``md5``: AuthenticationMD5Password (R 5), a hash an impostor can try guesses against;
* ``scram``: SCRAM-SHA-256 (R 10), answered with a server-first message of its own and, without the verifier,
  a server signature it cannot compute: a random one;
* ``scram-skip``: SCRAM-SHA-256 started, then AuthenticationOk (R 0) at once instead of the server's proof.

Everything each client sends after its startup packet is kept in :attr:`Impostor.received`, one entry per
connection: the messages as ``(type, body)`` pairs.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import struct
import threading
from dataclasses import dataclass, field

MODES = ("cleartext", "md5", "scram", "scram-skip")
_SSL_REQUEST, _GSS_REQUEST, _CANCEL_REQUEST = 80877103, 80877104, 80877102


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _auth(code: int, extra: bytes = b"") -> bytes:
    return _message(b"R", struct.pack("!i", code) + extra)


@dataclass
class Impostor:
    port: int
    mode: str
    received: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    startups: list[dict[str, str]] = field(default_factory=list)
    _sock: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {MODES}")

    def start(self) -> Impostor:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._sock = sock
        thread = threading.Thread(target=self._accept, name="impostor", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> Impostor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        return len(self.startups)

    def everything_sent(self) -> bytes:
        return b"".join(kind + body for conn in self.received for kind, body in conn)

    def kinds_sent(self) -> set[bytes]:
        return {kind for conn in self.received for kind, _ in conn}

    # -- one client ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), name="impostor-client", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        messages: list[tuple[bytes, bytes]] = []
        conn.settimeout(10)
        with conn, contextlib.suppress(OSError, ConnectionError):
            startup = self._startup(conn)
            if startup is None:
                return
            self.received.append(messages)
            self.startups.append(startup)
            if self.mode == "cleartext":
                conn.sendall(_auth(3))
                self._read(conn, messages)
            elif self.mode == "md5":
                conn.sendall(_auth(5, os.urandom(4)))
                self._read(conn, messages)
            else:
                self._scram(conn, messages)
            # Whatever the client believed, ask for nothing more and wait for what it sends next (a query?).
            while self._read(conn, messages) is not None:
                pass

    def _startup(self, conn: socket.socket) -> dict[str, str] | None:
        while True:
            head = _exactly(conn, 8)
            if head is None:
                return None
            length, code = struct.unpack("!ii", head)
            body = _exactly(conn, length - 8) or b""
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                conn.sendall(b"N")
                continue
            if code == _CANCEL_REQUEST:
                return None
            parts = body.split(b"\0")
            return {parts[i].decode(): parts[i + 1].decode() for i in range(0, len(parts) - 1, 2) if parts[i]}

    def _read(self, conn: socket.socket, messages: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes] | None:
        head = _exactly(conn, 5)
        if head is None:
            return None
        kind, length = head[:1], struct.unpack("!i", head[1:])[0]
        body = _exactly(conn, length - 4) or b""
        messages.append((kind, body))
        return kind, body

    def _scram(self, conn: socket.socket, messages: list[tuple[bytes, bytes]]) -> None:
        conn.sendall(_auth(10, b"SCRAM-SHA-256\0\0"))
        first = self._read(conn, messages)
        if first is None:
            return
        # SASLInitialResponse: mechanism, int32 length, client-first-message ("n,,n=,r=<nonce>")
        _mechanism, _, rest = first[1].partition(b"\0")
        client_first = rest[4:].decode()
        nonce = client_first.split("r=", 1)[1].split(",", 1)[0]
        server_nonce = nonce + base64.b64encode(os.urandom(18)).decode()
        salt = base64.b64encode(os.urandom(16)).decode()
        conn.sendall(_auth(11, f"r={server_nonce},s={salt},i=4096".encode()))
        if self._read(conn, messages) is None:  # client-final: its proof
            return
        if self.mode == "scram-skip":
            conn.sendall(_auth(0) + _message(b"Z", b"I"))
            return
        signature = base64.b64encode(os.urandom(32)).decode()
        conn.sendall(_auth(12, f"v={signature}".encode()) + _auth(0) + _message(b"Z", b"I"))


def _exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
