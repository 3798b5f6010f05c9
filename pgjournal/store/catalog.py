"""Reads of PostgreSQL's system catalog and statistics views: which relations make up the journal, who holds a
write lock on them (the visibility horizon, :mod:`pgjournal.core.horizon`), what this role may see and do.
Nothing here touches a pgjournal table's rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgjournal.store import Query, Read, rows, scalars

# The journal table and its partitions: the relations a journal writer holds a write lock on (in an adopted
# Akka journal with data partitions, the tables event_journal_0.. behind the event_journal view).
JOURNAL_RELATIONS_SQL = """
SELECT to_regclass('event_journal')::oid
UNION SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('event_journal')
UNION SELECT oid FROM pg_class
      WHERE relname ~ '^event_journal_[0-9]+$' AND relkind = 'r' AND pg_table_is_visible(oid)"""
# The durable state table: the relation its writers hold a write lock on (changes_by_slices' horizon).
STATE_RELATIONS_SQL = "SELECT to_regclass('durable_state')::oid"
# Whether other roles' transaction starts are visible to this role (superuser or pg_read_all_stats).
SEES_ALL_SESSIONS_SQL = """
SELECT current_user, rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') FROM pg_roles
WHERE rolname = current_user"""

# Whether role {role} may write the rows of relation {rel}: add rows, change them (a column's UPDATE is
# enough) or delete them. Owners and superusers may; PUBLIC's grants count.
_WRITES = ("(has_table_privilege({role}, {rel}, 'DELETE') "
           "OR has_any_column_privilege({role}, {rel}, 'INSERT, UPDATE'))")
# ... or a role it may become (SET ROLE, inherited or not: MEMBER is every membership, of any option).
_MAY_WRITE = ("EXISTS (SELECT FROM pg_roles AS m WHERE pg_has_role({role}, m.oid, 'MEMBER') AND "
              + _WRITES.format(role="m.oid", rel="{rel}") + ")")
# Whether the session of login role a.usesysid can write journal relation l.relation: every lock holder that
# can is a journal writer. A lock alone needs no right (PREPARE of an INSERT takes RowExclusiveLock), so a
# session that can write no row (a reader's, a loader's) holds no reader back. A session can write through:
#   its login role or a role it may become (pg_stat_activity.usesysid, visible to every role, is the login
#   role; SET ROLE and SET SESSION AUTHORIZATION only reach roles it is a member of, or any for a superuser);
#   a function running with its owner's rights (SECURITY DEFINER, also as a trigger, which needs no EXECUTE
#   right): any such function whose owner may write the relation makes every session a writer;
#   a view or rule over the relation whose owner may write it (the rewritten statement runs with the view
#   owner's rights), for a session that may write that view or table.
# A session with no statistics row (a prepared transaction, a backend newer than this transaction's snapshot
# of pg_stat_activity) counts as a writer. Rights are read in the same statement as the clock: a right granted
# later can only let a session write rows stamped after that grant, i.e. after this reading.
_JOURNAL_WRITER = ("(a.usesysid IS NULL OR " + _MAY_WRITE.format(role="a.usesysid", rel="l.relation")
                   + " OR EXISTS (SELECT FROM pg_proc AS f WHERE f.prosecdef AND "
                   + _MAY_WRITE.format(role="f.proowner", rel="l.relation") + ")"
                   + " OR EXISTS (SELECT FROM pg_depend AS d JOIN pg_rewrite AS rw ON rw.oid = d.objid "
                   "JOIN pg_class AS v ON v.oid = rw.ev_class "
                   "WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass "
                   "AND d.refobjid = l.relation AND v.oid <> l.relation AND "
                   + _MAY_WRITE.format(role="v.relowner", rel="l.relation") + " AND "
                   + _MAY_WRITE.format(role="a.usesysid", rel="v.oid") + "))")

# The clock, then every transaction that can write a journal table and holds a write lock on one (one row
# with NULLs when there is none). ``xact_start`` is NULL where this role may not see the session. Rows are
# unpacked in pgjournal.core.horizon.HorizonTracker.read, in this order: clock, pid, virtualtransaction,
# xact_start, and the isolation the reading ran under (a page pipelined with it ran under the same).
WRITERS_SQL = """
SELECT CURRENT_TIMESTAMP, w.pid, w.virtualtransaction, w.xact_start, current_setting('transaction_isolation')
FROM (SELECT 1) AS one LEFT JOIN (
    SELECT DISTINCT l.pid, l.virtualtransaction, a.xact_start
    FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation = ANY(%(relations)s::oid[]) AND l.pid IS DISTINCT FROM pg_backend_pid()
      AND """ + _JOURNAL_WRITER + """
) AS w ON true"""
CLOCK_SQL = "SELECT CURRENT_TIMESTAMP"


@dataclass(frozen=True, slots=True)
class WriterRow:
    """A row of :data:`WRITERS_SQL`: the clock, then one writer (``None`` in each of its columns when none)."""

    clock: datetime
    pid: int | None
    virtualtransaction: str | None
    xact_start: datetime | None
    isolation: str


def writers(relations: Sequence[int]) -> Read[WriterRow]:
    """:data:`WRITERS_SQL` over ``relations`` (oids), its rows by name."""
    return rows(WriterRow, WRITERS_SQL, {"relations": list(relations)})


# The primary's WAL insert position in bytes, read after a horizon reading (pgjournal.core.replica): every commit
# that reading counted as done was inserted into the WAL before it.
WAL_INSERTED_SQL = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
# A standby's replayed WAL position in bytes (NULL on a server that never was a standby), and whether it still is
# one. A statement after this one sees every commit replayed up to that position.
WAL_REPLAYED_SQL = "SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn, pg_is_in_recovery()"


@dataclass(frozen=True, slots=True)
class Role:
    """:data:`SEES_ALL_SESSIONS_SQL`: the role connected, and whether it sees other roles' sessions."""

    name: str
    sees_all_sessions: bool


def journal_relations() -> Read[int | None]:
    """The OIDs of ``event_journal`` and its partitions (NULL when there is no such table)."""
    return scalars(JOURNAL_RELATIONS_SQL)


def state_relations() -> Read[int | None]:
    """The OID of ``durable_state`` (NULL when there is no such table)."""
    return scalars(STATE_RELATIONS_SQL)


def role() -> Read[Role]:
    return rows(Role, SEES_ALL_SESSIONS_SQL)


@dataclass(frozen=True, slots=True)
class Replayed:
    """:data:`WAL_REPLAYED_SQL`: a standby's replayed WAL position in bytes (``None``: never a standby), and
    whether it is in recovery still."""

    position: Any
    recovering: bool


def replayed() -> Read[Replayed]:
    return rows(Replayed, WAL_REPLAYED_SQL)


@dataclass(frozen=True, slots=True)
class ClusterDatabase:
    """Which database a connection reaches: its cluster's system identifier (a physical standby has its
    primary's) and the database's name."""

    system_identifier: int
    database: str


def cluster_database() -> Read[ClusterDatabase]:
    return rows(ClusterDatabase, "SELECT (SELECT system_identifier FROM pg_control_system()), current_database()")


def current_user() -> Read[str]:
    return scalars("SELECT current_user")


def table_exists(name: str) -> Read[bool]:
    """One row: whether a relation called ``name`` is visible on the search path."""
    return scalars("SELECT to_regclass(%s) IS NOT NULL", (name,))


def has_table_privilege(table: str, privilege: str) -> Read[bool]:
    """One row: whether the current role has ``privilege`` (``SELECT``, ``INSERT``, ...) on ``table``."""
    return scalars("SELECT has_table_privilege(%s, %s)", (table, privilege))


#: The other sessions holding a lock on a table of this database's current schema (backend pid, ``None`` for a
#: prepared transaction; login role; seconds its transaction has been open, ``None`` where this role may not see
#: it): what a migration's DDL waited for.
LOCK_HOLDERS_SQL = """
SELECT DISTINCT l.pid, a.usename, extract(epoch FROM clock_timestamp() - a.xact_start)::float8
FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid IS DISTINCT FROM pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND c.relnamespace = current_schema()::regnamespace
ORDER BY 1"""


def lock_timeout(seconds: float, *, local: bool = True) -> Query:
    """Give up waiting for a lock after ``seconds`` (at least 1 ms; SQLSTATE 55P03), for the transaction
    (``local``) or the session: what each piece of DDL or rewrite that must not queue long runs first."""
    return "SELECT set_config('lock_timeout', %s, %s)", (f"{max(1, round(seconds * 1000))}ms", local)
