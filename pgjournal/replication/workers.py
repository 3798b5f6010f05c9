"""A replication worker process: one lease-sharing :class:`~projections.workers.Worker` per stream (peer, entity
type), all with one owner name, balanced together (``pgjournal replication run``). More processes started
anywhere against the same local database share every stream's slices."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgjournal.errors import ConfigurationError, JournalError
from pgjournal.model.printable import printable_logger
from pgjournal.projections.leases import default_owner
from pgjournal.projections.workers import Worker, _Balancing, step_each
from pgjournal.runtime.metrics import registered

from .replicator import ReplicationFilter, Replicator
from .status import StatusMetrics

if TYPE_CHECKING:
    from pgjournal.journal import Journal

log = printable_logger("pgjournal.replication.workers")


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer location: its replica id and the DSN of its database (a reader role there is enough)."""

    replica: str
    dsn: str

    @classmethod
    def parse(cls, text: str) -> Peer:
        """``REPLICA=DSN``."""
        replica, sep, dsn = text.partition("=")
        if not sep or not replica.strip() or not dsn.strip():
            raise ConfigurationError("a peer must look like REPLICA=DSN (for example us=postgresql://...), got "
                                     f"{text.partition('=')[0]!r}=...")
        return cls(replica.strip(), dsn.strip())


class ReplicationWorker(_Balancing):
    """The workers of every stream of this location in one process. :meth:`run` blocks until ``stop``.

    ``later``: streams whose peer could not be opened yet, as functions that try again (each returns its
    replicators, or raises while the peer does not answer); every lease cycle tries them, so a peer that is down
    when the worker starts is replicated from once it answers, and the other streams run meanwhile."""

    def __init__(self, replicators: Sequence[Replicator], *, owner: str | None = None, lease_duration: float = 10.0,
                 renew_interval: float | None = None, later: Sequence[Callable[[], list[Replicator]]] = ()) -> None:
        if not replicators and not later:
            raise ConfigurationError("a replication worker needs at least one stream (a peer and an entity type)")
        self.owner = owner or default_owner()
        self._lease = {"lease_duration": lease_duration, "renew_interval": renew_interval}
        self.replicators: list[Replicator] = []
        self.parts: list[Worker] = []
        self.later = list(later)
        for replicator in replicators:
            self._add(replicator)
        self.interval = (min(part.interval for part in self.parts) if self.parts
                         else renew_interval or lease_duration / 4)

    def _add(self, replicator: Replicator) -> None:
        self.replicators.append(replicator)
        self.parts.append(replicator.worker(owner=self.owner, **self._lease))

    @property
    def failure(self) -> Any:  # type: ignore[override]
        return next((part.failure for part in self.parts if part.failure is not None), None)

    def step(self) -> None:
        for attempt in list(self.later):
            try:
                opened = attempt()
            except (JournalError, OSError) as exc:
                log.info("%s: a peer does not answer yet (%s)", self.owner, exc)
                continue
            self.later.remove(attempt)
            for replicator in opened:
                self._add(replicator)
        step_each(self.parts)  # a stream whose cycle fails must not keep the others from theirs

    def settling(self) -> bool:
        return bool(self.later) or any(part.settling() for part in self.parts)

    def shutdown(self) -> None:
        for part in self.parts:
            part.shutdown()


def run_replication(local_dsn: str | None, replica: str, peers: Sequence[Peer], entity_types: Sequence[str], *,
                    stop: threading.Event | None = None, lease_duration: float = 10.0,
                    renew_interval: float | None = None, journal_settings: dict[str, Any] | None = None,
                    peer_settings: dict[str, Any] | None = None, max_wait: float = 0.05,
                    accept: ReplicationFilter | None = None, metrics: bool = False) -> int:
    """Run every stream of this location (each peer, each entity type) until ``stop`` (or SIGTERM/SIGINT when
    called on the main thread); returns 1 when a stream failed. Peers are opened without migrating (read only).
    ``accept``: the location's replication filter, the same for every stream. ``metrics``: each stream's status
    as Prometheus gauges (:class:`~pgjournal.replication.status.StatusMetrics`, computed when scraped; serve them
    with :func:`pgjournal.runtime.metrics.serve`)."""
    from pgjournal.journal import Journal

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as opened:
        local: Journal = opened.enter_context(Journal.open(local_dsn, **(journal_settings or {})))
        reported = None if not metrics else opened.enter_context(registered(StatusMetrics(local, {
            (peer.replica, entity_type): None for peer in peers for entity_type in entity_types})))

        def streams_of(peer: Peer) -> list[Replicator]:
            source = opened.enter_context(Journal.open(peer.dsn, **(peer_settings or journal_settings or {})))
            if reported is not None:
                reported.streams.update({(peer.replica, entity_type): source for entity_type in entity_types})
            return [Replicator(local, replica, source, peer.replica, entity_type, max_wait=max_wait, accept=accept)
                    for entity_type in entity_types]

        later = [functools.partial(streams_of, peer) for peer in peers]
        worker = ReplicationWorker([], later=later, lease_duration=lease_duration, renew_interval=renew_interval)
        log.info("replication worker %s of %s started: %d peer(s), %d entity type(s)", worker.owner, replica,
                 len(peers), len(entity_types))
        try:
            worker.run(stop)
        except Exception as exc:
            log.error("replication worker %s stopped: %s", worker.owner, exc)
            return 1
    return 0
