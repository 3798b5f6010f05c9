"""Read-your-writes through a projection, on both faces: a wait for the envelope an append returned ends once the
projection's offsets say it processed the event (and then its read model shows it), and raises NotSeenInTime
when the projection has not got there in time (not started, or paused)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.eventually import eventually
from support.faces import Face
from support.projection_handlers import FAST_PROJECTION

from pgjournal import InvalidArgument, Journal, NotSeenInTime
from pgjournal.projections import management
from pgjournal.projections.examples import counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.projections.read_your_writes import await_for_projection, wait_for_projection
from pgjournal.projections.runner import run_range


def wait(face: Face, name: str, envelope: Any, timeout: float) -> None:
    if face.kind == "blocking":
        wait_for_projection(face.journal, name, envelope, timeout=timeout)  # type: ignore[arg-type]
    else:
        face._runner.run(await_for_projection(face.journal, name, envelope, timeout=timeout))  # type: ignore


def counted(journal: Journal, name: str, pid: str) -> Any:
    with journal.connection() as conn:
        row = conn.execute("SELECT events, last_seq_nr FROM projection_counter WHERE projection_name = %s AND "
                           "persistence_id = %s", (name, pid)).fetchone()
    return tuple(row) if row else None


def test_a_wait_ends_once_the_projection_processed_the_write(face: Face, dsn: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with Journal.open(dsn) as journal:
        ensure_counter_table(journal)
        projection = Projection("ryw", "Cart", counter_writer("ryw", max_wait=0.05), FAST_PROJECTION)
        [first] = face.append("Cart|c1", [{"n": 1}])
        with pytest.raises(NotSeenInTime, match=r"projection 'ryw' had not processed 'Cart\|c1' seq_nr 1 within "
                                                r"0.2s") as timed_out:
            wait(face, "ryw", first, 0.2)
        assert timed_out.value.waited_for == ("Cart|c1", 1)
        runner = run_range(journal, projection, 0, 1023)
        try:
            wait(face, "ryw", first, 60)
            assert counted(journal, "ryw", "Cart|c1") == (1, 1)  # the read model shows the write
            with caplog.at_level(logging.INFO, logger="projections"):
                management.pause(journal, "ryw")
                eventually(lambda: "projection ryw 0-1023 paused" in caplog.text, "the range noticed the pause")
            [second] = face.append("Cart|c1", [{"n": 2}])
            with pytest.raises(NotSeenInTime):
                wait(face, "ryw", second, 0.5)
            assert counted(journal, "ryw", "Cart|c1") == (1, 1)
            wait(face, "ryw", first, 0)  # what it processed before stays seen
            management.resume(journal, "ryw")
            wait(face, "ryw", second, 60)
            assert counted(journal, "ryw", "Cart|c1") == (2, 2)
        finally:
            runner.stop()
            runner.join(timeout=30)
        with pytest.raises(InvalidArgument, match="timeout must be a number of seconds >= 0"):
            wait(face, "ryw", second, float("inf"))
