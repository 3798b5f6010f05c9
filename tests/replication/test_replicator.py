"""Three locations as three databases, writers in every location appending to the same entities at once, a
stream from each location to each other: every origin event once in every replica, contiguous sequence numbers,
vectors growing, the stored concurrent flag equal to its recomputation, causal order, convergence once quiet
(docs/replication.md, section 5). Then the same with a replicator process SIGKILLed and restarted mid-stream, and
with a peer's connections cut."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.eventually import eventually
from support.faultproxy import fault_proxy
from support.projection_workers import stop_all, worker_env
from support.replication import check_replicas, rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.model.replication import ReplicationId, VersionVector
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator

pytestmark = pytest.mark.postgres_only("three databases, the replicator's advisory locks")

REPLICAS = ("eu", "us", "ap")
TYPE = "Counter"
ENTITIES = ("c1", "c2", "c3")
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=5, backoff=0.01)


@pytest.fixture
def locations(shard_databases: Any) -> Iterator[dict[str, tuple[str, Journal]]]:
    dsns = shard_databases(len(REPLICAS))
    with contextlib.ExitStack() as stack:
        yield {r: (dsn, stack.enter_context(Journal.open(dsn, **FAST))) for r, dsn in zip(REPLICAS, dsns, strict=True)}


def writers(journals: dict[str, Journal], per_writer: int, stop: threading.Event | None = None,
            pause: float = 0.0) -> list[threading.Thread]:
    """Two writers per location, each appending ``per_writer`` events spread over the shared entities."""
    def write(replica: str, journal: Journal, n: int) -> None:
        for i in range(per_writer):
            if stop is not None and stop.is_set():
                return
            write_local(journal, ReplicationId(TYPE, ENTITIES[(i + n) % len(ENTITIES)], replica), f"{replica}-{n}-{i}")
            if pause:
                time.sleep(pause)

    threads = [threading.Thread(target=write, args=(r, j, n)) for r, j in journals.items() for n in range(2)]
    for t in threads:
        t.start()
    return threads


def streams(journals: dict[str, Journal], **options: Any) -> list[Any]:
    runners = []
    for local, journal in journals.items():
        for peer, source in journals.items():
            if peer != local:
                runners.append(Replicator(journal, local, source, peer, TYPE, settings=SETTINGS,
                                          **options).run_range())
    return runners


def stopped(runners: list[Any]) -> None:
    for r in runners:
        r.stop()
    for r in runners:
        r.join(15)
        assert r.failed is None, r.failed


def converged(journals: dict[str, Journal], expected: int) -> bool:
    counts = {r: sum(len(rows_of(j, ReplicationId(TYPE, e, r).persistence_id)) for e in ENTITIES)
              for r, j in journals.items()}
    return all(c == expected for c in counts.values())


def test_three_locations_writing_the_same_entities_converge_exactly_once_in_causal_order(
        locations: dict[str, tuple[str, Journal]]) -> None:
    journals = {r: j for r, (_, j) in locations.items()}
    runners = streams(journals)
    try:
        threads = writers(journals, 40)
        for t in threads:
            t.join(120)
        total = len(REPLICAS) * 2 * 40
        eventually(lambda: converged(journals, total), "every location holds every event", timeout=120)
        time.sleep(1.0)  # quiet: streams that would write a copy twice have had the time to
    finally:
        stopped(runners)
    assert check_replicas(journals, TYPE, ENTITIES, converged=True) == total
    flagged = sum(r.meta.concurrent for j in journals.values() for e in ENTITIES
                  for r in rows_of(j, ReplicationId(TYPE, e, "eu").persistence_id))
    assert flagged > 0  # writers at once in three places: some arrivals were concurrent


def test_relayed_events_keep_causal_order_with_three_locations(locations: dict[str, tuple[str, Journal]]) -> None:
    # A writes a1; B receives it and writes b1 (its vector covers a1); C reads only B: it gets a1 before b1,
    # through B (a stream reads every event its peer holds, not only the peer's own).
    journals = {r: j for r, (_, j) in locations.items()}
    eu, us, ap = (journals[r] for r in REPLICAS)
    write_local(eu, ReplicationId(TYPE, "x", "eu"), "a1")
    eu_to_us = Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS).run_range()
    try:
        eventually(lambda: len(rows_of(us, "Counter|x|us")) == 1, "a1 at us")
    finally:
        stopped([eu_to_us])
    write_local(us, ReplicationId(TYPE, "x", "us"), "b1")
    us_to_ap = Replicator(ap, "ap", us, "us", TYPE, settings=SETTINGS).run_range()
    try:
        eventually(lambda: len(rows_of(ap, "Counter|x|ap")) == 2, "both at ap")
    finally:
        stopped([us_to_ap])
    log = rows_of(ap, "Counter|x|ap")
    assert [(r.meta.origin_replica, r.meta.origin_sequence_nr) for r in log] == [("eu", 1), ("us", 2)]
    assert log[1].meta.version == VersionVector({"eu": 1, "us": 2})
    # Reading eu afterwards brings a1 again: dropped as seen.
    eu_to_ap = Replicator(ap, "ap", eu, "eu", TYPE, settings=SETTINGS)
    runner = eu_to_ap.run_range()
    try:
        eventually(lambda: eu_to_ap.stats.seen == 1, "a1 dropped at ap")
    finally:
        stopped([runner])
    assert len(rows_of(ap, "Counter|x|ap")) == 2


def replicator_process(local: str, dsns: dict[str, str]) -> subprocess.Popen[bytes]:
    peers = [f"--peer={p}={dsn}" for p, dsn in dsns.items() if p != local]
    return subprocess.Popen(
        [sys.executable, "-m", "pgjournal", "replication", "run", "--dsn", dsns[local], "--replica",
         local, *peers, "--entity-type", TYPE, "--lease-duration", "2"],
        env=worker_env(FAST), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a pipe never read would block it


@pytest.mark.servers
def test_replicator_processes_killed_mid_stream_resume_and_write_each_event_once(
        locations: dict[str, tuple[str, Journal]]) -> None:
    journals = {r: j for r, (_, j) in locations.items()}
    dsns = {r: dsn for r, (dsn, _) in locations.items()}
    procs = {r: replicator_process(r, dsns) for r in REPLICAS}
    kills = 0
    try:
        threads = writers(journals, 60, pause=0.01)
        deadline = time.monotonic() + 60
        # At least three kills, whether the writers are still writing or the replicators still copying what they
        # wrote (a quiet machine writes the events in less time than three kills take).
        while (kills < 3 or any(t.is_alive() for t in threads)) and time.monotonic() < deadline:
            time.sleep(0.7)
            victim = REPLICAS[kills % len(REPLICAS)]
            procs[victim].send_signal(signal.SIGKILL)  # mid-stream: no lease released, no batch finished
            procs[victim].wait(10)
            kills += 1
            procs[victim] = replicator_process(victim, dsns)
        for t in threads:
            t.join(60)
        total = len(REPLICAS) * 2 * 60
        eventually(lambda: converged(journals, total), "every location holds every event", timeout=180)
    finally:
        stop_all(list(procs.values()))
    assert kills >= 3
    assert check_replicas(journals, TYPE, ENTITIES, converged=True) == total


def test_a_peer_cut_off_resumes_where_it_stopped(locations: dict[str, tuple[str, Journal]]) -> None:
    journals = {r: j for r, (_, j) in locations.items()}
    dsns = {r: dsn for r, (dsn, _) in locations.items()}
    with fault_proxy(dsns["us"]) as (proxy, proxied):
        us_via_proxy = Journal.open(proxied, **FAST)
        try:
            runners = [Replicator(journals["eu"], "eu", us_via_proxy, "us", TYPE, settings=SETTINGS).run_range(),
                       Replicator(journals["us"], "us", journals["eu"], "eu", TYPE, settings=SETTINGS).run_range()]
            sub = {r: journals[r] for r in ("eu", "us")}
            try:
                threads = writers(sub, 40, pause=0.01)
                time.sleep(0.5)
                proxy.refuse(True)
                proxy.cut()
                time.sleep(2.0)  # cut off: local writes go on at both
                assert all(t.is_alive() or True for t in threads)
                proxy.refuse(False)
                for t in threads:
                    t.join(60)
                eventually(lambda: converged(sub, 2 * 2 * 40), "eu and us converge after the cut", timeout=120)
            finally:
                stopped(runners)
        finally:
            us_via_proxy.close()
    assert proxy.cuts >= 1
    assert check_replicas(sub, TYPE, ENTITIES, converged=True) == 2 * 2 * 40


def test_a_peer_is_read_with_its_reader_role_and_status_reports_each_peer(
        dsn: str, roles: Any, shard_databases: Any) -> None:
    # The peer ``us`` is this test's database with the least-privilege roles; ``eu`` reads it as the reader.
    [eu_dsn] = shard_databases(1)
    with Journal.open(dsn, **FAST) as us, Journal.open(eu_dsn, **FAST) as eu, \
            Journal.open(roles.dsn(dsn, roles.reader), **FAST) as us_reader:
        for i in range(5):
            write_local(us, ReplicationId(TYPE, "r", "us"), f"us-{i}")
        stream = Replicator(eu, "eu", us_reader, "us", TYPE, settings=SETTINGS)
        runner = stream.run_range()
        try:
            eventually(lambda: len(rows_of(eu, "Counter|r|eu")) == 5, "us's events at eu")
        finally:
            stopped([runner])
        assert check_replicas({"eu": eu, "us": us}, TYPE, ["r"], converged=True) == 5
        with us.connection() as conn:  # nothing written at the peer: no offsets, no seen rows
            assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM replication_seen").fetchone()[0] == 0
        from typer.testing import CliRunner

        from pgjournal.cli.commands import app

        unreachable = "postgresql://nobody:secret-pw@127.0.0.1:1/nowhere?connect_timeout=2"
        result = CliRunner().invoke(app, ["replication", "status", "--dsn", eu_dsn, "--replica", "eu",
                                          "--peer", f"us={roles.dsn(dsn, roles.reader)}", "--peer",
                                          f"ap={unreachable}", "-e", TYPE], env={"COLUMNS": "200"})
        assert result.exit_code == 2, result.output
        lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│ ")}
        assert "available" in lines["us"] and "unavailable" not in lines["us"], result.output
        assert "unavailable" in lines["ap"], result.output
        assert "secret-pw" not in result.output
        # 5 events appended by the stream within the minute: 5/60 per second.
        assert "0.1" in lines["us"], result.output


def test_a_peer_down_when_the_worker_starts_is_replicated_from_once_it_answers(
        locations: dict[str, tuple[str, Journal]]) -> None:
    from pgjournal.replication import Peer, run_replication

    journals = {r: j for r, (_, j) in locations.items()}
    dsns = {r: dsn for r, (dsn, _) in locations.items()}
    for i in range(3):
        write_local(journals["us"], ReplicationId(TYPE, "d", "us"), f"us-{i}")
        write_local(journals["ap"], ReplicationId(TYPE, "d", "ap"), f"ap-{i}")
    with fault_proxy(dsns["us"]) as (proxy, proxied):
        proxy.refuse(True)
        stop = threading.Event()
        codes: list[int] = []
        worker = threading.Thread(target=lambda: codes.append(run_replication(
            dsns["eu"], "eu", [Peer("us", proxied), Peer("ap", dsns["ap"])], [TYPE], stop=stop, lease_duration=2,
            journal_settings={**FAST, "connect_timeout": 1})))
        worker.start()
        try:
            eventually(lambda: len(rows_of(journals["eu"], "Counter|d|eu")) == 3, "ap's events while us is down",
                       timeout=60)
            assert {r.meta.origin_replica for r in rows_of(journals["eu"], "Counter|d|eu")} == {"ap"}
            proxy.refuse(False)
            eventually(lambda: len(rows_of(journals["eu"], "Counter|d|eu")) == 6, "us's events once it answers",
                       timeout=60)
        finally:
            stop.set()
            worker.join(60)
    assert codes == [0]
    assert check_replicas(journals, TYPE, ["d"], converged=False) == 6


async def test_the_asyncio_face_runs_the_same_streams(locations: dict[str, tuple[str, Journal]]) -> None:
    import asyncio

    from pgjournal.aio import AsyncJournal

    journals = {r: j for r, (_, j) in locations.items()}
    dsns = {r: dsn for r, (dsn, _) in locations.items()}
    for i in range(6):  # written with the blocking face, before and while the streams run
        write_local(journals["eu"], ReplicationId(TYPE, "a", "eu"), f"eu-{i}")
        write_local(journals["us"], ReplicationId(TYPE, "a", "us"), f"us-{i}")
    async with AsyncJournal.open(dsns["eu"], **FAST) as eu, AsyncJournal.open(dsns["us"], **FAST) as us:
        runners = [Replicator(eu, "eu", us, "us", TYPE, settings=SETTINGS).arun_range(),
                   Replicator(us, "us", eu, "eu", TYPE, settings=SETTINGS).arun_range()]
        try:
            for _ in range(600):
                if all(len(rows_of(journals[r], f"Counter|a|{r}")) == 12 for r in ("eu", "us")):
                    break
                await asyncio.sleep(0.1)
        finally:
            for r in runners:
                r.stop()
            for r in runners:
                await r.join(15)
                assert r.failed is None, r.failed
    sub = {r: journals[r] for r in ("eu", "us")}
    assert check_replicas(sub, TYPE, ["a"], converged=True) == 12
