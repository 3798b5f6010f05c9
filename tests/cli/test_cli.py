"""The command line against the test database: output, exit codes, one-line errors, masked passwords."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.cli.commands import app

pytestmark = pytest.mark.mode_independent

SECRET = "s3cr3t-Pa55"


@pytest.fixture
def cli(dsn: str):
    """Run ``pgjournal ARGS`` with PGJOURNAL_DSN set to the test database; returns the Result."""
    runner = CliRunner()

    def run(*args: str, env: dict | None = None):
        return runner.invoke(app, list(args), env={"PGJOURNAL_DSN": dsn, "COLUMNS": "200", **(env or {})},
                             terminal_width=200)

    return run


def assert_clean_failure(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "error:" in result.output
    # Rich wraps a long message at the terminal's width
    for fragment in fragments:
        assert fragment in " ".join(result.output.split()), result.output


def json_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_migrate_sql_for_yugabyte(cli) -> None:
    result = cli("migrate", "--sql", "--dialect", "yugabyte")
    assert result.exit_code == 0, result.output
    assert "PRIMARY KEY (persistence_id HASH, seq_nr ASC)" in result.output
    assert "SPLIT AT VALUES ((127), (255)" in result.output


def test_each_command_prints_at_the_width_of_its_own_terminal() -> None:
    # the process's consoles used to be made once, at the width of the first command that printed
    def error_lines(columns: int) -> list[str]:
        result = CliRunner().invoke(app, ["migrate", "--sql", "--dialect", "oracle"],
                                    env={"COLUMNS": str(columns)}, terminal_width=columns)
        assert result.exit_code == 1, result.output
        return [line for line in result.output.splitlines() if line.strip()]

    narrow = error_lines(30)
    assert len(narrow) > 1 and max(map(len, narrow)) <= 30, narrow
    assert len(error_lines(200)) == 1


def test_migrate_sql_unknown_dialect(cli) -> None:
    assert_clean_failure(cli("migrate", "--sql", "--dialect", "oracle"), "dialect must be one of", "'oracle'")


def test_migrate_an_empty_database(empty_dsn: str) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["migrate"], env={"PGJOURNAL_DSN": empty_dsn})
    assert result.exit_code == 0, result.output
    assert "schema is at revision" in result.output
    with Journal.open(empty_dsn) as journal:
        assert journal.highest_seq_nr("Cart|1") == 0


def test_commands_on_an_unmigrated_database_say_what_to_run(empty_dsn: str) -> None:
    result = CliRunner().invoke(app, ["info"], env={"PGJOURNAL_DSN": empty_dsn})
    assert_clean_failure(result, "pgjournal migrate")


@pytest.mark.floor
def test_append_and_events(cli) -> None:
    result = cli("append", "Cart|7", '{"item": "apple"}', '"text"', "42", "--tag", "fruit")
    assert result.exit_code == 0, result.output
    assert "Cart|7" in result.output and "seq nr" in result.output
    result = cli("append", "Cart|7", '{"item": "pear"}', "--expected-seq-nr", "3")
    assert result.exit_code == 0, result.output

    result = cli("events", "Cart|7")
    assert result.exit_code == 0, result.output
    lines = json_lines(result.output)
    assert [(r["pid"], r["seq_nr"], r["event"]) for r in lines] == [
        ("Cart|7", 1, {"item": "apple"}), ("Cart|7", 2, "text"), ("Cart|7", 3, 42), ("Cart|7", 4, {"item": "pear"})]
    assert lines[0]["tags"] == ["fruit"] and "tags" not in lines[3]
    assert lines[0]["timestamp"].endswith("Z")

    result = cli("events", "Cart|7", "--from", "2", "--to", "3")
    assert [r["seq_nr"] for r in json_lines(result.output)] == [2, 3]


def test_events_of_a_persistence_id_with_none_say_so_and_exit_1(cli) -> None:
    assert cli("append", "Cart|7", '"a"').exit_code == 0
    result = cli("events", "Nope|1")
    assert_clean_failure(result, "persistence id 'Nope|1' has no events")
    assert result.stdout == ""  # the message is on stderr: a pipe reading JSON lines gets none
    assert_clean_failure(cli("events", "Cart|7", "--from", "2"),
                         "persistence id 'Cart|7' has no events with seq nr 2 to the last")


def test_append_errors(cli) -> None:
    cli("append", "Cart|7", '"a"')
    assert_clean_failure(cli("append", "Cart|7", '"b"', "--expected-seq-nr", "0"),
                         "expected the highest sequence number to be 0 but it is 1")
    assert_clean_failure(cli("append", "Cart|7", "{not json"), "events must be JSON")
    assert_clean_failure(cli("append", "", '"x"'), "persistence id must not be empty")
    assert_clean_failure(cli("append", "Cart|7", '"x"', "--expected-seq-nr", "-1"), "expected_seq_nr")
    result = cli("events", "Cart|7")
    assert [r["event"] for r in json_lines(result.output)] == ["a"]


def test_persistence_ids(cli) -> None:
    for pid in ("Cart|2", "Cart|1", "Order|1", "Cart|3"):
        assert cli("append", pid, "1").exit_code == 0
    result = cli("persistence-ids")
    assert result.exit_code == 0
    assert result.output.split() == ["Cart|1", "Cart|2", "Cart|3", "Order|1"]
    assert cli("persistence-ids", "--after", "Cart|1", "--limit", "2").output.split() == ["Cart|2", "Cart|3"]
    assert_clean_failure(cli("persistence-ids", "--limit", "0"), "limit must be a positive integer, got 0")


def test_info(cli, dsn: str) -> None:
    with Journal.open(dsn) as journal:
        for i in range(5):
            journal.append(f"Cart|{i}", ["a", "b"])
        journal.append("Order|1", ["x"])
        journal.append("plain-id", ["y"])
        journal.save_snapshot("Cart|0", 2, {"state": 1})
        journal.delete_events("Cart|4", 1)
    result = cli("info")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Events per entity type" in out and "Events per slice range" in out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in out.splitlines() if line.count("│") >= 5 and "-" in line.split("│")[4]}
    assert rows["Cart"] == ["9", "5"] and rows["Order"] == ["1", "1"] and rows["(none)"] == ["1", "1"]
    assert "0-127" in out and "896-1023" in out
    header = next(line for line in out.splitlines() if "slices" in line and "events" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == ["slices", "events", "share"]
    assert "snapshots: 1" in out


def test_slices(cli) -> None:
    result = cli("slices", "4")
    assert result.exit_code == 0
    for lo, hi in ((0, 255), (256, 511), (512, 767), (768, 1023)):
        assert f"{lo}-{hi}" in result.output
    assert_clean_failure(cli("slices", "3"), "divisor of 1024", "got 3")
    assert_clean_failure(cli("slices", "0"), "got 0")


def test_malformed_dsn_with_a_password(cli) -> None:
    for bad in (f"host=db password={SECRET} dbname", f"postgresql://app:{SECRET} x@db/x"):
        result = cli("info", "--dsn", bad)
        assert_clean_failure(result, "malformed DSN")
        assert SECRET not in result.output


def test_unreachable_server_with_a_password(cli) -> None:
    result = cli("events", "Cart|1", "--dsn", f"postgresql://app:{SECRET}@127.0.0.1:1/db")
    assert_clean_failure(result, "cannot connect to postgresql://app:***@127.0.0.1:1/db")
    assert SECRET not in result.output


def test_real_process_prints_one_line_and_no_traceback() -> None:
    """The installed entry point, as a user runs it: the masked message on stderr, exit 1."""
    env = {**os.environ, "PGJOURNAL_DSN": f"postgresql://app:{SECRET}@127.0.0.1:1/db"}
    script = Path(sys.executable).with_name("pgjournal")  # the console script the package installs
    assert script.exists(), f"{script} is missing: pip install -e ."
    proc = subprocess.run([str(script), "persistence-ids"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    assert proc.stderr.strip().startswith("error: cannot connect to postgresql://app:***@127.0.0.1:1/db")


def test_migrate_of_an_unreachable_server(cli) -> None:
    result = cli("migrate", "--dsn", f"postgresql://app:{SECRET}@127.0.0.1:1/db")
    assert_clean_failure(result, "cannot migrate postgresql://app:***@127.0.0.1:1/db")
    assert SECRET not in result.output


def test_events_with_an_unknown_serializer_fail_cleanly(cli, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES (%s, 'Cart', 'Cart|9', 1, now(), 555, 'M', 'x', 'x')",
            (slice_for_persistence_id("Cart|9"),),
        )
    assert_clean_failure(cli("events", "Cart|9"), "unknown serializer id 555", "'Cart|9' seq_nr 1")
    result = cli("info")  # info counts rows and never decodes payloads
    assert result.exit_code == 0 and "Cart" in result.output
