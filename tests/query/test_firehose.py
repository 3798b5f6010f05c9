"""The firehose: consumers of one entity type and slice range share one live query. Adversarial: writers with
transactions held open around their inserts (late commits), consumers joining late from the start and from an
offset, a slow consumer detached (SlowConsumer) that resumes on its own query; every consumer gets every event
after its start exactly once, in sequence order per persistence id."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.torture import ENTITY, fast_writer, slow_writer

from pgjournal import ConfigurationError, InvalidArgument, Journal, NoOffset, SlowConsumer, TimestampOffset
from pgjournal.model.offsets import Offset
from pgjournal.query.firehose import Firehose


@dataclass
class Reader:
    name: str
    start: Offset = NoOffset
    slow: bool = False
    delivered: list[tuple[str, int]] = field(default_factory=list)
    offsets: list[TimestampOffset] = field(default_factory=list)
    detached: int = 0
    joined: bool = False
    error: BaseException | None = None
    stream: Any = None


def read(firehose: Firehose, journal: Journal, reader: Reader, stop: threading.Event) -> None:
    """Read from the firehose; when detached as slow, resume from the offset on a query of its own."""
    try:
        reader.stream = firehose.events_by_slices(ENTITY, 0, 1023, reader.start)
        while not stop.is_set():
            try:
                for envelope in reader.stream:
                    reader.delivered.append((envelope.persistence_id, envelope.seq_nr))
                    reader.offsets.append(envelope.offset)
                    reader.joined = reader.joined or getattr(reader.stream, "attached", False)
                    if reader.slow and reader.joined and not reader.detached:
                        time.sleep(0.1)  # slow only once it reads from the shared query
                return
            except SlowConsumer as exc:
                reader.detached += 1
                reader.stream = journal.query.events_by_slices(ENTITY, 0, 1023, exc.offset or NoOffset)
    except BaseException as exc:  # reported by the test
        reader.error = exc


def written(dsn: str) -> list[tuple[str, int, datetime]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT persistence_id, seq_nr, db_timestamp FROM event_journal WHERE entity_type = %s",
                            (ENTITY,)).fetchall()


def expected_for(reader: Reader, rows: list[tuple[str, int, datetime]]) -> set[tuple[str, int]]:
    start = reader.start
    return {(p, s) for p, s, ts in rows if not (isinstance(start, TimestampOffset) and start.covers(ts, p, s))}


def check(reader: Reader, wanted: set[tuple[str, int]]) -> None:
    assert reader.error is None, f"{reader.name}: {reader.error!r}"
    assert len(reader.delivered) == len(set(reader.delivered)), f"{reader.name} got duplicates"
    missing = wanted - set(reader.delivered)
    assert not missing, f"{reader.name} missed {len(missing)} events, e.g. {sorted(missing)[:5]}"
    assert set(reader.delivered) == wanted, f"{reader.name} got events before its start"
    last: dict[str, int] = {}
    for pid, seq_nr in reader.delivered:
        if pid in last:
            assert seq_nr == last[pid] + 1, f"{reader.name}: {pid} seq {seq_nr} after {last[pid]}"
        last[pid] = seq_nr
    for earlier, later_offset in zip(reader.offsets, reader.offsets[1:], strict=False):
        assert later_offset.timestamp >= earlier.timestamp, f"{reader.name}: offsets went backwards"


@pytest.mark.parametrize("portable", [False, True], ids=["horizon", "portable"])
def test_late_joiners_a_slow_consumer_and_late_commits(dsn: str, portable: bool) -> None:
    settings: dict[str, Any] = {**FAST, "buffer_size": 50, "backtracking_behind_current_time": 3.0}
    if portable:  # exact from an offset once behind_current_time exceeds the longest writing transaction
        settings.update(portable=True, behind_current_time=2.5)
    with Journal.open(dsn, **settings) as journal, \
            Firehose(journal, buffer_size=200, slow_consumer_timeout=2.0, linger=0.5) as firehose:
        journal.append(f"{ENTITY}|before", [{"n": i} for i in range(30)])  # history to catch up on
        stop_writers, stop_readers = threading.Event(), threading.Event()
        readers = [Reader(f"early-{i}") for i in range(4)] + [Reader("slow", slow=True)]
        threads: list[threading.Thread] = []

        def start(reader: Reader) -> None:
            thread = threading.Thread(target=read, args=(firehose, journal, reader, stop_readers))
            thread.start()
            threads.append(thread)

        for reader in readers:
            start(reader)
        pids = [f"{ENTITY}|fast-{i}" for i in range(20)]
        writers = [threading.Thread(target=fast_writer, args=(journal, stop_writers, random.Random(i), pids))
                   for i in range(3)]
        writers += [threading.Thread(target=slow_writer, args=(dsn, stop_writers, random.Random(100 + i),
                                                                [f"{ENTITY}|slow-{i}-{k}" for k in range(3)]))
                    for i in range(2)]
        for writer in writers:
            writer.start()
        time.sleep(2.0)
        late = [Reader("late-from-start")]
        if not portable:  # portable: what lies before an offset counts as consumed, late commits included
            late.append(Reader("late-from-offset", start=readers[0].offsets[len(readers[0].offsets) // 2]))
        for reader in late:
            start(reader)
        readers += late
        time.sleep(2.0)
        third = Reader("latest")
        start(third)
        readers.append(third)
        time.sleep(1.5)
        stop_writers.set()
        for writer in writers:
            writer.join(10)
        rows = written(dsn)
        wanted = {r.name: expected_for(r, rows) for r in readers}
        with contextlib.suppress(AssertionError):
            eventually(lambda: all(set(r.delivered) >= wanted[r.name] or r.error for r in readers),
                       "every reader has every event", timeout=40)
        stop_readers.set()
        for reader in readers:
            reader.stream.close()
        for thread in threads:
            thread.join(10)
    assert len(rows) > 150, "the writers wrote too little to prove anything"
    for reader in readers:
        check(reader, wanted[reader.name])
    slow = next(r for r in readers if r.slow)
    assert slow.detached >= 1, "the slow consumer was never detached"
    assert all(r.joined for r in readers if not r.slow), [r.name for r in readers if not r.joined]
    # (On a loaded machine a consumer that cannot keep up for 2 s is detached too: it resumed on its own query,
    # which the checks above cover as well.)


def test_sixteen_consumers_share_one_query(journal: Journal) -> None:
    for i in range(10):
        journal.append(f"Share|{i}", [{"n": k} for k in range(5)])
    with Firehose(journal) as firehose:
        streams = [firehose.events_by_slices("Share", 0, 1023) for _ in range(16)]
        got: list[list[tuple[str, int]]] = [[] for _ in streams]
        stop = threading.Event()

        def drain(i: int) -> None:
            for envelope in streams[i]:
                got[i].append((envelope.persistence_id, envelope.seq_nr))

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        eventually(lambda: all(s.attached for s in streams), "all 16 consumers joined the shared query")
        for i in range(10):
            journal.append(f"Share|{i}", [{"n": 5}])
        eventually(lambda: all(len(g) == 60 for g in got), "every consumer got all 60 events")
        assert firehose.hoses == 1
        stop.set()
        for s in streams:
            s.close()
        for t in threads:
            t.join(10)
    for g in got:
        assert sorted(g) == sorted((f"Share|{i}", k) for i in range(10) for k in range(1, 7))
    assert firehose.hoses == 0


def test_a_hose_lingers_after_its_last_consumer_then_stops(journal: Journal) -> None:
    journal.append("Linger|1", ["a"])
    with Firehose(journal, linger=0.3) as firehose:
        first = firehose.events_by_slices("Linger", 0, 1023)
        assert next(first).persistence_id == "Linger|1"
        first.close()
        assert firehose.hoses == 1
        second = firehose.events_by_slices("Linger", 0, 1023)
        assert next(second).persistence_id == "Linger|1"  # the same hose, still running
        second.close()
        eventually(lambda: firehose.hoses == 0, "the hose stopped after lingering")


@pytest.mark.parametrize(("call", "error", "fragment"), [
    (lambda j: Firehose(j, buffer_size=1), ConfigurationError, "buffer_size must be an integer >= 2, got 1"),
    (lambda j: Firehose(j, slow_consumer_timeout=-1), ConfigurationError, "slow_consumer_timeout"),
    (lambda j: Firehose(j).events_by_slices("Cart", 0, 1024), InvalidArgument, "max_slice"),
    (lambda j: Firehose(j).events_by_slices("Cart", 0, 1023, "2026-01-01"), InvalidArgument, "TimestampOffset"),
    (lambda j: Firehose(j).events_by_slices("a\x00", 0, 1023), InvalidArgument, "entity type"),
])
def test_bad_firehose_input(journal: Journal, call: Any, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=None) as caught:
        call(journal)
    assert fragment in str(caught.value)


def test_closing_the_firehose_ends_its_consumers(journal: Journal) -> None:
    journal.append("Close|1", ["a"])
    firehose = Firehose(journal)
    joined = firehose.events_by_slices("Close", 0, 1023)
    assert next(joined).seq_nr == 1
    ended: list[int] = []
    reader = threading.Thread(target=lambda: ended.extend(e.seq_nr for e in joined))
    reader.start()
    firehose.close()
    reader.join(10)
    assert not reader.is_alive() and joined.closed and firehose.hoses == 0
    with pytest.raises(InvalidArgument, match="closed"):
        firehose.events_by_slices("Close", 0, 1023)
