"""Wake-up signals for live queries (PostgreSQL LISTEN/NOTIFY), always sent *after* the write committed.

``NOTIFY`` inside a writing transaction takes a cluster-wide lock across the commit flush and serialises
writers, so a writer only records that an entity type changed; a background thread sends one coalesced
``pg_notify`` per entity type in its own tiny transaction. A listener thread wakes the live queries that
care. Signals are a latency optimisation only: a lost one means a query waits for its next poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from psycopg import sql

from pgjournal.model.printable import printable_logger
from pgjournal.runtime.backoff import Backoff
from pgjournal.runtime.steps import Call, Statement, Step, Work, run_work

CHANNEL = "pgjournal_events"
#: Seconds between two rounds of signals from one process (the most a signal waits behind another).
SEND_INTERVAL = 0.005
#: The sender's session. A NOTIFY commits a transaction of its own (it takes a transaction id), which would wait
#: for a WAL flush each round (server CPU for every round, ``python -m bench append-cpu``) and queue the writers'
#: commits behind it; a signal lost in a crash costs only latency.
SENDER_SETUP = "SET synchronous_commit = off"
LISTEN = f"LISTEN {CHANNEL}"
#: Before the listener connects again: half to all of 100 ms, doubling to 5 s.
RECONNECT = Backoff(0.1, 2.0, 5.0, jitter=0.5)
_log = printable_logger(__name__)


def wakes(wanted: frozenset[str] | None, entity_type: str | None) -> bool:
    """Whether a subscriber to ``wanted`` (``None``: every entity type) is woken by a signal for ``entity_type``
    (``None``: the listener (re)connected and may have missed any signal)."""
    return entity_type is None or wanted is None or entity_type in wanted


class Listening:
    """The listener's rules, for both faces (:class:`Signals`' thread, the asyncio face's task): LISTEN on a
    connection of its own, wake every subscriber when it (re)connects (a signal sent while nobody listened is
    caught by a poll now), then wake the subscribers of each signal that arrives; a lost connection is opened
    again after :data:`RECONNECT`'s pause (counted from the last time it listened), so listeners that lost
    their server together do not reconnect in step. :meth:`work` runs with :func:`~pgjournal.runtime.steps.run_work`
    or :func:`~pgjournal.runtime.steps.arun_work`, ``receive`` is the face's wait for signals on the connection."""

    def __init__(self, closed: Callable[[], bool], wake: Callable[[str | None], None],
                 receive: Callable[[Any], Any]) -> None:
        self._closed = closed
        self._wake = wake
        self._receive = receive
        self._failures = 0

    def work(self) -> Work[None]:
        while not self._closed():
            try:
                yield self._listen_step
            except psycopg.Error:  # closed while it was reconnecting (see pause)
                return

    def _listen_step(self) -> Step[None]:
        yield Statement(LISTEN)
        self._failures = 0
        self._wake(None)
        while not self._closed():
            notes = yield Call(self._receive, connection=True)
            for note in notes:
                self._wake(note.payload)

    def pause(self, _attempt: int, exc: BaseException) -> float | None:
        """After a lost connection: the pause before the next (none once closed); any other error ends the
        listener."""
        if not isinstance(exc, psycopg.Error) or self._closed():
            return None
        self._failures += 1
        _log.debug("listener connection lost (%s); reconnecting", exc.__class__.__name__)
        return RECONNECT.delay(self._failures)


def notify_sql(conn: psycopg.Connection, entity_types: Iterable[str]) -> str:
    """``NOTIFY`` statements for ``entity_types`` as one string (payloads quoted by the server's rules)."""
    return "; ".join(f"NOTIFY {CHANNEL}, {sql.Literal(entity_type).as_string(conn)}"
                     for entity_type in sorted(entity_types))


class Signals:
    def __init__(self, dsn: str, connect_kwargs: dict[str, Any] | None = None) -> None:
        self._dsn = dsn
        #: Connect timeout, keepalives, tcp_user_timeout (pgjournal.server.connections); no statement timeout.
        self._kwargs = connect_kwargs or {}
        self._lock = threading.Condition()
        self._pending: set[str] = set()
        self._subscribers: dict[threading.Event, frozenset[str] | None] = {}
        self._closed = False
        self._sender: threading.Thread | None = None
        self._listener: threading.Thread | None = None

    # -- writers -------------------------------------------------------------------------------------

    def written(self, _slice: int, entity_type: str) -> None:
        """Record that ``entity_type`` got events; the sender thread notifies soon after.

        Called after every commit, so it is kept to a set lookup in the common case: when ``entity_type`` is
        already pending, the sender has not taken the set yet (or is taking it now, and sends it after this
        commit), so the signal is already due. The sender is only woken when the set goes from empty to
        non-empty: waking it on every append cost a thread switch per append, with 8 writers the largest part
        of the append path's client CPU over a raw INSERT's (``python -m bench append-cpu``).
        """
        if entity_type in self._pending and self._sender is not None:
            return
        with self._lock:
            wake = not self._pending
            self._pending.add(entity_type)
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_loop, name="pgjournal-notify", daemon=True)
                self._sender.start()
            if wake:
                self._lock.notify()

    def _send_loop(self) -> None:
        conn: psycopg.Connection | None = None
        next_send = 0.0
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending:
                    break  # closed, and everything recorded has been sent
                # At most one round of signals per SEND_INTERVAL: after a quiet spell the first goes at once,
                # a stream of appends shares one instead of paying a round trip each (on one writer, a second
                # round trip beside the append's own: ``python -m bench append-cpu-1``).
                while not self._closed and (wait := next_send - time.monotonic()) > 0:
                    self._lock.wait(wait)
                batch, self._pending = self._pending, set()
            next_send = time.monotonic() + SEND_INTERVAL
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._dsn, autocommit=True, **self._kwargs)
                    conn.execute(SENDER_SETUP)
                # One simple-protocol string (no parameters, no pipeline): one round trip and the least
                # client CPU, which the writers' threads share (a pipeline of pg_notify calls cost more).
                conn.execute(notify_sql(conn, batch))
            except psycopg.Error as exc:  # best effort: readers still poll
                _log.debug("notification lost: %s", exc.__class__.__name__)
                conn = None
                time.sleep(0.1)
        if conn is not None:
            conn.close()

    # -- readers -------------------------------------------------------------------------------------

    def subscribe(self, entity_types: Iterable[str] | None = None) -> Callable[[threading.Event], Callable[[], None]]:
        """A ``subscribe`` hook for :class:`~pgjournal.runtime.live.LiveQuery` (``None``: every entity type)."""
        wanted = None if entity_types is None else frozenset(entity_types)

        def attach(event: threading.Event) -> Callable[[], None]:
            with self._lock:
                self._subscribers[event] = wanted
                if self._listener is None:
                    self._listener = threading.Thread(target=self._listen_loop, name="pgjournal-listen",
                                                      daemon=True)
                    self._listener.start()
            return lambda: self._detach(event)

        return attach

    def _detach(self, event: threading.Event) -> None:
        with self._lock:
            self._subscribers.pop(event, None)

    def _wake(self, entity_type: str | None) -> None:
        with self._lock:
            for event, wanted in self._subscribers.items():
                if wakes(wanted, entity_type):
                    event.set()

    def _listen_loop(self) -> None:
        listening = Listening(lambda: self._closed, self._wake, _receive)
        run_work(listening.work(), self._listener_connection, listening.pause)

    @contextlib.contextmanager
    def _listener_connection(self) -> Iterator[psycopg.Connection]:
        with psycopg.connect(self._dsn, autocommit=True, **self._kwargs) as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for thread in (self._sender, self._listener):
            if thread is not None:
                with contextlib.suppress(RuntimeError):
                    thread.join(timeout=2)


def _receive(conn: psycopg.Connection) -> list[psycopg.Notify]:
    """The signals that arrive within 0.1 s (the listener then looks whether it was closed), at once when one does."""
    return list(conn.notifies(timeout=0.1, stop_after=1))
