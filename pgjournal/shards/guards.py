"""Each database's shard guards (docs/sharding.md, section 6): the ``CHECK`` constraints by which the database
itself refuses rows of slices it does not hold (SQL in :mod:`pgjournal.store.shard_guard`)."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjournal.shards.layout import SliceRange
from pgjournal.store import shard_guard as sql


def install_guards(conn: psycopg.Connection[Any], ranges: list[SliceRange]) -> int:
    """Give every guarded table (or partition) of the database that has no guard one admitting ``ranges`` (the
    database's in the recorded layout); how many were added. A guard already there is kept: only a move changes
    a guard (a database's ranges change only by a move)."""
    added = 0
    for leaf in (sql.leaf_of(row) for row in sql.leaves().all(conn)):
        if not leaf.guarded:
            conn.execute(*sql.set_guard(leaf.name, ranges))
            added += 1
    return added
