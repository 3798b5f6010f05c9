"""Fuzzing with hypothesis: the public API and the CLI against malformed and hostile input.

The property everywhere: a call either works, or fails with a typed ``JournalError`` (never a raw driver
error, ``TypeError``, ``OverflowError``, ``RecursionError``...), and a failed write leaves nothing behind.
Each test prints how many inputs it tried (``-s``); ``PGJOURNAL_FUZZ_EXAMPLES`` scales them.
"""

from __future__ import annotations

import math
import os
import string
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tags import tags_written
from typer.testing import CliRunner

from pgjournal import Journal, JournalError, NoOffset, TimestampOffset
from pgjournal.cli.commands import app
from pgjournal.model.offsets import TimeBasedUUID, parse_offset
from pgjournal.model.slices import (
    NUMBER_OF_SLICES,
    check_slice_range,
    entity_type_of,
    parse_slice_range,
    slice_for_persistence_id,
    slice_ranges,
)
from pgjournal.validation import check_name, check_persistence_id

pytestmark = pytest.mark.mode_independent

SCALE = float(os.environ.get("PGJOURNAL_FUZZ_EXAMPLES", "1"))


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=max(10, int(examples * SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


HOSTILE = ["'; DROP TABLE event_journal; --", "Robert'); DROP TABLE snapshot;--", "%s", "%(pid)s", "{table}",
           "\x00", "a\x00b", "\ud800", "x" * 256, "x" * 255, "", " ", "|", "||", "Cart|", "|1", "\\", "$$",
           "\u202e", "🎉" * 130, "\r\n", "NaN", "null", "None", "0", "-1"]
texts = st.one_of(st.text(max_size=40), st.text(max_size=300), st.sampled_from(HOSTILE),
                  st.text(alphabet=string.ascii_letters + "|", max_size=12))
not_text = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.text(max_size=3)),
                     st.booleans(), st.just(object()))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.sampled_from(HOSTILE)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
weird_values = st.one_of(json_values, st.binary(max_size=16), st.just(object()), st.sets(st.integers(), max_size=2),
                         st.complex_numbers(), st.just(float("nan")), st.just(10**400), st.just(b"\x00" * 3),
                         st.dictionaries(st.integers(), st.integers(), max_size=2))
seq_numbers = st.one_of(st.none(), st.integers(min_value=-3, max_value=4), st.integers(), st.just(2**63 - 1),
                        st.just(2**63), st.booleans(), st.floats(), st.text(max_size=3))

tally: Counter[str] = Counter()


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    print("\nFUZZ inputs tried: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


def typed(call, what: str):  # type: ignore[no-untyped-def]
    """Run ``call``; return its result, or the JournalError it raised. Anything else fails the test."""
    tally[what] += 1
    try:
        return call()
    except JournalError as exc:
        tally[f"{what} rejected"] += 1
        tally[f"{what} rejected by {type(exc).__name__}"] += 1
        return exc


def rows(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM event_journal), (SELECT count(*) FROM tag_views), "
                           "(SELECT count(*) FROM tag_write_progress)").fetchone()
    assert row is not None
    return row


# -- append ----------------------------------------------------------------------------------------


def mostly(valid: st.SearchStrategy, invalid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid three times in four, so that whole calls get through and their combinations are tried."""
    return st.integers(0, 3).flatmap(lambda i: invalid if i == 0 else valid)


valid_pids = st.builds(lambda t, i: f"{t}|{i}", st.sampled_from(["Cart", "Order", "x' OR 1=1", "%s"]),
                       st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s and _encodable(s)))
valid_tags = st.lists(st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s and _encodable(s)),
                      max_size=3)


@fuzz_settings(300)
@given(pid=mostly(valid_pids, st.one_of(texts, not_text)),
       events=mostly(st.lists(json_values, min_size=1, max_size=4), st.one_of(st.lists(weird_values, max_size=4),
                                                                              weird_values)),
       expected=mostly(st.sampled_from([None, 0]), seq_numbers),
       tags=mostly(valid_tags, st.one_of(st.lists(st.one_of(texts, not_text), max_size=3), texts, not_text)),
       metadata=mostly(st.one_of(st.none(), json_values), weird_values))
def test_append_works_or_fails_typed_and_writes_nothing(journal: Journal, dsn: str, pid, events, expected, tags,
                                                        metadata) -> None:
    tags_written(journal)  # the tag rows of earlier examples, not while this one compares
    before = rows(dsn)
    result = typed(lambda: journal.append(pid, events, expected_seq_nr=expected, tags=tags, metadata=metadata),
                   "append")
    after = rows(dsn)
    if isinstance(result, JournalError):
        assert after == before, f"a failed append wrote something: {result}"
    else:
        assert len(result) == after[0] - before[0]


# -- queries that take names, numbers and offsets ----------------------------------------------------


@fuzz_settings(200)
@given(entity_type=mostly(st.sampled_from(["Cart", "x' OR 1=1", "%s"]), st.one_of(texts, not_text)),
       lo=mostly(st.integers(0, 511), seq_numbers), hi=mostly(st.integers(512, 1023), seq_numbers),
       offset=mostly(st.one_of(st.just(NoOffset), st.builds(
           TimestampOffset, st.datetimes(min_value=datetime(2000, 1, 1), timezones=st.just(UTC)), st.none(),
           st.dictionaries(valid_pids, st.integers(1, 2**63 - 1), max_size=3))), st.one_of(st.none(), texts, not_text)))
def test_slice_queries_work_or_fail_typed(journal: Journal, entity_type, lo, hi, offset) -> None:
    typed(lambda: list(journal.query.current_events_by_slices(entity_type, lo, hi, offset)), "events_by_slices")


@fuzz_settings(200)
@given(pid=mostly(valid_pids, st.one_of(texts, not_text)), lo=mostly(st.integers(0, 3), seq_numbers),
       hi=mostly(st.one_of(st.none(), st.integers(0, 5)), seq_numbers), after=mostly(valid_pids, not_text),
       limit=mostly(st.integers(1, 5), seq_numbers))
def test_pid_queries_work_or_fail_typed(journal: Journal, pid, lo, hi, after, limit) -> None:
    typed(lambda: list(journal.query.current_events_by_persistence_id(pid, lo, hi)), "events_by_persistence_id")
    typed(lambda: journal.highest_seq_nr(pid), "highest_seq_nr")
    typed(lambda: list(journal.query.current_persistence_ids(after, limit)), "persistence_ids")
    typed(lambda: journal.load_snapshot(pid, max_seq_nr=lo), "load_snapshot")
    typed(lambda: journal.query.events_by_persistence_id(pid, lo, hi).close(), "live events_by_persistence_id")


# -- offsets ---------------------------------------------------------------------------------------

seen_maps = st.dictionaries(st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s),
                            st.integers(min_value=1, max_value=2**63 - 1), max_size=4)
# Fixed offsets: with zoneinfo zones, Python compares an ambiguous local time (DST fold) unequal to the same
# instant in UTC (PEP 495), which says nothing about offsets.
aware = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                     timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                                                timezone(-timedelta(hours=11)), timezone(timedelta(hours=14))]))


@fuzz_settings(1500)
@given(ts=aware, read=st.one_of(st.none(), aware), seen=seen_maps)
def test_timestamp_offsets_round_trip_through_their_string_form(ts, read, seen) -> None:
    try:
        offset = TimestampOffset(ts, read, seen)
    except JournalError:
        return
    tally["offset round trip"] += 1
    text = str(offset)
    parsed = parse_offset(text)
    assert parsed == offset and parsed.timestamp == ts
    assert str(parsed) == text


offset_texts = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["{", "}", "{}", "[]", "null", '{"ts":1}', '{"ts":null}', '{"ts":"2026-01-01T00:00:00Z",'
                     '"seen":[]}', '{"ts":"2026-01-01T00:00:00Z","seen":{"p":0}}', '{"ts":"2026-01-01T00:00:00Z",'
                     '"seen":{"p":true}}', '{"ts":"2026-01-01T00:00:00Z","x":1}', "0001-01-01T00:00:00+01:00",
                     "9999-12-31T23:59:59-01:00", "2026-01-01T00:00:00", "2026-01-01", "none", "NoOffset",
                     '{"ts":"2026-01-01T00:00:00Z","seen":{"p":99999999999999999999}}',
                     '{"ts":"2026-01-01T00:00:00Z","seen":{"a\\u0000b":1}}',
                     '{"ts":"2026-01-01T00:00:00Z","seen":{"\\ud800":1}}',
                     '{"ts":"2026-01-01T00:00:00Z","seen":{"p":1e999}}',
                     '{"ts":' + "[" * 50_000 + "]" * 50_000 + "}",
                     "8f14e45f-ceea-11ef-8000-0123456789ab", "8f14e45f-ceea-41ef-8000-0123456789ab",
                     "00000000-0000-1000-0000-000000000000"]),
    st.builds(lambda ts, s: '{"ts":"' + ts + '"' + s + "}", st.text(max_size=30),
              st.sampled_from(["", ',"seen":{}', ',"read":"x"', ',"seen":{"p":-1}'])),
    st.uuids().map(str),
    # Well-formed ones (str of a real offset, then perhaps a seen value pushed out of range): they must parse
    # and, as start offsets, run.
    st.builds(lambda ts, seen, bump: str(TimestampOffset(ts, None, seen)).replace(":1}", f":{bump}}}"),
              st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
              st.dictionaries(st.text(min_size=1, max_size=8, alphabet=string.ascii_letters + "|'%"),
                              st.integers(1, 3), max_size=3),
              st.sampled_from([1, 2, 2**63 - 1, 2**63, 0, -1])),
)


@fuzz_settings(2000)
@given(text=st.one_of(offset_texts, not_text))
def test_offset_parsing_returns_an_offset_or_a_typed_error(text) -> None:
    result = typed(lambda: parse_offset(text), "parse_offset")
    if isinstance(result, TimestampOffset):
        assert result.timestamp.tzinfo is not None
        assert all(isinstance(k, str) and 1 <= v < 2**63 for k, v in result.seen.items())
        assert parse_offset(str(result)) == result
    elif isinstance(result, TimeBasedUUID):
        assert parse_offset(str(result)) == result


@fuzz_settings(150)
@given(text=offset_texts)
def test_parsed_offsets_are_usable_in_a_query(journal: Journal, text: str) -> None:
    """An offset that parses must run: no driver error from values the parser let through."""
    try:
        offset = parse_offset(text)
    except JournalError:
        return
    if isinstance(offset, TimeBasedUUID):
        return
    typed(lambda: list(journal.query.current_events_by_slices("Cart", 0, 1023, offset)), "query from offset")


@pytest.mark.parametrize("year", [1, 9999])
def test_extreme_start_offsets_are_typed(journal: Journal, year: int) -> None:
    start = TimestampOffset(datetime(year, 1, 1, tzinfo=UTC))
    typed(lambda: list(journal.query.current_events_by_slices("Cart", 0, 1023, start)), "far offsets")


@pytest.mark.parametrize("key", ["a\\u0000b", "\\ud800"])
def test_unstorable_seen_key_is_typed(journal: Journal, key: str) -> None:
    offset = parse_offset('{"ts":"2026-01-01T00:00:00Z","seen":{"' + key + '":1}}')
    typed(lambda: list(journal.query.current_events_by_slices("Cart", 0, 1023, offset)), "bad seen key")


# -- slices, names ---------------------------------------------------------------------------------


def reference_slice(pid: str) -> int:
    """An independent transcription of Akka: Java's String.hashCode, then Math.abs(h % 1024)."""
    h = 0
    for unit in memoryview(pid.encode("utf-16-le", "surrogatepass")).cast("H"):
        h = (h * 31 + unit) % 2**32
    signed = h - 2**32 if h >= 2**31 else h
    return abs(int(math.fmod(signed, NUMBER_OF_SLICES)))


@fuzz_settings(3000)
@given(pid=st.one_of(st.text(), st.text(alphabet=st.characters(min_codepoint=0x10000), max_size=20),
                     st.sampled_from(HOSTILE)))
def test_slice_of_any_string_is_akkas_and_in_range(pid: str) -> None:
    tally["slice_for_persistence_id"] += 1
    s = slice_for_persistence_id(pid)
    assert 0 <= s < NUMBER_OF_SLICES and s == reference_slice(pid)
    assert entity_type_of(pid) == (pid.split("|", 1)[0] if "|" in pid else "")


@fuzz_settings(1000)
@given(n=st.one_of(st.integers(-5, 2048), st.integers(), not_text), text=st.one_of(st.text(max_size=12), not_text),
       lo=seq_numbers, hi=seq_numbers)
def test_slice_functions_return_ranges_or_fail_typed(n, text, lo, hi) -> None:
    ranges = typed(lambda: slice_ranges(n), "slice_ranges")
    if not isinstance(ranges, JournalError):
        covered = [s for a, b in ranges for s in range(a, b + 1)]
        assert covered == list(range(NUMBER_OF_SLICES)) and len(ranges) == n
    parsed = typed(lambda: parse_slice_range(text), "parse_slice_range")
    if not isinstance(parsed, JournalError):
        assert 0 <= parsed[0] <= parsed[1] < NUMBER_OF_SLICES
    typed(lambda: check_slice_range(lo, hi), "check_slice_range")


@fuzz_settings(1000)
@given(value=st.one_of(texts, not_text))
def test_names_are_accepted_only_when_storable(value) -> None:
    for what, check in (("tag", lambda v: check_name(v, "tag")), ("persistence id", check_persistence_id)):
        result = typed(lambda check=check: check(value), f"check {what}")
        if not isinstance(result, JournalError):
            assert isinstance(result, str) and 0 < len(result) <= 255 and "\x00" not in result
            result.encode("utf-8")


# -- the CLI ---------------------------------------------------------------------------------------

cli_words = st.one_of(texts, st.sampled_from(["--from", "--to", "--slices", "--current", "--tag", "--limit", "--after",
                                              "--expected-seq-nr", "-1", "0", "1023", "0-1023", "5-2", "1e3", "--",
                                              "-f", "--help", "{}", '"x"', "[1,", "Cart|1", "Cart"]))
commands = st.sampled_from([["append"], ["events"], ["tail"], ["slices"], ["persistence-ids"], ["tags", "events"],
                            ["tags", "of"], ["cleanup", "events"], ["verify"], ["roles", "--sql"], ["info"]])


@fuzz_settings(150)
@given(command=commands, args=st.lists(cli_words, max_size=5))
def test_the_cli_never_shows_a_traceback_and_writes_nothing_when_it_fails(dsn: str, command: list[str],
                                                                          args: list[str]) -> None:
    argv = [*command, *args]
    options = args[:args.index("--")] if "--" in args else args  # after a "--", words are arguments, not options
    if command[0] in ("events", "tail", "tags") and "--current" not in options and command != ["tags", "of"]:
        argv = [a for a in argv if a not in ("-f", "--follow")]
        if command[0] == "tail":  # before the generated words, so that a "--" among them cannot make it an argument
            argv.insert(len(command), "--current")
    before = rows(dsn)
    tally["cli"] += 1
    # --dsn first (an argument after "--" would not be an option) and in the environment: never the default server.
    result = CliRunner().invoke(app, [*command, "--dsn", dsn, *argv[len(command):]], env={"PGJOURNAL_DSN": dsn},
                                catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, repr(result.exception))
    assert "Traceback" not in result.output, argv
    assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.output)
    if result.exit_code != 0:
        tally["cli rejected"] += 1
        assert rows(dsn) == before, argv


def test_timestamps_a_decade_ahead_give_nothing(journal: Journal) -> None:
    ahead = TimestampOffset(datetime.now(UTC) + timedelta(days=3650))
    assert list(journal.query.current_events_by_slices("Cart", 0, 1023, ahead)) == []
