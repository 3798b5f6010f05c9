"""The signal rules are the same on both faces (pgjournal.runtime.signals holds them): the sender's session skips
the WAL flush wait before it notifies, a signal wakes the subscribers of its entity type only, and a listener whose
connection was cut connects again and wakes everyone (it may have missed a signal)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.aio.signals import AsyncSignals
from pgjournal.runtime.signals import CHANNEL, LISTEN, SENDER_SETUP, Signals, wakes


def spy(monkeypatch: pytest.MonkeyPatch, cls: Any) -> list[tuple[int, str]]:
    """Every statement text ``cls`` (a psycopg connection class) runs, with the connection that ran it; the
    statements still run against the real server."""
    seen: list[tuple[int, str]] = []
    original = cls.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((id(self), query if isinstance(query, str) else str(query)))
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(cls, "execute", execute)
    return seen


def sender_setup_came_first(seen: list[tuple[int, str]]) -> bool:
    """The connection that notified ran :data:`SENDER_SETUP` before its first NOTIFY."""
    notifying = next(conn for conn, text in seen if text.startswith(f"NOTIFY {CHANNEL}"))
    mine = [text for conn, text in seen if conn == notifying]
    return SENDER_SETUP in mine and mine.index(SENDER_SETUP) < next(
        i for i, text in enumerate(mine) if text.startswith("NOTIFY"))


@pytest.mark.postgres_only("notifications")
def test_the_blocking_sender_skips_the_flush_wait(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy(monkeypatch, psycopg.Connection)
    with psycopg.connect(dsn, autocommit=True) as listener, Journal.open(dsn) as journal:
        listener.execute(f"LISTEN {CHANNEL}")
        journal.append("Cart|1", ["a"])
        assert [n.payload for n in listener.notifies(timeout=10, stop_after=1)] == ["Cart"]
    assert sender_setup_came_first(seen)


@pytest.mark.postgres_only("notifications")
async def test_the_asyncio_sender_skips_the_flush_wait(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy(monkeypatch, psycopg.AsyncConnection)
    got = threading.Event()

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute(f"LISTEN {CHANNEL}")
            ready.set()
            if list(listener.notifies(timeout=10, stop_after=1)):
                got.set()

    ready = threading.Event()
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10)
    async with await AsyncJournal.open(dsn) as journal:
        await journal.append("Cart|1", ["a"])
        assert await asyncio.to_thread(got.wait, 10), "no notification"
    thread.join(10)
    assert sender_setup_came_first(seen)


def test_a_signal_wakes_the_subscribers_of_its_entity_type() -> None:
    assert wakes(frozenset({"Cart"}), "Cart") and not wakes(frozenset({"Cart"}), "Order")
    assert wakes(None, "Order")  # subscribed to every entity type
    assert wakes(frozenset({"Cart"}), None)  # a listener that reconnected may have missed anything


def cut_listener(dsn: str) -> int:
    """Terminate the sessions of this database that listen (their last statement was :data:`LISTEN`)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                             "current_database() AND query = %s AND pid <> pg_backend_pid()", (LISTEN,)).fetchall()
    return len(rows)


@pytest.mark.postgres_only("notifications")
def test_the_blocking_listener_reconnects_and_wakes_everyone(dsn: str) -> None:
    signals = Signals(dsn)
    woken, other = threading.Event(), threading.Event()
    signals.subscribe(["Cart"])(woken)
    signals.subscribe(["Order"])(other)
    try:
        assert woken.wait(10) and other.wait(10)  # listening: everyone woken once
        woken.clear(), other.clear()
        assert cut_listener(dsn) == 1
        assert woken.wait(10) and other.wait(10), "the listener did not come back"
        woken.clear(), other.clear()
        signals.written(0, "Cart")
        assert woken.wait(10), "no signal after the reconnect"
        assert not other.is_set()
    finally:
        signals.close()


@pytest.mark.postgres_only("notifications")
async def test_the_asyncio_listener_reconnects_and_wakes_everyone(dsn: str) -> None:
    signals = AsyncSignals(dsn)
    woken, other = asyncio.Event(), asyncio.Event()
    signals.subscribe(["Cart"])(woken)
    signals.subscribe(["Order"])(other)
    try:
        await asyncio.wait_for(asyncio.gather(woken.wait(), other.wait()), 10)
        woken.clear(), other.clear()
        assert await asyncio.to_thread(cut_listener, dsn) == 1
        await asyncio.wait_for(asyncio.gather(woken.wait(), other.wait()), 10)
        woken.clear(), other.clear()
        signals.written(0, "Cart")
        await asyncio.wait_for(woken.wait(), 10)
        assert not other.is_set()
    finally:
        await signals.close()
