"""SQL of the replicator at a location (docs/replication.md, section 4): the per-persistence-id lock that
serializes the streams from different peers into one replica, the ``replication_seen`` rows (the highest origin
sequence number held per origin) and the replica's last event with its metadata.

Every statement runs in the transaction that appends the replicated events and stores the stream's offsets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pgjournal.store import Query, Read, rows, scalars, tables

SEEN_TABLE = tables.REPLICATION_SEEN
#: The first key of the replicator's two-key advisory locks (``pg_advisory_xact_lock(int, int)``), so they never
#: meet the one-key locks other code takes; the second is the persistence id's hash. Two persistence ids with one
#: hash only wait for each other.
LOCK_CLASS = 0x7265706C  # "repl"


@dataclass(frozen=True, slots=True)
class SeenRow:
    """:func:`seen`: the highest origin sequence number a replica holds from one origin."""

    persistence_id: str
    origin_replica: str
    origin_seq_nr: int


@dataclass(frozen=True, slots=True)
class LastEvent:
    """:func:`last_event`: a persistence id's highest event and its metadata columns."""

    seq_nr: int
    meta_ser_id: int | None
    meta_ser_manifest: str | None
    meta_payload: bytes | None


LOCK_SQL = f"""
SELECT count(pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p)))
FROM (SELECT p FROM unnest(%(pids)s::text[]) AS u(p) ORDER BY p) AS sorted"""
SEEN_SQL = f"""
SELECT persistence_id, origin_replica, origin_seq_nr FROM {SEEN_TABLE}
WHERE persistence_id = ANY(%(pids)s::text[])"""
RECORD_SEEN_SQL = f"""
INSERT INTO {SEEN_TABLE} (persistence_id, origin_replica, origin_seq_nr)
SELECT %(pid)s, u.origin, u.seq FROM unnest(%(origins)s::text[], %(seqs)s::bigint[]) AS u(origin, seq)
ON CONFLICT (persistence_id, origin_replica)
DO UPDATE SET origin_seq_nr = GREATEST({SEEN_TABLE}.origin_seq_nr, EXCLUDED.origin_seq_nr)"""
LAST_EVENT_SQL = """
SELECT seq_nr, meta_ser_id, meta_ser_manifest, meta_payload FROM {table}
WHERE persistence_id = %(pid)s AND slice = %(slice)s ORDER BY seq_nr DESC LIMIT 1"""
RECENT_SQL = f"""
SELECT count(*) FROM {tables.EVENT_JOURNAL}
WHERE slice BETWEEN 0 AND 1023 AND entity_type = %(entity_type)s AND db_timestamp > %(since)s AND writer = %(writer)s"""


def lock(pids: Sequence[str]) -> Query:
    """Lock the replicas ``pids`` until the transaction ends, in one order (so two batches never deadlock)."""
    return LOCK_SQL, {"pids": sorted(set(pids))}


def seen(pids: Sequence[str]) -> Read[SeenRow]:
    """The seen rows of the replicas ``pids``."""
    return rows(SeenRow, SEEN_SQL, {"pids": list(pids)})


def record_seen(pid: str, highest: Mapping[str, int]) -> Query:
    """Raise the seen rows of ``pid`` to ``highest`` (origin replica to origin sequence number); never lowers."""
    return RECORD_SEEN_SQL, {"pid": pid, "origins": list(highest), "seqs": list(highest.values())}


def last_event(table: str, pid: str, slice_: int) -> Read[LastEvent]:
    """The highest event of ``pid`` in ``table`` (the dialect's table of its slice), with its metadata columns."""
    return rows(LastEvent, LAST_EVENT_SQL.format(table=table), {"pid": pid, "slice": slice_})


def recent(entity_type: str, writer: str, since: datetime) -> Read[int]:
    """How many events of ``entity_type`` ``writer`` appended after ``since`` (a replicator's rate)."""
    return scalars(RECENT_SQL, {"entity_type": entity_type, "writer": writer, "since": since})
