"""What ``pgjournal replication status`` shows per stream (peer, entity type): whether the peer answers
(available / unavailable), the lag (the peer's clock minus the newest of its events this location holds, per slice,
the largest: 0 when nothing is pending), the rate (events the stream appended here over the last minute, per second)
and the live workers; and the same as Prometheus gauges (:class:`StatusMetrics`, ``replication run --metrics-port``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import JournalError
from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.projections.management import lags_step
from pgjournal.runtime.steps import run
from pgjournal.store import leases as lease_sql
from pgjournal.store import replication as sql
from pgjournal.store.timestamp_offsets import offsets

from .replicator import stream_name, writer_of

if TYPE_CHECKING:
    from pgjournal.journal import Journal

#: The window the rate is measured over, in seconds.
RATE_WINDOW = 60.0


@dataclass(frozen=True)
class StreamStatus:
    peer: str
    entity_type: str
    available: bool
    #: Seconds (``None``: not measured, the peer unavailable).
    lag: float | None
    #: Events per second appended here by the stream over :data:`RATE_WINDOW`.
    rate: float
    workers: int
    #: Why the peer is unavailable (the error's type and message, the DSN's password never in it).
    error: str | None = None


def stream_status(local: Journal, peer_replica: str, peer: Journal | None, entity_type: str,
                  peer_error: str | None = None) -> StreamStatus:
    """The status of one stream; ``peer`` ``None`` (it could not be opened, ``peer_error`` says why): unavailable."""
    name = stream_name(peer_replica, entity_type)
    with local.connection() as conn:
        latest = {row.slice: row.timestamp_offset for row in offsets().latest_per_slice(name).all(conn)}
        workers = len(lease_sql.live_workers(name).all(conn))
        now = conn.execute("SELECT now()").fetchone()
        assert now is not None
        count = sql.recent(entity_type, writer_of(peer_replica), now[0] - timedelta(seconds=RATE_WINDOW)).one(conn)
    lag: float | None = None
    error = peer_error
    if peer is not None:
        try:
            with peer.connection() as conn:
                lags = run(lags_step([entity_type], {s: latest.get(s) for s in range(NUMBER_OF_SLICES)},
                                     peer.horizon_tracker()), conn)
            lag = max(lags.values(), default=0.0)
        except (psycopg.Error, JournalError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    return StreamStatus(peer_replica, entity_type, error is None, lag, (count or 0) / RATE_WINDOW, workers, error)


class StatusMetrics:
    """``replication status`` as Prometheus gauges, computed when scraped (what the command shows, from the same
    queries, so the two never disagree): per stream (peer, entity type) ``pgjournal_replication_peer_available``
    (1 or 0), ``pgjournal_replication_lag_seconds`` (left out while the peer does not answer),
    ``pgjournal_replication_events_per_second`` (over :data:`RATE_WINDOW`) and ``pgjournal_replication_workers``.
    A scrape costs each stream one query here and one at the peer; a failing one marks that stream unavailable
    and never fails the scrape."""

    def __init__(self, local: Journal, streams: dict[tuple[str, str], Journal | None]) -> None:
        #: (peer replica, entity type) -> the peer's journal, ``None`` until it could be opened (unavailable)
        self._local = local
        self.streams = streams

    def statuses(self) -> list[StreamStatus]:
        out = []
        for (peer_replica, entity_type), peer in list(self.streams.items()):
            try:
                out.append(stream_status(self._local, peer_replica, peer, entity_type,
                                         None if peer is not None else "not opened yet"))
            except (psycopg.Error, JournalError, OSError) as exc:  # this location's own database did not answer
                out.append(StreamStatus(peer_replica, entity_type, False, None, 0.0, 0,
                                        f"{type(exc).__name__}: {exc}"))
        return out

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["peer", "entity_type"]
        available = GaugeMetricFamily("pgjournal_replication_peer_available",
                                      "1 when the stream's peer answers, else 0", labels=labels)
        lag = GaugeMetricFamily("pgjournal_replication_lag_seconds",
                                "The peer's clock minus the newest of its events this location holds (the largest "
                                "over the slices, 0 when nothing is pending)", labels=labels)
        rate = GaugeMetricFamily("pgjournal_replication_events_per_second",
                                 f"Events the stream appended here over the last {RATE_WINDOW:.0f} s, per second",
                                 labels=labels)
        workers = GaugeMetricFamily("pgjournal_replication_workers", "Live workers holding the stream's leases",
                                    labels=labels)
        for s in self.statuses():
            key = [s.peer, s.entity_type]
            available.add_metric(key, 1.0 if s.available else 0.0)
            if s.lag is not None:
                lag.add_metric(key, s.lag)
            rate.add_metric(key, s.rate)
            workers.add_metric(key, s.workers)
        yield from (available, lag, rate, workers)
