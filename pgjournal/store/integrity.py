"""Read-only SQL of ``pgjournal verify`` (:mod:`pgjournal.admin.verify`): each statement returns the rows that break
one rule of the journal, the tag view or the projection offsets. They scan whole tables; run them with
:meth:`~pgjournal.store.Read.stream`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgjournal.store import Read, rows, tables
from pgjournal.store.timestamp_offsets import LEDGER_SUFFIX, LOAD_PREFIX, MARKER_PID, OFFSET_TABLE

TAG_TABLES = (tables.TAG_VIEWS, tables.TAG_WRITE_PROGRESS, tables.TAG_BATCH_WRITERS)


@dataclass(frozen=True, slots=True)
class SeqStep:
    """An event whose sequence number or time does not follow from the one before (``prev_*``: ``None``
    for a persistence id's first row)."""

    persistence_id: str
    seq_nr: int
    prev_seq_nr: int | None
    db_timestamp: datetime
    prev_timestamp: datetime | None
    deleted: bool


@dataclass(frozen=True, slots=True)
class Identity:
    persistence_id: str
    slice: int
    entity_type: str


@dataclass(frozen=True, slots=True)
class MissingTag:
    """A tag of a live event without its ``tag_views`` row (``pending``: the event is not yet below the batched tag
    writers' watermark, so a running writer, or the recovery of a silent one, is still to write the row)."""

    persistence_id: str
    seq_nr: int
    tag: str
    pending: bool


@dataclass(frozen=True, slots=True)
class OrphanedTag:
    """A ``tag_views`` row whose event is gone (``stored`` false) or does not carry the tag."""

    tag: str
    persistence_id: str
    seq_nr: int
    stored: bool


@dataclass(frozen=True, slots=True)
class TagSeqGap:
    tag: str
    persistence_id: str
    prev: int
    tag_pid_sequence_nr: int


@dataclass(frozen=True, slots=True)
class TagProgress:
    """Tag write progress (``None``: no row) behind the highest tag sequence number in ``tag_views``."""

    tag: str
    persistence_id: str
    highest: int
    progress: int | None


@dataclass(frozen=True, slots=True)
class OffsetAhead:
    """A projection offset naming a sequence number the journal does not have (``highest``: the journal's)."""

    projection_name: str
    projection_key: str
    slice: int
    persistence_id: str
    seq_nr: int
    highest: int | None


SEQ_AND_TIME = """
SELECT persistence_id, seq_nr, prev_seq, db_timestamp, prev_ts, deleted FROM (
    SELECT persistence_id, seq_nr, db_timestamp, deleted,
           lag(seq_nr) OVER w AS prev_seq, lag(db_timestamp) OVER w AS prev_ts
    FROM event_journal WINDOW w AS (PARTITION BY persistence_id ORDER BY seq_nr)) AS s
WHERE (prev_seq IS NULL AND seq_nr > 1 AND NOT deleted) OR seq_nr > prev_seq + 1 OR db_timestamp < prev_ts
ORDER BY persistence_id, seq_nr"""
IDENTITY = "SELECT DISTINCT persistence_id, slice, entity_type FROM event_journal"
TAGS_MISSING = """
SELECT e.persistence_id, e.seq_nr, t.tag,
       e.db_timestamp >= COALESCE((SELECT min(complete_before) FROM tag_batch_writers), 'infinity')
FROM event_journal AS e CROSS JOIN LATERAL unnest(e.tags) AS t(tag)
WHERE NOT e.deleted AND NOT EXISTS (
    SELECT 1 FROM tag_views AS v
    WHERE v.tag_name = t.tag AND v.persistence_id = e.persistence_id AND v.sequence_nr = e.seq_nr)
ORDER BY 1, 2, 3"""
# A row whose event is gone is fine when the persistence id was cleaned up (a deleted marker above it).
TAGS_ORPHANED = """
SELECT v.tag_name, v.persistence_id, v.sequence_nr, e.seq_nr IS NOT NULL FROM tag_views AS v
LEFT JOIN event_journal AS e ON e.persistence_id = v.persistence_id AND e.seq_nr = v.sequence_nr
WHERE CASE WHEN e.seq_nr IS NOT NULL THEN NOT (v.tag_name = ANY(COALESCE(e.tags, '{}')))
      ELSE NOT EXISTS (SELECT 1 FROM event_journal AS m
                       WHERE m.persistence_id = v.persistence_id AND m.deleted AND m.seq_nr > v.sequence_nr) END
ORDER BY 1, 2, 3"""
TAG_SEQ_GAPS = """
SELECT tag_name, persistence_id, prev, tag_pid_sequence_nr FROM (
    SELECT tag_name, persistence_id, tag_pid_sequence_nr,
           lag(tag_pid_sequence_nr) OVER (PARTITION BY tag_name, persistence_id ORDER BY tag_pid_sequence_nr) AS prev
    FROM tag_views) AS s
WHERE tag_pid_sequence_nr <> prev + 1
ORDER BY 1, 2, 4"""
TAG_PROGRESS = """
SELECT v.tag_name, v.persistence_id, max(v.tag_pid_sequence_nr), p.tag_pid_sequence_nr
FROM tag_views AS v
LEFT JOIN tag_write_progress AS p ON p.persistence_id = v.persistence_id AND p.tag = v.tag_name
GROUP BY v.tag_name, v.persistence_id, p.tag_pid_sequence_nr
HAVING p.tag_pid_sequence_nr IS NULL OR p.tag_pid_sequence_nr < max(v.tag_pid_sequence_nr)
ORDER BY 1, 2"""
# A Spark load job's ledger (one row per load: load id, load number) holds no offsets.
OFFSETS_AHEAD = f"""
SELECT o.projection_name, o.projection_key, o.slice, o.persistence_id, o.seq_nr, h.highest
FROM {OFFSET_TABLE} AS o
LEFT JOIN LATERAL (SELECT max(e.seq_nr) AS highest FROM event_journal AS e
                   WHERE e.persistence_id = o.persistence_id) AS h ON true
WHERE o.persistence_id <> %(marker)s AND (h.highest IS NULL OR o.seq_nr > h.highest)
  AND NOT (o.projection_name LIKE %(load)s AND o.projection_name LIKE %(ledger)s)
ORDER BY 1, 2, 4, 5"""


def seq_and_time() -> Read[SeqStep]:
    """Gaps in sequence numbers (deleted rows are not gaps) and time going back within a persistence id."""
    return rows(SeqStep, SEQ_AND_TIME)


def identities() -> Read[Identity]:
    return rows(Identity, IDENTITY)


def tags_missing() -> Read[MissingTag]:
    return rows(MissingTag, TAGS_MISSING)


def tags_orphaned() -> Read[OrphanedTag]:
    return rows(OrphanedTag, TAGS_ORPHANED)


def tag_seq_gaps() -> Read[TagSeqGap]:
    return rows(TagSeqGap, TAG_SEQ_GAPS)


def tag_progress() -> Read[TagProgress]:
    return rows(TagProgress, TAG_PROGRESS)


def offsets_ahead() -> Read[OffsetAhead]:
    return rows(OffsetAhead, OFFSETS_AHEAD,
                {"marker": MARKER_PID, "load": LOAD_PREFIX + "%", "ledger": "%" + LEDGER_SUFFIX})
