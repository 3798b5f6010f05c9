"""restart: rows a projection restart reads (lower is better), with one idle persistence id alone in its slice
(last written a week ago) and without it.

Data: the same events under two entity types, one event every ``3600 / n`` seconds over the last hour
(``Cart``: plus the idle pid; ``Shop``: without). Each round projects the entity type from scratch under a new
name (exactly-once grouped counter read model), stops cleanly, appends 100 new events and restarts; the figure
is what the restarted range read from ``events_by_slices`` (``RangeRunner.stats.read``) until it had counted
the new events. ``idle_no_markers`` deletes the marker rows before the restart: the start the offset store
computed before markers existed (the earliest slice's offset), i.e. the old cost.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.projections.examples import counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection, ProjectionSettings
from pgjournal.projections.runner import RangeRunner, run_range

from .harness import Context, Scenario

SETTINGS = {"refresh_interval": 0.1, "notify": False}
COUNTED = "SELECT COALESCE(sum(events), 0) FROM projection_counter WHERE projection_name = %s"
COLUMNS = "slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id, event_ser_manifest, " \
          "event_payload"
NEW_EVENTS = 100


def _load(dsn: str, events: int, pids: int) -> str:
    """``events`` per entity type (Cart, Shop) over the last hour; returns the idle pid (Cart only)."""
    now = datetime.now(UTC)
    step = timedelta(seconds=3600 / events)
    used: set[int] = set()
    with psycopg.connect(dsn) as conn:
        for entity_type in ("Cart", "Shop"):
            names = [f"{entity_type}|{i}" for i in range(pids)]
            slices = [slice_for_persistence_id(p) for p in names]
            used.update(slices)
            seq = [0] * pids
            with conn.cursor().copy(f"COPY event_journal ({COLUMNS}) FROM STDIN") as copy:
                for n in range(events):
                    i = n % pids
                    seq[i] += 1
                    copy.write_row((slices[i], entity_type, names[i], seq[i], now - timedelta(hours=1) + n * step,
                                    "bench", 31, "", b'{"n": 1}'))
        idle = next(p for p in (f"Cart|idle{i}" for i in itertools.count())
                    if slice_for_persistence_id(p) not in used)
        conn.execute(f"INSERT INTO event_journal ({COLUMNS}) VALUES (%s, 'Cart', %s, 1, %s, 'bench', 31, '', %s)",
                     (slice_for_persistence_id(idle), idle, now - timedelta(days=7), b'{"n": 1}'))
        conn.commit()
        conn.execute("ANALYZE event_journal")
        conn.commit()
    return idle


def _setup(ctx: Context) -> dict[str, Any]:
    events, pids = (20_000, 200) if ctx.quick else (200_000, 2_000)
    idle = _load(ctx.dsn, events, pids)
    journal = Journal.open(ctx.dsn, pool_max_size=8, **SETTINGS)
    ensure_counter_table(journal)
    lookback = journal.settings.backtracking_window + journal.settings.backtracking_behind_current_time
    ctx.note(f"{events:,} events per entity type over the last hour ({events * lookback / 3600:,.0f} within the "
             f"{lookback:.0f} s restart lookback), {pids:,} pids; Cart also has {idle} alone in slice "
             f"{slice_for_persistence_id(idle)}, written 7 days ago; {NEW_EVENTS} new events per restart")
    return {"journal": journal, "names": itertools.count(), "pids": pids}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()


def _total(journal: Journal, entity_type: str) -> int:
    with journal.connection() as conn:
        return conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = %s", (entity_type,)).fetchone()[0]


def _run(journal: Journal, projection: Projection, rows: int, timeout: float = 600) -> RangeRunner:
    runner = run_range(journal, projection, 0, 1023)
    deadline = time.monotonic() + timeout
    try:
        with journal.connection() as conn:
            while conn.execute(COUNTED, (projection.name,)).fetchone()[0] < rows:
                if runner.failed is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"projection {projection.name} did not count {rows}: {runner.failed!r}")
                time.sleep(0.02)
    finally:
        runner.stop()
        runner.join()
    return runner


def restart(entity_type: str, *, keep_markers: bool = True) -> Any:
    def measure(_ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        name = f"restart-{next(state['names'])}"
        projection = Projection(name, entity_type, counter_writer(name, max_count=1000, max_wait=0.1),
                                ProjectionSettings(management_interval=5.0, delete_interval=5.0))
        _run(journal, projection, _total(journal, entity_type))
        if not keep_markers:
            with journal.connection() as conn:
                conn.execute("DELETE FROM projection_timestamp_offset_store WHERE projection_name = %s "
                             "AND persistence_id = ''", (name,))
        for k in range(NEW_EVENTS):
            journal.append(f"{entity_type}|{k % state['pids']}", [{"n": 2}])
        return float(_run(journal, projection, _total(journal, entity_type)).stats.read)

    return measure


SCENARIOS = [
    Scenario(
        name="restart", metric="rows_read", lower_is_better=True,
        description="rows a projection restart reads: one idle pid alone in a slice written 7 days ago (ours), the "
                    "same restart without the idle slice, and with the idle slice but no markers (the old start)",
        setup=_setup, teardown=_teardown,
        contenders={"ours": restart("Cart"), "no_idle_slice": restart("Shop"),
                    "idle_no_markers": restart("Cart", keep_markers=False)},
    ),
]
