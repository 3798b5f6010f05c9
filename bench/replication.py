"""``replication-throughput``: a location catching up with a peer's backlog, events/s, beside the local reference.

* **ours**: a :class:`~pgjournal.replication.Replicator` (one stream, every slice) copying the peer's 20,000
  events (quick: 2,000; 100 entities of ``Counter``, written at the peer ``us``) into a fresh location ``eu``:
  each event read by slices, its version vector merged, appended to ``eu``'s replica with its metadata, its
  "seen" record and the stream's offsets in the same transaction;
* **local_reference**: the same events read by a by-slices catch-up of the peer's journal and appended, one
  batch per persistence id, into a fresh database: what moving them costs without replication's rules.

Both databases are on the same server (no WAN delay: the lag and partition figures of docs/replication.md
section 9 need the tests' fault proxy, and are not measured here).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.model.offsets import NoOffset
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator

from .harness import Context, Scenario, scratch_database

TYPE = "Counter"
ENTITIES = 100
SETTINGS = {"refresh_interval": 0.05, "behind_current_time": 0.05}


def _setup(ctx: Context) -> dict[str, Any]:
    total = 2_000 if ctx.quick else 20_000
    peer = Journal.open(ctx.dsn, **SETTINGS)
    per = total // ENTITIES
    for e in range(ENTITIES):
        peer.append(f"{TYPE}|e{e}|us", [{"n": n, "pad": "x" * 64} for n in range(per)])
    ctx.note(f"peer: {total:,} events of {ENTITIES} entities")
    return {"peer": peer, "total": per * ENTITIES}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["peer"].close()


def _count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM event_journal WHERE persistence_id LIKE %s",
                           (f"{TYPE}|%|eu",)).fetchone()
    return int(row[0]) if row else 0


def replicated(ctx: Context, state: dict[str, Any]) -> float:
    total = state["total"]
    with scratch_database(ctx.server_dsn or ctx.dsn) as dsn, Journal.open(dsn, **SETTINGS) as local:
        stream = Replicator(local, "eu", state["peer"], "us", TYPE, max_count=500,
                            settings=ProjectionSettings(restart_backoff=0.2))
        start = time.perf_counter()
        runner = stream.run_range()
        try:
            while _count(dsn) < total:
                if runner.failed is not None:
                    raise RuntimeError(f"the stream failed: {runner.failed}")
                time.sleep(0.02)
            elapsed = time.perf_counter() - start
        finally:
            runner.stop()
            runner.join(30)
    return total / elapsed


def local_reference(ctx: Context, state: dict[str, Any]) -> float:
    total = state["total"]
    peer: Journal = state["peer"]
    with scratch_database(ctx.server_dsn or ctx.dsn) as dsn, Journal.open(dsn, **SETTINGS) as local:
        start = time.perf_counter()
        batches: dict[str, list[Any]] = {}
        for env in peer.query.current_events_by_slices(TYPE, 0, 1023, NoOffset):
            batches.setdefault(env.persistence_id.replace("|us", "|eu"), []).append(env.event)
        for pid, events in batches.items():
            local.append(pid, events)
        elapsed = time.perf_counter() - start
        assert _count(dsn) == total
    return total / elapsed


SCENARIOS = [
    Scenario(
        name="replication-throughput", metric="events_per_s",
        description="a Replicator copying a peer's 20,000-event backlog (quick: 2,000) into a fresh location, beside "
                    "a by-slices catch-up of the peer plus one batched append per persistence id",
        setup=_setup, teardown=_teardown,
        contenders={"ours": replicated, "local_reference": local_reference},
    ),
]
