"""SQL of the PostgreSQL key store (:class:`pgjournal.keystore.PostgresKeyStore`): one wrapped data key per
persistence id in ``pgjournal_payload_keys`` (revision 0007)."""

from __future__ import annotations

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

