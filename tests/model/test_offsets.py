"""Offsets and their string form: a stable round trip, bare ISO timestamps, clear errors for anything else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pgjournal import InvalidArgument, NoOffset, TimestampOffset
from pgjournal.model.offsets import format_timestamp, parse_offset

pytestmark = pytest.mark.mode_independent

aware = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
)
seen_maps = st.dictionaries(st.text(max_size=30), st.integers(min_value=1, max_value=2**63 - 1), max_size=5)


@given(aware, st.none() | aware, seen_maps)
@example(datetime(2026, 11, 21, 16, 1, 2, 123456, tzinfo=UTC), None, {})
@example(datetime(5, 1, 1, tzinfo=UTC), None, {"Cart|1": 1})
@example(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC), {'a"\\\n\x00é😀': 3})
def test_str_parse_round_trip(ts: datetime, read: datetime | None, seen: dict[str, int]) -> None:
    offset = TimestampOffset(ts, read, seen)
    text = str(offset)
    parsed = TimestampOffset.parse(text)
    assert parsed == offset
    assert parsed.timestamp.tzinfo == UTC and parsed.timestamp == ts
    assert dict(parsed.seen) == seen
    assert str(parsed) == text, "the string form is stable"
    assert parse_offset(text) == offset
    assert hash(parsed) == hash(offset)


def test_string_form_is_readable_json() -> None:
    ts = datetime(2026, 11, 21, 16, 1, 2, 123456, tzinfo=UTC)
    offset = TimestampOffset(ts, ts + timedelta(seconds=1), {"b": 2, "a": 1})
    assert str(offset) == ('{"ts":"2026-11-21T16:01:02.123456Z","read":"2026-11-21T16:01:03.123456Z",'
                           '"seen":{"a":1,"b":2}}')
    assert str(TimestampOffset(ts)) == '{"ts":"2026-11-21T16:01:02.123456Z"}'
    assert format_timestamp(ts.astimezone(timezone(timedelta(hours=2)))) == "2026-11-21T16:01:02.123456Z"


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-21T16:01:02.123456Z", datetime(2026, 11, 21, 16, 1, 2, 123456, tzinfo=UTC)),
    ("2026-11-21T16:01:02Z", datetime(2026, 11, 21, 16, 1, 2, tzinfo=UTC)),
    ("2026-11-21T16:01:02+01:00", datetime(2026, 11, 21, 15, 1, 2, tzinfo=UTC)),
    ("2026-11-21 16:01:02.5z", datetime(2026, 11, 21, 16, 1, 2, 500000, tzinfo=UTC)),
    ("  2026-11-21T16:01:02Z  ", datetime(2026, 11, 21, 16, 1, 2, tzinfo=UTC)),
])
def test_bare_iso_timestamps(text: str, expected: datetime) -> None:
    offset = TimestampOffset.parse(text)
    assert offset.timestamp == expected and offset.timestamp.tzinfo == UTC
    assert offset.read_timestamp is None and dict(offset.seen) == {}
    assert parse_offset(text) == offset


@pytest.mark.parametrize("text", ["", "   ", "none", "None", "NoOffset"])
def test_no_offset(text: str) -> None:
    assert parse_offset(text) is NoOffset
    assert str(NoOffset) == "none" and parse_offset(str(NoOffset)) is NoOffset


@pytest.mark.parametrize(("text", "hint"), [
    ("yesterday", "ISO 8601"),
    ("2026-11-21T16:01:02", "time zone"),
    ("2026-13-01T00:00:00Z", "ISO 8601"),
    ('{"ts":"2026-11-21T16:01:02Z"', "malformed timestamp offset"),
    ('{"seen":{"a":1}}', "malformed timestamp offset"),
    ('{"ts":1}', "ISO 8601"),
    ('{"ts":"2026-11-21T16:01:02Z","seen":{"a":0}}', "sequence numbers >= 1"),
    ('{"ts":"2026-11-21T16:01:02Z","seen":{"a":true}}', "sequence numbers >= 1"),
    ('{"ts":"2026-11-21T16:01:02Z","seen":{"a":"1"}}', "sequence numbers >= 1"),
    ('{"ts":"2026-11-21T16:01:02Z","seen":[["a",1]]}', "sequence numbers >= 1"),
    ('{"ts":"2026-11-21T16:01:02Z","read":"soon"}', "read timestamp"),
    ('{"ts":"2026-11-21T16:01:02Z","extra":1}', "unknown field(s) extra"),
    ("[1, 2]", "ISO 8601"),
])
def test_malformed_strings(text: str, hint: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        TimestampOffset.parse(text)
    message = str(caught.value)
    assert hint in message
    assert repr(text) in message or repr(text.strip()) in message or "ts" in text, message


@pytest.mark.parametrize("value", [None, 17, b"2026-11-21T16:01:02Z", "", "  "])
def test_parse_of_non_strings_and_empty(value: object) -> None:
    with pytest.raises(InvalidArgument, match="offset must be a non-empty string"):
        TimestampOffset.parse(value)  # type: ignore[arg-type]


@given(st.text(max_size=60))
@example('{"ts":"2026-11-21T16:01:02Z","seen":{"a":1}}')
@example("{}")
@example('{"ts":null}')
def test_parse_never_fails_with_anything_but_invalid_argument(text: str) -> None:
    try:
        offset = TimestampOffset.parse(text)
    except InvalidArgument:
        return
    assert TimestampOffset.parse(str(offset)) == offset


def test_parse_offset_rejects_non_strings() -> None:
    with pytest.raises(InvalidArgument):
        parse_offset(17)  # type: ignore[arg-type]


def test_timestamp_offset_checks_and_immutability() -> None:
    with pytest.raises(InvalidArgument, match="timezone-aware datetime"):
        TimestampOffset(datetime(2026, 1, 1))  # naive on purpose
    offset = TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC), seen={"a": 1})
    with pytest.raises(TypeError):
        offset.seen["b"] = 2  # type: ignore[index]
    assert offset == TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC), seen={"a": 1})
    assert offset != TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC), seen={"a": 2})


def test_an_offset_covers_what_lies_before_it_and_what_it_saw_at_its_timestamp() -> None:
    at = datetime(2024, 5, 1, 12, tzinfo=UTC)
    offset = TimestampOffset(at, seen={"a": 3})
    assert offset.covers(at - timedelta(microseconds=1), "z", 99)
    assert offset.covers(at, "a", 3) and offset.covers(at, "a", 1)
    assert not offset.covers(at, "a", 4) and not offset.covers(at, "b", 1)
    assert not offset.covers(at + timedelta(microseconds=1), "a", 1)
    assert not TimestampOffset(at).covers(at, "a", 1)


def test_an_offset_that_settled_less_covers_before_it_only_what_it_names() -> None:
    """``settled``: everything before it consumed; between it and the timestamp exactly what ``seen`` covers."""
    at = datetime(2024, 5, 1, 12, tzinfo=UTC)
    settled = at - timedelta(seconds=5)
    offset = TimestampOffset(at, seen={"a": 3, "b": 7}, settled=settled)
    assert offset.floor == settled
    assert offset.covers(settled - timedelta(microseconds=1), "z", 99)
    assert offset.covers(at - timedelta(seconds=1), "b", 7) and offset.covers(at, "a", 3)
    assert not offset.covers(at - timedelta(seconds=1), "b", 8), "after what it names, a late commit"
    assert not offset.covers(settled, "z", 1), "a persistence id it does not name"
    assert not offset.covers(at + timedelta(microseconds=1), "a", 1)
    assert TimestampOffset.parse(str(offset)) == offset and '"settled":' in str(offset)
    assert offset != TimestampOffset(at, seen={"a": 3, "b": 7})
    # Settled at its timestamp is the plain offset, in one form.
    assert TimestampOffset(at, seen={"a": 3}, settled=at) == TimestampOffset(at, seen={"a": 3})
    assert TimestampOffset(at, settled=at).settled is None
    with pytest.raises(InvalidArgument, match=r"settled \(.*\) must not be after"):
        TimestampOffset(at, settled=at + timedelta(microseconds=1))
    with pytest.raises(InvalidArgument, match="settled must be None or a timezone-aware"):
        TimestampOffset(at, settled=datetime(2024, 5, 1))  # naive on purpose
