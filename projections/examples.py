"""Eventuate-style helpers: a *writer* keeping a read model, a *processor* turning events into events.

* :func:`counter_writer` keeps ``projection_counter`` (events and last sequence number per entity) in the
  same transaction as its offsets: exactly once, in grouped or single-envelope mode.
  :func:`counter_mismatches` compares that read model with the journal.
* :class:`EventProcessor` appends, for each source event, an event of another entity type to the journal
  with the journal's own INSERT (``journal.events.append``) inside the handler's transaction:
  the derived event and the source offset commit together, so each source event yields exactly one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.store import stats
from pgjournal.validation import check_name, check_persistence_id

from .handlers import ExactlyOnce, Grouped, Handler, Projection

if TYPE_CHECKING:
    import psycopg

    from pgjournal.journal import Journal

COUNTER_DDL = """
CREATE TABLE IF NOT EXISTS projection_counter (
    projection_name VARCHAR(255) NOT NULL,
    persistence_id VARCHAR(255) NOT NULL,
    events BIGINT NOT NULL,
    last_seq_nr BIGINT NOT NULL,
    PRIMARY KEY (projection_name, persistence_id))"""
COUNTER_UPSERT = """
INSERT INTO projection_counter (projection_name, persistence_id, events, last_seq_nr)
SELECT %(name)s, u.pid, u.n, u.seq FROM unnest(%(pids)s::text[], %(ns)s::bigint[], %(seqs)s::bigint[]) AS u(pid, n, seq)
ON CONFLICT (projection_name, persistence_id) DO UPDATE
SET events = projection_counter.events + EXCLUDED.events,
    last_seq_nr = GREATEST(projection_counter.last_seq_nr, EXCLUDED.last_seq_nr)"""
COUNTERS = "SELECT persistence_id, events, last_seq_nr FROM projection_counter WHERE projection_name = %s"


def ensure_table(journal: Journal, ddl: str) -> None:
    """``CREATE TABLE IF NOT EXISTS`` that worker processes starting together may all run: concurrent ones
    race on the catalog, so they take turns (transaction-scoped advisory lock)."""
    with journal.connection() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (ddl,))
        conn.execute(ddl)


def ensure_counter_table(journal: Journal) -> None:
    """Read-model tables belong to the application, not to the journal's migrations."""
    ensure_table(journal, COUNTER_DDL)


def count_events(conn: psycopg.Connection, name: str, envelopes: Sequence[EventEnvelope]) -> None:
    """Add the envelopes to the counters (one statement for the whole group)."""
    conn.execute(*counter_upsert(name, envelopes))


async def acount_events(conn: psycopg.AsyncConnection, name: str, envelopes: Sequence[EventEnvelope]) -> None:
    """:func:`count_events` for the asyncio runner (:mod:`projections.aio`)."""
    await conn.execute(*counter_upsert(name, envelopes))


def counter_upsert(name: str, envelopes: Sequence[EventEnvelope]) -> tuple[str, dict[str, Any]]:
    per_pid: dict[str, list[int]] = {}
    for env in envelopes:
        entry = per_pid.setdefault(env.persistence_id, [0, 0])
        entry[0] += 1
        entry[1] = max(entry[1], env.seq_nr)
    return COUNTER_UPSERT, {"name": name, "pids": list(per_pid), "ns": [v[0] for v in per_pid.values()],
                            "seqs": [v[1] for v in per_pid.values()]}


def counter_writer(name: str, *, grouped: bool = True, max_count: int = 500, max_wait: float = 0.5,
                   asynchronous: bool = False) -> Handler:
    """The per-entity counter read model, exactly once (grouped: one upsert per group); ``asynchronous``:
    coroutine handlers, for the asyncio runner."""
    check_name(name, "projection name")
    count: Callable[[Any, str, Sequence[EventEnvelope]], Any] = acount_events if asynchronous else count_events
    if grouped:
        return Grouped(lambda conn, envs: count(conn, name, envs), max_count=max_count, max_wait=max_wait)
    return ExactlyOnce(lambda conn, env: count(conn, name, [env]))


def counter_mismatches(journal: Journal, name: str, entity_type: str) -> list[tuple[Any, ...]]:
    """``(pid, journal count, journal max seq_nr, counted, last counted seq_nr)`` for each disagreement."""
    with journal.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # both sides from one snapshot
        stored = {r.persistence_id: (r.events, r.highest) for r in stats.per_persistence_id(entity_type).all(conn)}
        counted = {pid: (n, last) for pid, n, last in conn.execute(COUNTERS, (name,)).fetchall()}
    return sorted((pid, *stored.get(pid, (None, None)), *counted.get(pid, (None, None)))
                  for pid in stored.keys() | counted.keys() if stored.get(pid) != counted.get(pid))


class EventProcessor:
    """Turn events of one entity type into events of another, exactly once (an :class:`ExactlyOnce` handler).

    ``transform(envelope)`` returns the new event (or ``None`` for none); it is appended to
    ``target_entity_type|<entity id of the source>``. One processor writes each target persistence id, so
    numbering after the latest event inside the transaction cannot clash.
    """

    def __init__(self, journal: Journal, target_entity_type: str, transform: Callable[[EventEnvelope], Any]) -> None:
        self.journal = journal
        self.target_entity_type = check_name(target_entity_type, "target entity type")
        self.transform = transform

    def target_id(self, env: EventEnvelope) -> str:
        entity_id = env.persistence_id.split("|", 1)[1] if "|" in env.persistence_id else env.persistence_id
        return check_persistence_id(f"{self.target_entity_type}|{entity_id}")

    def handle(self, conn: psycopg.Connection, env: EventEnvelope) -> None:
        event = self.transform(env)
        if event is None:
            return
        pid = self.target_id(env)
        slice_ = slice_for_persistence_id(pid)
        encoded = self.journal.serializers.serialize(event, persistence_id=pid)
        params = {"slice": slice_, "entity_type": entity_type_of(pid), "pid": pid,
                  "writer": self.journal.writer_id, "tags": None, "expected": None, "meta_ser_id": None,
                  "meta_manifest": None, "meta_payload": None, "ser_id": encoded.ser_id,
                  "manifest": encoded.manifest, "payload": encoded.payload}
        conn.execute(self.journal.events.append(slice_, after_latest=True, single=True), params)

    def handler(self) -> ExactlyOnce:
        return ExactlyOnce(self.handle)


def counter_projection(journal: Journal, name: str, entity_type: str) -> Projection:
    """Factory for workers and the CLI (``projections.examples:counter_projection``): the counter read model,
    grouped exactly-once."""
    ensure_counter_table(journal)
    return Projection(name, entity_type, counter_writer(name))
