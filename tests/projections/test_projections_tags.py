"""A projection with a tag filter (``Projection(..., tags=...)``): it processes exactly the tagged events, each
once, across rescaling 4 -> 8 -> 2 with writers running, in default and portable mode; bad filters refused."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from support.projection_handlers import FAST_PROJECTION
from test_projections import run_until

from pgjournal import InvalidArgument, Journal, slice_ranges
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.examples import ensure_table
from pgjournal.projections.handlers import ExactlyOnce, Grouped, Projection

SEEN_DDL = "CREATE TABLE IF NOT EXISTS tagged_seen (persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL)"


class TaggedWriters:
    """Threads appending to a set of entities until stopped; one append in three tagged ``red``."""

    def __init__(self, journal: Journal, entity_type: str, entities: int, threads: int = 3) -> None:
        self.journal, self.entity_type, self.entities = journal, entity_type, entities
        self.stop = threading.Event()
        self.count = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        while not self.stop.is_set():
            pid = f"{self.entity_type}|{hashlib.sha1(str(rng.randrange(self.entities)).encode()).hexdigest()[:12]}"
            tags = ["red"] if rng.randrange(3) == 0 else []
            self.journal.append(pid, [{"n": k} for k in range(rng.randint(1, 3))], tags=tags)
            self.count += 1
            time.sleep(0.005)

    def __enter__(self) -> TaggedWriters:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


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
    with TaggedWriters(journal, "Acct", entities=60) as writers:
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
