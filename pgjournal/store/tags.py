"""SQL of tagged appends: the append statement of :mod:`pgjournal.store.events` extended with data-modifying
CTEs that write the tag view rows and the tag write progress in the same statement (see
:mod:`pgjournal.tag_write` for the guarantee)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..timeuuid import UUID_EPOCH_OFFSET
from . import Query, Read, rows
from .events import BYTEA_PAYLOADS, INSERT, MANY_EVENTS, ONE_EVENT, PREVIOUS, TAGS_META

# The event's TimeUUID is assembled in SQL from its ticks and this process's low bytes, because the ticks
# are raised above the persistence id's last ones (``tag_write_progress.ts_time``): with concurrent appends
# to one persistence id (``expected_seq_nr=None``), the writer's clock alone could give a later tag sequence
# number an earlier TimeUUID. So per (tag, persistence id), TimeUUID order is tag sequence order.
_UUID = """(lpad(to_hex(u.ticks & 4294967295), 8, '0') || lpad(to_hex((u.ticks >> 32) & 65535), 4, '0')
        || lpad(to_hex(((u.ticks >> 48) & 4095) | 4096), 4, '0') || '{lsb_hex}')::uuid"""
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
# server runs ~10% faster (8 writers, 1 event per append).
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


# -- reads of the tag view (events_by_tag, see pgjournal.by_tag) -----------------------------------------
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


# -- tag view maintenance (pgjournal.reconciliation: the Cassandra plugin's Reconciliation and Cleanup) ---------

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
