"""Following an online move without new settings (docs/sharding.md, section 8): a sharded journal that knows the
move's target as a spare re-routes when a guard refuses its write (or ``check_layout`` sees the new layout) and
retries the write once; one that does not know it is refused, naming the database it misses."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support import FAST
from support.aio import check_once_in_order, take
from support.eventually import eventually
from test_move import move_cli, pid_in

from pgjournal.errors import ConcurrencyConflict, ConfigurationError, ShardLayoutMismatch
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.settings import Settings
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.aio import AsyncShardedJournal
from pgjournal.shards.move import Mover

pytestmark = pytest.mark.mode_independent

Databases = Callable[..., list[str]]


def database_id(dsn: str) -> uuid.UUID:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT database_id FROM pgjournal_shard_layout").fetchone()
        assert row is not None
        return uuid.UUID(str(row[0]))


def events_of(dsn: str, pid: str) -> list[tuple[int, Any]]:
    """``pid``'s events as stored in the database at ``dsn`` (seq_nr, payload bytes), whatever the layout says."""
    with psycopg.connect(dsn) as conn:
        return [(row[0], row[1]) for row in conn.execute(
            "SELECT seq_nr, event_payload FROM event_journal WHERE persistence_id = %s ORDER BY seq_nr", (pid,))]


def rollbacks(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0]) if row else 0


def test_spares_are_parsed_and_checked_by_name() -> None:
    parsed = ShardSettings.parse("0-511=postgresql://h/a; 512-1023=postgresql://h/b\nspare=postgresql://h/c")
    assert parsed.ranges == ((0, 511), (512, 1023)) and parsed.spares == ("postgresql://h/c",)
    assert ShardSettings.of(["postgresql://h/a"], spares=["postgresql://h/c"]).spares == ("postgresql://h/c",)
    with pytest.raises(ConfigurationError, match="spare DSN 'postgresql://h/a' is also the DSN of shard range 0-511"):
        ShardSettings.parse("0-511=postgresql://h/a;512-1023=postgresql://h/b;spare=postgresql://h/a")
    with pytest.raises(ConfigurationError, match="spare DSN 'postgresql://h/c' is given twice"):
        ShardSettings.parse("0-1023=postgresql://h/a;spare=postgresql://h/c;spare=postgresql://h/c")
    with pytest.raises(ConfigurationError, match="spare=DSN"):
        ShardSettings.parse("0-1023=postgresql://h/a;spares=postgresql://h/c")
    with pytest.raises(ConfigurationError):
        ShardSettings.parse("0-1023=postgresql://h/a;spare=")
    with pytest.raises(ConfigurationError, match="a list of DSNs"):
        ShardSettings(((0, 1023),), ("postgresql://h/a",), "postgresql://h/c")  # type: ignore[arg-type]


def test_a_refused_append_waits_for_the_switch_and_lands_once_on_the_spare_and_a_journal_without_it_is_told_what_is_missing(  # noqa: E501
        shard_databases: Databases, caplog: pytest.LogCaptureFixture) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    moved_pid, kept_pid = pid_in(512, 767, "acct|f"), pid_in(768, 1023, "acct|g")
    follower = ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), layout_wait=30, **FAST)
    checker = ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST)
    stale = ShardedJournal.open(old, layout_wait=0.2, **FAST)
    late = ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST)
    follower.append(moved_pid, ["before"], expected_seq_nr=0)
    outcome: dict[str, Any] = {}

    def follow() -> None:
        try:
            outcome["appended"] = follower.append(moved_pid, ["after"], expected_seq_nr=1)
        except BaseException as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=follow, daemon=True)

    def at(step: str, _rows: int) -> None:
        if step != "switch":
            return
        # Sealed and verified, not switched: the source refuses the range and every record still says version 1.
        before = rollbacks(b)
        writer.start()
        eventually(lambda: rollbacks(b) > before, "the follower's append is refused by the sealed source")
        assert writer.is_alive() and "appended" not in outcome  # waiting for the records to settle
        with pytest.raises(ShardLayoutMismatch, match=r"is not held.*did not settle within layout_wait.*under way"):
            stale.append(moved_pid, ["stale"])
        assert checker.check_layout().version == 1  # nothing to follow yet, and check_layout does not wait

    with Mover(old, (512, 767), c, keep=0, progress=at) as mover:
        mover.run()
    writer.join(30)
    assert "error" not in outcome, repr(outcome.get("error"))
    assert [e.seq_nr for e in outcome["appended"]] == [2]
    assert follower.layout.version == 2 and follower.shards.dsns == (a, c, b) and follower.shards.spares == ()
    assert len(events_of(c, moved_pid)) == 2 and events_of(b, moved_pid) == []  # once each, on the target
    assert [e.event for e in follower.query.current_events_by_persistence_id(moved_pid)] == ["before", "after"]

    # check_layout follows too: the next append goes to the target without a refusal
    assert checker.check_layout().version == 2 and checker.layout.version == 2
    checker.append(moved_pid, ["checked"], expected_seq_nr=2)
    assert len(events_of(c, moved_pid)) == 3

    # Without the spare: refused, naming the database no DSN of the journal reaches; other ranges carry on.
    target = database_id(c)
    with pytest.raises(ShardLayoutMismatch, match=rf"slice {slice_for_persistence_id(moved_pid)} is not held.*"
                                                  rf"512-767 on database {target}, which no DSN of this journal "
                                                  "reaches; list that database's DSN as a spare"):
        stale.append(moved_pid, ["stale"])
    with pytest.raises(ShardLayoutMismatch, match=rf"the databases record 0-511, 512-767, 768-1023 \(version 2\), "
                                                  rf"with slices 512-767 on database {target}"):
        stale.check_layout()
    stale.append(kept_pid, ["unmoved"])
    assert len(events_of(c, moved_pid)) == 3
    # Its sequence number checked where the range is no more (its rows deleted there): the move, not a conflict.
    with pytest.raises(ShardLayoutMismatch, match=rf"512-767 on database {target}, which no DSN"):
        stale.append(moved_pid, ["stale"], expected_seq_nr=3)
    with pytest.raises(ConcurrencyConflict):  # a conflict in a range that did not move stays one
        stale.append(kept_pid, ["again"], expected_seq_nr=0)
    # A journal with the spare that has not followed yet: its checked append lands where the range went.
    assert late.layout.version == 1
    assert [e.seq_nr for e in late.append(moved_pid, ["late"], expected_seq_nr=3)] == [4]
    assert late.layout.version == 2 and len(events_of(c, moved_pid)) == 4
    with pytest.raises(ConcurrencyConflict):
        late.append(moved_pid, ["late"], expected_seq_nr=3)
    for journal in (follower, checker, stale, late):
        journal.close()

    # Restarted with its settings of before: refused without the spare, routed by the records with it.
    with pytest.raises(ShardLayoutMismatch, match=r"the settings name ranges 0-511, 512-1023 but the databases "
                                                  r"record 0-511, 512-767, 768-1023 \(version 2\)"):
        ShardedJournal.open(old, **FAST)
    with caplog.at_level(logging.WARNING, logger="pgjournal.shards.routing"), \
            ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as restarted:
        assert restarted.layout.version == 2 and restarted.shards.dsns == (a, c, b) and restarted.shards.spares == ()
        assert [e.seq_nr for e in restarted.append(moved_pid, ["restarted"], expected_seq_nr=4)] == [5]
    assert len(events_of(c, moved_pid)) == 5
    assert "routing by the records" in caplog.text and "update the settings to 0-511" in caplog.text


def test_a_write_waiting_on_a_sealed_range_goes_where_it_was_going_when_the_move_is_rolled_back(
        shard_databases: Databases) -> None:
    a, b, c = shard_databases(3)
    migrate_all(ShardSettings.of([a, b]))
    moved_pid = pid_in(512, 767, "acct|r")
    assert move_cli(a, b, c, kill_after="verify").returncode == -signal.SIGKILL  # sealed, not switched
    with ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), layout_wait=60, **FAST) as journal:
        outcome: dict[str, Any] = {}
        before = rollbacks(b)
        writer = threading.Thread(target=lambda: outcome.setdefault("appended", journal.append(moved_pid, ["w"])),
                                  daemon=True)
        writer.start()
        eventually(lambda: rollbacks(b) > before, "the append is refused by the sealed source")
        assert writer.is_alive()
        rolled = move_cli(a, b, c, "--rollback")
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        writer.join(30)
        assert [e.seq_nr for e in outcome["appended"]] == [1] and journal.layout.version == 1
    assert len(events_of(b, moved_pid)) == 1 and events_of(c, moved_pid) == []


async def test_the_asyncio_face_follows_by_the_same_rule(shard_databases: Databases) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    moved_pid = pid_in(512, 767, "acct|h")
    async with AsyncShardedJournal.open(ShardSettings.parse(f"0-511={a};512-1023={b};spare={c}"), **FAST) as follower, \
            AsyncShardedJournal.open(old, **FAST) as stale:
        await follower.append(moved_pid, ["before"], expected_seq_nr=0)
        with Mover(old, (512, 767), c, keep=0) as mover:
            mover.run()
        appended = await follower.append(moved_pid, iter(["after"]), expected_seq_nr=1)
        assert [e.seq_nr for e in appended] == [2] and follower.layout.version == 2
        assert len(events_of(c, moved_pid)) == 2 and events_of(b, moved_pid) == []
        with pytest.raises(ShardLayoutMismatch, match=f"on database {database_id(c)}, which no DSN"):
            await stale.append(moved_pid, ["stale"])
        with pytest.raises(ShardLayoutMismatch, match=f"on database {database_id(c)}, which no DSN"):
            await stale.check_layout()
        with pytest.raises(ShardLayoutMismatch, match=f"on database {database_id(c)}, which no DSN"):
            await stale.append(moved_pid, ["stale"], expected_seq_nr=2)
    async with AsyncShardedJournal.open(ShardSettings.parse(f"0-511={a};512-1023={b};spare={c}"), **FAST) as restarted:
        assert restarted.layout.version == 2 and restarted.shards.dsns == (a, c, b)
        assert [e.seq_nr for e in await restarted.append(moved_pid, ["restarted"], expected_seq_nr=2)] == [3]


class Writer(threading.Thread):
    """Appends to its entities in turn, on one journal for its whole life (never reopened); records each append's
    duration: the longest is the writer's longest pause."""

    def __init__(self, journal: ShardedJournal, pids: list[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.journal, self.pids, self.stop = journal, pids, stop
        self.written = dict.fromkeys(pids, 0)
        self.longest: dict[str, float] = dict.fromkeys(pids, 0.0)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for pid in self.pids:
                    started = time.monotonic()
                    self.journal.append(pid, [f"{pid}:{self.written[pid] + 1}"], expected_seq_nr=self.written[pid])
                    self.longest[pid] = max(self.longest[pid], time.monotonic() - started)
                    self.written[pid] += 1
                time.sleep(0.002)  # pacing: 2 cores are shared with the mover and the server
        except BaseException as exc:
            self.error = exc


def test_writers_with_the_spare_keep_appending_across_a_move_without_reopening(shard_databases: Databases) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    pids = [f"acct|{uuid.uuid5(uuid.NAMESPACE_URL, str(i))}" for i in range(24)]
    moved = [p for p in pids if 512 <= slice_for_persistence_id(p) <= 767]
    assert moved and len(moved) < len(pids)
    stop = threading.Event()
    with ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as journal:
        writers = [Writer(journal, pids[i::2], stop) for i in range(2)]
        for writer in writers:
            writer.start()
        eventually(lambda: all(sum(w.written.values()) > 20 for w in writers), timeout=30)
        with Mover(old, (512, 767), c, Settings.load(backtracking_window=2.0), keep=0, chunk_slices=16,
                   catch_up_rows=50, catch_up_passes=6) as mover:
            mover.run()
        then = sum(sum(w.written.values()) for w in writers)
        eventually(lambda: sum(sum(w.written.values()) for w in writers) > then + 50 or any(w.error for w in writers),
                   timeout=60)
        stop.set()
        for writer in writers:
            writer.join(60)
            assert writer.error is None, repr(writer.error)
        assert journal.layout.version == 2
    written = {pid: n for w in writers for pid, n in w.written.items()}
    where = {a: (0, 511), c: (512, 767), b: (768, 1023)}
    for pid, n in written.items():  # every append exactly once, in the database the new layout puts it
        for dsn, (lo, hi) in where.items():
            expected = n if lo <= slice_for_persistence_id(pid) <= hi else 0
            assert len(events_of(dsn, pid)) == expected, (pid, dsn)
    longest = max(w.longest[p] for w in writers for p in moved if p in w.longest)
    print(f"\nlongest append of a moved-range entity (its writer's pause, the move followed without reopening): "
          f"{longest:.3f} s")
    assert longest <= 5.0


# -- a live by-slices stream follows a move by itself ----------------------------------------------------------

class Reading(threading.Thread):
    """Iterates a live by-slices stream until it ends, keeping (pid, seq_nr) of each envelope and what it raised."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.seen: list[tuple[str, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for envelope in self.stream:
                self.seen.append((envelope.persistence_id, envelope.seq_nr))
        except BaseException as exc:
            self.error = exc


def moved_pids(n: int) -> list[str]:
    return [pid_in(512, 767, f"acct|s{i}-") for i in range(n)]


def test_a_live_by_slices_stream_follows_a_move_of_its_range_by_itself(shard_databases: Databases) -> None:
    """The stream never calls ``check_layout``: without following, it kept polling the database the range left,
    and the events appended after the move (on the target only) never came."""
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    pids = moved_pids(4)
    with ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as journal:
        for pid in pids:
            journal.append(pid, ["one", "two"], expected_seq_nr=0)
        with journal.query.events_by_slices("acct", 512, 767) as stream:
            reading = Reading(stream)
            reading.start()
            eventually(lambda: len(reading.seen) == 8, timeout=30)
            with Mover(old, (512, 767), c, keep=0) as mover:
                mover.run()
            for pid in pids:
                journal.append(pid, ["three", "four"], expected_seq_nr=2)
            assert all(events_of(b, pid) == [] and len(events_of(c, pid)) == 4 for pid in pids)
            eventually(lambda: len(reading.seen) >= 16 or reading.error is not None, timeout=30)
        reading.join(10)
    assert reading.error is None, repr(reading.error)
    check_once_in_order(reading.seen, {(pid, n) for pid in pids for n in range(1, 5)}, "the stream across the move")


def test_a_live_durable_state_change_stream_follows_a_move_too(shard_databases: Databases) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    pids = moved_pids(3)
    with ShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as journal:
        for pid in pids:
            journal.durable_state.upsert(pid, 1, {"v": 1})
        with journal.durable_state.changes_by_slices("acct", 512, 767) as changes:
            seen = [(next(changes).persistence_id, 1) for _ in pids]
            with Mover(old, (512, 767), c, keep=0) as mover:
                mover.run()
            for pid in pids:
                journal.durable_state.upsert(pid, 2, {"v": 2})
            for _ in pids:
                change = next(changes)  # without following, this waited for ever on the range's old database
                seen.append((change.persistence_id, change.revision))
    assert sorted(seen) == sorted((pid, n) for pid in pids for n in (1, 2))


async def test_the_asyncio_stream_follows_by_the_same_rule(shard_databases: Databases) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    pids = moved_pids(3)
    async with AsyncShardedJournal.open(ShardSettings.of([a, b], spares=[c]), **FAST) as journal:
        for pid in pids:
            await journal.append(pid, ["one"], expected_seq_nr=0)
        async with journal.query.events_by_slices("acct", 512, 767) as stream:
            seen = await take(stream, 3)
            with Mover(old, (512, 767), c, keep=0) as mover:
                await asyncio.to_thread(mover.run)
            for pid in pids:
                await journal.append(pid, ["two"], expected_seq_nr=1)
            seen += await take(stream, 3)
    check_once_in_order([(e.persistence_id, e.seq_nr) for e in seen], {(p, n) for p in pids for n in (1, 2)},
                        "the asyncio stream across the move")


@pytest.mark.parametrize("case", ["split", "unknown"])
def test_a_stream_that_cannot_follow_raises_a_layout_mismatch_naming_why(shard_databases: Databases,
                                                                         case: str) -> None:
    """A move that leaves the stream's range on two databases is raised at the first check after it; a target this
    journal reaches by no DSN (no spare) once the records have not settled for ``layout_wait``."""
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    migrate_all(old)
    settings = ShardSettings.of([a, b], spares=[c]) if case == "split" else old
    lo, hi = (512, 1023) if case == "split" else (512, 767)
    with ShardedJournal.open(settings, **FAST, layout_wait=1.0) as journal:
        stream = journal.query.events_by_slices("acct", lo, hi)
        reading = Reading(stream)
        reading.start()
        with Mover(old, (512, 767), c, keep=0) as mover:
            mover.run()
        reading.join(30)
    assert not reading.is_alive() and stream.closed
    expected = (r"cannot follow layout version 2: slice range 512-1023 spans 2 databases" if case == "split"
                else f"on database {database_id(c)}, which no DSN")
    assert isinstance(reading.error, ShardLayoutMismatch) and re.search(expected, str(reading.error)), reading.error
