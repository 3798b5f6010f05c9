"""``replication status`` as Prometheus gauges (``StatusMetrics``, ``replication run --metrics-port``): per stream
the peer available, its lag, events/s and workers, computed when scraped; a peer that stops answering turns its
stream to 0 and drops its lag, and the scrape itself never fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.eventually import eventually
from support.faultproxy import fault_proxy
from support.replication import write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.model.replication import ReplicationId
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator
from pgjournal.replication.status import StatusMetrics

pytestmark = pytest.mark.postgres_only("two databases, the replicator's advisory locks")

TYPE = "Counter"
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=5, backoff=0.01)
KEY = {"peer": "us", "entity_type": TYPE}


@pytest.fixture
def two(shard_databases: Any) -> Iterator[tuple[list[str], Journal, Journal]]:
    dsns = shard_databases(2)
    with Journal.open(dsns[0], **FAST) as eu, Journal.open(dsns[1], **FAST) as us:
        yield dsns, eu, us


def test_a_streams_status_is_scraped_and_a_peer_cut_off_shows_unavailable(two: Any) -> None:
    dsns, eu, _us = two
    with fault_proxy(dsns[1]) as (proxy, proxied), \
            Journal.open(proxied, **{**FAST, "connect_timeout": 1}) as us_via_proxy:
        registry = CollectorRegistry()
        registry.register(StatusMetrics(eu, {("us", TYPE): us_via_proxy, ("ap", TYPE): None}))

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {**KEY, **labels})

        with contextlib.closing(_Stopping(Replicator(eu, "eu", us_via_proxy, "us", TYPE,
                                                     settings=SETTINGS).run_range())):
            for i in range(5):
                write_local(us_via_proxy, ReplicationId(TYPE, "c1", "us"), f"us-{i}")
            eventually(lambda: sample("pgjournal_replication_events_per_second") == 5 / 60,
                       "the five events counted in the stream's rate")
            assert sample("pgjournal_replication_peer_available") == 1.0
            assert eventually(lambda: sample("pgjournal_replication_lag_seconds") == 0.0, "nothing pending")
            assert sample("pgjournal_replication_workers") == 0.0  # a range run holds no lease
            # A peer not opened yet (the worker opens peers as they answer): unavailable, no lag.
            ap = {"peer": "ap", "entity_type": TYPE}
            assert registry.get_sample_value("pgjournal_replication_peer_available", ap) == 0.0
            assert registry.get_sample_value("pgjournal_replication_lag_seconds", ap) is None

            proxy.refuse(True)
            proxy.cut()
            assert sample("pgjournal_replication_peer_available") == 0.0
            assert sample("pgjournal_replication_lag_seconds") is None
            assert sample("pgjournal_replication_events_per_second") == 5 / 60, "counted here, not at the peer"

            proxy.refuse(False)
            eventually(lambda: sample("pgjournal_replication_peer_available") == 1.0, "the peer answers again")


class _Stopping:
    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def close(self) -> None:
        self.runner.stop()
        self.runner.join(15)
        assert self.runner.failed is None, self.runner.failed


def test_a_replication_worker_reports_its_streams_while_it_runs(two: Any) -> None:
    import threading

    from prometheus_client import REGISTRY

    from pgjournal.replication.workers import Peer, run_replication

    dsns, _eu, _us = two
    stop = threading.Event()
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(run_replication(
        dsns[0], "eu", [Peer("us", dsns[1])], [TYPE], stop=stop, lease_duration=2, journal_settings=FAST,
        metrics=True)))
    worker.start()
    try:
        eventually(lambda: REGISTRY.get_sample_value("pgjournal_replication_peer_available", KEY) == 1.0,
                   "the worker's stream reported available")
        eventually(lambda: REGISTRY.get_sample_value("pgjournal_replication_workers", KEY) == 1.0,
                   "the worker holding the stream's leases")
    finally:
        stop.set()
        worker.join(30)
    assert codes == [0]
    assert REGISTRY.get_sample_value("pgjournal_replication_peer_available", KEY) is None, "unregistered on exit"
