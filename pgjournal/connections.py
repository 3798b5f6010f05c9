"""Client-side limits on every connection pgjournal opens, so a dead network ends in a typed error, not a hang.

* ``connect_timeout``: a server that does not complete the handshake;
* TCP keepalives and ``tcp_user_timeout``: a peer that vanished (probes or sent data go unacknowledged);
* on pgjournal's own pool: the server-side ``statement_timeout`` for its internal statements, and a client-side
  limit on each round trip (``statement_timeout + tcp_user_timeout``): TCP cannot see a path that still
  acknowledges packets but never answers (a hung proxy or load balancer), so the client stops waiting,
  closes the connection and raises :class:`ServerSilent`, which the journal turns into
  :class:`~pgjournal.errors.ConnectionTimedOut` (or :class:`~pgjournal.errors.WriteOutcomeUnknown` mid-append).

User code that runs on a pool connection (projection handlers) uses :func:`user_statements`: no limits.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus

if TYPE_CHECKING:
    from .settings import Settings

RV = TypeVar("RV")
_IDLE = TransactionStatus.IDLE
# psycopg's own signal that Connection.wait(timeout=...) ran out (private, hence looked up defensively).
_WAIT_TIMEOUT: type[BaseException] | None = getattr(psycopg.errors, "_WaitTimeout", None)


_psycopg_wait = psycopg.Connection.wait


class ServerSilent(psycopg.OperationalError):
    """No answer within the client-side limit; the connection was closed (the statement may have run)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"no answer from the server within {limit:g} s (client-side limit: statement_timeout + "
                         "tcp_user_timeout); the connection was closed")
        self.limit = limit


def _whole_seconds(value: float) -> int:
    return max(1, math.ceil(value))


def connection_kwargs(settings: Settings, *, statement_timeout: bool = False) -> dict[str, Any]:
    """libpq keywords for one connection: connect timeout, keepalives, ``tcp_user_timeout`` and, for
    pgjournal's own statements only (``statement_timeout=True``), the server-side statement timeout.

    Keepalives start after a third of ``tcp_user_timeout`` idle and give up after three unanswered probes,
    so an idle connection to a vanished server is noticed within about ``tcp_user_timeout`` too.
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
        kwargs["options"] = f"-c statement_timeout={max(1, round(settings.statement_timeout * 1000))}"
    return kwargs


def round_trip_limit(settings: Settings) -> float | None:
    """Seconds the client waits for one answer on a pool connection; ``None`` without a statement timeout."""
    if settings.statement_timeout <= 0:
        return None
    return settings.statement_timeout + (settings.tcp_user_timeout or settings.connect_timeout)


class LimitedConnection(psycopg.Connection[Any]):
    """A connection that gives up on an answer after :attr:`limit` seconds (see the module docstring)."""

    #: Set per pool by :func:`limited_connection_class`; ``None``: wait as long as it takes.
    limit: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        # psycopg's own wait called directly, not through super(): this runs for every statement.
        limit = self.limit
        if limit is None or timeout is not None or _WAIT_TIMEOUT is None:
            return _psycopg_wait(self, gen, interval, timeout)
        try:
            return _psycopg_wait(self, gen, interval, limit)
        except _WAIT_TIMEOUT:
            # The protocol state is unknown mid-exchange: the connection cannot be used again.
            self.pgconn.finish()
            raise ServerSilent(limit) from None


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


class PoolFront:
    """Idle connections kept in front of a psycopg pool, so borrowing one is a list pop, not a pool round.

    ``psycopg_pool``'s ``getconn``/``putconn`` pair runs some 30 Python calls (locks, stats, logging, checks):
    ~30,000 instructions, a fifth of a raw single-row INSERT's client cost (measured with callgrind). Every
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

    def get(self) -> psycopg.Connection[Any]:
        """An idle connection (raises ``PoolTimeout`` as the pool does when none comes in time)."""
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
                return self.pool.getconn()
        finally:
            with self._lock:
                self._waiting -= 1

    def put(self, conn: psycopg.Connection[Any]) -> None:
        self._returns += 1  # a lost increment under a race only delays a recycle
        if (self._waiting or self._returns % self._recycle_every == 0 or conn.closed
                or conn.pgconn.transaction_status != _IDLE):
            self.pool.putconn(conn)
            return
        self._idle.append(conn)
        if self._waiting:  # a borrower started waiting meanwhile: let the pool hand it a connection
            self._hand_back()

    def _hand_back(self) -> bool:
        """Give one kept connection to the pool; ``False`` when none is kept."""
        try:
            conn = self._idle.pop()
        except IndexError:
            return False
        self.pool.putconn(conn)
        return True

    def close(self) -> None:
        """Hand every kept connection back (before the pool closes)."""
        while self._hand_back():
            pass

    def __len__(self) -> int:
        """Connections kept here now."""
        return len(self._idle)
