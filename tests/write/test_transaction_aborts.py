"""Every failed append aborts ``journal.transaction()`` (blocking and asyncio), whatever made it fail: a conflict
with ``expected_seq_nr`` above the highest stored one (the statement inserts nothing and no statement fails), a
stale one (below the highest: a primary-key clash), or a statement the server refused. The failed append raises
its own error; later appends and the end of the block raise ``TransactionAborted`` (its ``cause`` the first
failure), also when the caller caught the failure and went on, and nothing of the block commits: not the appends
before the failure, not the caller's own SQL. With ``savepoints=True`` each of them leaves nothing behind and the
caller goes on: the rest commits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.aio import SETTINGS

from pgjournal import ConcurrencyConflict, Journal, JournalError, TransactionAborted
from pgjournal.aio import AsyncJournal

REFUSE = """
CREATE FUNCTION refuse_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER refuse_insert BEFORE INSERT ON event_journal FOR EACH ROW
  WHEN (NEW.persistence_id = 'Refused|1') EXECUTE FUNCTION refuse_insert();
CREATE TABLE outbox (v int);
"""

#: How the append fails: (persistence id, expected_seq_nr, what it raises) with ``A|1`` stored up to 1.
FAILURES: dict[str, tuple[str, int | None, type[JournalError]]] = {
    "above-highest": ("A|1", 5, ConcurrencyConflict),
    "stale": ("A|1", 0, ConcurrencyConflict),
    "refused": ("Refused|1", None, JournalError),
}


@pytest.fixture
def prepared(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(REFUSE)
    return dsn


def outbox(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM outbox ORDER BY v").fetchall()]


def check_failure(error: BaseException, how: str) -> None:
    pid, expected, kind = FAILURES[how]
    assert isinstance(error, kind), error
    if kind is ConcurrencyConflict:
        assert (error.persistence_id, error.expected_seq_nr) == (pid, expected)  # type: ignore[attr-defined]
    else:
        assert not isinstance(error, ConcurrencyConflict) and "refused" in str(error)


def stored(highest: Callable[[str], Any]) -> tuple[Any, ...]:
    return tuple(highest(pid) for pid in ("A|1", "B|1", "C|1", "Refused|1"))


@pytest.mark.parametrize("how", FAILURES)
def test_a_failed_append_aborts_the_block(prepared: str, how: str) -> None:
    pid, expected, kind = FAILURES[how]
    with Journal.open(prepared, **SETTINGS) as journal:
        journal.append("A|1", ["a"])
        with pytest.raises(TransactionAborted) as at_end, journal.transaction() as tx:
            tx.append("B|1", ["b"], expected_seq_nr=0)
            tx.connection.execute("INSERT INTO outbox VALUES (1)")
            with pytest.raises(kind) as failure:
                tx.append(pid, ["x"], expected_seq_nr=expected)
            with pytest.raises(TransactionAborted) as later:  # the caller catches it and goes on
                tx.append("C|1", ["c"])
        check_failure(failure.value, how)
        assert at_end.value.cause is failure.value and later.value.cause is failure.value
        assert stored(journal.highest_seq_nr) == (1, 0, 0, 0)
    assert outbox(prepared) == []


@pytest.mark.parametrize("how", FAILURES)
def test_with_savepoints_a_failed_append_leaves_nothing_and_the_rest_commits(prepared: str, how: str) -> None:
    pid, expected, kind = FAILURES[how]
    with Journal.open(prepared, **SETTINGS) as journal:
        journal.append("A|1", ["a"])
        with journal.transaction(savepoints=True) as tx:
            tx.append("B|1", ["b"], expected_seq_nr=0)
            with pytest.raises(kind) as failure:
                tx.append(pid, ["x"], expected_seq_nr=expected)
            tx.append("C|1", ["c"])
            tx.connection.execute("INSERT INTO outbox VALUES (1)")
        check_failure(failure.value, how)
        assert stored(journal.highest_seq_nr) == (1, 1, 1, 0)
    assert outbox(prepared) == [1]


@pytest.mark.parametrize("how", FAILURES)
async def test_asyncio_a_failed_append_aborts_the_block(prepared: str, how: str) -> None:
    pid, expected, kind = FAILURES[how]
    async with AsyncJournal.open(prepared, **SETTINGS) as journal:
        await journal.append("A|1", ["a"])
        with pytest.raises(TransactionAborted) as at_end:
            async with journal.transaction() as tx:
                await tx.append("B|1", ["b"], expected_seq_nr=0)
                await tx.connection.execute("INSERT INTO outbox VALUES (1)")
                with pytest.raises(kind) as failure:
                    await tx.append(pid, ["x"], expected_seq_nr=expected)
                with pytest.raises(TransactionAborted) as later:
                    await tx.append("C|1", ["c"])
        check_failure(failure.value, how)
        assert at_end.value.cause is failure.value and later.value.cause is failure.value
        assert [await journal.highest_seq_nr(p) for p in ("A|1", "B|1", "C|1", "Refused|1")] == [1, 0, 0, 0]
    assert outbox(prepared) == []


@pytest.mark.parametrize("how", FAILURES)
async def test_asyncio_with_savepoints_a_failed_append_leaves_nothing_and_the_rest_commits(
        prepared: str, how: str) -> None:
    pid, expected, kind = FAILURES[how]
    async with AsyncJournal.open(prepared, **SETTINGS) as journal:
        await journal.append("A|1", ["a"])
        async with journal.transaction(savepoints=True) as tx:
            await tx.append("B|1", ["b"], expected_seq_nr=0)
            with pytest.raises(kind) as failure:
                await tx.append(pid, ["x"], expected_seq_nr=expected)
            await tx.append("C|1", ["c"])
            await tx.connection.execute("INSERT INTO outbox VALUES (1)")
        check_failure(failure.value, how)
        assert [await journal.highest_seq_nr(p) for p in ("A|1", "B|1", "C|1", "Refused|1")] == [1, 1, 1, 0]
    assert outbox(prepared) == [1]
