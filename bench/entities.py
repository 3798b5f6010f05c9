"""entities-hot, entities-many, entities-recovery: what the entity layer costs on top of ``journal.append``.

Commands deposit an amount into an account; each persists one ~200-byte JSON event (the ``append``
benchmark's event plus the amount). The references append the very same events with ``journal.append``,
so the ratio is the entity overhead: recovery on a cache miss, the per-entity lock, the expected-seq-nr
check, snapshots every 100 events.

- ``entities-hot``: 8 threads send commands to ONE entity (commands to one entity run one at a time, so
  the serial ``journal.append`` loop is the natural bound; 8 unsynchronised appenders are the ceiling).
- ``entities-many``: 8 threads, random entities out of 10,000 (quick: 1,000), each with some history.
- ``entities-recovery``: recovery of an entity with 10,000 events, from a snapshot and by full replay,
  beside just reading the events (lower is better).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pgjournal import Journal
from pgjournal.entity import Entity, EntityRepository, persist
from pgjournal.entity.recovery import snapshot_metadata

from .append import EVENT
from .harness import Context, Scenario

THREADS = 8
RECOVERY_EVENTS = 10_000


@dataclass(frozen=True)
class Balance:
    amount: int = 0
    deposits: int = 0


class BenchAccount(Entity[Balance]):
    name = "BenchAccount"
    initial_state = Balance()
    types = (Balance,)

    def handle(self, state: Balance, command: int) -> Any:
        if command <= 0:
            raise ValueError(f"deposit must be positive, got {command}")
        return persist(event(command), reply=state.amount + command)

    def apply(self, state: Balance, event: Any) -> Balance:
        return Balance(state.amount + event["amount"], state.deposits + 1)


def event(amount: int) -> dict[str, Any]:
    return {**EVENT, "amount": amount}


def _for(seconds: float, threads: int, step: Callable[[random.Random], None]) -> float:
    """Run ``step`` in a loop on ``threads`` threads for ``seconds``; return steps per second."""
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads

    def run(index: int) -> None:
        rng = random.Random(index)
        barrier.wait()
        n = 0
        while not stop.is_set():
            step(rng)
            n += 1
        counts[index] = n

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(run, i) for i in range(threads)]
        barrier.wait()
        started = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


def _duration(ctx: Context) -> float:
    return 1.2 if ctx.quick else 5.0


def _open(ctx: Context) -> dict[str, Any]:
    return {"journal": Journal.open(ctx.dsn, pool_max_size=12)}


def _close(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()


# -- one hot entity --------------------------------------------------------------------------------------


def hot_ours(ctx: Context, state: dict[str, Any]) -> float:
    repo = EntityRepository(state["journal"], BenchAccount)
    entity_id = uuid.uuid4().hex
    return _for(_duration(ctx), THREADS, lambda rng: repo.handle(entity_id, rng.randint(1, 100)))


def hot_append(threads: int) -> Callable[[Context, Any], float]:
    def measure(ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        pid = f"BenchAccount|{uuid.uuid4().hex}"
        return _for(_duration(ctx), threads, lambda rng: journal.append(pid, [event(rng.randint(1, 100))]))
    return measure


# -- many entities ---------------------------------------------------------------------------------------


def _entities(ctx: Context) -> int:
    return 1_000 if ctx.quick else 10_000


def many_setup(ctx: Context) -> dict[str, Any]:
    """Every entity gets 3 events. 'ours' has its own entities (the others' writes would make its cache
    stale), all cached by recovering each once."""
    state = _open(ctx)
    journal: Journal = state["journal"]
    ids = [f"acct-{i}" for i in range(_entities(ctx))]
    warm_ids = [f"warm-{i}" for i in range(_entities(ctx))]
    warm = EntityRepository(journal, BenchAccount, cache_size=len(ids))
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda i: journal.append(f"BenchAccount|{i}", [event(1)] * 3), ids + warm_ids))
        list(pool.map(warm.load, warm_ids))
    state.update(ids=ids, warm_ids=warm_ids, warm=warm)
    ctx.note(f"entities-many: {len(ids):,} entities with 3 events each; 'ours' has all of them cached, "
             "'ours, no cache' recovers the entity (snapshot lookup + replay) before every command")
    return state


def many_ours(ctx: Context, state: dict[str, Any]) -> float:
    repo, ids = state["warm"], state["warm_ids"]
    return _for(_duration(ctx), THREADS, lambda rng: repo.handle(rng.choice(ids), rng.randint(1, 100)))


def many_uncached(ctx: Context, state: dict[str, Any]) -> float:
    repo = EntityRepository(state["journal"], BenchAccount, cache_size=0)
    ids = state["ids"]
    return _for(_duration(ctx), THREADS, lambda rng: repo.handle(rng.choice(ids), rng.randint(1, 100)))


def many_append(ctx: Context, state: dict[str, Any]) -> float:
    journal: Journal = state["journal"]
    pids = [f"BenchAccount|{i}" for i in state["ids"]]
    return _for(_duration(ctx), THREADS, lambda rng: journal.append(rng.choice(pids), [event(rng.randint(1, 100))]))


# -- recovery --------------------------------------------------------------------------------------------


def recovery_setup(ctx: Context) -> dict[str, Any]:
    """Two entities with 10,000 events each; one has a snapshot at its 9,950th event (50 to replay)."""
    state = _open(ctx)
    journal: Journal = state["journal"]
    entity = BenchAccount()
    for entity_id in ("plain", "snapshotted"):
        pid = f"BenchAccount|{entity_id}"
        for start in range(0, RECOVERY_EVENTS, 500):
            journal.append(pid, [event(start + i) for i in range(500)])
    full = EntityRepository(journal, entity)
    at = RECOVERY_EVENTS - 50
    snap = Balance()
    for envelope in journal.query.current_events_by_persistence_id("BenchAccount|snapshotted", 1, at):
        snap = entity.apply(snap, envelope.event)
    journal.save_snapshot("BenchAccount|snapshotted", at, snap, metadata=snapshot_metadata(entity))
    check = full.load("snapshotted")
    assert check.snapshot_seq_nr == at and check.state == full.load("plain").state, check
    ctx.note(f"entities-recovery: {RECOVERY_EVENTS:,} events of ~230 bytes; snapshot at {at:,}; "
             f"replay pages of {journal.settings.buffer_size} events")
    return state


def _timed_ms(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def recover_with_snapshot(_ctx: Context, state: dict[str, Any]) -> float:
    return _timed_ms(lambda: EntityRepository(state["journal"], BenchAccount).load("snapshotted"))


def recover_by_replay(_ctx: Context, state: dict[str, Any]) -> float:
    return _timed_ms(lambda: EntityRepository(state["journal"], BenchAccount).load("plain"))


def read_events(_ctx: Context, state: dict[str, Any]) -> float:
    journal: Journal = state["journal"]
    return _timed_ms(lambda: sum(1 for _ in journal.query.current_events_by_persistence_id("BenchAccount|plain")))


SCENARIOS = [
    Scenario(
        name="entities-hot", metric="commands_per_s",
        description=f"{THREADS} threads, one entity, 1 event per command (append refs: the same events)",
        setup=_open, teardown=_close,
        contenders={"ours": hot_ours, "journal.append, 1 thread": hot_append(1),
                    f"journal.append, {THREADS} threads": hot_append(THREADS)},
    ),
    Scenario(
        name="entities-many", metric="commands_per_s",
        description=f"{THREADS} threads, random entity of 10,000 (quick: 1,000), 1 event per command",
        setup=many_setup, teardown=_close,
        contenders={"ours": many_ours, "ours, no cache": many_uncached, "journal.append": many_append},
    ),
    Scenario(
        name="entities-recovery", metric="ms",
        description=f"recover an entity with {RECOVERY_EVENTS:,} events: snapshot + 50 events vs full replay "
                    "vs only reading the events",
        setup=recovery_setup, teardown=_close, lower_is_better=True,
        contenders={"ours": recover_with_snapshot, "ours, no snapshot": recover_by_replay,
                    "read events only": read_events},
    ),
]
