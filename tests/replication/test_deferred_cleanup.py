"""Deferred cleanup (docs/replication.md, section 7): a replica's events are deleted only once every configured
peer's stream from this location has passed them (its offsets, read at the peer with its reader role). A peer that
is behind (its stream stopped) keeps them, reported; once it catches up, cleanup removes them; a peer removed from
the configuration stops holding cleanup back; an event a peer's filter left out does not hold it back; a peer that
does not answer stops the cleanup with a typed error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.eventually import eventually
from support.replication import rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.admin.cleanup import JournalCleanup
from pgjournal.errors import DatabaseUnavailable, InvalidArgument
from pgjournal.model.replication import ReplicationId
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Peer, ReplicatedCleanup, Replicator, location_private
from pgjournal.replication.replicator import PRIVATE_TAG

pytestmark = pytest.mark.postgres_only("three databases, the replicator's advisory locks")

TYPE = "Counter"
PID = ReplicationId(TYPE, "c", "eu").persistence_id
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=5, backoff=0.01)


@pytest.fixture
def locations(dsn: str, roles: Any, shard_databases: Any) -> Iterator[dict[str, tuple[Journal, str]]]:
    """eu (where cleanup runs), us (the test's database with the least-privilege roles; eu reads it as the
    reader) and ap: each journal with the DSN eu reads it by."""
    eu_dsn, ap_dsn = shard_databases(2)
    with contextlib.ExitStack() as stack:
        yield {"eu": (stack.enter_context(Journal.open(eu_dsn, **FAST)), eu_dsn),
               "us": (stack.enter_context(Journal.open(dsn, **FAST)), roles.dsn(dsn, roles.reader)),
               "ap": (stack.enter_context(Journal.open(ap_dsn, **FAST)), ap_dsn)}


def replicate(local: Journal, replica: str, eu: Journal, count: int) -> None:
    """Run ``replica``'s stream from eu until ``replica`` holds ``count`` events of the entity, then stop it."""
    stream = Replicator(local, replica, eu, "eu", TYPE, settings=SETTINGS)
    runner = stream.run_range()
    try:
        eventually(lambda: len(rows_of(local, f"{TYPE}|c|{replica}")) == count, f"{count} events at {replica}")
        # The offsets commit with the events: what the replica holds, its stream's offsets have passed.
    finally:
        runner.stop()
        runner.join(15)
        assert runner.failed is None, runner.failed


def at_eu(eu: Journal) -> list[tuple[int, bool]]:
    with eu.connection() as conn:
        found = conn.execute("SELECT seq_nr, deleted FROM event_journal WHERE persistence_id = %s ORDER BY seq_nr",
                             (PID,)).fetchall()
    return [(int(seq_nr), bool(deleted)) for seq_nr, deleted in found]


def soon() -> datetime:
    return datetime.now().astimezone() + timedelta(minutes=1)


def test_a_peer_behind_keeps_the_events_until_it_catches_up(locations: dict[str, tuple[Journal, str]]) -> None:
    (eu, _), (us, us_reader), (ap, ap_dsn) = locations["eu"], locations["us"], locations["ap"]
    peers = [Peer("us", us_reader), Peer("ap", ap_dsn)]
    rid = ReplicationId(TYPE, "c", "eu")
    for i in range(6):
        write_local(eu, rid, f"eu-{i}")
    eu.append("Other|x", ["not replicated", "by any stream"])  # no stream carries it: nothing holds it
    replicate(us, "us", eu, 6)
    replicate(ap, "ap", eu, 6)
    for i in range(6, 10):
        write_local(eu, rid, f"eu-{i}")
    replicate(us, "us", eu, 10)  # ap's stream stays stopped: ap is behind at 6 of 10

    dry = ReplicatedCleanup(eu, "eu", peers, [TYPE]).events_before(soon())
    assert dry.dry_run and dry.counts.events_deleted == 6 + 1  # 1..6 of eu's, and Other|x's first
    [held] = dry.held_back
    assert (held.persistence_id, held.released, held.events) == (PID, 6, 4)
    assert "'ap' (up to seq_nr 6 of 10)" in held.holder and "'us'" not in held.holder
    assert len(at_eu(eu)) == 10

    report = ReplicatedCleanup(eu, "eu", peers, [TYPE], dry_run=False).events_before(soon())
    assert report.counts.events_deleted == 7
    assert [h.events for h in report.held_back] == [4]
    assert at_eu(eu) == [(7, False), (8, False), (9, False), (10, False)]
    assert "4 event(s) of 'Counter|c|eu' after seq_nr 6 kept: not replicated yet by 'ap'" in str(report.held_back[0])

    replicate(ap, "ap", eu, 10)  # ap catches up
    again = ReplicatedCleanup(eu, "eu", peers, [TYPE], dry_run=False).events_before(soon())
    assert again.held_back == []
    assert again.counts.events_deleted == 3 and again.counts.events_marked == 1
    assert at_eu(eu) == [(10, True)]  # the highest stays as the marker, as any cleanup leaves it


def test_a_peer_removed_from_the_configuration_stops_holding_cleanup_back(
        locations: dict[str, tuple[Journal, str]]) -> None:
    (eu, _), (us, us_reader), (_, ap_dsn) = locations["eu"], locations["us"], locations["ap"]
    rid = ReplicationId(TYPE, "c", "eu")
    for i in range(5):
        write_local(eu, rid, f"eu-{i}")
    replicate(us, "us", eu, 5)
    # ap never ran a stream from eu: it holds everything while it is a peer...
    with_ap = ReplicatedCleanup(eu, "eu", [Peer("us", us_reader), Peer("ap", ap_dsn)], [TYPE], dry_run=False)
    report = with_ap.all_events(TYPE)
    assert report.counts.events_deleted == 0 and report.counts.events_marked == 0
    assert [(h.released, h.events) for h in report.held_back] == [(0, 5)]
    assert len(at_eu(eu)) == 5
    # ...and nothing once it is removed (its streams stopped, the location gone).
    report = ReplicatedCleanup(eu, "eu", [Peer("us", us_reader)], [TYPE], dry_run=False).all_events(TYPE)
    assert report.held_back == []
    assert at_eu(eu) == [(5, True)]


def test_an_event_a_peers_filter_left_out_does_not_hold_cleanup_back(
        locations: dict[str, tuple[Journal, str]]) -> None:
    (eu, _), (ap, ap_dsn) = locations["eu"], locations["ap"]
    rid = ReplicationId(TYPE, "c", "eu")
    write_local(eu, rid, "eu-1")
    write_local(eu, rid, "eu-2")
    write_local(eu, rid, "eu-3 private", [PRIVATE_TAG])
    write_local(eu, rid, "eu-4 private", [PRIVATE_TAG])
    cleanup = ReplicatedCleanup(eu, "eu", [Peer("ap", ap_dsn)], [TYPE], dry_run=False)
    stream = Replicator(ap, "ap", eu, "eu", TYPE, settings=SETTINGS, accept=location_private())
    runner = stream.run_range()
    try:
        # ap holds 2 events, and its stream's offsets pass all 4: nothing is held (waiting for the 2 it left out
        # would be for ever).
        eventually(lambda: stream.stats.filtered == 2 and not cleanup.replicated([PID]),
                   "ap's offsets past the events it left out")
    finally:
        runner.stop()
        runner.join(15)
        assert runner.failed is None, runner.failed
    assert len(rows_of(ap, "Counter|c|ap")) == 2
    report = cleanup.events_before(soon())
    assert report.held_back == []
    assert at_eu(eu) == [(4, True)]


def test_a_peer_that_does_not_answer_stops_the_cleanup_with_a_typed_error(
        locations: dict[str, tuple[Journal, str]]) -> None:
    eu = locations["eu"][0]
    for i in range(3):
        write_local(eu, ReplicationId(TYPE, "c", "eu"), f"eu-{i}")
    unreachable = "postgresql://nobody:secret-pw@127.0.0.1:1/nowhere"
    cleanup = ReplicatedCleanup(eu, "eu", [Peer("ap", unreachable)], [TYPE], dry_run=False, connect_timeout=2)
    with pytest.raises(DatabaseUnavailable, match="peer 'ap'") as raised:
        cleanup.events_before(soon())
    assert "secret-pw" not in str(raised.value)
    assert len(at_eu(eu)) == 3
    # A plain cleanup of the same journal knows nothing of peers.
    assert JournalCleanup(eu).events_before(soon()).held_back == []


def test_the_configuration_is_checked(locations: dict[str, tuple[Journal, str]]) -> None:
    eu = locations["eu"][0]
    with pytest.raises(InvalidArgument, match="this location's replica id"):
        ReplicatedCleanup(eu, "eu", [Peer("eu", "postgresql://x")], [TYPE])
    with pytest.raises(InvalidArgument, match="single string"):
        ReplicatedCleanup(eu, "eu", [], TYPE)
    with pytest.raises(InvalidArgument, match="Peer"):
        ReplicatedCleanup(eu, "eu", ["us=postgresql://x"], [TYPE])  # type: ignore[list-item]
