"""Durable state (Akka's durable_state table): optimistic revisions, deletes, and changes_by_slices with the
by-slice machinery (TimestampOffsets, the visibility horizon, backtracking). Every test runs on both faces
(``face``: ``journal.durable_state`` and ``AsyncJournal.durable_state``, see tests/support/faces.py); what only the
asyncio face has (tasks taking turns) is in test_aio_durable_state.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

import psycopg
import pytest
from support import FAST, waits_on_a_lock
from support.eventually import eventually
from support.faces import Face, Kind, open_face

from pgjournal import (
    ConcurrencyConflict,
    ConfigurationError,
    DurableStateChange,
    InvalidArgument,
    InvalidPersistenceId,
    NoOffset,
    RevisionConflict,
    SerializationError,
    SerializerRegistry,
    Source,
    TimestampOffset,
    slice_for_persistence_id,
)


def readable(face: Face, *written: object) -> None:
    """Wait until the database clock is past the newest of ``written`` (states or envelopes) by the journal's
    read margin: a current query started now reads them (unless a writer holds the horizon back)."""
    newest = max(w.db_timestamp for w in written)  # type: ignore[attr-defined]
    margin = timedelta(seconds=face.read_margin)

    def clock_passed() -> bool:
        with face.connection() as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        return bool(row and row[0] - margin > newest)

    eventually(clock_passed, timeout=5, interval=0.01)


def row_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM durable_state").fetchone()
    assert row is not None
    return row[0]


def test_upsert_get_and_delete_count_revisions(face: Face) -> None:
    store = face.durable_state
    assert store.get("Account|1") is None
    first = store.upsert("Account|1", 1, {"balance": 10}, tag="vip")
    got = store.get("Account|1")
    assert got == first
    assert (got.revision, got.value, got.tags, got.deleted) == (1, {"balance": 10}, ("vip",), False)
    second = store.upsert("Account|1", 2, {"balance": 15})
    assert second.db_timestamp > first.db_timestamp
    assert store.get("Account|1") == second and second.tags == ()
    deleted = store.delete("Account|1", 3)
    got = store.get("Account|1")
    assert got == deleted and (got.revision, got.value, got.deleted) == (3, None, True)
    again = store.upsert("Account|1", 4, "reopened")
    assert store.get("Account|1") == again and not again.deleted
    assert store.delete("Account|2", 1).deleted  # a deletion may be the first revision, as in Akka


def test_stale_or_skipped_revisions_are_typed_conflicts_that_write_nothing(face: Face, dsn: str) -> None:
    store = face.durable_state
    store.upsert("Account|1", 1, "a")
    store.upsert("Account|1", 2, "b")
    for revision in (1, 2, 4):
        with pytest.raises(RevisionConflict) as caught:
            store.upsert("Account|1", revision, "stale")
        error = caught.value
        assert isinstance(error, ConcurrencyConflict)
        assert (error.persistence_id, error.revision, error.expected_revision, error.actual_revision) == (
            "Account|1", revision, revision - 1, 2)
        assert str(error) == (f"revision {revision} of the durable state of persistence id 'Account|1' could not be "
                              f"written: expected the current revision to be {revision - 1} but it is 2; nothing "
                              "was written")
    with pytest.raises(RevisionConflict, match="expected the current revision to be 2 but it is 0") as caught:
        store.upsert("Account|2", 3, "x")  # a new persistence id starts at revision 1
    assert caught.value.actual_revision == 0
    with pytest.raises(RevisionConflict, match="but it is 2"):
        store.delete("Account|1", 2)
    got = store.get("Account|1")
    assert got is not None and (got.revision, got.value) == (2, "b")
    assert row_count(dsn) == 1


@pytest.mark.parametrize("call, error, text", [
    (lambda s: s.upsert("Account|1", 0, "x"), InvalidArgument, "revision must be an integer from 1 .*got 0"),
    (lambda s: s.upsert("Account|1", True, "x"), InvalidArgument, "revision .*got True"),
    (lambda s: s.upsert("Account|1", "1", "x"), InvalidArgument, "revision .*got '1'"),
    (lambda s: s.upsert("", 1, "x"), InvalidPersistenceId, "must not be empty"),
    (lambda s: s.upsert("Account|1", 1, "x", tag="a\x00b"), InvalidArgument, "tag must be"),
    (lambda s: s.upsert("Account|1", 1, {1, 2}), SerializationError, "cannot serialize set"),
    (lambda s: s.delete("Account|1", -1), InvalidArgument, "got -1"),
    (lambda s: s.get(None), InvalidPersistenceId, "got NoneType"),
    (lambda s: list(s.current_changes_by_slices("Account", 5, 2)), InvalidArgument, "slice"),
    (lambda s: list(s.current_changes_by_slices("Account", 0, 1023, offset="yesterday")), InvalidArgument,
     "TimestampOffset"),
])
def test_bad_input_is_refused_and_writes_nothing(face: Face, dsn: str, call, error, text) -> None:
    with pytest.raises(error, match=text):
        call(face.durable_state)
    assert row_count(dsn) == 0


def test_registered_types_round_trip(face_kind: Kind, dsn: str) -> None:
    @dataclass
    class Account:
        owner: str
        balance: int

    registry = SerializerRegistry()
    registry.register(Account, "com.example.Account")
    with open_face(face_kind, dsn, serializers=registry, **FAST) as face:
        readable(face, face.durable_state.upsert("Account|1", 1, Account("ann", 5)))
        got = face.durable_state.get("Account|1")
        assert got is not None and got.value == Account("ann", 5)
        [change] = face.durable_state.current_changes_by_slices("Account", 0, 1023)
        assert change.value == Account("ann", 5)
    with psycopg.connect(dsn) as conn:  # stored as Akka's Jackson JSON would be
        assert conn.execute("SELECT state_ser_id, state_ser_manifest, slice, entity_type FROM durable_state"
                            ).fetchone() == (31, "com.example.Account", slice_for_persistence_id("Account|1"),
                                             "Account")


def test_db_timestamp_never_goes_back_within_a_persistence_id(face: Face, dsn: str) -> None:
    store = face.durable_state
    store.upsert("Account|1", 1, "a")
    with psycopg.connect(dsn, autocommit=True) as conn:  # as if the clock had run back an hour since
        future = conn.execute("UPDATE durable_state SET db_timestamp = now() + interval '1 hour' "
                              "RETURNING db_timestamp").fetchone()[0]
    assert store.upsert("Account|1", 2, "b").db_timestamp == future + timedelta(microseconds=1)


def test_two_writers_racing_for_a_revision(face: Face) -> None:
    """Read-modify-write from several threads: each revision is won by exactly one writer, the others get
    RevisionConflict (never a lost update), and the counter ends at the number of increments."""
    store = face.durable_state
    threads, increments = 4, 15
    conflicts: list[RevisionConflict] = []
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        done = 0
        while done < increments:
            current = store.get("Counter|1")
            revision, value = (current.revision, current.value) if current else (0, 0)
            try:
                store.upsert("Counter|1", revision + 1, value + 1)
                done += 1
            except RevisionConflict as exc:
                conflicts.append(exc)

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(60)
    final = store.get("Counter|1")
    assert final is not None and final.value == final.revision == threads * increments
    assert conflicts, "four writers on one persistence id never collided: the race was not exercised"
    assert all(c.actual_revision is not None and c.actual_revision >= c.expected_revision for c in conflicts)


def test_two_first_writes_race_one_wins(face: Face, dsn: str) -> None:
    """Both try revision 1 of a new persistence id in open transactions: the second waits for the first's
    commit, then fails with RevisionConflict (the unique key), writing nothing."""
    sql = face.durable_state.sql
    with psycopg.connect(dsn) as first:
        assert first.execute(*sql.write("Account|9", 1, 20, "", b"first", None)).fetchone() is not None
        outcome: list[object] = []
        second = threading.Thread(target=lambda: outcome.append(_try(face, "Account|9", "second")))
        second.start()
        eventually(lambda: waits_on_a_lock(dsn), timeout=10)
        first.commit()
        second.join(10)
    assert isinstance(outcome[0], RevisionConflict) and outcome[0].actual_revision == 1
    got = face.durable_state.get("Account|9")
    assert got is not None and got.value == "first"


def _try(face: Face, pid: str, value: str) -> object:
    try:
        return face.durable_state.upsert(pid, 1, value)
    except RevisionConflict as exc:
        return exc


def test_current_changes_deliver_each_persistence_ids_latest_revision(face: Face) -> None:
    store = face.durable_state
    for i in range(6):
        store.upsert(f"Account|{i}", 1, {"v": 1})
    for i in range(3):
        store.upsert(f"Account|{i}", 2, {"v": 2})
    store.delete("Account|5", 2)
    store.upsert("Order|1", 1, "other entity type")
    readable(face, *face.append("Account|0", ["an event is not a state change"]))
    changes = list(store.current_changes_by_slices("Account", 0, 1023))
    assert all(isinstance(c, DurableStateChange) for c in changes)
    latest = {c.persistence_id: (c.revision, c.value, c.deleted) for c in changes}
    assert latest == {"Account|0": (2, {"v": 2}, False), "Account|1": (2, {"v": 2}, False),
                      "Account|2": (2, {"v": 2}, False), "Account|3": (1, {"v": 1}, False),
                      "Account|4": (1, {"v": 1}, False), "Account|5": (2, None, True)}
    assert len(changes) == 6  # one per persistence id: overwritten revisions are gone
    assert [c.db_timestamp for c in changes] == sorted(c.db_timestamp for c in changes)
    # a slice range holds only its own persistence ids
    s = slice_for_persistence_id("Account|3")
    assert {c.persistence_id for c in store.current_changes_by_slices("Account", s, s)} == {
        f"Account|{i}" for i in range(6) if slice_for_persistence_id(f"Account|{i}") == s}


def test_changes_resume_from_an_offset(face: Face) -> None:
    store = face.durable_state
    readable(face, *[store.upsert(f"Account|{i}", 1, 1) for i in range(4)])
    first = list(store.current_changes_by_slices("Account", 0, 1023))
    assert len(first) == 4
    resume = TimestampOffset.parse(str(first[-1].offset))  # as a projection would store it
    assert list(store.current_changes_by_slices("Account", 0, 1023, resume)) == []
    readable(face, store.upsert("Account|1", 2, 2), store.upsert("Account|9", 1, 1))
    later = list(store.current_changes_by_slices("Account", 0, 1023, resume))
    assert [(c.persistence_id, c.revision) for c in later] == [("Account|1", 2), ("Account|9", 1)]
    # from the middle: what lies after the offset of the second change
    middle = list(store.current_changes_by_slices("Account", 0, 1023, first[1].offset))
    assert [(c.persistence_id, c.revision) for c in middle] == [
        (c.persistence_id, c.revision) for c in first[2:] if c.persistence_id != "Account|1"
    ] + [("Account|1", 2), ("Account|9", 1)]


def test_live_changes_under_concurrent_upserts(mode_face: Face) -> None:
    """Writers keep upserting while a live query runs (default: horizon and notifications; portable: clock
    bound and backtracking): each persistence id's revisions arrive in increasing order, none twice, and the
    last revision of every persistence id arrives."""
    store = mode_face.durable_state
    pids = [f"Account|{i}" for i in range(8)]
    revisions = 12
    got: list[DurableStateChange] = []

    with store.changes_by_slices("Account", 0, 1023) as live:
        reader = threading.Thread(target=lambda: got.extend(live), daemon=True)
        reader.start()

        def writer(mine: list[str]) -> None:
            for revision in range(1, revisions + 1):
                for pid in mine:
                    store.upsert(pid, revision, {"pid": pid, "revision": revision})

        writers = [threading.Thread(target=writer, args=(pids[i::3],)) for i in range(3)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(60)

        def every_last_revision_arrived() -> bool:
            return {c.persistence_id for c in list(got) if c.revision == revisions} == set(pids)

        eventually(every_last_revision_arrived, timeout=20)
    reader.join(10)  # closed by the with: its pending read ends (before teardown stops an asyncio face's loop)
    assert not reader.is_alive()
    by_pid: dict[str, list[int]] = {}
    for change in got:
        assert change.value == {"pid": change.persistence_id, "revision": change.revision}
        by_pid.setdefault(change.persistence_id, []).append(change.revision)
    for pid, seen in by_pid.items():
        assert seen == sorted(set(seen)), f"{pid}: revisions out of order or twice: {seen}"


def test_live_changes_restart_from_an_offset(face: Face) -> None:
    store = face.durable_state
    store.upsert("Account|1", 1, "a")
    store.upsert("Account|2", 1, "a")
    got: list[DurableStateChange] = []
    with store.changes_by_slices("Account", 0, 1023) as live:
        for change in live:
            got.append(change)
            if len(got) == 2:
                break
    offset = got[-1].offset
    store.upsert("Account|1", 2, "b")
    store.upsert("Account|3", 1, "a")
    resumed: list[DurableStateChange] = []
    with store.changes_by_slices("Account", 0, 1023, offset) as live:
        for change in live:
            resumed.append(change)
            if len(resumed) == 2:
                break
    assert [(c.persistence_id, c.revision) for c in resumed] == [("Account|1", 2), ("Account|3", 1)]


@pytest.mark.postgres_only("the visibility horizon")
def test_an_open_durable_state_writer_holds_changes_back_but_not_events(face: Face, dsn: str) -> None:
    """The horizon of changes comes from durable_state writers: a change committed after an open writer
    started is not read until that writer ends (else the cursor would pass the writer's earlier
    timestamp). Event readers are not held back by it."""
    store = face.durable_state
    with psycopg.connect(dsn) as held:
        assert held.execute(*store.sql.write("Account|A", 1, 20, "", b"held", None)).fetchone() is not None
        readable(face, store.upsert("Account|B", 1, "committed later"), *face.append("Account|B", ["an event"]))
        assert list(store.current_changes_by_slices("Account", 0, 1023)) == []
        assert [e.event for e in face.query.current_events_by_slices("Account", 0, 1023)] == ["an event"]
        held.commit()
    readable(face, store.get("Account|B"))
    changes = list(store.current_changes_by_slices("Account", 0, 1023, NoOffset))
    assert [(c.persistence_id, c.value) for c in changes] == [("Account|A", "held"), ("Account|B", "committed later")]


def test_roles_writer_writes_state_and_reader_only_reads(face_kind: Kind, dsn: str, roles) -> None:
    with open_face(face_kind, roles.dsn(dsn, roles.writer), **FAST) as writer:
        state = writer.durable_state.upsert("Account|1", 1, "by the writer role")
        writer.durable_state.upsert("Account|1", 2, "again")
    with open_face(face_kind, roles.dsn(dsn, roles.reader), **FAST) as reader:
        readable(reader, state)
        assert [c.value for c in reader.durable_state.current_changes_by_slices("Account", 0, 1023)] == ["again"]
        with pytest.raises(ConfigurationError, match=r"refused by the database: SQLSTATE 42501.*nothing was written"):
            reader.durable_state.upsert("Account|1", 3, "by the reader role")
    with open_face(face_kind, dsn, **FAST) as face:
        got = face.durable_state.get("Account|1")
        assert got is not None and (got.revision, got.value) == (2, "again")


AKKA_DDL = """
CREATE TABLE durable_state (
  slice INT NOT NULL, entity_type VARCHAR(255) NOT NULL, persistence_id VARCHAR(255) NOT NULL,
  revision BIGINT NOT NULL, db_timestamp timestamp with time zone NOT NULL,
  state_ser_id INTEGER NOT NULL, state_ser_manifest VARCHAR(255), state_payload BYTEA NOT NULL, tags TEXT ARRAY,
  PRIMARY KEY(persistence_id, revision));
CREATE INDEX durable_state_slice_idx ON durable_state(slice, entity_type, db_timestamp, revision)"""


def test_a_table_created_with_akkas_ddl_works_the_same(face_kind: Kind, dsn: str) -> None:
    """Akka keys durable_state (persistence_id, revision): the statements never rely on a key of
    persistence_id alone, so a first write still cannot make a second row and conflicts are the same."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE durable_state")
        conn.execute(AKKA_DDL)
    with open_face(face_kind, dsn, **FAST) as face:
        store = face.durable_state
        store.upsert("Account|1", 1, "a")
        store.upsert("Account|1", 2, "b")
        with pytest.raises(RevisionConflict, match="but it is 2"):
            store.upsert("Account|1", 1, "a second row?")
        with pytest.raises(RevisionConflict, match="but it is 2"):
            store.upsert("Account|1", 2, "stale")
        readable(face, store.delete("Account|1", 3))
        assert [(c.revision, c.deleted) for c in store.current_changes_by_slices("Account", 0, 1023)] == [(3, True)]
    assert row_count(dsn) == 1


def test_a_deleted_state_written_by_akka_reads_as_deleted(face: Face, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # Akka's delete marker: ser_id 0, manifest '', no bytes
        conn.execute("INSERT INTO durable_state (slice, entity_type, persistence_id, revision, db_timestamp, "
                     "state_ser_id, state_ser_manifest, state_payload) VALUES (%s, 'Account', 'Account|1', 4, now(), "
                     "0, '', ''::bytea)", (slice_for_persistence_id("Account|1"),))
    got = face.durable_state.get("Account|1")
    assert got is not None and (got.revision, got.value, got.deleted) == (4, None, True)
    assert face.durable_state.upsert("Account|1", 5, "back").revision == 5


def test_a_late_commit_reaches_live_changes(mode_face: Face, dsn: str) -> None:
    """A durable-state transaction stamps its row, then commits after a later write: by default the horizon
    holds the later one back until it commits (delivered in time order); in portable mode the main cursor
    passes it and backtracking delivers it afterwards. Either way each once."""
    store = mode_face.durable_state
    portable = mode_face.settings.portable
    got: list[DurableStateChange] = []
    with store.changes_by_slices("Account", 0, 1023) as live:
        reader = threading.Thread(target=lambda: got.extend(live), daemon=True)
        reader.start()
        with psycopg.connect(dsn) as held:
            # A late writer that does commit: under SERIALIZABLE (PGJOURNAL_TEST_PORTABLE=1) this stand-in could
            # be cancelled as a pivot between the reader and the upsert, and there would be no late commit.
            held.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            assert held.execute(*store.sql.write("Account|A", 1, 20, "", b"late", None)).fetchone() is not None
            store.upsert("Account|B", 1, "on time")
            if portable:
                eventually(lambda: [c.persistence_id for c in got] == ["Account|B"], timeout=10)
            else:
                readable(mode_face, store.get("Account|B"))
                assert got == []  # held back by the open writer, not by the clock
            held.commit()
        eventually(lambda: len(got) == 2, timeout=15)
    reader.join(10)  # closed by the with: its pending read ends (before teardown stops an asyncio face's loop)
    assert not reader.is_alive()
    assert [c.persistence_id for c in got] == (["Account|B", "Account|A"] if portable else ["Account|A", "Account|B"])
    late = next(c for c in got if c.persistence_id == "Account|A")
    assert late.value == "late"
    assert late.source in ({Source.BACKTRACKING} if portable else {Source.QUERY, Source.NOTIFIED})
