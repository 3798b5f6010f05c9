"""Readers on a hot standby (``Journal.open(dsn, replica=STANDBY)``, :mod:`pgjournal.core.replica`), against a real
standby built with ``pg_basebackup`` from a private primary (:mod:`support.standby`).

A reader on the standby takes the primary's horizon and reads the standby only once it has replayed the primary's
WAL up to that reading. Without it (a journal opened on the standby itself, whose ``pg_locks`` shows none of the
primary's writers) the main query passes an event still uncommitted on the primary; with backtracking off it is
never delivered, and with backtracking on it is lost once it commits later than the backtracking window: every
test here fails that way on a reader that takes its horizon from the standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from support import FAST
from support.eventually import eventually
from support.standby import StandbyPair, standby_pair

from pgjournal import ConfigurationError, HorizonBlocked, Journal, Source
from pgjournal.aio import AsyncJournal
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import AsyncShardedJournal, ShardedJournal, ShardSettings, migrate_all

pytestmark = [pytest.mark.timing, pytest.mark.mode_independent, pytest.mark.servers]

#: Backtracking far behind (only the main query could deliver a late event within a test).
NO_BACKTRACKING: dict[str, Any] = dict(FAST, backtracking_enabled=False)


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    with standby_pair() as built:
        yield built


def _counting_reads(journal: Any) -> list[int]:
    """Count the by-slice reads' connections (one per poll) of ``journal``."""
    polls = [0]
    borrow = journal.read_connection

    def counted() -> Any:
        polls[0] += 1
        return borrow()

    journal.read_connection = counted
    return polls


def test_a_standby_reader_does_not_pass_a_writer_open_on_the_primary(pair: StandbyPair) -> None:
    got: list[Any] = []
    with Journal.open(pair.primary_dsn, **FAST) as writer, \
            Journal.open(pair.primary_dsn, replica=pair.standby_dsn, **NO_BACKTRACKING) as reader:
        polls = _counting_reads(reader)
        with reader.query.events_by_slices("Open", 0, 1023) as live:
            thread = threading.Thread(target=lambda: got.extend(live), daemon=True)
            thread.start()
            with writer.transaction() as tx:
                tx.append("Open|late", [{"n": 1}], expected_seq_nr=0)
                writer.append("Open|early", [{"n": 1}])
                pair.wait_replayed()  # the committed event is on the standby, the open one is not committed
                assert list(reader.query.current_events_by_slices("Open", 0, 1023)) == [], \
                    "a current query on the standby read past the writer open on the primary"
                seen = polls[0]
                eventually(lambda: polls[0] >= seen + 3, "three polls of the standby reader")
                assert got == [], "the live query on the standby read past the writer open on the primary"
            eventually(lambda: len(got) == 2, "both events on the standby")
            live.close()
        thread.join(5)
    assert [(e.persistence_id, e.source is Source.BACKTRACKING) for e in got] == [
        ("Open|late", False), ("Open|early", False)]


async def test_asyncio_a_standby_reader_does_not_pass_a_writer_open_on_the_primary(pair: StandbyPair) -> None:
    got: list[Any] = []

    async def read(live: Any) -> None:
        async for envelope in live:
            got.append(envelope)

    async with AsyncJournal.open(pair.primary_dsn, **FAST) as writer, \
            AsyncJournal.open(pair.primary_dsn, replica=pair.standby_dsn, **NO_BACKTRACKING) as reader:
        polls = _counting_reads(reader)
        live = reader.query.events_by_slices("AOpen", 0, 1023)
        task = asyncio.create_task(read(live))
        async with writer.transaction() as tx:
            await tx.append("AOpen|late", [{"n": 1}], expected_seq_nr=0)
            await writer.append("AOpen|early", [{"n": 1}])
            await asyncio.to_thread(pair.wait_replayed)
            assert [e async for e in reader.query.current_events_by_slices("AOpen", 0, 1023)] == []
            seen = polls[0]
            await asyncio.to_thread(eventually, lambda: polls[0] >= seen + 3, "three polls of the standby reader")
            assert got == []
        await asyncio.to_thread(eventually, lambda: len(got) == 2, "both events on the standby")
        live.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [(e.persistence_id, e.source is Source.BACKTRACKING) for e in got] == [
        ("AOpen|late", False), ("AOpen|early", False)]


@contextlib.contextmanager
def _replay_paused(pair: StandbyPair) -> Iterator[None]:
    with psycopg.connect(pair.standby_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        try:
            yield
        finally:
            conn.execute("SELECT pg_wal_replay_resume()")


def test_a_standby_that_has_not_replayed_holds_its_readers_back_and_counts_in_their_lag(pair: StandbyPair) -> None:
    got: list[Any] = []
    settings = dict(NO_BACKTRACKING, backtracking_behind_current_time=0.3)  # a one-shot bound waits this long
    with Journal.open(pair.primary_dsn, **FAST) as writer, \
            Journal.open(pair.primary_dsn, replica=pair.standby_dsn, **settings) as reader, \
            reader.query.events_by_slices("Paused", 0, 1023) as live:
        polls = _counting_reads(reader)
        thread = threading.Thread(target=lambda: got.extend((e, time.time()) for e in live), daemon=True)
        thread.start()
        with _replay_paused(pair):
            writer.append("Paused|1", [{"n": 1}])
            with pytest.raises(HorizonBlocked, match="has not replayed"):
                list(reader.query.current_events_by_slices("Paused", 0, 1023))
            seen = polls[0]
            eventually(lambda: polls[0] >= seen + 3, "three polls of the standby reader")
            assert got == []
            resumed = time.time()
        eventually(lambda: len(got) == 1, "the event once the standby replays")
        live.close()
    thread.join(5)
    envelope, delivered_at = got[0]
    assert envelope.persistence_id == "Paused|1" and delivered_at >= resumed


async def test_a_journal_opened_on_the_standby_itself_refuses_live_by_slice_reads(pair: StandbyPair) -> None:
    """No primary named: the standby's horizon would be the clock (it shows none of the primary's writers) and a
    commit later than the backtracking window never delivered. Live by-slice reads are refused naming ``replica=``
    on both faces, current ones are not, and ``standby_live_reads=True`` reads live there anyway."""
    refused = r"is a hot standby \(in recovery\).*replica="
    with Journal.open(pair.primary_dsn, **FAST) as writer:
        writer.append("Direct|1", [{"n": 1}])
    pair.wait_replayed()
    with Journal.open(pair.standby_dsn, **FAST) as journal:
        with pytest.raises(ConfigurationError, match=refused):
            journal.query.events_by_slices("Direct", 0, 1023)
        with pytest.raises(ConfigurationError, match=refused):
            journal.durable_state.changes_by_slices("Direct", 0, 1023)
        with pytest.raises(ConfigurationError, match=refused):
            journal.query.events_by_slices_starting_from_snapshots("Direct", 0, 1023, transform=lambda s: s)
        assert [e.persistence_id for e in journal.query.current_events_by_slices("Direct", 0, 1023)] == ["Direct|1"]
    async with AsyncJournal.open(pair.standby_dsn, **FAST) as opened:
        with pytest.raises(ConfigurationError, match=refused):
            opened.query.events_by_slices("Direct", 0, 1023)
        with pytest.raises(ConfigurationError, match=refused):
            opened.durable_state.changes_by_slices("Direct", 0, 1023)
    told = dict(FAST, standby_live_reads=True)
    with Journal.open(pair.standby_dsn, **told) as journal, journal.query.events_by_slices("Direct", 0, 1023) as live:
        assert next(iter(live)).persistence_id == "Direct|1"
    async with AsyncJournal.open(pair.standby_dsn, **told) as opened, \
            opened.query.events_by_slices("Direct", 0, 1023) as alive:
        assert (await anext(aiter(alive))).persistence_id == "Direct|1"


def test_a_replica_that_is_no_standby_is_refused_at_open(pair: StandbyPair) -> None:
    with pytest.raises(ConfigurationError, match="is not a standby"):
        Journal.open(pair.primary_dsn, replica=pair.primary_dsn)


async def test_a_standby_of_another_cluster_or_database_is_refused_at_open(pair: StandbyPair, dsn: str) -> None:
    """A standby passed the checks whatever it was a standby of: readers would have read another cluster's or
    another database's rows (and waited for WAL positions that are not the primary's)."""
    with pytest.raises(ConfigurationError, match=r"is a standby of another cluster \(system identifier"):
        Journal.open(dsn, replica=pair.standby_dsn)  # the suite's server: not the pair's primary
    async with AsyncJournal.open(pair.primary_dsn, **FAST) as opened:  # the asyncio face runs the same steps
        assert opened.replica_dsn is None
    with pytest.raises(ConfigurationError, match=r"is a standby of another cluster"):
        await AsyncJournal.open(dsn, replica=pair.standby_dsn)
    with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE other_db")
    try:
        pair.wait_replayed()
        standby_of_other = psycopg.conninfo.make_conninfo(pair.standby_dsn, dbname="other_db")
        with pytest.raises(ConfigurationError, match=r"reaches database 'other_db', the primary's is"):
            Journal.open(pair.primary_dsn, replica=standby_of_other)
    finally:
        with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
            conn.execute("DROP DATABASE other_db")


async def test_a_sharded_journal_reads_each_database_on_its_own_standby(pair: StandbyPair,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two databases of the pair's primary, each with its standby (the same standby server, the database's name):
    each range's by-slice reads go to its database's standby, on both faces; one replica for all is refused, and
    a standby of the other database is refused by the journal of the range it was given for."""
    with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
        for name in ("shard_a", "shard_b"):
            conn.execute(f"CREATE DATABASE {name}")
    try:
        a, b = (psycopg.conninfo.make_conninfo(pair.primary_dsn, dbname=n) for n in ("shard_a", "shard_b"))
        sa, sb = (psycopg.conninfo.make_conninfo(pair.standby_dsn, dbname=n) for n in ("shard_a", "shard_b"))
        migrate_all(ShardSettings.of([a, b]))
        pair.wait_replayed()
        settings = ShardSettings.of([a, b], replicas={"0-511": sa, "512-1023": sb})
        pids = [f"acct|{i}" for i in range(20)]
        with ShardedJournal.open(settings, **FAST) as journal:
            assert [j.replica_dsn for j in journal.journals] == [sa, sb]
            polls = [_counting_reads(j) for j in journal.journals]
            for pid in pids:
                journal.append(pid, [pid], expected_seq_nr=0)
            for i, (lo, hi) in enumerate(settings.ranges):
                expected = {p for p in pids if lo <= slice_for_persistence_id(p) <= hi}
                eventually(lambda lo=lo, hi=hi, expected=expected: {
                    e.persistence_id for e in journal.query.current_events_by_slices("acct", lo, hi)} == expected,
                    f"slices {lo}-{hi} read on their standby")
                assert polls[i][0] > 0
        async with AsyncShardedJournal.open(settings, **FAST) as opened:
            assert [j.replica_dsn for j in opened.journals] == [sa, sb]
        with pytest.raises(ConfigurationError, match=r"reaches database 'shard_b', the primary's is 'shard_a'"):
            ShardedJournal.open(ShardSettings.of([a, b], replicas={"0-511": sb}), **FAST)
        with pytest.raises(ConfigurationError, match="a hot standby per database, not one for all"):
            ShardedJournal.open(ShardSettings.of([a, b]), replica=sa)
        monkeypatch.setenv("PGJOURNAL_REPLICA_DSN", sa)
        with pytest.raises(ConfigurationError, match=r"PGJOURNAL_REPLICA_DSN\): give each as replica:RANGE=DSN"):
            ShardedJournal.open(ShardSettings.of([a, b]))
    finally:
        with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
            for name in ("shard_a", "shard_b"):
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- stalled writers ---------------------------------------------------------------------------------------


@dataclass
class Reader:
    """A live by-slice reader: each event's (pid, seq_nr, db_timestamp, delivered at: wall clock)."""

    name: str
    got: list[tuple[str, int, datetime, float]] = field(default_factory=list)

    def run(self, live: Any) -> None:
        for e in live:
            self.got.append((e.persistence_id, e.seq_nr, e.db_timestamp, time.time()))

    def lags(self) -> list[float]:
        return [at - ts.timestamp() for _, _, ts, at in self.got]


def _stalling_writer(journal: Journal, stop: threading.Event, rng: random.Random, pids: list[str],
                     stalled: float, longest: float) -> None:
    """Appends in its own transactions; ``stalled`` of them stay open up to ``longest`` s after their insert."""
    highest = dict.fromkeys(pids, 0)
    while not stop.is_set():
        pid = rng.choice(pids)
        count = rng.randint(1, 2)
        with journal.transaction() as tx:
            tx.append(pid, [{"w": 1}] * count, expected_seq_nr=highest[pid])
            if rng.random() < stalled:
                time.sleep(rng.uniform(longest / 2, longest))  # stamped at the insert, committed much later
        highest[pid] += count
        time.sleep(rng.uniform(0, 0.02))


def _replay_lags(pair: StandbyPair, stop: threading.Event, out: list[float]) -> None:
    """The standby's replay lag, sampled: how long until it has replayed the primary's WAL insert position."""
    with psycopg.connect(pair.primary_dsn, autocommit=True) as primary, \
            psycopg.connect(pair.standby_dsn, autocommit=True) as standby:
        while not stop.is_set():
            row = primary.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            assert row is not None
            started = time.monotonic()
            while not stop.is_set():
                done = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)).fetchone()
                if done and done[0]:
                    out.append(time.monotonic() - started)
                    break
                time.sleep(0.001)
            time.sleep(0.02)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def stalled_writers(pair: StandbyPair, *, writers: int, events: int, stalled: float, longest: float,
                    entity: str) -> dict[str, Any]:
    """Writers on the primary, some transactions stalled longer than the readers' backtracking window; live
    readers over two slice ranges on the primary and on the standby. Returns the figures; asserts none missed,
    duplicated or out of order."""
    reading = dict(FAST, backtracking_window=longest / 4, backtracking_behind_current_time=longest / 8,
                   pool_max_size=4)
    rng = random.Random(34)
    stop, replay_stop = threading.Event(), threading.Event()
    readers = {side: [Reader(f"{side} {lo}-{hi}") for lo, hi in ((0, 511), (512, 1023))]
               for side in ("primary", "standby")}
    replay: list[float] = []
    with Journal.open(pair.primary_dsn, **dict(FAST, pool_max_size=writers + 2)) as journal, \
            Journal.open(pair.primary_dsn, **reading) as on_primary, \
            Journal.open(pair.primary_dsn, replica=pair.standby_dsn, **reading) as on_standby, \
            contextlib.ExitStack() as stack:
        threads = []
        for side, opened in (("primary", on_primary), ("standby", on_standby)):
            for reader, (lo, hi) in zip(readers[side], ((0, 511), (512, 1023)), strict=True):
                live = stack.enter_context(opened.query.events_by_slices(entity, lo, hi))
                threads.append(threading.Thread(target=reader.run, args=(live,), daemon=True))
        sampler = threading.Thread(target=_replay_lags, args=(pair, replay_stop, replay), daemon=True)
        writing = [threading.Thread(target=_stalling_writer, args=(
            journal, stop, random.Random(rng.random()), [f"{entity}|w{i}-{k}" for k in range(12)], stalled, longest),
            daemon=True) for i in range(writers)]
        for thread in [*threads, sampler, *writing]:
            thread.start()

        def written() -> int:
            with journal.connection() as conn:
                row = conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = %s", (entity,)).fetchone()
            return int(row[0]) if row else 0

        eventually(lambda: written() >= events, f"{events} events written", timeout=600, interval=0.2)
        stop.set()
        for thread in writing:
            thread.join(30)
        with journal.connection() as conn:
            expected = {(pid, seq) for pid, seq in conn.execute(
                "SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s", (entity,))}
        everyone = [r for side in readers.values() for r in side]
        eventually(lambda: all(sum(1 for _ in r.got) >= 0 for r in everyone) and sum(
            len(r.got) for r in readers["standby"]) >= len(expected) and sum(
            len(r.got) for r in readers["primary"]) >= len(expected), "every event delivered on both sides",
            timeout=120, interval=0.1)
        replay_stop.set()
        sampler.join(5)
    figures: dict[str, Any] = {"writers": writers, "events": len(expected), "stalled_share": stalled,
                               "longest_stall_s": longest, "backtracking_window_s": reading["backtracking_window"]}
    for side, pair_of in readers.items():
        delivered = [(pid, seq) for r in pair_of for pid, seq, _, _ in r.got]
        assert len(delivered) == len(set(delivered)), f"{side}: duplicates"
        assert set(delivered) == expected, f"{side}: missed {sorted(expected - set(delivered))[:5]}"
        for r in pair_of:
            last: dict[str, int] = {}
            for pid, seq, _, _ in r.got:
                assert seq > last.get(pid, 0), f"{r.name}: {pid} {seq} after {last.get(pid)}"
                last[pid] = seq
        lags = [lag for r in pair_of for lag in r.lags()]
        figures[side] = {"lag_p50_s": round(_percentile(lags, 0.5), 4), "lag_p99_s": round(_percentile(lags, 0.99), 4),
                         "lag_max_s": round(max(lags), 4), "missed": 0, "duplicated": 0}
    figures["replay_lag"] = {"samples": len(replay), "p50_s": round(_percentile(replay, 0.5), 4),
                             "p99_s": round(_percentile(replay, 0.99), 4), "max_s": round(max(replay, default=0), 4)}
    figures["standby_max_minus_primary_max_s"] = round(figures["standby"]["lag_max_s"]
                                                       - figures["primary"]["lag_max_s"], 4)
    return figures


def test_stalled_writers_quick(pair: StandbyPair) -> None:
    figures = stalled_writers(pair, writers=4, events=200, stalled=0.1, longest=1.0, entity="QuickStall")
    print(json.dumps(figures, indent=2))
    budget = figures["primary"]["lag_max_s"] + figures["replay_lag"]["max_s"] + 0.1
    assert figures["standby"]["lag_max_s"] <= budget + 0.2, figures  # a shared machine: some slack at this size


@pytest.mark.slow
def test_stalled_writers_full(pair: StandbyPair) -> None:
    """The issue's scenario: 8 writers, 5 % of inserts stalled up to 1.5 s, 1,600 events; figures written to
    bench/results/standby.json (``PGJOURNAL_STANDBY_RESULTS`` to put them elsewhere)."""
    figures = stalled_writers(pair, writers=8, events=1600, stalled=0.05, longest=1.5, entity="FullStall")
    print(json.dumps(figures, indent=2))
    target = Path(os.environ.get("PGJOURNAL_STANDBY_RESULTS",
                                 Path(__file__).resolve().parents[2] / "bench" / "results" / "standby.json"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(figures, indent=2) + "\n")
    budget = figures["primary"]["lag_max_s"] + figures["replay_lag"]["max_s"] + 0.1
    assert figures["standby"]["lag_max_s"] <= budget, figures
