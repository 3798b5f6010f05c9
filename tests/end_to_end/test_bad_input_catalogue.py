"""The bad-input catalogue: named bad inputs through the public API and the CLI.

For every entry: the failure is a typed ``JournalError`` (the class the entry names, with a message that
names the value or the rule), never a raw driver error; at the CLI a one-line message, exit 1 (or 2 for
what the argument parser refuses), no traceback; and nothing is written, checked across every table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from support import FAST
from support.database import FreshDatabases
from support.tags import tags_written
from typer.testing import CliRunner

from pgjournal import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    EventNotFound,
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    JournalError,
    RevisionConflict,
    SchemaNotMigrated,
    SerializationError,
    Settings,
    TimestampOffset,
    entity_type_of,
    slice_for_persistence_id,
    slice_ranges,
)
from pgjournal.admin.cleanup import JournalCleanup
from pgjournal.admin.roles import role_script
from pgjournal.cli.commands import app
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import Transcoder
from pgjournal.model.offsets import TimeBasedUUID, parse_offset
from pgjournal.projections.examples import counter_writer
from pgjournal.projections.handlers import Projection
from pgjournal.projections.runner import run_range
from pgjournal.projections.workers import Worker
from pgjournal.query.firehose import Firehose
from pgjournal.state.keystore import AesGcmKeyWrapper, InMemoryKeyStore
from pgjournal.tags.reconciliation import Reconciliation

pytestmark = pytest.mark.mode_independent

PID = "Cart|1"


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@dataclasses.dataclass
class LongManifest:
    n: int


def long_manifest_journal(dsn: str) -> Journal:
    registry = SerializerRegistry()
    registry.register(LongManifest, "M" * 300)
    return Journal.open(dsn, serializers=registry)


Call = Callable[[Journal], Any]
# (name, call, expected error class, fragment of the message)
API: list[tuple[str, Call, type[JournalError], str]] = [
    ("empty persistence id", lambda j: j.append("", ["e"]), InvalidPersistenceId, "must not be empty"),
    ("persistence id of 256 characters", lambda j: j.append("C|" + "x" * 254, ["e"]), InvalidPersistenceId,
     "at most 255 characters, got 256"),
    ("NUL in persistence id", lambda j: j.append("Cart|a\x00", ["e"]), InvalidPersistenceId, "NUL"),
    ("lone surrogate in persistence id", lambda j: j.append("Cart|\udc00", ["e"]), InvalidPersistenceId,
     "surrogates"),
    ("persistence id not a string", lambda j: j.append(42, ["e"]), InvalidPersistenceId, "got int 42"),
    ("persistence id None", lambda j: j.append(None, ["e"]), InvalidPersistenceId, "got NoneType"),
    ("events given as one string", lambda j: j.append(PID, "event"), InvalidArgument, "wrap it in a list"),
    ("events given as one dict", lambda j: j.append(PID, {"a": 1}), InvalidArgument, "wrap it in a list"),
    ("events not iterable", lambda j: j.append(PID, 5), InvalidArgument, "got int"),
    ("event not serializable", lambda j: j.append(PID, [object()]), SerializationError, "cannot serialize object"),
    ("event is a set", lambda j: j.append(PID, [{1, 2}]), SerializationError, "cannot serialize set"),
    ("event with NaN", lambda j: j.append(PID, [{"x": float("nan")}]), SerializationError, "finite float"),
    ("event nested 100,000 deep", lambda j: j.append(PID, [nested(100_000)]), SerializationError,
     "nested too deeply"),
    ("second event of a batch bad", lambda j: j.append(PID, ["ok", object()]), SerializationError,
     "cannot serialize"),
    ("metadata not serializable", lambda j: j.append(PID, ["e"], metadata=object()), SerializationError,
     "cannot serialize"),
    ("expected_seq_nr negative", lambda j: j.append(PID, ["e"], expected_seq_nr=-1), InvalidArgument,
     "expected_seq_nr must be an integer from 0"),
    ("expected_seq_nr 2**63", lambda j: j.append(PID, ["e"], expected_seq_nr=2**63), InvalidArgument, "2**63-1"),
    ("expected_seq_nr a bool", lambda j: j.append(PID, ["e"], expected_seq_nr=True), InvalidArgument, "got True"),
    ("expected_seq_nr a string", lambda j: j.append(PID, ["e"], expected_seq_nr="0"), InvalidArgument, "got '0'"),
    ("expected_seq_nr a float", lambda j: j.append(PID, ["e"], expected_seq_nr=0.0), InvalidArgument, "got 0.0"),
    ("expected_seq_nr ahead of the journal", lambda j: j.append(PID, ["e"], expected_seq_nr=5), ConcurrencyConflict,
     "expected the highest sequence number to be 5"),
    ("expected_seq_nr stale", lambda j: j.append("Cart|seeded", ["e"], expected_seq_nr=0), ConcurrencyConflict,
     "but it is 2"),
    ("tags given as one string", lambda j: j.append(PID, ["e"], tags="t"), InvalidArgument, "not a single string"),
    ("empty tag", lambda j: j.append(PID, ["e"], tags=[""]), InvalidArgument, "tag must be a non-empty string"),
    ("tag of 256 characters", lambda j: j.append(PID, ["e"], tags=["t" * 256]), InvalidArgument, "at most 255"),
    ("NUL in tag", lambda j: j.append(PID, ["e"], tags=["a\x00"]), InvalidArgument, "without NUL"),
    ("tag not a string", lambda j: j.append(PID, ["e"], tags=[7]), InvalidArgument, "got 7"),
    ("tags None", lambda j: j.append(PID, ["e"], tags=None), InvalidArgument, "collection of strings"),
    ("tag a list", lambda j: j.append(PID, ["e"], tags=["a", ["b"]]), InvalidArgument, "got ['b']"),
    ("manifest longer than the column", lambda j: long_manifest_journal(j.dsn), SerializationError,
     "manifest must be a non-empty string of at most 255 characters without NUL, got 'MMMM"),
    ("manifest that overflows with its version", lambda j: SerializerRegistry().register(
        LongManifest, "M" * 253, version=10), SerializationError, "at most 252 characters"),
    ("tag rebuild of tags given as one string", lambda j: Reconciliation(j).rebuild("Cart|seeded", tags="cart"),
     InvalidArgument, "not a single string 'cart'"),
    ("writer id with a lone surrogate", lambda j: Journal.open(j.dsn, writer_id="w\udcff"), ConfigurationError,
     "setting writer_id must be valid Unicode (no lone surrogates), got 'w\\udcff'"),
    ("writer id of 256 characters", lambda j: Journal.open(j.dsn, writer_id="w" * 256), ConfigurationError,
     "setting writer_id must be a non-empty string of at most 255"),
    ("worker renew interval a string", lambda j: Worker(j, Projection("p", "Cart", counter_writer("p")),
                                                        renew_interval="fast"), InvalidArgument,
     "lease renew_interval must be a number of seconds > 0, got 'fast'"),
    ("worker lease duration NaN", lambda j: Worker(j, Projection("p", "Cart", counter_writer("p")),
                                                   lease_duration=float("nan")), InvalidArgument,
     "lease duration must be a number of seconds > 0, got nan"),
    ("min_slice above max_slice", lambda j: list(j.query.current_events_by_slices("Cart", 9, 3)), InvalidArgument,
     "min_slice 9 is greater than max_slice 3"),
    ("slice 1024", lambda j: list(j.query.current_events_by_slices("Cart", 0, 1024)), InvalidArgument,
     "max_slice must be an integer from 0 to 1023"),
    ("negative slice", lambda j: j.query.events_by_slices("Cart", -1, 3), InvalidArgument, "min_slice"),
    ("NUL in entity type", lambda j: list(j.query.current_events_by_slices("Ca\x00rt", 0, 3)), InvalidArgument,
     "entity type"),
    ("tag offset for a slice query", lambda j: list(j.query.current_events_by_slices(
        "Cart", 0, 3, TimeBasedUUID.parse("8f14e45f-ceea-11ef-8000-0123456789ab"))), InvalidArgument,
     "NoOffset or a TimestampOffset"),
    ("offset that is not a time", lambda j: parse_offset("yesterday"), InvalidArgument, "ISO 8601"),
    ("offset with a negative seen seq nr", lambda j: parse_offset('{"ts":"2026-01-01T00:00:00Z","seen":{"p":-1}}'),
     InvalidArgument, "sequence numbers >= 1"),
    ("offset beyond datetime", lambda j: parse_offset("0001-01-01T00:00:00+01:00"), InvalidArgument, "ISO 8601"),
    ("offset JSON nested 50,000 deep", lambda j: parse_offset('{"ts":' + "[" * 50_000 + "]" * 50_000 + "}"),
     InvalidArgument, "malformed timestamp offset"),
    ("naive offset timestamp", lambda j: TimestampOffset(datetime(2026, 1, 1)), InvalidArgument, "timezone-aware"),
    ("version 4 UUID as tag offset", lambda j: parse_offset("8f14e45f-ceea-41ef-8000-0123456789ab"),
     InvalidArgument, "version 1"),
    ("3 slice ranges", lambda j: slice_ranges(3), InvalidArgument, "divisor of 1024"),
    ("0 slice ranges", lambda j: slice_ranges(0), InvalidArgument, "got 0"),
    ("from_seq_nr negative", lambda j: list(j.query.current_events_by_persistence_id(PID, -1)), InvalidArgument,
     "from_seq_nr"),
    ("persistence ids limit 0", lambda j: list(j.query.current_persistence_ids(limit=0)), InvalidArgument,
     "limit must be a positive integer"),
    ("delete events to -1", lambda j: j.delete_events(PID, -1), InvalidArgument, "to_seq_nr"),
    ("snapshot at seq nr 0", lambda j: j.save_snapshot(PID, 0, {"s": 1}), InvalidArgument, "seq_nr must be"),
    ("snapshot not serializable", lambda j: j.save_snapshot(PID, 1, object()), SerializationError,
     "cannot serialize"),
    ("load snapshot max_seq_nr a string", lambda j: j.load_snapshot(PID, max_seq_nr="x"), InvalidArgument,
     "max_seq_nr"),
    ("unknown setting", lambda j: Settings.load(bufer_size=3), ConfigurationError, "unknown setting(s) bufer_size"),
    ("buffer size 0", lambda j: Settings.load(buffer_size=0), ConfigurationError, "buffer_size must be a positive"),
    ("unknown dialect", lambda j: Settings.load(dialect="oracle"), ConfigurationError, "oracle"),
    ("refresh interval 0", lambda j: Settings.load(refresh_interval=0), ConfigurationError, "refresh_interval"),
    ("writer id of 300 characters", lambda j: Settings.load(writer_id="w" * 300), ConfigurationError, "writer_id"),
    ("malformed DSN", lambda j: Journal.open("postgresql://u:pw@[::1/db"), ConfigurationError, "malformed DSN"),
    ("unreachable server", lambda j: Journal.open("postgresql://u@127.0.0.1:1/db", connect_timeout=1),
     DatabaseUnavailable, "cannot connect"),
    ("empty projection name", lambda j: Projection("", "Cart", counter_writer("x")), InvalidArgument,
     "projection name"),
    ("role name that injects", lambda j: role_script(reader='r"; DROP ROLE postgres; --'), ConfigurationError,
     "role name must be"),
    ("infinite refresh interval", lambda j: Settings.load(refresh_interval=float("inf")), ConfigurationError,
     "refresh_interval must be a number of seconds from 0 to 86,400, got inf"),
    ("connect timeout of a year", lambda j: Settings.load(connect_timeout=365 * 86_400), ConfigurationError,
     "connect_timeout"),
    ("portable given as a string", lambda j: Settings.load(portable="yes"), ConfigurationError,
     "portable must be true or false, got 'yes'"),
    ("notify given as a number", lambda j: Settings.load(notify=3), ConfigurationError, "notify must be true"),
    ("pipeline given as a string", lambda j: Settings.load(pipeline="off"), ConfigurationError,
     "pipeline must be true or false, got 'off'"),
    ("serializers not a registry", lambda j: Journal.open(j.dsn, serializers={}), ConfigurationError,
     "serializers must be a SerializerRegistry, got dict"),
    ("migrate given as a string", lambda j: Journal.open(j.dsn, migrate="yes"), ConfigurationError,
     "migrate must be True or False"),
    ("offset seen not a mapping", lambda j: TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC), seen=[1]),
     InvalidArgument, "seen must map persistence ids"),
    ("offset seen seq nr a string", lambda j: TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC), seen={"p": "1"}),
     InvalidArgument, "sequence numbers >= 1"),
    ("offset read timestamp a string", lambda j: TimestampOffset(datetime(2026, 1, 1, tzinfo=UTC),
                                                                 read_timestamp="now"),
     InvalidArgument, "read_timestamp must be None or a timezone-aware datetime"),
    ("slice of a number", lambda j: slice_for_persistence_id(42), InvalidPersistenceId, "got int 42"),
    ("serializer for something not a class", lambda j: SerializerRegistry().register(5, "x"), SerializationError,
     "register takes a class"),
    ("projection range backwards", lambda j: run_range(j, Projection("p", "Cart", counter_writer("p")), 5, 2),
     InvalidArgument, "min_slice 5 is greater than max_slice 2"),
    ("projection range past 1023", lambda j: run_range(j, Projection("p", "Cart", counter_writer("p")), 0, 1024),
     InvalidArgument, "max_slice must be an integer from 0 to 1023"),
    ("projection not a Projection", lambda j: run_range(j, counter_writer("p"), 0, 3), InvalidArgument,
     "projection must be a Projection"),
    ("entity type of None", lambda j: entity_type_of(None), InvalidPersistenceId, "got NoneType"),
    # issue 20: lookups, durable state, upcasting, events from snapshots
    ("load a missing event", lambda j: j.query.load_envelope("Cart|seeded", 3), EventNotFound,
     "no event at sequence number 3 of persistence id 'Cart|seeded'"),
    ("timestamp of seq nr 0", lambda j: j.query.timestamp_of(PID, 0), InvalidArgument, "seq_nr must be"),
    ("persistence ids of an entity type with NUL", lambda j: list(j.query.current_persistence_ids(entity_type="a\x00")),
     InvalidArgument, "entity type"),
    ("state at revision 0", lambda j: j.durable_state.upsert(PID, 0, "s"), InvalidArgument, "revision must be"),
    ("state first written at revision 2", lambda j: j.durable_state.upsert(PID, 2, "s"), RevisionConflict,
     "expected the current revision to be 1 but it is 0"),
    ("state not serializable", lambda j: j.durable_state.upsert(PID, 1, object()), SerializationError,
     "cannot serialize"),
    ("state deleted skipping revisions", lambda j: j.durable_state.delete(PID, 3), RevisionConflict, "revision 3"),
    ("state changes from a string offset", lambda j: list(j.durable_state.current_changes_by_slices(
        "Cart", 0, 1023, "2026-01-01")), InvalidArgument, "TimestampOffset"),
    ("upcaster from version 0", lambda j: SerializerRegistry().register_upcaster("M", 0, str), SerializationError,
     "from_version must be a positive int"),
    ("snapshots start without a transform", lambda j: j.query.current_events_by_slices_starting_from_snapshots(
        "Cart", 0, 1023, transform=None), InvalidArgument, "transform must be a function"),
    # issue 20: bulk cleanup, the firehose, transcoding
    ("cleanup batch size 0", lambda j: JournalCleanup(j, batch_size=0), InvalidArgument,
     "batch_size must be an integer from 1 to 100,000, got 0"),
    ("cleanup before a naive time", lambda j: JournalCleanup(j, dry_run=False).events_before(datetime(2026, 1, 1)),
     InvalidArgument, "timezone-aware"),
    ("cleanup of an entity type with NUL", lambda j: JournalCleanup(j, dry_run=False).all_events("a\x00"),
     InvalidArgument, "entity type"),
    ("cleanup persistence ids as one string", lambda j: JournalCleanup(j, dry_run=False).events_before_snapshot(
        persistence_ids="Cart|seeded"), InvalidArgument, "got a single string"),
    ("cleanup reset given as a string", lambda j: JournalCleanup(j, dry_run=False).tombstoned(
        reset_sequence_number="yes"), InvalidArgument, "reset must be True or False"),
    ("firehose buffer of 1", lambda j: Firehose(j, buffer_size=1), ConfigurationError, "buffer_size must be"),
    ("firehose from a string offset", lambda j: Firehose(j).events_by_slices("Cart", 0, 1023, "x"), InvalidArgument,
     "NoOffset or a TimestampOffset"),
    ("transcoder with lz4", lambda j: Transcoder(compression="lz4"), ConfigurationError, "compression must be one of"),
    ("master key of 16 bytes", lambda j: AesGcmKeyWrapper(b"0" * 16), ConfigurationError,
     "master_key must be 32 bytes (AES-256), got 16 bytes"),
    ("encryption without a persistence id", lambda j: SerializerRegistry(transcoder=Transcoder(
        key_store=InMemoryKeyStore())).serialize({"a": 1}), SerializationError, "needs its persistence id"),
]


def snapshot_of(dsn: str) -> dict[str, int]:
    """Rows of every table of the database (side tables included: settings, leases, the version table)."""
    with psycopg.connect(dsn) as conn:
        tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        assert len(tables) >= 10, tables
        return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}  # type: ignore[index]


@contextlib.contextmanager
def seeded_database(databases: FreshDatabases) -> Iterator[tuple[Journal, str]]:
    with databases.database() as dsn, Journal.open(dsn, **FAST) as journal:
        journal.append("Cart|seeded", ["a", "b"], expected_seq_nr=0, tags=["t"])
        tags_written(journal)  # not later, while a test compares the tables before and after
        yield journal, dsn


# One database for all the cases of a test function, not one each (a fresh database and its seeding took most of
# a case's time): every case compares all the tables before and after it, so a case that wrote would fail
# itself, and the cases that must fail write nothing the next one could see. The arguments' cases, which may
# succeed (and write), have a database of their own.
@pytest.fixture(scope="module")
def seeded(migrated_databases: FreshDatabases) -> Iterator[tuple[Journal, str]]:
    with seeded_database(migrated_databases) as pair:
        yield pair


@pytest.fixture(scope="module")
def seeded_for_arguments(migrated_databases: FreshDatabases) -> Iterator[tuple[Journal, str]]:
    with seeded_database(migrated_databases) as pair:
        yield pair


def test_the_catalogue_is_large_enough() -> None:
    assert len(API) + len(CLI) >= 30 and len({name for name, *_ in API + CLI}) == len(API) + len(CLI)


@pytest.mark.parametrize(("name", "call", "error", "fragment"), API, ids=[entry[0] for entry in API])
def test_bad_input_through_the_api(seeded: tuple[Journal, str], name: str, call: Call, error: type[JournalError],
                                   fragment: str) -> None:
    journal, dsn = seeded
    before = snapshot_of(dsn)
    with pytest.raises(error) as caught:
        result = call(journal)
        if hasattr(result, "close"):  # a live query that did start: it must not have
            result.close()
    assert isinstance(caught.value, JournalError)
    assert fragment in str(caught.value), str(caught.value)
    assert snapshot_of(dsn) == before


def test_a_tagged_append_that_conflicts_records_nothing_anywhere(dsn: str) -> None:
    """The first tagged append also records the tag bucket size: a failing one must not (a later open with
    another bucket size would then be refused because of a write that never happened)."""
    before = snapshot_of(dsn)
    with Journal.open(dsn, **FAST) as journal, pytest.raises(ConcurrencyConflict):
        journal.append(PID, ["e"], expected_seq_nr=3, tags=["t"])
    assert snapshot_of(dsn) == before  # (a batched tag writer's own row goes when it closes)
    with Journal.open(dsn, tag_bucket_size="Day", **FAST) as other:  # nothing was fixed by the failed call
        other.append(PID, ["e"], expected_seq_nr=0, tags=["t"])
    with pytest.raises(ConfigurationError, match="Day"):
        Journal.open(dsn, tag_bucket_size="Hour")


def test_a_database_without_schema(empty_dsn: str) -> None:
    with pytest.raises(SchemaNotMigrated, match="run `pgjournal migrate`"):
        Journal.open(empty_dsn)


# (name, argv, fragment of the message); every argv gets --dsn
CLI: list[tuple[str, list[str], str]] = [
    ("cli: empty persistence id", ["append", "", '"e"'], "persistence id must not be empty"),
    ("cli: event not JSON", ["append", PID, "not json"], "events must be JSON"),
    ("cli: negative expected seq nr", ["append", PID, '"e"', "--expected-seq-nr", "-1"], "expected_seq_nr"),
    ("cli: expected seq nr ahead", ["append", PID, '"e"', "--expected-seq-nr", "5"], "expected the highest"),
    ("cli: expected seq nr not a number", ["append", PID, '"e"', "--expected-seq-nr", "five"],
     "Invalid value for '--expected-seq-nr'"),
    ("cli: empty tag", ["append", PID, '"e"', "--tag", ""], "tag must be a non-empty string"),
    ("cli: NaN event", ["append", PID, "NaN"], "finite float"),
    ("cli: events of empty pid", ["events", ""], "persistence id must not be empty"),
    ("cli: events from -1", ["events", PID, "--from", "-1"], "from_seq_nr"),
    ("cli: slice range backwards", ["tail", "Cart", "--slices", "5-2", "--current"], "greater than max_slice"),
    ("cli: slice range not numbers", ["tail", "Cart", "--slices", "a-b", "--current"], "slice range must look like"),
    ("cli: offset garbage", ["tail", "Cart", "--from", "garbage", "--current"], "ISO 8601"),
    ("cli: offset seq nr too large", ["tail", "Cart", "--current", "--from",
                                      '{"ts":"2026-01-01T00:00:00Z","seen":{"p":9223372036854775808}}'], "< 2**63"),
    ("cli: 3 slice ranges", ["slices", "3"], "divisor of 1024"),
    ("cli: limit 0", ["persistence-ids", "--limit", "0"], "limit must be a positive integer"),
    ("cli: unknown dialect", ["migrate", "--sql", "--dialect", "oracle"], "oracle"),
    ("cli: role name that injects", ["roles", "--sql", "--writer", "w; DROP"], "role name must be"),
    ("cli: tag events of empty tag", ["tags", "events", ""], "tag"),
    ("cli: cleanup of empty pid", ["cleanup", "events", ""], "persistence id must not be empty"),
    ("cli: verify with negative examples", ["verify", "--examples", "-1"], "greater than or equal to 0"),
    ("cli: cleanup before a time without a zone", ["cleanup", "before-time", "2026-01-01T00:00:00", "--execute"],
     "must carry a time zone"),
    ("cli: cleanup batch size 0", ["cleanup", "tombstoned", "--batch-size", "0", "--execute"], "--batch-size"),
    ("cli: cleanup execute and dry run", ["cleanup", "entity-type", "Cart", "--execute", "--dry-run"],
     "contradict each other"),
    ("cli: cleanup of an entity type with NUL", ["cleanup", "entity-type", "Ca\x00rt", "--execute"], "entity type"),
    ("cli: event nested 50,000 deep", ["append", PID, "[" * 50_000], "events must be JSON: JSON nested too deeply"),
    ("cli: state nested 50,000 deep", ["state", "put", PID, "[" * 50_000 + "]" * 50_000],
     "the state must be JSON: JSON nested too deeply"),
    ("cli: offset nested 50,000 deep", ["tail", "Cart", "--current", "--from", '{"ts": ' + "[" * 50_000],
     "nested too deeply"),
]


@pytest.mark.parametrize(("name", "argv", "fragment"), CLI, ids=[entry[0] for entry in CLI])
def test_bad_input_through_the_cli(seeded: tuple[Journal, str], name: str, argv: list[str], fragment: str) -> None:
    _journal, dsn = seeded
    before = snapshot_of(dsn)
    with_dsn = [*argv, "--dsn", dsn] if argv[0] != "slices" else argv
    result = CliRunner().invoke(app, with_dsn, env={"PGJOURNAL_DSN": dsn})
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert fragment in " ".join(result.output.split()), result.output  # (Rich wraps at the terminal width)
    if result.exit_code == 1:
        # One message (Rich wraps it at the terminal width), nothing else.
        assert result.output.lstrip().startswith("error:") and result.output.count("error:") == 1
    assert snapshot_of(dsn) == before


@pytest.mark.parametrize("dsn_text", ["postgresql://u:pw@[::1/db", "postgresql://u@127.0.0.1:1/db", "host=x port=y"])
def test_bad_dsns_through_the_cli(dsn_text: str) -> None:
    result = CliRunner().invoke(app, ["info", "--dsn", dsn_text])
    assert result.exit_code == 1 and "Traceback" not in result.output and result.output.startswith("error:")
    assert "pw" not in result.output.replace("pw@", "")  # (the masked form keeps no password)


def test_a_closed_journal_raises_journal_closed_on_both_faces_and_nothing_waits_it_out(dsn: str) -> None:
    """Not a DatabaseUnavailable (the outage that retry logic and the entity breaker wait out): closing is final."""
    import asyncio

    from pgjournal import JournalClosed
    from pgjournal.aio import AsyncJournal
    from pgjournal.entity.breaker import is_unavailability

    journal = Journal.open(dsn, **FAST)
    journal.close()
    for call in (lambda: journal.append(PID, ["e"]), lambda: journal.highest_seq_nr(PID),
                 lambda: list(journal.query.current_events_by_persistence_id(PID))):
        with pytest.raises(JournalClosed, match="is closed") as caught:
            call()
        assert not isinstance(caught.value, DatabaseUnavailable) and not is_unavailability(caught.value)

    async def async_face() -> None:
        aj = await AsyncJournal.open(dsn, **FAST)
        await aj.close()
        with pytest.raises(JournalClosed, match="is closed") as caught:
            await aj.append(PID, ["e"])
        assert not isinstance(caught.value, DatabaseUnavailable)

    asyncio.run(async_face())
    assert snapshot_of(dsn)["event_journal"] == 0


def _cli_commands() -> list[tuple[list[str], list[str]]]:
    """Every command of the CLI with its positional arguments' names (``server`` left out: it starts and stops
    the user's embedded server; Spark's export and load start Spark on a path, whatever its value)."""
    import typer

    root = typer.main.get_command(app)
    found: list[tuple[list[str], list[str]]] = []

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "list_commands"):
            for name in command.list_commands(None):
                walk(command.get_command(None, name), [*path, name])
        else:
            found.append((path, [p.name for p in command.params if p.param_type_name == "argument"]))

    walk(root, [])
    return [(path, names) for path, names in found
            if names and path[0] != "server" and path[:2] not in (["spark", "export"], ["spark", "states"],
                                                                  ["spark", "load"])]


#: A well-formed value for each argument name, so that one bad argument at a time is what fails.
GOOD_ARGUMENT = {"persistence_id": PID, "events": '"e"', "value": '{"n": 1}', "entity_type": "Cart", "tag": "t",
                 "n": "4", "timestamp": "2026-01-01T00:00:00Z", "name": "p", "job": "j"}
#: Deep (nested brackets), huge (100,000 characters, below Linux's limit on one argument) and not UTF-8 (the
#: bytes Python decodes from argv with surrogate escapes).
BAD_ARGUMENTS = {"deep": "[" * 50_000, "huge": "Cart|" + "x" * 100_000, "not UTF-8": os.fsdecode(b"Cart|\xff\xfe")}
CLI_CASES = [(path, names, name, kind) for path, names in _cli_commands() for name in names
             for kind in BAD_ARGUMENTS]


def test_every_command_and_argument_is_covered() -> None:
    covered = {name for _path, _names, name, _kind in CLI_CASES}
    assert covered <= set(GOOD_ARGUMENT) and len({tuple(path) for path, *_ in CLI_CASES}) >= 25


@pytest.mark.parametrize(("path", "names", "argument", "kind"), CLI_CASES,
                         ids=[f"{' '.join(p)} {a} {k}" for p, _n, a, k in CLI_CASES])
def test_every_cli_argument_deep_huge_or_not_utf8_fails_in_one_line(seeded_for_arguments: tuple[Journal, str],
                                                                     path: list[str], names: list[str],
                                                                     argument: str, kind: str) -> None:
    _journal, dsn = seeded_for_arguments
    argv = [*path, *(BAD_ARGUMENTS[kind] if name == argument else GOOD_ARGUMENT[name] for name in names)]
    if path == ["tail"]:
        argv.insert(1, "--current")
    before = snapshot_of(dsn)
    result = CliRunner().invoke(app, [*argv, "--dsn", dsn], env={"PGJOURNAL_DSN": dsn})
    assert isinstance(result.exception, SystemExit | None), repr(result.exception)
    assert "Traceback" not in result.output
    assert len(result.output) < 2_000, result.output[:300]  # a message, not the value echoed whole
    if result.exit_code != 0:
        assert snapshot_of(dsn) == before
