"""Worker processes: each holds leases on a share of the slices and runs one range runner per contiguous run.

``run_workers(dsn, factory, n)`` starts ``n`` processes (``pgjournal projection run NAME --workers N``); more
can be started anywhere else against the same database and the shares re-balance. A process is also
started directly with ``python -m pgjournal.projections.workers NAME ENTITY_TYPE --handler module:factory``.

``factory(journal, name, entity_type)`` returns the :class:`~projections.handlers.Projection` to run; it
is named by ``module:attribute`` so that a fresh process can import it.

Over a journal sharded by slice range (``--shard RANGE=DSN`` per database, docs/sharding.md) a process is a
:class:`ShardedWorker`: one :class:`Worker` per database, all with one owner name. In each database the live
workers share that database's range, and lease, read and store offsets there (the factory is called with each
database's journal, so a read model it keeps lives beside its events); adding processes rebalances every
database at once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.errors import (
    InvalidArgument,
    JournalError,
    ProjectionFailed,
    ShardLayoutMismatch,
)
from pgjournal.model.printable import printable_logger
from pgjournal.shards import ShardedJournal, ShardSettings
from pgjournal.shards.routing import Unsettled
from pgjournal.validation import load_attribute

from .handlers import Projection
from .leases import LeaseManager, default_owner
from .runner import RangeRunner
from .shards import range_journal

if TYPE_CHECKING:
    from pgjournal.journal import Journal

log = printable_logger("pgjournal.projections.workers")

Factory = Callable[["Journal", str, str], Projection]
#: ``(journal, projection, min_slice, max_slice, guard)`` to the runner of one leased range.
RunnerFactory = Callable[["Journal", Projection, int, int, LeaseManager], RangeRunner]


def load_factory(spec: str) -> Factory:
    """``module:attribute`` to the callable it names."""
    loaded: Factory = load_attribute(spec, "handler factory", "package.module:function")
    return loaded


def contiguous_runs(slices: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for s in sorted(slices):
        if runs and runs[-1][1] == s - 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


def _passing(exc: Exception) -> bool:
    """A cycle's failure the next cycle may not meet: the database's or the network's. Anything else (a bug, a
    handler factory that cannot be built) would fail every cycle, silently, while the leases run out."""
    return isinstance(exc, (psycopg.Error, OSError, JournalError))


class _Balancing:
    """The loop of a worker: a lease cycle every ``interval`` until ``stop`` or a failed range.

    Cycles start ``interval`` apart, however long one takes (a slow database delays the next one only by what
    this one overran), so that a lease is renewed before its deadline. While the shares are changing hands
    (:meth:`settling`: this worker lacks slices of its share, or still holds slices it must give up) it cycles
    four times as often: a new worker takes what the others release, and they release it, within a fraction of
    the interval rather than at their next renewal."""

    owner: str
    #: What ends the run: a range that failed, or (sharded) a layout this process cannot follow.
    failure: ProjectionFailed | ShardLayoutMismatch | None
    interval: float

    def step(self) -> None:
        raise NotImplementedError

    def settling(self) -> bool:
        """Slices of this worker's share are not held yet, or slices outside it not released yet."""
        raise NotImplementedError

    def pause(self, started: float, now: float) -> float:
        """How long to wait after a cycle that began at ``started`` (monotonic) and ended at ``now``."""
        period = self.interval / 4 if self.settling() else self.interval
        return max(0.0, period - (now - started))

    def shutdown(self) -> None:
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Balance and process until ``stop``; raises :class:`ProjectionFailed` when a range failed
        (:class:`ShardLayoutMismatch`: a sharded worker's layout it cannot follow)."""
        try:
            while not stop.is_set() and self.failure is None:
                started = time.monotonic()
                try:
                    self.step()
                except Exception as exc:  # keep the worker alive: runners stop at their deadline
                    if isinstance(exc, ProjectionFailed) or exc is self.failure or not _passing(exc):
                        raise
                    log.warning("%s: lease cycle failed (%r); runners stop at their deadline", self.owner, exc)
                stop.wait(self.pause(started, time.monotonic()))
        finally:
            self.shutdown()
        if self.failure is not None:
            raise self.failure


class Worker(_Balancing):
    """Leases plus runners for one projection in this process. :meth:`run` blocks until ``stop`` is set.

    ``slices``: share only this range with the other workers (a database's range of a sharded journal; the
    journal may be the sharded one or that database's)."""

    def __init__(self, journal: Journal | ShardedJournal, projection: Projection, *, owner: str | None = None,
                 lease_duration: float = 10.0, renew_interval: float | None = None,
                 slices: tuple[int, int] | None = None, runner: RunnerFactory | None = None) -> None:
        if slices is not None:
            journal = range_journal(journal, *slices)
        if isinstance(journal, ShardedJournal):
            raise InvalidArgument("a Worker over a sharded journal needs the slices of one database "
                                  "(slices=(lo, hi)); ShardedWorker runs one per database")
        self.journal = journal
        self.projection = projection
        self.leases = LeaseManager(self.journal, projection.name, owner=owner, duration=lease_duration,
                                   renew_interval=renew_interval, slices=slices)
        self.owner = self.leases.owner
        self.interval = self.leases.renew_interval
        self.runners: dict[tuple[int, int, tuple[int, ...]], RangeRunner] = {}
        self.failure: ProjectionFailed | None = None
        #: How a range's runner is made (a processor reading another database gives its own).
        self.make_runner: RunnerFactory = runner or (
            lambda journal, projection, lo, hi, guard: RangeRunner(journal, projection, lo, hi, guard=guard))

    def step(self) -> None:
        held, target = self.leases.cycle()
        wanted = {(lo, hi, tuple(held[s] for s in range(lo, hi + 1)))
                  for lo, hi in contiguous_runs(s for s in held if s in target)}
        for key, runner in list(self.runners.items()):
            if isinstance(runner.failed, ProjectionFailed):
                self.failure = runner.failed
            if key not in wanted or not runner.alive:
                runner.stop()
        for key, runner in list(self.runners.items()):
            if runner.stopping:
                runner.join(timeout=self.leases.renew_interval / 2)
                if not runner.alive:
                    del self.runners[key]
        if self.failure is not None:
            return
        busy = {s for lo, hi, _ in self.runners for s in range(lo, hi + 1)}
        self.leases.release([s for s in held if s not in target and s not in busy])
        for key in sorted(wanted - set(self.runners)):
            lo, hi, _ = key
            if any(s in busy for s in range(lo, hi + 1)):
                continue  # an old runner over some of these slices is still stopping
            runner = self.make_runner(self.journal, self.projection, lo, hi, self.leases)
            self.runners[key] = runner
            runner.start()
            log.info("%s: runs slices %d-%d", self.owner, lo, hi)

    def settling(self) -> bool:
        held, target = set(self.leases.held), set(self.leases.target)
        return bool(target - held or held - target)

    def shutdown(self) -> None:
        for runner in self.runners.values():
            runner.stop()
        for runner in self.runners.values():
            runner.join(timeout=30)
        self.runners.clear()
        try:
            self.leases.leave()
        except Exception as exc:  # leases expire anyway
            log.warning("%s: could not release leases (%r); they expire", self.owner, exc)


def step_each(parts: Iterable[Any]) -> None:
    """``step()`` every part, each one whatever the others raised; then raise the first failure."""
    failures: list[Exception] = []
    for part in parts:
        try:
            part.step()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


class ShardedWorker(_Balancing):
    """One :class:`Worker` per database of a sharded journal, with one owner name: in each database the live
    workers share its range, leasing and storing offsets there. ``projection``: one for every database, or a
    callable giving each database's journal its own (a read model kept beside the events).

    Every lease cycle first checks the layout records (``journal.check_layout()``): after a move (docs/sharding.md,
    section 6) the workers are rebuilt for the new layout, so the moved range is read where it went, from the
    offsets the move copied there, instead of going silently quiet on the database it left. A layout this process
    cannot follow (the target reached by none of its DSNs: list it as a spare) fails the worker once it has not
    settled for ``layout_wait``, so that its supervisor restarts it with the new settings."""

    def __init__(self, journal: ShardedJournal, projection: Projection | Callable[[Journal], Projection], *,
                 owner: str | None = None, lease_duration: float = 10.0,
                 renew_interval: float | None = None) -> None:
        self.owner = owner or default_owner()
        self.journal = journal
        self._projection = projection
        self._lease = (lease_duration, renew_interval)
        self._unsettled = Unsettled(journal.layout_wait)
        self.layout = journal.layout
        self.parts = self._parts()
        self.interval = min(part.interval for part in self.parts)
        self._layout_failure: ShardLayoutMismatch | None = None

    def _parts(self) -> list[Worker]:
        projection, (duration, renew) = self._projection, self._lease
        return [Worker(database, projection if isinstance(projection, Projection) else projection(database),
                       owner=self.owner, lease_duration=duration, renew_interval=renew, slices=bounds)
                for bounds, database in zip(self.journal.shards.ranges, self.journal.journals, strict=True)]

    def _follow_layout(self) -> None:
        try:
            layout = self.journal.check_layout()
        except ShardLayoutMismatch as exc:
            if self._unsettled.gives_up():
                self._layout_failure = exc
            raise  # a warning this cycle; the workers of the layout they know go on meanwhile
        self._unsettled.settled()
        if layout != self.layout:
            log.info("%s: the shard layout is version %d now (%s): the workers follow it", self.owner,
                     layout.version, ", ".join(self.journal.shards.where(i) for i in range(self.journal.shards.count)))
            self.shutdown()
            self.layout, self.parts = layout, self._parts()

    @property
    def failure(self) -> ProjectionFailed | ShardLayoutMismatch | None:  # type: ignore[override]
        if self._layout_failure is not None:
            return self._layout_failure
        return next((part.failure for part in self.parts if part.failure is not None), None)

    @property
    def runners(self) -> dict[tuple[int, int, tuple[int, ...]], RangeRunner]:
        return {key: runner for part in self.parts for key, runner in part.runners.items()}

    def step(self) -> None:
        self._follow_layout()
        step_each(self.parts)  # a database that fails its cycle must not keep the others from theirs

    def settling(self) -> bool:
        return any(part.settling() for part in self.parts)

    def shutdown(self) -> None:
        for part in self.parts:
            part.shutdown()


def worker_main(dsn: str | None, name: str, entity_type: str, factory_spec: str, journal_settings: dict[str, Any],
                lease_duration: float, renew_interval: float | None, shards: str | None = None) -> int:
    """One worker process: stops cleanly on SIGTERM/SIGINT (leases released), exit code 1 on failure.
    ``shards``: ``RANGE=DSN`` entries (one per line or ``;``-separated): a worker of every database of that
    sharded journal instead of ``dsn``'s."""
    from pgjournal.journal import Journal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    factory = load_factory(factory_spec)
    with contextlib.ExitStack() as opened:
        worker: _Balancing
        if shards is not None:
            sharded = opened.enter_context(ShardedJournal.open(ShardSettings.parse(shards), **journal_settings))
            worker = ShardedWorker(sharded, lambda database: factory(database, name, entity_type),
                                   lease_duration=lease_duration, renew_interval=renew_interval)
        else:
            journal = opened.enter_context(Journal.open(dsn, **journal_settings))
            worker = Worker(journal, factory(journal, name, entity_type), lease_duration=lease_duration,
                            renew_interval=renew_interval)
        log.info("worker %s started for projection %s", worker.owner, name)
        try:
            worker.run(stop)
        except (ProjectionFailed, ShardLayoutMismatch) as exc:
            log.error("%s", exc)
            return 1
    return 0


def _child(*args: Any) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(name)s %(message)s")
    sys.exit(worker_main(*args))


def run_workers(dsn: str | None, name: str, entity_type: str, factory_spec: str, workers: int, *,
                journal_settings: dict[str, Any] | None = None, lease_duration: float = 10.0,
                renew_interval: float | None = None, stop: threading.Event | None = None,
                shards: str | None = None) -> int:
    """Start ``workers`` processes and wait; SIGINT/SIGTERM (or ``stop``) stops them cleanly.
    Returns the highest exit code of the children. ``shards``: as :func:`worker_main`'s."""
    load_factory(factory_spec)  # fail here, not in every child
    if shards is not None:
        ShardSettings.parse(shards)  # likewise
    ctx = multiprocessing.get_context("spawn")
    args = (dsn, name, entity_type, factory_spec, journal_settings or {}, lease_duration, renew_interval, shards)
    procs = [ctx.Process(target=_child, args=args, name=f"{name}-worker-{i}") for i in range(workers)]
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    for proc in procs:
        proc.start()
    try:
        while not stop.is_set() and any(p.is_alive() for p in procs):
            stop.wait(0.5)
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                proc.terminate()  # SIGTERM: the child releases its leases
        for proc in procs:
            proc.join(timeout=60)
    return max((p.exitcode or 0) for p in procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgjournal.projections.workers", description=__doc__)
    parser.add_argument("name")
    parser.add_argument("entity_type")
    parser.add_argument("--handler", default="pgjournal.projections.examples:counter_projection")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--shard", action="append", default=None, metavar="RANGE=DSN",
                        help="a database of a sharded journal, once per database (instead of --dsn)")
    parser.add_argument("--lease-duration", type=float, default=10.0)
    parser.add_argument("--renew-interval", type=float, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    # Journal settings come from PGJOURNAL_<NAME> environment variables, as everywhere.
    return worker_main(args.dsn, args.name, args.entity_type, args.handler, {}, args.lease_duration,
                       args.renew_interval, "\n".join(args.shard) if args.shard else None)


if __name__ == "__main__":
    sys.exit(main())
