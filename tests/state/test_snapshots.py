"""Snapshots: one per persistence id, never replaced by an older one, loaded by criteria."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgjournal import InvalidArgument, InvalidPersistenceId, Journal, SerializerRegistry

PID = "Cart|1"


@dataclass
class CartState:
    items: list[str]
    total: int


def test_save_and_load(journal: Journal) -> None:
    written = journal.append(PID, ["a", "b", "c"])
    assert journal.load_snapshot(PID) is None
    before = datetime.now(UTC)
    journal.save_snapshot(PID, 3, {"items": ["a", "b", "c"]}, metadata={"v": 2}, tags=["t1"])
    snap = journal.load_snapshot(PID)
    assert snap is not None
    assert (snap.persistence_id, snap.seq_nr, snap.snapshot) == (PID, 3, {"items": ["a", "b", "c"]})
    assert snap.metadata == {"v": 2} and snap.tags == ("t1",)
    assert snap.db_timestamp == written[2].db_timestamp, "db_timestamp is that of the event at seq_nr"
    assert abs(snap.write_timestamp - before.timestamp() * 1000) < 60_000
    assert journal.load_snapshot("Cart|2") is None


def test_registered_type_and_bytes_snapshots(dsn: str) -> None:
    registry = SerializerRegistry()
    registry.register(CartState)
    with Journal.open(dsn, serializers=registry) as journal:
        journal.save_snapshot(PID, 1, CartState(["x"], 7))
        journal.save_snapshot("Blob|1", 1, b"\x00\xffraw")
        assert journal.load_snapshot(PID).snapshot == CartState(["x"], 7)
        assert journal.load_snapshot("Blob|1").snapshot == b"\x00\xffraw"


def test_criteria_max_seq_nr(journal: Journal) -> None:
    journal.append(PID, list(range(6)))
    journal.save_snapshot(PID, 4, "at 4")
    assert journal.load_snapshot(PID, max_seq_nr=4).snapshot == "at 4"
    assert journal.load_snapshot(PID, max_seq_nr=10).snapshot == "at 4"
    assert journal.load_snapshot(PID, max_seq_nr=3) is None
    assert journal.load_snapshot(PID, max_seq_nr=0) is None


def test_criteria_max_timestamp(journal: Journal) -> None:
    (event,) = journal.append(PID, ["a"])
    journal.save_snapshot(PID, 1, "at 1")
    ts = event.db_timestamp
    assert journal.load_snapshot(PID, max_timestamp=ts).snapshot == "at 1"
    assert journal.load_snapshot(PID, max_timestamp=ts + timedelta(days=1)).snapshot == "at 1"
    assert journal.load_snapshot(PID, max_timestamp=ts - timedelta(microseconds=1)) is None
    assert journal.load_snapshot(PID, max_seq_nr=1, max_timestamp=ts).snapshot == "at 1"
    assert journal.load_snapshot(PID, max_seq_nr=0, max_timestamp=ts) is None


def test_snapshot_without_its_event_still_meets_a_later_max_timestamp(journal: Journal) -> None:
    """A snapshot may be saved at a seq nr whose event is not in this journal (deleted, imported...)."""
    journal.save_snapshot(PID, 9, "orphan")
    snap = journal.load_snapshot(PID)
    assert snap is not None and snap.db_timestamp is None
    assert journal.load_snapshot(PID, max_timestamp=datetime.now(UTC) + timedelta(hours=1)).snapshot == "orphan"
    assert journal.load_snapshot(PID, max_timestamp=datetime.now(UTC) - timedelta(hours=1)) is None


def test_an_older_snapshot_never_replaces_a_newer_one(journal: Journal, dsn: str) -> None:
    journal.append(PID, list(range(10)))
    journal.save_snapshot(PID, 5, "at 5")
    journal.save_snapshot(PID, 3, "at 3")
    assert (journal.load_snapshot(PID).seq_nr, journal.load_snapshot(PID).snapshot) == (5, "at 5")
    journal.save_snapshot(PID, 5, "at 5, again")  # same seq nr: replaced
    assert journal.load_snapshot(PID).snapshot == "at 5, again"
    journal.save_snapshot(PID, 8, "at 8", metadata={"m": 1})
    assert (journal.load_snapshot(PID).seq_nr, journal.load_snapshot(PID).metadata) == (8, {"m": 1})
    journal.save_snapshot(PID, 7, "at 7")
    assert journal.load_snapshot(PID).snapshot == "at 8"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM snapshot").fetchone() == (1,)


def test_delete_snapshot(journal: Journal) -> None:
    journal.save_snapshot(PID, 1, "s")
    journal.save_snapshot("Cart|2", 1, "other")
    journal.delete_snapshot(PID)
    assert journal.load_snapshot(PID) is None
    assert journal.load_snapshot("Cart|2").snapshot == "other"
    journal.delete_snapshot(PID)  # deleting nothing is fine
    journal.save_snapshot(PID, 1, "after delete")  # an older seq nr may be saved after a delete
    assert journal.load_snapshot(PID).snapshot == "after delete"


def test_snapshot_bad_input(journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="seq_nr must be an integer from 1"):
        journal.save_snapshot(PID, 0, "s")
    with pytest.raises(InvalidPersistenceId, match="must not be empty"):
        journal.save_snapshot("", 1, "s")
    with pytest.raises(InvalidArgument, match="max_seq_nr"):
        journal.load_snapshot(PID, max_seq_nr=-1)
    assert journal.load_snapshot(PID) is None
    with pytest.raises(InvalidArgument, match="max_timestamp must be a timezone-aware datetime"):
        journal.load_snapshot(PID, max_timestamp=datetime(2026, 1, 1))  # naive on purpose
