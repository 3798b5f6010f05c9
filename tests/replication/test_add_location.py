"""Adding a location while the others run (docs/replication.md, section 8): a fourth database is migrated and its
streams, to it from every location and from it to every location, start from the beginning while writers in the
three others keep writing. Its replicas fill with every event, in causal order; it writes at once, and its first
events are flagged concurrent where they arrive; once quiet, every check of section 5 holds over the four."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.eventually import eventually
from support.replication import check_replicas, rows_of, write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.model.replication import ReplicationId
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator

pytestmark = pytest.mark.postgres_only("four databases, the replicator's advisory locks")

RUNNING = ("eu", "us", "ap")
NEW = "sa"
TYPE = "Counter"
ENTITIES = ("c1", "c2", "c3")
SETTINGS = ProjectionSettings(restart_backoff=0.2, management_interval=0.5, attempts=5, backoff=0.01)


@pytest.fixture
def running(shard_databases: Any) -> Iterator[dict[str, Journal]]:
    with contextlib.ExitStack() as stack:
        yield {r: stack.enter_context(Journal.open(dsn, **FAST))
               for r, dsn in zip(RUNNING, shard_databases(len(RUNNING)), strict=True)}


def stream(local: str, journal: Journal, peer: str, source: Journal) -> Any:
    return Replicator(journal, local, source, peer, TYPE, settings=SETTINGS).run_range()


def writer(replica: str, journal: Journal, n: int, stop: threading.Event, written: list[int]) -> None:
    i = 0
    while not stop.is_set():
        write_local(journal, ReplicationId(TYPE, ENTITIES[(i + n) % len(ENTITIES)], replica), f"{replica}-{n}-{i}")
        i += 1
        written[0] += 1
        time.sleep(0.005)


def count(journal: Journal, replica: str) -> int:
    return sum(len(rows_of(journal, ReplicationId(TYPE, e, replica).persistence_id)) for e in ENTITIES)


def test_a_fourth_location_joins_while_the_others_write_and_replicate(
        running: dict[str, Journal], shard_databases: Any) -> None:
    journals = dict(running)
    runners = [stream(local, j, peer, s) for local, j in journals.items() for peer, s in journals.items()
               if peer != local]
    stop = threading.Event()
    written = {r: [0] for r in RUNNING}
    threads = [threading.Thread(target=writer, args=(r, j, n, stop, written[r])) for r, j in journals.items()
               for n in range(2)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: all(w[0] >= 20 for w in written.values()), "the three locations write", timeout=60)
        # The new location: an empty database, migrated while the others run.
        [dsn] = shard_databases(1, migrated=False)
        sa = Journal.open(dsn, migrate=True, **FAST)
        try:
            journals[NEW] = sa
            # It writes at once, before it holds anything of the others.
            for i, entity in enumerate(ENTITIES):
                write_local(sa, ReplicationId(TYPE, entity, NEW), f"{NEW}-first-{i}")
            # Its streams, from the start: to it from each location, from it to each.
            for peer in RUNNING:
                runners.append(stream(NEW, sa, peer, journals[peer]))
                runners.append(stream(peer, journals[peer], NEW, sa))
            before = sum(w[0] for w in written.values())
            eventually(lambda: count(sa, NEW) > before, "the new location's replicas fill while the others write",
                       timeout=120)
            for i in range(6):  # and it writes on while it catches up
                write_local(sa, ReplicationId(TYPE, ENTITIES[i % len(ENTITIES)], NEW), f"{NEW}-{i}")
            stop.set()
            for t in threads:
                t.join(60)
            total = sum(w[0] for w in written.values()) + len(ENTITIES) + 6
            eventually(lambda: all(count(j, r) == total for r, j in journals.items()), "every event everywhere",
                       timeout=180)
            time.sleep(1.0)  # quiet: a stream that would write a copy twice has had the time to
            for r in runners:
                r.stop()
            for r in runners:
                r.join(15)
                assert r.failed is None, r.failed
            assert check_replicas(journals, TYPE, ENTITIES, converged=True) == total
            # The new location's first writes had seen nothing of the others: concurrent where they arrived.
            for replica in RUNNING:
                firsts = [row for e in ENTITIES for row in rows_of(journals[replica], f"{TYPE}|{e}|{replica}")
                          if row.meta.origin_replica == NEW and row.meta.origin_sequence_nr == 1]
                assert len(firsts) == len(ENTITIES) and all(row.meta.concurrent for row in firsts), replica
        finally:
            sa.close()
    finally:
        stop.set()
        for r in runners:
            r.stop()
        for t in threads:
            t.join(60)
