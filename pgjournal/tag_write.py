"""Tagged appends: the journal rows and their tag view rows in ONE statement, so one transaction.

Guarantee: a tagged event is in ``tag_views`` exactly when it is in ``event_journal`` (no batched tag
writer, no recovery pass). The append statement of :mod:`pgjournal.write` is extended with data-modifying
CTEs: ``ins`` inserts the journal rows, ``tv`` one ``tag_views`` row per (event, tag), ``progress`` upserts
``tag_write_progress``. ``tag_pid_sequence_nr`` continues from ``tag_write_progress`` read in the same
statement; two appends racing on one persistence id clash on ``event_journal``'s primary key, so the loser's
whole statement (tag rows and progress included) rolls back and is retried or reported as a conflict.

TimeUUIDs come from the writer's clock (:mod:`pgjournal.timeuuid`), one per event, shared by its tags.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

from .buckets import BucketSize, ensure_bucket_size
from .timeuuid import GENERATOR, make_uuid, ms_of_ticks

if TYPE_CHECKING:
    from .journal import Journal

_EVENTS_ONE = """SELECT %(ser_id)s::int AS ser_id, %(manifest)s::text AS manifest, %(payload)s::bytea AS payload,
    %(tv_uuid)s::uuid AS tv_uuid, %(tv_time)s::bigint AS tv_time, %(tv_lsb)s::bigint AS tv_lsb,
    %(tv_bucket)s::bigint AS tv_bucket, 1::bigint AS ord"""
_EVENTS_MANY = """SELECT * FROM unnest(%(ser_ids)s::int[], %(manifests)s::text[], %(payloads)s::bytea[],
    %(tv_uuids)s::uuid[], %(tv_times)s::bigint[], %(tv_lsbs)s::bigint[], %(tv_buckets)s::bigint[])
    WITH ORDINALITY AS e(ser_id, manifest, payload, tv_uuid, tv_time, tv_lsb, tv_bucket, ord)"""
_TAGGED = """
WITH prev AS ({prev}),
e AS ({events}),
ins AS ({insert}),
t AS (SELECT t.tag, COALESCE(p.tag_pid_sequence_nr, 0) AS base
      FROM unnest(%(tv_tags)s::text[]) AS t(tag)
      LEFT JOIN tag_write_progress p ON p.persistence_id = %(pid)s AND p.tag = t.tag),
tv AS (INSERT INTO tag_views (tag_name, timebucket, ts_time, ts_lsb, timestamp, persistence_id, tag_pid_sequence_nr,
           sequence_nr, writer_uuid, ser_id, ser_manifest, event_manifest, event, meta_ser_id, meta_ser_manifest,
           meta_payload)
       SELECT t.tag, e.tv_bucket, e.tv_time, e.tv_lsb, e.tv_uuid, %(pid)s, t.base + e.ord, prev.seq_nr + e.ord,
           %(writer)s, e.ser_id, e.manifest, '', e.payload, %(meta_ser_id)s, %(meta_manifest)s, %(meta_payload)s
       FROM prev CROSS JOIN e CROSS JOIN t),
progress AS (INSERT INTO tag_write_progress (persistence_id, tag, sequence_nr, tag_pid_sequence_nr, "offset")
       SELECT %(pid)s, t.tag, prev.seq_nr + %(tv_count)s, t.base + %(tv_count)s, %(tv_last)s::uuid
       FROM prev CROSS JOIN t
       ON CONFLICT (persistence_id, tag) DO UPDATE SET sequence_nr = excluded.sequence_nr,
           tag_pid_sequence_nr = excluded.tag_pid_sequence_nr, "offset" = excluded."offset")
SELECT seq_nr, db_timestamp FROM ins"""

_bucket_sizes: weakref.WeakKeyDictionary[Journal, BucketSize] = weakref.WeakKeyDictionary()


@functools.cache
def tagged_insert_sql(table: str, *, after_latest: bool, single: bool) -> str:
    """The append statement for ``table`` with the tag view rows and progress in the same statement."""
    from .write import _AFTER_EXPECTED, _AFTER_LATEST, _INSERT

    prev = (_AFTER_LATEST if after_latest else _AFTER_EXPECTED).format(table=table)
    insert = _INSERT.format(table=table, prev="SELECT * FROM prev", events="e").strip()
    return _TAGGED.format(prev=prev, events=_EVENTS_ONE if single else _EVENTS_MANY, insert=insert)


def bucket_size(journal: Journal) -> BucketSize:
    """The journal's bucket size, recorded in the database (and checked against it) on first use."""
    size = _bucket_sizes.get(journal)
    if size is None:
        with journal.connection() as conn:
            size = ensure_bucket_size(conn, journal.settings.tag_bucket_size)
        _bucket_sizes[journal] = size
    return size


def prepare(journal: Journal, params: dict[str, Any], tags: tuple[str, ...], count: int, *,
            after_latest: bool) -> str:
    """Add the tag parameters to ``params`` (built by the writer) and return the tagged statement."""
    size = bucket_size(journal)
    first = GENERATOR.next_ticks(count)
    lsb_bytes, lsb = GENERATOR.lsb_bytes, GENERATOR.lsb
    ticks = range(first, first + count)
    uuids = [make_uuid(t, lsb_bytes) for t in ticks]
    buckets = [size.bucket_of(ms_of_ticks(t)) for t in ticks]
    # Sorted: concurrent appends lock progress rows in one order (no deadlock between tag lists).
    params.update(tv_tags=sorted(tags), tv_count=count, tv_last=uuids[-1])
    if count == 1:
        params.update(tv_uuid=uuids[0], tv_time=first, tv_lsb=lsb, tv_bucket=buckets[0])
    else:
        params.update(tv_uuids=uuids, tv_times=list(ticks), tv_lsbs=[lsb] * count, tv_buckets=buckets)
    table = journal.dialect.event_table(params["slice"])
    return tagged_insert_sql(table, after_latest=after_latest, single=count == 1)
