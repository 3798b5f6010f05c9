"""The lag operators read (``pgjournal projection status`` and ``pgjournal_projection_lag_seconds``): 0 when
nothing is pending, else the database clock minus the newest event handled, per slice range; and whether any
worker is alive."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from test_projections import append_many, caught_up, run_until
from typer.testing import CliRunner

from pgjournal import Journal, slice_for_persistence_id, slice_ranges
from pgjournal.cli.commands import app
from pgjournal.projections import management
from pgjournal.projections.examples import counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.runtime import metrics

pytestmark = pytest.mark.timing


def clock(journal: Journal):
    with journal.connection() as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def test_a_caught_up_projection_has_no_lag_however_long_it_idles(journal: Journal) -> None:
    """Before: the largest 'consumed minus event time' of the slices' last rows, kept until new events came."""
    ensure_counter_table(journal)
    projection = Projection("idle", "Cart", counter_writer("idle", max_wait=0.05), FAST_PROJECTION)
    append_many(journal, "Cart", 20, 2)
    run_until(journal, projection, slice_ranges(2), caught_up(journal, "idle", "Cart"))
    state = management.status(journal, "idle")  # the entity type is the one its offsets hold
    assert state.entity_types == ["Cart"]
    assert state.ranges and [r.lag for r in state.ranges] == [0.0] * len(state.ranges)
    assert not state.running  # its workers stopped


def test_pending_events_lag_by_the_newest_event_handled_in_their_range_only(journal: Journal) -> None:
    journal.append("Cart|late", ["x"])
    pending_slice = slice_for_persistence_id("Cart|late")
    handled_until = clock(journal) - timedelta(seconds=100)
    management.set_offset(journal, "behind", handled_until)  # everything before counts as handled

    def lags() -> dict[tuple[int, int], float | None]:
        state = management.status(journal, "behind", ["Cart"])
        return {(r.min_slice, r.max_slice): r.lag for r in state.ranges}

    eventually(lambda: any(lag for lag in lags().values()), "the new event visible under the horizon")
    now = clock(journal)
    measured = lags()
    assert len(measured) == 1  # one key: the whole range
    [(lo, hi)] = measured
    assert lo <= pending_slice <= hi
    assert 100 <= measured[(lo, hi)] <= (now - handled_until).total_seconds() + 1

    # per range: after this slice is handled, nothing is pending anywhere
    management.set_offset(journal, "behind", now, pending_slice, pending_slice)
    assert set(lags().values()) == {0.0}
    # another entity type's events are not this projection's
    assert management.status(journal, "behind", ["Order"]).ranges[0].lag == 0.0
    # an offset table of markers only names no entity type: no lag, and the command says how to get one
    assert management.status(journal, "behind").ranges[0].lag is None
    out = CliRunner().invoke(app, ["projection", "status", "behind", "--dsn", journal.dsn], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "stopped (no live worker)" in out.output and "--entity-type" in out.output
    out = CliRunner().invoke(app, ["projection", "status", "behind", "-e", "Cart", "--dsn", journal.dsn],
                             terminal_width=200)
    assert "0.000" in out.output and "entity type(s): Cart" in out.output, out.output


@pytest.mark.skipif(not metrics.available(), reason="needs the metrics extra")
def test_the_workers_gauge_shows_the_same_number(journal: Journal) -> None:
    from prometheus_client import REGISTRY

    ensure_counter_table(journal)
    settings = FAST_PROJECTION.__class__(**{**FAST_PROJECTION.__dict__, "lag_interval": 0.1})
    projection = Projection("gauged", "Cart", counter_writer("gauged", max_wait=0.05), settings)
    append_many(journal, "Cart", 10, 2)

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("pgjournal_projection_lag_seconds",
                                         {"projection": "gauged", "slices": "0-1023"})

    run_until(journal, projection, [(0, 1023)], lambda: caught_up(journal, "gauged", "Cart")() and gauge() == 0.0)
    # before: the clock minus the last event's time when it was handled, kept while the worker idled
    assert gauge() == 0.0
    assert management.status(journal, "gauged").ranges[0].lag == 0.0
