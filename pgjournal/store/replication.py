"""SQL of the replicator at a location (docs/replication.md, section 4): the per-persistence-id lock that
serializes the streams from different peers into one replica, the ``replication_seen`` rows (the highest origin
sequence number held per origin) and the replica's last event with its metadata.

Every statement runs in the transaction that appends the replicated events and stores the stream's offsets, but
the two of the deferred cleanup (section 7): :func:`peer_offsets`, read at a peer (its reader role is enough), and
:func:`replicated_up_to`, here.
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
    """:func:`last_event`, :func:`last_events`: a persistence id's highest event and its metadata columns."""

    persistence_id: str
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
SELECT u.pid, u.origin, u.seq FROM unnest(%(pids)s::text[], %(origins)s::text[], %(seqs)s::bigint[])
    AS u(pid, origin, seq)
ON CONFLICT (persistence_id, origin_replica)
DO UPDATE SET origin_seq_nr = GREATEST({SEEN_TABLE}.origin_seq_nr, EXCLUDED.origin_seq_nr)"""
LAST_EVENT_SQL = """
SELECT persistence_id, seq_nr, meta_ser_id, meta_ser_manifest, meta_payload FROM {table}
WHERE persistence_id = %(pid)s AND slice = %(slice)s ORDER BY seq_nr DESC LIMIT 1"""
LAST_EVENTS_SQL = """
SELECT u.pid, e.seq_nr, e.meta_ser_id, e.meta_ser_manifest, e.meta_payload
FROM unnest(%(pids)s::text[], %(slices)s::int[]) AS u(pid, slice)
CROSS JOIN LATERAL (SELECT seq_nr, meta_ser_id, meta_ser_manifest, meta_payload FROM {table}
                    WHERE persistence_id = u.pid AND slice = u.slice ORDER BY seq_nr DESC LIMIT 1) AS e"""
RECENT_SQL = f"""
SELECT count(*) FROM {tables.EVENT_JOURNAL}
WHERE slice BETWEEN 0 AND 1023 AND entity_type = %(entity_type)s AND db_timestamp > %(since)s AND writer = %(writer)s"""


# At a peer: per persistence id of this location, what the peer's stream from here has stored in that slice (its
# latest offset) and for that persistence id (the highest seq_nr among the rows the offset window still keeps).
PEER_OFFSETS_SQL = """
SELECT u.pid,
       (SELECT max(o.seq_nr) FROM {table} AS o
        WHERE o.projection_name = u.name AND o.slice = u.slice AND o.persistence_id = u.pid),
       (SELECT max(o.timestamp_offset) FROM {table} AS o WHERE o.projection_name = u.name AND o.slice = u.slice)
FROM unnest(%(pids)s::text[], %(names)s::text[], %(slices)s::int[]) AS u(pid, name, slice)"""
# Here: per persistence id, the highest seq_nr a peer's stream has processed (every event up to it is older than
# its slice's offset, or covered by the persistence id's own offset row) and the persistence id's highest.
REPLICATED_UP_TO_SQL = f"""
SELECT u.pid,
       GREATEST(u.seq, COALESCE(
           (SELECT min(e.seq_nr) - 1 FROM {tables.EVENT_JOURNAL} AS e
            WHERE e.persistence_id = u.pid AND e.slice = u.slice AND e.db_timestamp >= u.latest),
           (SELECT max(e.seq_nr) FROM {tables.EVENT_JOURNAL} AS e
            WHERE e.persistence_id = u.pid AND e.slice = u.slice AND u.latest IS NOT NULL),
           0)),
       (SELECT max(e.seq_nr) FROM {tables.EVENT_JOURNAL} AS e WHERE e.persistence_id = u.pid AND e.slice = u.slice)
FROM unnest(%(pids)s::text[], %(slices)s::int[], %(seqs)s::bigint[], %(latests)s::timestamptz[])
    AS u(pid, slice, seq, latest)"""


@dataclass(frozen=True, slots=True)
class PeerOffset:
    """:func:`peer_offsets`: a peer's stream's offsets for one persistence id of this location (``None``: none)."""

    persistence_id: str
    seq_nr: int | None
    latest: datetime | None


@dataclass(frozen=True, slots=True)
class ReplicatedUpTo:
    """:func:`replicated_up_to`: the highest seq_nr of a persistence id a peer has processed, and its highest."""

    persistence_id: str
    seq_nr: int
    highest: int | None


def peer_offsets(offset_table: str, pids: Sequence[str], names: Sequence[str], slices: Sequence[int]
                 ) -> Read[PeerOffset]:
    """At a peer: its offsets for ``pids`` (each with the stream name it is read under and its slice)."""
    return rows(PeerOffset, PEER_OFFSETS_SQL.format(table=offset_table),
                {"pids": list(pids), "names": list(names), "slices": list(slices)})


def replicated_up_to(offsets: Sequence[PeerOffset], slices: Sequence[int]) -> Read[ReplicatedUpTo]:
    """Here: from a peer's ``offsets`` (with each persistence id's slice), how far it has processed each."""
    return rows(ReplicatedUpTo, REPLICATED_UP_TO_SQL, {
        "pids": [o.persistence_id for o in offsets], "slices": list(slices),
        "seqs": [o.seq_nr for o in offsets], "latests": [o.latest for o in offsets]})


def lock(pids: Sequence[str]) -> Query:
    """Lock the replicas ``pids`` until the transaction ends, in one order (so two batches never deadlock)."""
    return LOCK_SQL, {"pids": sorted(set(pids))}


def seen(pids: Sequence[str]) -> Read[SeenRow]:
    """The seen rows of the replicas ``pids``."""
    return rows(SeenRow, SEEN_SQL, {"pids": list(pids)})


def record_seen(highest: Mapping[str, Mapping[str, int]]) -> Query:
    """Raise the seen rows of each persistence id to its ``highest`` (origin replica to origin sequence number);
    never lowers."""
    pairs = [(pid, origin, seq) for pid, of_pid in highest.items() for origin, seq in of_pid.items()]
    return RECORD_SEEN_SQL, {"pids": [p[0] for p in pairs], "origins": [p[1] for p in pairs],
                             "seqs": [p[2] for p in pairs]}


def last_event(table: str, pid: str, slice_: int) -> Read[LastEvent]:
    """The highest event of ``pid`` in ``table`` (the dialect's table of its slice), with its metadata columns."""
    return rows(LastEvent, LAST_EVENT_SQL.format(table=table), {"pid": pid, "slice": slice_})


def last_events(table: str, pids: Sequence[str], slices: Sequence[int]) -> Read[LastEvent]:
    """:func:`last_event` of each of ``pids`` (of ``slices``, all in ``table``) in one statement; a persistence id
    with no event has no row."""
    return rows(LastEvent, LAST_EVENTS_SQL.format(table=table), {"pids": list(pids), "slices": list(slices)})


def recent(entity_type: str, writer: str, since: datetime) -> Read[int]:
    """How many events of ``entity_type`` ``writer`` appended after ``since`` (a replicator's rate)."""
    return scalars(RECENT_SQL, {"entity_type": entity_type, "writer": writer, "since": since})


# -- Recovery from the peers (docs/replication.md, section 8) -----------------------------------------------------
#: The persistence id of the row of ``replication_seen`` that marks a replica recovering (no persistence id is
#: empty): ``('', replica, 0)``, written before a recovery starts and deleted when it ends, so a crash leaves it.
#: A write reads it in its own transaction; the recovery, once it is in, waits for every transaction in progress,
#: so that a write that read it before it was in has ended before the recovery reads anything.
RECOVERING_PID = ""
IS_RECOVERING_SQL = f"""
SELECT EXISTS (SELECT 1 FROM {SEEN_TABLE} WHERE persistence_id = %(marker)s AND origin_replica = %(replica)s)"""
MARK_RECOVERING_SQL = f"""
INSERT INTO {SEEN_TABLE} (persistence_id, origin_replica, origin_seq_nr) VALUES (%(marker)s, %(replica)s, 0)
ON CONFLICT (persistence_id, origin_replica) DO NOTHING"""
UNMARK_RECOVERING_SQL = f"""
DELETE FROM {SEEN_TABLE} WHERE persistence_id = %(marker)s AND origin_replica = %(replica)s"""
# Every transaction holds a lock on its own virtual transaction id until it ends (what CREATE INDEX CONCURRENTLY
# waits on): the transactions in progress now, and which of them are still in progress.
IN_PROGRESS_SQL = """
SELECT coalesce(array_agg(virtualxid), '{}') FROM pg_locks
WHERE locktype = 'virtualxid' AND granted AND pid <> pg_backend_pid()"""
STILL_IN_PROGRESS_SQL = """
SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY(%(ids)s::text[])"""
SEEN_FROM_SQL = f"""
SELECT persistence_id, origin_replica, origin_seq_nr FROM {SEEN_TABLE}
WHERE origin_replica = %(origin)s AND starts_with(persistence_id, %(prefix)s)"""
REPLICA_ROWS_SQL = """
SELECT seq_nr, event_ser_id, event_ser_manifest, event_payload, meta_ser_id, meta_ser_manifest, meta_payload, tags
FROM {table} WHERE persistence_id = %(pid)s AND slice = %(slice)s AND seq_nr > %(after)s AND NOT deleted
ORDER BY seq_nr LIMIT %(limit)s"""
STREAM_HIGHEST_SQL = f"""
SELECT persistence_id, max(seq_nr) AS seq_nr FROM {tables.PROJECTION_TIMESTAMP_OFFSET_STORE}
WHERE projection_name = %(name)s AND starts_with(persistence_id, %(prefix)s) GROUP BY persistence_id"""


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """:func:`replica_rows`: one event of a replica as stored, payload and metadata undecoded."""

    seq_nr: int
    ser_id: int
    manifest: str
    payload: bytes
    meta_ser_id: int | None
    meta_ser_manifest: str | None
    meta_payload: bytes | None
    tags: list[str] | None


@dataclass(frozen=True, slots=True)
class HighestRow:
    """:func:`stream_highest`: the highest sequence number a stream's offsets record for a persistence id."""

    persistence_id: str
    seq_nr: int


def is_recovering(replica: str) -> Read[bool]:
    """Whether ``replica`` is marked recovering."""
    return scalars(IS_RECOVERING_SQL, {"marker": RECOVERING_PID, "replica": replica})


def mark_recovering(replica: str) -> Query:
    """Mark ``replica`` recovering (then wait for the transactions in progress: :func:`in_progress`)."""
    return MARK_RECOVERING_SQL, {"marker": RECOVERING_PID, "replica": replica}


def in_progress() -> Read[list[str]]:
    """The virtual transaction ids of every other transaction in progress on the server."""
    return scalars(IN_PROGRESS_SQL)


def still_in_progress(ids: Sequence[str]) -> Read[int]:
    """How many of the transactions ``ids`` (:func:`in_progress`) have not ended."""
    return scalars(STILL_IN_PROGRESS_SQL, {"ids": list(ids)})


def unmark_recovering(replica: str) -> Query:
    return UNMARK_RECOVERING_SQL, {"marker": RECOVERING_PID, "replica": replica}


def seen_from(origin: str, entity_type: str) -> Read[SeenRow]:
    """The seen rows of every replica of ``entity_type`` here for events of ``origin`` (read at a peer)."""
    return rows(SeenRow, SEEN_FROM_SQL, {"origin": origin, "prefix": f"{entity_type}|"})


def replica_rows(table: str, pid: str, slice_: int, after: int, limit: int) -> Read[ReplicaRow]:
    """A page of ``pid``'s events after ``after`` in ``table`` (its slice's), as stored."""
    return rows(ReplicaRow, REPLICA_ROWS_SQL.format(table=table),
                {"pid": pid, "slice": slice_, "after": after, "limit": limit})


def stream_highest(name: str, entity_type: str) -> Read[HighestRow]:
    """Per persistence id of ``entity_type``, the highest sequence number the offsets of the stream (projection)
    ``name`` record (read at a peer: how far it has read this location's replicas)."""
    return rows(HighestRow, STREAM_HIGHEST_SQL, {"name": name, "prefix": f"{entity_type}|"})
