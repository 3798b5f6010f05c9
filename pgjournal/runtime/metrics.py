"""Optional Prometheus metrics (``pip install 'pgjournal[metrics]'``); without ``prometheus_client`` every
metric here is a no-op, so instrumented code never checks.

Served with :func:`serve` (or ``pgjournal info --metrics-port``); names follow Prometheus conventions.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar, cast

try:
    import prometheus_client
except ImportError:  # the extra is not installed: metrics cost nothing
    prometheus_client = None  # type: ignore[assignment]

C = TypeVar("C")


class _Noop:
    def labels(self, *_args: Any, **_kwargs: Any) -> _Noop:
        return self

    def inc(self, *_args: Any) -> None:
        pass

    def dec(self, *_args: Any) -> None:
        pass

    def set(self, *_args: Any) -> None:
        pass

    def observe(self, *_args: Any) -> None:
        pass

    def set_function(self, *_args: Any) -> None:
        pass


def _metric(kind: str, name: str, documentation: str, labels: tuple[str, ...] = ()) -> Any:
    if prometheus_client is None:
        return _Noop()
    return getattr(prometheus_client, kind)(name, documentation, labels)


class AppendStats:
    """``pgjournal_appends_total`` and ``pgjournal_events_appended_total`` per entity type and the
    ``pgjournal_append_seconds`` histogram, updated together under one lock per append and exposed as those
    three metrics when scraped. Three ``prometheus_client`` updates cost three locks and a Python loop over
    the buckets per append, a noticeable share of a raw INSERT's client cost (``python -m bench append-cpu``)."""

    #: prometheus_client's default histogram buckets (seconds; the last is +Inf).
    BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, float("inf"))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._types: dict[str, list[int]] = {}
        self._buckets = [0] * len(self.BOUNDS)
        self._sum = 0.0

    def counts(self, entity_type: str) -> list[int]:
        """The [appends, events] counts of ``entity_type`` (a writer keeps it per persistence id)."""
        with self._lock:
            return self._types.setdefault(entity_type, [0, 0])

    def record(self, counts: list[int], events: int, seconds: float) -> None:
        """One append of ``events`` events that took ``seconds``, to the ``counts`` of its entity type."""
        bucket = bisect.bisect_left(self.BOUNDS, seconds)  # "le": the first bound >= seconds
        with self._lock:
            counts[0] += 1
            counts[1] += events
            self._buckets[bucket] += 1
            self._sum += seconds

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        with self._lock:
            types = {name: list(counts) for name, counts in self._types.items()}
            buckets, total = list(self._buckets), self._sum
        appends = CounterMetricFamily("pgjournal_appends", "Appends committed", labels=["entity_type"])
        events = CounterMetricFamily("pgjournal_events_appended", "Events committed by appends",
                                     labels=["entity_type"])
        for name, (count, event_count) in sorted(types.items()):
            appends.add_metric([name], count)
            events.add_metric([name], event_count)
        cumulative = list(itertools.accumulate(buckets))
        seconds = HistogramMetricFamily("pgjournal_append_seconds", "Time of an append, retries included")
        seconds.add_metric([], [(_bound(b), c) for b, c in zip(self.BOUNDS, cumulative, strict=True)], total)
        yield from (appends, events, seconds)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


APPEND_STATS = AppendStats()
if prometheus_client is not None:
    prometheus_client.REGISTRY.register(APPEND_STATS)
WRITE_RETRIES = _metric("Counter", "pgjournal_write_retries",
                        "Writes (appends, durable state) tried again after a transient failure", ("sqlstate",))
TAG_PENDING = _metric("Gauge", "pgjournal_tag_pending_events",
                     "Tagged events appended whose tag view rows the batched tag writer has not written yet")
#: What :data:`TAG_PENDING` sums when scraped: the batched tag writers' batches (their ``events``). Read at a
#: scrape rather than updated on every tagged append (a gauge update is a lock per append).
_TAG_BATCHES: weakref.WeakSet[Any] = weakref.WeakSet()
TAG_PENDING.set_function(lambda: sum(batch.events for batch in list(_TAG_BATCHES)))


def count_pending(batch: Any) -> None:
    """Count ``batch``'s pending events (its ``events``) in :data:`TAG_PENDING` while it lives."""
    _TAG_BATCHES.add(batch)

TAG_ROWS = _metric("Counter", "pgjournal_tag_rows_written", "Tag view rows written by the batched tag writer")
TAG_FLUSH_FAILURES = _metric("Counter", "pgjournal_tag_flush_failures",
                             "Writes of the batched tag writer that failed after their retries (what was pending "
                             "stays pending)")
LIVE_LAG = _metric("Gauge", "pgjournal_live_lag_seconds",
                   "Database clock minus the db_timestamp of the last delivered event (caught up: minus the "
                   "visibility horizon)", ("entity_type", "slices"))
HORIZON_HELD_BACK = _metric("Gauge", "pgjournal_horizon_held_back_seconds",
                            "Database clock minus the visibility horizon at the last reading")
STANDBY_HORIZON_AGE = _metric("Gauge", "pgjournal_standby_horizon_age_seconds",
                              "Readers on a standby: seconds since the primary's horizon reading they read below "
                              "was taken (the standby's replay lag, and the reading's own time)")
SLOW_WRITERS = _metric("Gauge", "pgjournal_slow_journal_writers",
                       "Journal writers whose transaction is open longer than longest_transaction")
PROJECTION_LAG = _metric("Gauge", "pgjournal_projection_lag_seconds",
                         "Database clock minus the db_timestamp of the newest event handled, 0 when nothing is "
                         "pending (as pgjournal projection status shows it; the largest over the range's slices)",
                         ("projection", "slices"))
PROJECTION_ENVELOPES = _metric("Counter", "pgjournal_projection_envelopes", "Envelopes handled",
                               ("projection", "slices"))
PROJECTION_ERRORS = _metric("Counter", "pgjournal_projection_errors", "Handler failures and restarts",
                            ("projection", "slices"))
LEASED_SLICES = _metric("Gauge", "pgjournal_projection_leased_slices", "Slices this worker holds a lease on",
                        ("projection", "owner"))


def available() -> bool:
    return prometheus_client is not None


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Expose the metrics over HTTP on ``address:port`` (a daemon thread). Needs the ``metrics`` extra."""
    from pgjournal.errors import ConfigurationError

    if prometheus_client is None:
        raise ConfigurationError("metrics need prometheus_client: pip install 'pgjournal[metrics]'")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigurationError(f"metrics port must be an integer from 1 to 65535, got {port!r}")
    prometheus_client.start_http_server(port, addr=address)


@contextlib.contextmanager
def registered(collector: C) -> Iterator[C]:
    """``collector`` (an object with ``collect()``) in Prometheus' registry while the block runs (nothing without
    the ``metrics`` extra)."""
    if prometheus_client is None:
        yield collector
        return
    prometheus_client.REGISTRY.register(cast(Any, collector))
    try:
        yield collector
    finally:
        prometheus_client.REGISTRY.unregister(cast(Any, collector))


def slices_label(min_slice: int, max_slice: int) -> str:
    return f"{min_slice}-{max_slice}"
