"""How far a reader may safely read: the time before which no transaction can still commit an event.

``db_timestamp`` is at least the writing transaction's start time (``CURRENT_TIMESTAMP``, never lowered
by the ``GREATEST`` rule). So on PostgreSQL, the start of the oldest transaction still open in this
database bounds every timestamp still to come: rows older than it are final. Distributed databases have
no such view; there (and in portable mode) the bound is the database clock minus a fixed delay.

Read the horizon in a statement *before* the data query: a writer that commits between the two is then
either visible to the data query's (later) snapshot or was still open when the horizon was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

# The clock, and the start of the oldest open transaction of any other session in this database.
HORIZON_SQL = """
SELECT CURRENT_TIMESTAMP,
       (SELECT min(xact_start) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
          AND backend_type = 'client backend')"""
CLOCK_SQL = "SELECT CURRENT_TIMESTAMP, NULL::timestamptz"
# Other roles' xact_start is hidden unless this role may read all statistics.
CAN_SEE_ACTIVITY_SQL = """
SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') FROM pg_roles
WHERE rolname = current_user"""


@dataclass(frozen=True)
class Horizon:
    #: The database clock.
    now: datetime
    #: Every row with ``db_timestamp`` below this is committed and visible to a query started after.
    safe: datetime


def read_horizon(conn: psycopg.Connection, *, behind: float, use_transactions: bool,
                 longest_transaction: float = 10.0) -> Horizon:
    """``behind`` seconds are always kept from the clock (covers clock steps and the start-up race of a
    transaction); with ``use_transactions`` the oldest open transaction's start lowers the bound further,
    but by no more than ``longest_transaction`` seconds: a transaction open longer (a report, a stuck
    session) must not stall every reader. Backtracking assumes the same limit.
    """
    row = conn.execute(HORIZON_SQL if use_transactions else CLOCK_SQL, prepare=False).fetchone()
    assert row is not None
    now, oldest = row
    bound = now - timedelta(seconds=behind)
    if oldest is not None:
        bound = max(min(bound, oldest), now - timedelta(seconds=max(longest_transaction, behind)))
    return Horizon(now, bound)


def visibility_horizon(conn: psycopg.Connection, *, behind: float, use_transactions: bool) -> datetime:
    """The newest ``db_timestamp`` below which every row is committed and visible."""
    return read_horizon(conn, behind=behind, use_transactions=use_transactions).safe


def can_see_all_transactions(conn: psycopg.Connection) -> bool:
    row = conn.execute(CAN_SEE_ACTIVITY_SQL).fetchone()
    return bool(row and row[0])
