"""Tagged appends: the journal rows and their tag view rows in ONE statement, so one transaction.

Guarantee: a tagged event is in ``tag_views`` exactly when it is in ``event_journal`` (no batched tag
writer, no recovery pass). The append statement of :mod:`pgjournal.write` is extended with data-modifying
CTEs: ``ins`` inserts the journal rows, ``tv`` one ``tag_views`` row per (event, tag), ``progress`` upserts
``tag_write_progress``. ``tag_pid_sequence_nr`` continues from ``tag_write_progress`` read in the same
statement; two appends racing on one persistence id clash on ``event_journal``'s primary key, so the loser's
whole statement (tag rows and progress included) rolls back and is retried or reported as a conflict.

TimeUUIDs come from the writer's clock (:mod:`pgjournal.timeuuid`), one per event, shared by its tags,
raised in the statement above the persistence id's previous one (see ``_UUID``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from .buckets import BucketSize, check_bucket_size, ensure_bucket_size
from .store.events import AFTER_EXPECTED, AFTER_LATEST, INSERT, MANY_EVENTS, ONE_EVENT, text_array
from .timeuuid import GENERATOR, UUID_EPOCH_OFFSET

if TYPE_CHECKING:
    from .journal import Journal

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

_bucket_sizes: weakref.WeakKeyDictionary[Journal, BucketSize] = weakref.WeakKeyDictionary()


@functools.cache
def tagged_insert_sql(table: str, *, after_latest: bool, single: bool, one_tag: bool, bucket_ms: int, lsb: int,
                      lsb_bytes: int) -> str:
    """The append statement for ``table`` with the tag view rows and progress in the same statement
    (``one_tag``: the statement for exactly one tag, ``tv_tag``; else ``tv_tags``, an array). The bucket
    size and this process's TimeUUID low bytes are written into the text: fewer parameters to send."""
    prev = (AFTER_LATEST if after_latest else AFTER_EXPECTED).format(table=table)
    insert = INSERT.format(table=table, prev="SELECT * FROM prev", events="e").strip()
    return (_ONE_TAG if one_tag else _TAGGED).format(
        prev=prev, events=ONE_EVENT if single else MANY_EVENTS, insert=insert,
        uuid=_UUID.format(lsb_hex=f"{lsb_bytes:016x}"), epoch=UUID_EPOCH_OFFSET, bucket_ms=int(bucket_ms), lsb=int(lsb))


def bucket_size(journal: Journal, *, record: bool = True) -> BucketSize:
    """The journal's bucket size, checked against the one recorded in the database; a writer (``record``)
    records it when none is. A reader records nothing: reading an empty tag view fixes no size."""
    size = _bucket_sizes.get(journal)
    if size is None:
        with journal.connection() as conn:
            if record:
                size = ensure_bucket_size(conn, journal.settings.tag_bucket_size)
            else:
                check_bucket_size(conn, journal.settings.tag_bucket_size)
                return BucketSize.parse(journal.settings.tag_bucket_size)
        _bucket_sizes[journal] = size
    return size


def record_bucket_size(journal: Journal) -> Callable[[psycopg.Connection], None] | None:
    """Until a tagged append of ``journal`` committed: what records the bucket size in the append's
    transaction (so an append that fails records nothing); ``None`` after that."""
    if journal in _bucket_sizes:
        return None

    def record(conn: psycopg.Connection) -> None:
        ensure_bucket_size(conn, journal.settings.tag_bucket_size)

    return record


def bucket_size_recorded(journal: Journal) -> None:
    """A tagged append of ``journal`` committed, so its bucket size is recorded."""
    _bucket_sizes[journal] = BucketSize.parse(journal.settings.tag_bucket_size)


def prepare(journal: Journal, params: dict[str, Any], tags: tuple[str, ...], count: int, *,
            after_latest: bool) -> str:
    """Add the tag parameters to ``params`` (built by the writer) and return the tagged statement. The bucket
    size is the journal's setting, checked against the recorded one when the journal opened; the writer
    records it with the first tagged append (:func:`record_bucket_size`)."""
    size = _bucket_sizes.get(journal) or BucketSize.parse(journal.settings.tag_bucket_size)
    # The writer's clock; the statement raises it above the persistence id's last TimeUUID when needed.
    params.update(tv_count=count, tv_time=GENERATOR.next_ticks(count))
    if len(tags) == 1:
        params["tv_tag"] = tags[0]
    else:
        params["tv_tags"] = text_array(sorted(tags))  # sorted: racing appends lock progress rows in one order
    table = journal.dialect.event_table(params["slice"])
    return tagged_insert_sql(table, after_latest=after_latest, single=count == 1, one_tag=len(tags) == 1,
                             bucket_ms=size.millis, lsb=GENERATOR.lsb, lsb_bytes=GENERATOR.lsb_bytes)
