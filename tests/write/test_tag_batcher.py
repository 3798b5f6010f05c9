"""The batched tag writer (``tag_batch_writer=True``, pgjournal.write.tag_batcher) on a real PostgreSQL: its rows are
the in-statement path's rows (exactly once, tag sequence order = TimeUUID order), readers never pass rows it
still owes (concurrent writers, a held append, a writer SIGKILLed with rows pending), recovery by another
writer (either face) or ``pgjournal tags recover``, close() flushes, tagged appends in transactions (both
faces), and the asyncio face's writer."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from support import make_serializable, waits_on_a_lock
from support.eventually import eventually
from support.faces import KINDS, Kind, open_face
from support.tags import TAGS, collect, progress, tag_rows
from typer.testing import CliRunner

from pgjournal import ConcurrencyConflict, ConfigurationError, Journal, Source
from pgjournal.aio import AsyncJournal
from pgjournal.buckets import BucketSize
from pgjournal.cli.commands import app
from pgjournal.model.timeuuid import compare

#: Batched, writing often: what most tests use.
BATCHED: dict[str, Any] = dict(TAGS, tag_batch_writer=True, tag_flush_interval=0.05, tag_writer_timeout=1.0)
#: A reader's settings: a database records one tag writer, and every journal on it opens with that setting.
READER: dict[str, Any] = dict(TAGS, tag_batch_writer=True)
#: Batched, writing only when told (flush, close) or when 10,000 events are pending.
HOLDING: dict[str, Any] = dict(TAGS, tag_batch_writer=True, tag_flush_interval=60.0, tag_writer_timeout=240.0,
                               tag_batch_size=10_000)


@pytest.fixture
def bj(dsn: str) -> Iterator[Journal]:
    with Journal.open(dsn, **BATCHED) as opened:
        yield opened


def writer_rows(journal: Journal) -> list[tuple[str, str]]:
    with journal.connection() as conn:
        return conn.execute("SELECT id, writer FROM tag_batch_writers ORDER BY id").fetchall()


def tagged_in_journal(journal: Journal, tag: str) -> dict[str, int]:
    """Per persistence id, how many events the journal holds with ``tag``."""
    with journal.connection() as conn:
        return dict(conn.execute("SELECT persistence_id, count(*) FROM event_journal WHERE %s = ANY(tags) "
                                 "GROUP BY persistence_id", (tag,)).fetchall())


def assert_timeuuid_order_is_tag_order(journal: Journal) -> None:
    """Per (tag, persistence id): ordered by TimeUUID (Cassandra's order), tag sequence numbers are 1..n."""
    with journal.connection() as conn:
        rows = conn.execute("SELECT tag_name, persistence_id, tag_pid_sequence_nr FROM tag_views "
                            "ORDER BY tag_name, persistence_id, ts_time, ts_lsb").fetchall()
    per: dict[tuple[str, str], list[int]] = {}
    for tag, pid, tseq in rows:
        per.setdefault((tag, pid), []).append(tseq)
    for key, seqs in per.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{key}: tag sequence numbers in TimeUUID order {seqs}"


def per_pid(envs: list[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for env in envs:
        out.setdefault(env.persistence_id, []).append(env.tag_pid_sequence_nr)
    return out


class Consumer:
    """A live stream read by a thread into ``got`` (so a test can look at what arrived without closing it)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.got: list[Any] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for env in self.stream:
                self.got.append(env)
        except BaseException as exc:
            self.error = exc

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Any]:
        eventually(lambda: self.error is not None or len(self.got) >= count, f"{count} envelopes", timeout=timeout)
        assert self.error is None, self.error
        return self.got

    def quiet_for(self, seconds: float) -> list[Any]:
        """What arrived while the reader polled for ``seconds`` more (it may deliver nothing new meanwhile)."""
        start = time.monotonic()
        eventually(lambda: time.monotonic() - start > seconds, "the reader polls", timeout=seconds + 5)
        return list(self.got)


# -- the rows ---------------------------------------------------------------------------------------------


def test_rows_are_written_later_and_match_the_in_statement_path(dsn: str) -> None:
    with Journal.open(dsn, **HOLDING) as journal:
        journal.append("Cart|a", [{"n": 1}, {"n": 2}], tags=["x", "y"])
        journal.append("Cart|a", [{"n": 3}], tags=["x"])
        journal.append("Cart|b", [{"n": 1}], tags=["y"])
        journal.append("Cart|a", [{"n": 4}])  # untagged: no tag row, numbers unchanged
        journal.append("Cart|a", [{"n": 5}], tags=["y"])
        journal.append("Cart|b", [{"n": 2}, {"n": 3}], tags=["y"])
        assert tag_rows(journal, "x") == [] and tag_rows(journal, "y") == []  # pending: not written yet
        with Journal.open(dsn, **READER) as reader:  # and readers wait for them
            time.sleep(reader.settings.tag_eventual_consistency_delay + 0.05)
            assert list(reader.query.current_events_by_tag("y")) == []
        journal.tag_writer.flush()  # type: ignore[union-attr]
        assert tag_rows(journal, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2), ("Cart|a", 3, 3)]
        assert tag_rows(journal, "y") == [("Cart|a", 1, 1), ("Cart|a", 2, 2), ("Cart|a", 5, 3), ("Cart|b", 1, 1),
                                          ("Cart|b", 2, 2), ("Cart|b", 3, 3)]
        assert progress(journal) == {("Cart|a", "x"): (3, 3), ("Cart|a", "y"): (5, 3), ("Cart|b", "y"): (3, 3)}
        assert_timeuuid_order_is_tag_order(journal)
        envs = eventually(lambda: (e := list(journal.query.current_events_by_tag("y"))) and len(e) == 6 and e,
                          "the flushed rows readable")
        assert per_pid(envs) == {"Cart|a": [1, 2, 3], "Cart|b": [1, 2, 3]}
        assert [e.event for e in envs if e.persistence_id == "Cart|a"] == [{"n": 1}, {"n": 2}, {"n": 5}]
        assert all(compare(a.offset.value, b.offset.value) == -1 for a, b in itertools.pairwise(envs))
        # Writing the same rows again (another process, a recovery) changes nothing.
        assert journal.tag_writer.recover(silent_for=0) == []  # type: ignore[union-attr]
        journal.tag_writer.flush()  # type: ignore[union-attr]
        assert len(tag_rows(journal, "y")) == 6


def test_more_than_a_batch_per_pair_is_written_in_several_statements(dsn: str) -> None:
    with Journal.open(dsn, **dict(HOLDING, tag_batch_size=7)) as journal:
        for i in range(5):
            journal.append("Cart|big", [{"n": i * 4 + k} for k in range(4)], tags=["x"])
        journal.append("Cart|small", [1], tags=["x"])
        eventually(lambda: len(tag_rows(journal, "x")) >= 7, "the batch size starts a write")
        journal.tag_writer.flush()  # type: ignore[union-attr]
        assert [r[2] for r in tag_rows(journal, "x") if r[0] == "Cart|big"] == list(range(1, 21))
        assert_timeuuid_order_is_tag_order(journal)
        envs = eventually(lambda: (e := list(journal.query.current_events_by_tag("x"))) and len(e) == 21 and e)
        assert per_pid(envs) == {"Cart|big": list(range(1, 21)), "Cart|small": [1]}


def test_close_writes_what_is_pending_and_drops_the_writer_row(dsn: str) -> None:
    journal = Journal.open(dsn, **HOLDING)
    for i in range(10):
        journal.append(f"Cart|c{i % 3}", [i], tags=["x", f"t{i % 2}"])
    assert tag_rows(journal, "x") == []
    assert len(writer_rows(journal)) == 1
    journal.close()
    with Journal.open(dsn, **READER) as reader:
        assert writer_rows(reader) == []
        assert len(tag_rows(reader, "x")) == 10
        envs = eventually(lambda: (e := list(reader.query.current_events_by_tag("x"))) and len(e) >= 10 and e,
                          "the rows written by close() readable")
        assert per_pid(envs) == {"Cart|c0": [1, 2, 3, 4], "Cart|c1": [1, 2, 3], "Cart|c2": [1, 2, 3]}
        assert_timeuuid_order_is_tag_order(reader)


def _writer_backend(journal: Journal) -> int | None:
    """The backend of the batched writer's own connection: the one whose last statement was the writer's."""
    with journal.connection() as conn:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND (query LIKE "
                           "'INSERT INTO tag_batch_writers%' OR query LIKE 'DELETE FROM tag_batch_writers%')"
                           ).fetchone()
    return row[0] if row else None


def test_the_writer_connection_lost_is_opened_again_and_closed_with_the_journal(dsn: str) -> None:
    journal = Journal.open(dsn, **HOLDING)
    journal.append("Cart|a", [1], tags=["x"])
    journal.tag_writer.flush()  # type: ignore[union-attr]
    backend = _writer_backend(journal)
    assert backend is not None
    with journal.connection() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    journal.append("Cart|a", [2], tags=["x"])
    journal.tag_writer.flush()  # type: ignore[union-attr]  # a new connection: nothing pending is lost
    assert [r[2] for r in tag_rows(journal, "x")] == [1, 2]
    again = _writer_backend(journal)
    assert again not in (None, backend)
    journal.close()
    with Journal.open(dsn, **READER) as reader:
        eventually(lambda: _writer_backend(reader) is None, "close() closes the writer's connection")


# -- readers never pass what is owed -----------------------------------------------------------------------


def _writer(dsn: str, index: int, count: int, errors: list[BaseException], give_up: Callable[[], None]) -> None:
    try:
        with Journal.open(dsn, **BATCHED) as journal:
            for i in range(count):
                journal.append(f"Cart|w{index}-{i % 5}", [i], tags=["x"])  # its own persistence ids
                journal.append("Cart|shared", [i], tags=["x", f"w{index}"])  # one all 4 writers share
    except BaseException as exc:
        errors.append(exc)
        give_up()  # the reader stops waiting for events that will not come


@pytest.mark.parametrize("portable", [False, True], ids=["horizon", "portable"])
def test_a_live_reader_beside_four_batched_writers_misses_nothing(dsn: str, portable: bool) -> None:
    """Four journals (four batched writers, each with its own watermark row) append tagged events, one
    persistence id from all of them; a live reader runs throughout. Portable: no visibility horizon, so only
    the watermarks hold the reader back."""
    count = 60
    with Journal.open(dsn, portable=portable, **READER) as reader, reader.query.events_by_tag("x") as stream:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_writer, args=(dsn, i, count, errors, stream.close))
                   for i in range(4)]
        for t in threads:
            t.start()
        got = collect(stream, 4 * count * 2, timeout=120)
        for t in threads:
            t.join()
        assert not errors, errors
        expected = tagged_in_journal(reader, "x")
        assert sum(expected.values()) == 4 * count * 2
        delivered = per_pid(got)
        assert delivered == {pid: list(range(1, n + 1)) for pid, n in expected.items()}
        assert all(e.source is not Source.BACKTRACKING for e in got), "the cursor passed a row written later"
        assert all(compare(a.offset.value, b.offset.value) == -1 for a, b in itertools.pairwise(got))
        assert writer_rows(reader) == []
        assert_timeuuid_order_is_tag_order(reader)


def test_writers_starting_together_on_a_serializable_database_record_the_tag_settings_once(dsn: str) -> None:
    """A writer's first tagged append records the bucket size and the tag writer in ``tag_settings``; writers
    starting together insert the same rows, and under SERIALIZABLE all but the first fail 40001 (CI's
    PostgreSQL 15 once ended two of four writers so). Here the first is the test's own transaction, committed
    while the journal's insert waits on it: the journal retries and appends."""
    make_serializable(dsn)
    with Journal.open(dsn, **BATCHED) as journal, psycopg.connect(dsn) as first:
        first.execute("INSERT INTO tag_settings (name, value) VALUES ('bucket_size', %s), ('tag_writer', 'batched')",
                      (BucketSize.parse(journal.settings.tag_bucket_size).label,))
        errors: list[BaseException] = []
        appending = threading.Thread(target=_append_or_record, args=(journal, errors))
        appending.start()

        eventually(lambda: waits_on_a_lock(dsn), "the journal's insert waits on the test's transaction")
        first.commit()
        appending.join()
        assert not errors, errors
        journal.tag_writer.flush()  # type: ignore[union-attr]
        assert len(tag_rows(journal, "x")) == 1
        with journal.connection() as conn:
            assert conn.execute("SELECT count(*) FROM tag_settings").fetchone()[0] == 2


def _append_or_record(journal: Journal, errors: list[BaseException]) -> None:
    try:
        journal.append("Cart|1", [1], tags=["x"])
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("portable", [False, True], ids=["horizon", "portable"])
def test_a_held_append_keeps_readers_before_it(dsn: str, portable: bool) -> None:
    """A tagged append held open (the key it inserts is locked by the test's own uncommitted insert) while
    others of the same writer commit and are flushed: the reader waits for it, then reads all in order."""
    with Journal.open(dsn, portable=portable, **BATCHED) as journal, \
            Journal.open(dsn, portable=portable, **READER) as reader:
        journal.append("Cart|slow", [0], tags=["x"])
        with reader.query.events_by_tag("x") as stream:
            consumer = Consumer(stream)
            consumer.wait_for(1)
            blocker = psycopg.connect(dsn)
            blocker.execute("INSERT INTO event_journal SELECT slice, entity_type, persistence_id, 2, db_timestamp, "
                            "event_ser_id, event_ser_manifest, event_payload, deleted, 'blocker' "
                            "FROM event_journal WHERE persistence_id = 'Cart|slow'")
            held = threading.Thread(target=journal.append, args=("Cart|slow", [1]),
                                    kwargs={"tags": ["x"], "expected_seq_nr": 1})
            held.start()

            eventually(lambda: waits_on_a_lock(dsn), "the held append waits on the test's lock")
            for i in range(5):
                journal.append(f"Cart|fast{i}", [1, 2], tags=["x"])
            eventually(lambda: len(tag_rows(journal, "x")) == 11, "the later appends' rows written")
            # Their rows are there; the reader polls many times and delivers none of them.
            assert len(consumer.quiet_for(10 * reader.settings.refresh_interval)) == 1
            blocker.rollback()
            blocker.close()
            held.join()
            journal.append("Cart|slow", [2], tags=["x"])
            got = consumer.wait_for(13)
    assert per_pid(got) == {"Cart|slow": [1, 2, 3], **{f"Cart|fast{i}": [1, 2] for i in range(5)}}
    assert all(e.source is not Source.BACKTRACKING for e in got)
    assert all(compare(a.offset.value, b.offset.value) == -1 for a, b in itertools.pairwise(got))


# -- a writer that dies -------------------------------------------------------------------------------------

_CHILD = """
import sys
from pgjournal import Journal
settings = dict(tag_batch_writer=True, tag_flush_interval=60.0, tag_writer_timeout=240.0, tag_batch_size=10_000,
                tag_bucket_size="Minute", tag_eventual_consistency_delay=0.05)
journal = Journal.open(sys.argv[1], **settings)
for i in range(int(sys.argv[2])):
    journal.append(f"Cart|dead{i % 4}", [{"i": i}], tags=["x", "dead"])
print("ready", flush=True)
sys.stdin.read()  # until killed
"""


def append_and_close(dsn: str, pid: str) -> None:
    """A tagged event of ``pid`` whose rows are written (by a batched writer that closes: no row of it stays)."""
    with Journal.open(dsn, **HOLDING) as writer:
        writer.append(pid, [0], tags=["x"])


async def _recover_with_an_asyncio_writer(dsn: str, dead: Any) -> None:
    async with AsyncJournal.open(dsn, **BATCHED) as other:
        await other.append("Cart|other", [0], tags=["y"])
        deadline = time.monotonic() + 30
        while dead in writer_rows_of(dsn):
            assert time.monotonic() < deadline, "the dead writer recovered by the asyncio writer"
            await asyncio.sleep(0.05)


def writer_rows_of(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, writer FROM tag_batch_writers ORDER BY id").fetchall()


@pytest.mark.parametrize("by", ["writer", "asyncio writer", "cli"])
def test_a_sigkilled_writer_is_recovered_and_readers_go_on(dsn: str, by: str) -> None:
    count = 40
    with Journal.open(dsn, **READER) as reader, reader.query.events_by_tag("x") as stream:
        append_and_close(dsn, "Cart|before")
        consumer = Consumer(stream)
        consumer.wait_for(1)
        child = subprocess.Popen([sys.executable, "-c", _CHILD, dsn, str(count)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            assert tag_rows(reader, "x") == [("Cart|before", 1, 1)]  # the child's rows are pending
            child.send_signal(signal.SIGKILL)
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        dead = writer_rows(reader)
        assert len(dead) == 1  # the dead writer's row stays: readers wait for it
        append_and_close(dsn, "Cart|after")  # rows written, later than the dead writer's events
        assert len(consumer.quiet_for(1.0)) == 1  # held back by the dead writer's watermark
        if by == "writer":  # another batched writer starts and finds it silent for its tag_writer_timeout
            with Journal.open(dsn, **BATCHED) as other:
                other.append("Cart|other", [0], tags=["y"])
                eventually(lambda: dead[0] not in writer_rows(reader), "the dead writer recovered", timeout=30)
                assert len(tag_rows(reader, "dead")) == count
        elif by == "asyncio writer":
            asyncio.run(_recover_with_an_asyncio_writer(dsn, dead[0]))
        else:
            result = CliRunner().invoke(app, ["tags", "recover", "--silent-for", "0", "--dsn", dsn],
                                        env={"PGJOURNAL_TAG_BUCKET_SIZE": "Minute"})
            assert result.exit_code == 0, result.output
            assert "recovered" in result.output
        assert writer_rows(reader) == []
        got = consumer.wait_for(count + 2)
        assert len(tag_rows(reader, "dead")) == count
        assert_timeuuid_order_is_tag_order(reader)
    assert per_pid(got) == {"Cart|before": [1], **{f"Cart|dead{i}": list(range(1, count // 4 + 1)) for i in range(4)},
                            "Cart|after": [1]}


# -- transactions and the asyncio face -------------------------------------------------------------------------


def watermark(dsn: str) -> Any:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT min(complete_before) FROM tag_batch_writers").fetchone()[0]  # type: ignore[index]


def db_clock(dsn: str) -> Any:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize("kind", KINDS)
def test_tagged_appends_in_a_transaction_hold_the_watermark_until_the_commit(dsn: str, kind: Kind) -> None:
    """While a transaction with a tagged append is open, the writer flushes other events but its watermark
    stays below the transaction's event; after the commit its rows are written like any append's."""
    with open_face(kind, dsn, **HOLDING) as journal:
        # The first tagged write records the tag settings in its transaction: before the test's transaction, so
        # the append outside it does not wait for its commit.
        journal.append("Cart|o", [0], tags=["x"])
        with journal.transaction() as tx:
            tx.append("Cart|t", [1])  # untagged
            tx.append("Cart|t", [2, 3], tags=["x"])
            stamped = tx.connection.execute("SELECT min(db_timestamp) FROM event_journal WHERE "
                                            "persistence_id = 'Cart|t' AND tags IS NOT NULL").fetchone()[0]
            journal.append("Cart|o", [1], tags=["x"], expected_seq_nr=1)  # outside, committed and flushed first
            journal.tag_writer.flush()
            assert tag_rows(journal, "x") == [("Cart|o", 1, 1), ("Cart|o", 2, 2)]
            assert watermark(dsn) <= stamped, "the watermark passed an event of the open transaction"
        journal.tag_writer.flush()
        assert tag_rows(journal, "x") == [("Cart|o", 1, 1), ("Cart|o", 2, 2), ("Cart|t", 2, 1), ("Cart|t", 3, 2)]
        assert watermark(dsn) > stamped
        envs = eventually(lambda: (e := [(e.persistence_id, e.tag_pid_sequence_nr)
                                          for e in journal.query.current_events_by_tag("x")]) and len(e) == 4 and e,
                          "the rows readable")
        # TimeUUID order: the transaction's events before the later append outside it
        assert envs == [("Cart|o", 1), ("Cart|t", 1), ("Cart|t", 2), ("Cart|o", 2)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_rolled_back_or_failed_tagged_append_in_a_transaction_is_forgotten(dsn: str, kind: Kind) -> None:
    """Rolled back, or failed in a savepoint: the writer no longer waits for it (its watermark moves on) and
    writes no row for it."""
    with open_face(kind, dsn, **HOLDING) as journal:
        journal.append("Cart|c", [0], tags=["x"])
        with pytest.raises(RuntimeError), journal.transaction() as tx:
            tx.append("Cart|r", [1], tags=["x"])
            raise RuntimeError("the caller gives up")
        with journal.transaction(savepoints=True) as tx:
            with pytest.raises(ConcurrencyConflict):
                tx.append("Cart|c", [1], tags=["x"], expected_seq_nr=0)
            tx.append("Cart|c", [1], tags=["y"], expected_seq_nr=1)
        after = db_clock(dsn)
        journal.tag_writer.flush()
        assert journal.tag_writer.batch.idle()
        assert watermark(dsn) > after
        assert tag_rows(journal, "x") == [("Cart|c", 1, 1)] and tag_rows(journal, "y") == [("Cart|c", 2, 1)]
        assert tagged_in_journal(journal, "x") == {"Cart|c": 1}  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_a_current_tag_query_reads_this_journals_own_pending_appends(dsn: str, kind: Kind) -> None:
    """Read-your-writes in the process: the current query first has the journal's writer write what it has
    pending (another process sees the events once the watermark passed them), and a query with nothing
    pending writes nothing."""
    with open_face(kind, dsn, **HOLDING) as journal, Journal.open(dsn, **READER) as other:
        journal.append("Cart|r", [1, 2], tags=["x"])
        time.sleep(journal.settings.tag_eventual_consistency_delay + 0.05)
        assert list(other.query.current_events_by_tag("x")) == []  # pending in the writer
        assert not journal.tag_writer.batch.caught_up()
        assert [e.seq_nr for e in journal.query.current_events_by_tag("x")] == [1, 2]
        assert journal.tag_writer.batch.caught_up()
        assert [e.seq_nr for e in other.query.current_events_by_tag("x")] == [1, 2]
        before = writer_heartbeats(dsn)
        assert [e.seq_nr for e in journal.query.current_events_by_tag("x")] == [1, 2]
        assert writer_heartbeats(dsn) == before  # nothing to write: no statement


def writer_heartbeats(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT heartbeat FROM tag_batch_writers ORDER BY id").fetchall()


def test_the_asyncio_face_writes_pending_rows_when_it_closes(dsn: str) -> None:
    async def main() -> None:
        async with AsyncJournal.open(dsn, **HOLDING) as journal:
            await journal.append("Cart|a", [1, 2], tags=["x"])
            await journal.append("Cart|b", [1], tags=["x", "y"])
            assert journal.tag_writer is not None and journal.tag_writer.batch.events == 3
    asyncio.run(main())
    with Journal.open(dsn, **READER) as reader:
        assert tag_rows(reader, "x") == [("Cart|a", 1, 1), ("Cart|a", 2, 2), ("Cart|b", 1, 1)]
        assert tag_rows(reader, "y") == [("Cart|b", 1, 1)]
        assert writer_rows(reader) == []
        assert_timeuuid_order_is_tag_order(reader)


def test_bad_settings_are_named() -> None:
    from pgjournal.settings import Settings
    with pytest.raises(ConfigurationError, match="tag_batch_size"):
        Settings(tag_batch_size=0)
    with pytest.raises(ConfigurationError, match="tag_writer_timeout"):
        Settings(tag_batch_writer=True, tag_flush_interval=1.0, tag_writer_timeout=2.0)
    with pytest.raises(ConfigurationError, match="tag_flush_interval"):
        Settings(tag_flush_interval=0)
    with pytest.raises(ConfigurationError, match="tag_batch_writer"):
        Settings(tag_batch_writer="yes")  # type: ignore[arg-type]


def _flush_together(journal: Journal, start: threading.Barrier) -> None:
    start.wait()
    journal.tag_writer.flush()  # type: ignore[union-attr]


def test_writers_flushing_one_pair_at_once_write_each_row_once(dsn: str) -> None:
    """Four batched writers owe rows of one (persistence id, tag) and flush at the same moment: the tag view
    rows carry no ON CONFLICT, so the writers that read the same progress collide on the key and retry from
    the winner's progress (23505); every row is written once, numbered in sequence order."""
    journals = [Journal.open(dsn, **HOLDING) for _ in range(4)]
    try:
        seq = 0
        for _ in range(10):
            for k in range(8):
                journals[k % 4].append("Cart|race", [k], tags=["x"], expected_seq_nr=seq)
                seq += 1
            start = threading.Barrier(4)
            threads = [threading.Thread(target=_flush_together, args=(j, start)) for j in journals]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert tag_rows(journals[0], "x") == [("Cart|race", n, n) for n in range(1, seq + 1)]
        assert progress(journals[0]) == {("Cart|race", "x"): (seq, seq)}
        assert_timeuuid_order_is_tag_order(journals[0])
    finally:
        for journal in journals:
            journal.close()
