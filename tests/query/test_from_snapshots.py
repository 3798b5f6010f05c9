"""events_by_slices_starting_from_snapshots: per persistence id its snapshot (transformed into an event),
then only its events after it; persistence ids without a snapshot as events_by_slices delivers them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.eventually import eventually

from pgjournal import InvalidArgument, Journal, NoOffset, Source


def readable(journal: Journal, *written: Any) -> None:
    """Wait until the database clock is past the newest of ``written`` by the journal's read margin."""
    newest = max(w.db_timestamp for w in written)
    margin = timedelta(seconds=journal.read_margin)

    def clock_passed() -> bool:
        with journal.connection() as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        return bool(row and row[0] - margin > newest)

    eventually(clock_passed, timeout=5, interval=0.01)


def as_state(snapshot: Any) -> dict:
    return {"from snapshot": snapshot}


def keys(envelopes: list) -> list[tuple[str, int, str]]:
    return [(e.persistence_id, e.seq_nr, e.source.value) for e in envelopes]


def write_carts(journal: Journal) -> list:
    """Cart|A: 5 events, snapshot at 3; Cart|B: 2 events, none; Cart|C: snapshot at its last event (2)."""
    written = journal.append("Cart|A", [{"n": n} for n in range(1, 4)])
    journal.save_snapshot("Cart|A", 3, {"total": 3})
    written += journal.append("Cart|B", [{"n": 1}, {"n": 2}])
    written += journal.append("Cart|C", [{"n": 1}, {"n": 2}])
    journal.save_snapshot("Cart|C", 2, {"total": 2}, metadata={"taken": "by test"})
    written += journal.append("Cart|A", [{"n": 4}, {"n": 5}])
    written += journal.append("Order|1", [{"n": 1}])
    return written


def test_snapshots_come_first_then_the_events_after_them(mode_journal: Journal) -> None:
    journal = mode_journal
    readable(journal, *write_carts(journal))
    got = list(journal.query.current_events_by_slices_starting_from_snapshots("Cart", 0, 1023, transform=as_state))
    assert keys(got[:2]) == [("Cart|A", 3, "snapshot"), ("Cart|C", 2, "snapshot")]
    assert sorted(keys(got[2:])) == [("Cart|A", 4, "query"), ("Cart|A", 5, "query"), ("Cart|B", 1, "query"),
                                     ("Cart|B", 2, "query")]
    snapshot_a, snapshot_c = got[0], got[1]
    assert snapshot_a.event == {"from snapshot": {"total": 3}} and snapshot_a.source is Source.SNAPSHOT
    assert snapshot_a.db_timestamp == journal.query.timestamp_of("Cart|A", 3)
    assert snapshot_c.metadata == {"taken": "by test"} and snapshot_c.entity_type == "Cart"
    assert snapshot_a.offset.timestamp == snapshot_c.offset.timestamp  # the start offset: safe to resume from
    assert [e.event for e in got if e.persistence_id == "Cart|A"][1:] == [{"n": 4}, {"n": 5}]


def test_from_an_offset_only_later_snapshots_stand_in_for_events(journal: Journal) -> None:
    first = journal.append("Cart|A", [{"n": 1}, {"n": 2}])
    journal.save_snapshot("Cart|A", 2, "old snapshot")
    readable(journal, *first, *journal.append("Cart|B", [{"n": 1}]))
    events = list(journal.query.current_events_by_slices("Cart", 0, 1023))
    offset = events[-1].offset  # at Cart|B 1, the last so far: its snapshot (taken at it) counts as consumed
    # (in portable mode, where it settled less than its timestamp, seen also names Cart|A: see TimestampOffset)
    assert offset.timestamp == events[-1].db_timestamp and offset.seen["Cart|B"] == 1
    later = journal.append("Cart|A", [{"n": 3}, {"n": 4}])
    journal.save_snapshot("Cart|B", 1, "before the offset: not used")
    journal.append("Cart|B", [{"n": 2}])
    readable(journal, *later, *journal.append("Cart|C", [{"n": 1}]))
    journal.save_snapshot("Cart|C", 1, "after the offset")
    got = list(journal.query.current_events_by_slices_starting_from_snapshots("Cart", 0, 1023, offset,
                                                                              transform=str))
    assert keys(got) == [("Cart|C", 1, "snapshot"), ("Cart|A", 3, "query"), ("Cart|A", 4, "query"),
                         ("Cart|B", 2, "query")]
    assert got[0].offset == offset


def test_live_continues_with_new_events(journal: Journal) -> None:
    readable(journal, *write_carts(journal))
    with journal.query.events_by_slices_starting_from_snapshots("Cart", 0, 1023, transform=as_state) as live:
        got = [next(live) for _ in range(6)]
        journal.append("Cart|C", [{"n": 3}])
        got.append(next(live))
    assert keys(got[:2]) == [("Cart|A", 3, "snapshot"), ("Cart|C", 2, "snapshot")]
    assert sorted(keys(got[2:6])) == [("Cart|A", 4, "query"), ("Cart|A", 5, "query"), ("Cart|B", 1, "query"),
                                      ("Cart|B", 2, "query")]
    assert (got[6].persistence_id, got[6].seq_nr, got[6].event) == ("Cart|C", 3, {"n": 3})
    assert live.closed


def test_a_snapshot_without_its_events_timestamp_is_left_out(journal: Journal) -> None:
    journal.save_snapshot("Cart|A", 1, "taken before its event was found")  # db_timestamp NULL
    readable(journal, *journal.append("Cart|A", [{"n": 1}, {"n": 2}]))
    got = list(journal.query.current_events_by_slices_starting_from_snapshots("Cart", 0, 1023, NoOffset,
                                                                              transform=str))
    assert keys(got) == [("Cart|A", 1, "query"), ("Cart|A", 2, "query")]


@pytest.mark.parametrize("transform", [None, "str", 3])
def test_transform_must_be_a_function(journal: Journal, transform: Any) -> None:
    with pytest.raises(InvalidArgument, match="transform must be a function from a snapshot to an event"):
        journal.query.current_events_by_slices_starting_from_snapshots("Cart", 0, 1023, transform=transform)
