"""append and append-batch: our write path beside raw INSERT, the eventsourcing library and COPY.

Workload (BENCHMARKS.md): ~200-byte JSON events, one entity per writer thread. ``append``: one event per
transaction; ``append-batch``: batches of 10 per transaction, 8 writers.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.conninfo

from pgjournal import Journal

from .harness import Context, Scenario

EVENT = {"type": "ItemAdded", "item": "sku-000123", "quantity": 2, "price_cents": 1999,
         "note": "x" * 80, "at": "2026-11-21T16:00:00Z"}
PAYLOAD = json.dumps(EVENT).encode()
assert 180 <= len(PAYLOAD) <= 220

RAW_TABLE = "bench_raw_journal"
RAW_INSERT = (
    f"INSERT INTO {RAW_TABLE} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
    "event_ser_id, event_ser_manifest, event_payload) VALUES (%s, %s, %s, %s, now(), %s, 31, '', %s)"
)


def _threads(writers: int, per_writer: int, work: Callable[[int, int], None]) -> float:
    """Run ``work(writer, n)`` on ``writers`` threads; return the elapsed seconds."""
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def run(w: int) -> None:
        barrier.wait()
        try:
            work(w, per_writer)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def _setup(ctx: Context) -> dict[str, Any]:
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {RAW_TABLE} (LIKE event_journal INCLUDING DEFAULTS INCLUDING INDEXES)")
    return {"journal": Journal.open(ctx.dsn, pool_max_size=12)}


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()
    if "app" in state:
        state["app"].close()


def ours(writers: int, total: int, batch: int) -> Callable[[Context, Any], float]:
    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        events = [EVENT] * batch

        def work(w: int, n: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(n // batch):
                journal.append(pid, events, expected_seq_nr=i * batch)

        return total / _threads(writers, total // writers, work)

    return measure


def raw_insert(writers: int, total: int) -> Callable[[Context, Any], float]:
    def measure(ctx: Context, _state: Any) -> float:
        def work(w: int, n: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            with psycopg.connect(ctx.dsn, autocommit=True) as conn:
                for seq in range(1, n + 1):
                    conn.execute(RAW_INSERT, (1, "Bench", pid, seq, "raw", PAYLOAD))

        return total / _threads(writers, total // writers, work)

    return measure


def copy_batches(writers: int, total: int, batch: int) -> Callable[[Context, Any], float]:
    """Binary COPY of the same rows, one COPY (one transaction) per batch."""

    def measure(ctx: Context, _state: Any) -> float:
        columns = "slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id, " \
                  "event_ser_manifest, event_payload"
        types = ["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "int4", "varchar", "bytea"]

        def work(w: int, n: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            with psycopg.connect(ctx.dsn, autocommit=True) as conn:
                for first in range(1, n + 1, batch):
                    with conn.cursor().copy(f"COPY {RAW_TABLE} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
                        copy.set_types(types)
                        now = datetime.now(UTC)
                        for seq in range(first, first + batch):
                            copy.write_row((1, "Bench", pid, seq, now, "copy", 31, "", PAYLOAD))

        return total / _threads(writers, total // writers, work)

    return measure


def eventsourcing_app(writers: int, total: int) -> Callable[[Context, Any], float]:
    """The eventsourcing library's Application.save(), one new event per save (its global-order write path)."""

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        from eventsourcing.application import Application

        cart_class = _eventsourcing_cart()
        if "app" not in state:
            info = psycopg.conninfo.conninfo_to_dict(ctx.dsn)
            state["app"] = Application(env={
                "PERSISTENCE_MODULE": "eventsourcing.postgres",
                "POSTGRES_DBNAME": str(info.get("dbname")), "POSTGRES_HOST": str(info.get("host", "127.0.0.1")),
                "POSTGRES_PORT": str(info.get("port", 5432)), "POSTGRES_USER": str(info.get("user", "postgres")),
                "POSTGRES_PASSWORD": str(info.get("password", "")), "POSTGRES_POOL_SIZE": str(writers + 2),
                "CREATE_TABLE": "y",
            })
        app = state["app"]
        body = {k: v for k, v in EVENT.items() if k != "type"}

        def work(w: int, n: int) -> None:
            cart = cart_class()
            app.save(cart)
            for _ in range(n - 1):
                cart.add(**body)
                app.save(cart)

        return total / _threads(writers, total // writers, work)

    return measure


@functools.cache
def _eventsourcing_cart() -> type:
    from eventsourcing.domain import Aggregate, event

    class Cart(Aggregate):
        @event("ItemAdded")
        def add(self, item: str, quantity: int, price_cents: int, note: str, at: str) -> None:
            pass

    return Cart


def _scenarios() -> list[Scenario]:
    out = []
    for writers in (8, 1):
        total = 20_000
        name = "append" if writers == 8 else "append-1"
        out.append(Scenario(
            name=name, metric="events_per_s",
            description=f"{total:,} events (quick: a tenth), 1 per transaction, {writers} writer(s), one entity each",
            setup=_setup, teardown=_teardown,
            contenders={
                "ours": _sized(lambda t, w=writers: ours(w, t, 1), total),
                "raw_insert": _sized(lambda t, w=writers: raw_insert(w, t), total),
                "eventsourcing": _sized(lambda t, w=writers: eventsourcing_app(w, t), total, cap=4_000),
            },
        ))
    out.append(Scenario(
        name="append-batch", metric="events_per_s",
        description="200,000 events (quick: a tenth) in batches of 10 per transaction, 8 writers",
        setup=_setup, teardown=_teardown,
        contenders={
            "ours": _sized(lambda t: ours(8, t, 10), 200_000),
            "binary_copy": _sized(lambda t: copy_batches(8, t, 10), 200_000),
        },
    ))
    return out


def _sized(make: Callable[[int], Callable[[Context, Any], float]], total: int, cap: int | None = None
           ) -> Callable[[Context, Any], float]:
    """Size the workload by mode: a tenth in --quick; ``cap`` bounds slow references (rates stay comparable)."""

    def measure(ctx: Context, state: Any) -> float:
        n = total // 10 if ctx.quick else total
        if cap is not None:
            n = min(n, cap)
        return make(n)(ctx, state)

    return measure


SCENARIOS = _scenarios()
