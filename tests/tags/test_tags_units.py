"""TimeUUID order (Cassandra's), start_of/end_of, buckets, first_time_bucket parsing, TimeBasedUUID offsets, the
batched tag writer's bookkeeping."""

from __future__ import annotations

import itertools
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from pgjournal import ConfigurationError, InvalidArgument, Settings
from pgjournal.buckets import BucketSize, format_bucket, parse_first_time_bucket
from pgjournal.model.offsets import NoOffset, TimeBasedUUID, parse_offset
from pgjournal.model.timeuuid import (
    TimeUUIDGenerator,
    compare,
    end_of,
    from_key,
    is_time_uuid,
    make_uuid,
    order_key,
    start_of,
    uuid_datetime,
)
from pgjournal.write.tag_batch import TagBatch


def cassandra_compare(a: uuid.UUID, b: uuid.UUID) -> int:
    """Cassandra's TimeUUIDType comparison written out the slow way: timestamp, then signed bytes 8..15."""
    if a.time != b.time:
        return -1 if a.time < b.time else 1
    sa = [x - 256 if x > 127 else x for x in a.bytes[8:]]
    sb = [x - 256 if x > 127 else x for x in b.bytes[8:]]
    return (sa > sb) - (sa < sb)


# (smaller, larger) in Cassandra's order.
VECTORS = [
    # time_low compares after time_hi/time_mid: bytewise UUID order would say the opposite.
    ("ffffffff-0000-1000-8000-000000000000", "00000000-0001-1000-8000-000000000000"),
    ("00000000-ffff-1000-8000-000000000000", "00000000-0000-1001-8000-000000000000"),
    # same timestamp: low bytes as *signed* bytes, 0x80 (-128) < 0x7f (127), though 0x80 > 0x7f unsigned
    ("00000001-0000-1000-8000-000000000000", "00000001-0000-1000-7f00-000000000000"),
    ("00000001-0000-1000-0080-000000000000", "00000001-0000-1000-007f-000000000000"),
    ("00000001-0000-1000-8080-808080808080", "00000001-0000-1000-8080-808080808081"),
    ("00000001-0000-1000-0000-0000000000ff", "00000001-0000-1000-0000-000000000000"),
    # timestamp first: a larger low part never outranks a later time
    ("00000001-0000-1000-7f7f-7f7f7f7f7f7f", "00000002-0000-1000-8080-808080808080"),
]


@pytest.mark.parametrize(("smaller", "larger"), VECTORS)
def test_time_uuid_order_vectors(smaller: str, larger: str) -> None:
    a, b = uuid.UUID(smaller), uuid.UUID(larger)
    assert cassandra_compare(a, b) == -1
    assert compare(a, b) == -1 and compare(b, a) == 1 and compare(a, a) == 0
    assert order_key(a) < order_key(b)
    assert TimeBasedUUID(a) < TimeBasedUUID(b)


def test_order_key_agrees_with_cassandra_on_random_uuids() -> None:
    rng = random.Random(7)
    values = [make_uuid(rng.choice([5, 6, rng.getrandbits(60)]), rng.getrandbits(64)) for _ in range(2000)]
    for a, b in itertools.pairwise(values):
        assert compare(a, b) == cassandra_compare(a, b)
        assert from_key(*order_key(a)) == a


def test_start_of_and_end_of_match_the_cassandra_driver() -> None:
    # Values of the DataStax driver's UUIDs.startOf(0) / endOf(0).
    assert start_of(0) == uuid.UUID("13814000-1dd2-11b2-8080-808080808080")
    assert end_of(0) == uuid.UUID("1381670f-1dd2-11b2-7f7f-7f7f7f7f7f7f")
    ms = 1_795_277_520_123
    generated = make_uuid(start_of(ms).time + 5000, 0x9A3B_0123_4567_89AB)
    assert compare(start_of(ms), generated) == -1 and compare(generated, end_of(ms)) == -1
    assert compare(end_of(ms - 1), start_of(ms)) == -1
    assert uuid_datetime(start_of(ms)) == datetime.fromtimestamp(ms / 1000, UTC)
    assert start_of(datetime.fromtimestamp(ms / 1000, UTC)) == start_of(ms)
    assert is_time_uuid(end_of(ms)) and TimeBasedUUID(end_of(ms)).key == order_key(end_of(ms))


def test_generator_is_unique_and_increasing_across_threads() -> None:
    gen = TimeUUIDGenerator()
    out: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        out[i].extend(gen.next() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for values in out:
        assert all(compare(a, b) == -1 for a, b in itertools.pairwise(values))
        assert all(v.version == 1 for v in values)
    assert len({v for values in out for v in values}) == 20000


@pytest.mark.parametrize(("text", "size", "expected"), [
    ("20151120T00:00", BucketSize.HOUR, "20151120T00:00"),
    ("20151120T13:47", BucketSize.MINUTE, "20151120T13:47"),
    ("20151120T13:47", BucketSize.HOUR, "20151120T13:00"),
    ("20151120T13:47", BucketSize.DAY, "20151120T00:00"),
    ("20151120T13", BucketSize.HOUR, "20151120T13:00"),
    ("20151120T13", BucketSize.DAY, "20151120T00:00"),
    ("20151120", BucketSize.DAY, "20151120T00:00"),
    (" 20240229T23:59 ", BucketSize.MINUTE, "20240229T23:59"),
])
def test_first_time_bucket_parsing(text: str, size: BucketSize, expected: str) -> None:
    bucket = parse_first_time_bucket(text, size)
    assert format_bucket(bucket) == expected
    assert bucket % size.millis == 0


@pytest.mark.parametrize(("text", "size"), [
    ("20151120T13", BucketSize.MINUTE),  # short forms need a bucket at least that coarse
    ("20151120", BucketSize.HOUR),
    ("2015-11-20T00:00", BucketSize.HOUR),
    ("20151320T00:00", BucketSize.HOUR),  # month 13
    ("20151120T24:00", BucketSize.HOUR),
    ("", BucketSize.DAY),
])
def test_first_time_bucket_rejects(text: str, size: BucketSize) -> None:
    with pytest.raises(ConfigurationError, match="first_time_bucket"):
        parse_first_time_bucket(text, size)


def test_bucket_of_boundaries() -> None:
    minute = BucketSize.MINUTE
    assert minute.bucket_of(59_999) == 0 and minute.bucket_of(60_000) == 60_000
    assert BucketSize.DAY.bucket_of(86_400_000 * 3 + 5) == 86_400_000 * 3
    assert BucketSize.parse("minute") is minute and BucketSize.parse("Day") is BucketSize.DAY


def test_tag_settings_validation() -> None:
    with pytest.raises(ConfigurationError, match="Day, Hour or Minute"):
        Settings.load(tag_bucket_size="Week")
    with pytest.raises(ConfigurationError, match="tag_back_track_long_period"):
        Settings.load(tag_back_track_long_period="forever")
    with pytest.raises(ConfigurationError, match="tag_gap_timeout"):
        Settings.load(tag_gap_timeout=-1)
    assert Settings.load(tag_back_track_long_period="max").tag_back_track_long_period_seconds is None
    assert Settings.load(tag_back_track_long_period=30).tag_back_track_long_period_seconds == 30.0


def test_time_based_uuid_offset_string_form() -> None:
    value = make_uuid(start_of(1_795_277_520_000).time, 0x8123_4567_89AB_CDEF)
    offset = TimeBasedUUID(value)
    assert str(offset) == str(value)
    assert TimeBasedUUID.parse(str(offset)) == offset
    assert parse_offset(str(offset)) == offset
    assert parse_offset("none") is NoOffset
    with pytest.raises(InvalidArgument, match="time-based"):
        TimeBasedUUID(uuid.uuid4())
    with pytest.raises(InvalidArgument, match="time-based UUID offset"):
        TimeBasedUUID.parse("not-a-uuid")


def test_the_batch_bound_stays_at_the_oldest_pending_event_when_appends_report_out_of_order() -> None:
    """Two appends to one persistence id take turns, but report after their turn: the later may report first.
    The pending entry keeps the older time, so the watermark never passes the older event before its row."""
    batch = TagBatch("key", "writer", limit=500)
    older = datetime(2026, 1, 1, tzinfo=UTC)
    first, second = batch.begin(), batch.begin()
    batch.written(second, "Cart|a", 3, ["x"], [(2, older + timedelta(seconds=1))])
    batch.written(first, "Cart|a", 3, ["y"], [(1, older)])
    assert batch.bound() == older
    [entry] = batch.take()
    assert (entry.upto, entry.count, entry.tags, entry.since) == (2, 2, {"x", "y"}, older)
