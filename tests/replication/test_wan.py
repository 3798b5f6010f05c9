"""Three locations as three PostgreSQL servers, each stream reading its peer through a proxy that adds a WAN delay
(10 ms each way): writers in every location append to the same entities at once while the test partitions one
link in one direction only, cuts and refuses another, SIGKILLs a location's replicator process and restarts a
server mid-stream. Healed and quiet, every check of docs/replication.md section 5 holds over every replica:
each origin event once, contiguous sequence numbers, vectors growing, the stored concurrent flag equal to its
recomputation, causal order, the same final vector everywhere.

Every connection to a location's server (its writers, its replicator process, its peers' streams) goes through a
proxy, so the server's restart on a new port is one ``retarget`` per proxy."""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from support.database import own_embedded_server
from support.eventually import eventually
from support.faultproxy import FaultProxy
from support.projection_workers import stop_all, worker_env
from support.replication import check_replicas, rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.errors import JournalError
from pgjournal.model.replication import ReplicationId

pytestmark = [pytest.mark.servers, pytest.mark.timing,
              pytest.mark.postgres_only("three servers, the replicator's advisory locks")]

REPLICAS = ("eu", "us", "ap")
TYPE = "Counter"
ENTITIES = ("c1", "c2", "c3")
#: One way, per link: a 20 ms round trip.
WAN = 0.010
#: The peers' connections: a lost link is found in a few seconds, not the operating system's minutes.
SETTINGS = {**FAST, "connect_timeout": 2, "statement_timeout": 5.0, "tcp_user_timeout": 3.0}


class Location:
    """A server, the proxies in front of it (one for its own clients, one per peer reading it) and its journal."""

    def __init__(self, name: str, server: object) -> None:
        self.name = name
        self.server = server
        dsn = server.dsn  # type: ignore[attr-defined]
        self.own = FaultProxy(*_host_port(dsn))
        self.own_dsn = self.own.dsn(dsn)
        #: peer name -> the proxy that peer's streams read this location through
        self.read_by: dict[str, FaultProxy] = {}
        self.journal = Journal.open(self.own_dsn, migrate=True, **SETTINGS)

    def proxies(self) -> list[FaultProxy]:
        return [self.own, *self.read_by.values()]

    def restart(self) -> None:
        self.server.stop()  # type: ignore[attr-defined]
        self.server.ensure_running()  # type: ignore[attr-defined]
        host, port = _host_port(self.server.dsn)  # type: ignore[attr-defined]
        for proxy in self.proxies():
            proxy.retarget(host, port)

    def close(self) -> None:
        self.journal.close()
        for proxy in self.proxies():
            proxy.close()


def _host_port(dsn: str) -> tuple[str, int]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


@pytest.fixture
def world() -> Iterator[dict[str, Location]]:
    with contextlib.ExitStack() as stack:
        places = {name: Location(name, stack.enter_context(own_embedded_server(f"pgjournal-wan-{name}-")))
                  for name in REPLICAS}
        for place in places.values():
            stack.callback(place.close)
        for reader, read in itertools.permutations(REPLICAS, 2):
            proxy = FaultProxy(*_host_port(places[read].server.dsn))  # type: ignore[attr-defined]
            proxy.delay(up=WAN, down=WAN)
            places[read].read_by[reader] = proxy
        yield places


def peer_dsn(world: dict[str, Location], reader: str, read: str) -> str:
    place = world[read]
    return place.read_by[reader].dsn(place.own_dsn)


def replicator(world: dict[str, Location], name: str) -> subprocess.Popen[bytes]:
    peers = [f"--peer={p}={peer_dsn(world, name, p)}" for p in REPLICAS if p != name]
    return subprocess.Popen(
        [sys.executable, "-m", "pgjournal", "replication", "run", "--dsn", world[name].own_dsn, "--replica", name,
         *peers, "--entity-type", TYPE, "--lease-duration", "2"],
        env=worker_env(SETTINGS), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def writers(world: dict[str, Location], stop: threading.Event, written: dict[str, int]) -> list[threading.Thread]:
    """Two writers per location on the shared entities until ``stop``; a write that fails (its server restarting)
    is tried again as a new event: what counts is what each origin holds, read back at the end."""
    lock = threading.Lock()

    def write(place: Location, n: int) -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            rid = ReplicationId(TYPE, ENTITIES[(i + n) % len(ENTITIES)], place.name)
            try:
                write_local(place.journal, rid, f"{place.name}-{n}-{i}")
            except (psycopg.Error, JournalError, OSError):
                time.sleep(0.1)
                continue
            with lock:
                written[place.name] += 1
            time.sleep(0.01)

    threads = [threading.Thread(target=write, args=(place, n), daemon=True)
               for place in world.values() for n in range(2)]
    for t in threads:
        t.start()
    return threads


def holdings(world: dict[str, Location]) -> dict[str, int]:
    return {name: sum(len(rows_of(place.journal, ReplicationId(TYPE, e, name).persistence_id)) for e in ENTITIES)
            for name, place in world.items()}


def arrivals(world: dict[str, Location]) -> dict[tuple[str, str], int]:
    """(location, origin) -> the origin's events the location holds, for every pair of two locations."""
    out = {(name, origin): 0 for name, origin in itertools.permutations(REPLICAS, 2)}
    for name, place in world.items():
        for e in ENTITIES:
            for row in rows_of(place.journal, ReplicationId(TYPE, e, name).persistence_id):
                if row.meta.origin_replica != name:
                    out[(name, row.meta.origin_replica)] += 1
    return out


def origin_events(world: dict[str, Location]) -> int:
    return sum(1 for name, place in world.items() for e in ENTITIES
               for row in rows_of(place.journal, ReplicationId(TYPE, e, name).persistence_id)
               if row.meta.origin_replica == name)


def test_three_servers_over_a_wan_with_partitions_kills_and_a_restart_converge_exactly_once(
        world: dict[str, Location]) -> None:
    procs = {name: replicator(world, name) for name in REPLICAS}
    stop = threading.Event()
    written = dict.fromkeys(REPLICAS, 0)
    threads = writers(world, stop, written)
    try:
        def replicated_some() -> bool:
            return all(count >= 10 for count in arrivals(world).values())

        eventually(replicated_some, "events of every other location arriving everywhere", timeout=90)
        # 1. eu's streams get nothing back from us for 3 s (queries reach us, answers are held): one way only.
        world["us"].read_by["eu"].stall(True, direction="down")
        time.sleep(3.0)
        world["us"].read_by["eu"].stall(False, direction="down")
        # 2. ap's streams from us lose their connections and find us refusing for 2 s.
        link = world["us"].read_by["ap"]
        link.refuse(True)
        link.cut()
        time.sleep(2.0)
        link.refuse(False)
        # 3. eu's replicator process SIGKILLed mid-stream (no lease released, no batch finished), then restarted.
        procs["eu"].send_signal(signal.SIGKILL)
        procs["eu"].wait(10)
        procs["eu"] = replicator(world, "eu")
        # 4. ap's server restarted while everyone writes: its writers wait, the streams from it and into it resume.
        before = written["ap"]
        world["ap"].restart()
        eventually(lambda: written["ap"] > before + 10, "ap's writers going on after its restart", timeout=60)
        stop.set()
        for t in threads:
            t.join(30)
        total = origin_events(world)

        def converged() -> bool:
            return all(count == total for count in holdings(world).values())

        eventually(converged, f"every location holding all {total} origin events", timeout=180)
    finally:
        stop.set()
        stop_all(list(procs.values()))
    assert check_replicas({n: p.journal for n, p in world.items()}, TYPE, ENTITIES, converged=True) == total
    assert total >= sum(written.values()), "an acknowledged write is missing at its origin"
    assert world["us"].read_by["ap"].cuts >= 1 and world["us"].read_by["ap"].refused >= 1
