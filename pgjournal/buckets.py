"""Time buckets of the tag view (Day, Hour, Minute) and the ``first_time_bucket`` setting.

A bucket is identified by the epoch milliseconds of its start (UTC), as in the Cassandra plugin.
"""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime

import psycopg

from pgjournal.errors import ConfigurationError
from pgjournal.runtime.steps import Step, first_of, run, statement
from pgjournal.store import format as sql


class BucketSize(enum.Enum):
    DAY = 86_400_000
    HOUR = 3_600_000
    MINUTE = 60_000

    @property
    def millis(self) -> int:
        return self.value

    @property
    def label(self) -> str:
        return self.name.capitalize()

    @classmethod
    def parse(cls, text: str | BucketSize) -> BucketSize:
        if isinstance(text, BucketSize):
            return text
        if isinstance(text, str):
            for size in cls:
                if text.strip().lower() == size.name.lower():
                    return size
        raise ConfigurationError(f"tag bucket size must be Day, Hour or Minute, got {text!r}")

    def bucket_of(self, epoch_ms: int) -> int:
        """The start (epoch ms) of the bucket holding ``epoch_ms``."""
        return epoch_ms - epoch_ms % self.value


# yyyyMMdd'T'HH:mm, and the shorter forms yyyyMMdd'T'HH (Hour, Day) and yyyyMMdd (Day).
_FORMS = (
    (re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2}):(\d{2})$"), (BucketSize.DAY, BucketSize.HOUR, BucketSize.MINUTE)),
    (re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})$"), (BucketSize.DAY, BucketSize.HOUR)),
    (re.compile(r"^(\d{4})(\d{2})(\d{2})$"), (BucketSize.DAY,)),
)


def parse_first_time_bucket(text: str, size: BucketSize) -> int:
    """The bucket (epoch ms, UTC) that ``text`` names, rounded down to ``size``.

    ``yyyyMMdd'T'HH:mm`` for every size; Hour and Day buckets also accept ``yyyyMMdd'T'HH``, Day
    buckets ``yyyyMMdd``.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"first_time_bucket must be a string like 20151120T00:00, got {text!r}")
    for pattern, sizes in _FORMS:
        match = pattern.match(text.strip())
        if match is None:
            continue
        if size not in sizes:
            break
        parts = [int(p) for p in match.groups()] + [0, 0]
        year, month, day, hour, minute = parts[:5]
        try:
            start = datetime(year, month, day, hour, minute, tzinfo=UTC)
        except ValueError as exc:
            raise ConfigurationError(f"first_time_bucket {text!r} is not a valid time: {exc}") from None
        return size.bucket_of(int(start.timestamp()) * 1000)
    forms = {BucketSize.MINUTE: "yyyyMMdd'T'HH:mm", BucketSize.HOUR: "yyyyMMdd'T'HH:mm or yyyyMMdd'T'HH",
             BucketSize.DAY: "yyyyMMdd'T'HH:mm, yyyyMMdd'T'HH or yyyyMMdd"}[size]
    raise ConfigurationError(
        f"first_time_bucket must be {forms} (UTC) with {size.label} buckets, for example 20151120T00:00; "
        f"got {text!r}"
    )


def format_bucket(bucket_ms: int) -> str:
    """``yyyyMMdd'T'HH:mm`` of a bucket start, for messages and the CLI."""
    return datetime.fromtimestamp(bucket_ms / 1000, UTC).strftime("%Y%m%dT%H:%M")


# -- the bucket size recorded in the database -------------------------------------------------------------
_SETTING = "bucket_size"


def _mismatch(recorded: str, wanted: BucketSize) -> ConfigurationError:
    return ConfigurationError(
        f"tag_bucket_size is {wanted.label} but this database's tag view was written with {recorded} buckets; "
        f"the bucket size cannot change once tagged events exist: set tag_bucket_size={recorded}"
    )


def check_bucket_size(conn: psycopg.Connection, wanted: str | BucketSize) -> None:
    """Raise :class:`ConfigurationError` when a different bucket size is recorded (nothing recorded: fine)."""
    run(check_bucket_size_step(wanted), conn)


def check_bucket_size_step(wanted: str | BucketSize) -> Step[BucketSize]:
    """:func:`check_bucket_size` as a step (for a blocking or an asyncio connection); returns the size."""
    size = BucketSize.parse(wanted)
    recorded = yield from first_of(sql.tag_setting(_SETTING))
    if recorded is not None and BucketSize.parse(recorded) is not size:
        raise _mismatch(recorded, size)
    return size


def ensure_bucket_size(conn: psycopg.Connection, wanted: str | BucketSize) -> BucketSize:
    """Record ``wanted`` unless a size is recorded already; raise if the recorded one differs."""
    return run(ensure_bucket_size_step(wanted), conn)


def ensure_bucket_size_step(wanted: str | BucketSize) -> Step[BucketSize]:
    """:func:`ensure_bucket_size` as a step."""
    size = BucketSize.parse(wanted)
    yield statement(sql.record_tag_setting(_SETTING, size.label))
    return (yield from check_bucket_size_step(size))
