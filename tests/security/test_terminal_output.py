"""Output a terminal can trust: the real ``pgjournal`` command (a subprocess, as a user runs it) printing stored
names that hold terminal escapes, newlines, C1 and bidi controls and Rich markup. Nothing it prints holds a raw
control character, and every name is on one line, as its visible escape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgjournal import Journal
from pgjournal.model.printable import json_printable, printable
from pgjournal.projections import management

pytestmark = pytest.mark.mode_independent

# What an attacker stores: clear the screen, set the window title, a second line, an 8-bit CSI, a right-to-left
# override, Rich markup (one closing tag that matches nothing), an emoji code and a trailing backslash.
HOSTILE = ["a\x1b[2Jb", "t\x1b]0;pwned\x07t", "two\nlines", "c1\x9b31m", "ab\u202edc", "[bold red]x[/]", "[/]",
           "tag:smile:", "end\\", "del\x7f\r\tx"]
PIDS = [f"Cart|{name}" for name in HOSTILE]
# The names each command runs on (every name is listed, and a newline is in the JSON lines): an escape sequence,
# and markup. Each run of the command is a process start, so two and not all.
SOME = [0, 5]
ENTITY_TYPE = "Ev\x1b[31mil\n"  # an entity type of its own: the text before '|'


def pgjournal(dsn: str, *args: str, code: int = 0) -> str:
    """Run the installed console script; its stdout and stderr together."""
    script = Path(sys.executable).with_name("pgjournal")
    assert script.exists(), f"{script} is missing: pip install -e ."
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    env.update({"PGJOURNAL_DSN": dsn, "COLUMNS": "2000", "NO_COLOR": "1",
                "PGJOURNAL_TAG_EVENTUAL_CONSISTENCY_DELAY": "0"})
    proc = subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert_no_raw_controls(output)
    return output


def assert_no_raw_controls(output: str) -> None:
    raw = sorted({c for c in output if c != "\n" and printable(c) != c})
    assert raw == [], f"raw control characters {raw!r} in {output!r}"


def assert_on_one_line(output: str, *names: str) -> None:
    lines = output.splitlines()
    for name in names:
        assert any(printable(name) in line for line in lines), f"{printable(name)!r} is on no line of:\n{output}"


@pytest.fixture
def stored(dsn: str) -> str:
    with Journal.open(dsn) as journal:
        for pid in PIDS:
            journal.append(pid, [{"n": 1}], tags=[HOSTILE[PIDS.index(pid)], "plain"])
            journal.durable_state.upsert(pid, 1, {"v": pid}, HOSTILE[PIDS.index(pid)])
        journal.append(f"{ENTITY_TYPE}|1", [{"n": 1}])
        for name in HOSTILE:
            management.pause(journal, f"proj {name}")
    return dsn


def test_listing_and_tables_show_each_name_escaped_on_one_line(stored: str) -> None:
    assert_on_one_line(pgjournal(stored, "persistence-ids"), *PIDS, f"{ENTITY_TYPE}|1")
    assert_on_one_line(pgjournal(stored, "info"), ENTITY_TYPE)
    assert_on_one_line(pgjournal(stored, "tags", "all"), *HOSTILE)
    for i in SOME:
        assert_on_one_line(pgjournal(stored, "tags", "of", PIDS[i]), HOSTILE[i])
    assert_on_one_line(pgjournal(stored, "projection", "list"), *(f"proj {name}" for name in HOSTILE))
    for name in (HOSTILE[i] for i in SOME):
        assert_on_one_line(pgjournal(stored, "projection", "status", f"proj {name}"), f"proj {name}")
        assert_on_one_line(pgjournal(stored, "projection", "resume", f"proj {name}"), f"proj {name}")


def test_commands_on_a_hostile_name_print_it_escaped(stored: str) -> None:
    for pid, tag in ((PIDS[i], HOSTILE[i]) for i in SOME):
        assert_on_one_line(pgjournal(stored, "append", pid, '{"n": 2}', "--tag", tag), pid)
        assert_on_one_line(pgjournal(stored, "state", "put", pid, '{"v": 2}', "--tag", tag), pid, tag)
        assert_on_one_line(pgjournal(stored, "cleanup", "events", pid), pid)
        assert_on_one_line(pgjournal(stored, "tags", "rebuild", pid), pid)
        # an error quoting the name (Rich markup in it is text, not a style nor a crash)
        missing = pid.replace("Cart|", "Gone|")
        assert_on_one_line(pgjournal(stored, "state", "get", missing, code=1), repr(missing))


def test_json_lines_stay_json_and_safe(stored: str) -> None:
    """JSON output (events, tags events, state): one JSON object a line, the names exact after decoding. (JSON
    escapes C0 itself, not DEL, C1 nor bidi controls.)"""
    for pid, tag in ((PIDS[i], HOSTILE[i]) for i in (2, 9)):  # newline; DEL, CR and tab
        [event] = [json.loads(line) for line in pgjournal(stored, "events", pid).splitlines()]
        assert event["pid"] == pid and tag in event["tags"]
        [state] = [json.loads(line) for line in pgjournal(stored, "state", "get", pid).splitlines()]
        assert state["pid"] == pid and state["tags"] == [tag]
        tagged = [json.loads(line) for line in pgjournal(stored, "tags", "events", tag).splitlines()]
        assert [t["pid"] for t in tagged] == [pid]
    lines = pgjournal(stored, "tail", ENTITY_TYPE, "--current").splitlines()
    assert [json.loads(line)["pid"] for line in lines] == [f"{ENTITY_TYPE}|1"]


FORGED = "w\x1b]0;owned\x07\x1b[2J\nall checks passed"  # a batched tag writer's id: title, clear, a forged line


def test_log_lines_show_a_name_from_the_database_escaped(stored: str) -> None:
    """A silent batched tag writer's id is logged by ``tags events`` (readers wait for it) and ``tags recover``
    (it is recovered): on one line, as its visible escape, with no forged line of its own."""
    import psycopg

    with psycopg.connect(stored) as conn:
        conn.execute("INSERT INTO tag_batch_writers (id, writer, entity_types, complete_before, heartbeat) "
                     "VALUES (%s, 'ghost', ARRAY['Cart'], now() - interval '1 hour', now() - interval '1 hour')",
                     (FORGED,))
    for args in (("tags", "events", "plain"), ("tags", "recover")):
        output = pgjournal(stored, *args)
        assert "batched tag writer" in output, output
        assert_on_one_line(output, FORGED)
        assert "all checks passed" not in [line.strip() for line in output.splitlines()], output


def test_log_records_escape_their_arguments_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """The rule every pgjournal logger follows (``printable_logger``): ``%s`` arguments and a traceback's lines
    escaped, ``%d`` and ``%r`` as they are, the record's text on one line."""
    from pgjournal.model.printable import printable_logger

    log = printable_logger("pgjournal.test_terminal_output")
    with caplog.at_level("INFO", logger=log.name):
        log.info("writer %s wrote %d row(s) of %r", FORGED, 3, "p\x1b")
        try:
            raise ValueError(FORGED)
        except ValueError:
            log.exception("failed on %s", "x\ny")
    handler = caplog.handler
    lines = [handler.format(record) for record in caplog.records]
    assert lines[0].endswith(f"writer {printable(FORGED)} wrote 3 row(s) of 'p\\x1b'"), lines[0]
    assert "failed on x\\ny" in lines[1] and f"ValueError: {printable(FORGED)}" in lines[1], lines[1]
    assert_no_raw_controls("".join(lines))
    assert not any(line.strip() == "all checks passed" for text in lines for line in text.splitlines())


def test_every_module_logs_through_the_printable_logger() -> None:
    """The rule in one place: no module of pgjournal (add-ons included) takes a logger but through
    ``printable_logger``, so no log call can print a name raw."""
    root = Path(__file__).resolve().parents[2]
    found = sorted(str(path.relative_to(root)) for place in ("pgjournal", "projections", "spark")  # add-ons: links
                   for path in (root / place).rglob("*.py") if "logging.getLogger(" in path.read_text(encoding="utf-8"))
    assert found == ["pgjournal/model/printable.py"], found


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable("a\x1b[2J\nb\x7f\x9b\u202e\u2028\U000e0001\u00a0c") == \
        "a\\x1b[2J\\nb\\x7f\\x9b\\u202e\\u2028\\U000e0001\\xa0c"
    assert printable("Cart|naïve 日本 \\x1b [red]") == "Cart|naïve 日本 \\x1b [red]"  # untouched
    encoded = json_printable(json.dumps({"k": "\x7f\x9b\u202e\U000e0001"}, ensure_ascii=False))
    assert printable(encoded) == encoded and json.loads(encoded) == {"k": "\x7f\x9b\u202e\U000e0001"}
