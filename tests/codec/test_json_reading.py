"""Reading Jackson JSON payloads: msgspec's parser (``read_json``) gives what ``json.loads`` gives on every document
it accepts, and what it refuses goes to ``json.loads`` for its value or its error, both in the registry
(``decode_json``) and in a by-slice reader's own decoding of plain JSON rows."""

from __future__ import annotations

import gzip
import json
import math
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgjournal import Journal, SerializerRegistry, slice_for_persistence_id
from pgjournal.codec import akka_formats as akka

pytestmark = [pytest.mark.floor, pytest.mark.mode_independent]

#: JSON values of every kind, integers far past 64 bits and floats of every magnitude among them.
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: Numbers as JSON text, not only as Python writes them: long mantissas, exponents past float range.
NUMBERS = st.from_regex(r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,3})?", fullmatch=True)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (``1 == 1.0``, ``0.0 == -0.0`` are not the same here)."""
    return repr(a) == repr(b) and type(a) is type(b)


@given(VALUES, st.booleans(), st.sampled_from(["", " ", "\n\t "]))
def test_read_json_gives_what_json_loads_gives(value: Any, ascii_only: bool, space: str) -> None:
    text = space + json.dumps(value, ensure_ascii=ascii_only) + space
    assert same(akka.read_json(text.encode()), json.loads(text))


@given(NUMBERS)
def test_numbers_read_as_json_loads_reads_them(text: str) -> None:
    expected = json.loads(text)
    try:
        got = akka.read_json(text.encode())
    except akka.REFUSED:
        assert isinstance(expected, float) and math.isinf(expected), text  # out of float range: json.loads's inf
    else:
        assert same(got, expected)
    assert same(akka.decode_json(text.encode()), expected)


@pytest.mark.parametrize("text", [
    "NaN", "[Infinity, -Infinity]", "1e400", '"\\ud800"', '{"a": 1, "a": 2}', "123456789012345678901234567890",
    '{"n": -18446744073709551617}', "[" * 2000 + "]" * 2000,
])
def test_what_read_json_refuses_decode_json_reads_as_json_loads(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except RecursionError:
        with pytest.raises(RecursionError):
            akka.decode_json(text.encode())
        return
    assert same(akka.decode_json(text.encode()), expected) or (text == "NaN" and math.isnan(akka.decode_json(b"NaN")))


@pytest.mark.parametrize("payload", [b"\xef\xbb\xbf{}", b'"\xc3"', b"{", b'"a\x01"', b"\x1f\x8bnot gzip", b""])
def test_what_neither_reads_is_a_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError):
        akka.decode_json(payload)


def test_a_by_slice_reader_decodes_plain_json_rows_as_the_registry_does(journal: Journal, dsn: str) -> None:
    """Rows as Akka writes them, read by the reader's own decoding (plain JSON, no type registered): each event
    is what ``json.loads`` gives, the refused ones (NaN, out of float range, gzip) included."""
    payloads = [b'{"n": 123456789012345678901234567890}', b"NaN", b'{"x": 1e400}', b'{"a": 1} ',
                gzip.compress(b'{"big": "' + b"x" * 40_000 + b'"}'), '{"é": "ü"}'.encode()]
    pid = "Reading|1"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for seq_nr, payload in enumerate(payloads, 1):
            conn.execute(
                "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
                "event_ser_id, event_ser_manifest, event_payload) VALUES (%s, 'Reading', %s, %s, "
                "clock_timestamp() - interval '2 seconds', 'akka', 31, 'com.example.Any', %s)",
                (slice_for_persistence_id(pid), pid, seq_nr, payload))
    events = [e.event for e in journal.query.current_events_by_slices("Reading", 0, 1023)]
    registry = SerializerRegistry()
    assert len(events) == len(payloads)
    for got, payload in zip(events, payloads, strict=True):
        want = json.loads(gzip.decompress(payload) if payload[:2] == b"\x1f\x8b" else payload)
        for value in (got, registry.deserialize(31, "com.example.Any", payload)):
            assert same(value, want) or (math.isnan(value) and math.isnan(want)), (payload[:40], value)
