"""Helpers of the asyncio tests: an AsyncJournal fixture's settings and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from support import FAST, PORTABLE

T = TypeVar("T")
SETTINGS: dict[str, Any] = dict(FAST, portable=PORTABLE)


def connections_to(dsn: str) -> Any:
    """A factory of asyncio connections to ``dsn`` (each borrowed for one step), like a pool's ``connection``."""

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            yield aconn

    return connection


async def eventually(condition: Callable[[], Awaitable[T]], what: str = "", timeout: float = 20.0) -> T:
    """Await ``condition()`` until it is truthy (returned); fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what} (last value {value!r})")
        await asyncio.sleep(0.02)


async def take(iterator: Any, count: int, timeout: float = 20.0) -> list[Any]:
    """The next ``count`` items of an async iterator, within ``timeout`` seconds."""
    out: list[Any] = []
    async with asyncio.timeout(timeout):
        while len(out) < count:
            out.append(await anext(iterator))
    return out


def check_once_in_order(delivered: list[tuple[str, int]], written: set[tuple[str, int]], label: str) -> None:
    """Every written ``(persistence id, seq_nr)`` delivered exactly once, in sequence order per persistence id."""
    assert len(delivered) == len(set(delivered)), f"{label}: duplicates"
    assert set(delivered) == written, (f"{label}: missed {sorted(written - set(delivered))[:5]}, "
                                       f"unexpected {sorted(set(delivered) - written)[:5]}")
    last: dict[str, int] = {}
    for pid, seq_nr in delivered:
        assert seq_nr == last.get(pid, 0) + 1, f"{label}: {pid} {seq_nr} after {last.get(pid, 0)}"
        last[pid] = seq_nr
