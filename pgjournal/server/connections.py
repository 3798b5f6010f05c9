"""Client-side limits on every connection pgjournal opens, so a dead network ends in a typed error, not a hang.

* ``connect_timeout``: a server that does not complete the handshake;
* TCP keepalives and ``tcp_user_timeout``: a peer that vanished (probes or sent data go unacknowledged);
* on pgjournal's own pool: the server-side ``statement_timeout`` for its internal statements, and a client-side
  limit on each round trip (``statement_timeout + tcp_user_timeout``): TCP cannot see a path that still
  acknowledges packets but never answers (a hung proxy or load balancer), so the client stops waiting,
  closes the connection and raises :class:`ServerSilent`, which the journal turns into
  :class:`~pgjournal.errors.ConnectionTimedOut` (or :class:`~pgjournal.errors.WriteOutcomeUnknown` mid-append).

The client-side limit uses nothing private of psycopg: each round trip goes through ``Connection.wait`` (every
psycopg 3 release routes statements, pipeline syncs and streamed rows through it; a test checks it), which a
pool connection wraps, arguments passed through as they come, in a deadline kept by one :class:`Watchdog` thread.
A round trip past its deadline has its socket shut down (``shutdown(2)`` on a duplicate of ``Connection.fileno()``):
psycopg's own wait then returns, libpq reports the connection lost, and the wrapper raises :class:`ServerSilent`.
(psycopg 3.3.6 added a ``timeout`` to ``wait`` with a private exception; relying on it broke every statement on
3.2, whose ``wait`` takes no such argument.)

User code that runs on a pool connection (projection handlers) uses :func:`user_statements`: no limits.

While a server is unreachable, psycopg_pool warns of every failed attempt of every pool (one journal's pool of
2-4 connections wrote 26 warnings in a 10 s outage); :class:`PoolWarnings` keeps one per pgjournal pool, error and
minute.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed

from pgjournal.errors import DatabaseUnavailable, JournalClosed
from pgjournal.model.printable import printable_logger
from pgjournal.server.dsn import mask_dsn, redact
from pgjournal.settings import Settings

RV = TypeVar("RV")


class PoolWarnings(logging.Filter):
    """On the ``psycopg.pool`` logger: of a pgjournal pool's warnings that it failed to connect (each attempt) or
    gave up reconnecting, the first of each kind, pool and error passes, the same ones within ``interval``
    seconds are left out, and the next that passes says how many were. Other pools' records pass untouched."""

    REPEATED = frozenset({"error connecting in %r: %s", "reconnection attempt in pool %r failed after %s sec"})
    #: Distinct (kind, pool, error) kept: the oldest is forgotten past this (an error text that keeps changing).
    KEPT = 256

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, ...], tuple[float, int]] = {}  # key -> (when one last passed, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if (not isinstance(record.msg, str) or record.msg not in self.REPEATED or not args
                or not str(args[0]).startswith("pgjournal")):
            return True
        key = (str(record.msg), *map(str, args))
        now = self._clock()
        with self._lock:
            passed, left_out = self._seen.pop(key, (None, 0))
            if passed is not None and now - passed < self.interval:
                self._seen[key] = (passed, left_out + 1)
                return False
            self._seen[key] = (now, 0)
            while len(self._seen) > self.KEPT:
                del self._seen[next(iter(self._seen))]
        if passed is not None and left_out:
            record.msg = f"{record.msg} (and %d more like it in %.0f s, left out)"
            record.args = (*args, left_out, now - passed)
        return True


_POOL_WARNINGS = PoolWarnings()


def quiet_pool_warnings() -> None:
    """Put :class:`PoolWarnings` on psycopg_pool's logger (once; a journal's pools call it when made). It is taken
    as every logger of pgjournal is, so the server's error texts it repeats are printed escaped too."""
    pool_logger = printable_logger("psycopg.pool")
    if _POOL_WARNINGS not in pool_logger.filters:
        pool_logger.addFilter(_POOL_WARNINGS)
_IDLE = TransactionStatus.IDLE

_psycopg_wait = psycopg.Connection.wait


class ServerSilent(psycopg.OperationalError):
    """No answer within the client-side limit; the connection was closed (the statement may have run)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"no answer from the server within {limit:g} s (client-side limit: statement_timeout + "
                         "tcp_user_timeout); the connection was closed")
        self.limit = limit


class Watchdog:
    """Deadlines of the round trips under way on limited connections, both faces', and one daemon thread that
    cuts the connection of a round trip past its deadline: its socket is shut down, so the thread (or event
    loop) waiting on it wakes up to a lost connection. Arming and disarming are a dict operation under a lock;
    the thread sleeps until the earliest deadline (woken when an earlier one is armed)."""

    def __init__(self) -> None:
        self._armed: dict[int, float] = {}  # id(connection) -> deadline (monotonic)
        self._sockets: dict[int, int] = {}  # id(connection) -> its socket's file descriptor
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._next = math.inf  # when the thread wakes up next
        self._thread: threading.Thread | None = None
        self.cuts = 0

    def arm(self, conn: Any, limit: float) -> None:
        deadline = time.monotonic() + limit
        fd = conn.pgconn.socket
        with self._lock:
            self._armed[id(conn)] = deadline
            self._sockets[id(conn)] = fd
            if deadline < self._next:
                self._next = deadline
                self._wake.set()
        if self._thread is None:
            self._start()

    def disarm(self, conn: Any) -> bool:
        """``False`` when the round trip was cut (its deadline passed)."""
        key = id(conn)
        with self._lock:
            self._sockets.pop(key, None)
            return self._armed.pop(key, None) is not None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgjournal-watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(None if self._next == math.inf else max(0.0, self._next - time.monotonic()))
            self._wake.clear()
            with self._lock:
                now = time.monotonic()
                for key in [key for key, deadline in self._armed.items() if deadline <= now]:
                    del self._armed[key]
                    # Under the lock: the waiter closes the connection only after disarming, so the descriptor
                    # is still this connection's socket (not one reused by another connection).
                    _cut(self._sockets.pop(key))
                    self.cuts += 1
                self._next = min(self._armed.values(), default=math.inf)


def _cut(fd: int) -> None:
    """Shut the socket ``fd`` down both ways (through a duplicate: the connection still owns ``fd``)."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


WATCHDOG = Watchdog()


def _whole_seconds(value: float) -> int:
    return max(1, math.ceil(value))


def connection_kwargs(settings: Settings, *, statement_timeout: bool = False, dsn: str | None = None
                      ) -> dict[str, Any]:
    """libpq keywords for one connection: connect timeout, keepalives, ``tcp_user_timeout`` and, for
    pgjournal's own statements only (``statement_timeout=True``), the server-side statement timeout.

    Keepalives start after a third of ``tcp_user_timeout`` idle and give up after three unanswered probes,
    so an idle connection to a vanished server is noticed within about ``tcp_user_timeout`` too. The timeout
    goes in libpq's ``options``, which replaces the ``options`` of the DSN (``dsn``) or of ``PGOPTIONS``: those
    are kept in front of it (a user's ``-c TimeZone=...`` or ``-c search_path=...`` still applies).
    """
    kwargs: dict[str, Any] = {"connect_timeout": _whole_seconds(settings.connect_timeout)}
    user_timeout = settings.tcp_user_timeout
    if user_timeout > 0:
        kwargs.update(keepalives=1, keepalives_idle=_whole_seconds(user_timeout / 3),
                      keepalives_interval=_whole_seconds(user_timeout / 6), keepalives_count=3,
                      tcp_user_timeout=max(1, round(user_timeout * 1000)))
    else:
        kwargs.update(keepalives=1)
    if statement_timeout and settings.statement_timeout > 0:
        given = _given_options(dsn)
        ours = f"-c statement_timeout={max(1, round(settings.statement_timeout * 1000))}"
        kwargs["options"] = f"{given} {ours}" if given else ours
    return kwargs


def _given_options(dsn: str | None) -> str:
    """The ``options`` a connection to ``dsn`` would have without pgjournal's: the DSN's, else ``PGOPTIONS``."""
    if dsn:
        with contextlib.suppress(psycopg.ProgrammingError):
            given = psycopg.conninfo.conninfo_to_dict(dsn).get("options")
            if given:
                return str(given)
    return os.environ.get("PGOPTIONS", "")


def unreachable(dsn: str, exc: psycopg.OperationalError, doing: str = "connect to") -> DatabaseUnavailable:
    """A server that could not be connected to, password masked wherever the message quotes it."""
    reason = " ".join(str(exc).split()) or exc.__class__.__name__
    return DatabaseUnavailable(f"cannot {doing} {mask_dsn(dsn)}: {redact(reason, dsn)}")


def connect(dsn: str, settings: Settings | None = None, *, statement_timeout: bool = False,
            doing: str = "connect to") -> psycopg.Connection[Any]:
    """One autocommit connection outside the pools, with the project's limits (:func:`connection_kwargs`); an
    unreachable server is :class:`DatabaseUnavailable` saying what could not be done (``doing``)."""
    try:
        return psycopg.connect(dsn, autocommit=True, **connection_kwargs(settings or Settings.load(), dsn=dsn,
                                                                        statement_timeout=statement_timeout))
    except psycopg.OperationalError as exc:
        raise unreachable(dsn, exc, doing) from None


def round_trip_limit(settings: Settings) -> float | None:
    """Seconds the client waits for one answer on a pool connection; ``None`` without a statement timeout."""
    if settings.statement_timeout <= 0:
        return None
    return settings.statement_timeout + (settings.tcp_user_timeout or settings.connect_timeout)


def round_trip_ended(conn: Any, limit: float, *, failed: bool) -> None:
    """Disarm ``conn``'s deadline after a round trip. One the :data:`WATCHDOG` cut is closed (its protocol state
    is unknown mid-exchange): a failed one raises :class:`ServerSilent`; one answered just as it was cut keeps
    its answer."""
    if WATCHDOG.disarm(conn):
        return
    conn.pgconn.finish()
    if failed:
        raise ServerSilent(limit) from None


class LimitedConnection(psycopg.Connection[Any]):
    """A connection that gives up on an answer after :attr:`limit` seconds (see the module docstring)."""

    #: Set per pool by :func:`limited_connection_class`; ``None``: wait as long as it takes.
    limit: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        # psycopg's own wait called directly, not through super(): this runs for every statement.
        limit = self.limit
        if limit is None:
            return _psycopg_wait(self, gen, *args, **kwargs)
        WATCHDOG.arm(self, limit)
        try:
            result = _psycopg_wait(self, gen, *args, **kwargs)
        except BaseException:
            round_trip_ended(self, limit, failed=True)
            raise
        round_trip_ended(self, limit, failed=False)
        return result


def limited_connection_class(settings: Settings) -> type[LimitedConnection]:
    """A :class:`LimitedConnection` subclass carrying ``settings``' round-trip limit, for one pool."""
    return type("LimitedConnection", (LimitedConnection,), {"limit": round_trip_limit(settings)})


@contextlib.contextmanager
def user_statements(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """Run user code (a projection handler) on a pool connection inside a transaction without pgjournal's
    limits: ``statement_timeout`` off for the rest of the transaction, no client-side limit while inside."""
    limit = getattr(conn, "limit", None)
    if limit is None:
        yield conn
        return
    conn.execute("SET LOCAL statement_timeout = 0")
    conn.limit = None  # type: ignore[attr-defined]
    try:
        yield conn
    finally:
        del conn.limit  # type: ignore[attr-defined]  # back to the class's limit


def closed_journal(pool: Any) -> JournalClosed:
    """The error of a borrow from the closed pool of a journal (both faces)."""
    return JournalClosed(f"the journal on {mask_dsn(pool.conninfo)} is closed")


class PoolFront:
    """Idle connections kept in front of a psycopg pool, so borrowing one is a list pop, not a pool round.

    ``psycopg_pool``'s ``getconn``/``putconn`` pair runs some 30 Python calls (locks, stats, logging, checks),
    a sizeable share of a raw single-row INSERT's client cost (``python -m bench append-cpu``). Every
    borrower of the journal goes through this front, so a connection kept here is available to all of them,
    never hoarded by one. The pool still owns every connection:

    * a connection goes back to the pool, which resets or replaces it, unless it is healthy and idle (not in a
      transaction, not closed or broken);
    * while any borrower waits inside the pool (all connections out), returned connections go to the pool,
      which hands them to the waiters (a waiter re-checks this front before it waits, a returner re-checks
      the waiters after it kept one, so none is missed);
    * one return in ``recycle_every`` goes to the pool anyway, so its lifetime and idle limits still apply;
    * :meth:`close` hands back everything kept before the pool closes.
    """

    def __init__(self, pool: Any, *, recycle_every: int = 500) -> None:
        self.pool = pool
        self._idle: list[psycopg.Connection[Any]] = []
        self._waiting = 0
        self._lock = threading.Lock()
        self._returns = 0
        self._recycle_every = recycle_every
        self._closed = False

    def get(self) -> psycopg.Connection[Any]:
        """An idle connection (raises ``PoolTimeout`` as the pool does when none comes in time, and
        :class:`~pgjournal.errors.JournalClosed` once closed)."""
        if self._closed:
            raise closed_journal(self.pool)
        try:
            return self._idle.pop()
        except IndexError:
            pass
        with self._lock:
            self._waiting += 1
        try:
            try:
                return self._idle.pop()  # kept by a returner that did not see this borrower yet
            except IndexError:
                conn: psycopg.Connection[Any] = self.pool.getconn()
                return conn
        except PoolClosed:
            raise closed_journal(self.pool) from None
        finally:
            with self._lock:
                self._waiting -= 1

    def ready(self) -> bool:
        """Whether a borrow now would be served at once: a connection kept here or idle in the pool, or room in
        the pool to open one (the group commit, :mod:`pgjournal.write.pipelining`, takes appends that would wait)."""
        if self._idle:
            return True
        stats = self.pool.get_stats()
        return bool(stats.get("pool_available")) or stats.get("pool_size", 0) < self.pool.max_size

    def put(self, conn: psycopg.Connection[Any]) -> None:
        self._returns += 1  # a lost increment under a race only delays a recycle
        if (self._closed or self._waiting or self._returns % self._recycle_every == 0 or conn.closed
                or conn.pgconn.transaction_status != _IDLE):
            self.pool.putconn(conn)
            return
        self._idle.append(conn)
        if self._waiting:  # a borrower started waiting meanwhile: let the pool hand it a connection
            self._hand_back()
        if self._closed:  # returned by a borrower that had it when the journal closed: the pool closes it
            self.close()

    def _hand_back(self) -> bool:
        """Give one kept connection to the pool; ``False`` when none is kept."""
        try:
            conn = self._idle.pop()
        except IndexError:
            return False
        self.pool.putconn(conn)
        return True

    def close(self) -> None:
        """Hand every kept connection back (before the pool closes); later borrows raise
        :class:`~pgjournal.errors.JournalClosed`, and a connection returned later goes to the pool, which closes it
        (kept here, it would serve a borrower that outlived the close, such as a live query, forever)."""
        self._closed = True
        while self._hand_back():
            pass

    def __len__(self) -> int:
        """Connections kept here now."""
        return len(self._idle)
