"""Group commit on both faces (pgjournal.write.group_commit's rules; pgjournal.write.pipelining for threads,
pgjournal.aio.pipelining for tasks): appends that would wait for a pool connection ride together in one pipeline
and one transaction, yet each keeps its own outcome. A group is built on purpose: the test holds the pool's only
connection while the appends queue, then lets it go, so the drain takes them all at once."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from support import FAST, PORTABLE, make_serializable
from support.eventually import eventually
from support.faces import Face, Kind, open_face
from support.faultproxy import fault_proxy

from pgjournal import ConcurrencyConflict, Journal, JournalError, WriteOutcomeUnknown

#: Appends in a group built on purpose (below the pipeline's BATCH, so one drain takes them all).
GROUP = 20


@contextlib.contextmanager
def grouped(kind: Kind, dsn: str, **options: Any) -> Iterator[Face]:
    """A journal of ``kind`` with one pool connection and group commits on, warmed up (its connection open)."""
    settings = dict(FAST, portable=PORTABLE, pool_max_size=1, pool_min_size=1, pipeline=True, async_pipeline=True)
    with open_face(kind, dsn, **dict(settings, **options)) as face:
        if not face.journal._pipeline.enabled:
            pytest.skip("no group commits on a SERIALIZABLE database (PGJOURNAL_TEST_PORTABLE=1)")
        face.append("Warm|up", ["w"])  # may ride alone, waiting for the pool's first connection
        pipeline = face.journal._pipeline
        pipeline.sent = pipeline.pipelines = pipeline.rolled_back = 0
        yield face


def in_one_group(face: Face, appends: list[Callable[[], Any]]) -> list[Any]:
    """Run ``appends`` on threads of their own while the test holds the pool's only connection, so every one
    queues for a group; then let the connection go. Each one's result, or the error it raised."""
    pipeline = face.journal._pipeline
    with ThreadPoolExecutor(len(appends)) as threads:
        with face.connection():
            futures = [threads.submit(append) for append in appends]
            eventually(lambda: len(pipeline.queue) == len(appends), "every append queued for a group")
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=30))
            except JournalError as exc:
                outcomes.append(exc)
    return outcomes


def rows(dsn: str, prefix: str) -> list[tuple[str, int, str]]:
    """``(persistence_id, seq_nr, xmin)`` of every row of the persistence ids starting with ``prefix``."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT persistence_id, seq_nr, xmin::text FROM event_journal WHERE persistence_id "
                            "LIKE %s ORDER BY 1, 2", (prefix + "%",)).fetchall()


def test_appends_waiting_for_a_connection_commit_in_one_transaction(face_kind: Kind, dsn: str) -> None:
    """Each keeps its own events, sequence numbers, timestamp and envelopes; the group commits once."""
    with grouped(face_kind, dsn) as face:
        outcomes = in_one_group(face, [lambda t=t: face.append(f"One|{t:02}", [t, t]) for t in range(GROUP)])
        pipeline = face.journal._pipeline
        assert (pipeline.pipelines, pipeline.sent, pipeline.rolled_back) == (1, GROUP, 0)
        assert [[(e.persistence_id, e.seq_nr, e.event) for e in envs] for envs in outcomes] == [
            [(f"One|{t:02}", 1, t), (f"One|{t:02}", 2, t)] for t in range(GROUP)]
        assert all(envs[0].db_timestamp == envs[1].db_timestamp for envs in outcomes), "one stamp per append"
        next_ = face.append("One|00", ["next"], expected_seq_nr=2)  # the writer knows the last event
        assert next_[0].seq_nr == 3 and next_[0].db_timestamp > outcomes[0][1].db_timestamp
    written = rows(dsn, "One|")
    assert len(written) == 2 * GROUP + 1
    assert len({xmin for pid, seq_nr, xmin in written if seq_nr <= 2}) == 1, "one transaction for the group"


def test_many_threads_ride_in_fewer_commits_than_appends(face_kind: Kind, dsn: str) -> None:
    """16 threads, 10 appends each, on 2 connections: nothing held, the appends wait for connections by
    themselves."""
    with grouped(face_kind, dsn, pool_max_size=2) as face:

        def thread(t: int) -> None:
            for i in range(10):
                face.append(f"Many|{t}", [i], expected_seq_nr=i)

        with ThreadPoolExecutor(16) as threads:
            list(threads.map(thread, range(16)))
        pipeline = face.journal._pipeline
        assert pipeline.sent > 40, "most appends waited for a connection"
        assert pipeline.pipelines < pipeline.sent, "groups of more than one append"
    written = rows(dsn, "Many|")
    assert [(pid, seq_nr) for pid, seq_nr, _ in written] == sorted((f"Many|{t}", i) for t in range(16)
                                                                    for i in range(1, 11))
    assert len({xmin for *_, xmin in written}) < 160, "fewer commits than appends"


def test_a_conflict_in_a_group_takes_only_itself_out(face_kind: Kind, dsn: str) -> None:
    """Every fourth append states a stale expected_seq_nr: it gets its ConcurrencyConflict, the others commit
    together after it left the group."""
    with grouped(face_kind, dsn) as face:
        for t in range(0, GROUP, 4):
            face.append(f"Clash|{t:02}", ["first"])
        outcomes = in_one_group(face, [lambda t=t: face.append(f"Clash|{t:02}", ["mine"], expected_seq_nr=0)
                                       for t in range(GROUP)])
        pipeline = face.journal._pipeline
        assert pipeline.rolled_back == GROUP // 4, "each conflict rolled its group back once"
    for t, outcome in enumerate(outcomes):
        if t % 4:
            assert [(e.seq_nr, e.event) for e in outcome] == [(1, "mine")]
        else:
            assert isinstance(outcome, ConcurrencyConflict), repr(outcome)
            assert (outcome.persistence_id, outcome.expected_seq_nr, outcome.actual_seq_nr) == (f"Clash|{t:02}", 0, 1)
    written = rows(dsn, "Clash|")
    assert [(pid, seq_nr) for pid, seq_nr, _ in written] == [(f"Clash|{t:02}", 1) for t in range(GROUP)]
    assert len({xmin for pid, _, xmin in written if int(pid[-2:]) % 4}) == 1, "the others in one transaction"


def test_a_failing_statement_rolls_the_group_back_and_the_others_go_again(face_kind: Kind, dsn: str) -> None:
    """A trigger refuses one persistence id's events: that append alone fails (refused, nothing written), run
    on a connection of its own; the others are queued again and commit in one transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "IF NEW.persistence_id = 'Fail|07' THEN RAISE EXCEPTION 'refused on purpose'; END IF; "
                     "RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION refuse_one()")
    with grouped(face_kind, dsn) as face:
        outcomes = in_one_group(face, [lambda t=t: face.append(f"Fail|{t:02}", [t]) for t in range(GROUP)])
        pipeline = face.journal._pipeline
        assert (pipeline.rolled_back, pipeline.pipelines) == (1, 2), "rolled back once, then the rest again"
        assert pipeline.sent == 2 * GROUP - 1
    refused = outcomes.pop(7)
    assert type(refused) is JournalError and "refused on purpose" in str(refused), repr(refused)
    assert all(isinstance(outcome, list) for outcome in outcomes), outcomes
    written = rows(dsn, "Fail|")
    assert [pid for pid, _, _ in written] == [f"Fail|{t:02}" for t in range(GROUP) if t != 7]
    assert len({xmin for *_, xmin in written}) == 1


def test_a_connection_lost_under_a_group_leaves_every_member_unknown_never_half(
        face_kind: Kind, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """The network breaks once the group's statements reached the server, before the answer: every member gets
    WriteOutcomeUnknown, and the group is in the database whole or not at all. psycopg logs nothing of its own
    (an error at the pipeline's end would be logged as ignored)."""
    with fault_proxy(dsn) as (proxy, proxied), grouped(face_kind, proxied) as face, \
            caplog.at_level(logging.WARNING, logger="psycopg"):
        proxy.cut_on(b"Lost|", forward=True)
        outcomes = in_one_group(face, [lambda t=t: face.append(f"Lost|{t:02}", [t] * 3, expected_seq_nr=0)
                                       for t in range(GROUP)])
        assert proxy.traps_sprung == 1
        assert all(isinstance(outcome, WriteOutcomeUnknown) for outcome in outcomes), outcomes
        assert face.append("Lost|after", ["a"])[0].seq_nr == 1, "the journal goes on with a new connection"
    assert "error ignored" not in caplog.text
    written = {pid for pid, *_ in rows(dsn, "Lost|")} - {"Lost|after"}
    assert written in (set(), {f"Lost|{t:02}" for t in range(GROUP)}), "the whole group or none of it"
    assert len(rows(dsn, "Lost|")) in (1, 3 * GROUP + 1)


@pytest.mark.parametrize("why", ["setting", "serializable"])
def test_no_group_commit_when_off_or_where_a_commit_may_fail(why: str, dsn: str) -> None:
    """``pipeline=False``, or SERIALIZABLE (a commit may fail at the Sync, for the whole group): threads waiting
    for the one connection each get it in turn and commit on their own."""
    if why == "serializable":
        make_serializable(dsn)
    with Journal.open(dsn, **dict(FAST, pool_max_size=1, pipeline=why != "setting")) as journal:
        assert not journal._pipeline.enabled
        journal.append("Warm|up", ["w"])
        with ThreadPoolExecutor(8) as threads:
            with journal.connection():
                futures = [threads.submit(journal.append, f"Off|{t}", [t]) for t in range(8)]
                eventually(lambda: journal._pool.get_stats().get("requests_waiting") == 8, "8 threads waiting")
            [future.result(timeout=30) for future in futures]
        assert journal._pipeline.sent == 0
    assert len({xmin for *_, xmin in rows(dsn, "Off|")}) == 8
