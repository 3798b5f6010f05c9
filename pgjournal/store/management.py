"""SQL over ``projection_management`` (Akka Projection's table: per projection and key, whether it is paused)
and the projection names known to the projection tables (see :mod:`projections.management`)."""

from __future__ import annotations

from pgjournal.store import Query, Read, scalars, tables
from pgjournal.store.leases import WORKER_TABLE
from pgjournal.store.timestamp_offsets import OFFSET_TABLE

MANAGEMENT_TABLE = tables.PROJECTION_MANAGEMENT

IS_PAUSED_SQL = f"""
SELECT COALESCE(bool_or(paused), false) FROM {MANAGEMENT_TABLE}
WHERE projection_name = %(name)s AND projection_key = %(key)s"""
SET_PAUSED_SQL = f"""
INSERT INTO {MANAGEMENT_TABLE} (projection_name, projection_key, paused, last_updated)
VALUES (%(name)s, %(key)s, %(paused)s, %(now)s)
ON CONFLICT (projection_name, projection_key) DO UPDATE SET paused = EXCLUDED.paused,
    last_updated = EXCLUDED.last_updated"""
NAMES_SQL = f"""
SELECT projection_name FROM {MANAGEMENT_TABLE}
UNION SELECT DISTINCT projection_name FROM {OFFSET_TABLE}
UNION SELECT projection_name FROM {WORKER_TABLE}
ORDER BY 1"""


def is_paused(name: str, key: str) -> Read[bool]:
    """One row: whether the projection is paused under ``key`` (false without a row)."""
    return scalars(IS_PAUSED_SQL, {"name": name, "key": key})


def set_paused(name: str, key: str, paused: bool, now_ms: int) -> Query:
    return SET_PAUSED_SQL, {"name": name, "key": key, "paused": paused, "now": now_ms}


def names() -> Read[str]:
    """The names of the projections with a management row, offsets or a worker, in order."""
    return scalars(NAMES_SQL)
