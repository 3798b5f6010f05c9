"""A fault-injecting TCP proxy for tests: client -> 127.0.0.1:<port> -> PostgreSQL.

It runs an asyncio loop in a daemon thread and takes commands from the test's thread:

* ``cut()``: break every open connection at once (the client sees the server vanish);
* ``refuse(True)``: accept and close new connections at once (the server is unreachable);
* ``stall(True)``: stop forwarding in both directions until ``stall(False)`` (a hung network);
  ``direction="up"`` (client to server) or ``"down"``: one direction only, the other still flowing;
* ``delay(up=, down=)``: every byte arrives that many seconds after it was sent, per direction, the order kept
  and what follows not held up by what precedes (a WAN link: its round trip, not its bandwidth);
* ``cut_on(marker, forward=...)``: break the next connection whose client sends ``marker`` (for example
  ``b"INSERT INTO"``), either before the statement reaches the server (``forward=False``: nothing ran) or
  after it did, dropping the server's answer (``forward=True``: it ran, the client cannot know);
* ``retarget(host, port)``: send new connections elsewhere (a restarted server on a new port).

Loopback only: the proxy listens on 127.0.0.1 and refuses any other target than a loopback address.
Counters (``connections``, ``cuts``, ``traps_sprung``) let tests report how many faults they injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg.conninfo

LOOPBACK = "127.0.0.1"


def _check_loopback(host: str) -> str:
    try:
        address = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError) as exc:
        raise ValueError(f"fault proxy target {host!r} does not resolve: {exc}") from None
    if not address.is_loopback:
        raise ValueError(f"fault proxy forwards to loopback addresses only, not {host!r} ({address})")
    return str(address)


#: The server's ReadyForQuery message ('Z', length 5; the status byte follows): the first one ends the login.
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    #: The server's answers are dropped and the link closes (a trap with forward=True went off).
    muted: bool = False
    #: The server said ReadyForQuery once: the login is over.
    logged_in: bool = False

    def abort(self) -> None:
        for writer in (self.client, self.server):
            transport = writer.transport
            with contextlib.suppress(Exception):
                transport.abort()  # RST-like: no orderly goodbye, exactly what a dead network looks like


@dataclass
class _Trap:
    marker: bytes
    forward: bool
    times: int = 1


@dataclass
class FaultProxy:
    target_host: str
    target_port: int
    port: int = 0
    connections: int = 0
    cuts: int = 0
    traps_sprung: int = 0
    refused: int = 0
    _links: set[_Link] = field(default_factory=set)
    _trap: _Trap | None = None
    _refusing: bool = False
    #: Per direction (``True``: upstream, client to server): set while it forwards.
    _flowing: dict[bool, asyncio.Event] = field(default_factory=dict)
    #: Per direction: seconds each chunk is held before it is forwarded.
    _delay: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    sprung: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.target_host = _check_loopback(self.target_host)
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="faultproxy", daemon=True)
        self._thread.start()
        ready.wait(5)
        if not self.port:
            raise RuntimeError("fault proxy did not start")

    # -- commands (from any thread) ----------------------------------------------------------------

    def cut(self, logged_in: bool = False) -> int:
        """Break every open connection (``logged_in``: only those past their login); return how many were
        broken."""
        return self._call(lambda: self._cut(logged_in))

    def refuse(self, on: bool = True) -> None:
        self._call(lambda: setattr(self, "_refusing", on))

    def stall(self, on: bool = True, direction: str = "both") -> None:
        """Stop (``on``) or resume forwarding: ``"both"``, ``"up"`` (client to server) or ``"down"``."""
        if direction not in ("both", "up", "down"):
            raise ValueError(f"direction must be 'both', 'up' or 'down', got {direction!r}")
        sides = [side for side in (True, False) if direction == "both" or (direction == "up") == side]

        def apply() -> None:
            for side in sides:
                if on:
                    self._flowing[side].clear()
                else:
                    self._flowing[side].set()

        self._call(apply)

    def delay(self, up: float = 0.0, down: float = 0.0) -> None:
        """Hold every chunk ``up`` seconds on its way to the server and ``down`` on its way back."""
        self._call(lambda: self._delay.update({True: up, False: down}))

    def cut_on(self, marker: bytes, *, forward: bool, times: int = 1) -> None:
        """Break the next ``times`` connections that send ``marker`` (see the module docstring)."""
        self.sprung.clear()
        self._call(lambda: setattr(self, "_trap", _Trap(marker, forward, times)))

    def disarm(self) -> None:
        self._call(lambda: setattr(self, "_trap", None))

    def retarget(self, host: str, port: int) -> None:
        checked = _check_loopback(host)

        def apply() -> None:
            self.target_host, self.target_port = checked, port

        self._call(apply)

    def dsn(self, dsn: str) -> str:
        """``dsn`` rewritten to go through this proxy."""
        return psycopg.conninfo.make_conninfo(dsn, host=LOOPBACK, port=str(self.port))

    def close(self) -> None:
        self._call(self._cut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # -- the loop ------------------------------------------------------------------------------------

    def _call(self, fn):  # type: ignore[no-untyped-def]
        result: list = []
        done = threading.Event()

        def run() -> None:
            try:
                result.append(fn())
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(5):
            raise RuntimeError("fault proxy loop did not answer")
        return result[0] if result else None

    def _cut(self, logged_in: bool = False) -> int:
        links = [link for link in self._links if link.logged_in or not logged_in]
        self._links.difference_update(links)
        for link in links:
            link.abort()
        self.cuts += len(links)
        return len(links)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        for side in (True, False):
            self._flowing[side] = asyncio.Event()
            self._flowing[side].set()
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, LOOPBACK, self.port or 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        await asyncio.gather(self._pump(reader, up_writer, link, upstream=True),
                             self._pump(up_reader, writer, link, upstream=False), return_exceptions=True)
        self._links.discard(link)
        link.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link, *, upstream: bool
                    ) -> None:
        """Read ``src`` and hand each chunk, stamped with when it is due, to :meth:`_forward`: a delay holds a chunk,
        never the reading of the next."""
        due: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        forward = asyncio.ensure_future(self._forward(due, dst, link, upstream=upstream))
        try:
            while not forward.done():
                data = await src.read(65536)
                if not data:
                    break
                due.put_nowait((self._loop.time() + self._delay[upstream], data))
        finally:
            due.put_nowait(None)
            with contextlib.suppress(Exception):
                await forward
            self._links.discard(link)
            link.abort()

    async def _forward(self, due: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter, link: _Link,
                       *, upstream: bool) -> None:
        flowing = self._flowing[upstream]
        while (item := await due.get()) is not None:
            at, data = item
            wait = at - self._loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await flowing.wait()
            if link not in self._links:
                break  # cut while we waited
            if not upstream and link.muted:
                break  # the answer to a trapped statement: never delivered
            if not upstream and not link.logged_in and READY_FOR_QUERY in data:
                link.logged_in = True
            trap = self._trap
            if upstream and trap is not None and trap.marker in data:
                trap.times -= 1
                if trap.times <= 0:
                    self._trap = None
                self.traps_sprung += 1
                self.sprung.set()
                if not trap.forward:
                    break  # the statement never reaches the server
                link.muted = True
            dst.write(data)
            await dst.drain()
        self._links.discard(link)
        link.abort()


@contextlib.contextmanager
def fault_proxy(dsn: str) -> Iterator[tuple[FaultProxy, str]]:
    """A proxy in front of ``dsn``'s server and the DSN that goes through it."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = FaultProxy(str(params.get("host") or LOOPBACK), int(params.get("port") or 5432))
    try:
        yield proxy, proxy.dsn(dsn)
    finally:
        proxy.close()
