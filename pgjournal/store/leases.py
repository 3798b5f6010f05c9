"""SQL over ``projection_lease`` (one row per projection and slice: owner, epoch, expiry) and
``projection_worker`` (one heartbeat row per worker process of a projection); see :mod:`projections.leases`.

Every time is the database's (``now()``, ``clock_timestamp()``), so workers' clocks never have to agree.
The statements that lock lease rows (:func:`acquire`, :func:`fence`) lock them in slice order, so they cannot
deadlock each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.store import Query, Read, rows, scalars, tables

LEASE_TABLE = tables.PROJECTION_LEASE
WORKER_TABLE = tables.PROJECTION_WORKER


@dataclass(frozen=True, slots=True)
class Lease:
    """A slice held, and its epoch (grows whenever the slice changes hands)."""

    slice: int
    epoch: int


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A live lease of a projection: its slice, owner and epoch."""

    slice: int
    owner: str
    epoch: int


ENSURE_ROWS_SQL = f"""
INSERT INTO {LEASE_TABLE} (projection_name, slice, owner, epoch, expires_at)
SELECT %(name)s, s, NULL, 0, now() FROM generate_series(0, {NUMBER_OF_SLICES - 1}) AS s
ON CONFLICT (projection_name, slice) DO NOTHING"""
HEARTBEAT_SQL = f"""
INSERT INTO {WORKER_TABLE} (projection_name, owner, started_at, expires_at)
VALUES (%(name)s, %(owner)s, clock_timestamp(), now() + %(duration)s * INTERVAL '1 second')
ON CONFLICT (projection_name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at"""
LIVE_WORKERS_SQL = f"""
SELECT owner FROM {WORKER_TABLE} WHERE projection_name = %(name)s AND expires_at > now()
ORDER BY started_at, owner"""
FORGET_DEAD_SQL = f"""
DELETE FROM {WORKER_TABLE} WHERE projection_name = %(name)s AND expires_at < now() - INTERVAL '1 minute'"""
# Renew what this owner holds (unexpired) and take the free or expired slices it wants; the epoch grows
# whenever a slice changes hands (or is taken back after it expired).
ACQUIRE_SQL = f"""
WITH chosen AS (
    SELECT slice FROM {LEASE_TABLE}
    WHERE projection_name = %(name)s
      AND ((owner = %(owner)s AND expires_at > now())
           OR (slice = ANY(%(want)s) AND (owner IS NULL OR expires_at <= now())))
    ORDER BY slice FOR UPDATE)
UPDATE {LEASE_TABLE} AS l
SET epoch = CASE WHEN l.owner = %(owner)s AND l.expires_at > now() THEN l.epoch ELSE l.epoch + 1 END,
    owner = %(owner)s,
    expires_at = now() + %(duration)s * INTERVAL '1 second'
FROM chosen WHERE l.projection_name = %(name)s AND l.slice = chosen.slice
RETURNING l.slice, l.epoch"""
RELEASE_SQL = f"""
UPDATE {LEASE_TABLE} SET owner = NULL, expires_at = now()
WHERE projection_name = %(name)s AND owner = %(owner)s AND slice = ANY(%(slices)s)"""
LEAVE_SQL = f"DELETE FROM {WORKER_TABLE} WHERE projection_name = %(name)s AND owner = %(owner)s"
# How many of the slices this owner still holds at the given epochs, their rows locked FOR SHARE until the
# caller's transaction ends (a take-over waits for it).
FENCE_SQL = f"""
SELECT count(*) FROM (
    SELECT l.slice FROM {LEASE_TABLE} AS l
    JOIN unnest(%(slices)s::int[], %(epochs)s::bigint[]) AS u(slice, epoch)
      ON l.slice = u.slice AND l.epoch = u.epoch
    WHERE l.projection_name = %(name)s AND l.owner = %(owner)s AND l.expires_at > clock_timestamp()
    ORDER BY l.slice FOR SHARE OF l) AS held"""
LIVE_LEASES_SQL = f"""
SELECT slice, owner, epoch FROM {LEASE_TABLE}
WHERE projection_name = %(name)s AND owner IS NOT NULL AND expires_at > now()"""


def ensure_rows(name: str) -> Query:
    """One lease row per slice of the projection (idempotent)."""
    return ENSURE_ROWS_SQL, {"name": name}


def heartbeat(name: str, owner: str, duration: float) -> Query:
    """Register the worker (started now) or extend its heartbeat by ``duration`` seconds."""
    return HEARTBEAT_SQL, {"name": name, "owner": owner, "duration": duration}


def live_workers(name: str) -> Read[str]:
    """The owners of unexpired heartbeats, oldest first (the order that splits the slices)."""
    return scalars(LIVE_WORKERS_SQL, {"name": name})


def forget_dead(name: str) -> Query:
    """Delete heartbeats expired for more than a minute."""
    return FORGET_DEAD_SQL, {"name": name}


def acquire(name: str, owner: str, want: Sequence[int], duration: float) -> Read[Lease]:
    """Renew the owner's leases and take the free or expired ones of ``want``: every lease it holds after."""
    return rows(Lease, ACQUIRE_SQL, {"name": name, "owner": owner, "want": list(want), "duration": duration})


def release(name: str, owner: str, slices: Sequence[int]) -> Query:
    return RELEASE_SQL, {"name": name, "owner": owner, "slices": list(slices)}


def leave(name: str, owner: str) -> Query:
    """Drop the worker's heartbeat."""
    return LEAVE_SQL, {"name": name, "owner": owner}


def fence(name: str, owner: str, epochs: dict[int, int]) -> Read[int]:
    """How many of ``epochs``' slices the owner holds at those epochs, their rows locked for share."""
    slices = list(epochs)
    return scalars(FENCE_SQL, {"name": name, "owner": owner, "slices": slices, "epochs": [epochs[s] for s in slices]})


def live_leases(name: str) -> Read[HeldLease]:
    return rows(HeldLease, LIVE_LEASES_SQL, {"name": name})


def forget(name: str) -> list[Query]:
    """Delete every lease and heartbeat row of the projection (a reset, with no worker running)."""
    return [(f"DELETE FROM {LEASE_TABLE} WHERE projection_name = %s", (name,)),
            (f"DELETE FROM {WORKER_TABLE} WHERE projection_name = %s", (name,))]
