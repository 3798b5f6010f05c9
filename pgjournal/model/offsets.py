"""Offsets: where a reader is, with a stable string form for storage and the command line."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from pgjournal.errors import InvalidArgument
from pgjournal.validation import load_json

_new = object.__new__
_UUID_FORM = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class _NoOffset:
    """The start of a stream."""

    _instance: _NoOffset | None = None

    def __new__(cls) -> _NoOffset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NoOffset"

    def __str__(self) -> str:
        return "none"

    def __reduce__(self) -> str:
        return "NoOffset"


NoOffset = _NoOffset()


def format_timestamp(ts: datetime) -> str:
    """ISO 8601 in UTC with microseconds and a ``Z``: ``2026-11-21T16:01:02.123456Z``."""
    # isoformat, not strftime: strftime("%Y") does not zero-pad years before 1000, which parse would reject.
    return ts.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_timestamp(text: str, what: str = "timestamp") -> datetime:
    try:
        ts = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        utc = ts.astimezone(UTC) if ts.tzinfo is not None else None
    except (ValueError, AttributeError, OverflowError):
        raise InvalidArgument(f"{what} must be ISO 8601 like 2026-11-21T16:01:02.123456Z, got {text!r}") from None
    if utc is None:
        raise InvalidArgument(f"{what} must carry a time zone (Z or +hh:mm), got {text!r}")
    return utc


@dataclass(frozen=True)
class TimestampOffset:
    """A position in an ``events_by_slices`` stream.

    ``timestamp`` is the ``db_timestamp`` of the last event consumed; ``seen`` holds, for every persistence
    id consumed *at exactly that timestamp*, its sequence number, so resuming skips those and nothing else.
    ``read_timestamp`` is the database clock when the row was read (lag = read - timestamp).

    ``settled`` (``None``: the timestamp itself) is where a reader that reads ahead of what may still commit
    (portable mode: no visibility horizon) had consumed *everything* before; between it and ``timestamp`` it
    consumed exactly the events that ``seen`` covers (per persistence id its number and all before it: the
    reader delivers each persistence id's events in order), so ``seen`` names every persistence id it consumed
    there. An event that commits late below ``timestamp`` but after ``settled`` is not covered, and a query
    resumed from the offset delivers it.
    """

    timestamp: datetime
    read_timestamp: datetime | None = None
    seen: Mapping[str, int] = field(default_factory=dict)
    settled: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.timestamp, datetime) or self.timestamp.tzinfo is None:
            raise InvalidArgument(f"TimestampOffset.timestamp must be a timezone-aware datetime, "
                                  f"got {self.timestamp!r}")
        if self.read_timestamp is not None and (
                not isinstance(self.read_timestamp, datetime) or self.read_timestamp.tzinfo is None):
            raise InvalidArgument(f"TimestampOffset.read_timestamp must be None or a timezone-aware datetime, "
                                  f"got {self.read_timestamp!r}")
        if not isinstance(self.seen, Mapping) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**63
                for k, v in self.seen.items()):
            raise InvalidArgument(f"TimestampOffset.seen must map persistence ids (strings) to sequence numbers "
                                  f">= 1 (and < 2**63), got {self.seen!r}")
        object.__setattr__(self, "seen", MappingProxyType(dict(self.seen)))
        if self.settled is not None:
            if not isinstance(self.settled, datetime) or self.settled.tzinfo is None:
                raise InvalidArgument(f"TimestampOffset.settled must be None or a timezone-aware datetime, "
                                      f"got {self.settled!r}")
            if self.settled > self.timestamp:
                raise InvalidArgument(f"TimestampOffset.settled ({format_timestamp(self.settled)}) must not be after "
                                      f"its timestamp ({format_timestamp(self.timestamp)})")
            if self.settled == self.timestamp:
                object.__setattr__(self, "settled", None)  # the same position, one form

    @classmethod
    def trusted(cls, timestamp: datetime, read_timestamp: datetime | None, seen: Mapping[str, int],
                settled: datetime | None = None) -> TimestampOffset:
        """An offset from values read from the journal (aware timestamps, stored pids and sequence numbers),
        without the checks: a query builds one per envelope, and the checks cost more than the rest of it."""
        return cls.adopted(timestamp, read_timestamp, dict(seen), settled)

    @classmethod
    def adopted(cls, timestamp: datetime, read_timestamp: datetime | None, seen: dict[str, int],
                settled: datetime | None = None) -> TimestampOffset:
        """:meth:`trusted` that keeps ``seen`` itself (behind a read-only view) instead of a copy: for a caller
        that never changes that dict afterwards (the by-slice query makes a new map, never changes one handed
        out). ``settled``: before ``timestamp``, or ``None``."""
        offset = _new(cls)
        # Filled in place: the frozen class's __setattr__ is not on this path (one per envelope read).
        fields = offset.__dict__
        fields["timestamp"], fields["read_timestamp"] = timestamp, read_timestamp
        fields["seen"], fields["settled"] = MappingProxyType(seen), settled
        return offset

    @property
    def floor(self) -> datetime:
        """Everything before this was consumed: ``settled``, or the timestamp."""
        return self.timestamp if self.settled is None else self.settled

    def covers(self, ts: datetime, pid: str, seq_nr: int) -> bool:
        """Whether the event ``(ts, pid, seq_nr)`` lies at or before this offset (a query from it skips it)."""
        return ts < self.floor or (ts <= self.timestamp and seq_nr <= self.seen.get(pid, 0))

    def __str__(self) -> str:
        body: dict[str, Any] = {"ts": format_timestamp(self.timestamp)}
        if self.read_timestamp is not None:
            body["read"] = format_timestamp(self.read_timestamp)
        if self.seen:
            body["seen"] = dict(sorted(self.seen.items()))
        if self.settled is not None:
            body["settled"] = format_timestamp(self.settled)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimestampOffset):
            return NotImplemented
        return (self.timestamp, self.read_timestamp, dict(self.seen), self.settled) == (
            other.timestamp, other.read_timestamp, dict(other.seen), other.settled)

    def __hash__(self) -> int:
        return hash((self.timestamp, self.settled, tuple(sorted(self.seen.items()))))

    @classmethod
    def parse(cls, text: str) -> TimestampOffset:
        """Parse the form ``str()`` produces, or a bare ISO 8601 timestamp (nothing seen at it)."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidArgument(f"offset must be a non-empty string, got {text!r}")
        if not text.lstrip().startswith("{"):
            return cls(parse_timestamp(text, "offset timestamp"))
        try:
            body = load_json(text)
            ts = parse_timestamp(body["ts"], "offset timestamp")
            read = parse_timestamp(body["read"], "offset read timestamp") if "read" in body else None
            settled = parse_timestamp(body["settled"], "offset settled timestamp") if "settled" in body else None
            seen = body.get("seen", {})
            if not isinstance(seen, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**63
                for k, v in seen.items()
            ):
                raise ValueError("seen must map persistence ids to sequence numbers >= 1 (and < 2**63)")
            extra = set(body) - {"ts", "read", "seen", "settled"}
            if extra:
                raise ValueError(f"unknown field(s) {', '.join(sorted(extra))}")
        except InvalidArgument:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            shown = text if len(text) <= 200 else text[:200] + "..."
            raise InvalidArgument(
                f'malformed timestamp offset {shown!r} ({exc}); expected {{"ts":"2026-11-21T16:01:02.123456Z",'
                '"seen":{"pid":1}} or an ISO 8601 timestamp'
            ) from None
        return cls(ts, read, seen, settled)


@dataclass(frozen=True, order=False)
class TimeBasedUUID:
    """A position in an ``events_by_tag`` stream: a version 1 TimeUUID (exclusive: the stream resumes after
    it). Offsets compare in Cassandra's TimeUUID order; the string form is the UUID's."""

    value: uuid.UUID

    def __post_init__(self) -> None:
        if not isinstance(self.value, uuid.UUID) or (self.value.int >> 76) & 0xF != 1:
            raise InvalidArgument(f"TimeBasedUUID needs a version 1 (time-based) UUID, got {self.value!r}")

    def __str__(self) -> str:
        return str(self.value)

    @property
    def key(self) -> tuple[int, int]:
        from pgjournal.model.timeuuid import order_key

        return order_key(self.value)

    def __lt__(self, other: TimeBasedUUID) -> bool:
        return self.key < other.key

    def __le__(self, other: TimeBasedUUID) -> bool:
        return self.key <= other.key

    def __gt__(self, other: TimeBasedUUID) -> bool:
        return self.key > other.key

    def __ge__(self, other: TimeBasedUUID) -> bool:
        return self.key >= other.key

    @classmethod
    def parse(cls, text: str) -> TimeBasedUUID:
        try:
            value = uuid.UUID(text.strip())
        except (ValueError, AttributeError):
            raise InvalidArgument(f"time-based UUID offset must look like 8f14e45f-ceea-11ef-8000-0123456789ab, "
                                  f"got {text!r}") from None
        return cls(value)


Offset = _NoOffset | TimestampOffset | TimeBasedUUID


def parse_offset(text: str) -> Offset:
    """``none`` (or empty) for the start, a UUID for a :class:`TimeBasedUUID`, else a :class:`TimestampOffset`."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "none", "nooffset")):
        return NoOffset
    if not isinstance(text, str):
        raise InvalidArgument(f"offset must be a string, got {type(text).__name__} {text!r}")
    if _UUID_FORM.match(text.strip()):
        return TimeBasedUUID.parse(text)
    return TimestampOffset.parse(text)
