"""SQL of the journal's write path: the append statement (one per ``append``) and its parts.

The statement finds the previous event of the persistence id, numbers the new events after it and stamps
them all with ``GREATEST(clock_timestamp(), previous + 1 µs)`` (see :mod:`pgjournal.write` for why the
clock and not the transaction start). The tag path (:mod:`pgjournal.tag_write`) builds on the same parts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

INSERT = """
INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, adapter_manifest,
    event_ser_id, event_ser_manifest, event_payload, tags, meta_ser_id, meta_ser_manifest, meta_payload)
SELECT %(slice)s, %(entity_type)s, %(pid)s, prev.seq_nr + e.ord, prev.ts, %(writer)s, '',
    e.ser_id, e.manifest, e.payload, %(tags)s::text[], %(meta_ser_id)s, %(meta_manifest)s, %(meta_payload)s
FROM ({prev}) AS prev
CROSS JOIN {events}
RETURNING seq_nr, db_timestamp
"""
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
MANY_EVENTS = """unnest(%(ser_ids)s::int[], %(manifests)s::text[], %(payloads)s::bytea[])
    WITH ORDINALITY AS e(ser_id, manifest, payload, ord)"""
# One event (the common case) without arrays: measurably cheaper for the server to plan and run.
ONE_EVENT = "(SELECT %(ser_id)s::int AS ser_id, %(manifest)s::text AS manifest, %(payload)s::bytea AS payload, " \
    "1 AS ord) AS e"


@functools.cache
def insert_sql(table: str, *, after_latest: bool, single: bool) -> str:
    """The append statement for ``table`` (the dialect's table for the slice)."""
    prev = (AFTER_LATEST if after_latest else AFTER_EXPECTED).format(table=table)
    return INSERT.format(table=table, prev=prev, events=ONE_EVENT if single else MANY_EVENTS)


def text_array(items: Iterable[str]) -> str:
    """``items`` as a PostgreSQL array literal for a ``%s::text[]`` parameter: psycopg's list dumper costs
    ~20 µs a call (it inspects the elements), a quoted string next to nothing."""
    return "{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items) + "}"
