"""append and append-batch: our write path beside raw INSERT, the eventsourcing library and COPY.

Workload (BENCHMARKS.md): ~200-byte JSON events, one entity per writer thread. ``append``: one event per
transaction; ``append-batch``: batches of 10 per transaction, 8 writers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.conninfo

from pgjournal import Journal
from pgjournal.server.dsn import dsn_password

from .cpu import CpuPerOp
from .cpu import measure as measure_cpu
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


def _p99(ctx: Context, name: str, latencies: list[float]) -> None:
    """Record the round's 99th percentile append latency (ms) of contender ``name`` in the JSON's extra."""
    if latencies:
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        ctx.extra.setdefault("p99_append_ms", {}).setdefault(name, []).append(round(p99, 3))


def _grouped(ctx: Context, name: str, journal: Journal) -> None:
    """Appends per group commit of ``journal``'s pipeline so far (when it has one) in the JSON's extra."""
    pipeline = getattr(journal, "_pipeline", None)
    if pipeline is not None and pipeline.pipelines:
        ctx.extra.setdefault("appends_per_pipeline", {})[name] = round(pipeline.sent / pipeline.pipelines, 2)


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
    for name, value in state.items():
        if name.startswith("ours_"):
            value.close()
    state["journal"].close()
    if "portable" in state:
        state["portable"].close()
    if "app" in state:
        state["app"].close()


def ours(writers: int, total: int, batch: int, connections: int = 0) -> Callable[[Context, Any], float]:
    """``connections``: a journal of its own with that many pool connections (fewer than writers: appends wait
    for one and ride in group commits), else the scenario's (12: none waits)."""

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        name = f"ours_{connections}_connections" if connections else "ours"
        if connections and name not in state:
            state[name] = Journal.open(ctx.dsn, pool_max_size=connections)
        journal: Journal = state[name if connections else "journal"]
        events = [EVENT] * batch
        latencies: list[float] = []

        def work(w: int, n: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            clock = time.perf_counter
            mine = []
            for i in range(n // batch):
                started = clock()
                journal.append(pid, events, expected_seq_nr=i * batch)
                mine.append(clock() - started)
            latencies.extend(mine)

        rate = total / _threads(writers, total // writers, work)
        _p99(ctx, name, latencies)
        _grouped(ctx, name, journal)
        return rate

    return measure


def raw_insert(writers: int, total: int) -> Callable[[Context, Any], float]:
    def measure(ctx: Context, _state: Any) -> float:
        latencies: list[float] = []

        def work(w: int, n: int) -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            clock = time.perf_counter
            mine = []
            with psycopg.connect(ctx.dsn, autocommit=True) as conn:
                for seq in range(1, n + 1):
                    started = clock()
                    conn.execute(RAW_INSERT, (1, "Bench", pid, seq, "raw", PAYLOAD))
                    mine.append(clock() - started)
            latencies.extend(mine)

        rate = total / _threads(writers, total // writers, work)
        _p99(ctx, "raw_insert", latencies)
        return rate

    return measure


def _cpu_threads(writers: int, prepare: Callable[[int], Any], work: Callable[[int, Any], None],
                 cleanup: Callable[[Any], None]) -> Callable[[Callable[[], None], Callable[[], None]], None]:
    """``run(start, stop)`` for :func:`bench.cpu.measure`: each thread prepares (opens its connection, warms
    up), ``start`` is read, all work, ``stop`` is read while every connection is still open, then cleanup."""

    def run(start: Callable[[], None], stop: Callable[[], None]) -> None:
        ready, go, done = (threading.Barrier(writers + 1) for _ in range(3))
        release = threading.Event()
        errors: list[BaseException] = []

        def thread(w: int) -> None:
            state = None
            try:
                state = prepare(w)
                ready.wait()
                go.wait()
                work(w, state)
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                for barrier in (ready, go, done):  # done too: the others (and the caller) would wait there forever
                    barrier.abort()
            finally:
                with contextlib.suppress(threading.BrokenBarrierError):
                    done.wait()
                release.wait()
                if state is not None:
                    cleanup(state)

        threads = [threading.Thread(target=thread, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        try:
            ready.wait()
            start()
            go.wait()
            done.wait()
            stop()
        except threading.BrokenBarrierError:
            pass
        finally:
            release.set()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]

    return run


def cpu_ours(writers: int, total: int, tags: tuple[str, ...] = (), *, portable: bool = False,
             label: str | None = None) -> Callable[[Context, Any], float]:
    """Client + server CPU µs per append of ours (one event per append, ``expected_seq_nr`` given);
    ``portable``: a portable journal (no notifications), to show what the after-commit signals cost."""
    per_writer = total // writers
    warm = 20
    name = label or ("ours_portable" if portable else "ours")

    def measure(ctx: Context, state: dict[str, Any]) -> float:
        if portable and "portable" not in state:
            state["portable"] = Journal.open(ctx.dsn, pool_max_size=12, portable=True)
        journal: Journal = state["portable" if portable else "journal"]

        def prepare(_w: int) -> str:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(warm):  # the pool grows to the writers' concurrency, statements get prepared
                journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)
            return pid

        def work(_w: int, pid: str) -> None:
            for i in range(warm, warm + per_writer):
                journal.append(pid, [EVENT], expected_seq_nr=i, tags=tags)

        result = measure_cpu(ctx.dsn, per_writer * writers, _cpu_threads(writers, prepare, work, lambda _s: None))
        return _record_cpu(ctx, name, result)

    return measure


def cpu_raw_insert(writers: int, total: int) -> Callable[[Context, Any], float]:
    """Client + server CPU µs per raw single-row INSERT (the ``raw_insert`` reference)."""
    per_writer = total // writers

    def measure(ctx: Context, _state: Any) -> float:
        def prepare(_w: int) -> tuple[psycopg.Connection, str]:
            conn = psycopg.connect(ctx.dsn, autocommit=True)
            pid = f"Bench|{uuid.uuid4().hex}"
            for seq in range(1, 21):
                conn.execute(RAW_INSERT, (1, "Bench", pid, seq, "raw", PAYLOAD))
            return conn, pid

        def work(_w: int, state: tuple[psycopg.Connection, str]) -> None:
            conn, pid = state
            for seq in range(21, 21 + per_writer):
                conn.execute(RAW_INSERT, (1, "Bench", pid, seq, "raw", PAYLOAD))

        result = measure_cpu(ctx.dsn, per_writer * writers,
                             _cpu_threads(writers, prepare, work, lambda state: state[0].close()))
        return _record_cpu(ctx, "raw_insert", result)

    return measure


def _record_cpu(ctx: Context, name: str, result: CpuPerOp) -> float:
    """Keep the client/server split of each round in the scenario's extra figures; the metric is the sum."""
    split = ctx.extra.setdefault("cpu_us_per_event", {}).setdefault(name, {"client": [], "server": []})
    split["client"].append(round(result.client_us, 1))
    split["server"].append(round(result.server_us, 1))
    ctx.note(f"{name}: client {result.client_us:.0f} µs + server {result.server_us:.0f} µs per event "
             f"({result.wall_s:.1f} s wall)")
    return result.total_us


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
            if info.get("require_auth"):
                # The library takes host, port, user and password only; libpq still reads this from the
                # environment, so it refuses a password request from an impostor as pgjournal's DSN does.
                os.environ["PGREQUIREAUTH"] = str(info["require_auth"])
            state["app"] = Application(env={
                "PERSISTENCE_MODULE": "eventsourcing.postgres",
                "POSTGRES_DBNAME": str(info.get("dbname")), "POSTGRES_HOST": str(info.get("host", "127.0.0.1")),
                "POSTGRES_PORT": str(info.get("port", 5432)), "POSTGRES_USER": str(info.get("user", "postgres")),
                "POSTGRES_PASSWORD": dsn_password(ctx.dsn) or "", "POSTGRES_POOL_SIZE": str(writers + 2),
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
            description=f"{total:,} events (quick: a tenth), 1 per transaction, {writers} writer(s), one entity each; "
                        "p99 append latency in the extra",
            setup=_setup, teardown=_teardown,
            contenders={
                "ours": _sized(lambda t, w=writers: ours(w, t, 1), total),
                **({"ours_4_connections": _sized(lambda t, w=writers: ours(w, t, 1, connections=4), total)}
                   if writers == 8 else {}),
                "raw_insert": _sized(lambda t, w=writers: raw_insert(w, t), total),
                "eventsourcing": _sized(lambda t, w=writers: eventsourcing_app(w, t), total, cap=4_000),
            },
        ))
    for writers in (8, 1):
        total = 8_000 if writers == 8 else 3_000
        out.append(Scenario(
            name="append-cpu" if writers == 8 else "append-cpu-1", metric="cpu_us_per_event", lower_is_better=True,
            description=f"client + server CPU µs per event (split in extra), {total:,} events (quick: a tenth), "
                        f"1 per transaction, {writers} writer(s): CPU per append is throughput on 2 shared cores",
            setup=_setup, teardown=_teardown,
            contenders={
                "ours": _sized(lambda t, w=writers: cpu_ours(w, t), total),
                "ours_portable": _sized(lambda t, w=writers: cpu_ours(w, t, portable=True), total),
                "raw_insert": _sized(lambda t, w=writers: cpu_raw_insert(w, t), total),
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
