"""Counts over the journal for people: ``pgjournal info``, the demos and the example read model's check. Each
one scans what it counts (they are not for hot paths)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.store import Read, rows, scalars
from pgjournal.store.snapshots import SNAPSHOT_TABLE


@dataclass(frozen=True, slots=True)
class Counts:
    """Events (deleted ones included) and persistence ids."""

    events: int
    persistence_ids: int


@dataclass(frozen=True, slots=True)
class EntityTypeCounts:
    """Live (not deleted) events of an entity type."""

    entity_type: str
    events: int
    persistence_ids: int
    first: datetime
    last: datetime


@dataclass(frozen=True, slots=True)
class RangeCount:
    """Live events of the ``index``-th of equal slice ranges."""

    index: int
    events: int


@dataclass(frozen=True, slots=True)
class PidCount:
    """Live events of a persistence id and its highest sequence number."""

    persistence_id: str
    events: int
    highest: int


@dataclass(frozen=True, slots=True)
class Newest:
    """The newest event's db_timestamp (``None``: no event) and the database clock."""

    db_timestamp: datetime | None
    now: datetime


def per_entity_type() -> Read[EntityTypeCounts]:
    return rows(EntityTypeCounts,
                "SELECT entity_type, count(*), count(DISTINCT persistence_id), min(db_timestamp), max(db_timestamp) "
                "FROM event_journal WHERE NOT deleted GROUP BY entity_type ORDER BY entity_type")


def per_slice_range(ranges: int) -> Read[RangeCount]:
    """Live events per slice range of ``slices.slice_ranges(ranges)`` (ranges without events have no row)."""
    return rows(RangeCount, "SELECT slice / %s, count(*) FROM event_journal WHERE NOT deleted GROUP BY 1",
                (NUMBER_OF_SLICES // ranges,))


def totals(entity_type: str | None = None) -> Read[Counts]:
    """One row: the events and persistence ids of the journal, or of one entity type."""
    if entity_type is None:
        return rows(Counts, "SELECT count(*), count(DISTINCT persistence_id) FROM event_journal")
    return rows(Counts, "SELECT count(*), count(DISTINCT persistence_id) FROM event_journal WHERE entity_type = %s",
                (entity_type,))


def per_persistence_id(entity_type: str) -> Read[PidCount]:
    """Each persistence id of an entity type with its live events."""
    return rows(PidCount, "SELECT persistence_id, count(*), max(seq_nr) FROM event_journal "
                "WHERE entity_type = %s AND NOT deleted GROUP BY persistence_id", (entity_type,))


def newest() -> Read[Newest]:
    return rows(Newest, "SELECT max(db_timestamp), clock_timestamp() FROM event_journal")


#: The tables whose size ``journal_size`` adds up: events, snapshots and durable state.
SIZED_TABLES = ("event_journal", SNAPSHOT_TABLE, "durable_state")
# A partitioned table has no storage of its own: its size is its partitions'. (An adopted Akka journal's
# ``event_journal`` is a view over its data partitions and counts 0.)
JOURNAL_SIZE_SQL = """
SELECT coalesce(sum(CASE WHEN c.relkind = 'p'
                         THEN (SELECT sum(pg_total_relation_size(t.relid)) FROM pg_partition_tree(c.oid) AS t)
                         ELSE pg_total_relation_size(c.oid) END), 0)::bigint
FROM pg_class AS c WHERE c.oid IN (SELECT to_regclass(n) FROM unnest(%s::text[]) AS n)"""


def journal_size() -> Read[int]:
    """Bytes on disk of the journal's tables (indexes and TOAST included) in this database."""
    return scalars(JOURNAL_SIZE_SQL, (list(SIZED_TABLES),))


def snapshots() -> Read[int]:
    """How many snapshots are stored (one per persistence id)."""
    return scalars(f"SELECT count(*) FROM {SNAPSHOT_TABLE}")


@dataclass(frozen=True, slots=True)
class FirstPending:
    """The oldest event of a slice that a consumer whose offset is ``after`` has still to handle."""

    slice: int
    db_timestamp: datetime


def first_pending(entity_types: list[str], slices: list[int], after: list[datetime | None],
                  before: datetime) -> Read[FirstPending]:
    """Per slice of ``slices`` (its offset in ``after``, ``None``: nothing handled), its oldest live event of
    ``entity_types`` newer than the offset and older than ``before`` (the visibility horizon); slices with none
    have no row. One range scan of the entity types' index from the oldest offset given."""
    known = [a for a in after if a is not None]
    oldest = min(known) if len(known) == len(after) and known else None
    return rows(FirstPending, """
SELECT e.slice, min(e.db_timestamp)
FROM event_journal e
JOIN unnest(%(slices)s::int[], %(after)s::timestamptz[]) AS o(slice, after) ON o.slice = e.slice
WHERE e.entity_type = ANY(%(types)s) AND NOT e.deleted AND e.db_timestamp < %(before)s
  AND (%(oldest)s::timestamptz IS NULL OR e.db_timestamp > %(oldest)s)
  AND (o.after IS NULL OR e.db_timestamp > o.after)
GROUP BY e.slice""", {"slices": slices, "after": after, "types": entity_types, "before": before, "oldest": oldest})
