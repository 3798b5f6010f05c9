"""A local writer that does not take the replicator's lock, built on purpose: it appends to the replica between the
batch's read of the replicas' last events and its appends. The batch goes back to its savepoint and each replica
is written again from its own, its state read again: every event once, the sequence numbers contiguous."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from support.eventually import eventually
from support.replication import write_local
from support.settings import FAST

from pgjournal import Journal
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.replication import ReplicationId
from pgjournal.projections import ProjectionSettings
from pgjournal.replication import Replicator
from pgjournal.replication.replicator import writer_of
from pgjournal.runtime.steps import Pipelined, Step, run

pytestmark = pytest.mark.postgres_only("the replicator's advisory locks")

TYPE = "Counter"
TARGET = f"{TYPE}|c1|eu"


class Racing(Replicator):
    """A replicator whose first batch meets a local append to :data:`TARGET` right after it read the replicas'
    last events (what a writer that does not lock can do at any moment)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raced = False

    def process(self, conn: psycopg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
        run(self._racing(self.process_step(envelopes)), conn)

    def _racing(self, step: Step[None]) -> Step[None]:
        """``step``, its requests and answers (and errors) passed through."""
        request = next(step)
        while True:
            try:
                answer = yield request
            except Exception as exc:  # the statement's error, raised where the step asked
                try:
                    request = step.throw(exc)
                except StopIteration:
                    return
                continue
            if not self.raced and isinstance(request, Pipelined) and any(
                    "LATERAL" in one.sql for one in request.statements):  # the replicas' last events read
                self.raced = True
                self.local.append(TARGET, [{"local": 1}])  # its own connection, committed, no lock taken
            try:
                request = step.send(answer)
            except StopIteration:
                return


def test_a_local_append_between_the_batch_read_and_its_appends_sends_the_batch_back_to_its_savepoint(
        shard_databases: Any) -> None:
    eu_dsn, us_dsn = shard_databases(2)
    with Journal.open(eu_dsn, **FAST) as eu, Journal.open(us_dsn, **FAST) as us:
        for n in range(3):
            write_local(us, ReplicationId(TYPE, "c1", "us"), f"us-{n}")
        write_local(us, ReplicationId(TYPE, "c2", "us"), "us-c2")
        stream = Racing(eu, "eu", us, "us", TYPE, settings=ProjectionSettings(restart_backoff=0.2))
        runner = stream.run_range()
        try:
            eventually(lambda: stream.stats.appended == 4, "the peer's four events appended")
        finally:
            runner.stop()
            runner.join(30)
        with contextlib.closing(psycopg.connect(eu_dsn)) as conn:
            rows = conn.execute("SELECT persistence_id, seq_nr, writer FROM event_journal ORDER BY 1, 2").fetchall()
    assert stream.raced and stream.stats.races == 1
    replicated = writer_of("us")
    assert [(pid, seq) for pid, seq, _ in rows] == [(TARGET, 1), (TARGET, 2), (TARGET, 3), (TARGET, 4),
                                                     (f"{TYPE}|c2|eu", 1)]
    assert [writer == replicated for _, _, writer in rows] == [False, True, True, True, True]
