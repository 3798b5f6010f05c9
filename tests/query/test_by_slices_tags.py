"""events_by_slices(..., tags=...): only the events carrying any of the tags, filtered by the database, in default
mode (a sparse page over the tagged events' index) and portable mode (markers without payloads), on both faces;
offsets that move past the events filtered out; late commits under the horizon and behind a portable cursor."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faces import Face

from pgjournal import InvalidArgument, Journal, Source, slice_for_persistence_id
from pgjournal.store.events import insert_sql

LATE_COMMITS: dict[str, Any] = dict(FAST, portable=True, behind_current_time=0.05,
                                    backtracking_behind_current_time=30.0)


def keys(envelopes: Any) -> list[tuple[str, int]]:
    return [(e.persistence_id, e.seq_nr) for e in envelopes]


def current(face: Any, *, tags: Any, offset: Any = None, entity_type: str = "Cart") -> list[Any]:
    if offset is None:
        return list(face.query.current_events_by_slices(entity_type, 0, 1023, tags=tags))
    return list(face.query.current_events_by_slices(entity_type, 0, 1023, offset, tags=tags))


def until_read(face: Any, count: int, *, tags: Any, offset: Any = None) -> list[Any]:
    """A current query's result once it holds ``count`` envelopes (portable mode reads behind the clock)."""
    found: list[Any] = []

    def complete() -> bool:
        found[:] = current(face, tags=tags, offset=offset)
        return len(found) >= count

    eventually(complete, f"{count} envelopes read")
    return found


def insert_held(conn: psycopg.Connection, pid: str, after: int, tags: list[str] | None) -> None:
    """The write path's statement, tags included, on the caller's connection (its transaction left open)."""
    conn.execute(insert_sql("event_journal", single=True), {
        "slice": slice_for_persistence_id(pid), "entity_type": pid.partition("|")[0], "pid": pid, "writer": "held",
        "tags": tags, "expected": after, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
        "ser_id": 31, "manifest": "", "payload": b'{"held": true}'})


def test_a_filtered_reader_sees_only_the_tagged_events_in_order(mode_face: Face) -> None:
    expected: dict[str, list[tuple[str, int]]] = {"red": [], "blue": [], "any": []}
    for i in range(60):
        pid = f"Cart|{i % 7}"
        tags = ["red"] if i % 5 == 0 else ["blue", "big"] if i % 11 == 0 else []
        (written,) = mode_face.append(pid, [{"n": i}], tags=tags)
        for key in ("red", "blue"):
            if key in tags:
                expected[key].append((pid, written.seq_nr))
        if "red" in tags or "blue" in tags:
            expected["any"].append((pid, written.seq_nr))
    mode_face.append("Other|1", [{"x": 1}], tags=["red"])
    red = until_read(mode_face, len(expected["red"]), tags=["red"])
    assert keys(red) == expected["red"]
    assert all(e.event["n"] % 5 == 0 and "red" in e.tags for e in red)  # decoded, and carrying the tag
    order = [(e.db_timestamp, e.seq_nr) for e in red]
    assert order == sorted(order)
    assert keys(current(mode_face, tags=("blue",))) == expected["blue"]
    # Any of the tags (Akka's IncludeTags): an event carrying one of them, once.
    assert keys(current(mode_face, tags=["red", "blue"])) == expected["any"]
    assert current(mode_face, tags=["green"]) == []


def test_a_consumer_resumed_over_untagged_events_neither_misses_nor_repeats(mode_face: Face) -> None:
    mode_face.append("Cart|a", [{"n": 1}], tags=["red"])
    for i in range(40):  # a stretch of untagged events, Cart|a's own among them
        mode_face.append(f"Cart|{'a' if i % 4 == 0 else f'u{i % 3}'}", [{"n": i}])
    mode_face.append("Cart|b", [{"n": 1}], tags=["red"])
    first = until_read(mode_face, 2, tags=["red"])
    assert keys(first) == [("Cart|a", 1), ("Cart|b", 1)]
    # The offset of Cart|b's envelope lies past every untagged event before it.
    assert keys(until_read(mode_face, 1, tags=["red"], offset=first[0].offset)) == [("Cart|b", 1)]
    assert current(mode_face, tags=["red"], offset=first[1].offset) == []
    for i in range(20):
        mode_face.append(f"Cart|u{i % 3}", [{"n": i}])
    (later,) = mode_face.append("Cart|a", [{"n": 99}], tags=["red"])
    resumed = until_read(mode_face, 1, tags=["red"], offset=first[1].offset)
    assert keys(resumed) == [("Cart|a", later.seq_nr)]
    assert later.seq_nr == 12  # its untagged predecessors are left out, not loaded as a gap
    assert current(mode_face, tags=["red"], offset=resumed[0].offset) == []


def test_a_live_filtered_query_waits_for_a_held_tagged_event(face: Face, dsn: str) -> None:
    """Default mode: a tagged event whose transaction is held open stops the main cursor (the horizon), so the
    tagged event committed after it is delivered after it, once the horizon passes; both once."""
    if not face.capabilities.writer_horizon:
        pytest.skip("the visibility horizon is PostgreSQL's default mode")
    got: list[Any] = []
    face.append("Cart|before", [{"n": 0}], tags=["red"])
    with face.query.events_by_slices("Cart", 0, 1023, tags=["red"]) as live:
        reader = threading.Thread(target=lambda: [got.append(e) for e in live], daemon=True)
        reader.start()
        eventually(lambda: keys(got) == [("Cart|before", 1)], "the reader runs")
        with psycopg.connect(dsn) as held:
            insert_held(held, "Cart|late", 0, ["red"])
            face.append("Cart|quiet", [{"n": 1}])  # untagged
            face.append("Cart|early", [{"n": 1}], tags=["red"])
            before = len(got)
            held.commit()
        eventually(lambda: len(got) >= 3, "the held event and the later one read")
        live.close()
        reader.join(5)
    assert before == 1, "nothing passed the open transaction"
    assert keys(got) == [("Cart|before", 1), ("Cart|late", 1), ("Cart|early", 1)]


def test_a_portable_filtered_query_closes_a_gap_with_the_tagged_events_only(dsn: str) -> None:
    """Portable mode: a transaction outlasting ``behind_current_time`` commits a tagged event behind the main
    cursor; the next tagged event of the same persistence id is read first, and the gate's fill delivers the
    late one before it (backtracked), leaving out the untagged event between them."""
    got: list[Any] = []
    with Journal.open(dsn, **LATE_COMMITS) as journal, \
            journal.query.events_by_slices("Cart", 0, 1023, tags=["red"]) as live:
        reader = threading.Thread(target=lambda: [got.append(e) for e in live], daemon=True)
        reader.start()
        # (The journal's tagged appends also write the tag view, whose rows a held tagged append would lock.)
        with psycopg.connect(dsn) as held:
            insert_held(held, "Cart|late", 0, ["red"])
            journal.append("Cart|early", [{"n": 1}], tags=["red"])
            early = eventually(lambda: [e for e in got if e.persistence_id == "Cart|early"], "Cart|early read")
            first = held.execute("SELECT db_timestamp FROM event_journal WHERE persistence_id = 'Cart|late'").fetchone()
            assert early[0].offset.timestamp > first[0], "the main cursor passed the open event"
            held.commit()
        journal.append("Cart|late", [{"n": 2}], expected_seq_nr=1)
        journal.append("Cart|late", [{"n": 3}], expected_seq_nr=2, tags=["red"])
        eventually(lambda: any(e.persistence_id == "Cart|late" and e.seq_nr == 3 for e in got), "Cart|late 3 read")
        live.close()
        reader.join(5)
    late = [(e.seq_nr, e.source is Source.BACKTRACKING) for e in got if e.persistence_id == "Cart|late"]
    assert late == [(1, True), (3, False)]
    assert all(e.event is not None and "red" in e.tags for e in got)


@pytest.mark.parametrize(("tags", "message"), [
    ("red", "not a single string 'red'"),
    ([], "at least one tag"),
    (["red", ""], "tag"),
    (["x" * 300], "tag"),
    (42, "42"),
])
def test_bad_tags_are_refused_naming_the_value(face: Face, tags: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        list(face.query.current_events_by_slices("Cart", 0, 1023, tags=tags))
    with pytest.raises(InvalidArgument, match=message):
        face.query.events_by_slices("Cart", 0, 1023, tags=tags)
