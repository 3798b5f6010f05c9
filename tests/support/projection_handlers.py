"""Handler factories for projection tests that run in worker subprocesses (imported by module name there).

No tests here. ``audited_counter`` keeps the counter read model and, in the same transaction, an audit row per
envelope: (slice, owner, lease epoch, database clock) — the evidence that two workers never processed one
slice in overlapping leases. ``audited_at_least_once`` records every handling on its own connection.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from pgjournal.journal import Journal
from pgjournal.projections.examples import count_events, ensure_counter_table, ensure_table
from pgjournal.projections.handlers import AtLeastOnce, Grouped, Projection, ProjectionSettings
from pgjournal.projections.runner import current_context

AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS projection_audit (
    slice INT NOT NULL, owner TEXT NOT NULL, epoch BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL,
    persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL)"""
AUDIT_INSERT = """
INSERT INTO projection_audit (slice, owner, epoch, at, persistence_id, seq_nr)
SELECT u.slice, %(owner)s, u.epoch, clock_timestamp(), u.pid, u.seq
FROM unnest(%(slices)s::int[], %(epochs)s::bigint[], %(pids)s::text[], %(seqs)s::bigint[])
    AS u(slice, epoch, pid, seq)"""
SEEN_DDL = """
CREATE TABLE IF NOT EXISTS projection_seen (persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL,
                                            at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"""

FAST_PROJECTION = ProjectionSettings(backoff=0.01, management_interval=0.2, delete_interval=1.0,
                                     restart_backoff=0.2)


def audited_counter(journal: Journal, name: str, entity_type: str) -> Projection:
    ensure_counter_table(journal)
    ensure_table(journal, AUDIT_DDL)

    def handle(conn: psycopg.Connection, envelopes: Any) -> None:
        count_events(conn, name, envelopes)
        ctx = current_context.get()
        assert ctx is not None and ctx.owner is not None
        conn.execute(AUDIT_INSERT, {"owner": ctx.owner, "slices": [e.slice for e in envelopes],
                                    "epochs": [ctx.epochs[e.slice] for e in envelopes],
                                    "pids": [e.persistence_id for e in envelopes],
                                    "seqs": [e.seq_nr for e in envelopes]})

    max_count = int(os.environ.get("TEST_GROUP_SIZE", "20"))
    return Projection(name, entity_type, Grouped(handle, max_count=max_count, max_wait=0.1), FAST_PROJECTION)


def audited_at_least_once(journal: Journal, name: str, entity_type: str) -> Projection:
    ensure_table(journal, SEEN_DDL)
    own = psycopg.connect(journal.dsn, autocommit=True)

    def handle(env: Any) -> None:
        own.execute("INSERT INTO projection_seen (persistence_id, seq_nr) VALUES (%s, %s)",
                    (env.persistence_id, env.seq_nr))

    save_every = int(os.environ.get("TEST_SAVE_EVERY", "20"))
    return Projection(name, entity_type, AtLeastOnce(handle, save_every=save_every, save_interval=3600.0),
                      FAST_PROJECTION)
