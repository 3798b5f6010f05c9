"""events_by_slices: order, offsets, dedup, gap filling, live delivery, in default and portable mode, on both faces."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, timedelta
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.faces import Face, Kind, open_face

from pgjournal import (
    ConfigurationError,
    InvalidArgument,
    NoOffset,
    SerializationError,
    Source,
    TimestampOffset,
    slice_for_persistence_id,
)
from pgjournal.model.envelope import EventEnvelope
from pgjournal.query.gate import Gate
from pgjournal.store.events import insert_sql


def keys(envelopes) -> list[tuple[str, int]]:
    return [(e.persistence_id, e.seq_nr) for e in envelopes]


def test_current_delivers_all_in_timestamp_order(mode_face: Face) -> None:
    for i in range(40):
        mode_face.append(f"Cart|{i % 9}", [{"n": i}, {"n": i, "second": True}])
    mode_face.append("Other|1", [{"x": 1}])
    time.sleep(0.15)  # past behind_current_time in portable mode
    envelopes = list(mode_face.query.current_events_by_slices("Cart", 0, 1023))
    assert len(envelopes) == 80
    assert all(e.entity_type == "Cart" for e in envelopes)
    order = [(e.db_timestamp, e.seq_nr) for e in envelopes]
    assert order == sorted(order)
    per_pid: dict[str, list[int]] = {}
    for e in envelopes:
        per_pid.setdefault(e.persistence_id, []).append(e.seq_nr)
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in per_pid.values())


def test_every_event_passes_the_one_gate_on_both_faces(face: Face, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page loop asks the ordering/dedup gate (query/gate.py) about every row, on either face: no copy of
    its rule of its own."""
    taken: list[tuple[str, int]] = []
    take_next = Gate.take_next

    def counted(gate: Gate[Any], pid: str, seq_nr: int, stamp: Any) -> bool:
        taken.append((pid, seq_nr))
        return take_next(gate, pid, seq_nr, stamp)

    monkeypatch.setattr(Gate, "take_next", counted)
    for i in range(9):
        face.append(f"Cart|{i % 3}", [{"n": i}])
    envelopes = eventually(lambda: [*face.query.current_events_by_slices("Cart", 0, 1023)][8:] and
                           list(face.query.current_events_by_slices("Cart", 0, 1023)))
    assert len(envelopes) == 9 and set(taken) == set(keys(envelopes))


def test_slice_ranges_partition_the_stream(mode_face: Face) -> None:
    for i in range(60):
        mode_face.append(f"Cart|{i}", [{"n": i}])
    time.sleep(0.15)
    whole = set(keys(mode_face.query.current_events_by_slices("Cart", 0, 1023)))
    parts = [keys(mode_face.query.current_events_by_slices("Cart", lo, hi))
             for lo, hi in [(0, 255), (256, 511), (512, 767), (768, 1023)]]
    assert sorted(k for part in parts for k in part) == sorted(whole)
    for (lo, hi), part in zip([(0, 255), (256, 511), (512, 767), (768, 1023)], parts, strict=True):
        assert all(lo <= slice_for_persistence_id(pid) <= hi for pid, _ in part)


@pytest.mark.parametrize("cut", [0, 1, 5, 17, 29])
def test_resume_from_any_offset_continues_exactly_after(face: Face, cut: int) -> None:
    # Several events share one timestamp: a batch of 3 per persistence id.
    for i in range(10):
        face.append(f"Cart|{i}", [{"a": i}, {"b": i}, {"c": i}])
    time.sleep(0.05)
    everything = list(face.query.current_events_by_slices("Cart", 0, 1023))
    assert len(everything) == 30
    offset = TimestampOffset.parse(str(everything[cut].offset))  # through the string form
    rest = list(face.query.current_events_by_slices("Cart", 0, 1023, offset))
    assert keys(rest) == keys(everything[cut + 1:])


def test_more_events_at_one_timestamp_than_the_buffer(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, **{**FAST, "buffer_size": 4}) as journal:
        journal.append("Cart|big", [{"n": n} for n in range(25)])  # 25 events, one timestamp
        journal.append("Cart|small", [{"n": 1}])
        time.sleep(0.05)
        envelopes = list(journal.query.current_events_by_slices("Cart", 0, 1023))
        assert keys(envelopes) == [("Cart|big", n) for n in range(1, 26)] + [("Cart|small", 1)]
        resumed = list(journal.query.current_events_by_slices("Cart", 0, 1023, envelopes[10].offset))
        assert keys(resumed) == keys(envelopes[11:])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
def test_pages_may_end_among_events_sharing_timestamp_and_number(face_kind: Kind, dsn: str, portable: bool) -> None:
    """30 persistence ids' first events share one timestamp and number (writers in one microsecond, imported
    data), in no particular order: pages of 4 end among them. Each is delivered once (portable: the backtracking
    pass pages through them too, and must get past them); a query resumed from any of them delivers the rest."""
    options = {**FAST, "buffer_size": 4, "catchup_buffer_size": 4}
    with open_face(face_kind, dsn, portable=portable, **options) as journal:
        pids = [f"Cart|tie{i}" for i in range(30)]
        for pid in pids:
            journal.append(pid, [{"n": 1}])
        journal.append("Cart|after", [{"n": 1}])
        with psycopg.connect(dsn) as conn:
            conn.execute("UPDATE event_journal SET db_timestamp = date_trunc('second', now()) - interval '5 seconds' "
                         "WHERE persistence_id = ANY(%s)", (pids,))
        time.sleep(0.15)  # past behind_current_time in portable mode
        envelopes = list(journal.query.current_events_by_slices("Cart", 0, 1023))
        assert sorted(keys(envelopes[:30])) == [(p, 1) for p in sorted(pids)]
        assert keys(envelopes[30:]) == [("Cart|after", 1)]
        for cut in (0, 3, 4, 17, 29):
            resumed = list(journal.query.current_events_by_slices("Cart", 0, 1023, envelopes[cut].offset))
            assert sorted(keys(resumed)) == sorted(keys(envelopes[cut + 1:]))


def test_deleted_events_are_skipped(face: Face) -> None:
    face.append("Cart|1", [{"n": n} for n in range(5)])
    face.delete_events("Cart|1", 3)
    time.sleep(0.05)
    assert keys(face.query.current_events_by_slices("Cart", 0, 1023)) == [("Cart|1", 4), ("Cart|1", 5)]


def _held_open_append(dsn: str, pid: str, expected: int, started: threading.Event, release: threading.Event
                      ) -> None:
    """Append one event in a transaction that stays open until ``release``: its db_timestamp is the
    transaction start, so it commits 'in the past'."""
    slice_ = slice_for_persistence_id(pid)
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # the transaction (and its timestamp) starts here
        started.set()
        release.wait(10)
        table = "event_journal"
        conn.execute(insert_sql(table, after_latest=False, single=True), {
            "slice": slice_, "entity_type": pid.split("|")[0], "pid": pid, "writer": "held", "tags": None,
            "expected": expected, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
            "ser_id": 31, "manifest": "", "payload": b'{"late": true}'})
        conn.commit()


def test_late_commit_is_delivered_once_and_in_order(mode_face: Face, dsn: str) -> None:
    """A transaction holds event 1 of Cart|late open while newer events commit; once it commits, the
    consumer gets it exactly once, and event 2 of the same pid only after it."""
    started, release = threading.Event(), threading.Event()
    writer = threading.Thread(target=_held_open_append, args=(dsn, "Cart|late", 0, started, release))
    writer.start()
    started.wait(5)
    time.sleep(0.05)
    mode_face.append("Cart|early", [{"n": 1}])
    got: list = []
    with mode_face.query.events_by_slices("Cart", 0, 1023) as live:
        reader = threading.Thread(target=lambda: [got.append(e) for e in live])
        reader.start()
        time.sleep(0.6)
        release.set()
        writer.join()
        mode_face.append("Cart|late", [{"n": 2}], expected_seq_nr=1)
        deadline = time.time() + 15
        while time.time() < deadline and len(got) < 3:
            time.sleep(0.05)
    reader.join(5)
    assert sorted(keys(got)) == [("Cart|early", 1), ("Cart|late", 1), ("Cart|late", 2)]
    late = [e.seq_nr for e in got if e.persistence_id == "Cart|late"]
    assert late == [1, 2]


def test_live_query_wakes_on_signal(face_kind: Kind, dsn: str) -> None:
    """With a 60 s refresh interval only a writer's signal can deliver the event within the wait."""
    with open_face(face_kind, dsn, **{**FAST, "refresh_interval": 60.0}) as journal:
        assert journal.settings.uses_notifications
        got: list = []
        with journal.query.events_by_slices("Cart", 0, 1023) as live:
            reader = threading.Thread(target=lambda: [got.append(e) for e in live])
            reader.start()
            time.sleep(0.5)
            journal.append("Cart|1", [{"n": 1}])
            deadline = time.time() + 20
            while not got and time.time() < deadline:
                time.sleep(0.01)
        reader.join(5)
    assert keys(got) == [("Cart|1", 1)]
    assert got[0].source == Source.NOTIFIED


@pytest.mark.floor
def test_live_delivers_later_appends_once_in_order(face: Face) -> None:
    face.append("Cart|1", [1, 2])
    with face.query.events_by_slices("Cart", 0, 1023) as live:
        events = iter(live)
        assert [next(events).seq_nr for _ in range(2)] == [1, 2]
        face.append("Cart|1", [3])
        face.append("Cart|2", ["a"])
        assert sorted(keys(next(events) for _ in range(2))) == [("Cart|1", 3), ("Cart|2", 1)]
    assert live.closed


def test_close_stops_the_iterator_from_another_thread(face: Face) -> None:
    live = face.query.events_by_slices("Cart", 0, 1023)
    finished = threading.Event()
    threading.Thread(target=lambda: (list(live), finished.set()), daemon=True).start()
    time.sleep(0.3)
    live.close()
    assert finished.wait(3)


def test_portable_mode_uses_no_postgres_only_feature(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, portable=True, **FAST) as journal:
        assert journal.signals is None
        assert not journal.capabilities.writer_horizon


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("Cart", 10, 5), "greater than max_slice"),
        (("Cart", -1, 5), "min_slice"),
        (("Cart", 0, 1024), "max_slice"),
        (("Cart", "0", 5), "min_slice"),
        (("", 0, 5), None),
    ],
)
def test_bad_slice_arguments(face: Face, args: tuple, message: str | None) -> None:
    if message is None:
        list(face.query.current_events_by_slices(*args))  # empty entity type is a valid (empty) type
        return
    with pytest.raises(InvalidArgument, match=message):
        list(face.query.current_events_by_slices(*args))


def test_bad_offsets(face: Face) -> None:
    for text in ["{", '{"ts": 5}', "yesterday", '{"ts":"2026-01-01T00:00:00Z","seen":{"a":0}}']:
        with pytest.raises(InvalidArgument):
            TimestampOffset.parse(text)
    with pytest.raises(InvalidArgument):
        list(face.query.current_events_by_slices("Cart", 0, 1, offset="not an offset"))  # type: ignore[arg-type]


def test_negative_buffer_size_is_rejected(face_kind: Kind, dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="buffer_size"), open_face(face_kind, dsn, buffer_size=-1):
        pass


def test_offset_lag_fields(face: Face) -> None:
    face.append("Cart|1", [{"n": 1}])
    time.sleep(0.05)
    (envelope,) = face.query.current_events_by_slices("Cart", 0, 1023, NoOffset)
    assert envelope.offset.read_timestamp is not None
    assert envelope.offset.read_timestamp - envelope.offset.timestamp >= timedelta(0)


@dataclasses.dataclass(frozen=True)
class Added:
    item: str


def test_catch_up_decodes_each_payload_as_deserialize_does(face: Face, dsn: str) -> None:
    """The catch-up's plain-JSON shortcut gives what ``deserialize`` gives: plain JSON as data, a registered type
    as its class, other payloads through their own path; a payload that does not decode raises deserialize's
    error naming the row; the envelopes compare and replace like any other."""
    face.serializers.register(Added, "cart.added")
    face.append("Cart|1", [{"n": 1}, Added("sku-1"), 7, "text", b"\x00raw", {"é": "ü"}, [1, 2], None])
    time.sleep(0.05)
    envelopes = list(face.query.current_events_by_slices("Cart", 0, 1023))
    assert [e.event for e in envelopes] == [{"n": 1}, Added("sku-1"), 7, "text", b"\x00raw", {"é": "ü"}, [1, 2],
                                            None]
    made = [EventEnvelope(*(getattr(e, f.name) for f in dataclasses.fields(e))) for e in envelopes]
    assert envelopes == made and made == envelopes and all(type(e) is EventEnvelope for e in envelopes)
    assert dataclasses.replace(envelopes[0], seq_nr=99).seq_nr == 99
    with pytest.raises(dataclasses.FrozenInstanceError):
        envelopes[0].seq_nr = 5  # type: ignore[misc]
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE event_journal SET event_payload = %s WHERE persistence_id = 'Cart|1' AND seq_nr = 2",
                     (b'{"n": \xff',))
        conn.execute("UPDATE event_journal SET event_payload = %s, event_ser_manifest = '' WHERE "
                     "persistence_id = 'Cart|1' AND seq_nr = 3", (b'{"n": 1} trailing',))
    read = face.query.current_events_by_slices("Cart", 0, 1023)
    assert next(read).event == {"n": 1}
    with pytest.raises(SerializationError, match=r"'Cart\|1'.* 2"):
        next(read)
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE event_journal SET event_payload = '{\"item\": \"sku-2\"}'::bytea WHERE "
                     "persistence_id = 'Cart|1' AND seq_nr = 2")
    read = face.query.current_events_by_slices("Cart", 0, 1023)
    assert [next(read).event for _ in range(2)] == [{"n": 1}, Added("sku-2")]
    with pytest.raises(SerializationError, match=r"'Cart\|1'.* 3"):
        next(read)


def test_envelopes_carry_utc_timestamps_whatever_the_session_time_zone(face_kind: Kind, dsn: str) -> None:
    """A by-slice page's timestamps are made in UTC (psycopg would make them in the session's zone, at a cost per
    row), the events a gap fill loads too: the instants are those stored, every envelope's ``tzinfo`` is UTC."""
    with psycopg.connect(dsn, autocommit=True) as conn:  # every new session of this database in +05:30
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        conn.execute(f'ALTER DATABASE "{name}" SET TimeZone = \'Asia/Kolkata\'')
    with open_face(face_kind, dsn, **FAST) as journal:
        with journal.connection() as conn:
            assert conn.execute("SHOW TimeZone").fetchone()[0] == "Asia/Kolkata"
        for i in range(6):
            journal.append(f"Cart|{i % 3}", [{"n": i}])
        with psycopg.connect(dsn) as conn:  # a hole: Cart|0's first event is older than the query's first page
            conn.execute("UPDATE event_journal SET db_timestamp = db_timestamp + interval '1 hour' "
                         "WHERE persistence_id = 'Cart|0' AND seq_nr = 1")
            stored = dict(((pid, seq), ts) for pid, seq, ts in conn.execute(
                "SELECT persistence_id, seq_nr, db_timestamp FROM event_journal"))
        time.sleep(0.05)
        envelopes = list(journal.query.current_events_by_slices("Cart", 0, 1023))
        assert sorted(keys(envelopes)) == sorted(stored)
        assert Source.BACKTRACKING in {e.source for e in envelopes}
        assert {e.db_timestamp.tzinfo for e in envelopes} == {UTC}
        assert all(e.db_timestamp == stored[e.persistence_id, e.seq_nr] for e in envelopes)
