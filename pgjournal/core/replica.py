"""Readers on a hot standby: the primary's visibility horizon, fenced by the primary's WAL position.

A standby's ``pg_locks`` shows none of the primary's writers, and a standby cannot LISTEN. So a reader on a
standby (``Journal.open(dsn, replica=STANDBY_DSN)``: writes, offsets and everything else on ``dsn``, the by-slice
pages on the standby) takes its horizon from the primary's writers exactly as a reader on the primary does (the
same :class:`~pgjournal.core.horizon.HorizonTracker`, on a connection of the primary), and reads the primary's WAL
insert position right after that reading. Every transaction the reading counts as finished inserted its commit
record before that position (a writer holds its lock until its commit record is in the WAL), so a standby that has
replayed up to the position has replayed those commits and shows them to every later statement (a hot standby's
snapshots follow the commit records in WAL order). The reader reads the standby only below the newest reading
whose position the standby has replayed: nothing can still appear below it, however late a writer commits on the
primary and however far the standby lags.

One reading (:meth:`ReplicaHorizon.read_step`): the primary's horizon and position (a :class:`Call` of the face,
on a primary connection), then the standby's replayed position, read again every few milliseconds up to
``replica_replay_wait`` seconds while the newest reading is not replayed; a reading not replayed yet stays pending
for the next one. The delivery lag counts the replay: the horizon's ``now`` is the primary's clock at the newest
reading, so ``now - safe`` includes the wait. Wake-ups come from the primary too: a journal LISTENs on its primary
DSN; the wait above covers a signal that arrives before the standby has replayed the commit it announces.

A one-shot bound (a current query, a Spark load) waits until the standby has replayed its reading, at most
``longest_transaction`` seconds, then raises :class:`~pgjournal.errors.HorizonBlocked`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pgjournal.core.horizon import Horizon, HorizonTracker
from pgjournal.errors import ConfigurationError, HorizonBlocked
from pgjournal.model.timeuuid import EPOCH
from pgjournal.runtime import metrics
from pgjournal.runtime.steps import Call, Sleep, Statement, Step, first_of, run
from pgjournal.server.dsn import mask_dsn
from pgjournal.store import catalog

if TYPE_CHECKING:
    import psycopg

    from pgjournal.core.capabilities import Capabilities

X = TypeVar("X")

#: Seconds between two readings of the standby's replayed position while a reader waits for it (one tiny
#: statement; replay on a healthy standby takes milliseconds).
REPLAY_POLL = 0.002
#: Readings kept while the standby has not replayed them (one per poll); past this the oldest goes: a newer one
#: bounds as safely, only later.
MAX_PENDING = 256


@dataclass(frozen=True, slots=True)
class _Reading:
    """A horizon read on the primary, the primary's WAL insert position after it, and when (monotonic)."""

    lsn: int
    horizon: Horizon
    taken: float


class ReplicaHorizon:
    """The visibility horizon of one reader on a standby (see the module docstring); the interface of
    :class:`HorizonTracker` that readers use (``read_step``, ``settle_step``, ``final_bound_step``), its statements
    run on the standby and ``on_primary(step)`` running a step on the primary (the face's ``run``)."""

    def __init__(self, primary: HorizonTracker, on_primary: Callable[[Step[Any]], Any], *, replay_wait: float,
                 replica: str) -> None:
        self.primary = primary
        self._on_primary = on_primary
        self._wait = replay_wait
        self._replica = replica
        self._pending: deque[_Reading] = deque(maxlen=MAX_PENDING)
        #: The newest reading the standby has replayed.
        self._usable: _Reading | None = None

    @property
    def capabilities(self) -> Capabilities:
        return self.primary.capabilities

    def read(self, conn: psycopg.Connection) -> Horizon:
        """:meth:`read_step` on a blocking connection to the standby."""
        return run(self.read_step(), conn)

    def read_step(self) -> Step[Horizon]:
        """A live reader's horizon: the primary's newest reading; ``safe`` from the newest one the standby has
        replayed (waiting up to ``replica_replay_wait`` for the newest)."""
        horizon, lsn = yield from self._on_primary_step(self.primary.read_step())
        newest = _Reading(lsn, horizon, time.monotonic())
        self._pending.append(newest)
        yield from self._replay_step(lsn, self._wait, required=False)
        usable = self._usable
        if usable is None:
            return Horizon(horizon.now, EPOCH, horizon.writers)
        metrics.STANDBY_HORIZON_AGE.set(time.monotonic() - usable.taken)
        return Horizon(horizon.now, usable.horizon.safe, horizon.writers)

    def read_with_step(self, below: Callable[[datetime], Statement], at: int) -> Step[tuple[Horizon, list[Any]]]:
        """:meth:`read_step`, then ``below(safe)`` on the standby (the reading is the primary's: nothing to send
        together)."""
        horizon = yield from self.read_step()
        rows: list[Any] = yield below(horizon.safe)
        return horizon, rows

    def settle_step(self, timeout: float) -> Step[Horizon]:
        """A one-shot read's horizon (:meth:`HorizonTracker.settle_step` on the primary), once replayed."""
        horizon, lsn = yield from self._on_primary_step(self.primary.settle_step(timeout))
        yield from self._replay_step(lsn, timeout, required=True)
        return horizon

    def final_bound(self, conn: psycopg.Connection, *, settle: bool = True) -> datetime:
        """:meth:`final_bound_step` on a blocking connection to the standby."""
        return run(self.final_bound_step(settle=settle), conn)

    def final_bound_step(self, *, settle: bool = True) -> Step[datetime]:
        """:meth:`HorizonTracker.final_bound_step` on the primary, once the standby has replayed it."""
        bound, lsn = yield from self._on_primary_step(self.primary.final_bound_step(settle=settle))
        yield from self._replay_step(lsn, self.capabilities.longest_transaction, required=True)
        return bound

    def _on_primary_step(self, step: Step[X]) -> Step[tuple[X, int]]:
        result: tuple[X, int] = yield Call(self._on_primary, (_fenced(step),))
        return result

    def _replay_step(self, lsn: int, wait: float, *, required: bool) -> Step[bool]:
        """Read the standby's replayed position until it reaches ``lsn`` or ``wait`` seconds have passed (then
        ``False``, or with ``required`` :class:`HorizonBlocked`); the pending readings it has replayed become
        usable."""
        deadline = time.monotonic() + wait
        while True:
            found = yield from first_of(catalog.replayed(), prepare=False)
            if found is None or found.position is None or not found.recovering:
                raise ConfigurationError(
                    f"replica {mask_dsn(self._replica)} is not a standby (pg_is_in_recovery() is false): a reader "
                    "there cannot tell which of the primary's commits it shows; open the journal with it as the "
                    "primary, or give the DSN of a standby")
            replayed = int(found.position)
            while self._pending and self._pending[0].lsn <= replayed:
                self._usable = self._pending.popleft()
            if replayed >= lsn:
                return True
            if time.monotonic() >= deadline:
                if required:
                    raise HorizonBlocked(
                        f"the standby {mask_dsn(self._replica)} has not replayed the primary's WAL up to the "
                        f"horizon's position within {wait:g} s ({lsn - replayed} bytes behind); retry later, or "
                        "read from the primary")
                return False
            yield Sleep(REPLAY_POLL)


def _fenced(step: Step[X]) -> Step[tuple[X, int]]:
    """``step`` on the primary, then the WAL insert position (a later statement: after the reading)."""
    value = yield from step
    rows = yield Statement(catalog.WAL_INSERTED_SQL, prepare=False)
    return value, int(rows[0][0])
