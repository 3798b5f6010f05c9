"""Databases as Akka/Pekko Persistence R2DBC documents them, and rows and queries as Akka's plugins run them.

Our own text, written from the tables, columns, types and indexes of Akka's documented DDL
(``ddl-scripts/create_tables_postgres.sql``, ``create_tables_postgres_jsonb.sql``, ``create_tables_yugabyte.sql``
of akka-persistence-r2dbc, data partitions ``event_journal_<n>``; the offset tables of akka-projection-r2dbc).
The Yugabyte form cannot run on PostgreSQL as written (``HASH``, ``ASC`` in a key, ``SPLIT AT``):
:func:`runnable_on_postgres` drops exactly those clauses so the same tables can be adopted here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import psycopg

from pgjournal import slice_for_persistence_id

SPLITS = "SPLIT AT VALUES ((127), (255), (383), (511), (639), (767), (895))"


def _journal_table(name: str, dialect: str, payload: str) -> list[str]:
    key = "persistence_id HASH, seq_nr ASC" if dialect == "yugabyte" else "persistence_id, seq_nr"
    table = f"""CREATE TABLE {name} (
  slice INT NOT NULL, entity_type VARCHAR(255) NOT NULL, persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL, db_timestamp timestamp with time zone NOT NULL,
  event_ser_id INTEGER NOT NULL, event_ser_manifest VARCHAR(255) NOT NULL, event_payload {payload} NOT NULL,
  deleted BOOLEAN DEFAULT FALSE NOT NULL, writer VARCHAR(255) NOT NULL, adapter_manifest VARCHAR(255),
  tags TEXT ARRAY, meta_ser_id INTEGER, meta_ser_manifest VARCHAR(255), meta_payload BYTEA,
  PRIMARY KEY ({key}))"""
    if dialect == "yugabyte":
        index = (f"CREATE INDEX {name}_slice_idx ON {name} (slice ASC, entity_type ASC, db_timestamp ASC, "
                 f"seq_nr ASC, persistence_id, deleted) {SPLITS}")
    else:
        index = f"CREATE INDEX {name}_slice_idx ON {name} (slice, entity_type, db_timestamp, seq_nr)"
    return [table, index]


def akka_ddl(dialect: str = "postgres", *, payload: str = "BYTEA", partitions: int = 1,
             old_journal: bool = False, projections: bool = True, database: tuple[int, int] = (0, 1)) -> list[str]:
    """Akka's tables: the journal (one table, or ``event_journal_0..n-1``), snapshots, durable state and,
    with ``projections``, Akka Projection's offset and management tables. ``old_journal``: the journal of
    Akka R2DBC 1.0 (no ``tags`` column), which pgjournal must refuse. ``database``: ``(i, n)``, database ``i``
    of Akka's ``number-of-databases = n``, which holds the ``i``-th run of ``partitions / n`` data partitions."""
    index, databases = database
    per = partitions // databases
    names = (["event_journal"] if partitions == 1 else
             [f"event_journal_{i}" for i in range(index * per, (index + 1) * per)])
    statements = [s for name in names for s in _journal_table(name, dialect, payload)]
    if old_journal:
        statements = [s.replace("  tags TEXT ARRAY,", " ") for s in statements]
    hash_key = " HASH" if dialect == "yugabyte" else ""
    statements += [
        f"""CREATE TABLE snapshot (
  slice INT NOT NULL, entity_type VARCHAR(255) NOT NULL, persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL, db_timestamp timestamp with time zone, write_timestamp BIGINT NOT NULL,
  ser_id INTEGER NOT NULL, ser_manifest VARCHAR(255) NOT NULL, snapshot {payload} NOT NULL, tags TEXT ARRAY,
  meta_ser_id INTEGER, meta_ser_manifest VARCHAR(255), meta_payload BYTEA,
  PRIMARY KEY (persistence_id{hash_key}))""",
        f"""CREATE TABLE durable_state (
  slice INT NOT NULL, entity_type VARCHAR(255) NOT NULL, persistence_id VARCHAR(255) NOT NULL,
  revision BIGINT NOT NULL, db_timestamp timestamp with time zone NOT NULL,
  state_ser_id INTEGER NOT NULL, state_ser_manifest VARCHAR(255), state_payload {payload} NOT NULL,
  tags TEXT ARRAY, PRIMARY KEY (persistence_id{hash_key}, revision{' ASC' if hash_key else ''}))""",
    ]
    if projections:
        asc = " ASC" if dialect == "yugabyte" else ""
        split = f" {SPLITS}" if dialect == "yugabyte" else ""
        statements += [
            """CREATE TABLE akka_projection_offset_store (
  projection_name VARCHAR(255) NOT NULL, projection_key VARCHAR(255) NOT NULL,
  current_offset VARCHAR(255) NOT NULL, manifest VARCHAR(32) NOT NULL, mergeable BOOLEAN NOT NULL,
  last_updated BIGINT NOT NULL, PRIMARY KEY (projection_name, projection_key))""",
            f"""CREATE TABLE akka_projection_timestamp_offset_store (
  projection_name VARCHAR(255) NOT NULL, projection_key VARCHAR(255) NOT NULL, slice INT NOT NULL,
  persistence_id VARCHAR(255) NOT NULL, seq_nr BIGINT NOT NULL,
  timestamp_offset timestamp with time zone NOT NULL, timestamp_consumed timestamp with time zone NOT NULL,
  PRIMARY KEY (slice{asc}, projection_name{asc}, timestamp_offset{asc}, persistence_id{asc}, seq_nr{asc})){split}""",
            """CREATE TABLE akka_projection_management (
  projection_name VARCHAR(255) NOT NULL, projection_key VARCHAR(255) NOT NULL, paused BOOLEAN NOT NULL,
  last_updated BIGINT NOT NULL, PRIMARY KEY (projection_name, projection_key))""",
        ]
    return statements


def runnable_on_postgres(statement: str) -> str:
    """A Yugabyte statement with its Yugabyte-only clauses dropped (key ``HASH``/``ASC``, ``SPLIT AT``)."""
    statement = re.sub(r"\s*SPLIT AT VALUES \(.*\)\s*$", "", statement, flags=re.S)
    return re.sub(r"PRIMARY KEY \(([^)]*)\)", lambda m: "PRIMARY KEY (" + re.sub(r" (HASH|ASC)", "", m.group(1)) + ")",
                  statement)


def create_akka_database(dsn: str, dialect: str = "postgres", **options: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in akka_ddl(dialect, **options):
            conn.execute(runnable_on_postgres(statement).encode())


def akka_table(pid: str, partitions: int) -> str:
    if partitions == 1:
        return "event_journal"
    return f"event_journal_{slice_for_persistence_id(pid) // (1024 // partitions)}"


def akka_insert(conn: psycopg.Connection, pid: str, seq_nr: int, ser_id: int, manifest: str, payload: bytes, *,
                partitions: int = 1, jsonb: bool = False, tags: list[str] | None = None) -> None:
    """One event as Akka's journal inserts it: the transaction's ``CURRENT_TIMESTAMP`` raised to 1 µs after the
    previous event of the persistence id, writer and adapter manifest set, JSONB bound from the JSON bytes."""
    table = akka_table(pid, partitions)
    value = "convert_from(%(payload)s, 'UTF8')::jsonb" if jsonb else "%(payload)s"
    conn.execute(
        f"INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, writer, adapter_manifest, event_ser_id, "
        "event_ser_manifest, event_payload, tags, meta_ser_id, meta_ser_manifest, meta_payload, db_timestamp) "
        f"VALUES (%(slice)s, %(et)s, %(pid)s::varchar, %(seq)s, 'akka-writer-1', '', %(ser_id)s, %(manifest)s, "
        f"{value}, %(tags)s, NULL, NULL, NULL, GREATEST(CURRENT_TIMESTAMP, "
        f"(SELECT db_timestamp + '1 microsecond'::interval FROM {table} "
        "WHERE persistence_id = %(pid)s::varchar AND seq_nr = %(prev)s)))",
        {"slice": slice_for_persistence_id(pid), "et": pid.partition("|")[0], "pid": pid, "seq": seq_nr,
         "ser_id": ser_id, "manifest": manifest, "payload": payload, "tags": tags, "prev": seq_nr - 1})


# -- queries as Akka's read journal runs them (same predicates, ordering and paging) -------------------

def akka_events_by_pid(conn: psycopg.Connection, table: str, pid: str, from_seq: int = 1, to_seq: int = 2**63 - 1,
                       limit: int = 1000) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, CURRENT_TIMESTAMP AS read_db_timestamp, "
        "event_ser_id, event_ser_manifest, event_payload, writer, adapter_manifest, meta_ser_id, meta_ser_manifest, "
        f"meta_payload, tags FROM {table} WHERE persistence_id = %s AND seq_nr >= %s AND seq_nr <= %s "
        "AND deleted = false ORDER BY seq_nr LIMIT %s", (pid, from_seq, to_seq, limit)).fetchall()


def akka_highest_seq_nr(conn: psycopg.Connection, table: str, pid: str) -> int:
    row = conn.execute(f"SELECT MAX(seq_nr) FROM {table} WHERE persistence_id = %s AND seq_nr >= %s",
                       (pid, 0)).fetchone()
    return int(row[0] or 0) if row else 0


def akka_events_by_slices(conn: psycopg.Connection, table: str, entity_type: str, min_slice: int, max_slice: int,
                          from_ts: datetime, limit: int = 5) -> list[tuple[Any, ...]]:
    """All rows after ``from_ts`` in pages of ``limit``, as Akka pages: the next page starts at the last row's
    timestamp (``>=``) and drops what it has seen at that timestamp (its ``seen`` map). As in Akka, more rows
    at one timestamp than ``limit`` would stall it (pgjournal's batch appends share one timestamp)."""
    slices = ", ".join(str(s) for s in range(min_slice, max_slice + 1))
    out: list[tuple[Any, ...]] = []
    seen: dict[str, int] = {}
    while True:
        rows = conn.execute(
            "SELECT slice, persistence_id, seq_nr, db_timestamp, CURRENT_TIMESTAMP AS read_db_timestamp, tags, "
            f"event_ser_id, event_ser_manifest, event_payload FROM {table} WHERE entity_type = %s "
            f"AND slice IN ({slices}) AND db_timestamp >= %s AND db_timestamp < CURRENT_TIMESTAMP - interval "
            "'100 milliseconds' AND deleted = false ORDER BY db_timestamp, seq_nr LIMIT %s",
            (entity_type, from_ts, limit)).fetchall()
        fresh = [r for r in rows if not (r[3] == from_ts and seen.get(r[1], 0) >= r[2])]
        if not fresh:
            return out
        out += fresh
        last = fresh[-1][3]
        if last != from_ts:
            seen = {}
        from_ts = last
        for r in fresh:
            if r[3] == last:
                seen[r[1]] = r[2]


def akka_offsets_per_slice(conn: psycopg.Connection, name: str, min_slice: int, max_slice: int
                           ) -> dict[int, tuple[datetime, dict[str, int]]]:
    """Akka Projection's start: per slice, the latest timestamp_offset and the pids (seq_nr) seen at it."""
    rows = conn.execute(
        "SELECT slice, persistence_id, seq_nr, timestamp_offset FROM akka_projection_timestamp_offset_store "
        "WHERE slice BETWEEN %s AND %s AND projection_name = %s", (min_slice, max_slice, name)).fetchall()
    latest: dict[int, tuple[datetime, dict[str, int]]] = {}
    for slice_, pid, seq, ts in rows:
        current = latest.get(slice_)
        if current is None or ts > current[0]:
            latest[slice_] = (ts, {pid: seq})
        elif ts == current[0]:
            current[1][pid] = max(seq, current[1].get(pid, 0))
    return latest
