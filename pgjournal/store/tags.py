"""SQL of tagged appends: the append statement of :mod:`pgjournal.store.events` extended with data-modifying
CTEs that write the tag view rows and the tag write progress in the same statement (see
:mod:`pgjournal.tag_write` for the guarantee)."""

from __future__ import annotations

import functools

from ..timeuuid import UUID_EPOCH_OFFSET
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
