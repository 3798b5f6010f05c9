"""SQL of the PostgreSQL key store (:class:`pgjournal.state.keystore.PostgresKeyStore`): one wrapped data key per
persistence id in ``pgjournal_payload_keys`` (revision 0007)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

Query = tuple[str, tuple[Any, ...]]

TABLE = "pgjournal_payload_keys"


def get(pid: str) -> Query:
    """One row (or none): the wrapped key of a persistence id."""
    return f"SELECT wrapped_key FROM {TABLE} WHERE persistence_id = %s", (pid,)


def insert(pid: str, wrapped: bytes) -> Query:
    """Store a new wrapped key; no row back when the persistence id has one already (a concurrent first write):
    then :func:`get` returns the one that won."""
    return (f"INSERT INTO {TABLE} (persistence_id, wrapped_key, created_at) VALUES (%s, %s, clock_timestamp()) "
            "ON CONFLICT (persistence_id) DO NOTHING RETURNING wrapped_key", (pid, wrapped))


def delete(pid: str) -> Query:
    """Delete (shred) a persistence id's key; rowcount 1 when there was one."""
    return f"DELETE FROM {TABLE} WHERE persistence_id = %s", (pid,)


# A deleted row's bytes stay in the table's file until its page is rewritten: a plain VACUUM frees the row but
# leaves its bytes in the page's free space, and a rewrite (VACUUM FULL) still copies a deleted row that a
# transaction older than the delete may see. So: VACUUM until it reports no dead row it had to keep
# (:func:`dead_rows`), then rewrite; what the plain VACUUM freed is then not copied. (Outside a transaction
# block; the table is one small row per persistence id.)
VACUUM: Query = (f"VACUUM {TABLE}", ())
REWRITE: Query = (f"VACUUM (FULL) {TABLE}", ())


def may_vacuum() -> Query:
    """Whether this role may vacuum the table (a role that may not only gets a warning): its owner, a superuser,
    or (PostgreSQL 17+) a role with MAINTAIN on it; and the server's clock, the moment :func:`lockers` measures
    from."""
    return ("SELECT pg_has_role(c.relowner, 'USAGE') OR CASE WHEN current_setting('server_version_num')::int "
            ">= 170000 THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END, clock_timestamp() "
            "FROM pg_class AS c WHERE c.oid = %s::regclass", (TABLE,))


def dead_rows() -> Query:
    """The dead rows the table's statistics count: after a VACUUM, those it had to keep because a transaction
    may still see them (and deletes counted since)."""
    return "SELECT pg_stat_get_dead_tuples(%s::regclass)", (TABLE,)


def lockers(since: datetime) -> Query:
    """The other sessions holding a lock on the table (backend pid, login role) in a transaction begun by ``since``
    (the server's clock before a rewrite's first try): what that rewrite waited for (a key lookup that began since,
    holding its lock for a moment, is not named). The server's clock on both sides, so neither a client's clock nor
    the time this query took to arrive moves the line. A session of another role whose start this role may not see
    (without pg_read_all_stats) is named."""
    return ("SELECT DISTINCT l.pid, a.usename FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid "
            "WHERE l.locktype = 'relation' AND l.relation = %s::regclass AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.pid IS DISTINCT FROM pg_backend_pid() "
            "AND (a.xact_start IS NULL OR a.xact_start <= %s) "
            "ORDER BY l.pid", (TABLE, since))
