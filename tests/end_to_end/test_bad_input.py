"""The bad-input catalogue: each a typed error naming the value and what was expected; nothing half-written."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from pgjournal import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    SchemaNotMigrated,
    SerializationError,
    Settings,
    slice_for_persistence_id,
)
from pgjournal.server.dsn import check_dsn, mask_dsn

PID = "Cart|1"
SECRET = "s3cr3t-Pa55"


@pytest.fixture
def count_rows(dsn: str) -> Iterator:
    def count() -> int:
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT count(*) FROM event_journal").fetchone()[0]

    yield count


# -- persistence ids -------------------------------------------------------------------------------


def test_empty_persistence_id(journal: Journal, count_rows) -> None:
    with pytest.raises(InvalidPersistenceId, match="persistence id must not be empty"):
        journal.append("", ["e"])
    assert count_rows() == 0


def test_too_long_persistence_id(journal: Journal, count_rows) -> None:
    pid = "Cart|" + "x" * 251  # 256 characters
    with pytest.raises(InvalidPersistenceId) as caught:
        journal.append(pid, ["e"])
    message = str(caught.value)
    assert "at most 255 characters, got 256" in message and "'Cart|xxxx" in message
    journal.append(pid[:255], ["fits"])  # exactly 255 is fine
    assert count_rows() == 1


def test_persistence_id_with_nul(journal: Journal, count_rows) -> None:
    with pytest.raises(InvalidPersistenceId) as caught:
        journal.append("Cart|a\x00b", ["e"])
    assert "must not contain NUL" in str(caught.value) and "'Cart|a\\x00b'" in str(caught.value)
    assert count_rows() == 0


@pytest.mark.parametrize(("pid", "expected"), [
    (42, "must be a string, got int 42"), (None, "must be a string, got NoneType None"),
    ("Cart|\ud800", "no lone surrogates"),
])
def test_other_bad_persistence_ids(journal: Journal, count_rows, pid: object, expected: str) -> None:
    with pytest.raises(InvalidPersistenceId, match=expected):
        journal.append(pid, ["e"])  # type: ignore[arg-type]
    assert count_rows() == 0


@pytest.mark.parametrize("call", [
    lambda j: j.highest_seq_nr(""),
    lambda j: list(j.query.current_events_by_persistence_id("")),
    lambda j: j.query.events_by_persistence_id("x" * 300),
    lambda j: j.delete_events("a\x00", 1),
    lambda j: j.load_snapshot(""),
    lambda j: list(j.query.current_persistence_ids(after="")),
])
def test_reads_check_persistence_ids_too(journal: Journal, call) -> None:
    with pytest.raises(InvalidPersistenceId):
        call(journal)


# -- events and arguments --------------------------------------------------------------------------


def test_event_the_serializer_cannot_encode(journal: Journal, count_rows) -> None:
    journal.append(PID, ["first"])
    with pytest.raises(SerializationError) as caught:
        journal.append(PID, ["ok", {"when": object()}])
    message = str(caught.value)
    assert "cannot serialize dict value" in message and "<object object" in message
    assert "expected a JSON value" in message
    assert count_rows() == 1 and journal.highest_seq_nr(PID) == 1


def test_wrong_expected_seq_nr(journal: Journal, count_rows) -> None:
    journal.append(PID, ["a", "b", "c"])
    for wrong in (0, 2, 4, 100):
        with pytest.raises(ConcurrencyConflict) as caught:
            journal.append(PID, ["x", "y"], expected_seq_nr=wrong)
        assert caught.value.expected_seq_nr == wrong and caught.value.actual_seq_nr == 3
        assert f"expected the highest sequence number to be {wrong} but it is 3" in str(caught.value)
    assert count_rows() == 3


@pytest.mark.parametrize("bad", [-1, -100, 1.5, "3", True, 2**63])
def test_bad_expected_seq_nr_value(journal: Journal, count_rows, bad: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        journal.append(PID, ["e"], expected_seq_nr=bad)  # type: ignore[arg-type]
    assert f"expected_seq_nr must be an integer from 0 to 2**63-1, got {bad!r}" in str(caught.value)
    assert count_rows() == 0


@pytest.mark.parametrize(("events", "expected"), [
    ("one string", "got a single str; wrap it in a list"),
    ({"a": 1}, "got a single dict"),
    (b"bytes", "got a single bytes"),
    (42, "events must be a list of events, got int"),
])
def test_events_not_a_list(journal: Journal, count_rows, events: object, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        journal.append(PID, events)  # type: ignore[arg-type]
    assert count_rows() == 0


@pytest.mark.parametrize(("tags", "expected"), [
    ("red", "not a single string 'red'"), (["ok", ""], "tag must be a non-empty string.*got ''"),
    (["x" * 256], "at most 255 characters"), (["a\x00"], "without NUL"), ([7], "got 7"),
])
def test_bad_tags(journal: Journal, count_rows, tags: object, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        journal.append(PID, ["e"], tags=tags)  # type: ignore[arg-type]
    assert count_rows() == 0


@pytest.mark.parametrize(("call", "expected"), [
    (lambda j: list(j.query.current_events_by_persistence_id(PID, -1)), "from_seq_nr must be an integer"),
    (lambda j: list(j.query.current_events_by_persistence_id(PID, 1, -5)), "to_seq_nr must be an integer"),
    (lambda j: list(j.query.current_persistence_ids(limit=0)), "limit must be a positive integer, got 0"),
    (lambda j: j.delete_events(PID, -1), "to_seq_nr must be an integer from 0"),
])
def test_bad_read_arguments(journal: Journal, call, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        call(journal)


def test_unknown_serializer_id_met_on_read(journal: Journal, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES (%s, 'Cart', %s, 1, now(), 9999, 'M', 'x', 'x')",
            (slice_for_persistence_id(PID), PID),
        )
    with pytest.raises(SerializationError) as caught:
        list(journal.query.current_events_by_persistence_id(PID))
    message = str(caught.value)
    assert "unknown serializer id 9999" in message and f"{PID!r} seq_nr 1" in message
    assert "known ids: 4, 18, 19, 20, 21, 31, 32, 33, 35" in message


# -- database and configuration --------------------------------------------------------------------


def test_unmigrated_database(empty_dsn: str) -> None:
    with pytest.raises(SchemaNotMigrated) as caught:
        Journal.open(empty_dsn)
    assert "no pgjournal schema" in str(caught.value) and "`pgjournal migrate`" in str(caught.value)
    with psycopg.connect(empty_dsn) as conn:  # opening did not create anything
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_database_at_an_older_revision(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgjournal_version SET version_num = '0001'")
    with pytest.raises(SchemaNotMigrated, match=r"at revision 0001 but this pgjournal needs .*run `pgjournal migrate`"):
        Journal.open(dsn)


def test_unreachable_server_fails_fast_without_the_password() -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as caught:
        Journal.open(f"postgresql://app:{SECRET}@127.0.0.1:1/db")
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "cannot connect to postgresql://app:***@127.0.0.1:1/db" in message
    assert SECRET not in message


def test_missing_database_is_unavailable_without_the_password(server_dsn: str) -> None:
    dsn = psycopg.conninfo.make_conninfo(server_dsn, dbname="no_such_db_xyz", password=SECRET)
    with pytest.raises(DatabaseUnavailable) as caught:
        Journal.open(dsn)
    assert "no_such_db_xyz" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("dsn", [
    "host=db port",
    f"host=db password={SECRET} dbname",
    f"postgresql://app:{SECRET}@[::1/db",
    f"host='db password={SECRET}",
    "nonsense",
    "",
    "   ",
])
def test_malformed_dsn(dsn: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Journal.open(dsn)
    message = str(caught.value)
    assert SECRET not in message
    assert "DSN" in message and ("expected postgresql://" in message or "non-empty" in message)


@pytest.mark.parametrize("dsn", [
    f"postgresql://app:{SECRET}@db/x?sslmode=require",
    f"postgres://app:{SECRET}@db:5432/x",
    f"postgresql://:{SECRET}@db/x",
    f"postgresql://app@db/x?password={SECRET}&sslmode=disable",
    f"postgresql:///x?user=app&password={SECRET}",
    f"host=db password={SECRET} user=app",
    f"host=db password = '{SECRET} with space' user=app",
    f"host=db password='{SECRET}\\'quote' user=app",
    f"host=db PASSWORD={SECRET}",
    f"postgresql://app:{SECRET}?x@db/x",
    f"postgresql://app:{SECRET}#x@db/x",
    f"postgresql://app:{SECRET}/x@db/x",
    f"postgresql://app:{SECRET}%2Fx@db/x",
    f"error while connecting to postgresql://app:{SECRET}@db/x: refused",
])
def test_mask_dsn_hides_every_password_form(dsn: str) -> None:
    masked = mask_dsn(dsn)
    assert SECRET not in masked
    assert "***" in masked


@pytest.mark.parametrize("text", [
    "postgresql://app@db:5432/x", "host=db user=app dbname=x", "postgresql://db:5432/x?sslmode=require",
    "no dsn here: just text",
])
def test_mask_dsn_leaves_passwordless_text_alone(text: str) -> None:
    assert mask_dsn(text) == text


@pytest.mark.parametrize("dsn", [
    f"postgresql://app:{SECRET} x@db/x",  # libpq echoes the offending part: "unexpected spaces found in ..."
    f"postgresql://app:{SECRET}@db/x?password",
    f"host=db password={SECRET} port",
])
def test_malformed_dsn_error_never_shows_the_password(dsn: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_dsn(dsn)
    assert SECRET not in str(caught.value)


def test_bad_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGJOURNAL_DSN", f"host=db password={SECRET} dbname")
    with pytest.raises(ConfigurationError) as caught:
        Journal.open()
    assert SECRET not in str(caught.value)


def test_unknown_setting_names() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Journal.open("postgresql://127.0.0.1:1/db", bufer_size=10, colour="red")
    message = str(caught.value)
    assert "unknown setting(s) bufer_size, colour" in message and "buffer_size" in message


@pytest.mark.parametrize(("settings", "expected"), [
    ({"buffer_size": 0}, "buffer_size must be a positive integer, got 0"),
    ({"buffer_size": "10"}, "buffer_size must be a positive integer, got '10'"),
    ({"pool_max_size": True}, "pool_max_size must be a positive integer, got True"),
    ({"pool_min_size": 5, "pool_max_size": 2}, "pool_min_size \\(5\\) exceeds pool_max_size \\(2\\)"),
    ({"refresh_interval": 0}, "refresh_interval must be > 0 seconds, got 0"),
    ({"behind_current_time": -1}, "behind_current_time must be a number of seconds from 0 to 86,400, got -1"),
    ({"connect_timeout": float("nan")}, "connect_timeout must be a number of seconds from 0 to 86,400, got nan"),
    ({"append_retries": -1}, "append_retries must be an integer >= 0, got -1"),
    ({"dialect": "oracle"}, "dialect must be one of postgres, yugabyte, cockroach, got 'oracle'"),
    ({"writer_id": "w" * 256}, "writer_id must be a non-empty string of at most 255 characters"),
])
def test_bad_setting_values(settings: dict, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        Journal.open("postgresql://127.0.0.1:1/db", **settings)


@pytest.mark.parametrize(("name", "raw", "expected"), [
    ("PGJOURNAL_BUFFER_SIZE", "lots", "PGJOURNAL_BUFFER_SIZE='lots' is not a valid int"),
    ("PGJOURNAL_PORTABLE", "maybe", "PGJOURNAL_PORTABLE='maybe' is not a valid bool"),
    ("PGJOURNAL_REFRESH_INTERVAL", "1s", "PGJOURNAL_REFRESH_INTERVAL='1s' is not a valid float"),
    ("PGJOURNAL_BUFFER_SIZE", "-3", "buffer_size must be a positive integer, got -3"),
])
def test_bad_setting_values_from_the_environment(monkeypatch: pytest.MonkeyPatch, name: str, raw: str,
                                                 expected: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigurationError, match=expected):
        Settings.load()


def test_settings_from_the_environment_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGJOURNAL_BUFFER_SIZE", "50")
    monkeypatch.setenv("PGJOURNAL_PORTABLE", "yes")
    loaded = Settings.load(refresh_interval=0.5)
    assert (loaded.buffer_size, loaded.portable, loaded.refresh_interval) == (50, True, 0.5)
    assert Settings.load(buffer_size=7).buffer_size == 7
