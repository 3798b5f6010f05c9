"""Slice leases: which worker process may consume which slices of a projection, balanced without a manager.

Every worker process of a projection heartbeats a row in ``projection_worker``. The live workers, ordered
by start time, split 0..1023 into contiguous shares (worker *i* of *N* gets ``i*1024//N .. (i+1)*1024//N-1``).
Each worker then, in one conditional UPDATE on the database clock, renews the ``projection_lease`` rows it
holds and takes the free or expired rows of its share. A slice outside its share is released only after the
runner consuming it has stopped; the new owner takes it when it is free (or its lease expired).

Safety does not depend on clocks agreeing: a worker counts its lease from the moment it *sent* the renewal
and stops consuming ``margin`` seconds before ``duration`` has passed, so it stops before the database can
consider the lease expired. The transactional handler modes also :meth:`LeaseManager.fence` their
transaction: ``FOR SHARE`` on the lease rows (owner and epoch checked), so a take-over waits for the commit.
Rows are locked in slice order by both statements, so they cannot deadlock each other.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pgjournal.errors import InvalidArgument, LeaseLost
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import NUMBER_OF_SLICES, check_slice_range
from pgjournal.runtime import metrics
from pgjournal.runtime.steps import Step, first_of, run
from pgjournal.store import Query
from pgjournal.store import leases as sql
from pgjournal.validation import check_name, check_seconds

if TYPE_CHECKING:
    import psycopg

    from pgjournal.journal import Journal

log = printable_logger("projections.leases")


ALL_SLICES = range(NUMBER_OF_SLICES)


def share(index: int, workers: int, within: range = ALL_SLICES) -> range:
    """The contiguous slices worker ``index`` of ``workers`` should own, of the slices ``within`` (all, or the
    range of one database of a sharded journal)."""
    return within[index * len(within) // workers:(index + 1) * len(within) // workers]


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseManager:
    """The leases of one worker process for one projection; also the runners' :class:`LeaseGuard`."""

    def __init__(self, journal: Journal, name: str, *, owner: str | None = None, duration: float = 10.0,
                 renew_interval: float | None = None, slices: tuple[int, int] | None = None) -> None:
        self.journal = journal
        self.name = check_name(name, "projection name")
        #: The slices this projection's workers share in ``journal``'s database: all of them, or the range of one
        #: database of a sharded journal (its workers heartbeat and lease there, beside the offsets).
        if slices is not None:
            check_slice_range(*slices)
        self.slices = ALL_SLICES if slices is None else range(slices[0], slices[1] + 1)
        self.owner = owner or default_owner()
        self.duration = check_seconds(duration, "lease duration")
        self.renew_interval = (check_seconds(renew_interval, "lease renew_interval") if renew_interval is not None
                               else self.duration / 4)
        if not self.renew_interval < self.duration / 2:
            raise InvalidArgument(f"lease renew_interval must be > 0 and below half the duration "
                                  f"({self.duration / 2}s), got {self.renew_interval!r}")
        #: Stop consuming this long before the lease could expire.
        self.margin = self.duration / 4
        self.held: dict[int, int] = {}
        self.target: range = range(0)
        self._deadline = 0.0
        self._lock = threading.Lock()
        self._rows_ensured = False

    # -- LeaseGuard ----------------------------------------------------------------------------------

    def valid(self) -> bool:
        return time.monotonic() < self._deadline

    def epochs(self, slices: Sequence[int]) -> dict[int, int]:
        with self._lock:
            return {s: self.held[s] for s in slices if s in self.held}

    def fence(self, conn: psycopg.Connection, slices: Sequence[int], epochs: Mapping[int, int]) -> None:
        run(self.fence_step(slices, epochs), conn)

    def fence_step(self, slices: Sequence[int], epochs: Mapping[int, int]) -> Step[None]:
        """:meth:`fence` as a step (:mod:`pgjournal.runtime.steps`), inside the caller's transaction."""
        if not self.valid():
            raise LeaseLost(f"lease of {self.owner} not renewed in time")
        wanted = list(slices)
        if any(s not in epochs for s in wanted):
            raise LeaseLost(f"slices {wanted} are not all leased to this runner")
        if (yield from first_of(sql.fence(self.name, self.owner, {s: epochs[s] for s in wanted}))) != len(wanted):
            raise LeaseLost(f"{self.owner} no longer holds the leases of slices {wanted[0]}..{wanted[-1]}")

    # -- membership and acquisition ------------------------------------------------------------------

    def cycle(self) -> tuple[dict[int, int], range]:
        """Heartbeat, compute this worker's share, renew and acquire. Returns (held slices -> epoch, share)."""
        def attempt() -> tuple[float, range, list[sql.Lease]]:
            sent = time.monotonic()  # before the statements: the local deadline errs early
            with self.journal.connection() as conn:
                if not self._rows_ensured:
                    conn.execute(*sql.ensure_rows(self.name))
                conn.execute(*sql.heartbeat(self.name, self.owner, self.duration))
                live = sql.live_workers(self.name).all(conn)
                target = share(live.index(self.owner), len(live), self.slices) if self.owner in live else range(0)
                leases = sql.acquire(self.name, self.owner, target, self.duration).all(conn)
                if len(live) > 1 and sent % 10 < self.renew_interval:
                    conn.execute(*sql.forget_dead(self.name))
            return sent, target, leases

        # Workers starting or rebalancing together on a SERIALIZABLE database conflict here (40001): the cycle
        # only renews and takes what this worker may hold, so it simply runs again.
        sent, target, leases = self.journal.settings.retry_policy.run(
            attempt, self.journal.dialect.retryable_sqlstates)
        self._rows_ensured = True
        held = {lease.slice: lease.epoch for lease in leases}
        metrics.LEASED_SLICES.labels(self.name, self.owner).set(len(held))
        with self._lock:
            lost = set(self.held) - set(held)
            self.held, self.target = held, target
            self._deadline = sent + self.duration - self.margin if held else 0.0
        if lost:
            log.warning("%s lost the leases of %d slice(s) it held", self.owner, len(lost))
        return held, target

    def release(self, slices: Sequence[int]) -> None:
        if not slices:
            return
        with self._lock:
            for s in slices:
                self.held.pop(s, None)
        self._run(sql.release(self.name, self.owner, slices))

    def leave(self) -> None:
        """Release every slice and drop the heartbeat (a clean stop: others take over at once)."""
        with self._lock:
            self.held = {}
            self._deadline = 0.0
        metrics.LEASED_SLICES.labels(self.name, self.owner).set(0)
        self._run(sql.release(self.name, self.owner, range(NUMBER_OF_SLICES)), sql.leave(self.name, self.owner))

    def _run(self, *statements: Query) -> None:
        """Statements that may simply run again (they only give up this worker's own rows), retried after a
        transient failure: workers stopping together on a SERIALIZABLE database conflict with each other, and a
        release that failed would keep its slices from the others until the lease expires."""
        def release() -> None:
            with self.journal.connection() as conn:
                for statement in statements:
                    conn.execute(*statement)

        self.journal.settings.retry_policy.run(release, self.journal.dialect.retryable_sqlstates)
