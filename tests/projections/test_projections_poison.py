"""Poison events: a payload that does not decode (invalid JSON bytes written directly) or an envelope the
handler always fails on. ``stop`` (default): bounded retries, then ProjectionFailed naming projection, pid,
seq_nr, serializer id and manifest (no endless restarts). ``dead-letter``: stored in projection_dead_letter and
passed, the offset in the same transaction; the exactly-once read model stays exact; ``--retry`` replays."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from test_projections import MODES, Flaky, append_many, stored_seq_nrs
from test_projections_cli import invoke

from pgjournal import Journal
from pgjournal.codec.serialization import JSON_SER_ID
from pgjournal.projections import ProjectionFailed
from pgjournal.projections.dead_letters import list_dead_letters, retry_dead_letters
from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.projections.runner import RangeRunner, run_range

POISON = b'{"n": \xff'
CORRUPT = "UPDATE event_journal SET event_payload = %s WHERE persistence_id = %s AND seq_nr = %s"
REPAIR = "UPDATE event_journal SET event_payload = '{\"n\": 1}'::bytea WHERE persistence_id = %s AND seq_nr = %s"


def settings(on_failure: str) -> Any:
    return dataclasses.replace(FAST_PROJECTION, attempts=3, backoff=0.01, on_failure=on_failure)


def corrupt(journal: Journal, pid: str, seq_nr: int) -> tuple[int, str]:
    with journal.connection() as conn:
        assert conn.execute(CORRUPT, (POISON, pid, seq_nr)).rowcount == 1
        row = conn.execute("SELECT event_ser_id, event_ser_manifest FROM event_journal WHERE persistence_id = %s "
                           "AND seq_nr = %s", (pid, seq_nr)).fetchone()
    return row[0], row[1]


def stopped(runner: RangeRunner) -> RangeRunner:
    runner.stop()
    runner.join(timeout=30)
    return runner


@pytest.mark.parametrize("mode", MODES)
def test_poison_payload_stops_with_a_typed_error(journal: Journal, mode: str) -> None:
    append_many(journal, "Cart", 3, 3)
    ser_id, manifest = corrupt(journal, "Cart|e1", 2)
    flaky = Flaky("-", 0, failures=0)
    runner = run_range(journal, Projection("poison", "Cart", flaky.handler(mode), settings("stop")), 0, 1023)
    eventually(lambda: runner.failed is not None, "the runner stops on the poison payload")
    stopped(runner)
    failed = runner.failed
    assert isinstance(failed, ProjectionFailed)
    assert (failed.projection, failed.persistence_id, failed.seq_nr) == ("poison", "Cart|e1", 2)
    assert (failed.ser_id, failed.manifest) == (ser_id, manifest) and ser_id == JSON_SER_ID
    assert "'poison'" in str(failed) and "'Cart|e1' seq_nr 2" in str(failed) and f"ser_id {ser_id}" in str(failed)
    assert "cannot decode payload" in str(failed.cause)
    assert runner.stats.restarts == 0  # no endless restart loop
    assert ("Cart|e1", 2) not in flaky.handled and ("Cart|e1", 3) not in flaky.handled
    assert stored_seq_nrs(journal, "poison").get("Cart|e1", 0) < 2  # the offset stays before it


@pytest.mark.parametrize("grouped", [False, True], ids=["exactly-once", "grouped"])
def test_poison_payload_dead_lettered_read_model_exact_and_retried(dsn: str, journal: Journal,
                                                                  grouped: bool) -> None:
    ensure_counter_table(journal)
    append_many(journal, "Cart", 5, 3)
    corrupt(journal, "Cart|e2", 2)
    projection = Projection("dl", "Cart", counter_writer("dl", grouped=grouped, max_count=4, max_wait=0.05),
                            settings("dead-letter"))

    def counted_but_the_poison() -> bool:
        return counter_mismatches(journal, "dl", "Cart") == [("Cart|e2", 3, 3, 2, 3)]

    runner = run_range(journal, projection, 0, 1023)
    eventually(counted_but_the_poison, "every event but the poison one counted")
    stopped(runner)
    assert runner.failed is None and runner.stats.dead_lettered == 1
    [letter] = list_dead_letters(journal, "dl")
    assert (letter.persistence_id, letter.seq_nr, letter.ser_id, letter.payload) == ("Cart|e2", 2, JSON_SER_ID, POISON)
    assert letter.projection_key == "0-1023" and "cannot decode payload" in letter.error
    assert stored_seq_nrs(journal, "dl")["Cart|e2"] == 3  # the offset went past it

    # A restart handles nothing again: the dead letter counts as processed.
    again = run_range(journal, projection, 0, 1023)
    eventually(lambda: again.stats.read >= 1, "the restart read its lookback")
    stopped(again)
    assert again.stats.handled == 0 and again.stats.dead_lettered == 0 and counted_but_the_poison()

    # Still poison: the retry fails again and keeps it; repaired in the journal: handled once and removed.
    result = invoke(dsn, "dead-letters", "dl", "--retry")
    assert result.exit_code == 0, result.output
    assert "0 dead letter(s) handled and removed, 1 failed again" in result.output
    assert "Cart|e2" in result.output and counted_but_the_poison()
    with journal.connection() as conn:
        conn.execute(REPAIR, ("Cart|e2", 2))
    result = invoke(dsn, "dead-letters", "dl", "--retry")
    assert result.exit_code == 0, result.output
    assert "1 dead letter(s) handled and removed, 0 failed again" in result.output
    assert "dl: 0 dead letter(s)" in result.output
    assert counter_mismatches(journal, "dl", "Cart") == [] and list_dead_letters(journal, "dl") == []


def test_dead_letter_list_in_the_cli(dsn: str, journal: Journal) -> None:
    append_many(journal, "Cart", 2, 2)
    corrupt(journal, "Cart|e0", 1)
    flaky = Flaky("-", 0, failures=0)
    runner = run_range(journal, Projection("shown", "Cart", flaky.handler("exactly-once"), settings("dead-letter")),
                       0, 1023)
    eventually(lambda: len(flaky.handled) == 3, "the three good events handled")
    stopped(runner)
    result = invoke(dsn, "dead-letters", "shown")
    assert result.exit_code == 0, result.output
    assert "shown: 1 dead letter(s)" in result.output
    line = next(ln for ln in result.output.splitlines() if "Cart|e0" in ln)
    assert " 1 " in line and f" {JSON_SER_ID} " in line and "SerializationError" in line
    assert invoke(dsn, "dead-letters", "nobody").output.count("0 dead letter(s)") == 1


@pytest.mark.parametrize("mode", MODES)
def test_handler_that_always_fails_is_dead_lettered_then_retried_when_fixed(journal: Journal, mode: str) -> None:
    append_many(journal, "Cart", 3, 3)
    flaky = Flaky("Cart|e1", 2, failures=None)
    projection = Projection("fixme", "Cart", flaky.handler(mode), settings("dead-letter"))
    runner = run_range(journal, projection, 0, 1023)
    eventually(lambda: len(set(flaky.handled)) == 8, "every other event handled")
    stopped(runner)
    assert runner.failed is None and runner.stats.dead_lettered == 1
    assert flaky.calls >= 3
    assert sorted(set(flaky.handled)) == sorted({(f"Cart|e{i}", s) for i in range(3) for s in (1, 2, 3)}
                                                - {("Cart|e1", 2)})
    [letter] = list_dead_letters(journal, "fixme")
    assert (letter.persistence_id, letter.seq_nr) == ("Cart|e1", 2) and "boom on Cart|e1 2" in letter.error
    flaky.failures = flaky.calls  # fixed
    outcome = retry_dead_letters(journal, projection)
    assert outcome.succeeded == [("Cart|e1", 2)] and outcome.failed == []
    assert ("Cart|e1", 2) in flaky.handled and list_dead_letters(journal, "fixme") == []

