"""``pgjournal projection ...``: list, status with lag, pause/resume, reset guarded while workers run, and
``run --workers 2`` as real processes that stop cleanly (leases released) on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from support import FAST
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from test_projections import append_many, caught_up, run_until
from typer.testing import CliRunner

from pgjournal import Journal
from pgjournal.cli.commands import app
from pgjournal.projections import management
from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection

ROOT = Path(__file__).resolve().parents[2]


def invoke(dsn: str, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["projection", *args], env={"PGJOURNAL_DSN": dsn, "COLUMNS": "200"})


def test_list_status_pause_resume_reset(dsn: str, journal: Journal) -> None:
    ensure_counter_table(journal)
    append_many(journal, "Cart", 6, 2)
    projection = Projection("shown", "Cart", counter_writer("shown", max_wait=0.05), FAST_PROJECTION)
    run_until(journal, projection, [(0, 511), (512, 1023)], caught_up(journal, "shown", "Cart"))
    result = invoke(dsn, "list")
    assert result.exit_code == 0 and "shown" in result.output.split()
    result = invoke(dsn, "status", "shown")
    assert result.exit_code == 0, result.output
    assert "stopped (no live worker)" in result.output and ("0-511" in result.output or "512-1023" in result.output)
    assert invoke(dsn, "pause", "shown").exit_code == 0
    assert "paused" in invoke(dsn, "status", "shown").output
    result = invoke(dsn, "reset", "shown", "--to", "2026-01-01T00:00:00Z", "--slices", "0-99")
    assert result.exit_code == 0, result.output
    assert "0-99" in result.output
    result = invoke(dsn, "reset", "shown")
    assert result.exit_code == 0 and "cleared" in result.output
    assert invoke(dsn, "resume", "shown").exit_code == 0
    assert not management.status(journal, "shown").paused
    result = invoke(dsn, "reset", "shown", "--to", "yesterday")
    assert result.exit_code == 1 and "--to must be ISO 8601" in result.output
    result = invoke(dsn, "run", "shown", "-e", "Cart", "--handler", "nowhere:factory")
    assert result.exit_code == 1 and "cannot load handler factory 'nowhere:factory'" in result.output


def test_run_with_two_worker_processes(dsn: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.update({f"PGJOURNAL_{k.upper()}": str(v) for k, v in FAST.items()})
    with Journal.open(dsn, **FAST) as journal:
        append_many(journal, "Cart", 40, 3)
        proc = subprocess.Popen(
            [sys.executable, "-c", "from pgjournal.cli.commands import main; main()", "projection", "run", "two", "-e",
             "Cart",
             "--workers", "2", "--lease-duration", "4", "--dsn", dsn],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        def settled() -> bool:
            state = management.status(journal, "two")
            balanced = len(state.workers) == 2 and {r.owner for r in state.ranges} == set(state.workers)
            return balanced and not counter_mismatches(journal, "two", "Cart")

        try:
            with contextlib.suppress(AssertionError):  # the assertions below say what is missing, with the log
                eventually(settled, "two balanced workers, the read model caught up", timeout=60, interval=0.1)
            state = management.status(journal, "two")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        log = err.decode()[-3000:]
        assert len(state.workers) == 2, log
        assert {r.owner for r in state.ranges} == set(state.workers), log  # each owns half
        assert [(r.min_slice, r.max_slice) for r in state.ranges] == [(0, 511), (512, 1023)], log
        assert counter_mismatches(journal, "two", "Cart") == []
        assert proc.returncode == 0, log
        with journal.connection() as conn:
            held = conn.execute("SELECT count(*) FROM projection_lease WHERE owner IS NOT NULL").fetchone()[0]
        assert held == 0, log  # released on a clean stop
        assert management.status(journal, "two").workers == []


def test_status_with_leases_over_some_slices(dsn: str, journal: Journal) -> None:
    """A worker of one database of a sharded journal (or one still starting) leases only part of the slices: the
    others are shown as a range nobody owns, with their lag, not a failure."""
    from pgjournal.projections.leases import LeaseManager

    append_many(journal, "Cart", 6, 2)
    leases = LeaseManager(journal, "partial", duration=60, slices=(0, 511))
    held, _ = leases.cycle()
    try:
        assert sorted(held) == list(range(512))
        result = invoke(dsn, "status", "partial", "-e", "Cart")
        assert result.exit_code == 0, result.output
        assert "running, 1 live worker(s)" in result.output
        state = management.status(journal, "partial", ["Cart"])
        assert [(r.min_slice, r.max_slice, r.owner) for r in state.ranges] == [(0, 511, leases.owner),
                                                                                  (512, 1023, None)]
        assert all(r.lag is not None for r in state.ranges)
    finally:
        leases.leave()
