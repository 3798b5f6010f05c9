"""A projection with a tag filter (``Projection(..., tags=...)``): it processes exactly the tagged events, each
once, across rescaling 4 -> 8 -> 2 with writers running, in default and portable mode; bad filters refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from support.projection_handlers import FAST_PROJECTION
from support.projection_workers import Writers
from test_projections import run_until

from pgjournal import InvalidArgument, Journal, slice_ranges
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.examples import ensure_table
from pgjournal.projections.handlers import ExactlyOnce, Grouped, Projection

pytestmark = pytest.mark.mode_independent

SEEN_DDL = "CREATE TABLE IF NOT EXISTS tagged_seen (persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL)"


def record(conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO tagged_seen (persistence_id, seq_nr) VALUES (%s, %s)",
                        [(e.persistence_id, e.seq_nr) for e in envelopes])


def seen_and_tagged(journal: Journal) -> tuple[list[tuple[str, int]], set[tuple[str, int]]]:
    with journal.connection() as conn:
        seen = conn.execute("SELECT persistence_id, seq_nr FROM tagged_seen").fetchall()
        tagged = conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = 'Acct' "
                              "AND 'red' = ANY(tags)").fetchall()
    return [tuple(r) for r in seen], {tuple(r) for r in tagged}


@pytest.mark.parametrize("grouped", [False, True], ids=["exactly-once", "grouped"])
def test_a_tag_filtered_projection_rescaled_processes_each_tagged_event_once(mode_journal: Journal,
                                                                            grouped: bool) -> None:
    journal = mode_journal
    ensure_table(journal, SEEN_DDL)
    handler: Any = Grouped(record, max_count=20, max_wait=0.05) if grouped else \
        ExactlyOnce(lambda conn, env: record(conn, [env]))
    projection = Projection("reds", "Acct", handler, FAST_PROJECTION, tags=("red",))
    rejected = 0
    with Writers(journal, "Acct", entities=60, red_every=3) as writers:
        for n in (4, 8, 2):
            runners = run_until(journal, projection, slice_ranges(n), lambda: False, timeout=2.0)
            assert not any(r.failed for r in runners)
            rejected += sum(r.stats.rejected for r in runners)
        assert writers.count > 0

    def caught_up() -> bool:
        seen, tagged = seen_and_tagged(journal)
        return set(seen) == tagged

    runners = run_until(journal, projection, slice_ranges(2), caught_up)
    rejected += sum(r.stats.rejected for r in runners)
    seen, tagged = seen_and_tagged(journal)
    assert len(tagged) > 20
    assert sorted(seen) == sorted(tagged), "each tagged event processed exactly once, and nothing else"
    assert rejected == 0, "a filtered read's holes are not gaps: nothing was replayed by persistence id"


@pytest.mark.parametrize(("tags", "message"), [("red", "single string 'red'"), ((), "at least one tag"),
                                                (("",), "tag")])
def test_a_bad_tag_filter_is_refused_naming_the_value(tags: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Projection("p", "Acct", ExactlyOnce(lambda conn, env: None), tags=tags)
