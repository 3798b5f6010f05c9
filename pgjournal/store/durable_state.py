"""SQL of the durable state store (``durable_state``, Akka Persistence R2DBC's table): one row per persistence
id, updated in place at each revision.

Writes are optimistic on the revision: revision 1 inserts (and finds nothing when the persistence id has a
row), revision ``n`` updates the row at ``n - 1``. No row back means another writer got there first. Both
stamp ``db_timestamp`` with ``clock_timestamp()`` read while the statement holds its write lock on the table
(the visibility horizon of ``changes_by_slices`` relies on it, as the journal's does: see
:mod:`pgjournal.core.horizon`), never earlier than the previous revision's plus 1 µs.

The statements work on Akka's own DDL as well (primary key ``(persistence_id, revision)``): they never
count on ``ON CONFLICT (persistence_id)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgjournal.model.slices import entity_type_of, slice_for_persistence_id

if TYPE_CHECKING:
    from pgjournal.store.tables import Slicing

Query = tuple[str, tuple[Any, ...] | dict[str, Any]]

TABLE = "durable_state"
#: Column list of every row the store returns, in order: the first five are where the by-slice machinery
#: expects them (slice, entity_type, persistence_id, number, db_timestamp).
STATE_COLUMNS = ("slice, entity_type, persistence_id, revision, db_timestamp, state_ser_id, state_ser_manifest, "
                 "state_payload, tags")
#: What a deleted state stores (Akka's ``deleteObject`` with a revision): ser_id 0 (what readers go by), no
#: manifest, no bytes.
DELETED_SER_ID = 0

INSERT_FIRST = f"""
INSERT INTO {TABLE} (slice, entity_type, persistence_id, revision, db_timestamp, state_ser_id, state_ser_manifest,
    state_payload, tags)
SELECT %(slice)s::int, %(entity_type)s::varchar, %(pid)s::varchar, 1, clock_timestamp(), %(ser_id)s::int,
    %(manifest)s::varchar, %(payload)s::bytea, %(tags)s::text[]
WHERE NOT EXISTS (SELECT 1 FROM {TABLE} WHERE persistence_id = %(pid)s::varchar)
RETURNING db_timestamp"""
UPDATE_NEXT = f"""
UPDATE {TABLE} SET revision = %(revision)s::bigint,
    db_timestamp = GREATEST(clock_timestamp(), db_timestamp + INTERVAL '1 microsecond'),
    state_ser_id = %(ser_id)s, state_ser_manifest = %(manifest)s, state_payload = %(payload)s, tags = %(tags)s::text[]
WHERE persistence_id = %(pid)s::varchar AND revision = %(revision)s::bigint - 1
RETURNING db_timestamp"""

# The journal's by-slice page (pgjournal.store.events.PAGE) over this table, with the revision as the number.
PAGE = f"""
SELECT {STATE_COLUMNS} FROM {TABLE}
WHERE entity_type = %(entity_type)s AND {{slices}}
  AND db_timestamp >= %(from_ts)s AND db_timestamp < %(until)s
  AND NOT (db_timestamp = %(from_ts)s
           AND revision <= COALESCE((SELECT s.seq FROM unnest(%(seen_pids)s::text[], %(seen_seqs)s::bigint[])
                                     AS s(pid, seq) WHERE s.pid = persistence_id), 0))
ORDER BY db_timestamp, revision
LIMIT %(limit)s"""


class DurableStateSQL:
    """The SQL over ``durable_state`` for one dialect; each method returns ``(sql, params)``."""

    def __init__(self, dialect: Slicing) -> None:
        self._dialect = dialect

    @staticmethod
    def get(pid: str) -> Query:
        """One row of :data:`STATE_COLUMNS`, or none."""
        return f"SELECT {STATE_COLUMNS} FROM {TABLE} WHERE persistence_id = %s", (pid,)

    @staticmethod
    def revision(pid: str) -> Query:
        """One row (or none): the current revision (after a failed write, for the error)."""
        return f"SELECT revision FROM {TABLE} WHERE persistence_id = %s", (pid,)

    @staticmethod
    def write(pid: str, revision: int, ser_id: int, manifest: str, payload: bytes, tags: list[str] | None) -> Query:
        """Revision ``revision`` of ``pid``: one row back (its db_timestamp) when written, none when the
        current revision is not ``revision - 1`` (``0``: no row)."""
        params = {"slice": slice_for_persistence_id(pid), "entity_type": entity_type_of(pid), "pid": pid,
                  "revision": revision, "ser_id": ser_id, "manifest": manifest, "payload": payload, "tags": tags}
        return (INSERT_FIRST if revision == 1 else UPDATE_NEXT), params

    def page_sql(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, Any]]:
        """The by-slice page for a slice range (parameters as :data:`pgjournal.store.events.PAGE`'s)."""
        slices, params = self._dialect.slice_condition(min_slice, max_slice)
        return PAGE.format(slices=slices), params
