"""A live consumer that restarts from its last offset at random moments (torture tests share it)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgjournal import NoOffset, TimestampOffset, slice_for_persistence_id
from pgjournal.model.offsets import Offset
from pgjournal.runtime.live import LiveQuery


@dataclass
class Consumer:
    restarts: bool
    min_slice: int = 0
    max_slice: int = 1023
    delivered: list[tuple[str, int]] = field(default_factory=list)
    offset: Offset = NoOffset
    restart_count: int = 0
    error: BaseException | None = None


def consume(
    open_stream: Callable[[Offset], LiveQuery[Any]],
    key: Callable[[Any], tuple[str, int]],
    consumer: Consumer,
    stop: threading.Event,
    rng: random.Random,
) -> None:
    """Read ``open_stream(offset)`` until ``stop``; with restarts, close it after 0.5-2.5 s and open it
    again from the last envelope's offset. Records ``key(envelope)`` of everything delivered."""
    try:
        while not stop.is_set():
            live = open_stream(consumer.offset)
            timer = threading.Timer(rng.uniform(0.5, 2.5) if consumer.restarts else 10**6, live.close)
            timer.start()
            stopper = threading.Thread(target=lambda lv=live: (stop.wait(), lv.close()), daemon=True)
            stopper.start()
            for envelope in live:
                consumer.delivered.append(key(envelope))
                consumer.offset = envelope.offset
            timer.cancel()
            consumer.restart_count += 1
    except BaseException as exc:  # reported by the test
        consumer.error = exc


def passed(consumers: Iterable[Any], pid: str, ts: datetime) -> bool:
    """Every consumer (with ``min_slice``, ``max_slice`` and ``offset``) whose range holds ``pid`` delivered an event
    newer than ``ts``: its main cursor is past it (torture tests' gap writers wait for this)."""
    slice_ = slice_for_persistence_id(pid)
    return all(isinstance(c.offset, TimestampOffset) and c.offset.timestamp > ts
               for c in consumers if c.min_slice <= slice_ <= c.max_slice)


def check_delivered(consumer: Consumer, wanted: set[tuple[str, int]]) -> None:
    """``consumer`` got every event of ``wanted`` once, and each persistence id's in sequence order."""
    assert consumer.error is None, consumer.error
    label = f"consumer {consumer.min_slice}-{consumer.max_slice}"
    assert len(consumer.delivered) == len(set(consumer.delivered)), f"{label} got duplicates"
    missing = wanted - set(consumer.delivered)
    assert not missing, f"{label} missed {len(missing)} events, e.g. {sorted(missing)[:5]}"
    assert set(consumer.delivered) == wanted, f"{label} got events of other ranges"
    last: dict[str, int] = {}
    for pid, seq_nr in consumer.delivered:
        assert seq_nr == last.get(pid, 0) + 1, f"{label}: {pid} seq {seq_nr} after {last.get(pid, 0)}"
        last[pid] = seq_nr
