"""Replication filters (docs/replication.md, section 7): location-private events stay where they were written; a
filtered event advances the stream's offsets (a restarted stream does not read it again), is recorded as seen (a
relay does not bring it either, whatever the relay stream's filter), and the hole it leaves in the origin's
sequence numbers keeps the later events of that origin arriving, in causal order. On both faces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from support.eventually import eventually
from support.replication import rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.replication import Ordering, ReplicationId, VersionVector
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Candidate, Replicator, load_filter, location_private, stream_name
from pgjournal.replication.replicator import PRIVATE_TAG
from pgjournal.store.timestamp_offsets import offsets

pytestmark = pytest.mark.postgres_only("three databases, the replicator's advisory locks")

REPLICAS = ("eu", "us", "ap")
TYPE = "Counter"
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=5, backoff=0.01)
PRIVATE = [PRIVATE_TAG]


@pytest.fixture
def locations(shard_databases: Any) -> Iterator[dict[str, Journal]]:
    dsns = shard_databases(len(REPLICAS))
    with contextlib.ExitStack() as stack:
        yield {r: stack.enter_context(Journal.open(dsn, **FAST)) for r, dsn in zip(REPLICAS, dsns, strict=True)}


def stopped(runners: list[Any]) -> None:
    for r in runners:
        r.stop()
    for r in runners:
        r.join(15)
        assert r.failed is None, r.failed


def keys(journal: Journal, pid: str) -> list[tuple[str, int]]:
    return [(r.meta.origin_replica, r.meta.origin_sequence_nr) for r in rows_of(journal, pid)]


def seen_rows(journal: Journal, pid: str) -> dict[str, int]:
    with journal.connection() as conn:
        return dict(conn.execute("SELECT origin_replica, origin_seq_nr FROM replication_seen "
                                 "WHERE persistence_id = %s", (pid,)).fetchall())


def check_log(journal: Journal, pid: str) -> None:
    """Contiguous, once each, vectors growing, and causal order among the events that are there."""
    log = rows_of(journal, pid)
    assert [r.seq_nr for r in log] == list(range(1, len(log) + 1))
    assert len({(r.meta.origin_replica, r.meta.origin_sequence_nr) for r in log}) == len(log)
    previous = VersionVector()
    for i, row in enumerate(log):
        assert row.meta.version.compare(previous) is Ordering.AFTER
        for later in log[i + 1:]:
            assert later.origin_version.compare(row.origin_version) is not Ordering.BEFORE, (pid, row, later)
        previous = row.meta.version


def test_location_private_events_stay_where_they_were_written_and_their_offsets_advance(
        locations: dict[str, Journal]) -> None:
    journals = locations
    eu, us, ap = (journals[r] for r in REPLICAS)
    x = {r: ReplicationId(TYPE, "x", r).persistence_id for r in REPLICAS}
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "eu-1")
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "eu-2 private", PRIVATE)
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "eu-3")
    write_local(us, ReplicationId(TYPE, "x", "us"), "us-1 private", PRIVATE)
    write_local(us, ReplicationId(TYPE, "x", "us"), "us-2")

    def mesh() -> list[Replicator]:
        return [Replicator(journals[local], local, journals[peer], peer, TYPE, settings=SETTINGS,
                           accept=location_private())
                for local in REPLICAS for peer in REPLICAS if peer != local]

    streams = mesh()
    runners = [s.run_range() for s in streams]
    try:
        # Each location: its own events, and the others' public ones (eu: 3 + 1, us: 2 + 2, ap: 2 + 1).
        eventually(lambda: [len(rows_of(journals[r], x[r])) for r in REPLICAS] == [4, 4, 3], "public events spread")
        eventually(lambda: all(lag_zero(journals[s.local_replica], s) for s in streams),
                   "every stream's offsets past the peer's last event")
    finally:
        stopped(runners)
    assert ("eu", 2) not in keys(us, x["us"]) + keys(ap, x["ap"])
    assert ("us", 1) not in keys(eu, x["eu"]) + keys(ap, x["ap"])
    assert sorted(keys(ap, x["ap"])) == [("eu", 1), ("eu", 3), ("us", 2)]
    for r in REPLICAS:
        check_log(journals[r], x[r])
    # The hole at eu's 2: ap's seen record holds eu's 3 (and 2 was recorded when it was filtered), and ap's vector
    # says it has seen eu up to 3, though eu's 2 is not there.
    assert seen_rows(ap, x["ap"]) == {"eu": 3, "us": 2}
    assert rows_of(ap, x["ap"])[-1].meta.version == VersionVector({"eu": 3, "us": 2})
    assert sum(s.stats.filtered for s in streams) >= 2
    assert sum(s.stats.appended for s in streams) == 6

    # Restarted streams start after the filtered events (their offsets passed them): nothing read is filtered
    # again, and the next event of eu, after the hole, arrives everywhere.
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "eu-4")
    again = mesh()
    runners = [s.run_range() for s in again]
    try:
        eventually(lambda: [len(rows_of(journals[r], x[r])) for r in REPLICAS] == [5, 5, 4], "eu-4 everywhere")
    finally:
        stopped(runners)
    assert sum(s.stats.filtered for s in again) == 0
    for r in REPLICAS:
        check_log(journals[r], x[r])


def lag_zero(journal: Journal, stream: Replicator) -> bool:
    """The stream's stored offset in the slice of the peer's persistence id is at the peer's last event of it."""
    pid = ReplicationId(TYPE, "x", stream.peer_replica).persistence_id
    peer: Journal = stream.processor.source
    with peer.connection() as conn:
        row = conn.execute("SELECT slice, max(db_timestamp) FROM event_journal WHERE persistence_id = %s "
                           "GROUP BY slice", (pid,)).fetchone()
    if row is None:
        return True
    with journal.connection() as conn:
        latest = {r.slice: r.timestamp_offset
                  for r in offsets().latest_per_slice(stream_name(stream.peer_replica, TYPE)).all(conn)}
    return row[0] in latest and latest[row[0]] >= row[1]


def test_a_filtered_event_is_seen_so_a_relay_whose_stream_does_not_filter_never_brings_it(
        locations: dict[str, Journal]) -> None:
    # Two streams into ap with different filters (a rolling restart of ap's workers with a new filter): eu -> ap
    # filters eu's private event, us -> ap does not. us holds it (us does not filter). Filtered first, it is
    # recorded as seen at ap, so the relay through us drops it: the filter's answer is final.
    eu, us, ap = (locations[r] for r in REPLICAS)
    write_local(eu, ReplicationId(TYPE, "y", "eu"), "eu-1 private", PRIVATE)
    eu_us = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS)
    runner = eu_us.run_range()
    try:
        eventually(lambda: len(rows_of(us, "Counter|y|us")) == 1, "eu-1 at us")
    finally:
        stopped([runner])
    eu_ap = Replicator(ap, "ap", eu, "eu", TYPE, settings=SETTINGS, accept=location_private())
    runner = eu_ap.run_range()
    try:
        eventually(lambda: seen_rows(ap, "Counter|y|ap") == {"eu": 1}, "eu-1 filtered at ap, recorded as seen")
    finally:
        stopped([runner])
    assert seen_rows(ap, "Counter|y|ap") == {"eu": 1}
    us_ap = Replicator(ap, "ap", us, "us", TYPE, settings=SETTINGS)
    runner = us_ap.run_range()
    try:
        eventually(lambda: us_ap.stats.seen == 1, "eu-1 relayed by us, dropped as seen at ap")
    finally:
        stopped([runner])
    assert rows_of(ap, "Counter|y|ap") == []
    assert us_ap.stats.appended == 0


def test_the_relay_of_a_filtered_origin_keeps_causal_order_across_the_hole(locations: dict[str, Journal]) -> None:
    # eu writes e1, e2 (private), e3; us holds them all and writes u1 after them (its vector covers e1..e3);
    # ap filters e2 and reads us first, then eu: e1, e3, u1 in that order at ap, eu's copies dropped as seen.
    eu, us, ap = (locations[r] for r in REPLICAS)
    write_local(eu, ReplicationId(TYPE, "z", "eu"), "e1")
    write_local(eu, ReplicationId(TYPE, "z", "eu"), "e2 private", PRIVATE)
    write_local(eu, ReplicationId(TYPE, "z", "eu"), "e3")
    runner = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS).run_range()
    try:
        eventually(lambda: len(rows_of(us, "Counter|z|us")) == 3, "eu's events at us")
    finally:
        stopped([runner])
    write_local(us, ReplicationId(TYPE, "z", "us"), "u1")
    streams = [Replicator(ap, "ap", us, "us", TYPE, settings=SETTINGS, accept=location_private()),
               Replicator(ap, "ap", eu, "eu", TYPE, settings=SETTINGS, accept=location_private())]
    runner = streams[0].run_range()
    try:
        eventually(lambda: len(rows_of(ap, "Counter|z|ap")) == 3, "through us")
    finally:
        stopped([runner])
    runner = streams[1].run_range()
    try:
        eventually(lambda: streams[1].stats.seen + streams[1].stats.filtered == 3, "eu's copies dropped")
    finally:
        stopped([runner])
    assert keys(ap, "Counter|z|ap") == [("eu", 1), ("eu", 3), ("us", 4)]
    check_log(ap, "Counter|z|ap")
    assert seen_rows(ap, "Counter|z|ap") == {"eu": 3, "us": 4}
    # A local write at ap after the hole: its vector covers everything ap has seen.
    meta = write_local(ap, ReplicationId(TYPE, "z", "ap"), "a1")
    assert meta.version == VersionVector({"ap": 4, "eu": 3, "us": 4})


def test_a_filter_decides_on_the_candidate_and_a_failing_filter_stops_the_batch(
        locations: dict[str, Journal]) -> None:
    eu, us = locations["eu"], locations["us"]
    decided: list[Candidate] = []

    def only_even(candidate: Candidate) -> bool:
        decided.append(candidate)
        return candidate.metadata.origin_sequence_nr % 2 == 0

    for i in range(1, 5):
        write_local(eu, ReplicationId(TYPE, "w", "eu"), f"eu-{i}")
    stream = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS, accept=only_even)
    runner = stream.run_range()
    try:
        eventually(lambda: keys(us, "Counter|w|us") == [("eu", 2), ("eu", 4)] and stream.stats.filtered == 2,
                   "evens in, odds out")
    finally:
        stopped([runner])
    assert keys(us, "Counter|w|us") == [("eu", 2), ("eu", 4)]
    first = decided[0]
    assert (first.peer, first.local, first.origin_replica, first.entity_type, first.entity_id) == (
        "eu", "us", "eu", TYPE, "w")
    with pytest.raises(InvalidArgument, match="accept"):
        Replicator(us, "us", eu, "eu", TYPE, accept="private")  # type: ignore[arg-type]


def test_load_filter_names_what_it_cannot_load() -> None:
    accept = load_filter("pgjournal.replication:location_private")
    assert accept.__qualname__ == f"location_private({PRIVATE_TAG!r})"
    with pytest.raises(ConfigurationError, match="module:attribute, got 'nocolon'"):
        load_filter("nocolon")
    with pytest.raises(ConfigurationError, match="cannot load the replication filter 'pgjournal:nothing_here'"):
        load_filter("pgjournal:nothing_here")
    with pytest.raises(ConfigurationError, match="not callable"):
        load_filter("pgjournal.replication.replicator:PRIVATE_TAG")
    from typer.testing import CliRunner

    from pgjournal.cli.commands import app

    result = CliRunner().invoke(app, ["replication", "run", "--dsn", "postgresql://nobody@127.0.0.1:1/x",
                                      "--replica", "eu", "--peer", "us=postgresql://nobody@127.0.0.1:1/y",
                                      "-e", TYPE, "--filter", "pgjournal:nothing_here"])
    assert result.exit_code != 0
    assert "nothing_here" in result.output


async def test_the_asyncio_face_filters_the_same(shard_databases: Any) -> None:
    import asyncio

    from pgjournal.aio import AsyncJournal

    dsns = dict(zip(("eu", "us"), shard_databases(2), strict=True))
    with Journal.open(dsns["eu"], **FAST) as eu_blocking, Journal.open(dsns["us"], **FAST) as us_blocking:
        write_local(eu_blocking, ReplicationId(TYPE, "a", "eu"), "eu-1")
        write_local(eu_blocking, ReplicationId(TYPE, "a", "eu"), "eu-2 private", PRIVATE)
        write_local(eu_blocking, ReplicationId(TYPE, "a", "eu"), "eu-3")
        async with AsyncJournal.open(dsns["eu"], **FAST) as eu, AsyncJournal.open(dsns["us"], **FAST) as us:
            stream = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS, accept=location_private())
            runner = stream.arun_range()
            try:
                for _ in range(600):
                    if seen_rows(us_blocking, "Counter|a|us") == {"eu": 3} and stream.stats.filtered == 1:
                        break
                    await asyncio.sleep(0.05)
            finally:
                runner.stop()
                await runner.join(15)
                assert runner.failed is None, runner.failed
        assert keys(us_blocking, "Counter|a|us") == [("eu", 1), ("eu", 3)]
        assert seen_rows(us_blocking, "Counter|a|us") == {"eu": 3}


def test_a_worker_runs_its_streams_with_the_filter_it_loaded_and_only_its_entity_types(
        shard_databases: Any) -> None:
    import threading

    from pgjournal.replication import Peer, run_replication

    eu_dsn, us_dsn = shard_databases(2)
    with Journal.open(eu_dsn, **FAST) as eu, Journal.open(us_dsn, **FAST) as us:
        write_local(eu, ReplicationId(TYPE, "v", "eu"), "eu-1")
        write_local(eu, ReplicationId(TYPE, "v", "eu"), "eu-2 private", PRIVATE)
        write_local(eu, ReplicationId("Other", "v", "eu"), "no stream for its type")
        write_local(eu, ReplicationId(TYPE, "v", "eu"), "eu-3")
        stop = threading.Event()
        codes: list[int] = []
        worker = threading.Thread(target=lambda: codes.append(run_replication(
            us_dsn, "us", [Peer("eu", eu_dsn)], [TYPE], stop=stop, lease_duration=2, journal_settings=FAST,
            accept=load_filter("pgjournal.replication:location_private"))))
        worker.start()
        try:
            eventually(lambda: len(rows_of(us, "Counter|v|us")) == 2, "eu's public events at us", timeout=60)
        finally:
            stop.set()
            worker.join(60)
        assert codes == [0]
        assert keys(us, "Counter|v|us") == [("eu", 1), ("eu", 3)]
        assert rows_of(us, "Other|v|us") == []
