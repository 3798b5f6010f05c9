"""SQL of tagged appends: the append statement of :mod:`pgjournal.store.events` extended with data-modifying
CTEs that write the tag view rows and the tag write progress in the same statement (see
:mod:`pgjournal.tags.statement_writer` for the guarantee)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgjournal.model.timeuuid import UUID_EPOCH_OFFSET
from pgjournal.store import Query, Read, rows, scalars
from pgjournal.store.events import (
    BYTEA_PAYLOADS,
    INSERT,
    MANY_EVENTS,
    ONE_EVENT,
    PREVIOUS,
    TAGS_META,
    insert_sql,
    text_array,
)

# The event's TimeUUID is assembled in SQL from its ticks and this process's low bytes, because the ticks
# are raised above the persistence id's last ones (``tag_write_progress.ts_time``): with concurrent appends
# to one persistence id (``expected_seq_nr=None``), the writer's clock alone could give a later tag sequence
# number an earlier TimeUUID. So per (tag, persistence id), TimeUUID order is tag sequence order.
_UUID_TICKS = """(lpad(to_hex(u.ticks & 4294967295), 8, '0') || lpad(to_hex((u.ticks >> 32) & 65535), 4, '0')
        || lpad(to_hex(((u.ticks >> 48) & 4095) | 4096), 4, '0')"""
_UUID = _UUID_TICKS + " || '{lsb_hex}')::uuid"
_TAG_VIEW_INSERT = """INSERT INTO tag_views (tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id,
           tag_pid_sequence_nr, sequence_nr, writer_uuid, ser_id, ser_manifest, event_manifest, event, meta_ser_id,
           meta_ser_manifest, meta_payload)"""
_PROGRESS_INSERT = """INSERT INTO tag_write_progress (persistence_id, tag, sequence_nr, tag_pid_sequence_nr, "offset",
           ts_time)"""
_PROGRESS_UPDATE = """ON CONFLICT (persistence_id, tag) DO UPDATE SET sequence_nr = excluded.sequence_nr,
           tag_pid_sequence_nr = excluded.tag_pid_sequence_nr, "offset" = excluded."offset",
           ts_time = excluded.ts_time"""
# Any number of tags: one row per tag in ``t`` with its last tag sequence number and ticks.
_TAGGED = f"""
WITH prev AS ({{prev}}),
e AS (SELECT * FROM {{events}}),
ins AS ({{insert}}),
t AS (SELECT t.tag, COALESCE(p.tag_pid_sequence_nr, 0) AS base, COALESCE(p.ts_time, 0) AS last_time
      FROM unnest(%(tv_tags)s::text[]) AS t(tag)
      LEFT JOIN tag_write_progress p ON p.persistence_id = %(pid)s AND p.tag = t.tag),
s AS (SELECT GREATEST(%(tv_time)s::bigint, max(last_time) + 1) AS first_time FROM t),
u AS (SELECT e.ord, s.first_time + e.ord - 1 AS ticks FROM e CROSS JOIN s),
uu AS (SELECT u.ord, u.ticks, {{uuid}} AS stamp, (u.ticks - {{epoch}}) / 10000 AS ms FROM u),
tv AS ({_TAG_VIEW_INSERT}
       SELECT t.tag, uu.ms - mod(uu.ms, {{bucket_ms}}), uu.ticks, {{lsb}}, uu.stamp, %(pid)s, t.base + e.ord,
           prev.seq_nr + e.ord, %(writer)s, e.ser_id, e.manifest, '', e.payload, %(meta_ser_id)s, %(meta_manifest)s,
           %(meta_payload)s
       FROM prev CROSS JOIN e JOIN uu ON uu.ord = e.ord CROSS JOIN t),
progress AS ({_PROGRESS_INSERT}
       SELECT %(pid)s, t.tag, prev.seq_nr + %(tv_count)s, t.base + %(tv_count)s, uu.stamp, uu.ticks
       FROM prev CROSS JOIN t JOIN uu ON uu.ord = %(tv_count)s
       {_PROGRESS_UPDATE})
SELECT seq_nr, db_timestamp FROM ins"""
# One tag (the common case): the same rows with scalar lookups instead of joins over a tag list, which the
# server runs faster (``python -m bench tags-append-cpu``).
_ONE_TAG = f"""
WITH prev AS ({{prev}}),
e AS (SELECT * FROM {{events}}),
ins AS ({{insert}}),
p AS (SELECT tag_pid_sequence_nr, ts_time FROM tag_write_progress WHERE persistence_id = %(pid)s AND tag = %(tv_tag)s),
u AS (SELECT e.*, COALESCE((SELECT tag_pid_sequence_nr FROM p), 0) + e.ord AS tag_seq_nr,
             GREATEST(%(tv_time)s::bigint, (SELECT ts_time FROM p) + 1) + e.ord - 1 AS ticks FROM e),
uu AS (SELECT u.*, {{uuid}} AS stamp, (u.ticks - {{epoch}}) / 10000 AS ms FROM u),
tv AS ({_TAG_VIEW_INSERT}
       SELECT %(tv_tag)s, uu.ms - mod(uu.ms, {{bucket_ms}}), uu.ticks, {{lsb}}, uu.stamp, %(pid)s, uu.tag_seq_nr,
           prev.seq_nr + uu.ord, %(writer)s, uu.ser_id, uu.manifest, '', uu.payload, %(meta_ser_id)s, %(meta_manifest)s,
           %(meta_payload)s
       FROM prev CROSS JOIN uu),
progress AS ({_PROGRESS_INSERT}
       SELECT %(pid)s, %(tv_tag)s, prev.seq_nr + uu.ord, uu.tag_seq_nr, uu.stamp, uu.ticks
       FROM prev CROSS JOIN uu WHERE uu.ord = %(tv_count)s
       {_PROGRESS_UPDATE})
SELECT seq_nr, db_timestamp FROM ins"""


# One event with one tag (the common tagged append): the journal's own single-event INSERT (its ``RETURNING``
# feeds the tag row and the progress, so neither is written when it inserts nothing) and one aggregate read of
# the progress (always one row), with the event's values taken from the parameters rather than from CTE scans:
# fewer plan nodes and parameters for the server to bind and run on every append (``python -m bench.tag_waits``).
_ONE_EVENT_ONE_TAG = f"""
WITH ins AS ({{insert}}),
p AS (SELECT COALESCE(max(tag_pid_sequence_nr), 0) + 1 AS tag_seq_nr,
             GREATEST(%(tv_time)s::bigint, max(ts_time) + 1) AS ticks
      FROM tag_write_progress WHERE persistence_id = %(pid)s AND tag = %(tv_tag)s),
u AS (SELECT u.tag_seq_nr, u.ticks, {{uuid}} AS stamp, (u.ticks - {{epoch}}) / 10000 AS ms FROM p AS u),
tv AS ({_TAG_VIEW_INSERT}
       SELECT %(tv_tag)s, u.ms - mod(u.ms, {{bucket_ms}}), u.ticks, {{lsb}}, u.stamp, %(pid)s, u.tag_seq_nr, ins.seq_nr,
           %(writer)s, %(ser_id)s, %(manifest)s, '', %(payload)s::bytea, {{meta}}
       FROM ins CROSS JOIN u),
progress AS ({_PROGRESS_INSERT}
       SELECT %(pid)s, %(tv_tag)s, ins.seq_nr, u.tag_seq_nr, u.stamp, u.ticks FROM ins CROSS JOIN u
       {_PROGRESS_UPDATE})
SELECT seq_nr, db_timestamp FROM ins"""
_NO_META = "NULL::int, NULL::text, NULL::bytea"
_META_VALUES = "%(meta_ser_id)s, %(meta_manifest)s, %(meta_payload)s::bytea"


@functools.cache
def one_tagged_event_sql(table: str, *, after: str, meta: bool, bucket_ms: int, lsb: int, lsb_bytes: int,
                         payload: str = BYTEA_PAYLOADS["payload"],
                         meta_payload: str = BYTEA_PAYLOADS["meta_payload"]) -> str:
    """The append statement of one event with one tag (``tv_tag``) for ``table``: the same rows as
    :func:`tagged_insert_sql` (``meta``: the event has metadata, parameters ``meta_*``)."""
    insert = insert_sql(table, single=True, after=after, payload=payload, meta_payload=meta_payload, tags=True,
                        meta=meta).strip()
    return _ONE_EVENT_ONE_TAG.format(insert=insert, uuid=_UUID.format(lsb_hex=f"{lsb_bytes:016x}"),
                                     epoch=UUID_EPOCH_OFFSET, bucket_ms=int(bucket_ms), lsb=int(lsb),
                                     meta=_META_VALUES if meta else _NO_META)


@functools.cache
def tagged_insert_sql(table: str, *, after_latest: bool = False, single: bool, one_tag: bool, bucket_ms: int,
                      lsb: int, lsb_bytes: int, payload: str = BYTEA_PAYLOADS["payload"],
                      meta_payload: str = BYTEA_PAYLOADS["meta_payload"], after: str | None = None) -> str:
    """The append statement for ``table`` with the tag view rows and progress in the same statement
    (``one_tag``: the statement for exactly one tag, ``tv_tag``; else ``tv_tags``, an array). The bucket
    size and this process's TimeUUID low bytes are written into the text: fewer parameters to send."""
    prev = PREVIOUS[after or ("latest" if after_latest else "expected")].format(table=table)
    insert = INSERT.format(table=table, prev="SELECT * FROM prev", events="e", payload=payload,
                           **{k: v.format(meta_payload=meta_payload) for k, v in TAGS_META.items()}).strip()
    return (_ONE_TAG if one_tag else _TAGGED).format(
        prev=prev, events=ONE_EVENT if single else MANY_EVENTS, insert=insert,
        uuid=_UUID.format(lsb_hex=f"{lsb_bytes:016x}"), epoch=UUID_EPOCH_OFFSET, bucket_ms=int(bucket_ms), lsb=int(lsb))



# -- the batched tag writer (the default, pgjournal.write.tag_batcher) -------------------------------------
# A tagged append writes its event alone; these statements write its tag view rows later, from the journal,
# so whoever writes them (the appending process, another process flushing the same persistence id, the
# recovery of a writer that died) writes the same rows:
# * per (persistence id, tag), the tagged events after ``tag_write_progress.sequence_nr`` in sequence order
#   get the next tag sequence numbers (a persistence id's committed events are always a contiguous prefix:
#   an append numbers after a committed predecessor, so no event can appear below one already written);
# * the TimeUUID's ticks are the event's db_timestamp (µs × 10), raised to one above the previous row of the
#   (tag, persistence id) when needed (``ts_time`` of the progress, then row by row: events of one append
#   share a db_timestamp), so TimeUUID order is tag sequence order; its low bytes are a hash of the
#   persistence id (:func:`pgjournal.write.tag_batch.pid_lsb`), passed in with it;
# * the progress only moves forward, and rows are written only after it: a second writer of the same pair
#   reads the first's progress, or (both read the same one) its rows collide with the first's on the primary key
#   and its statement fails whole with a unique violation (23505), which the writer retries: it then reads the
#   new progress. (``ON CONFLICT DO NOTHING`` made every row a speculative insertion, dearer per row.)
# ``mark`` records, in the same statement, how far this writer's tag rows are complete (readers wait for it).

# The TimeUUID's high 8 bytes (time_low, time_mid, version 1 and time_hi) as 16 hex digits, from ``r.ticks``:
# one integer expression instead of three padded hex strings (cheaper per row than building the text form).
_UUID_HIGH = """(encode(int8send(((r.ticks & 4294967295) << 32) | (((r.ticks >> 32) & 65535) << 16)
           | ((r.ticks >> 48) & 4095) | 4096), 'hex')"""
#: The batched writers' row: upsert (a writer that was presumed dead and recovered comes back with it).
_MARK = """INSERT INTO tag_batch_writers (id, writer, entity_types, complete_before, heartbeat)
       SELECT %(id)s, %(writer)s, %(types)s::text[], LEAST(COALESCE(%(bound)s::timestamptz, clock_timestamp()),
           {incomplete}clock_timestamp()), clock_timestamp()
       ON CONFLICT (id) DO UPDATE SET writer = excluded.writer, entity_types = excluded.entity_types,
           complete_before = excluded.complete_before, heartbeat = excluded.heartbeat
       RETURNING heartbeat"""
# Pairs that wrote ``limit`` rows may have more: their ``since`` still bounds the watermark.
_INCOMPLETE = """COALESCE((SELECT min(w.since) FROM w JOIN (SELECT pid, tag, count(*) AS n FROM u GROUP BY pid, tag)
           AS c ON c.pid = w.pid AND c.tag = w.tag WHERE c.n >= %(limit)s), clock_timestamp()), """
_BATCH = f"""
WITH w AS (
    SELECT w.pid, w.slice, w.tag, w.upto, w.since, w.lsb, w.lsb_hex, COALESCE(p.sequence_nr, 0) AS after_seq,
           COALESCE(p.tag_pid_sequence_nr, 0) AS base, COALESCE(p.ts_time, 0) AS last_time
    FROM unnest(%(pids)s::text[], %(slices)s::int[], %(tags)s::text[], %(uptos)s::bigint[],
                %(sinces)s::timestamptz[], %(lsbs)s::bigint[], %(lsb_hex)s::text[])
         AS w(pid, slice, tag, upto, since, lsb, lsb_hex)
    LEFT JOIN tag_write_progress AS p ON p.persistence_id = w.pid AND p.tag = w.tag),
ev AS (
    SELECT w.pid, w.tag, w.lsb, w.lsb_hex, w.base, w.last_time, e.*,
           row_number() OVER (PARTITION BY w.pid, w.tag ORDER BY e.seq_nr) AS i
    FROM w CROSS JOIN LATERAL (
        SELECT e.seq_nr, e.writer, e.event_ser_id, e.event_ser_manifest, {{payload}} AS payload, e.meta_ser_id,
               e.meta_ser_manifest, {{meta_payload}} AS meta,
               (extract(epoch FROM e.db_timestamp) * 1000000)::bigint * 10 + {{epoch}} AS d
        FROM {{table}} AS e
        WHERE e.persistence_id = w.pid AND e.slice = w.slice AND e.seq_nr > w.after_seq AND e.seq_nr <= w.upto
          AND w.tag = ANY(e.tags)
        ORDER BY e.seq_nr LIMIT %(limit)s) AS e),
r AS (
    SELECT ev.*, ev.base + ev.i AS tag_seq,
           ev.i + GREATEST(ev.last_time, max(ev.d - ev.i) OVER (PARTITION BY ev.pid, ev.tag ORDER BY ev.seq_nr))
               AS ticks
    FROM ev),
u AS (SELECT r.*, {_UUID_HIGH} || r.lsb_hex)::uuid AS stamp,
           (r.ticks - {{epoch}}) / 10000 AS ms
    FROM r),
tv AS ({_TAG_VIEW_INSERT}
       SELECT u.tag, u.ms - mod(u.ms, {{bucket_ms}}), u.ticks, u.lsb, u.stamp, u.pid, u.tag_seq, u.seq_nr, u.writer,
           u.event_ser_id, u.event_ser_manifest, '', u.payload, u.meta_ser_id, u.meta_ser_manifest, u.meta
       FROM u),
progress AS ({_PROGRESS_INSERT}
       SELECT DISTINCT ON (u.pid, u.tag) u.pid, u.tag, u.seq_nr, u.tag_seq, u.stamp, u.ticks FROM u
       ORDER BY u.pid, u.tag, u.seq_nr DESC
       {_PROGRESS_UPDATE} WHERE tag_write_progress.sequence_nr < excluded.sequence_nr),
mark AS ({{mark}})
SELECT m.heartbeat, c.pid, c.tag, c.n
FROM mark AS m LEFT JOIN (SELECT pid, tag, count(*)::int AS n FROM u GROUP BY pid, tag) AS c ON true"""
#: Effectively no upper bound on the sequence numbers a pair writes (a recovery: all there is).
NO_UPTO = 2**63 - 1


@dataclass(frozen=True, slots=True)
class BatchPair:
    """One (persistence id, tag) of a batched write: its tagged events after the progress, up to ``upto``
    (:data:`NO_UPTO`: all), at most ``limit`` per statement. ``since`` (None: not this writer's) bounds the
    writer's watermark while the pair may not be complete; ``lsb``/``lsb_hex``: the TimeUUID low bytes."""

    pid: str
    slice: int
    tag: str
    upto: int
    since: Any
    lsb: int
    lsb_hex: str


@functools.cache
def batch_sql(table: str, *, bucket_ms: int, jsonb: frozenset[str] = frozenset(), pairs: bool = True) -> str:
    """The batched writer's statement: the tag view rows and progress of the pairs (``pairs``; without: only
    the writer's row, a heartbeat) and the writer's row. ``table``: the journal table to read (all slices);
    ``jsonb``: its payload columns that are JSONB (read as their JSON bytes)."""
    if not pairs:
        return _MARK.format(incomplete="")
    payload, meta = (f"convert_to(e.{c}::text, 'UTF8')" if c in jsonb else f"e.{c}"
                     for c in ("event_payload", "meta_payload"))
    return _BATCH.format(table=table, bucket_ms=int(bucket_ms), epoch=UUID_EPOCH_OFFSET, payload=payload,
                         meta_payload=meta, mark=_MARK.format(incomplete=_INCOMPLETE))


def batch_params(writer_key: str, writer: str, entity_types: list[str], bound: Any, pairs: list[BatchPair],
                 limit: int) -> dict[str, Any]:
    """Parameters of :func:`batch_sql`: the writer's key, ``event_journal.writer`` and entity types, the bound
    of its watermark from what is pending outside ``pairs`` (None: none), the pairs, rows per pair at most."""
    return {"id": writer_key, "writer": writer, "types": text_array(entity_types), "bound": bound, "limit": limit,
            "pids": [p.pid for p in pairs], "slices": [p.slice for p in pairs], "tags": [p.tag for p in pairs],
            "uptos": [p.upto for p in pairs], "sinces": [p.since for p in pairs], "lsbs": [p.lsb for p in pairs],
            "lsb_hex": [p.lsb_hex for p in pairs]}


@dataclass(frozen=True, slots=True)
class BatchWriter:
    """A row of ``tag_batch_writers``, with the database clock of the reading (``now``)."""

    id: str
    writer: str
    entity_types: list[str]
    complete_before: datetime
    heartbeat: datetime
    now: datetime


def batch_writers(silent_for: float | None = None) -> Read[BatchWriter]:
    """The batched writers' rows (``silent_for``: only those whose heartbeat is older than that, seconds)."""
    where = "" if silent_for is None else " WHERE heartbeat < clock_timestamp() - %s * interval '1 second'"
    return rows(BatchWriter, "SELECT id, writer, entity_types, complete_before, heartbeat, clock_timestamp() "
                             f"FROM tag_batch_writers{where} ORDER BY heartbeat",
                (silent_for,) if silent_for is not None else ())


def claim_batch_writer(key: str, heartbeat: datetime) -> Read[datetime]:
    """Take over a silent writer's row (one row: the new heartbeat; none when another process was first or
    the writer came back), so others leave it alone while its tag rows are recovered."""
    return scalars("UPDATE tag_batch_writers SET heartbeat = clock_timestamp() WHERE id = %s AND heartbeat = %s "
                   "RETURNING heartbeat", (key, heartbeat))


def drop_batch_writer(key: str, heartbeat: datetime | None = None) -> Query:
    """Remove a writer's row (``heartbeat``: only if it is still the one read when it was claimed)."""
    if heartbeat is None:
        return "DELETE FROM tag_batch_writers WHERE id = %s", (key,)
    return "DELETE FROM tag_batch_writers WHERE id = %s AND heartbeat = %s", (key, heartbeat)


@dataclass(frozen=True, slots=True)
class TaggedSince:
    """A persistence id with tagged events a writer appended since a time, and their tags."""

    persistence_id: str
    slice: int
    tags: list[str]


def tagged_since(writer: str, entity_types: list[str], since: datetime) -> Read[TaggedSince]:
    """The persistence ids ``writer`` appended tagged events to at or after ``since`` (the journal's slice
    index: entity type, then time), with the tags of those events."""
    return rows(TaggedSince, """
SELECT e.persistence_id, e.slice, array_agg(DISTINCT t.tag ORDER BY t.tag)
FROM event_journal AS e CROSS JOIN LATERAL unnest(e.tags) AS t(tag)
WHERE e.entity_type = ANY(%s) AND e.db_timestamp >= %s AND e.writer = %s
GROUP BY e.persistence_id, e.slice ORDER BY e.persistence_id""", (entity_types, since, writer))


def unrecorded_writer() -> Read[str]:
    """For a database that records no tag writer: ``in-statement`` when tag rows exist and no batched writer has
    a row (versions that recorded nothing wrote them, their default was in-statement), else ``batched``."""
    return scalars("SELECT CASE WHEN EXISTS (SELECT 1 FROM tag_write_progress) AND NOT EXISTS "
                   "(SELECT 1 FROM tag_batch_writers) THEN 'in-statement' ELSE 'batched' END", ())


@dataclass(frozen=True, slots=True)
class Watermark:
    """How far every batched writer's tag rows are complete (None: no batched writer), and the writers that
    stopped heartbeating ``silent_for`` ago (readers wait for them: they name them)."""

    complete_before: datetime | None
    silent: list[str] | None


def clock() -> Read[datetime]:
    return scalars("SELECT clock_timestamp()", ())


def writers_past(moment: datetime, excluding: str | None = None) -> Read[bool]:
    """Whether every batched tag writer's watermark (but ``excluding``'s) is past ``moment`` (true without any)."""
    return scalars("SELECT COALESCE((SELECT min(complete_before) FROM tag_batch_writers WHERE id IS DISTINCT FROM %s)"
                   " > %s, true)", (excluding, moment))


def watermark(silent_for: float) -> Read[Watermark]:
    return rows(Watermark, "SELECT min(complete_before), array_agg(id || ' (writer ' || writer || ')' ORDER BY id) "
                           "FILTER (WHERE heartbeat < clock_timestamp() - %s * interval '1 second') "
                           "FROM tag_batch_writers", (silent_for,))

# -- reads of the tag view (events_by_tag, see pgjournal.query.by_tag) -----------------------------------
# Keys are (timebucket, ts_time, ts_lsb): Cassandra's TimeUUID order within the buckets.

#: The columns every read of a tag view row selects, in order.
TAG_COLUMNS = ("ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr, sequence_nr, ser_id, ser_manifest, event, "
               "meta_ser_id, meta_ser_manifest, meta_payload, writer_uuid")
PAGE = f"""
SELECT {TAG_COLUMNS} FROM tag_views
WHERE tag_name = %s AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s) AND timebucket <= %s AND ts_time <= %s
ORDER BY timebucket, ts_time, ts_lsb LIMIT %s"""
# Back tracking: keys only; the few rows the stream has not delivered are loaded by LOAD.
KEYS = """
SELECT ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr FROM tag_views
WHERE tag_name = %s AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s) AND (timebucket, ts_time, ts_lsb) <= (%s, %s, %s)
ORDER BY timebucket, ts_time, ts_lsb LIMIT %s"""
LOAD = f"""
SELECT {TAG_COLUMNS} FROM tag_views
WHERE tag_name = %s AND persistence_id = %s AND tag_pid_sequence_nr = ANY(%s)
  AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s)
ORDER BY tag_pid_sequence_nr"""
MISSING = f"""
SELECT {TAG_COLUMNS} FROM tag_views
WHERE tag_name = %s AND persistence_id = %s AND tag_pid_sequence_nr >= %s AND tag_pid_sequence_nr < %s
  AND (timebucket, ts_time, ts_lsb) > (%s, %s, %s)
ORDER BY tag_pid_sequence_nr"""
LOWEST_IN_BUCKET = """
SELECT persistence_id, min(tag_pid_sequence_nr) FROM tag_views
WHERE tag_name = %s AND timebucket = %s AND (ts_time, ts_lsb) > (%s, %s)
GROUP BY persistence_id"""

Key = tuple[int, int, int]
TagQuery = tuple[str, tuple[Any, ...]]


def page(tag: str, after: Key, last_bucket: int, last_ticks: int, limit: int) -> TagQuery:
    """Rows of :data:`TAG_COLUMNS` after ``after`` up to ``last_ticks`` (in bucket ``last_bucket`` at most)."""
    return PAGE, (tag, *after, last_bucket, last_ticks, limit)


def keys(tag: str, after: Key, up_to: Key, limit: int) -> TagQuery:
    """(ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr) after ``after`` up to ``up_to`` (inclusive)."""
    return KEYS, (tag, *after, *up_to, limit)


def load(tag: str, pid: str, numbers: list[int], after: Key) -> TagQuery:
    """Rows of :data:`TAG_COLUMNS`: the given tag sequence numbers of ``pid`` after ``after``."""
    return LOAD, (tag, pid, numbers, *after)


def missing(tag: str, pid: str, lowest: int, below: int, after: Key) -> TagQuery:
    """Rows of :data:`TAG_COLUMNS`: tag sequence numbers ``lowest .. below - 1`` of ``pid`` after ``after``."""
    return MISSING, (tag, pid, lowest, below, *after)


def lowest_in_bucket(tag: str, bucket: int, after: tuple[int, int]) -> TagQuery:
    """(persistence_id, lowest tag sequence number) of the rows of ``bucket`` after ``after`` (ticks, lsb)."""
    return LOWEST_IN_BUCKET, (tag, bucket, *after)


# -- tag view maintenance (pgjournal.tags.reconciliation: the Cassandra plugin's Reconciliation and Cleanup) ----

#: One tag view row as a rebuild writes it (``executemany``), in this order.
REBUILT_ROW = """INSERT INTO tag_views (tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id,
    tag_pid_sequence_nr, sequence_nr, writer_uuid, ser_id, ser_manifest, event, meta_ser_id, meta_ser_manifest,
    meta_payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"""
#: One progress row as a rebuild writes it (``executemany``): persistence id, tag, sequence number, tag
#: sequence number, TimeUUID, ticks.
REBUILT_PROGRESS = """INSERT INTO tag_write_progress (persistence_id, tag, sequence_nr, tag_pid_sequence_nr,
    "offset", ts_time) VALUES (%s, %s, %s, %s, %s, %s)"""
# A persistence id's tags come from its progress rows, so the (tag_name, persistence_id) index finds its rows.
_TAGGED_ROWS_OF = ("tag_name = ANY(ARRAY(SELECT tag FROM tag_write_progress WHERE persistence_id = %s)) "
                   "AND persistence_id = %s")


@dataclass(frozen=True, slots=True)
class TagCount:
    """A tag of the tag view: its events and persistence ids (from the write progress)."""

    tag: str
    events: int
    persistence_ids: int


def delete_view_of(pid: str, tags: list[str]) -> list[Query]:
    """Delete the persistence id's rows of ``tags`` and their progress (the first statement's rowcount: rows)."""
    return [("DELETE FROM tag_views WHERE tag_name = ANY(%s) AND persistence_id = %s", (tags, pid)),
            ("DELETE FROM tag_write_progress WHERE persistence_id = %s AND tag = ANY(%s)", (pid, tags))]


def record_scanned(pid: str, seq_nr: int) -> Query:
    """How far the journal of ``pid`` was scanned for tags (as the Cassandra plugin's ``tag_scanning``)."""
    return ("INSERT INTO tag_scanning (persistence_id, sequence_nr) VALUES (%s, %s) "
            "ON CONFLICT (persistence_id) DO UPDATE SET sequence_nr = excluded.sequence_nr", (pid, seq_nr))


def tag_counts() -> Read[TagCount]:
    return rows(TagCount, "SELECT tag, sum(tag_pid_sequence_nr)::bigint, count(*) FROM tag_write_progress "
                          "GROUP BY tag ORDER BY tag")


def truncate_views() -> Query:
    """Empty the tag view and its progress (the recorded bucket size stays)."""
    return "TRUNCATE tag_views, tag_write_progress, tag_scanning", ()


def count_or_delete_tagged(pid: str, *, count: bool) -> Query:
    """The persistence id's rows in every tag view: how many (``count``), or delete them."""
    verb = "SELECT count(*) FROM" if count else "DELETE FROM"
    return f"{verb} tag_views WHERE {_TAGGED_ROWS_OF}", (pid, pid)
