"""Slices: a stable hash of the persistence id into 0..1023, bit-exact with Akka's ``sliceForPersistenceId``.

Readers consume slice *ranges*, so a journal can be split between 1, 2, 4 ... 1024 consumers without a
global sequence.
"""

from __future__ import annotations

import functools

from pgjournal.errors import InvalidArgument, InvalidPersistenceId

NUMBER_OF_SLICES = 1024


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as a signed int32."""
    h = 0
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def slice_for_persistence_id(persistence_id: str) -> int:
    """``abs(hashCode % 1024)`` with Java's truncated remainder (the sign follows the dividend)."""
    if not isinstance(persistence_id, str):
        raise InvalidPersistenceId(f"persistence id must be a string, got {type(persistence_id).__name__} "
                                   f"{persistence_id!r}")
    return _slice_of(persistence_id)


@functools.lru_cache(maxsize=65536)
def _slice_of(persistence_id: str) -> int:
    # Cached: the hash is a Python loop over the id's characters, paid on every append and by-pid read.
    # abs(truncated remainder) == abs(h) % n for every int32, Integer.MIN_VALUE included.
    return abs(java_string_hash(persistence_id)) % NUMBER_OF_SLICES


def slice_ranges(n: int) -> list[tuple[int, int]]:
    """Split 0..1023 into ``n`` equal, inclusive ranges; ``n`` must divide 1024."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > NUMBER_OF_SLICES or NUMBER_OF_SLICES % n:
        raise InvalidArgument(
            f"number of slice ranges must be a power of two from 1 to {NUMBER_OF_SLICES} "
            f"(a divisor of {NUMBER_OF_SLICES}), got {n!r}"
        )
    size = NUMBER_OF_SLICES // n
    return [(i * size, i * size + size - 1) for i in range(n)]


def entity_type_of(persistence_id: str) -> str:
    """The text before the first ``|`` of the persistence id, or ``""`` when there is none."""
    if not isinstance(persistence_id, str):
        raise InvalidPersistenceId(f"persistence id must be a string, got {type(persistence_id).__name__} "
                                   f"{persistence_id!r}")
    head, sep, _ = persistence_id.partition("|")
    return head if sep else ""


def check_slice_range(min_slice: int, max_slice: int) -> None:
    """Raise :class:`InvalidArgument` unless ``0 <= min_slice <= max_slice <= 1023``."""
    for name, value in (("min_slice", min_slice), ("max_slice", max_slice)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < NUMBER_OF_SLICES:
            raise InvalidArgument(f"{name} must be an integer from 0 to {NUMBER_OF_SLICES - 1}, got {value!r}")
    if min_slice > max_slice:
        raise InvalidArgument(f"min_slice {min_slice} is greater than max_slice {max_slice}")


def parse_slice_range(text: str) -> tuple[int, int]:
    """Parse ``"0-255"`` (or a single slice ``"17"``) into an inclusive range."""
    if not isinstance(text, str):
        raise InvalidArgument(f"slice range must be a string like 0-255, got {text!r}")
    lo, sep, hi = text.strip().partition("-")
    try:
        bounds = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise InvalidArgument(f"slice range must look like 0-255, got {text!r}") from None
    check_slice_range(*bounds)
    return bounds
