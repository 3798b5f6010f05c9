"""Snapshots: one per persistence id, never replaced by an older one, loaded by criteria. Every test runs on
both faces (``face``: ``Journal`` and ``AsyncJournal``'s save/load/delete_snapshot, see tests/support/faces.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support.faces import Face, Kind, open_face

from pgjournal import InvalidArgument, InvalidPersistenceId, SerializerRegistry

PID = "Cart|1"


@dataclass
class CartState:
    items: list[str]
    total: int


def test_save_and_load(face: Face) -> None:
    written = face.append(PID, ["a", "b", "c"])
    assert face.load_snapshot(PID) is None
    before = datetime.now(UTC)
    face.save_snapshot(PID, 3, {"items": ["a", "b", "c"]}, metadata={"v": 2}, tags=["t1"])
    snap = face.load_snapshot(PID)
    assert snap is not None
    assert (snap.persistence_id, snap.seq_nr, snap.snapshot) == (PID, 3, {"items": ["a", "b", "c"]})
    assert snap.metadata == {"v": 2} and snap.tags == ("t1",)
    assert snap.db_timestamp == written[2].db_timestamp, "db_timestamp is that of the event at seq_nr"
    assert abs(snap.write_timestamp - before.timestamp() * 1000) < 60_000
    assert face.load_snapshot("Cart|2") is None


def test_registered_type_and_bytes_snapshots(face_kind: Kind, dsn: str) -> None:
    registry = SerializerRegistry()
    registry.register(CartState)
    with open_face(face_kind, dsn, serializers=registry) as face:
        face.save_snapshot(PID, 1, CartState(["x"], 7))
        face.save_snapshot("Blob|1", 1, b"\x00\xffraw")
        assert face.load_snapshot(PID).snapshot == CartState(["x"], 7)
        assert face.load_snapshot("Blob|1").snapshot == b"\x00\xffraw"


def test_criteria_max_seq_nr(face: Face) -> None:
    face.append(PID, list(range(6)))
    face.save_snapshot(PID, 4, "at 4")
    assert face.load_snapshot(PID, max_seq_nr=4).snapshot == "at 4"
    assert face.load_snapshot(PID, max_seq_nr=10).snapshot == "at 4"
    assert face.load_snapshot(PID, max_seq_nr=3) is None
    assert face.load_snapshot(PID, max_seq_nr=0) is None


def test_criteria_max_timestamp(face: Face) -> None:
    (event,) = face.append(PID, ["a"])
    face.save_snapshot(PID, 1, "at 1")
    ts = event.db_timestamp
    assert face.load_snapshot(PID, max_timestamp=ts).snapshot == "at 1"
    assert face.load_snapshot(PID, max_timestamp=ts + timedelta(days=1)).snapshot == "at 1"
    assert face.load_snapshot(PID, max_timestamp=ts - timedelta(microseconds=1)) is None
    assert face.load_snapshot(PID, max_seq_nr=1, max_timestamp=ts).snapshot == "at 1"
    assert face.load_snapshot(PID, max_seq_nr=0, max_timestamp=ts) is None


def test_snapshot_without_its_event_still_meets_a_later_max_timestamp(face: Face) -> None:
    """A snapshot may be saved at a seq nr whose event is not in this journal (deleted, imported...)."""
    face.save_snapshot(PID, 9, "orphan")
    snap = face.load_snapshot(PID)
    assert snap is not None and snap.db_timestamp is None
    assert face.load_snapshot(PID, max_timestamp=datetime.now(UTC) + timedelta(hours=1)).snapshot == "orphan"
    assert face.load_snapshot(PID, max_timestamp=datetime.now(UTC) - timedelta(hours=1)) is None


def test_an_older_snapshot_never_replaces_a_newer_one(face: Face, dsn: str) -> None:
    face.append(PID, list(range(10)))
    face.save_snapshot(PID, 5, "at 5")
    face.save_snapshot(PID, 3, "at 3")
    assert (face.load_snapshot(PID).seq_nr, face.load_snapshot(PID).snapshot) == (5, "at 5")
    face.save_snapshot(PID, 5, "at 5, again")  # same seq nr: replaced
    assert face.load_snapshot(PID).snapshot == "at 5, again"
    face.save_snapshot(PID, 8, "at 8", metadata={"m": 1})
    assert (face.load_snapshot(PID).seq_nr, face.load_snapshot(PID).metadata) == (8, {"m": 1})
    face.save_snapshot(PID, 7, "at 7")
    assert face.load_snapshot(PID).snapshot == "at 8"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM snapshot").fetchone() == (1,)


def test_delete_snapshot(face: Face) -> None:
    face.save_snapshot(PID, 1, "s")
    face.save_snapshot("Cart|2", 1, "other")
    face.delete_snapshot(PID)
    assert face.load_snapshot(PID) is None
    assert face.load_snapshot("Cart|2").snapshot == "other"
    face.delete_snapshot(PID)  # deleting nothing is fine
    face.save_snapshot(PID, 1, "after delete")  # an older seq nr may be saved after a delete
    assert face.load_snapshot(PID).snapshot == "after delete"


def test_snapshot_bad_input(face: Face) -> None:
    with pytest.raises(InvalidArgument, match="seq_nr must be an integer from 1"):
        face.save_snapshot(PID, 0, "s")
    with pytest.raises(InvalidPersistenceId, match="must not be empty"):
        face.save_snapshot("", 1, "s")
    with pytest.raises(InvalidArgument, match="max_seq_nr"):
        face.load_snapshot(PID, max_seq_nr=-1)
    assert face.load_snapshot(PID) is None
    with pytest.raises(InvalidArgument, match="max_timestamp must be a timezone-aware datetime"):
        face.load_snapshot(PID, max_timestamp=datetime(2026, 1, 1))  # naive on purpose
