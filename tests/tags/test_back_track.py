"""The short back track after a catch-up: it re-reads only what the cursor passed close to its upper bound (rows a
catch-up read long after they were written cannot have been invisible then), and still finds a commit the cursor
passed at the head. Portable mode: no visibility horizon holds the cursor back, so late commits are passed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support import PORTABLE
from support.faces import Face, Kind, open_face
from support.tags import IN_STATEMENT, collect

from pgjournal import Source
from pgjournal.model.offsets import TimeBasedUUID
from pgjournal.model.timeuuid import TimeUUIDGenerator, from_key, order_key
from pgjournal.store import tags as store
from pgjournal.tags import statement_writer as tag_write_module

#: The short back track every 0.1 s over 5 s; the long one far off, so that only the short one can find a row.
SETTINGS: dict[str, Any] = dict(IN_STATEMENT, portable=True, tag_back_track_interval=0.1, tag_back_track_period=5.0,
                                tag_back_track_long_interval=3600.0)
OLD_EVENTS = 30


class Statements:
    """The tag statements the query issues (the real ones, counted on their way to the database)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages = 0
        self.keys: list[tuple[tuple[int, int], tuple[int, int]]] = []
        page, keys = store.page, store.keys

        def counted_page(*args: Any) -> Any:
            self.pages += 1
            return page(*args)

        def counted_keys(tag: str, after: Any, up_to: Any, limit: int) -> Any:
            self.keys.append(((after[1], after[2]), (up_to[1], up_to[2])))
            return keys(tag, after, up_to, limit)

        monkeypatch.setattr(store, "page", counted_page)
        monkeypatch.setattr(store, "keys", counted_keys)


def await_condition(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def read_until(stream: Any, condition: Callable[[], bool], timeout: float = 15.0) -> list[Any]:
    """What a live query delivers while it is read until ``condition`` holds (then closed from a watcher)."""
    def watch() -> None:
        try:
            await_condition(condition, timeout)
        finally:
            stream.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    got = list(stream)
    watcher.join()
    assert condition()
    return got


@pytest.fixture
def old(face_kind: Kind, dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Face, TimeBasedUUID]]:
    """A portable journal whose tag view holds :data:`OLD_EVENTS` events written a minute ago (within one second,
    as a batch import or a busy minute writes them), and an offset before them."""
    with open_face(face_kind, dsn, **SETTINGS) as journal:
        written = time.time_ns() - 60 * 10**9
        with monkeypatch.context() as patched:
            patched.setattr(tag_write_module, "GENERATOR", TimeUUIDGenerator(clock=lambda: written))
            for i in range(OLD_EVENTS):
                journal.append(f"Old|{i % 3}", [i], tags=["x"])
        first = order_key(next(iter(journal.query.current_events_by_tag("x"))).timestamp)
        yield journal, TimeBasedUUID(from_key(first[0] - 10_000_000, first[1]))


def test_rows_a_catch_up_read_long_after_they_were_written_are_not_read_again(
        old: tuple[Face, TimeBasedUUID], monkeypatch: pytest.MonkeyPatch) -> None:
    """The cursor rests on the last old row, so the old rows stay within the short back track's 5 s behind it:
    before, every back track (every poll here) re-read all of them."""
    journal, offset = old
    statements = Statements(monkeypatch)
    with journal.query.events_by_tag("x", offset) as stream:
        assert len(collect(stream, OLD_EVENTS)) == OLD_EVENTS
        polled = statements.pages
        # Reading on (a live query polls as it is read) until it polled eight times at the head, each past 0.1 s.
        assert read_until(stream, lambda: statements.pages >= polled + 8) == []
    assert statements.keys == []


def test_a_commit_the_cursor_passed_at_the_head_after_a_catch_up_comes_by_the_short_back_track(
        old: tuple[Face, TimeBasedUUID], dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    journal, offset = old
    journal.append("Cart|held", [1], tags=["x"])
    statements = Statements(monkeypatch)
    with journal.query.events_by_tag("x", offset) as stream:
        assert [e.persistence_id for e in collect(stream, OLD_EVENTS + 1)][-1] == "Cart|held"
        blocker = psycopg.connect(dsn)  # holds the progress row: the next append has its TimeUUID and waits
        blocker.execute("SELECT * FROM tag_write_progress WHERE persistence_id = 'Cart|held' FOR UPDATE")
        held = threading.Thread(target=journal.append, args=("Cart|held", [2]), kwargs={"tags": ["x"]})
        held.start()
        with psycopg.connect(dsn, autocommit=True) as watcher:
            await_condition(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone() == (1,))
        journal.append("Cart|after", [1], tags=["x"])
        assert [e.persistence_id for e in collect(stream, 1)] == ["Cart|after"]  # the cursor passed the held row
        blocker.commit()
        blocker.close()
        held.join()
        late = collect(stream, 1)
    assert [(e.persistence_id, e.tag_pid_sequence_nr) for e in late] == [("Cart|held", 2)]
    # Under SERIALIZABLE (PGJOURNAL_TEST_PORTABLE=1) the held append may be cancelled and retried with a new
    # TimeUUID: then the cursor reads it in order.
    assert late[0].source is Source.BACKTRACKING or PORTABLE
    old_rows_end = order_key(late[0].timestamp)[0] - 30 * 10_000_000
    assert statements.keys and all(after[0] > old_rows_end for after, _ in statements.keys)
