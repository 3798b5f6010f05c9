"""SQL of the journal's write path: the append statement (one per ``append``) and its parts.

The statement finds the previous event of the persistence id, numbers the new events after it and stamps
them all with ``GREATEST(clock_timestamp(), previous + 1 µs)`` (see :mod:`pgjournal.write.event_writer` for why the
clock and not the transaction start). The tag path (:mod:`pgjournal.tags.statement_writer`) builds on the same parts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.errors import SerializationError
from pgjournal.model.envelope import EVENT_COLUMNS
from pgjournal.model.slices import slice_for_persistence_id

if TYPE_CHECKING:
    from pgjournal.store.tables import Slicing

# ``{tags_meta}`` / ``{tags_meta_values}``: the tags and metadata columns (:data:`TAGS_META`), each left out of
# the statement for an append without it (the columns default to NULL): parameters fewer to send.
INSERT = """
INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, adapter_manifest,
    event_ser_id, event_ser_manifest, event_payload{tags_meta})
SELECT %(slice)s, %(entity_type)s, %(pid)s, prev.seq_nr + e.ord, prev.ts, %(writer)s, '',
    e.ser_id, e.manifest, {payload}{tags_meta_values}
FROM ({prev}) AS prev
CROSS JOIN {events}
RETURNING seq_nr, db_timestamp
"""
_TAGS = (", tags", ", %(tags)s::text[]")
_META = (", meta_ser_id, meta_ser_manifest, meta_payload", ", %(meta_ser_id)s, %(meta_manifest)s, {meta_payload}")
TAGS_META = {"tags_meta": _TAGS[0] + _META[0], "tags_meta_values": _TAGS[1] + _META[1]}
# GREATEST ignores the NULL of a persistence id without events; evaluated once (an aggregate's one row).
NEXT_TIMESTAMP = "GREATEST(clock_timestamp(), MAX(db_timestamp) + INTERVAL '1 microsecond')"
# After a given sequence number: no row at all (nothing inserted) when that event does not exist.
AFTER_EXPECTED = f"""
    SELECT %(expected)s::bigint AS seq_nr, {NEXT_TIMESTAMP} AS ts FROM {{table}}
    WHERE persistence_id = %(pid)s AND slice = %(slice)s AND seq_nr = %(expected)s
    HAVING %(expected)s::bigint = 0 OR COUNT(*) > 0"""
# After whatever the highest sequence number is.
AFTER_LATEST = f"""
    SELECT COALESCE(MAX(seq_nr), 0) AS seq_nr, {NEXT_TIMESTAMP} AS ts FROM (
        SELECT seq_nr, db_timestamp FROM {{table}} WHERE persistence_id = %(pid)s AND slice = %(slice)s
        ORDER BY seq_nr DESC LIMIT 1) AS last"""
# After a predecessor the writer knows, its own last append (``expected`` and its ``prev_ts``), or none at
# all (``expected`` 0, ``prev_ts`` NULL, which GREATEST ignores): nothing to read. An index probe for the
# predecessor costs the server a large share of a raw INSERT's work (``python -m bench append-cpu``).
AFTER_KNOWN = """
    SELECT %(expected)s::bigint AS seq_nr,
        GREATEST(clock_timestamp(), %(prev_ts)s::timestamptz + INTERVAL '1 microsecond') AS ts"""
# One event after a known predecessor: a plain VALUES row (the cheapest form for the server).
ONE_AFTER_KNOWN = """
INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, adapter_manifest,
    event_ser_id, event_ser_manifest, event_payload{tags_meta})
VALUES (%(slice)s, %(entity_type)s, %(pid)s, %(expected)s::bigint + 1,
    GREATEST(clock_timestamp(), %(prev_ts)s::timestamptz + INTERVAL '1 microsecond'), %(writer)s, '',
    %(ser_id)s, %(manifest)s, {payload}{tags_meta_values})
RETURNING seq_nr, db_timestamp
"""
#: Where the numbering starts: after ``expected`` (looked up), after the highest (looked up), or after a
#: predecessor the writer knows (:data:`AFTER_KNOWN`).
PREVIOUS = {"expected": AFTER_EXPECTED, "latest": AFTER_LATEST, "known": AFTER_KNOWN}
MANY_EVENTS = """unnest(%(ser_ids)s::int[], %(manifests)s::text[], %(payloads)s::bytea[])
    WITH ORDINALITY AS e(ser_id, manifest, payload, ord)"""
# Several persistence ids' events, each with metadata of its own, in one statement (the replicator's batch): each
# persistence id's predecessor read once, by its (persistence id, slice, seq_nr) key, its events stamped as one
# append's are (:data:`NEXT_TIMESTAMP` over that predecessor). ``p`` is a CTE with a volatile function in it
# (clock_timestamp), so PostgreSQL computes it once instead of folding it into the join, where it ran again for
# every event (each with a stamp of its own, and a lookup each).
MANY_PIDS_WITH_META = """
WITH p AS (
    SELECT u.n, u.slice, u.entity_type, u.pid, u.expected, prev.ts
    FROM unnest(%(slices)s::int[], %(entity_types)s::text[], %(pids)s::text[], %(expecteds)s::bigint[])
        WITH ORDINALITY AS u(slice, entity_type, pid, expected, n)
    CROSS JOIN LATERAL (
        SELECT {next_timestamp} AS ts FROM {table}
        WHERE persistence_id = u.pid AND slice = u.slice AND seq_nr = u.expected
        HAVING u.expected = 0 OR COUNT(*) > 0) AS prev
)
INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, adapter_manifest,
    event_ser_id, event_ser_manifest, event_payload, meta_ser_id, meta_ser_manifest, meta_payload)
SELECT p.slice, p.entity_type, p.pid, p.expected + e.ord, p.ts, %(writer)s, '',
    e.ser_id, e.manifest, e.payload, e.meta_ser_id, e.meta_manifest, e.meta_payload
FROM p
JOIN unnest(%(of)b::bigint[], %(ords)b::bigint[], %(ser_ids)b::int[], %(manifests)b::text[], %(payloads)b::bytea[],
    %(meta_ser_ids)b::int[], %(meta_manifests)b::text[], %(meta_payloads)b::bytea[])
    AS e(n, ord, ser_id, manifest, payload, meta_ser_id, meta_manifest, meta_payload) ON e.n = p.n
RETURNING persistence_id, seq_nr
"""
# One event (the common case) without arrays: measurably cheaper for the server to plan and run.
ONE_EVENT = "(SELECT %(ser_id)s::int AS ser_id, %(manifest)s::text AS manifest, %(payload)s::bytea AS payload, " \
    "1 AS ord) AS e"


# Payload values as the INSERT writes them: bytes into BYTEA, or (Akka's ``payload-column-type = JSONB``)
# the serializer's JSON bytes converted to JSONB, as Akka's journal binds them.
BYTEA_PAYLOADS = {"payload": "e.payload", "meta_payload": "%(meta_payload)s"}
JSONB_PAYLOAD = "convert_from(e.payload, 'UTF8')::jsonb"
JSONB_META = "convert_from(%(meta_payload)s::bytea, 'UTF8')::jsonb"


@functools.cache
def insert_sql(table: str, *, after_latest: bool = False, single: bool, payload: str = BYTEA_PAYLOADS["payload"],
               meta_payload: str = BYTEA_PAYLOADS["meta_payload"], after: str | None = None,
               tags: bool = True, meta: bool = True) -> str:
    """The append statement for ``table`` (the dialect's table for the slice). ``after``: ``expected``,
    ``latest`` or ``known`` (see :data:`PREVIOUS`; default from ``after_latest``); without ``tags`` or
    ``meta``: without that column (parameter ``tags``) or those columns (``meta_*``)."""
    after = after or ("latest" if after_latest else "expected")
    parts = [part for part, wanted in ((_TAGS, tags), (_META, meta)) if wanted]
    extra = {"tags_meta": "".join(p[0] for p in parts),
             "tags_meta_values": "".join(p[1] for p in parts).format(meta_payload=meta_payload)}
    if after == "known" and single:
        return ONE_AFTER_KNOWN.format(table=table, payload=payload.replace("e.payload", "%(payload)s::bytea"),
                                      **extra)
    return INSERT.format(table=table, prev=PREVIOUS[after].format(table=table), events=ONE_EVENT if single else
                         MANY_EVENTS, payload=payload, **extra)


def read_payload(column: str, jsonb: bool) -> str:
    """A payload column as bytes in a select list (JSONB: its JSON text, which Jackson reads alike)."""
    return f"convert_to({column}::text, 'UTF8') AS {column}" if jsonb else column


def int_array(items: Iterable[int]) -> str:
    """``items`` as a PostgreSQL array literal for a ``%s::int[]`` or ``%s::bigint[]`` parameter (as
    :func:`text_array`: no per-element adaptation)."""
    return "{" + ",".join([str(item) for item in items]) + "}"


def text_array(items: Iterable[str]) -> str:
    """``items`` as a PostgreSQL array literal for a ``%s::text[]`` parameter: psycopg's list dumper inspects
    the elements on every call, a quoted string costs next to nothing."""
    return "{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items) + "}"


Query = tuple[str, tuple[Any, ...] | dict[str, Any]]


class EventStore:
    """The SQL over ``event_journal`` for one dialect: each method returns ``(sql, params)`` for the caller's
    connection (sync or async alike) and nothing else names the table. A persistence id's statements go to
    the dialect's table for its slice (a partition on PostgreSQL: no pruning cost per statement)."""

    def __init__(self, dialect: Slicing, *, jsonb: frozenset[str] = frozenset()) -> None:
        self._dialect = dialect
        #: Which of ``event_payload`` / ``meta_payload`` are JSONB columns (Akka's JSONB payload option).
        self.jsonb = frozenset(jsonb)
        #: What the append writes into the payload columns (see :data:`BYTEA_PAYLOADS`).
        self.payload_sql = {
            "payload": JSONB_PAYLOAD if "event_payload" in self.jsonb else BYTEA_PAYLOADS["payload"],
            "meta_payload": JSONB_META if "meta_payload" in self.jsonb else BYTEA_PAYLOADS["meta_payload"]}
        #: :data:`EVENT_COLUMNS` with JSONB payloads read back as bytes.
        self.columns = EVENT_COLUMNS
        for column in self.jsonb:
            self.columns = self.columns.replace(column, read_payload(column, True))

    def check_payloads(self, pid: str, encoded: Iterable[Any], meta: Any = None) -> None:
        """Refuse, before any SQL, payloads a JSONB column cannot hold (Akka's JSONB option needs a JSON
        serializer: primitives, CBOR or bytes cannot go there). ``encoded``: the serializer's results."""
        checks = [(e, "event_payload") for e in encoded] + ([(meta, "meta_payload")] if meta is not None else [])
        for item, column in checks:
            if column not in self.jsonb:
                continue
            try:
                json.loads(bytes(item.payload))
            except ValueError:
                raise SerializationError(
                    f"{column} of event_journal is JSONB, so only JSON payloads can be stored; the payload for "
                    f"{pid!r} has ser_id {item.ser_id} and manifest {item.manifest!r} and is not JSON "
                    f"({bytes(item.payload)[:40]!r}); register the type as JSON (ser_id 31)",
                    persistence_id=pid, ser_id=item.ser_id, manifest=item.manifest) from None

    def table(self, slice_: int) -> str:
        """The table of a slice's events (for the sibling stores that extend these statements)."""
        return self._dialect.event_table(slice_)

    def batch_table(self, slice_: int) -> str:
        """The table of a statement over several persistence ids (see :meth:`Dialect.batch_table
        <pgjournal.dialects.base.Dialect.batch_table>`)."""
        return self._dialect.batch_table(slice_)

    # -- writes ----------------------------------------------------------------------------------------

    def append(self, slice_: int, *, after_latest: bool = False, single: bool, after: str | None = None,
               tags: bool = True, meta: bool = True) -> str:
        """The append statement (parameters: see :mod:`pgjournal.write.event_writer`; ``after``, ``tags``, ``meta``: see
        :func:`insert_sql`)."""
        return insert_sql(self.table(slice_), after_latest=after_latest, single=single, after=after, tags=tags,
                          meta=meta, **self.payload_sql)

    def append_many_with_metadata(self, slice_: int) -> str:
        """Events of several persistence ids of one table (the :meth:`batch_table` of ``slice_``), each after its own
        ``expected`` and each event with its own ``meta_*``, in one statement; no tags; BYTEA metadata only (see
        :attr:`jsonb`). Per persistence id the arrays ``slices``, ``entity_types``, ``pids``, ``expecteds``; per
        event ``of`` (the 1-based index of its persistence id there), ``ords`` (1, 2, ... within it) beside
        ``ser_ids``, ``manifests``, ``payloads``, ``meta_ser_ids``, ``meta_manifests``, ``meta_payloads``. A
        persistence id whose ``expected`` event does not exist gets no row (the caller sees it in what returns:
        ``persistence_id, seq_nr``); one that lost the race for a number raises the key's unique violation."""
        assert "meta_payload" not in self.jsonb, "metadata of their own per event go to a BYTEA meta_payload"
        return MANY_PIDS_WITH_META.format(table=self.batch_table(slice_), next_timestamp=NEXT_TIMESTAMP)

    def mark_deleted(self, pid: str, to_seq_nr: int) -> Query:
        """Logical delete of the events up to ``to_seq_nr`` (rowcount: how many)."""
        slice_ = slice_for_persistence_id(pid)
        return (f"UPDATE {self.table(slice_)} SET deleted = true WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr <= %s AND deleted = false", (pid, slice_, to_seq_nr))

    def count_or_delete(self, pid: str, *, keep_last: bool, count: bool) -> Query:
        """Physical cleanup of a persistence id's events (``keep_last``: all but the highest); ``count``:
        how many would go, instead of deleting them."""
        slice_ = slice_for_persistence_id(pid)
        table = self.table(slice_)
        where = "persistence_id = %s AND slice = %s"
        params: tuple[Any, ...] = (pid, slice_)
        if keep_last:
            where += f" AND seq_nr < (SELECT max(seq_nr) FROM {table} WHERE persistence_id = %s AND slice = %s)"
            params += (pid, slice_)
        return (f"SELECT count(*) FROM {table} WHERE {where}" if count else f"DELETE FROM {table} WHERE {where}",
                params)

    def mark_all_deleted(self, pid: str) -> Query:
        slice_ = slice_for_persistence_id(pid)
        return f"UPDATE {self.table(slice_)} SET deleted = true WHERE persistence_id = %s AND slice = %s", (
            pid, slice_)

    # -- reads by persistence id -----------------------------------------------------------------------

    def highest_seq_nr(self, pid: str) -> Query:
        """One row: the highest sequence number written (logically deleted events count), 0 when none."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT COALESCE(MAX(seq_nr), 0) FROM {self.table(slice_)} WHERE persistence_id = %s "
                "AND slice = %s", (pid, slice_))

    def by_persistence_id(self, pid: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> Query:
        """Rows of :data:`EVENT_COLUMNS`, not deleted, in sequence order."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT {self.columns} FROM {self.table(slice_)} WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr >= %s AND seq_nr <= %s AND deleted = false ORDER BY seq_nr LIMIT %s",
                (pid, slice_, from_seq_nr, to_seq_nr, limit))

    def between(self, pid: str, after: int, before: int, floor: datetime) -> Query:
        """Rows of :data:`EVENT_COLUMNS` with ``after < seq_nr < before`` and ``db_timestamp >= floor``."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT {self.columns} FROM {self.table(slice_)} WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr > %s AND seq_nr < %s AND db_timestamp >= %s AND deleted = false ORDER BY seq_nr",
                (pid, slice_, after, before, floor))

    def previous(self, pid: str, seq_nr: int, floor: datetime) -> Query:
        """One row: the db_timestamp of the event before ``seq_nr`` (NULL when missing or deleted), and the
        highest sequence number below ``seq_nr`` written before ``floor`` (0 when none)."""
        slice_ = slice_for_persistence_id(pid)
        table = self.table(slice_)
        return (f"SELECT (SELECT db_timestamp FROM {table} WHERE persistence_id = %(pid)s AND slice = %(slice)s "
                "AND seq_nr = %(prev)s AND deleted = false), (SELECT COALESCE(max(seq_nr), 0) FROM "
                f"{table} WHERE persistence_id = %(pid)s AND slice = %(slice)s AND seq_nr < %(seq)s "
                "AND db_timestamp < %(floor)s)",
                {"pid": pid, "slice": slice_, "prev": seq_nr - 1, "seq": seq_nr, "floor": floor})

    @staticmethod
    def first_event(entity_type: str, slices: list[int], before: datetime) -> Query:
        """One row (or none): the db_timestamp of the first event of ``slices`` before ``before`` (an ordered
        walk of the time index that stops at the first match)."""
        return ("SELECT db_timestamp FROM event_journal WHERE entity_type = %(entity_type)s "
                "AND slice = ANY(%(slices)s) AND deleted = false AND db_timestamp < %(before)s "
                "ORDER BY db_timestamp LIMIT 1", {"entity_type": entity_type, "slices": slices, "before": before})

    def writer_of(self, pid: str, seq_nr: int) -> Query:
        """One row (or none): the ``writer`` of an event."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT writer FROM {self.table(slice_)} WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr = %s", (pid, slice_, seq_nr))

    def timestamp_of_sql(self, slice_: int) -> str:
        """A scalar subquery (named parameters ``pid``, ``slice``, ``seq_nr``): an event's db_timestamp."""
        return (f"(SELECT db_timestamp FROM {self.table(slice_)} WHERE persistence_id = %(pid)s "
                "AND slice = %(slice)s AND seq_nr = %(seq_nr)s)")

    def tags_of(self, pid: str) -> Query:
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT DISTINCT unnest(tags) FROM {self.table(slice_)} WHERE persistence_id = %s "
                "AND slice = %s", (pid, slice_))

    def tagged(self, pid: str, tags: list[str]) -> Query:
        """(seq_nr, db_timestamp, tags, ser_id, manifest, payload, meta...) of events carrying any of ``tags``,
        logically deleted ones included, in sequence order (the tag view's rebuild)."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT seq_nr, db_timestamp, tags, event_ser_id, event_ser_manifest, "
                f"{read_payload('event_payload', 'event_payload' in self.jsonb)}, meta_ser_id, meta_ser_manifest, "
                f"{read_payload('meta_payload', 'meta_payload' in self.jsonb)} FROM {self.table(slice_)} "
                "WHERE persistence_id = %s "
                "AND slice = %s AND tags && %s::text[] ORDER BY seq_nr", (pid, slice_, tags))

    @staticmethod
    def predecessors(pids: list[str], slices: list[int], seqs: list[int]) -> Query:
        """(pid, seq_nr, db_timestamp) of the event before ``seqs[i]`` of each ``pids[i]``, where it exists and
        is not deleted."""
        return PREDECESSORS, {"pids": pids, "slices": slices, "seqs": seqs}

    @staticmethod
    def persistence_ids(after: str, limit: int) -> Query:
        return ("SELECT DISTINCT persistence_id FROM event_journal WHERE persistence_id > %s "
                "ORDER BY persistence_id LIMIT %s", (after, limit))

    # -- lookups (Akka's timestampOf, loadEnvelope, currentPersistenceIds(entityType, afterId, limit)) ---

    def timestamp_of(self, pid: str, seq_nr: int) -> Query:
        """One row (or none): the db_timestamp of an event that is not deleted."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT db_timestamp FROM {self.table(slice_)} WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr = %s AND deleted = false", (pid, slice_, seq_nr))

    def one_event(self, pid: str, seq_nr: int) -> Query:
        """One row of :data:`EVENT_COLUMNS` (or none): an event that is not deleted."""
        slice_ = slice_for_persistence_id(pid)
        return (f"SELECT {EVENT_COLUMNS} FROM {self.table(slice_)} WHERE persistence_id = %s AND slice = %s "
                "AND seq_nr = %s AND deleted = false", (pid, slice_, seq_nr))

    @staticmethod
    def persistence_ids_of_type(entity_type: str, after: str, limit: int) -> Query:
        """Keyset page of the persistence ids of one entity type (the primary-key index, in id order; rows of
        other types are filtered on the way)."""
        return ("SELECT DISTINCT persistence_id FROM event_journal WHERE entity_type = %s AND persistence_id > %s "
                "ORDER BY persistence_id LIMIT %s", (entity_type, after, limit))

    # -- reads by slice --------------------------------------------------------------------------------

    def page_sql(self, min_slice: int, max_slice: int, tags: tuple[str, ...] | None = None, *, sparse: bool = True
                 ) -> tuple[str, dict[str, Any]]:
        """The by-slice page (:data:`PAGE`) for a slice range, and the range's parameters. With ``tags``: the
        events carrying any of them; ``sparse``, only those rows (:data:`TAGGED`: the tagged events' index),
        else every row, those without the tags as markers without payloads (:meth:`marker_columns`)."""
        slices, params = self._dialect.slice_condition(min_slice, max_slice)
        if tags is None:
            return PAGE.format(columns=self.columns, slices=slices, tagged=""), params
        params["tags"] = list(tags)
        if sparse:
            return PAGE.format(columns=self.columns, slices=slices, tagged=TAGGED), params
        return PAGE.format(columns=self.marker_columns(), slices=slices, tagged=""), params

    def marker_columns(self) -> str:
        """:data:`EVENT_COLUMNS` whose payloads are NULL where the row carries none of the ``tags`` parameter."""
        columns = []
        for name in EVENT_COLUMNS.split(", "):
            if name in ("event_payload", "meta_payload"):
                value = f"convert_to({name}::text, 'UTF8')" if name in self.jsonb else name
                name = f"CASE WHEN tags && %(tags)s::text[] THEN {value} END AS {name}"
            columns.append(name)
        return ", ".join(columns)


# Rows from from_ts on, skipping those at from_ts that the cursor's seen map holds (read by the previous page, or
# consumed before the offset), in the order of the time index (entity_type, db_timestamp, seq_nr, ...): no sort
# node (a tie-breaker column the index lacks made the server sort every page, incrementally: a large part of its
# work per row). Rows that share a timestamp and a number come in no particular order; the seen map, not a key
# position, says which of them were read (see pgjournal.query.by_slices).
PAGE = """
SELECT {columns} FROM event_journal
WHERE entity_type = %(entity_type)s AND {slices} AND deleted = false{tagged}
  AND db_timestamp >= %(from_ts)s AND db_timestamp < %(until)s
  AND NOT (db_timestamp = %(from_ts)s
           AND seq_nr <= COALESCE((SELECT s.seq FROM unnest(%(seen_pids)s::text[], %(seen_seqs)s::bigint[])
                                   AS s(pid, seq) WHERE s.pid = persistence_id), 0))
ORDER BY db_timestamp, seq_nr
LIMIT %(limit)s"""
#: A page's filter on tags (any of them): implies ``tags IS NOT NULL``, so the page may walk the tagged events'
#: index (``event_journal_tagged_idx``, a partial index) in the same order.
TAGGED = " AND tags && %(tags)s::text[]"
# One primary-key probe per pid. A plain join over unnest was planned as a hash join over a sequential scan of
# every partition once the table had statistics (the whole journal read on a restart's first page); so was a
# bare LATERAL, which the planner flattens into the same join. LIMIT 1 keeps the subquery apart: a nested loop
# of index probes with run-time partition pruning (EXPLAIN at 10k and 1M events: bench/restart_plans.py).
PREDECESSORS = """
SELECT u.pid, e.seq_nr, e.db_timestamp
FROM unnest(%(pids)s::text[], %(slices)s::int[], %(seqs)s::bigint[]) AS u(pid, slice, seq)
CROSS JOIN LATERAL (
    SELECT p.seq_nr, p.db_timestamp FROM event_journal AS p
    WHERE p.persistence_id = u.pid AND p.seq_nr = u.seq - 1 AND p.slice = u.slice AND NOT p.deleted
    LIMIT 1) AS e"""
