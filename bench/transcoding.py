"""transcoding: client CPU per event of payload compression and encryption, on append and on catch-up.

Each contender appends ``events`` ~200-byte JSON events (1 per append, 200 persistence ids) and reads them back
with ``current_events_by_slices``; the figure is this process's CPU time (``time.process_time``, all threads)
per event, not wall time: transcoding is client work, and the machine's other load should not move the ratio.
Contenders: ours (AES-256-GCM with per-pid keys from the in-memory key store, plus zstd), its variants (zstd
only; encryption with the PostgreSQL key store, keys wrapped by a master key and cached), and no transcoding.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from pgjournal import Journal
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import Transcoder
from pgjournal.state.keystore import InMemoryKeyStore, PostgresKeyStore

from .harness import Context, Scenario

PAYLOAD = {"item": "a fairly ordinary shopping cart item", "qty": 3, "price": 1999, "currency": "EUR",
           "note": "delivered to the side door, ring twice", "tags": ["gift", "express"], "customer": "c-000123"}


def make_registry(kind: str, dsn: str) -> tuple[SerializerRegistry, Any]:
    """The registry of a contender and what to close after it."""
    if kind == "plain":
        return SerializerRegistry(), None
    if kind == "zstd":
        return SerializerRegistry(transcoder=Transcoder(compression="zstd", compress_min_size=64)), None
    store: Any = InMemoryKeyStore() if kind == "aes+zstd" else PostgresKeyStore(dsn, master_key=os.urandom(32))
    transcoder = Transcoder(compression="zstd" if kind == "aes+zstd" else None, compress_min_size=64, key_store=store)
    return SerializerRegistry(transcoder=transcoder), store if kind == "aes-pg-keys" else None


def measure(ctx: Context, kind: str, phase: str) -> float:
    events = 2_000 if ctx.quick else 20_000
    entity = "Tc" + uuid.uuid4().hex[:8]
    registry, closing = make_registry(kind, ctx.dsn)
    try:
        with Journal.open(ctx.dsn, serializers=registry) as journal:
            pids = [f"{entity}|{i}" for i in range(200)]
            started = time.process_time()
            for n in range(events):
                journal.append(pids[n % len(pids)], [PAYLOAD])
            append_cpu = time.process_time() - started
            time.sleep(0.2)  # past the read margin
            started = time.process_time()
            read = sum(1 for _ in journal.query.current_events_by_slices(entity, 0, 1023))
            read_cpu = time.process_time() - started
    finally:
        if closing is not None:
            closing.close()
    if read != events:
        raise AssertionError(f"{kind}: read {read} of {events} events")
    cpu = append_cpu if phase == "append" else read_cpu
    ctx.note(f"{kind} {phase}: {cpu * 1e6 / events:,.1f} µs CPU per event ({events:,} events)")
    return cpu * 1e6 / events


def contender(kind: str, phase: str) -> Callable[[Context, Any], float]:
    return lambda ctx, _state: measure(ctx, kind, phase)


SCENARIOS = [
    Scenario(
        name=f"transcoding-{phase}", metric="client_cpu_us_per_event", lower_is_better=True,
        description=f"{phase} of 20,000 ~200-byte JSON events (quick: 2,000), 1 per append, 200 persistence ids; "
                    "process CPU time per event",
        setup=lambda _ctx: None,
        contenders={
            "ours": contender("aes+zstd", phase),
            "ours_zstd_only": contender("zstd", phase),
            **({"ours_aes_pg_keys": contender("aes-pg-keys", phase)} if phase == "append" else {}),
            "plain": contender("plain", phase),
        },
    )
    for phase in ("append", "catchup")
]
