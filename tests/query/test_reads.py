"""Reads by persistence id (current and live), persistence ids, highest seq nr and logical deletes. Every test
runs on both faces (``face``: ``Journal`` and ``AsyncJournal``, see tests/support/faces.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faces import Face, Kind, open_face

from pgjournal import Source

PID = "Cart|1"


@pytest.fixture
def small_pages(face_kind: Kind, dsn: str) -> Iterator[Face]:
    """Pages of 3 rows, so 10 events take four queries (on each face)."""
    with open_face(face_kind, dsn, buffer_size=3, **FAST) as opened:
        yield opened


def seq_nrs(envelopes) -> list[int]:
    return [e.seq_nr for e in envelopes]


def test_current_events_with_from_and_to(face: Face) -> None:
    face.append(PID, [{"n": i} for i in range(1, 11)])
    face.append("Cart|2", ["other"])
    query = face.query
    assert seq_nrs(query.current_events_by_persistence_id(PID)) == list(range(1, 11))
    assert seq_nrs(query.current_events_by_persistence_id(PID, 4)) == list(range(4, 11))
    assert seq_nrs(query.current_events_by_persistence_id(PID, 4, 6)) == [4, 5, 6]
    assert seq_nrs(query.current_events_by_persistence_id(PID, 0, 2)) == [1, 2]
    assert seq_nrs(query.current_events_by_persistence_id(PID, 11)) == []
    assert seq_nrs(query.current_events_by_persistence_id(PID, 7, 3)) == []
    assert seq_nrs(query.current_events_by_persistence_id("Cart|none")) == []
    events = list(query.current_events_by_persistence_id(PID, 9))
    assert [e.event for e in events] == [{"n": 9}, {"n": 10}]
    assert {(e.persistence_id, e.entity_type, e.source) for e in events} == {(PID, "Cart", Source.QUERY)}


def test_current_events_page_across_buffer_size(small_pages: Face) -> None:
    small_pages.append(PID, list(range(1, 11)))
    events = list(small_pages.query.current_events_by_persistence_id(PID))
    assert seq_nrs(events) == list(range(1, 11))
    assert [e.event for e in events] == list(range(1, 11))
    assert seq_nrs(small_pages.query.current_events_by_persistence_id(PID, 2, 8)) == list(range(2, 9))


def test_current_events_stop_at_the_tail_seen_at_start(small_pages: Face) -> None:
    small_pages.append(PID, list(range(10)))
    stream = small_pages.query.current_events_by_persistence_id(PID)
    first = next(stream)
    small_pages.append(PID, list(range(5)))  # written after the query started
    assert [first.seq_nr, *seq_nrs(stream)] == list(range(1, 11))
    assert seq_nrs(small_pages.query.current_events_by_persistence_id(PID)) == list(range(1, 16))


def collect_in_thread(stream, into: list, done: threading.Event) -> threading.Thread:
    def run() -> None:
        for env in stream:
            into.append(env)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.floor
def test_live_events_deliver_later_appends_and_stop_at_to_seq_nr(mode_face: Face) -> None:
    mode_face.append(PID, ["a", "b", "c"])
    got: list = []
    done = threading.Event()
    stream = mode_face.query.events_by_persistence_id(PID, 2, 6)
    collect_in_thread(stream, got, done)
    eventually(lambda: len(got) == 2)
    mode_face.append(PID, ["d"])
    mode_face.append("Cart|2", ["unrelated"])
    mode_face.append(PID, ["e", "f", "g"])  # g (7) is beyond to_seq_nr
    assert done.wait(10), "the live query must end by itself at to_seq_nr"
    assert seq_nrs(got) == [2, 3, 4, 5, 6]
    assert [e.event for e in got] == ["b", "c", "d", "e", "f"]
    assert stream.closed


def test_live_events_stop_on_close_from_another_thread(mode_face: Face) -> None:
    got: list = []
    done = threading.Event()
    stream = mode_face.query.events_by_persistence_id(PID)
    collect_in_thread(stream, got, done)
    mode_face.append(PID, ["a"])
    eventually(lambda: len(got) == 1)
    mode_face.append(PID, ["b", "c"])
    eventually(lambda: len(got) == 3)
    stream.close()
    assert done.wait(5), "close() must end the iteration"
    assert seq_nrs(got) == [1, 2, 3]


def test_live_events_as_context_manager(face: Face) -> None:
    face.append(PID, ["a", "b"])
    with face.query.events_by_persistence_id(PID) as stream:
        assert [next(stream).event, next(stream).event] == ["a", "b"]
    assert stream.closed
    assert list(stream) == []


@pytest.mark.floor
def test_live_events_are_woken_by_the_writer_signal(face_kind: Kind, dsn: str) -> None:
    """With notifications on, a live query sees a new event long before its (here 30 s) refresh interval."""
    with open_face(face_kind, dsn, refresh_interval=30) as journal:
        got: list = []
        done = threading.Event()
        stream = journal.query.events_by_persistence_id(PID, 1, 2)
        collect_in_thread(stream, got, done)
        journal.append(PID, ["a"])
        eventually(lambda: len(got) == 1, timeout=5)
        journal.append(PID, ["b"])
        assert done.wait(5)
        assert seq_nrs(got) == [1, 2]
        assert got[1].source == Source.NOTIFIED


def test_current_persistence_ids_keyset_paging(small_pages: Face) -> None:
    pids = [*sorted(f"Cart|{i:02d}" for i in range(11)), "Order|1", "plain"]
    for pid in reversed(pids):
        small_pages.append(pid, ["x", "y"])  # two events each: every id must come once
    query = small_pages.query
    assert list(query.current_persistence_ids(limit=None)) == pids
    assert list(query.current_persistence_ids()) == pids  # default limit 1000
    assert list(query.current_persistence_ids(limit=5)) == pids[:5]
    assert list(query.current_persistence_ids(after="Cart|04", limit=4)) == pids[5:9]
    assert list(query.current_persistence_ids(after="Cart|99")) == ["Order|1", "plain"]
    assert list(query.current_persistence_ids(after="plain")) == []
    # resuming from the last id of each page visits every id exactly once
    resumed, after = [], None
    while True:
        page = list(query.current_persistence_ids(after=after, limit=4))
        if not page:
            break
        resumed += page
        after = page[-1]
    assert resumed == pids


def test_highest_seq_nr(face: Face) -> None:
    assert face.highest_seq_nr(PID) == 0
    face.append(PID, ["a", "b", "c"])
    face.append("Cart|2", ["x"])
    assert face.highest_seq_nr(PID) == 3
    assert face.highest_seq_nr("Cart|2") == 1


def test_delete_events_is_logical(small_pages: Face, dsn: str) -> None:
    journal = small_pages
    journal.append(PID, list(range(1, 8)))
    assert journal.delete_events(PID, 4) == 4
    assert journal.delete_events(PID, 4) == 0  # already deleted
    query = journal.query
    assert seq_nrs(query.current_events_by_persistence_id(PID)) == [5, 6, 7]
    assert seq_nrs(query.current_events_by_persistence_id(PID, 1, 5)) == [5]
    assert journal.highest_seq_nr(PID) == 7
    written = journal.append(PID, ["next"])
    assert seq_nrs(written) == [8]
    with journal.query.events_by_persistence_id(PID, 1, 8) as live:
        assert seq_nrs(live) == [5, 6, 7, 8]
    # delete everything: reads are empty, numbering still continues
    journal.delete_events(PID, 100)
    assert list(query.current_events_by_persistence_id(PID)) == []
    assert journal.highest_seq_nr(PID) == 8
    assert seq_nrs(journal.append(PID, ["again"], expected_seq_nr=8)) == [9]
    assert list(query.current_persistence_ids()) == [PID]
    with psycopg.connect(dsn) as conn:  # the rows are still there, only marked
        assert conn.execute("SELECT count(*), count(*) FILTER (WHERE deleted) FROM event_journal").fetchone() \
            == (9, 8)


def test_live_events_end_at_to_seq_nr_when_the_last_events_are_deleted(small_pages: Face) -> None:
    journal = small_pages
    journal.append(PID, list(range(1, 11)))
    journal.delete_events(PID, 10)
    done = threading.Event()
    got: list = []
    stream = journal.query.events_by_persistence_id(PID, 1, 10)
    collect_in_thread(stream, got, done)
    assert done.wait(5), "every event up to to_seq_nr is written (and deleted): the query must end"
    assert got == []
    # not yet written up to the bound: it waits for the events, then ends
    journal.append(PID, ["a", "b", "c"])
    journal.delete_events(PID, 13)
    done, got = threading.Event(), []
    with journal.query.events_by_persistence_id(PID, 1, 15) as stream:
        collect_in_thread(stream, got, done)
        assert not done.wait(0.5), "seq nrs 14 and 15 are not written yet"
        journal.append(PID, ["d"])
        journal.append(PID, ["e"])
        assert done.wait(5)
    assert [(e.seq_nr, e.event) for e in got] == [(14, "d"), (15, "e")]
