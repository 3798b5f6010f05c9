"""One tag writer per database (pgjournal.tags.writer_mode): the first tagged write records its journal's
``tag_batch_writer``; a journal with the other setting is refused when it opens and before its own first tagged
write, with nothing written (a batched event beside an in-statement writer would lose its tag row); a journal
that leaves the setting unset follows the database (batched when nothing says otherwise); ``pgjournal tags
writer`` shows and switches it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from support.tags import IN_STATEMENT, TAGS, tag_rows
from typer.testing import CliRunner

from pgjournal import ConfigurationError, Journal
from pgjournal.aio import AsyncJournal
from pgjournal.cli.commands import app
from pgjournal.settings import Settings

BATCHED: dict[str, Any] = dict(TAGS, tag_batch_writer=True, tag_flush_interval=60.0, tag_writer_timeout=240.0)


def recorded(dsn: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT value FROM tag_settings WHERE name = 'tag_writer'").fetchone()
    return row[0] if row else None


def journal_rows(dsn: str, pid: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id = %s", (pid,)).fetchone()[0]


def cli(dsn: str, *args: str) -> Any:
    return CliRunner().invoke(app, ["tags", "writer", *args, "--dsn", dsn], env={"PGJOURNAL_TAG_BUCKET_SIZE": "Minute"})


def test_nothing_is_recorded_before_a_tagged_write(dsn: str) -> None:
    with Journal.open(dsn, **BATCHED) as journal:
        journal.append("Cart|a", [1])  # untagged
    with Journal.open(dsn, **IN_STATEMENT) as journal:  # so the other setting opens
        journal.append("Cart|b", [1])
    assert recorded(dsn) is None


@pytest.mark.parametrize("first", ["batched", "in-statement"])
def test_a_journal_with_the_other_setting_is_refused_at_open(dsn: str, first: str) -> None:
    settings, other = (BATCHED, IN_STATEMENT) if first == "batched" else (IN_STATEMENT, BATCHED)
    with Journal.open(dsn, **settings) as journal:
        journal.append("Cart|a", [1], tags=["x"])
    assert recorded(dsn) == first
    with pytest.raises(ConfigurationError, match=r"tag_batch_writer is (True|False) but .*tag_settings 'tag_writer'"):
        Journal.open(dsn, **other)
    with Journal.open(dsn, **settings) as journal:  # the same setting opens
        assert journal.append("Cart|a", [2], tags=["x"])[0].seq_nr == 2


def test_an_in_statement_append_beside_a_batched_writer_is_refused_and_writes_nothing(dsn: str) -> None:
    """Both journals open before anything is recorded; the batched writer's event is pending when the
    in-statement journal appends to the same persistence id: that append would move the progress past it."""
    with Journal.open(dsn, **BATCHED) as batched, Journal.open(dsn, **IN_STATEMENT) as plain:
        batched.append("Cart|same", [1], tags=["x"])
        assert recorded(dsn) == "batched"
        with pytest.raises(ConfigurationError, match="tag_batch_writer is False"):
            plain.append("Cart|same", [2], tags=["x"], expected_seq_nr=1)
        assert journal_rows(dsn, "Cart|same") == 1
        plain.append("Cart|other", [1])  # untagged appends do not touch the tag view
        batched.tag_writer.flush()  # type: ignore[union-attr]
        assert tag_rows(batched, "x") == [("Cart|same", 1, 1)]


def test_a_batched_writer_beside_in_statement_appends_is_refused_before_its_event(dsn: str) -> None:
    with Journal.open(dsn, **IN_STATEMENT) as plain, Journal.open(dsn, **BATCHED) as batched:
        plain.append("Cart|same", [1], tags=["x"])
        assert recorded(dsn) == "in-statement"
        with pytest.raises(ConfigurationError, match="tag_batch_writer is True"):
            batched.append("Cart|same", [2], tags=["x"], expected_seq_nr=1)
        assert journal_rows(dsn, "Cart|same") == 1
        assert tag_rows(plain, "x") == [("Cart|same", 1, 1)]


def test_the_asyncio_face_records_and_checks_the_in_statement_writer(dsn: str) -> None:
    import asyncio

    async def main() -> None:
        async with await AsyncJournal.open(dsn, **IN_STATEMENT) as journal:
            await journal.append("Cart|a", [1], tags=["x"])
    asyncio.run(main())
    assert recorded(dsn) == "in-statement"


def test_the_cli_shows_and_switches_the_tag_writer(dsn: str) -> None:
    result = cli(dsn)
    assert result.exit_code == 0 and "none recorded" in result.output, result.output
    with Journal.open(dsn, **BATCHED) as journal:
        journal.append("Cart|a", [1], tags=["x"])
        assert "batched" in cli(dsn).output
        refused = cli(dsn, "--set", "in-statement")  # the running writer still has its row
        assert refused.exit_code != 0 and "tag_batch_writers" in refused.output, refused.output
    assert recorded(dsn) == "batched"
    result = cli(dsn, "--set", "in-statement")  # closed: its rows written, its row dropped
    assert result.exit_code == 0 and "batched -> in-statement" in result.output, result.output
    with Journal.open(dsn, **IN_STATEMENT) as journal:
        journal.append("Cart|a", [2], tags=["x"], expected_seq_nr=1)
        assert tag_rows(journal, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2)]
    bad = cli(dsn, "--set", "sometimes")
    assert bad.exit_code != 0 and "batched, in-statement" in bad.output, bad.output
    # The other commands open with the recorded writer, so they work on either database.
    result = CliRunner().invoke(app, ["tags", "all", "--dsn", dsn], env={"PGJOURNAL_TAG_BUCKET_SIZE": "Minute"})
    assert result.exit_code == 0, result.output


# -- the default: follow the database -------------------------------------------------------------------------


def opened_mode(dsn: str, **settings: Any) -> tuple[bool | None, bool, bool | None, bool]:
    """What a journal opened with ``settings`` resolves, on each face: (setting, has a batched writer) twice."""
    import asyncio

    with Journal.open(dsn, **settings) as journal:
        blocking = (journal.settings.tag_batch_writer, journal.tag_writer is not None)

    async def main() -> tuple[bool | None, bool]:
        async with AsyncJournal.open(dsn, **settings) as journal:
            return journal.settings.tag_batch_writer, journal.tag_writer is not None
    return (*blocking, *asyncio.run(main()))


def test_unset_follows_the_database_and_is_batched_on_a_new_one(dsn: str) -> None:
    assert Settings().tag_batch_writer is None and Settings().batched_tags
    assert opened_mode(dsn, **TAGS) == (True, True, True, True)  # nothing recorded, no tag rows: batched
    with Journal.open(dsn, **TAGS) as journal:
        journal.append("Cart|a", [1], tags=["x"])
    assert recorded(dsn) == "batched"
    assert opened_mode(dsn, **TAGS) == (True, True, True, True)


def test_unset_follows_a_recorded_in_statement_writer(dsn: str) -> None:
    with Journal.open(dsn, **IN_STATEMENT) as journal:
        journal.append("Cart|a", [1], tags=["x"])
    assert opened_mode(dsn, **TAGS) == (False, False, False, False)
    with Journal.open(dsn, **TAGS) as journal:  # and writes in-statement
        journal.append("Cart|a", [2], tags=["x"], expected_seq_nr=1)
        assert tag_rows(journal, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2)]


def test_unset_on_tag_rows_of_a_version_that_recorded_nothing_stays_in_statement(dsn: str) -> None:
    """Tag rows but no recorded writer: written by a version whose only writer was in-statement (and which may
    still run beside this one, unchecked): the in-statement writer, recorded with the next tagged append."""
    with Journal.open(dsn, **IN_STATEMENT) as journal:
        journal.append("Cart|a", [1], tags=["x"])
    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM tag_settings WHERE name = 'tag_writer'")
    assert opened_mode(dsn, **TAGS) == (False, False, False, False)
    with Journal.open(dsn, **TAGS) as journal:
        journal.append("Cart|a", [2], tags=["x"], expected_seq_nr=1)
        assert tag_rows(journal, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2)]
    assert recorded(dsn) == "in-statement"
    with pytest.raises(ConfigurationError, match="tag_batch_writer is True"):
        Journal.open(dsn, **BATCHED)


def test_unset_beside_a_batched_writer_of_a_version_that_recorded_nothing_is_batched(dsn: str) -> None:
    """No recorded writer, but a batched writer owes rows (its row in tag_batch_writers): batched."""
    with Journal.open(dsn, **BATCHED) as journal:
        journal.append("Cart|a", [1], tags=["x"])
        with psycopg.connect(dsn) as conn:
            conn.execute("DELETE FROM tag_settings WHERE name = 'tag_writer'")
        assert opened_mode(dsn, **TAGS) == (True, True, True, True)


def test_the_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, value in (("true", True), ("0", False), ("auto", None), ("", None)):
        monkeypatch.setenv("PGJOURNAL_TAG_BATCH_WRITER", raw)
        assert Settings.load().tag_batch_writer is value
    monkeypatch.setenv("PGJOURNAL_TAG_BATCH_WRITER", "sometimes")
    with pytest.raises(ConfigurationError, match="TAG_BATCH_WRITER"):
        Settings.load()
