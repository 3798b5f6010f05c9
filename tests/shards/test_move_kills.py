"""The online move (docs/sharding.md, section 6) under a kill -9 that is not the mover's: a writer of
the moved range killed between the copy and the seal, with an append in flight, and either server killed while
the mover runs a step. Each leaves the old layout or the new, never a mix; the move resumes, and every event is
in its one database exactly once (the mover's own kills: tests/shards/test_move.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql
from support import FAST
from support.database import own_embedded_server
from support.eventually import eventually
from test_move import ROOT, admits, after_move, count, move_cli, opens, pid_in, seed

from pgjournal.admin.migrate import upgrade
from pgjournal.errors import DatabaseUnavailable
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.server.dsn import mask_dsn
from pgjournal.server.embedded import EmbeddedServer
from pgjournal.shards import ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.move import Mover

pytestmark = [pytest.mark.timing, pytest.mark.mode_independent]

Databases = Callable[..., list[str]]

#: The writer: appends one event at a time to its persistence id through the old layout and prints each seq_nr
#: once committed. When the hold file appears it appends the next one in a transaction it leaves open (``open``)
#: or commits (``committed``), says ``holding``, and waits to be killed: the append in flight, unreported.
WRITER = """
import sys, time
from pathlib import Path
from support import FAST
from pgjournal import Journal
from pgjournal.shards import ShardedJournal, ShardSettings
first, source, pid, hold, mode = sys.argv[1:6]
with ShardedJournal.open(ShardSettings.of([first, source]), **FAST) as journal:
    n = 0
    while not Path(hold).exists():
        journal.append(pid, [f"w{n + 1}"], expected_seq_nr=n)
        n += 1
        print(n, flush=True)
in_flight = Journal.open(source, **FAST).transaction()
in_flight.__enter__().append(pid, [f"w{n + 1}"], expected_seq_nr=n)
if mode == "committed":
    in_flight.__exit__(None, None, None)
print("holding", flush=True)
time.sleep(3600)
"""


class WriterProcess:
    """The writer above as a child process; its reported lines read on demand."""

    def __init__(self, first: str, source: str, pid: str, hold: Path, mode: str) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
        self.process = subprocess.Popen([sys.executable, "-c", WRITER, first, source, pid, str(hold), mode],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def committed(self) -> list[int]:
        return [int(line) for line in self.lines if line.isdigit()]

    def read_until(self, done: Callable[[], bool], what: str) -> None:
        out: IO[str] | None = self.process.stdout
        assert out is not None
        while not done():
            line = out.readline()  # the writer prints a line per append: this blocks only while it makes progress
            if not line:
                err = self.process.stderr.read() if self.process.stderr else ""
                raise AssertionError(f"the writer exited ({self.process.wait()}) before {what}: {err}")
            self.lines.append(line.strip())

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        if self.process.stdout:
            self.lines += [line.strip() for line in self.process.stdout.read().splitlines()]
            self.process.stdout.close()
        if self.process.stderr:
            self.process.stderr.close()


def seq_nrs(dsn: str, pid: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT seq_nr FROM event_journal WHERE persistence_id = %s "
                                               "ORDER BY seq_nr", (pid,)).fetchall()]


def others_in_place(new: ShardSettings, written: dict[str, int]) -> None:
    with ShardedJournal.open(new, **FAST) as journal:
        for pid, highest in written.items():
            assert journal.highest_seq_nr(pid) == highest


@pytest.mark.parametrize("in_flight", ["open", pytest.param("committed", marks=pytest.mark.crash_states)])
def test_a_writer_killed_between_copy_and_seal_loses_no_reported_append_and_leaves_no_stray(
        shard_databases: Databases, tmp_path: Path, in_flight: str) -> None:
    a, b, c = shard_databases(3)
    old = ShardSettings.of([a, b])
    new = after_move(a, b, c)
    migrate_all(old)
    with ShardedJournal.open(old, **FAST) as journal:
        written = seed(journal, 20)
    pid = pid_in(512, 767, f"acct|w{uuid.uuid4().hex[:6]}")
    hold = tmp_path / "hold"
    writer = WriterProcess(a, b, pid, hold, in_flight)
    try:
        writer.read_until(lambda: len(writer.committed()) >= 5, "its first appends")
        # The mover stops after the bulk copy, then (resumed) after the check: the writer's appends of both gaps
        # reach the target only through the catch-up, the check and the verify inside the seal.
        assert move_cli(a, b, c, kill_after="copy").returncode == -signal.SIGKILL
        at_copy = len(writer.committed())
        writer.read_until(lambda: len(writer.committed()) >= at_copy + 5, "appends after the copy")
        assert move_cli(a, b, c, "--resume", kill_after="check").returncode == -signal.SIGKILL
        at_check = len(writer.committed())
        writer.read_until(lambda: len(writer.committed()) >= at_check + 5, "appends after the check")
        hold.touch()
        writer.read_until(lambda: "holding" in writer.lines, "its append in flight")
        assert writer.process.poll() is None
    finally:
        writer.kill()
    reported = writer.committed()
    assert reported == list(range(1, len(reported) + 1))
    assert (opens(old), opens(new)) == (True, False)  # killed writer, unsealed move: the old layout, whole
    resumed = move_cli(a, b, c, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (opens(old), opens(new)) == (False, True)
    in_target = seq_nrs(c, pid)
    flight = reported[-1] + 1
    # Every reported append once, no gap, and the one in flight there exactly when its transaction committed.
    assert in_target == [*reported, *([flight] if in_flight == "committed" else [])]
    assert count(b, "event_journal", 512, 767) == 0 and seq_nrs(b, pid) == []
    others_in_place(new, written)
    with ShardedJournal.open(new, **FAST) as journal:  # and the entity carries on from there
        journal.append(pid, ["after"], expected_seq_nr=in_target[-1])


# -- a server killed while the mover runs a step ---------------------------------------------------------------

@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """An embedded server of this test alone: it is killed with SIGKILL and restarted."""
    with own_embedded_server("pgjournal-move-kill-") as server:
        yield server


def database_on(server: EmbeddedServer) -> str:
    name = f"shard_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(server.dsn, dbname=name)


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def kill_9(server: EmbeddedServer) -> None:
    """SIGKILL the postmaster; returns once it and every backend it had are gone (they exit on its death) and the
    postmaster reaped (the server reads as not running: a zombie still answers ``kill(pid, 0)``)."""
    postmaster = server.status().pid
    assert postmaster is not None
    backends = children(postmaster)
    os.kill(postmaster, signal.SIGKILL)
    eventually(lambda: not server.status().running and not any(alive(p) for p in backends),
               "the killed server's processes exited", timeout=20, interval=0.05)


def one_layout(old: ShardSettings, new: ShardSettings) -> tuple[bool, bool]:
    state = (opens(old), opens(new))
    assert state in ((True, False), (False, True)), f"both layouts or neither: {state}"
    return state


#: Which server dies, and at which progress report: as the seal or the switch starts (its first statement fails),
#: or inside the verify's target transaction, after its copy (which the source's digests then miss, or which is
#: rolled back with the target). `make test` runs the first; the others are ``crash_states`` tests.
KILLS = [("source", "seal"), pytest.param("source", "verify: copied the changes", marks=pytest.mark.crash_states),
         pytest.param("target", "verify: copied the changes", marks=pytest.mark.crash_states),
         pytest.param("target", "switch", marks=pytest.mark.crash_states)]


@pytest.mark.parametrize(("killed", "during"), KILLS,
                         ids=["source-at-seal", "source-in-verify", "target-in-verify", "target-at-switch"])
def test_a_server_killed_during_a_step_leaves_one_layout_and_the_move_resumes(
        shard_databases: Databases, own_server: EmbeddedServer, killed: str, during: str) -> None:
    a, there = shard_databases(2)
    own = database_on(own_server)
    b, c = (own, there) if killed == "source" else (there, own)
    old = ShardSettings.of([a, b])
    new = after_move(a, b, c)
    upgrade(own)
    migrate_all(old)
    with ShardedJournal.open(old, **FAST) as journal:
        written = seed(journal, 30)
    probe = pid_in(512, 767, "acct|probe")

    # 1. The mover killed after the copy (a known state), then the server: the old layout, the copy kept.
    assert move_cli(a, b, c, kill_after="copy").returncode == -signal.SIGKILL
    kill_9(own_server)
    own_server.ensure_running()
    assert one_layout(old, new) == (True, False)
    assert admits(b, probe)

    # 2. The server killed as the mover starts a step: the step's transaction never commits.
    killed_at: list[str] = []

    def kill_at(what: str, _rows: int) -> None:
        if what == during and not killed_at:
            killed_at.append(what)
            kill_9(own_server)

    with Mover(old, (512, 767), c, progress=kill_at) as mover, pytest.raises(DatabaseUnavailable) as lost:
        mover.run()
    killed_dsn = c if killed == "target" else b
    assert f"{'the target' if killed == 'target' else 'a source'} database {mask_dsn(killed_dsn)}" in str(lost.value)
    assert f"step {during.split(':')[0]!r}" in str(lost.value) and "--resume" in str(lost.value)
    assert killed_at == [during]
    own_server.ensure_running()
    assert one_layout(old, new) == (True, False)
    sealed = during != "seal"
    assert admits(b, probe) is not sealed  # before the seal the source takes the range; sealed, nobody does

    # 3. Resumed: the new layout, every event once, in its one database.
    resumed = move_cli(a, b, c, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert one_layout(old, new) == (False, True)
    assert count(b, "event_journal", 512, 767) == 0
    others_in_place(new, written)
    moved = [pid for pid in written if 512 <= slice_for_persistence_id(pid) <= 767]
    assert moved
    for pid in moved:
        assert seq_nrs(c, pid) == [1, 2, 3] and seq_nrs(b, pid) == []
    # the probes the source took (after step 1, and after step 2 unless sealed), once each
    assert seq_nrs(c, probe) == ([1] if sealed else [1, 2]) and seq_nrs(b, probe) == []
