"""async-append: 200 asyncio tasks appending through one AsyncJournal (a pool of 8 connections) beside 8 threads
appending through the blocking Journal (a pool of 8), same process, same workload, interleaved rounds.

Workload (BENCHMARKS.md): ~200-byte JSON events, one event per append, one entity per task or thread, each
append stating its expected sequence number. Besides events/s, each round records the client's CPU time per
append (``time.process_time``), where the two faces differ: the figure is in the notes and the JSON's extra.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from typing import Any

from pgjournal import Journal
from pgjournal.aio import AsyncJournal

from .append import EVENT, _threads
from .harness import Context, Scenario

TASKS = 200
THREADS = 8
POOL = 8
TOTAL = 20_000


def _total(ctx: Context) -> int:
    return TOTAL // 10 if ctx.quick else TOTAL


def _setup(ctx: Context) -> dict[str, Any]:
    """Both journals open for the whole run (warm pools, prepared statements), the asyncio one on an event loop
    in a thread of its own; the main thread only waits for it."""
    journal = Journal.open(ctx.dsn, pool_min_size=POOL, pool_max_size=POOL)
    journal._pool.wait()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True)
    thread.start()

    async def open_async() -> AsyncJournal:
        opened = await AsyncJournal.open(ctx.dsn, pool_min_size=POOL, pool_max_size=POOL)
        await opened._pool.wait()
        return opened

    ajournal = asyncio.run_coroutine_threadsafe(open_async(), loop).result()
    return {"journal": journal, "ajournal": ajournal, "loop": loop, "thread": thread,
            "cpu": {"ours": [], "threads": []}}


def _teardown(ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()
    loop = state["loop"]
    asyncio.run_coroutine_threadsafe(state["ajournal"].close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    state["thread"].join(10)
    cpu = {name: round(statistics.median(values), 1) for name, values in state["cpu"].items() if values}
    ctx.extra["client_cpu_us_per_append"] = cpu
    pipeline = state["ajournal"]._pipeline
    if pipeline.pipelines:
        per_group = round(pipeline.sent / pipeline.pipelines, 1)
        ctx.extra["appends_per_pipeline"] = per_group
        ctx.note(f"asyncio: {pipeline.sent:,} appends in {pipeline.pipelines:,} pipelines (one transaction each): "
                 f"{per_group} per commit")
    if len(cpu) == 2:
        ctx.note(f"client CPU per append (median of rounds): asyncio {cpu['ours']} us, threads {cpu['threads']} us")


def asyncio_tasks(ctx: Context, state: dict[str, Any]) -> float:
    total = _total(ctx)
    journal: AsyncJournal = state["ajournal"]
    per_task = total // TASKS

    async def run() -> tuple[float, float]:
        async def task() -> None:
            pid = f"Bench|{uuid.uuid4().hex}"
            for i in range(per_task):
                await journal.append(pid, [EVENT], expected_seq_nr=i)

        cpu, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(task() for _ in range(TASKS)))
        return time.perf_counter() - start, time.process_time() - cpu

    elapsed, cpu = asyncio.run_coroutine_threadsafe(run(), state["loop"]).result()
    state["cpu"]["ours"].append(cpu / total * 1e6)
    return total / elapsed


def threads(ctx: Context, state: dict[str, Any]) -> float:
    total = _total(ctx)
    journal: Journal = state["journal"]

    def work(_w: int, n: int) -> None:
        pid = f"Bench|{uuid.uuid4().hex}"
        for i in range(n):
            journal.append(pid, [EVENT], expected_seq_nr=i)

    cpu = time.process_time()
    rate = total / _threads(THREADS, total // THREADS, work)
    state["cpu"]["threads"].append((time.process_time() - cpu) / total * 1e6)
    return rate


SCENARIOS = [Scenario(
    name="async-append", metric="events_per_s",
    description=f"{TOTAL:,} events (quick: a tenth), 1 per append: {TASKS} asyncio tasks on a pool of {POOL} "
                f"vs {THREADS} threads on the blocking API (pool of {POOL})",
    setup=_setup, teardown=_teardown,
    contenders={"ours": asyncio_tasks, "threads": threads},
)]
