"""How far a reader may safely read: the time before which no transaction can still commit an event.

``db_timestamp`` is at least the writing transaction's start time (``CURRENT_TIMESTAMP``, never lowered
by the ``GREATEST`` rule). So on PostgreSQL, the start of the oldest transaction still open in this
database bounds every timestamp still to come: rows older than it are final. Distributed databases have
no such view; there (and in portable mode) the bound is the database clock minus a fixed delay.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg

# The clock, and the start of the oldest open transaction of any other session in this database.
HORIZON_SQL = """
SELECT CURRENT_TIMESTAMP,
       (SELECT min(xact_start) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL)"""
CLOCK_SQL = "SELECT CURRENT_TIMESTAMP, NULL::timestamptz"


def visibility_horizon(conn: psycopg.Connection, *, behind: float, use_transactions: bool) -> datetime:
    """The newest ``db_timestamp`` below which every row is committed and visible.

    ``behind`` seconds are always kept from the clock (covers clock steps); with ``use_transactions``
    the oldest open transaction's start lowers the bound further.
    """
    row = conn.execute(HORIZON_SQL if use_transactions else CLOCK_SQL).fetchone()
    assert row is not None
    now, oldest = row
    bound = now - timedelta(seconds=behind)
    return min(bound, oldest) if oldest is not None else bound
