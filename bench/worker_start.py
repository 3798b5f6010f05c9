"""worker-start: how long a projection's slices wait when its worker processes change (lower is better).

Two worker processes (``pgjournal projection run NAME -e Bench --lease-duration 3 --dsn ...``, started as a user
starts them) run an exactly-once projection while one thread appends events over 512 persistence ids (every
slice range gets events all the time). The handler records, in the projection's transaction, which process
handled each event and when (the database's clock). Each round measures:

* ``ours``: a third process is started; the time from its start to its first handled event (imports, opening
  the journal, its first lease cycle, the running workers handing over slices, its runner's first event);
* ``sigterm``: that process is stopped with SIGTERM; the time until another process handles an event of a slice
  it held (a clean stop releases its leases);
* ``sigkill``: a third process is started again, settled, then killed with SIGKILL; the same time (nothing is
  released: its leases and heartbeat expire);
* ``lease_duration``: the lease duration, the reference: the goal is each of the others within it plus a second.

Every wait starts with the workers settled (every slice leased, each process holding its share). ``extra``: the
median time from a process's start to its first heartbeat (imports and opening the journal), per round.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgjournal import Journal
from pgjournal.projections.examples import ensure_table
from pgjournal.projections.handlers import ExactlyOnce, Projection, ProjectionSettings

from .harness import Context, Scenario

if TYPE_CHECKING:
    import psycopg

    from pgjournal.model.envelope import EventEnvelope

ROOT = Path(__file__).resolve().parents[1]
NAME = "worker-start"
ENTITY_TYPE = "Bench"
LEASE = 3.0
BASELINE_WORKERS = 2
PIDS = 512
HANDLED_DDL = """
CREATE TABLE IF NOT EXISTS bench_handled (
    pid INTEGER NOT NULL,
    slice INTEGER NOT NULL,
    handled_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"""


def handled_projection(journal: Journal, name: str, entity_type: str) -> Projection:
    """The workers' factory (``--handler bench.worker_start:handled_projection``): each event handled is a row
    naming this process, written in the transaction that stores its offset."""
    ensure_table(journal, HANDLED_DDL)
    pid = os.getpid()

    def handle(conn: psycopg.Connection, env: EventEnvelope) -> None:
        conn.execute("INSERT INTO bench_handled (pid, slice) VALUES (%s, %s)", (pid, env.slice))

    return Projection(name, entity_type, ExactlyOnce(handle), ProjectionSettings())


class _Workers:
    """The worker processes of the run, started as ``pgjournal projection run`` and stopped at the end."""

    def __init__(self, dsn: str, log: Path) -> None:
        self.dsn = dsn
        self.log = log.open("ab")
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgjournal", "projection", "run", NAME, "-e", ENTITY_TYPE,
             "--handler", "bench.worker_start:handled_projection", "--lease-duration", str(LEASE), "--dsn", self.dsn],
            cwd=ROOT, env=env, stdout=self.log, stderr=self.log)
        self.running.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        self.running.remove(proc)
        proc.send_signal(sig)

    def close(self) -> None:
        for proc in self.running:
            proc.send_signal(signal.SIGTERM)
        for proc in self.running:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.running.clear()
        self.log.close()


def _db_now(journal: Journal) -> Any:
    with journal.connection() as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def _await(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None and found is not False:
            return found
        time.sleep(0.02)
    raise RuntimeError(f"worker-start: {what} did not happen within {timeout:.0f} s")


def _settled(journal: Journal, workers: _Workers) -> None:
    """Every slice leased, by as many owners as processes run, each of them alive (the owner names its pid)."""
    pids = {str(p.pid) for p in workers.running}

    def check() -> bool:
        with journal.connection() as conn:
            owners = conn.execute(
                "SELECT owner, count(*) FROM projection_lease WHERE projection_name = %s AND owner IS NOT NULL "
                "AND expires_at > now() GROUP BY owner", (NAME,)).fetchall()
        held = {owner.split(":")[-2]: n for owner, n in owners}
        return set(held) == pids and sum(held.values()) == 1024 and min(held.values()) >= 1024 // len(pids) - 1

    _await("the workers settling", check)


def _first_handled_by(journal: Journal, pid: int, since: Any) -> Any:
    with journal.connection() as conn:
        return conn.execute("SELECT min(handled_at) FROM bench_handled WHERE pid = %s AND handled_at >= %s",
                            (pid, since)).fetchone()[0]


def _heartbeat(journal: Journal, pid: int) -> Any:
    with journal.connection() as conn:
        return conn.execute("SELECT min(started_at) FROM projection_worker WHERE projection_name = %s "
                            "AND owner LIKE %s", (NAME, f"%:{pid}:%")).fetchone()[0]


def _setup(ctx: Context) -> dict[str, Any]:
    journal = Journal.open(ctx.dsn, pool_max_size=4)
    ensure_table(journal, HANDLED_DDL)
    stop = threading.Event()
    rate = 100 if ctx.quick else 200

    def write() -> None:
        n = 0
        while not stop.is_set():
            journal.append(f"{ENTITY_TYPE}|{n % PIDS}", [{"n": n}])
            n += 1
            stop.wait(1 / rate)

    writer = threading.Thread(target=write, daemon=True, name="worker-start-writer")
    writer.start()
    workers = _Workers(ctx.dsn, Path(tempfile.gettempdir()) / f"pgjournal-bench-worker-start-{os.getpid()}.log")
    for _ in range(BASELINE_WORKERS):
        workers.start()
    _settled(journal, workers)
    ctx.note(f"{BASELINE_WORKERS} workers running (lease {LEASE:.0f} s, renewed every {LEASE / 4:.2f} s), a third "
             f"started and stopped per round; {rate} events/s appended over {PIDS} persistence ids; worker logs in "
             f"{workers.log.name}")
    return {"journal": journal, "workers": workers, "stop": stop, "writer": writer, "heartbeats": [],
            "newest": None}


def _teardown(ctx: Context, state: dict[str, Any]) -> None:
    state["stop"].set()
    state["writer"].join(timeout=30)
    state["workers"].close()
    state["journal"].close()
    if state["heartbeats"]:
        ctx.extra["start_to_heartbeat_s"] = [round(s, 3) for s in state["heartbeats"]]
        ctx.note(f"process start to its first heartbeat (imports, opening the journal): median "
                 f"{statistics.median(state['heartbeats']):.2f} s")
    ctx.note(f"goal: each figure within the lease duration plus a second ({LEASE + 1:.0f} s)")


def start(_ctx: Context, state: dict[str, Any]) -> float:
    journal, workers = state["journal"], state["workers"]
    _settled(journal, workers)
    before = _db_now(journal)
    proc = workers.start()
    state["newest"] = proc
    first = _await("the new worker's first event", lambda: _first_handled_by(journal, proc.pid, before))
    heartbeat = _heartbeat(journal, proc.pid)
    if heartbeat is not None:
        state["heartbeats"].append((heartbeat - before).total_seconds())
    return float((first - before).total_seconds())


def stop_with(sig: signal.Signals) -> Any:
    def measure(_ctx: Context, state: dict[str, Any]) -> float:
        journal, workers = state["journal"], state["workers"]
        victim = state["newest"] or workers.start()  # sigkill: a third process of its own
        state["newest"] = None
        _settled(journal, workers)
        with journal.connection() as conn:
            slices = [row[0] for row in conn.execute(
                "SELECT slice FROM projection_lease WHERE projection_name = %s AND owner LIKE %s "
                "AND expires_at > now()", (NAME, f"%:{victim.pid}:%"))]
        before = _db_now(journal)
        workers.stop(victim, sig)

        def taken_over() -> Any:
            with journal.connection() as conn:
                return conn.execute(
                    "SELECT min(handled_at) FROM bench_handled WHERE pid <> %s AND slice = ANY(%s) "
                    "AND handled_at >= %s", (victim.pid, slices, before)).fetchone()[0]

        first = _await(f"the slices of the worker stopped by {sig.name} being consumed again", taken_over)
        victim.wait(timeout=60)
        return float((first - before).total_seconds())

    return measure


def lease_duration(_ctx: Context, _state: dict[str, Any]) -> float:
    return LEASE


SCENARIOS = [
    Scenario(
        name="worker-start", metric="seconds", lower_is_better=True,
        description="a projection worker process started beside 2 running ones: seconds to its first handled "
                    "event (ours); stopped by SIGTERM or SIGKILL: seconds until its slices are consumed again; "
                    "the lease duration as the reference (goal: within it plus a second)",
        setup=_setup, teardown=_teardown,
        contenders={"ours": start, "ours_sigterm": stop_with(signal.SIGTERM),
                    "ours_sigkill": stop_with(signal.SIGKILL), "lease_duration": lease_duration},
    ),
]
