"""Prometheus metrics: appends, live lag, the horizon held back by a journal writer; served over HTTP."""

from __future__ import annotations

import socket
import urllib.request

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.held_writes import insert_in

from pgjournal import ConfigurationError, Journal
from pgjournal.runtime import metrics

prometheus_client = pytest.importorskip("prometheus_client")


def sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def test_appends_live_lag_and_a_writer_holding_the_horizon_are_measured(dsn: str) -> None:
    before = sample("pgjournal_appends_total", entity_type="Metered")
    events_before = sample("pgjournal_events_appended_total", entity_type="Metered")
    with Journal.open(dsn, **{**FAST, "backtracking_behind_current_time": 0.2}) as journal:
        journal.append("Metered|1", [1, 2, 3])
        journal.append("Metered|2", [4])
        assert sample("pgjournal_appends_total", entity_type="Metered") == before + 2
        assert sample("pgjournal_events_appended_total", entity_type="Metered") == events_before + 4
        with journal.query.events_by_slices("Metered", 0, 1023) as live:
            assert [next(live).seq_nr for _ in range(4)]
            lag = sample("pgjournal_live_lag_seconds", entity_type="Metered", slices="0-1023")
            assert 0 <= lag < 5
        with psycopg.connect(dsn) as held:
            insert_in(held, "Busy|held", 0)
            with journal.connection() as conn:
                tracker = journal.horizon_tracker()
                eventually(lambda: tracker.read(conn).held_back > 0.3)
                assert sample("pgjournal_horizon_held_back_seconds") > 0.3
                assert sample("pgjournal_slow_journal_writers") == 1
            held.rollback()


def test_metrics_are_served_over_http() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics.serve(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "pgjournal_appends_total" in body and "pgjournal_horizon_held_back_seconds" in body
    with pytest.raises(ConfigurationError, match="port must be"):
        metrics.serve(70000)


def test_a_projection_range_reports_envelopes_lag_and_leased_slices(dsn: str) -> None:
    from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
    from pgjournal.projections.handlers import Projection
    from pgjournal.projections.leases import LeaseManager
    from pgjournal.projections.runner import run_range

    with Journal.open(dsn, **FAST) as journal:
        ensure_counter_table(journal)
        for i in range(5):
            journal.append(f"Metered|p{i}", [{"n": 1}, {"n": 2}])
        runner = run_range(journal, Projection("metered", "Metered", counter_writer("metered")), 0, 1023)
        try:
            eventually(lambda: not counter_mismatches(journal, "metered", "Metered")
                       and runner.stats.handled == 10)
        finally:
            runner.stop()
            runner.join(10)
        assert sample("pgjournal_projection_envelopes_total", projection="metered", slices="0-1023") == 10
        assert 0 < sample("pgjournal_projection_lag_seconds", projection="metered", slices="0-1023") < 60
        leases = LeaseManager(journal, "metered", owner="metrics-test", duration=5.0)
        held, _ = leases.cycle()
        assert sample("pgjournal_projection_leased_slices", projection="metered", owner="metrics-test") == len(held)
        leases.leave()
        assert sample("pgjournal_projection_leased_slices", projection="metered", owner="metrics-test") == 0


def test_the_tag_pending_gauge_counts_the_batched_writers_pending_events(dsn: str) -> None:
    """Read from the writers' batches when scraped (no update per append): pending after the appends, none after
    the flush, and a closed journal's batch no longer counted."""
    before = sample("pgjournal_tag_pending_events")
    # A flush interval far beyond the test: only the explicit flush writes the rows.
    journal = Journal.open(dsn, tag_flush_interval=60, tag_writer_timeout=600)
    try:
        journal.append("Gauged|1", [1, 2], tags=("gauge",))
        journal.append("Gauged|2", [3], tags=("gauge",))
        assert sample("pgjournal_tag_pending_events") == before + 3
        assert journal.tag_writer is not None
        journal.tag_writer.flush()
        assert sample("pgjournal_tag_pending_events") == before
        journal.append("Gauged|1", [4], tags=("gauge",))
        assert sample("pgjournal_tag_pending_events") == before + 1
    finally:
        journal.close()
    assert sample("pgjournal_tag_pending_events") == before
