"""How far a reader may safely read: the time before which no transaction can still commit an event.

Only a transaction that holds a write lock (``RowExclusiveLock``) on ``event_journal`` or one of its
partitions can still commit journal rows; idle ``psql`` sessions, ``pg_dump``, reports and Spark JDBC reads
hold at most a read lock and never hold readers back (Marten's gap liveness probe reasons the same way).
``pg_locks`` is readable by every role. A lock needs no right on the table (a reader's ``PREPARE`` of an
INSERT takes one), so only holders whose session can write the table count: its login role, a role it may
become, or a definer-rights function or view of a role that can (:data:`pgjournal.store.catalog.WRITERS_SQL`
says how); every other lock holds nobody back. Rights are read in the same statement as the clock, and a
session that gets the right later can only write rows stamped after it got it.

The write path takes ``db_timestamp`` from ``clock_timestamp()`` inside its INSERT, i.e. *after* the
statement holds that lock (``GREATEST`` only raises it). So a writer that a reader does not see in
``pg_locks`` can only write timestamps later than that reader's clock reading, and the rows of a writer it
does see are no older than that writer's transaction start. The reader takes its clock (``CURRENT_TIMESTAMP``,
the statement start) before it scans ``pg_locks`` in the same statement, and reads data in a later
statement (a later snapshot), so:

* a writer whose ``xact_start`` the role may see (its own role, ``pg_read_all_stats``, superuser) bounds
  the horizon at that start, at once;
* a writer the role may not see (another role's session, a prepared transaction) is waited out: a clock
  reading taken while it held the lock becomes safe once it has finished. A live query keeps those
  readings (:class:`HorizonTracker`); a one-shot read (current query, Spark load) polls until the writers
  it saw are gone.

The readings are steps (:mod:`pgjournal.runtime.steps`): ``read_step``, ``settle_step`` and ``final_bound_step``
describe their statements, and ``read``, ``settle`` and ``final_bound`` run them on a blocking connection.

No cap: a writer that keeps its lock longer than ``longest_transaction`` holds readers back for as long
as it runs, and is logged (backend pid, transaction start) so an operator can find it. Distributed
databases have no such view; there (and in portable mode) the bound is the database clock minus a delay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgjournal.errors import HorizonBlocked
from pgjournal.model.printable import printable_logger
from pgjournal.model.timeuuid import EPOCH, LATEST
from pgjournal.runtime import metrics
from pgjournal.runtime.steps import Pipelined, Sleep, Statement, Step, run
from pgjournal.store.catalog import CLOCK_SQL, WRITERS_SQL

if TYPE_CHECKING:
    import psycopg

    from pgjournal.core.capabilities import Capabilities

log = printable_logger("pgjournal.core.horizon")
#: A reader whose last reading was held back by more than this (seconds: a writer open that long) reads its next
#: page after the reading, not with it: sent together, the page would read, and drop, every row committed above
#: the bound since that writer began.
PIPELINE_HELD_BACK = 0.1


@dataclass(frozen=True)
class Writer:
    """A transaction holding a write lock on the journal: its backend pid (``None`` for a prepared
    transaction), virtual transaction id, and start time where this role may see it."""

    pid: int | None
    vxid: str
    started: datetime | None


@dataclass(frozen=True)
class Horizon:
    #: The database clock.
    now: datetime
    #: Every row with ``db_timestamp`` below this is committed and visible to a query started after.
    safe: datetime
    #: Journal writers open at ``now`` (empty on the clock-only path).
    writers: tuple[Writer, ...] = ()

    @property
    def held_back(self) -> float:
        """Seconds between the clock and the safe bound."""
        return max(0.0, (self.now - self.safe).total_seconds())


class HorizonTracker:
    """The visibility horizon of one reader, remembered from read to read (see the module docstring)."""

    def __init__(self, capabilities: Capabilities, relations: tuple[int, ...] | None = None) -> None:
        self.capabilities = capabilities
        #: The tables whose writers bound this reader: the journal's unless told (durable state's changes).
        self.relations = capabilities.journal_relations if relations is None else relations
        self._margin = timedelta(seconds=capabilities.read_margin)
        self._longest = timedelta(seconds=capabilities.longest_transaction)
        #: Clock readings taken while writers hidden from this role were open: (reading, their vxids).
        self._pending: list[tuple[datetime, frozenset[str]]] = []
        #: The newest reading whose hidden writers have all finished.
        self._cleared: datetime | None = None
        self._warned: set[str] = set()
        #: The last reading (:meth:`read_with_step` sends its statement with the next one unless it was held back).
        self._last: Horizon | None = None
        #: Sends a page with its reading (``False`` once a reading ran under another isolation than READ COMMITTED).
        self._pipelines = True

    def read(self, conn: psycopg.Connection) -> Horizon:
        """:meth:`read_step` on a blocking connection."""
        return run(self.read_step(), conn)

    def read_step(self) -> Step[Horizon]:
        """One horizon reading. Where hidden writers have been open since this tracker's first reading,
        ``safe`` is the newest earlier reading they have all left (at the very first reading: the epoch)."""
        if not self.capabilities.writer_horizon:
            clock = yield Statement(CLOCK_SQL, prepare=False)
            now = clock[0][0]
            return Horizon(now, now - self._margin)
        return self._reading((yield self._writers_statement()))

    def read_with_step(self, below: Callable[[datetime], Statement], at: int) -> Step[tuple[Horizon, list[Any]]]:
        """A reading, and the rows of ``below(bound)`` under it (the statement's rows ordered by their column
        ``at``, a timestamp). Where the last reading was not held back (no writer older than
        :data:`PIPELINE_HELD_BACK`), in one round trip: the statement, bounded by nothing, is sent with the
        reading (:class:`~pgjournal.runtime.steps.Pipelined`: its snapshot is taken after the reading ran, as a
        statement sent after it would be), and its rows at or past the new safe bound are dropped: only those
        committed in the instant between the two snapshots, so a page costs one round trip instead of two.
        Else the reading first, then the statement below its bound.

        The two go in the pipeline's own transaction, under the session's isolation: under READ COMMITTED (the
        reading says which) each has its snapshot. Under another, they shared one, so the page proves nothing:
        it is read again below the bound, and this tracker reads one after the other from then on."""
        last = self._last
        if not self._pipelines or not self.capabilities.writer_horizon or last is None \
                or last.held_back > PIPELINE_HELD_BACK:
            horizon = yield from self.read_step()
            rows: list[Any] = yield below(horizon.safe)
            return horizon, rows
        writers, rows = yield Pipelined((self._writers_statement(), below(LATEST)))
        horizon = self._reading(writers)
        if writers[0][4] != "read committed":
            self._pipelines = False
            rows = yield below(horizon.safe)
            return horizon, rows
        safe = horizon.safe
        if rows and rows[-1][at] >= safe:
            rows = [row for row in rows if row[at] < safe]
        return horizon, rows

    def _writers_statement(self) -> Statement:
        # Prepared once run often (psycopg's default): planning the rights checks costs more than running them.
        return Statement(WRITERS_SQL, {"relations": list(self.relations)})

    def _reading(self, rows: list[tuple[Any, ...]]) -> Horizon:
        now = rows[0][0]
        writers = tuple(Writer(pid, vxid, started) for _, pid, vxid, started, _ in rows if vxid is not None)
        safe = now - self._margin
        for writer in writers:
            if writer.started is not None:
                safe = min(safe, writer.started)
        hidden = frozenset(w.vxid for w in writers if w.started is None)
        safe = min(safe, self._hidden_bound(now - self._margin, hidden))
        self._warn_long(now, writers)
        metrics.HORIZON_HELD_BACK.set((now - safe).total_seconds())
        self._last = Horizon(now, safe, writers)
        return self._last

    def _hidden_bound(self, reading: datetime, hidden: frozenset[str]) -> datetime:
        # A writer open at an earlier reading and at this one was open in between: the newest reading whose
        # hidden writers are all gone is safe, and so is every older one.
        if not hidden:
            self._pending.clear()
            self._cleared = reading
            return reading
        for i in range(len(self._pending) - 1, -1, -1):
            at, open_then = self._pending[i]
            if not open_then & hidden:
                self._cleared = max(at, self._cleared or at)
                del self._pending[: i + 1]
                break
        self._pending.append((reading, hidden))
        return self._cleared if self._cleared is not None else EPOCH

    def _warn_long(self, now: datetime, writers: tuple[Writer, ...]) -> None:
        metrics.SLOW_WRITERS.set(sum(1 for w in writers if w.started is not None and now - w.started > self._longest))
        self._warned &= {w.vxid for w in writers}  # warn once per writer, remember only open ones
        for writer in writers:
            if writer.vxid in self._warned:
                continue
            if writer.started is not None:
                if now - writer.started <= self._longest:
                    continue
                since = f"since {writer.started.isoformat()}"
            else:
                first = next((at for at, vxids in self._pending if writer.vxid in vxids), now)
                if now - first <= self._longest:
                    continue
                since = f"for more than {(now - first).total_seconds():.0f} s (start hidden from this role)"
            self._warned.add(writer.vxid)
            log.warning("journal writer backend %s (transaction %s) has held a write lock on the journal %s, "
                        "longer than longest_transaction (%.0f s): live readers wait for it to finish",
                        writer.pid, writer.vxid, since, self._longest.total_seconds())

    def final_bound(self, conn: psycopg.Connection, *, settle: bool = True) -> datetime:
        """:meth:`final_bound_step` on a blocking connection."""
        return run(self.final_bound_step(settle=settle), conn)

    def final_bound_step(self, *, settle: bool = True) -> Step[datetime]:
        """The newest ``db_timestamp`` below which every event is committed *for good* (what a checkpoint
        may move to): the writer-lock horizon (``settle``: waiting out writers hidden from this role, for a
        one-shot read), else the clock minus ``longest_transaction`` (portable mode: only a transaction open
        longer can still commit below it)."""
        caps = self.capabilities
        horizon = (yield from self.settle_step(timeout=caps.longest_transaction)) if settle else (
            yield from self.read_step())
        if caps.writer_horizon:
            return horizon.safe
        return horizon.now - self._longest

    def settle(self, conn: psycopg.Connection, timeout: float) -> Horizon:
        """:meth:`settle_step` on a blocking connection."""
        return run(self.settle_step(timeout), conn)

    def settle_step(self, timeout: float) -> Step[Horizon]:
        """A horizon for a one-shot read: reads again (every 10 ms) until the writers hidden from this role
        at the first reading have finished. Raises :class:`HorizonBlocked` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        horizon = yield from self.read_step()
        first = horizon.now - self._margin
        while self.capabilities.writer_horizon and (self._cleared is None or self._cleared < first):
            if time.monotonic() >= deadline:
                hidden = [w for w in horizon.writers if w.started is None]
                names = ", ".join(f"backend {w.pid} ({w.vxid})" for w in hidden)
                raise HorizonBlocked(
                    f"journal writers hidden from this role still hold their write lock after {timeout:g} s: "
                    f"{names}; no bound above their rows is provable. Grant pg_read_all_stats to this role "
                    "(pgjournal roles --visibility-horizon) so their start times are visible, or retry later",
                    backends=tuple(w.pid for w in hidden),
                )
            yield Sleep(0.01)
            horizon = yield from self.read_step()
        return horizon
