"""Optional Prometheus metrics (``pip install 'pgjournal[metrics]'``); without ``prometheus_client`` every
metric here is a no-op, so instrumented code never checks.

Served with :func:`serve` (or ``pgjournal info --metrics-port``); names follow Prometheus conventions.
"""

from __future__ import annotations

from typing import Any

try:
    import prometheus_client
except ImportError:  # the extra is not installed: metrics cost nothing
    prometheus_client = None  # type: ignore[assignment]


class _Noop:
    def labels(self, *_args: Any, **_kwargs: Any) -> _Noop:
        return self

    def inc(self, *_args: Any) -> None:
        pass

    def set(self, *_args: Any) -> None:
        pass

    def observe(self, *_args: Any) -> None:
        pass


def _metric(kind: str, name: str, documentation: str, labels: tuple[str, ...] = ()) -> Any:
    if prometheus_client is None:
        return _Noop()
    return getattr(prometheus_client, kind)(name, documentation, labels)


APPENDS = _metric("Counter", "pgjournal_appends", "Appends committed", ("entity_type",))
EVENTS_APPENDED = _metric("Counter", "pgjournal_events_appended", "Events committed by appends", ("entity_type",))
APPEND_SECONDS = _metric("Histogram", "pgjournal_append_seconds", "Time of an append, retries included")
WRITE_RETRIES = _metric("Counter", "pgjournal_write_retries",
                        "Writes (appends, durable state) tried again after a transient failure", ("sqlstate",))
LIVE_LAG = _metric("Gauge", "pgjournal_live_lag_seconds",
                   "Database clock minus the db_timestamp of the last delivered event (caught up: minus the "
                   "visibility horizon)", ("entity_type", "slices"))
HORIZON_HELD_BACK = _metric("Gauge", "pgjournal_horizon_held_back_seconds",
                            "Database clock minus the visibility horizon at the last reading")
SLOW_WRITERS = _metric("Gauge", "pgjournal_slow_journal_writers",
                       "Journal writers whose transaction is open longer than longest_transaction")
PROJECTION_LAG = _metric("Gauge", "pgjournal_projection_lag_seconds",
                         "Database clock minus the db_timestamp of the last handled envelope",
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
    from .errors import ConfigurationError

    if prometheus_client is None:
        raise ConfigurationError("metrics need prometheus_client: pip install 'pgjournal[metrics]'")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigurationError(f"metrics port must be an integer from 1 to 65535, got {port!r}")
    prometheus_client.start_http_server(port, addr=address)


def slices_label(min_slice: int, max_slice: int) -> str:
    return f"{min_slice}-{max_slice}"
