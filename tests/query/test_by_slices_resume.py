"""A consumer resumed from its offset while a late commit is on its way, made on purpose, on both faces and in both
modes: every event comes once, in sequence order per persistence id, across the two queries.

The case: a writer holds an event's transaction open; a newer event commits; the first query delivers the newer
one (in portable mode its main cursor, bounded only by the clock minus ``behind_current_time``, passes the open
event) and is closed; the held transaction commits, so its event lies below the last envelope's offset
timestamp but inside ``backtracking_behind_current_time``. A query resumed from that offset must still deliver
it: through its gap fill when the next event of the same persistence id comes first, through backtracking when
none does, and in a current query. In default mode the visibility horizon keeps the first query's main cursor
before the open transaction, so the same steps must hold there too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faces import Face, Kind, open_face
from support.held_writes import insert_in

from pgjournal import Source, TimestampOffset

#: Backtracking well behind the clock (the held transaction commits well inside it), the main cursor 50 ms behind.
LATE = dict(FAST, behind_current_time=0.05, backtracking_behind_current_time=5.0)


@pytest.fixture(params=["default", "portable"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def journal(face_kind: Kind, mode: str, dsn: str) -> Iterator[Face]:
    with open_face(face_kind, dsn, portable=mode == "portable", **LATE) as opened:
        yield opened


class Reader:
    """A live query read in a thread of its own, closed by :meth:`stop`."""

    def __init__(self, journal: Face, offset: Any) -> None:
        self.got: list[Any] = []
        #: Each envelope's offset as it was handed out: none may change afterwards (offsets are filled in place).
        self.handed: list[str] = []
        self.error: BaseException | None = None
        self.live = journal.query.events_by_slices("Late", 0, 1023, offset)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for envelope in self.live:
                self.handed.append(str(envelope.offset))
                self.got.append(envelope)
        except BaseException as exc:  # reported by stop(); a test that failed before it ends the face under it
            self.error = exc

    def has(self, pid: str, seq_nr: int) -> bool:
        return any((e.persistence_id, e.seq_nr) == (pid, seq_nr) for e in self.got)

    def stop(self) -> Any:
        """Close the query; the last envelope's offset."""
        self.live.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        assert self.error is None, self.error
        assert [str(e.offset) for e in self.got] == self.handed, "an offset changed after it was handed out"
        return self.got[-1].offset


def keys(envelopes: list[Any]) -> list[tuple[str, int]]:
    return [(e.persistence_id, e.seq_nr) for e in envelopes]


def check_once_in_order(delivered: list[tuple[str, int]], written: set[tuple[str, int]]) -> None:
    assert len(delivered) == len(set(delivered)), f"duplicates in {delivered}"
    assert set(delivered) == written, f"missing {sorted(written - set(delivered))}"
    last: dict[str, int] = {}
    for pid, seq_nr in delivered:
        assert seq_nr == last.get(pid, 0) + 1, f"{pid} {seq_nr} after {last.get(pid, 0)} in {delivered}"
        last[pid] = seq_nr


def first_query_then_commit(journal: Face, dsn: str, mode: str) -> tuple[list[Any], TimestampOffset]:
    """The first query's deliveries and its last envelope's offset, taken while ``Late|held`` 1 was open; on
    return that event is committed, below the offset's timestamp in portable mode."""
    journal.append("Late|before", [{"n": 1}])
    with psycopg.connect(dsn) as held:
        # The test's own instrument: a SERIALIZABLE database (the portable test pass) could refuse its commit.
        held.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        insert_in(held, "Late|held", after=0)
        ((held_at,),) = held.execute("SELECT db_timestamp FROM event_journal WHERE persistence_id = 'Late|held'")
        journal.append("Late|after", [{"n": 1}])
        first = Reader(journal, None)
        if mode == "portable":
            eventually(lambda: first.has("Late|after", 1), "the first query passes the open event")
        else:  # the horizon holds the main cursor before the open transaction's start
            eventually(lambda: first.has("Late|before", 1), "the first query reads what came before")
        offset = first.stop()
        if mode == "portable":
            assert offset.timestamp > held_at, "the resumed offset lies after the held event"
        held.commit()
    assert not first.has("Late|held", 1)
    return first.got, offset


WRITTEN = {("Late|before", 1), ("Late|held", 1), ("Late|after", 1)}


def test_the_next_event_of_a_late_commit_below_the_resumed_offset_comes_after_it(journal: Face, dsn: str,
                                                                               mode: str) -> None:
    """The resumed query reads event 2 first: the gap fill must load event 1, not count it as consumed because
    its timestamp lies below the offset."""
    got, offset = first_query_then_commit(journal, dsn, mode)
    journal.append("Late|held", [{"n": 2}], expected_seq_nr=1)
    second = Reader(journal, offset)
    eventually(lambda: second.has("Late|held", 2), "event 2 of Late|held delivered")
    second.stop()
    check_once_in_order(keys(got) + keys(second.got), WRITTEN | {("Late|held", 2)})


def test_a_late_commit_below_the_resumed_offset_is_backtracked(journal: Face, dsn: str, mode: str) -> None:
    """No later event of its persistence id: only the resumed query's backtracking can find it."""
    got, offset = first_query_then_commit(journal, dsn, mode)
    second = Reader(journal, offset)
    eventually(lambda: second.has("Late|held", 1), "the late event delivered", timeout=30)
    journal.append("Late|after", [{"n": 2}], expected_seq_nr=1)
    eventually(lambda: second.has("Late|after", 2), "a later event delivered after it")
    second.stop()
    check_once_in_order(keys(got) + keys(second.got), WRITTEN | {("Late|after", 2)})
    if mode == "portable":
        assert [e.source for e in second.got if e.persistence_id == "Late|held"] == [Source.BACKTRACKING]


def test_a_current_query_from_the_offset_delivers_the_late_commit(journal: Face, dsn: str, mode: str) -> None:
    got, offset = first_query_then_commit(journal, dsn, mode)
    rest = list(journal.query.current_events_by_slices("Late", 0, 1023, offset))
    check_once_in_order(keys(got) + keys(rest), WRITTEN)
    # The current query's last offset resumes exactly after it.
    journal.append("Late|held", [{"n": 2}], expected_seq_nr=1)
    after = eventually(lambda: keys(list(journal.query.current_events_by_slices("Late", 0, 1023, rest[-1].offset))),
                       "event 2 below the current query's bound")
    assert after == [("Late|held", 2)]


def test_an_offset_names_only_what_was_delivered_before_it_at_a_shared_timestamp(journal: Face, mode: str,
                                                                                  dsn: str) -> None:
    """Events of several persistence ids at one timestamp, read in one page: the offset of the first names only
    what was delivered up to it (a later one of the page named there would be skipped by a query resumed from
    it), so a query resumed from each envelope delivers exactly the rest."""
    pids = [f"Cart|same-{i}" for i in range(4)]
    for pid in pids:
        journal.append(pid, ["a", "b"])
    with psycopg.connect(dsn, autocommit=True) as conn:  # one timestamp for all of them, recent (not settled)
        conn.execute("UPDATE event_journal SET db_timestamp = (SELECT max(db_timestamp) FROM event_journal) "
                     "WHERE persistence_id = ANY(%s)", (pids,))
    got = eventually(lambda: (read := list(journal.query.current_events_by_slices("Cart", 0, 1023)))
                     and len(read) == 2 * len(pids) and read, "all the events past behind_current_time")
    assert sorted((e.persistence_id, e.seq_nr) for e in got) == sorted((p, n) for p in pids for n in (1, 2))
    if mode == "portable":  # offsets past what is settled: the case under test
        assert any(e.offset.settled is not None for e in got)
    for k, envelope in enumerate(got):
        again = [(e.persistence_id, e.seq_nr)
                 for e in journal.query.current_events_by_slices("Cart", 0, 1023, envelope.offset)]
        assert again == [(e.persistence_id, e.seq_nr) for e in got[k + 1:]], k
