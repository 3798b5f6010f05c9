"""SQL of bulk cleanup (:mod:`pgjournal.admin.cleanup`): which persistence ids to visit, one bounded batch of event
deletes with the tag view rows that follow them, snapshot deletes, and the projection offsets behind a deletion.

A batch is one statement (so one transaction): at most ``limit`` events of a page of persistence ids, in
``(persistence_id, seq_nr)`` order after a keyset position. Per persistence id an event is *selected* when its
sequence number is at most ``upto`` and its ``db_timestamp`` before ``before``; a selected event is deleted,
except the persistence id's highest event, which stays as a logically deleted marker (so the persistence id
continues after its highest sequence number) unless ``reset`` is set. Tag view rows of every selected event go
in the same statement. Everything a batch does is also what a rerun would decide, so a run stopped anywhere
continues where it stopped when it is run again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

Query = tuple[str, dict[str, Any]]

#: The offset tables a deletion may leave projections behind in (pgjournal's, Akka Projection's).
OFFSET_TABLES = ("projection_timestamp_offset_store", "akka_projection_timestamp_offset_store")
MAX_SEQ_NR = 2**63 - 1

# Pages of persistence ids, keyset by id.
PIDS_OF_EVENTS = """
SELECT DISTINCT persistence_id FROM event_journal
WHERE persistence_id > %(after)s AND (%(entity_type)s::text IS NULL OR entity_type = %(entity_type)s)
ORDER BY persistence_id LIMIT %(limit)s"""
PIDS_WITH_SNAPSHOTS = """
SELECT persistence_id FROM snapshot
WHERE persistence_id > %(after)s AND (%(entity_type)s::text IS NULL OR entity_type = %(entity_type)s)
ORDER BY persistence_id LIMIT %(limit)s"""
# Tombstoned: every event the persistence id still has is logically deleted (Akka's deleteAll leaves such ids).
PIDS_TOMBSTONED = """
SELECT persistence_id FROM event_journal
WHERE persistence_id > %(after)s AND (%(entity_type)s::text IS NULL OR entity_type = %(entity_type)s)
GROUP BY persistence_id HAVING bool_and(deleted)
ORDER BY persistence_id LIMIT %(limit)s"""

# The selected events of a page, after the keyset position (``upto`` per persistence id: its snapshot's
# sequence number for "before the snapshot", else the largest; never above its cap, what a hold lets go).
_SELECTED = """
WITH page AS (
    SELECT u.pid, u.slice, u.ord,
           LEAST(COALESCE(s.seq_nr, CASE WHEN %(by_snapshot)s THEN 0 ELSE {max_seq} END), u.cap) AS upto
    FROM unnest(%(pids)s::text[], %(slices)s::int[], %(caps)s::bigint[]) WITH ORDINALITY AS u(pid, slice, cap, ord)
    LEFT JOIN snapshot AS s ON %(by_snapshot)s AND s.persistence_id = u.pid),
picked AS (
    SELECT e.persistence_id, e.seq_nr, e.slice, e.entity_type, e.db_timestamp, e.tags, e.deleted
    FROM page CROSS JOIN LATERAL (
        -- per persistence id a primary-key range scan (never a scan of the table), at most limit rows
        SELECT x.persistence_id, x.seq_nr, x.slice, x.entity_type, x.db_timestamp, x.tags, x.deleted
        FROM event_journal AS x
        WHERE x.persistence_id = page.pid AND x.slice = page.slice AND x.seq_nr <= page.upto
          AND x.seq_nr > CASE WHEN page.pid = %(after_pid)s THEN %(after_seq)s::bigint ELSE 0 END
          AND x.db_timestamp < %(before)s
        ORDER BY x.seq_nr LIMIT %(limit)s) AS e
    WHERE page.pid >= %(after_pid)s
    -- the page is sorted by persistence id (the caller's promise): in ordinal order an incremental sort stops
    -- after the persistence ids that fill the batch
    ORDER BY page.ord, e.seq_nr
    LIMIT %(limit)s),
highest AS MATERIALIZED (
    SELECT p.persistence_id, (SELECT max(h.seq_nr) FROM event_journal AS h
                              WHERE h.persistence_id = p.persistence_id AND h.slice = p.slice) AS seq_nr
    FROM (SELECT DISTINCT persistence_id, slice FROM picked) AS p),
cand AS (
    SELECT picked.*, picked.seq_nr = highest.seq_nr AS highest
    FROM picked JOIN highest ON highest.persistence_id = picked.persistence_id),
tagged AS (SELECT c.persistence_id, c.seq_nr, unnest(c.tags) AS tag FROM cand AS c WHERE c.tags IS NOT NULL)"""
# What a batch touches: deleted events, highest events kept as (new) markers, and each (entity type, slice)'s
# newest touched event time, for the offsets check.
_SUMMARY = """
SELECT {deleted}, {marked}, {tag_rows}, {progress},
       (SELECT count(*) FROM cand), (SELECT count(DISTINCT persistence_id) FROM cand),
       (SELECT persistence_id FROM cand ORDER BY persistence_id DESC, seq_nr DESC LIMIT 1),
       (SELECT seq_nr FROM cand ORDER BY persistence_id DESC, seq_nr DESC LIMIT 1),
       (SELECT array_agg(entity_type) FROM touched), (SELECT array_agg(slice) FROM touched),
       (SELECT array_agg(until) FROM touched)"""
_TOUCHED = """
touched AS (SELECT entity_type, slice, max(db_timestamp) AS until FROM cand
            WHERE NOT (highest AND deleted AND NOT %(reset)s) GROUP BY entity_type, slice)"""
COUNT_BATCH = (_SELECTED + "," + _TOUCHED + _SUMMARY.format(
    deleted="(SELECT count(*) FROM cand WHERE NOT highest OR %(reset)s)",
    marked="(SELECT count(*) FROM cand WHERE highest AND NOT %(reset)s AND NOT deleted)",
    tag_rows="(SELECT count(*) FROM tag_views AS t JOIN tagged AS x ON t.tag_name = x.tag "
             "AND t.persistence_id = x.persistence_id AND t.sequence_nr = x.seq_nr)",
    progress="(SELECT count(*) FROM tag_write_progress WHERE %(reset)s AND persistence_id IN "
             "(SELECT persistence_id FROM cand WHERE highest))")).format(max_seq=MAX_SEQ_NR)
DELETE_BATCH = (_SELECTED + "," + _TOUCHED + """,
del AS (DELETE FROM event_journal AS d USING cand AS c
        WHERE d.persistence_id = c.persistence_id AND d.slice = c.slice AND d.seq_nr = c.seq_nr
          AND (NOT c.highest OR %(reset)s) RETURNING 1),
mark AS (UPDATE event_journal AS m SET deleted = true FROM cand AS c
         WHERE m.persistence_id = c.persistence_id AND m.slice = c.slice AND m.seq_nr = c.seq_nr
           AND c.highest AND NOT %(reset)s AND NOT m.deleted RETURNING 1),
tv AS (DELETE FROM tag_views AS t USING tagged AS x
       WHERE t.tag_name = x.tag AND t.persistence_id = x.persistence_id AND t.sequence_nr = x.seq_nr RETURNING 1),
gone AS (SELECT persistence_id FROM cand WHERE highest AND %(reset)s),
twp AS (DELETE FROM tag_write_progress WHERE persistence_id IN (SELECT persistence_id FROM gone) RETURNING 1),
ts AS (DELETE FROM tag_scanning WHERE persistence_id IN (SELECT persistence_id FROM gone) RETURNING 1)"""
                + _SUMMARY.format(deleted="(SELECT count(*) FROM del)", marked="(SELECT count(*) FROM mark)",
                                  tag_rows="(SELECT count(*) FROM tv)",
                                  progress="(SELECT count(*) FROM twp)")).format(max_seq=MAX_SEQ_NR)

# Per capped persistence id of a page: the events the operation would select above its cap (kept by the hold).
HELD = f"""
SELECT u.pid, count(x.seq_nr)
FROM unnest(%(pids)s::text[], %(slices)s::int[], %(caps)s::bigint[]) AS u(pid, slice, cap)
LEFT JOIN snapshot AS s ON %(by_snapshot)s AND s.persistence_id = u.pid
JOIN event_journal AS x ON x.persistence_id = u.pid AND x.slice = u.slice AND x.seq_nr > u.cap
  AND x.seq_nr <= COALESCE(s.seq_nr, CASE WHEN %(by_snapshot)s THEN 0 ELSE {MAX_SEQ_NR} END)
  AND x.db_timestamp < %(before)s
  -- a highest event already marked deleted stays as it is (unless reset): nothing of it is held
  AND NOT (x.deleted AND NOT %(reset)s AND x.seq_nr = (SELECT max(h.seq_nr) FROM event_journal AS h
                                                        WHERE h.persistence_id = u.pid AND h.slice = u.slice))
GROUP BY u.pid ORDER BY u.pid"""

COUNT_SNAPSHOTS = "SELECT count(*) FROM snapshot WHERE persistence_id = ANY(%(pids)s) AND {where}"
DELETE_SNAPSHOTS = "DELETE FROM snapshot WHERE persistence_id = ANY(%(pids)s) AND {where}"
_SNAPSHOT_BEFORE = "COALESCE(db_timestamp, to_timestamp(write_timestamp / 1000.0)) < %(before)s"

# Per projection: the slices whose latest stored offset is older than the newest event deleted there, for
# projections of the deleted events' entity types (known from the persistence ids in their rows; a projection
# with marker rows only counts for every type). A Spark load's ledger rows are not offsets.
OFFSETS_BEHIND = """
WITH d AS (SELECT * FROM unnest(%(types)s::text[], %(slices)s::int[], %(untils)s::timestamptz[])
           AS d(entity_type, slice, until)),
o AS (SELECT projection_name, slice, max(timestamp_offset) AS latest FROM {table}
      WHERE NOT (projection_name LIKE 'spark-load:%%' AND projection_name LIKE '%%:loads')
      GROUP BY projection_name, slice),
t AS (SELECT projection_name,
             array_agg(DISTINCT CASE WHEN strpos(persistence_id, '|') > 0 THEN split_part(persistence_id, '|', 1)
                                     ELSE '' END) FILTER (WHERE persistence_id <> '') AS types
      FROM {table} GROUP BY projection_name)
SELECT o.projection_name, count(DISTINCT o.slice), min(o.latest), max(d.until)
FROM o JOIN d ON d.slice = o.slice JOIN t ON t.projection_name = o.projection_name
WHERE o.latest < d.until AND (t.types IS NULL OR d.entity_type = ANY(t.types))
GROUP BY o.projection_name ORDER BY o.projection_name"""


def pid_page(source: str, entity_type: str | None, after: str, limit: int) -> Query:
    """A page of persistence ids: ``events`` (with events), ``snapshots`` (with a snapshot) or ``tombstoned``."""
    sql = {"events": PIDS_OF_EVENTS, "snapshots": PIDS_WITH_SNAPSHOTS, "tombstoned": PIDS_TOMBSTONED}[source]
    return sql, {"after": after, "entity_type": entity_type, "limit": limit}


def batch(pids: list[str], slices: list[int], *, by_snapshot: bool, before: datetime | None, reset: bool,
          after: tuple[str, int], limit: int, execute: bool, caps: list[int] | None = None) -> Query:
    """One batch over a page of persistence ids (sorted, with their slices): one row (deleted, marked, tag rows,
    tag progress rows, events selected, persistence ids, last persistence id and seq_nr, then arrays of entity
    type, slice and newest time touched). ``execute=False`` counts what it would do and changes nothing.
    ``caps``: per persistence id the highest sequence number it may select (none: no cap)."""
    return (DELETE_BATCH if execute else COUNT_BATCH), {
        "pids": pids, "slices": slices, "by_snapshot": by_snapshot, "before": before or "infinity",
        "reset": reset, "after_pid": after[0], "after_seq": after[1], "limit": limit,
        "caps": caps if caps is not None else [MAX_SEQ_NR] * len(pids)}


def held(pids: list[str], slices: list[int], caps: list[int], *, by_snapshot: bool, before: datetime | None,
         reset: bool) -> Query:
    """Rows (persistence id, events): what :func:`batch` would select above each persistence id's cap."""
    return HELD, {"pids": pids, "slices": slices, "caps": caps, "by_snapshot": by_snapshot,
                  "before": before or "infinity", "reset": reset}


def snapshots(pids: list[str], before: datetime | None, *, execute: bool) -> Query:
    """Count (or delete) the snapshots of ``pids`` (taken before ``before`` when given)."""
    where = _SNAPSHOT_BEFORE if before is not None else "true"
    return (DELETE_SNAPSHOTS if execute else COUNT_SNAPSHOTS).format(where=where), {"pids": pids, "before": before}


def offsets_behind(table: str, touched: dict[tuple[str, int], datetime]) -> Query:
    """Projections in ``table`` (one of :data:`OFFSET_TABLES`) behind what was deleted: (name, slices, oldest
    latest offset, newest deleted time)."""
    assert table in OFFSET_TABLES
    keys = list(touched)
    return OFFSETS_BEHIND.format(table=table), {
        "types": [k[0] for k in keys], "slices": [k[1] for k in keys], "untils": [touched[k] for k in keys]}


def table_exists(name: str) -> Query:
    return "SELECT to_regclass(%(name)s) IS NOT NULL", {"name": name}
