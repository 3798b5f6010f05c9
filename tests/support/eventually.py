"""``eventually(condition)``: wait for a condition instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg.errors

T = TypeVar("T")


def eventually(condition: Callable[[], T], what: str = "", timeout: float = 20.0, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns a truthy value (returned); fail naming ``what`` (default: the
    condition) after ``timeout`` seconds. A read cancelled by a serialization failure counts as "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except psycopg.errors.SerializationFailure:  # SERIALIZABLE (portable test mode) may cancel a read
            value = None  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what or getattr(condition, '__qualname__', condition)} "
                                 f"(last value {value!r})")
        time.sleep(interval)
