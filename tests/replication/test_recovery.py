"""Disaster recovery (docs/replication.md, section 8): a location restored from an old backup has lost the tail of
its replicas, which its peers hold. Until its recovery ends its writes and the streams into it are refused; the
recovery, stopped half-way and run again, gives it back its own events at their own sequence numbers with their
own vectors; then streams resume and every check of section 5 holds."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.eventually import eventually
from support.replication import check_replicas, rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.entity import ReplicatedEntity, ReplicatedRepository, persist
from pgjournal.errors import DatabaseUnavailable, InvalidArgument, LocationRecovering, ProjectionFailed
from pgjournal.model.replication import ReplicationId
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator
from pgjournal.replication.recovery import arecover, mark_recovering_step, recover, recovering
from pgjournal.store import replication as sql

pytestmark = pytest.mark.postgres_only("databases copied as templates, the replicator's advisory locks")

REPLICAS = ("eu", "us", "ap")
TYPE = "Counter"
ENTITIES = ("c1", "c2", "c3")
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=3, backoff=0.01)


class Counter(ReplicatedEntity[int]):
    name = TYPE
    replicas = REPLICAS
    initial_state = 0

    def handle(self, state: int, command: Any, context: Any) -> Any:
        return persist(command, reply="ok")

    def apply(self, state: int, event: Any, context: Any) -> int:
        return state + 1


class Locations:
    """Three locations as three databases; the journal of each can be closed and its database swapped."""

    def __init__(self, server_dsn: str, dsns: dict[str, str]) -> None:
        self.server_dsn = server_dsn
        self.dsns = dsns
        self.journals: dict[str, Journal] = {r: Journal.open(d, **FAST) for r, d in dsns.items()}

    def close(self) -> None:
        for j in self.journals.values():
            j.close()

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.server_dsn, autocommit=True)

    def name(self, replica: str) -> str:
        return str(psycopg.conninfo.conninfo_to_dict(self.dsns[replica])["dbname"])

    def backup(self, replica: str) -> str:
        """A copy of ``replica``'s database as it is now (its journal closed meanwhile)."""
        copy = f"pgjournal_t_backup_{uuid.uuid4().hex[:8]}"
        self.journals[replica].close()
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{self.name(replica)}"')
        self.journals[replica] = Journal.open(self.dsns[replica], **FAST)
        return copy

    def restore(self, replica: str, copy: str) -> None:
        """``replica``'s database replaced by the backup ``copy``."""
        self.journals[replica].close()
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE "{self.name(replica)}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name(replica)}" TEMPLATE "{copy}"')
            conn.execute(f'DROP DATABASE "{copy}"')
        self.journals[replica] = Journal.open(self.dsns[replica], **FAST)


@pytest.fixture
def places(server_dsn: str, shard_databases: Any) -> Iterator[Locations]:
    dsns = dict(zip(REPLICAS, shard_databases(len(REPLICAS)), strict=True))
    locations = Locations(server_dsn, dsns)
    try:
        yield locations
    finally:
        locations.close()


def streams(journals: dict[str, Journal]) -> list[Any]:
    return [Replicator(journal, local, source, peer, TYPE, settings=SETTINGS).run_range()
            for local, journal in journals.items() for peer, source in journals.items() if peer != local]


def stopped(runners: list[Any]) -> None:
    for r in runners:
        r.stop()
    for r in runners:
        r.join(15)
        assert r.failed is None, r.failed


def write(journals: dict[str, Journal], per_writer: int, tag: str) -> None:
    """Two writers per location at once, over the shared entities."""
    def each(replica: str, journal: Journal, n: int) -> None:
        for i in range(per_writer):
            write_local(journal, ReplicationId(TYPE, ENTITIES[(i + n) % len(ENTITIES)], replica),
                        f"{tag}-{replica}-{n}-{i}")

    threads = [threading.Thread(target=each, args=(r, j, n)) for r, j in journals.items() for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def count(journal: Journal, replica: str) -> int:
    return sum(len(rows_of(journal, ReplicationId(TYPE, e, replica).persistence_id)) for e in ENTITIES)


def replicate_until(journals: dict[str, Journal], total: int) -> None:
    runners = streams(journals)
    try:
        eventually(lambda: all(count(j, r) == total for r, j in journals.items()), f"{total} events everywhere",
                   timeout=120)
    finally:
        stopped(runners)


class CutAfter:
    """A peer's journal whose connection is cut after ``calls`` runs: a recovery stopped half-way."""

    def __init__(self, journal: Journal, calls: int) -> None:
        self.journal, self.calls = journal, calls

    def run(self, step: Any) -> Any:
        self.calls -= 1
        if self.calls < 0:
            step.close()
            raise DatabaseUnavailable("the peer was cut off")
        return self.journal.run(step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.journal, name)


def own_rows(journal: Journal, entity: str) -> list[tuple[int, Any, bytes]]:
    return [(r.seq_nr, r.meta, r.payload) for r in rows_of(journal, ReplicationId(TYPE, entity, "eu").persistence_id)
            if r.meta.origin_replica == "eu"]


def keys(journal: Journal, entity: str) -> set[tuple[str, int]]:
    return {(r.meta.origin_replica, r.meta.origin_sequence_nr)
            for r in rows_of(journal, ReplicationId(TYPE, entity, "eu").persistence_id)}


def test_a_location_restored_from_an_old_backup_recovers_its_events_from_its_peers_before_it_writes(
        places: Locations) -> None:
    from typer.testing import CliRunner

    from pgjournal.cli.commands import app

    journals = places.journals
    write(journals, 8, "before")
    replicate_until(journals, 3 * 2 * 8)
    copy = places.backup("eu")
    write(journals, 8, "after")  # eu writes on past its backup; us and ap receive it all
    replicate_until(journals, 3 * 2 * 16)
    lost = {e: (own_rows(journals["eu"], e), keys(journals["eu"], e), len(rows_of(journals["eu"], f"Counter|{e}|eu")))
            for e in ENTITIES}

    places.restore("eu", copy)  # the disaster: eu is back at its backup; us and ap hold what it lost
    eu = journals["eu"]
    assert all(len(own_rows(eu, e)) < len(lost[e][0]) for e in ENTITIES)

    # A recovery cut off half-way: the first entity is rebuilt, the location stays recovering.
    peers = {"us": journals["us"], "ap": CutAfter(journals["ap"], 3)}
    with pytest.raises(DatabaseUnavailable):
        recover(eu, "eu", peers, [TYPE])  # type: ignore[arg-type]
    assert recovering(eu, "eu")
    assert own_rows(eu, "c1") == lost["c1"][0]
    assert len(own_rows(eu, "c2")) < len(lost["c2"][0])

    # Meanwhile no write here: neither a command of a replicated entity...
    repository = ReplicatedRepository(eu, Counter, replica="eu")
    before = eu.highest_seq_nr("Counter|c2|eu")
    with pytest.raises(LocationRecovering, match=r"replica 'eu' is recovering") as refused:
        repository.handle("c2", "refused")
    assert refused.value.replica == "eu"
    assert eu.highest_seq_nr("Counter|c2|eu") == before
    # ...nor a stream's arrival: its batch is refused until the stream stops, nothing written.
    stream = Replicator(eu, "eu", journals["us"], "us", TYPE, settings=SETTINGS)
    runner = stream.run_range()
    eventually(lambda: runner.failed is not None, "the stream into the recovering location stops")
    runner.join(15)
    assert isinstance(runner.failed, ProjectionFailed)
    assert "recovering" in repr(runner.failed.__cause__) or "recovering" in str(runner.failed)
    assert stream.stats.appended == 0 and eu.highest_seq_nr("Counter|c2|eu") == before

    # Run again (the command): it finishes; the replicas done already are left as they are.
    result = CliRunner().invoke(app, ["replication", "recover", "--dsn", places.dsns["eu"], "--replica", "eu",
                                      "--peer", f"us={places.dsns['us']}", "--peer", f"ap={places.dsns['ap']}",
                                      "-e", TYPE], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Counter|c1|eu" not in result.output and "Counter|c2|eu" in result.output, result.output
    assert not recovering(eu, "eu")
    for e in ENTITIES:
        own, held, length = lost[e]
        assert own_rows(eu, e) == own  # the same sequence numbers, vectors and payloads
        assert keys(eu, e) == held and len(rows_of(eu, f"Counter|{e}|eu")) == length
    assert check_replicas(journals, TYPE, ENTITIES, converged=True) == 3 * 2 * 16

    # Writes are accepted again, and the streams resume: the peers drop what eu sends again.
    assert repository.handle("c2", "accepted").reply == "ok"
    runners = streams(journals)
    try:
        write(journals, 4, "later")
        total = 3 * 2 * 20 + 1
        eventually(lambda: all(count(j, r) == total for r, j in journals.items()), "every event everywhere",
                   timeout=120)
    finally:
        stopped(runners)
    assert check_replicas(journals, TYPE, ENTITIES, converged=True) == total


def test_the_recovery_starts_once_a_write_in_progress_has_ended_and_every_later_write_sees_the_mark(
        places: Locations) -> None:
    eu = places.journals["eu"]
    repository = ReplicatedRepository(eu, Counter, replica="eu")
    repository.handle("w", "first")
    marked = threading.Event()
    # A write of eu in progress: its transaction has read no marker and not committed yet.
    with eu.connection() as conn, conn.transaction():
        check = sql.is_recovering("eu")
        assert conn.execute(check.sql, check.params).fetchone() == (False,)
        marking = threading.Thread(target=lambda: (eu.run(mark_recovering_step("eu", poll=0.01)), marked.set()))
        marking.start()
        eventually(lambda: recovering(eu, "eu"), "the marker is in")
        with pytest.raises(LocationRecovering):  # a later write sees it...
            repository.handle("w", "refused")
        time.sleep(0.2)
        assert not marked.is_set()  # ...and the recovery waits for the one in progress
    eventually(marked.is_set, "the recovery goes on once the write in progress has ended")
    marking.join(15)
    assert eu.highest_seq_nr("Counter|w|eu") == 1


def test_recovery_refuses_bad_arguments(places: Locations) -> None:
    eu = places.journals["eu"]
    with pytest.raises(InvalidArgument, match="peers"):
        recover(eu, "eu", {}, [TYPE])
    with pytest.raises(InvalidArgument, match="this location's replica id"):
        recover(eu, "eu", {"eu": places.journals["us"]}, [TYPE])
    with pytest.raises(InvalidArgument, match="entity types"):
        recover(eu, "eu", {"us": places.journals["us"]}, [])
    assert not recovering(eu, "eu")


async def test_the_asyncio_face_recovers_and_refuses_writes_meanwhile(places: Locations) -> None:
    from pgjournal.aio import AsyncJournal
    from pgjournal.entity import AsyncReplicatedRepository

    journals = places.journals
    write({"eu": journals["eu"]}, 2, "before")
    copy = places.backup("eu")
    write({"eu": journals["eu"]}, 3, "after")
    replicate_until(journals, 2 * 5)
    lost = own_rows(journals["eu"], "c1")
    places.restore("eu", copy)
    async with AsyncJournal.open(places.dsns["eu"], **FAST) as eu, \
            AsyncJournal.open(places.dsns["us"], **FAST) as us, AsyncJournal.open(places.dsns["ap"], **FAST) as ap:
        journals["eu"].run(mark_recovering_step("eu"))  # as a recovery that stopped leaves it
        repository = AsyncReplicatedRepository(eu, Counter, replica="eu")
        with pytest.raises(LocationRecovering):
            await repository.handle("c1", "refused")
        report = await arecover(eu, "eu", {"us": us, "ap": ap}, [TYPE])
        assert report.events > 0 and {r.persistence_id for r in report.replicas} <= {
            f"Counter|{e}|eu" for e in ENTITIES}
        assert (await repository.handle("c1", "accepted")).reply == "ok"
    assert own_rows(journals["eu"], "c1")[:len(lost)] == lost
    assert not recovering(journals["eu"], "eu")


def test_positions_a_peer_has_read_are_filled_so_that_the_next_write_reaches_it(places: Locations) -> None:
    # eu's last events before the loss were arrivals (us's), which us's stream from eu had read as eu's seq_nrs 2-4:
    # the recovery fills those positions, so eu's next event is its seq_nr 5, which us's offsets have not counted.
    journals = places.journals
    eu, us = journals["eu"], journals["us"]
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "e1")
    copy = places.backup("eu")
    eu = journals["eu"]
    for i in range(3):
        write_local(us, ReplicationId(TYPE, "x", "us"), f"u{i}")
    to_eu = Replicator(eu, "eu", us, "us", TYPE, settings=SETTINGS)
    runner = to_eu.run_range()
    try:
        eventually(lambda: len(rows_of(eu, "Counter|x|eu")) == 4, "us's events at eu")
    finally:
        stopped([runner])
    to_us = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS)
    runner = to_us.run_range()
    try:
        eventually(lambda: to_us.stats.appended == 1 and to_us.stats.own == 3, "us read eu's four events")
    finally:
        stopped([runner])
    places.restore("eu", copy)
    eu = journals["eu"]
    assert len(rows_of(eu, "Counter|x|eu")) == 1
    report = recover(eu, "eu", {"us": us}, [TYPE])
    assert [(r.persistence_id, r.own, r.arrived, r.seq_nr) for r in report.replicas] == [("Counter|x|eu", 0, 3, 4)]
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "e5")
    to_us = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS)
    runner = to_us.run_range()
    try:
        eventually(lambda: len(rows_of(us, "Counter|x|us")) == 5, "eu's write after its recovery at us")
    finally:
        stopped([runner])
    assert check_replicas({"eu": eu, "us": us}, TYPE, ["x"], converged=True) == 5
