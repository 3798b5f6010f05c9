"""Run a projection over one slice range: read, validate, handle, store offsets; retry, fail or skip.

A :class:`RangeRunner` (re)starts its range from the stored offsets until it is stopped: after a pause, after
an infrastructure error (with backoff) and when a worker re-assigns ranges. One thread reads the live
``events_by_slices`` query into a bounded queue, in chunks; the runner's thread validates and handles envelopes, so
groups and at-least-once saves can close on time even when no event arrives.

With a lease guard (see :mod:`projections.leases`) the runner stops before its lease can expire, and the
transactional modes check the lease inside their transaction (``FOR SHARE``: a take-over waits for the
commit), so two workers never commit work for one slice in overlapping leases.

The rules are :class:`projections.logic.RangeLogic`'s (shared with the asyncio runner,
:mod:`projections.aio`); this module is their blocking face: a daemon thread, a reader thread and a queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from pgjournal.errors import ProjectionFailed
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import Offset
from pgjournal.model.printable import printable_logger
from pgjournal.query import Query
from pgjournal.runtime.live import LiveQuery
from pgjournal.runtime.steps import run

from .handlers import Projection
from .logic import (
    CHUNKS,
    DEADLOCK_RETRIES,
    LeaseGuard,
    RangeLogic,
    RunContext,
    Stats,
    current_context,
    lookback,
)
from .offset_store import OffsetStore, Record

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.journal import Journal
    from pgjournal.shards import ShardedJournal

__all__ = ["DEADLOCK_RETRIES", "LeaseGuard", "RangeRunner", "RunContext", "Stats",
           "current_context", "lookback", "run_range"]

log = printable_logger("projections")


@dataclass
class _ReaderFailed:
    error: BaseException


class RangeRunner(RangeLogic):
    """One projection over ``min_slice..max_slice``. ``run()`` blocks until :meth:`stop` (or a failure)."""

    def __init__(self, journal: Journal | ShardedJournal, projection: Projection, min_slice: int, max_slice: int,
                 *, guard: LeaseGuard | None = None, source: Journal | ShardedJournal | None = None,
                 serializers: SerializerRegistry | None = None) -> None:
        super().__init__(journal, projection, min_slice, max_slice, guard=guard, stop=threading.Event(),
                         source=source, serializers=serializers)
        self.reading = Query(self.source, serializers=self.serializers)
        self.thread: threading.Thread | None = None
        self._inbox: queue.Queue[list[EventEnvelope] | _ReaderFailed] = queue.Queue()
        self._reader: tuple[LiveQuery[EventEnvelope], threading.Thread, threading.Event] | None = None

    def start(self) -> None:
        """Run on a daemon thread; a failure is kept in :attr:`failed` (and logged)."""

        def target() -> None:
            try:
                self.run()
            except ProjectionFailed as exc:
                log.error("%s", exc)
            except BaseException as exc:
                self.failed = exc
                log.exception("projection %s %s crashed", self.projection.name, self.key)

        self.thread = threading.Thread(target=target, daemon=True, name=f"projection-{self.projection.name}-{self.key}")
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def run(self) -> None:
        """Process until stopped. Raises :class:`ProjectionFailed`; returns on :class:`LeaseLost`."""
        self.journal.run(self.run_step())

    def _admit(self, conn: psycopg.Connection, store: OffsetStore, env: EventEnvelope,
               pending: MutableMapping[str, Record]) -> list[EventEnvelope]:
        """Validate ``env``: nothing for a duplicate; for a rejected one, its missing predecessors first."""
        return run(self._admit_step(store, env, pending), conn)

    # -- the blocking face ---------------------------------------------------------------------------

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _next(self, timeout: float) -> list[EventEnvelope]:
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return []
        if isinstance(item, _ReaderFailed):
            raise item.error
        return item

    def _open_reader(self, offset: Offset) -> None:
        query = self.reading.events_by_slices(self.projection.entity_type, self.min_slice, self.max_slice, offset,
                                             tags=self.projection.tags)
        inbox: queue.Queue[list[EventEnvelope] | _ReaderFailed] = queue.Queue(maxsize=CHUNKS)
        halt = threading.Event()
        reader = threading.Thread(target=_read, args=(query, inbox, halt, self.source.settings.buffer_size),
                                  daemon=True,
                                  name=f"read-{self.projection.name}-{self.key}")
        self._inbox, self._reader = inbox, (query, reader, halt)
        reader.start()

    def _close_reader(self) -> None:
        if self._reader is not None:
            (query, reader, halt), self._reader = self._reader, None
            halt.set()
            query.close()
            reader.join(timeout=30)


def _read(query: LiveQuery[EventEnvelope], inbox: queue.Queue[list[EventEnvelope] | _ReaderFailed],
          halt: threading.Event, chunk: int) -> None:
    try:
        for env in query:
            envelopes = [env, *query.ready(chunk - 1)]
            while True:
                try:
                    inbox.put(envelopes, timeout=0.1)
                    break
                except queue.Full:
                    if halt.is_set():
                        return
            if halt.is_set():
                return
    except BaseException as exc:  # handed to the consuming thread
        if not halt.is_set():
            inbox.put(_ReaderFailed(exc))


def run_range(journal: Journal | ShardedJournal, projection: Projection, min_slice: int, max_slice: int
              ) -> RangeRunner:
    """Start a runner for one range on a daemon thread (no leases); ``stop()`` and ``join()`` it. A sharded
    journal runs it on the database of the range (its offsets stored there)."""
    runner = RangeRunner(journal, projection, min_slice, max_slice)
    runner.start()
    return runner
