"""projection: exactly-once grouped projection throughput (a per-entity counter read model written in the same
transaction as the per-slice offsets), beside the plain by-slices read rate of the same events.

Data: the by-slices scenario's load (a fifth of the events are ``Cart``); each round projects all ``Cart``
events from the beginning under a fresh projection name, and ends when the read model has counted them all.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from pgjournal import Journal, slice_ranges
from pgjournal.projections.examples import counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection, ProjectionSettings
from pgjournal.projections.runner import run_range

from .by_slices import load
from .harness import Context, Scenario

SETTINGS = {"refresh_interval": 0.1, "notify": False}
COUNTED = "SELECT COALESCE(sum(events), 0) FROM projection_counter WHERE projection_name = %s"


def _setup(ctx: Context) -> dict[str, Any]:
    events, pids = (100_000, 1_000) if ctx.quick else (1_000_000, 10_000)
    load(ctx.dsn, events, pids)
    journal = Journal.open(ctx.dsn, pool_max_size=8, **SETTINGS)
    ensure_counter_table(journal)
    ctx.note(f"{events // 5:,} Cart events of {pids // 5:,} entities; groups of up to 1,000 envelopes")
    return {"journal": journal, "rows": events // 5, "names": itertools.count()}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()


def _wait_counted(journal: Journal, name: str, rows: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    with journal.connection() as conn:
        while conn.execute(COUNTED, (name,)).fetchone()[0] < rows:
            if time.monotonic() > deadline:
                raise TimeoutError(f"projection {name} did not count {rows} events in {timeout}s")
            time.sleep(0.02)


def _projection(name: str, grouped: bool) -> Projection:
    return Projection(name, "Cart", counter_writer(name, grouped=grouped, max_count=1000, max_wait=0.2),
                      ProjectionSettings(management_interval=5.0, delete_interval=5.0))


def ours_threads(ranges: int, *, grouped: bool = True, limit: int | None = None) -> Callable[[Context, Any], float]:
    """``limit``: time only the first events (one transaction per envelope is slow: a commit each)."""

    def measure(_ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        name = f"bench-{next(state['names'])}"
        projection = _projection(name, grouped)
        rows = min(limit or state["rows"], state["rows"])
        start = time.perf_counter()
        runners = [run_range(journal, projection, lo, hi) for lo, hi in slice_ranges(ranges)]
        try:
            _wait_counted(journal, name, rows)
            elapsed = time.perf_counter() - start
        finally:
            for r in runners:
                r.stop()
            for r in runners:
                r.join()
        return rows / elapsed

    return measure


def _run_range_process(dsn: str, name: str, lo: int, hi: int, ready: Any, stop: Any) -> None:
    with Journal.open(dsn, pool_max_size=4, **SETTINGS) as journal:
        runner = run_range(journal, _projection(name, True), lo, hi)
        ready.wait()
        stop.wait()
        runner.stop()
        runner.join()


def ours_processes(ranges: int) -> Callable[[Context, Any], float]:
    """Each range in its own process, as ``pgjournal projection run --workers N`` runs them (no leases here)."""

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        name = f"bench-{next(state['names'])}"
        mp = multiprocessing.get_context("fork")
        ready, stop = mp.Event(), mp.Event()
        procs = [mp.Process(target=_run_range_process, args=(ctx.dsn, name, lo, hi, ready, stop))
                 for lo, hi in slice_ranges(ranges)]
        start = time.perf_counter()
        for p in procs:
            p.start()
        ready.set()
        try:
            _wait_counted(journal, name, state["rows"])
            elapsed = time.perf_counter() - start
        finally:
            stop.set()
            for p in procs:
                p.join()
        return state["rows"] / elapsed

    return measure


def by_slices_read(_ctx: Context, state: dict[str, Any]) -> float:
    """The reference: reading the same events with current_events_by_slices, doing nothing with them."""
    journal: Journal = state["journal"]
    start = time.perf_counter()
    count = sum(1 for _ in journal.query.current_events_by_slices("Cart", 0, 1023))
    elapsed = time.perf_counter() - start
    assert count == state["rows"], (count, state["rows"])
    return count / elapsed


SCENARIOS = [
    Scenario(
        name="projection", metric="events_per_s",
        description="exactly-once grouped counter projection from scratch, 1 range in-process (ours), 4 ranges in 4 "
                    "processes, 1 envelope per transaction (first 2,000 events); by-slices read of the same events "
                    "as reference (200,000 Cart events; quick: 20,000)",
        setup=_setup, teardown=_teardown,
        contenders={"ours": ours_threads(1), "ours_4_processes": ours_processes(4),
                    "ours_single_envelope_tx": ours_threads(1, grouped=False, limit=2_000),
                    "by_slices_read": by_slices_read},
    ),
]
