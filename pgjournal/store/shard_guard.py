"""SQL of the shard guards and of a move's record (docs/sharding.md, sections 3 and 6).

A guard is a ``CHECK`` constraint named :data:`GUARD` on every table (or, for a table partitioned by slice, every
partition) whose rows belong to a slice, admitting the slices its database owns. It is added ``NOT VALID`` (no
scan) and checks every new or updated row, whoever writes it: a stale process's, Akka's. A refused write fails
with SQLSTATE 23514 naming :data:`GUARD` (:mod:`pgjournal.write.failures` maps it to ``ShardLayoutMismatch``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import tuple_row

from pgjournal.store import Query, Read, rows, scalars
from pgjournal.store.shard_layout import LAYOUT_TABLE, SLICED_TABLES

GUARD = "pgjournal_shard_guard"
#: The tables whose rows carry a slice and are guarded and moved with it: the journal, snapshots, durable state,
#: and the projections' offsets (so a projection of a moved range resumes from its offsets on the target).
GUARDED_TABLES = (*SLICED_TABLES, "projection_timestamp_offset_store")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_BOUND = re.compile(r"FROM \((\d+)\) TO \((\d+)\)")


@dataclass(frozen=True, slots=True)
class Leaf:
    """A table rows are stored in: ``table`` itself, or one of its partitions (``bounds`` its slices)."""

    table: str
    name: str
    bounds: tuple[int, int] | None
    guarded: bool


@dataclass(frozen=True, slots=True)
class _LeafRow:
    table: str
    name: str
    bound: str | None
    guarded: bool


def leaves() -> Read[_LeafRow]:
    """Every leaf table of :data:`GUARDED_TABLES` that exists here (an adopted Akka journal's view has none)."""
    return rows(_LeafRow, """
WITH RECURSIVE tree (oid, root) AS (
    SELECT c.oid, c.relname::text FROM pg_class c
    WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid)
    UNION ALL
    SELECT i.inhrelid, t.root FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)
SELECT t.root, c.relname::text, pg_get_expr(c.relpartbound, c.oid),
       EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.conname = %s)
FROM tree t JOIN pg_class c ON c.oid = t.oid WHERE c.relkind = 'r' ORDER BY 1, 2""", (list(GUARDED_TABLES), GUARD))


def leaf_of(row: _LeafRow) -> Leaf:
    match = _BOUND.search(row.bound or "")
    bounds = (int(match[1]), int(match[2]) - 1) if match else None
    return Leaf(row.table, row.name, bounds, row.guarded)


def guard_expression(ranges: Sequence[tuple[int, int]]) -> str:
    """The check admitting ``ranges`` (none: nothing)."""
    if not ranges:
        return "false"
    return " OR ".join(f"slice BETWEEN {int(lo)} AND {int(hi)}" for lo, hi in ranges)


def set_guard(leaf: str, ranges: Sequence[tuple[int, int]]) -> Query:
    """Replace ``leaf``'s guard by one admitting ``ranges``: one statement, so one brief ACCESS EXCLUSIVE lock,
    taken after the transactions writing ``leaf`` ended."""
    if not _NAME.match(leaf):
        raise ValueError(f"not a table name: {leaf!r}")
    return (f'ALTER TABLE "{leaf}" DROP CONSTRAINT IF EXISTS {GUARD}, '
            f"ADD CONSTRAINT {GUARD} CHECK ({guard_expression(ranges)}) NOT VALID", ())


def drop_guard(leaf: str) -> Query:
    if not _NAME.match(leaf):
        raise ValueError(f"not a table name: {leaf!r}")
    return f'ALTER TABLE "{leaf}" DROP CONSTRAINT IF EXISTS {GUARD}', ()


def lock_timeout(seconds: float) -> Query:
    """For the transaction: give up waiting for a lock after ``seconds`` (SQLSTATE 55P03)."""
    return "SELECT set_config('lock_timeout', %s, true)", (f"{max(1, round(seconds * 1000))}ms",)


# -- a move's record ----------------------------------------------------------------------------------------

#: The move's columns of the layout record (added when a move starts: a layout never moved has none).
MOVE_COLUMNS_SQL = f"""
ALTER TABLE {LAYOUT_TABLE}
    ADD COLUMN IF NOT EXISTS move_range TEXT,
    ADD COLUMN IF NOT EXISTS move_source UUID,
    ADD COLUMN IF NOT EXISTS move_target UUID,
    ADD COLUMN IF NOT EXISTS move_step TEXT,
    ADD COLUMN IF NOT EXISTS move_rows BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS move_next_slice INTEGER,
    ADD COLUMN IF NOT EXISTS move_mark TIMESTAMPTZ"""


@dataclass(frozen=True, slots=True)
class MoveRow:
    """A database's record with its move's columns (columns in SELECT order)."""

    version: int
    layout: str
    database_id: uuid.UUID
    state: str
    move_range: str | None
    move_source: uuid.UUID | None
    move_target: uuid.UUID | None
    move_step: str | None
    move_rows: int
    move_next_slice: int | None
    move_mark: datetime | None
    changed_at: datetime


def add_move_columns() -> Query:
    return MOVE_COLUMNS_SQL, ()


def move_record(*, lock: bool = False) -> Read[MoveRow]:
    return rows(MoveRow, f"SELECT version, layout, database_id, state, move_range, move_source, move_target, "
                         f"move_step, move_rows, move_next_slice, move_mark, changed_at FROM {LAYOUT_TABLE}"
                         + (" FOR UPDATE" if lock else ""))


def has_move_columns() -> Read[bool]:
    return scalars("SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = %s "
                   "AND column_name = 'move_step' AND table_schema = current_schema())", (LAYOUT_TABLE,))


def insert_target_record(version: int, layout: str, database_id: uuid.UUID, move_range: str,
                         source: uuid.UUID, step: str) -> Query:
    """The target's record when a move is planned: the current layout (no range of it is the target's yet)."""
    return (f"INSERT INTO {LAYOUT_TABLE} (version, layout, database_id, state, move_range, move_source, "
            "move_target, move_step, move_next_slice) VALUES (%s, %s, %s, 'moving', %s, %s, %s, %s, %s) "
            "ON CONFLICT (one) DO NOTHING", (version, layout, database_id, move_range, source, database_id, step,
                                             int(move_range.split("-")[0])))


def record_move(step: str | None, *, state: str, move_range: str | None = None, source: uuid.UUID | None = None,
                target: uuid.UUID | None = None, rows_added: int = 0, next_slice: int | None = None,
                mark: datetime | None = None) -> Query:
    """Record the move's ``step`` (``None`` with ``state = 'stable'``: no move) in this database's record."""
    return (f"UPDATE {LAYOUT_TABLE} SET state = %s, move_step = %s, move_range = %s, move_source = %s, "
            "move_target = %s, move_rows = CASE WHEN %s::text IS NULL THEN 0 ELSE move_rows + %s END, "
            "move_next_slice = %s, move_mark = %s, changed_at = CURRENT_TIMESTAMP",
            (state, step, move_range, source, target, step, rows_added, next_slice, mark))


def record_layout(version: int, layout: str) -> Query:
    return (f"UPDATE {LAYOUT_TABLE} SET version = %s, layout = %s, changed_at = CURRENT_TIMESTAMP",
            (version, layout))


def delete_record() -> Query:
    return f"DELETE FROM {LAYOUT_TABLE}", ()


# -- copying a range's rows ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Columns:
    """A table's stored columns and its primary key."""

    names: tuple[str, ...]
    key: tuple[str, ...]


def columns(table: str) -> Read[tuple[list[str], list[str]]]:
    """``table``'s columns that are written (not generated), in order, and its primary key's."""
    return Read(sql="""
SELECT array(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
             ORDER BY a.attnum),
       array(SELECT a.attname::text FROM pg_index i JOIN pg_attribute a
                ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum))
FROM pg_class c WHERE c.relname = %s AND pg_table_is_visible(c.oid)""", params=(table,),
                row=tuple_row)


#: The column a row's last change is stamped with, where a table has one a catch-up pass can select by.
CHANGED_AT = {"event_journal": "db_timestamp", "durable_state": "db_timestamp"}
#: What a slice's rows are checked by, source against target, after the seal (a count alone misses an update).
DIGEST = {"event_journal": "count(*), coalesce(sum(seq_nr), 0), count(*) FILTER (WHERE deleted)",
          "durable_state": "count(*), coalesce(sum(revision), 0), 0",
          "snapshot": "count(*), coalesce(sum(seq_nr), 0), 0",
          "projection_timestamp_offset_store": "count(*), coalesce(sum(seq_nr), 0), 0"}


def _checked(table: str) -> str:
    if table not in GUARDED_TABLES:
        raise ValueError(f"not a guarded table: {table!r}")
    return table


def copy_out(table: str, cols: Columns, lo: int, hi: int, since: datetime | None) -> Query:
    """``COPY ... TO STDOUT`` of ``table``'s rows of slices ``lo..hi`` (changed at or after ``since``)."""
    listed = ", ".join(cols.names)
    where = "slice BETWEEN %s AND %s"
    params: tuple[object, ...] = (lo, hi)
    if since is not None and table in CHANGED_AT:
        where += f" AND {CHANGED_AT[table]} >= %s"
        params = (lo, hi, since)
    return f"COPY (SELECT {listed} FROM {_checked(table)} WHERE {where}) TO STDOUT (FORMAT BINARY)", params


def staging(table: str) -> Query:
    return (f"CREATE TEMP TABLE IF NOT EXISTS pgjournal_moving_{_checked(table)} "
            f"(LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS", ())


def copy_in(table: str, cols: Columns) -> Query:
    return f"COPY pgjournal_moving_{_checked(table)} ({', '.join(cols.names)}) FROM STDIN (FORMAT BINARY)", ()


def merge_staged(table: str, cols: Columns) -> Query:
    """The staged rows into ``table``: new rows inserted, changed rows updated (copying again is harmless)."""
    listed = ", ".join(cols.names)
    rest = [c for c in cols.names if c not in cols.key]
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in rest)
    differs = (f"({', '.join(f'{table}.{c}' for c in rest)}) IS DISTINCT FROM "
               f"({', '.join(f'EXCLUDED.{c}' for c in rest)})")
    return (f"INSERT INTO {_checked(table)} ({listed}) SELECT {listed} FROM pgjournal_moving_{table} "
            f"ON CONFLICT ({', '.join(cols.key)}) DO UPDATE SET {sets} WHERE {differs}", ())


def delete_slices(table: str, lo: int, hi: int, limit: int | None = None) -> Query:
    """Delete ``table``'s rows of slices ``lo..hi`` (at most ``limit``, for batches)."""
    if limit is None:
        return f"DELETE FROM {_checked(table)} WHERE slice BETWEEN %s AND %s", (lo, hi)
    return (f"DELETE FROM {_checked(table)} WHERE (tableoid, ctid) IN (SELECT tableoid, ctid FROM {table} "
            "WHERE slice BETWEEN %s AND %s LIMIT %s)", (lo, hi, limit))


def digests(table: str, lo: int, hi: int) -> Read[tuple[int, int, int, int]]:
    """Per slice of ``lo..hi``: what :data:`DIGEST` checks."""
    return Read(f"SELECT slice, {DIGEST[_checked(table)]} FROM {table} WHERE slice BETWEEN %s AND %s "
                "GROUP BY slice", (lo, hi), tuple_row)


def clock() -> Read[datetime]:  # a row always
    return scalars("SELECT clock_timestamp()")


def newest_change(table: str, lo: int, hi: int) -> Read[datetime | None]:
    return scalars(f"SELECT max({CHANGED_AT[table]}) FROM {_checked(table)} WHERE slice BETWEEN %s AND %s", (lo, hi))
