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

from psycopg import sql
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


def _composed(statement: sql.Composable) -> str:
    # Identifiers quoted by psycopg; no connection is needed for that (the stores return text).
    return statement.as_string(None)


def set_guard(leaf: str, ranges: Sequence[tuple[int, int]]) -> Query:
    """Replace ``leaf``'s guard by one admitting ``ranges``: one statement, so one brief ACCESS EXCLUSIVE lock,
    taken after the transactions writing ``leaf`` ended."""
    if not _NAME.match(leaf):
        raise ValueError(f"not a table name: {leaf!r}")
    # DDL takes no parameters: the check is built from integers only (guard_expression).
    return _composed(sql.SQL("ALTER TABLE {leaf} DROP CONSTRAINT IF EXISTS {guard}, ADD CONSTRAINT {guard} "
                             "CHECK ({check}) NOT VALID").format(
        leaf=sql.Identifier(leaf), guard=sql.Identifier(GUARD), check=sql.SQL(guard_expression(ranges)))), ()


def drop_guard(leaf: str) -> Query:
    if not _NAME.match(leaf):
        raise ValueError(f"not a table name: {leaf!r}")
    return _composed(sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
        sql.Identifier(leaf), sql.Identifier(GUARD))), ()


#: The advisory lock one move at a time holds on its target database (a session lock: released when the
#: mover's connection closes, a killed mover's included).
MOVE_LOCK = "pgjournal shard move"


def try_move_lock() -> Read[bool]:
    """Take :data:`MOVE_LOCK` for this session unless another holds it; whether it was taken."""
    return scalars("SELECT pg_try_advisory_lock(hashtext(%s))", (MOVE_LOCK,))


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


def _names(names: Sequence[str], prefix: str | None = None) -> sql.Composed:
    """``a, b`` (``t.a, t.b`` with ``prefix`` ``t``), each name quoted."""
    return sql.SQL(", ").join(sql.Identifier(*((prefix,) if prefix else ()), name) for name in names)


def _stamped(table: str, bounds: Sequence[tuple[datetime | None, str]]) -> tuple[sql.Composable, list[object]]:
    """``slice BETWEEN %s AND %s`` and, where ``table`` has a change stamp (:data:`CHANGED_AT`), a condition on it
    for each bound given (``(value, operator)``); the parameters after ``lo`` and ``hi``."""
    where: list[sql.Composable] = [sql.SQL("slice BETWEEN %s AND %s")]
    params: list[object] = []
    for bound, op in bounds:
        if bound is not None and table in CHANGED_AT:
            where.append(sql.SQL("{} {} %s").format(sql.Identifier(CHANGED_AT[table]), sql.SQL(op)))
            params.append(bound)
    return sql.SQL(" AND ").join(where), params


def copy_out(table: str, cols: Columns, lo: int, hi: int, since: datetime | None) -> Query:
    """``COPY ... TO STDOUT`` of ``table``'s rows of slices ``lo..hi`` (changed at or after ``since``)."""
    where, params = _stamped(table, [(since, ">=")])
    return _composed(sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT (FORMAT BINARY)").format(
        _names(cols.names), sql.Identifier(_checked(table)), where)), (lo, hi, *params)


def _staged(table: str) -> sql.Identifier:
    """The temporary table a copy of ``table``'s rows is staged in on the target."""
    return sql.Identifier(f"pgjournal_moving_{_checked(table)}")


def staging(table: str) -> Query:
    return _composed(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
                             ).format(_staged(table), sql.Identifier(table))), ()


def truncate_staging(table: str) -> Query:
    """Empty ``table``'s staging table (a copy merged earlier in the same transaction left its rows there)."""
    return _composed(sql.SQL("TRUNCATE {}").format(_staged(table))), ()


def copy_in(table: str, cols: Columns) -> Query:
    return _composed(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(_staged(table), _names(cols.names))), ()


def merge_staged(table: str, cols: Columns) -> Query:
    """The staged rows into ``table``: new rows inserted, changed rows updated (copying again is harmless)."""
    rest = [c for c in cols.names if c not in cols.key]
    sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest)
    return _composed(sql.SQL("INSERT INTO {table} ({listed}) SELECT {listed} FROM {staged} ON CONFLICT ({key}) "
                             "DO UPDATE SET {sets} WHERE ({old}) IS DISTINCT FROM ({new})").format(
        table=sql.Identifier(_checked(table)), listed=_names(cols.names), staged=_staged(table),
        key=_names(cols.key), sets=sets, old=_names(rest, table), new=_names(rest, "excluded"))), ()


def delete_slices(table: str, lo: int, hi: int, limit: int | None = None) -> Query:
    """Delete ``table``'s rows of slices ``lo..hi`` (at most ``limit``, for batches)."""
    name = sql.Identifier(_checked(table))
    if limit is None:
        return _composed(sql.SQL("DELETE FROM {} WHERE slice BETWEEN %s AND %s").format(name)), (lo, hi)
    return _composed(sql.SQL("DELETE FROM {0} WHERE (tableoid, ctid) IN (SELECT tableoid, ctid FROM {0} "
                             "WHERE slice BETWEEN %s AND %s LIMIT %s)").format(name)), (lo, hi, limit)


def digests(table: str, lo: int, hi: int, *, since: datetime | None = None,
            before: datetime | None = None) -> Read[tuple[int, int, int, int]]:
    """Per slice of ``lo..hi``: what :data:`DIGEST` checks, over the rows changed at or after ``since`` and
    before ``before`` where the table has a change stamp (:data:`CHANGED_AT`; the others: every row)."""
    where, params = _stamped(table, [(since, ">="), (before, "<")])
    return Read(_composed(sql.SQL("SELECT slice, {} FROM {} WHERE {} GROUP BY slice").format(
        sql.SQL(DIGEST[_checked(table)]), sql.Identifier(table), where)), (lo, hi, *params), tuple_row)


def table_oids() -> Read[list[int]]:
    """The guarded tables' oids and their partitions' (a statement naming a partition locks only that one)."""
    return scalars("""
WITH tables AS (SELECT oid FROM pg_class WHERE relname = ANY(%s) AND relkind IN ('r', 'p') AND pg_table_is_visible(oid))
SELECT array_agg(oid) FROM (SELECT oid FROM tables UNION SELECT inhrelid FROM pg_inherits
                            WHERE inhparent IN (SELECT oid FROM tables)) AS found""", (list(GUARDED_TABLES),))


# -- deletes during a move ------------------------------------------------------------------------------------
# A guard checks inserted and updated rows, never deleted ones. While a move runs, the source logs the keys of
# the moved range's deleted rows (an AFTER DELETE statement trigger per table, reading its transition table), so
# the verify after the seal deletes them on the target as well, without reading the range; from the seal on,
# the same trigger refuses such a delete (as the guard refuses a write), so none can come after the verify.

DELETE_LOG = "pgjournal_shard_move_deletes"
_WATCH = "pgjournal_shard_move_watch"


def create_delete_log() -> Query:
    return (f"CREATE TABLE IF NOT EXISTS {DELETE_LOG} (id BIGSERIAL PRIMARY KEY, table_name TEXT NOT NULL, "
            "key JSONB NOT NULL)", ())


def drop_delete_log() -> Query:
    return f"DROP TABLE IF EXISTS {DELETE_LOG}", ()


def watch_deletes(table: str, key: Sequence[str], lo: int, hi: int, relations: Sequence[str], schema: str
                  ) -> list[Query]:
    """The triggers on ``relations`` (``table`` and those of its partitions a move's rows are in: a statement
    naming a partition fires the partition's triggers only) logging the keys of the rows of ``lo..hi`` a
    statement deletes or updates (an update that changes no change stamp, as the logical delete of events, is
    caught so), or refusing the statement once this database's record says the range is sealed (SQLSTATE 23514
    on :data:`GUARD`, as a guard).

    The function runs as its owner (``SECURITY DEFINER``): the writer role, whose updates and deletes fire it,
    has no right on the log; its tables are named in ``schema`` and its search path holds only ``pg_catalog``
    and ``pg_temp`` (last), so a caller's own search path or temporary tables cannot stand in for them."""
    for name in (table, *key, *relations, schema):
        if not _NAME.match(name):
            raise ValueError(f"not a column, table or schema name: {name!r}")
    function = f"{_WATCH}_{_checked(table)}"
    built = ", ".join(f"'{column}', g.{column}" for column in key)
    body = f"""
BEGIN
    IF NOT EXISTS (SELECT 1 FROM gone g WHERE g.slice BETWEEN {int(lo)} AND {int(hi)}) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.{LAYOUT_TABLE} WHERE move_step IN ('sealed', 'switched')) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = '{GUARD}', TABLE = TG_TABLE_NAME,
            MESSAGE = 'slices {int(lo)}-{int(hi)} are being moved out of this database: a delete or update is refused';
    END IF;
    INSERT INTO {schema}.{DELETE_LOG} (table_name, key)
        SELECT '{table}', jsonb_build_object({built}) FROM gone g WHERE g.slice BETWEEN {int(lo)} AND {int(hi)};
    RETURN NULL;
END"""
    queries: list[Query] = [
        (f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
         f"SET search_path = pg_catalog, pg_temp AS $watch${body}$watch$", ()),
        (f"REVOKE ALL ON FUNCTION {function}() FROM PUBLIC", ())]
    for relation in relations:
        for event in ("DELETE", "UPDATE"):
            name = f"{_WATCH}_{event.lower()}"
            queries += [(f'DROP TRIGGER IF EXISTS {name} ON "{relation}"', ()),
                        (f'CREATE TRIGGER {name} AFTER {event} ON "{relation}" REFERENCING OLD TABLE AS gone '
                         f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()", ())]
    return queries


def unwatch_deletes(table: str) -> Query:
    """The triggers of :func:`watch_deletes` on ``table`` and its partitions dropped (with their function)."""
    return f"DROP FUNCTION IF EXISTS {_WATCH}_{_checked(table)}() CASCADE", ()


def delete_log_exists() -> Read[bool]:
    return scalars("SELECT to_regclass(%s) IS NOT NULL", (DELETE_LOG,))


@dataclass(frozen=True, slots=True)
class Deleted:
    """A logged delete: the row's table and key (a JSON object of its primary key's columns)."""

    id: int
    table_name: str
    key: dict[str, object]


def logged_deletes() -> Read[Deleted]:
    return rows(Deleted, f"SELECT id, table_name, key FROM {DELETE_LOG} ORDER BY id")


def forget_deletes(upto: int) -> Query:
    return f"DELETE FROM {DELETE_LOG} WHERE id <= %s", (upto,)


def _keyed(cols: Columns) -> sql.Composed:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier("t", c), sql.Identifier("d", c))
                                 for c in cols.key)


def delete_keys(table: str, cols: Columns, keys: str) -> Query:
    """Delete ``table``'s rows with the keys of ``keys`` (a JSON array of key objects)."""
    return _composed(sql.SQL("DELETE FROM {0} AS t USING jsonb_populate_recordset(NULL::{0}, %s::jsonb) AS d "
                             "WHERE {1}").format(sql.Identifier(_checked(table)), _keyed(cols))), (keys,)


def copy_keys_out(table: str, cols: Columns, keys: str) -> Query:
    """``COPY ... TO STDOUT`` of ``table``'s rows with the keys of ``keys`` (those still there)."""
    return _composed(sql.SQL("COPY (SELECT {0} FROM {1} AS t JOIN jsonb_populate_recordset(NULL::{1}, %s::jsonb) "
                             "AS d ON {2}) TO STDOUT (FORMAT BINARY)").format(
        _names(cols.names, "t"), sql.Identifier(_checked(table)), _keyed(cols))), (keys,)


def current_schema() -> Read[str]:
    """The schema the journal's tables are in (the first of the search path that exists)."""
    return scalars("SELECT current_schema()")


def clock() -> Read[datetime]:  # a row always
    return scalars("SELECT clock_timestamp()")


def analyze(table: str) -> Query:
    return _composed(sql.SQL("ANALYZE {}").format(sql.Identifier(_checked(table)))), ()
