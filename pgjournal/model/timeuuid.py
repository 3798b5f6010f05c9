"""TimeUUIDs (RFC 4122 version 1) from the writer's clock, and Cassandra's order over them.

Cassandra orders TimeUUIDs by their 60-bit timestamp (100 ns ticks since 1582-10-15), then by the low
8 bytes compared as *signed* bytes. We keep that order in SQL as two BIGINT columns: ``ts_time`` (the
ticks) and ``ts_lsb`` (the low 8 bytes mapped to a signed 64-bit integer whose order is the signed-byte
order: XOR with ``0x0080808080808080`` turns bytes 1..7 into unsigned order, byte 0 stays signed).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

#: The Unix epoch: the start of every journal (nothing in one is older) and of epoch arithmetic.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Later than any timestamp a journal holds: offsets past it are refused (the cursor arithmetic needs headroom below
#: datetime.max), and a page bounded by nothing reads below it.
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

#: 100 ns ticks between the UUID epoch (1582-10-15) and the Unix epoch.
UUID_EPOCH_OFFSET = 0x01B21DD213814000
TICKS_PER_MS = 10_000
_LSB_FLIP = 0x0080808080808080
_MIN_LSB_BYTES = 0x8080808080808080  # smallest in Cassandra's order
_MAX_LSB_BYTES = 0x7F7F7F7F7F7F7F7F  # largest in Cassandra's order


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def lsb_key(lsb_bytes: int) -> int:
    """The signed 64-bit integer that orders like Cassandra's signed-byte comparison of the low 8 bytes."""
    return _signed64(lsb_bytes ^ _LSB_FLIP)


def lsb_from_key(key: int) -> int:
    return (key & 0xFFFFFFFFFFFFFFFF) ^ _LSB_FLIP


def make_uuid(ticks: int, lsb_bytes: int) -> uuid.UUID:
    """A version 1 UUID with timestamp ``ticks`` and low 8 bytes ``lsb_bytes`` (kept as given)."""
    if not 0 <= ticks < 1 << 60:
        raise ValueError(f"TimeUUID timestamp must be 0..2**60-1 ticks, got {ticks}")
    msb = ((ticks & 0xFFFFFFFF) << 32) | (((ticks >> 32) & 0xFFFF) << 16) | 0x1000 | ((ticks >> 48) & 0x0FFF)
    return uuid.UUID(int=(msb << 64) | (lsb_bytes & 0xFFFFFFFFFFFFFFFF))


def is_time_uuid(value: uuid.UUID) -> bool:
    """Version 1 by its version bits (Cassandra's endOf() UUIDs carry no RFC 4122 variant, so ``.version``
    of Python's ``uuid`` would be ``None`` for them)."""
    return (value.int >> 76) & 0xF == 1


def uuid_ticks(value: uuid.UUID) -> int:
    if not is_time_uuid(value):
        raise ValueError(f"not a time-based (version 1) UUID: {value}")
    return value.time


def order_key(value: uuid.UUID) -> tuple[int, int]:
    """Cassandra's order as a tuple: ``(ticks, signed low bytes)``; these are the ``ts_time, ts_lsb`` columns."""
    return uuid_ticks(value), lsb_key(value.int & 0xFFFFFFFFFFFFFFFF)


def from_key(ticks: int, lsb: int) -> uuid.UUID:
    """Inverse of :func:`order_key`."""
    return make_uuid(ticks, lsb_from_key(lsb))


def compare(a: uuid.UUID, b: uuid.UUID) -> int:
    """-1, 0 or 1 in Cassandra's TimeUUID order."""
    ka, kb = order_key(a), order_key(b)
    return (ka > kb) - (ka < kb)


def ticks_of_ms(epoch_ms: int) -> int:
    return epoch_ms * TICKS_PER_MS + UUID_EPOCH_OFFSET


def ms_of_ticks(ticks: int) -> int:
    return (ticks - UUID_EPOCH_OFFSET) // TICKS_PER_MS


def _epoch_ms(ts: int | datetime) -> int:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise ValueError(f"timestamp must be timezone-aware, got {ts!r}")
        return (ts - EPOCH) // timedelta(milliseconds=1)
    return ts


def start_of(ts: int | datetime) -> uuid.UUID:
    """The smallest TimeUUID (Cassandra order) of the millisecond ``ts`` (epoch ms or aware datetime)."""
    return make_uuid(ticks_of_ms(_epoch_ms(ts)), _MIN_LSB_BYTES)


def end_of(ts: int | datetime) -> uuid.UUID:
    """The largest TimeUUID (Cassandra order) of the millisecond ``ts``."""
    return make_uuid(ticks_of_ms(_epoch_ms(ts) + 1) - 1, _MAX_LSB_BYTES)


def uuid_datetime(value: uuid.UUID) -> datetime:
    """The UUID's time as an aware UTC datetime (microsecond precision)."""
    return EPOCH + timedelta(microseconds=(uuid_ticks(value) - UUID_EPOCH_OFFSET) // 10)


class TimeUUIDGenerator:
    """Version 1 UUIDs from this process's clock: unique and strictly increasing (in Cassandra order).

    The tick is bumped past the previous one when the clock does not advance (or steps back); the low
    bytes (random clock sequence and multicast node id, as RFC 4122 allows) are fixed per process and
    drawn anew after ``fork``.
    """

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        #: Nanoseconds since the Unix epoch (replaceable in tests).
        self.clock = clock
        self._lock = threading.Lock()
        self._last = 0
        self._lsb_bytes = 0
        self.reseed()

    def reseed(self) -> None:
        clock_seq = secrets.randbits(14)
        node = secrets.randbits(48) | (1 << 40)  # multicast bit: not a real MAC address
        self._lsb_bytes = ((0x80 | (clock_seq >> 8)) << 56) | ((clock_seq & 0xFF) << 48) | node
        self._last = 0

    @property
    def lsb_bytes(self) -> int:
        """This process's low 8 bytes (clock sequence and node) as an unsigned integer."""
        return self._lsb_bytes

    @property
    def lsb(self) -> int:
        """This process's low bytes as an order key (the ``ts_lsb`` column)."""
        return lsb_key(self._lsb_bytes)

    def next_ticks(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive ticks; returns the first."""
        now = self.clock() // 100 + UUID_EPOCH_OFFSET
        with self._lock:
            first = now if now > self._last else self._last + 1
            self._last = first + count - 1
        return first

    def next(self) -> uuid.UUID:
        return make_uuid(self.next_ticks(), self._lsb_bytes)


GENERATOR = TimeUUIDGenerator()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GENERATOR.reseed)
