"""Running the online move of a slice range to another database (docs/sharding.md, section 6): the I/O of the
steps :mod:`pgjournal.shards.move_plan` decides. Each step is one transaction on one database and records itself
in that database's layout record in the same transaction, so a kill at any point leaves the records saying what
is done, and running the move again (``resume``) or :meth:`Mover.roll_back` continues from there.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.errors

from pgjournal.admin.migrate import check_schema
from pgjournal.errors import DatabaseUnavailable, InvalidArgument, JournalError, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.server.connections import connect
from pgjournal.server.dsn import mask_dsn
from pgjournal.settings import Settings
from pgjournal.shards.layout import Layout, ShardSettings, SliceRange, format_range
from pgjournal.shards.move_plan import (
    Action,
    Move,
    MoveStep,
    Progress,
    can_roll_back,
    chunks,
    differing,
    leaves_touching,
    next_action,
    owned,
    plan_move,
    step_of,
    unplan,
)
from pgjournal.store import shard_guard as sql
from pgjournal.store import shard_layout
from pgjournal.store.catalog import lock_timeout, writers
from pgjournal.store.shard_guard import GUARDED_TABLES, Columns, Leaf, MoveRow, leaf_of

Progressed = Callable[[str, int], None]
#: Called with the name of each point the move reaches (a step done, or a part of one): tests build a crash at
#: each point on purpose by killing the process there.
Reached = Callable[[str], None]


@dataclass
class MoveStatus:
    """Where a move stands: for ``--dry-run`` and ``status``."""

    move: Move
    progress: Progress
    next: Action
    rows: int
    next_slice: int | None


@dataclass
class _Database:
    dsn: str
    conn: psycopg.Connection[Any]
    row: MoveRow | None
    columns: dict[str, Columns] = field(default_factory=dict)


class Mover:
    """The move of ``moved`` to the database at ``target_dsn``, the journal's databases found through
    ``shards`` (the settings before the move or after it: databases are told apart by their recorded ids)."""

    def __init__(self, shards: ShardSettings, moved: SliceRange, target_dsn: str, settings: Settings | None = None,
                 *, keep: float = 0.0, chunk_slices: int = 32, catch_up_rows: int = 200, catch_up_passes: int = 10,
                 seal_timeout: float = 0.2,
                 seal_attempts: int = 50, progress: Progressed | None = None, reached: Reached | None = None
                 ) -> None:
        self.shards = shards
        self.moved = moved
        self.target_dsn = target_dsn
        self.settings = settings or Settings.load()
        self.keep = keep
        self.chunk_slices = chunk_slices
        self.catch_up_rows = catch_up_rows
        #: After this many passes the range is sealed anyway: writers faster than a pass copies would never let
        #: it catch up, and the seal's final copy takes what is left (a longer pause, not a lost row).
        self.catch_up_passes = catch_up_passes
        self._passes = 0
        self.seal_timeout = seal_timeout
        self.seal_attempts = seal_attempts
        self.progress = progress or (lambda _what, _rows: None)
        self._reached: Reached = reached or (lambda _point: None)
        #: Seconds the seal's transaction took, each attempt (the range's writers are refused from its commit).
        self.seal_seconds: list[float] = []
        self._databases: dict[uuid.UUID, _Database] = {}
        self._target: _Database | None = None

    # -- opening -----------------------------------------------------------------------------------------

    def __enter__(self) -> Mover:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        for database in {id(d): d for d in [*self._databases.values(), self._target] if d is not None}.values():
            database.conn.close()

    def _open(self) -> None:
        opened: list[_Database] = []
        for index, dsn in enumerate(self.shards.dsns):
            try:
                conn = connect(dsn, self.settings, doing="move slices with")
            except DatabaseUnavailable as exc:
                raise DatabaseUnavailable(f"the database of slices {format_range(self.shards.ranges[index])}: "
                                          f"{exc}; nothing was moved") from None
            opened.append(_Database(dsn, conn, _read_row(conn)))
            if opened[-1].row is None:
                raise SchemaNotMigrated(f"no shard layout record in the database of {self.shards.where(index)}: "
                                        "run `pgjournal shard migrate` first")
        for dsn in self.shards.spares:  # settings a move left behind reach the layout's new databases as spares
            if dsn == self.target_dsn:
                continue
            try:
                conn = connect(dsn, self.settings, doing="move slices with")
            except DatabaseUnavailable as exc:
                raise DatabaseUnavailable(f"the spare database {mask_dsn(dsn)}: {exc}; nothing was moved") from None
            row = _read_row(conn)
            if row is None:  # no layout's database (yet): nothing of the move is there
                conn.close()
                continue
            opened.append(_Database(dsn, conn, row))
        try:
            conn = connect(self.target_dsn, self.settings, doing="move slices to")
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(f"the target database: {exc}; nothing was moved") from None
        try:
            check_schema(conn)
        except SchemaNotMigrated as exc:
            conn.close()
            # The schema check names the command to run once; `pgjournal shard migrate` also migrates spares.
            raise SchemaNotMigrated(f"the target database {mask_dsn(self.target_dsn)} is not migrated: {exc} "
                                    "(with --dsn naming it, or list it as spare=DSN to `pgjournal shard migrate`)"
                                    ) from None
        target = _Database(self.target_dsn, conn, _read_row(conn))
        for database in opened:
            assert database.row is not None
            self._databases.setdefault(database.row.database_id, database)
        if target.row is not None and target.row.database_id in self._databases:
            conn.close()
            target = self._databases[target.row.database_id]
        self._target = target
        if not sql.try_move_lock().one(target.conn):
            raise JournalError(f"another `pgjournal shard move` is running on {mask_dsn(self.target_dsn)}")

    def dsn_of(self, member: uuid.UUID) -> str | None:
        """The DSN given for the database with id ``member``."""
        found = self._databases.get(member)
        if found is None and self._target is not None and self._target.row is not None \
                and self._target.row.database_id == member:
            found = self._target
        return found.dsn if found is not None else None

    # -- where the move stands ---------------------------------------------------------------------------

    def status(self) -> MoveStatus:
        """The move as the records say, and the step that comes next; :class:`InvalidArgument` /
        :class:`ShardLayoutMismatch` when it cannot be (or another move is recorded)."""
        target = self._target
        assert target is not None
        known = {d.row.database_id: d.row for d in [*self._databases.values(), target] if d.row is not None}
        layouts = sorted({Layout.parse(r.version, r.layout) for r in known.values()}, key=lambda x: x.version)
        recorded = [r for r in known.values() if r.move_step is not None]
        if not recorded:
            if len(layouts) > 1:
                raise ShardLayoutMismatch("the databases record different layouts and no move: "
                                          + "; ".join(f"version {x.version}" for x in layouts))
            if target.row is None:
                move = plan_move(layouts[0], self.moved, uuid.uuid4())
                return MoveStatus(move, Progress(None, None, False), Action.PLAN, 0, None)
            if (self.moved, target.row.database_id) in layouts[0].members:
                member = target.row.database_id  # a finished move: nothing left to tell but where the range is
                move = Move(self.moved, member, member, self.moved, layouts[0], layouts[0])
                return MoveStatus(move, Progress(None, None, True), Action.DONE, 0, None)
            if target.row.database_id in {member for _, member in layouts[0].members}:
                plan_move(layouts[0], self.moved, target.row.database_id)  # refused, naming what it holds
            raise InvalidArgument(f"the target database {mask_dsn(self.target_dsn)} already records a shard "
                                  f"layout (version {target.row.version}, database id {target.row.database_id}): "
                                  "move to a database that holds no journal's layout")
        first = recorded[0]
        if any((r.move_range, r.move_source, r.move_target) != (first.move_range, first.move_source,
                                                                 first.move_target) for r in recorded) \
                or first.move_range != format_range(self.moved):
            raise InvalidArgument(f"the records hold another move ({first.move_range} to database "
                                  f"{first.move_target}); resume or roll back that one first")
        if target.row is None or target.row.database_id != first.move_target or first.move_source is None:
            raise InvalidArgument(f"the move of {first.move_range} recorded in the databases goes to database "
                                  f"{first.move_target}, not the one {mask_dsn(self.target_dsn)} reaches")
        newest = layouts[-1]
        if (self.moved, first.move_target) in newest.members:
            move = unplan(newest, self.moved, first.move_source, first.move_target)
        else:
            move = plan_move(newest, self.moved, first.move_target)
        if move.source != first.move_source:
            raise ShardLayoutMismatch(f"the move of {first.move_range} is recorded from database "
                                      f"{first.move_source}, but the layout holds it in {move.source}")
        for layout in layouts:
            if layout not in (move.before, move.after):
                raise ShardLayoutMismatch(f"a database records layout version {layout.version}, neither the "
                                          "move's starting layout nor the one it leaves")
        source = self._databases.get(move.source)
        if source is None or source.row is None:
            raise InvalidArgument(f"no DSN given reaches the database holding {format_range(move.held)} (id "
                                  f"{move.source}): pass every database of the layout with --shard")
        progress = Progress(step_of(source.row.move_step), step_of(target.row.move_step), True)
        return MoveStatus(move, progress, next_action(progress, moved_already=False), target.row.move_rows,
                          target.row.move_next_slice)

    # -- running -----------------------------------------------------------------------------------------

    def run(self) -> MoveStatus:
        """Run the steps from where the records stand until the move is done; the final status.
        :class:`DatabaseUnavailable` when a database is lost under a step (its transaction did not commit: the
        records say where to resume)."""
        step = "status"
        moving: Move | None = None
        try:
            while True:
                status = self.status()
                if status.next is Action.DONE:
                    # Once done, the records no longer say where the range came from: the final status keeps the
                    # move this run made (its layouts before and after), not the finished layout twice.
                    return status if moving is None else replace(status, move=moving)
                moving = status.move
                step = status.next.value
                self.progress(step, status.rows)
                {Action.PLAN: self._plan, Action.COPY: self._copy, Action.CATCH_UP: self._catch_up,
                 Action.CHECK: self._check, Action.SEAL: self._seal, Action.VERIFY: self._verify,
                 Action.SWITCH: self._switch, Action.CLEAN_UP: self._clean_up}[status.next](status.move)
                self._reached(step)
                self._refresh()
        except psycopg.OperationalError as exc:
            raise self._lost(exc, f"the move stopped in its step {step!r}") from exc

    def _lost(self, exc: psycopg.OperationalError, where: str) -> BaseException:
        """The typed error of a database lost under the move (``exc`` as it is when every connection is alive:
        the server answered)."""
        for database in [self._target, *self._databases.values()]:
            if database is not None and (database.conn.closed or database.conn.broken):
                which = "the target" if database is self._target else "a source"
                reason = " ".join(str(exc).split()) or exc.__class__.__name__
                return DatabaseUnavailable(
                    f"lost the connection to {which} database {mask_dsn(database.dsn)} ({reason}): {where}; "
                    "nothing of that step was committed: run `pgjournal shard move --resume` (or --rollback) once "
                    "it is back")
        return exc

    def roll_back(self) -> None:
        """Undo a move that has not switched: the source's guard admits the range again, the target's copy and
        record are removed. :class:`InvalidArgument` once the target recorded the new layout;
        :class:`DatabaseUnavailable` when a database is lost under it (run it again once it is back)."""
        try:
            self._roll_back()
        except psycopg.OperationalError as exc:
            raise self._lost(exc, "the rollback stopped") from exc

    def _roll_back(self) -> None:
        status = self.status()
        if not can_roll_back(status.progress):
            raise InvalidArgument(f"the move of {format_range(self.moved)} has switched to the new layout (version "
                                  f"{status.move.after.version}): it cannot be rolled back; move the range back")
        move = status.move
        source = self._databases[move.source]
        if status.progress.source is not None:
            self._retrying_lock(source, lambda: self._set_guards(source, move, owned(move.before, move.source)),
                                None, move)
            self._reached("rollback:source")
        self._unwatch(source)
        target = self._target
        assert target is not None
        if target.row is not None:
            with target.conn.transaction():
                for table in self._tables(target):
                    target.conn.execute(*sql.delete_slices(table, *move.moved))
                for leaf in self._leaves(target):
                    target.conn.execute(*sql.drop_guard(leaf.name))
                target.conn.execute(*sql.delete_record())
        self._refresh()

    # -- the steps ---------------------------------------------------------------------------------------

    def _plan(self, move: Move) -> None:
        target, source = self._target, self._databases[move.source]
        assert target is not None
        if target.row is None:
            with target.conn.transaction():
                target.conn.execute(*shard_layout.create_layout_table())
                target.conn.execute(*sql.add_move_columns())
                # The target admits the range from now on: no layout names it for the range before the switch,
                # so only the mover writes there (a process with the new layout is refused at open until then).
                for leaf in self._leaves(target):
                    target.conn.execute(*sql.set_guard(leaf.name, [move.moved]))
                target.conn.execute(*sql.insert_target_record(move.before.version, move.before.text(), move.target,
                                                              format_range(move.moved), move.source,
                                                              MoveStep.PLANNED.value))
            self._refresh()
            self._reached("plan:target")
        with source.conn.transaction():
            source.conn.execute(*sql.add_move_columns())
        self._retrying_lock(source, lambda: self._watch(source, move), MoveStep.PLANNED, move)
        self.seal_seconds.clear()  # that was the plan's lock, not the seal's

    def _copy(self, move: Move) -> None:
        target = self._target
        assert target is not None and target.row is not None
        start = target.row.move_next_slice if target.row.move_next_slice is not None else move.moved[0]
        mark = target.row.move_mark
        for lo, hi in chunks(move.moved, start, self.chunk_slices):
            if mark is None:  # the catch-up re-reads from the first chunk's start on
                mark = self._safe_mark(self._databases[move.source])
            with target.conn.transaction():
                copied = sum(self._copy_rows(move, table, lo, hi, None) for table in self._tables(target))
                last = hi >= move.moved[1]
                target.conn.execute(*self._record(target, move, MoveStep.COPIED if last else MoveStep.PLANNED,
                                                  rows=copied, next_slice=None if last else hi + 1, mark=mark))
            self._refresh()
            self.progress(f"copied slices {lo}-{hi}", self._rows())
            self._reached("copy:chunk")

    def _catch_up(self, move: Move) -> None:
        target = self._target
        assert target is not None and target.row is not None
        started = self._safe_mark(self._databases[move.source])
        with target.conn.transaction():
            copied = sum(self._copy_rows(move, table, *move.moved, self._since(target))
                         for table in self._tables(target))
            self._passes += 1
            done = copied < self.catch_up_rows or self._passes >= self.catch_up_passes
            target.conn.execute(*self._record(target, move, MoveStep.CAUGHT_UP if done else MoveStep.COPIED,
                                              rows=copied, mark=started))
        self.progress(f"caught up {copied} rows", self._rows() + copied)

    def _seal(self, move: Move) -> None:
        source = self._databases[move.source]
        for _ in range(self.catch_up_passes):
            if self._pass_since_check(move) < self.catch_up_rows:
                break
        self._retrying_lock(source, lambda: self._set_guards(source, move, owned(move.after, move.source)),
                            MoveStep.SEALED, move)

    def _check(self, move: Move) -> None:
        """Before the seal, while the range is written: one more pass, then every slice's digest over the rows
        older than a *safe mark* (every row stamped before it is committed) compared with the source's, the
        slices that differ copied again (a commit later than the catch-up window, a delete), and the logged
        deletes applied; recorded ``checked`` with the mark, from which the verify copies and checks. This reads
        the whole range on both sides, outside the writers' pause."""
        target, source = self._target, self._databases[move.source]
        assert target is not None and target.row is not None
        for table in self._tables(target):  # the bulk copy's statistics, so the verify's reads by stamp use the index
            target.conn.execute(*sql.analyze(table))
        mark = self._safe_mark(source)
        with target.conn.transaction():
            copied = sum(self._copy_rows(move, table, *move.moved, self._since(target))
                         for table in self._tables(target))
            applied, handled = self._apply_deletes(move)
            copied += applied
            for table in self._tables(target):
                copied += self._repair(move, table, before=mark)[0]
            target.conn.execute(*self._record(target, move, MoveStep.CHECKED, rows=copied, mark=mark))
        self._forget(source, handled)
        self.progress(f"checked, {copied} rows copied", self._rows() + copied)

    def _pass_since_check(self, move: Move) -> int:
        """One pass after the check, before the seal: the rows stamped since the recorded safe mark and the
        logged deletes copied, a new safe mark recorded (still ``checked``), so the verify inside the pause has
        only what was written during the last pass to copy, not what was written during the check."""
        target, source = self._target, self._databases[move.source]
        assert target is not None and target.row is not None
        mark = self._safe_mark(source)
        with target.conn.transaction():
            copied = sum(self._copy_rows(move, table, *move.moved, self._since(target))
                         for table in self._tables(target))
            applied, handled = self._apply_deletes(move)
            target.conn.execute(*self._record(target, move, MoveStep.CHECKED, rows=copied + applied, mark=mark))
        self._forget(source, handled)
        self._refresh()
        return copied + applied

    def _forget(self, source: _Database, handled: int | None) -> None:
        if handled is not None:  # applied on the target: the log need not hold them (a kill before: applied again)
            source.conn.execute(*sql.forget_deletes(handled))

    def _verify(self, move: Move) -> None:
        """After the seal nothing changes in the range on the source (its guard refuses writes, its delete
        trigger deletes): copy the rows changed since the check's mark, apply the deletes logged since, compare
        the digests of the rows changed since the mark (copy again the slices that differ), and record the target
        verified, all in one target transaction. Its work is what changed since the check, not the range."""
        target, source = self._target, self._databases[move.source]
        assert target is not None and target.row is not None
        since = self._since(target)  # the check's (or its last pass's) safe mark
        with target.conn.transaction():
            copied = sum(self._copy_rows(move, table, *move.moved, since) for table in self._tables(target))
            self.progress("verify: copied the changes", copied)
            copied += self._apply_deletes(move)[0]
            self.progress("verify: applied the deletes", copied)
            for table in self._tables(target):
                rows, slices = self._repair(move, table, since=since)
                copied += rows
                wrong = slices and differing(sql.digests(table, *move.moved, since=since).all(source.conn),
                                               sql.digests(table, *move.moved, since=since).all(target.conn))
                if wrong:
                    raise JournalError(f"after the seal, {table} of slices {wrong[:5]} still differs between the "
                                       "source and the target; is another process writing the target?")
            self.progress("verify: compared the digests", copied)
            self._wait_for_target_clock(move)
            target.conn.execute(*self._record(target, move, MoveStep.VERIFIED, rows=copied))

    def _repair(self, move: Move, table: str, *, since: Any = None, before: Any = None) -> tuple[int, int]:
        """Copy again (inside the target's open transaction) every slice of ``table`` whose digest over the rows
        changed in ``since..before`` differs from the source's; the rows and the slices copied."""
        target, source = self._target, self._databases[move.source]
        assert target is not None
        slices = differing(sql.digests(table, *move.moved, since=since, before=before).all(source.conn),
                           sql.digests(table, *move.moved, since=since, before=before).all(target.conn))
        copied = 0
        for slice_ in slices:
            target.conn.execute(*sql.delete_slices(table, slice_, slice_))
            copied += self._copy_rows(move, table, slice_, slice_, None)
        return copied, len(slices)

    def _apply_deletes(self, move: Move) -> tuple[int, int | None]:
        """The deletes the source logged, done on the target (inside its open transaction): each logged row is
        deleted there and copied again from the source where it is there again (deleted, then written anew).
        The rows copied and the last log id handled (``None``: nothing logged)."""
        target, source = self._target, self._databases[move.source]
        assert target is not None
        if not sql.delete_log_exists().one(source.conn):
            return 0, None
        logged = sql.logged_deletes().all(source.conn)
        by_table: dict[str, list[dict[str, object]]] = {}
        for deleted in logged:
            by_table.setdefault(deleted.table_name, []).append(deleted.key)
        copied = 0
        for table, keys in by_table.items():
            columns = self._columns(target, table)
            text = json.dumps(keys)
            target.conn.execute(*sql.delete_keys(table, columns, text))
            copied += self._copy_out_in(table, columns, sql.copy_keys_out(table, columns, text), move)
        return copied, (logged[-1].id if logged else None)

    def _safe_mark(self, source: _Database) -> Any:
        """The source's clock, or the start of the oldest transaction writing a guarded table there if earlier:
        a row stamped before the mark is committed (a writer stamps its rows after its start, a writer not seen
        takes its lock later and stamps later still). A writer whose start this role may not see moves the mark
        back by the backtracking window."""
        oids = sql.table_oids().one(source.conn) or []
        found = writers(oids).all(source.conn)
        seen = [w.xact_start for w in found if w.virtualtransaction is not None and w.xact_start is not None]
        mark = min([found[0].clock, *seen])
        if any(w.virtualtransaction is not None and w.xact_start is None for w in found):
            mark -= timedelta(seconds=self.settings.backtracking_window)
        return mark

    def _switch(self, move: Move) -> None:
        target, source = self._target, self._databases[move.source]
        assert target is not None and target.row is not None
        if step_of(target.row.move_step) is not MoveStep.SWITCHED:
            with target.conn.transaction():
                target.conn.execute(*sql.record_layout(move.after.version, move.after.text()))
                target.conn.execute(*self._record(target, move, MoveStep.SWITCHED))
            self._reached("switch:target")
        with source.conn.transaction():
            source.conn.execute(*sql.record_layout(move.after.version, move.after.text()))
            source.conn.execute(*self._record(source, move, MoveStep.SWITCHED))
        for member, database in self._databases.items():
            if member not in (move.source, move.target) and database.row is not None \
                    and database.row.version < move.after.version:
                database.conn.execute(*sql.record_layout(move.after.version, move.after.text()))

    def _clean_up(self, move: Move) -> None:
        target, source = self._target, self._databases[move.source]
        assert target is not None and source.row is not None
        switched = source.row.changed_at
        while True:
            now = sql.clock().one(source.conn)
            assert now is not None
            left = self.keep - (now - switched).total_seconds()
            if left <= 0:
                break
            self.progress(f"keeping the source's rows {left:.0f} s more", self._rows())
            time.sleep(min(left, 1.0))
        self._unwatch(source)  # the clean-up's deletes are not refused nor logged
        for table in self._tables(source):
            while source.conn.execute(*sql.delete_slices(table, *move.moved, limit=5000)).rowcount:
                self._reached("clean up:rows")
        if target.row is not None and target.row.move_step is not None:
            target.conn.execute(*sql.record_move(None, state="stable"))
        source.conn.execute(*sql.record_move(None, state="stable"))

    # -- helpers -----------------------------------------------------------------------------------------

    def _retrying_lock(self, database: _Database, change: Callable[[], None], step: MoveStep | None,
                       move: Move) -> None:
        """``change`` and the record of ``step`` (``None``: the move cleared) in one transaction, as
        :meth:`_locking` runs it; the times of its attempts go into :attr:`seal_seconds`."""

        def recorded() -> None:
            change()
            database.conn.execute(*(sql.record_move(None, state="stable") if step is None
                                    else self._record(database, move, step)))

        self._locking(database, recorded, f"the guard of {format_range(move.moved)} could not be changed",
                      self.seal_seconds)

    def _locking(self, database: _Database, change: Callable[[], None], failure: str,
                 times: list[float] | None = None) -> None:
        """``change`` (DDL over several tables) in one transaction that waits at most ``seal_timeout`` for each
        lock, tried again on a timeout or a deadlock with other sessions' locks (nothing changed then); after
        ``seal_attempts``, a :class:`JournalError` that begins with ``failure``."""
        for attempt in range(self.seal_attempts):
            started = time.monotonic()
            try:
                with database.conn.transaction():
                    database.conn.execute(*lock_timeout(self.seal_timeout))
                    change()
                if times is not None:
                    times.append(time.monotonic() - started)
                return
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                if times is not None:
                    times.append(time.monotonic() - started)
                self.progress(f"lock not granted in {self.seal_timeout} s (attempt {attempt + 1}); again", 0)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise JournalError(f"{failure} in {self.seal_attempts} attempts of {self.seal_timeout} s: long transactions "
                           "hold the tables; nothing changed, run the move again (--resume)")

    def _set_guards(self, database: _Database, move: Move, ranges: list[SliceRange]) -> None:
        for leaf in leaves_touching(self._leaves(database), move.moved):
            database.conn.execute(*sql.set_guard(leaf.name, ranges))

    def _record(self, database: _Database, move: Move, step: MoveStep, *, rows: int = 0,
                next_slice: int | None = None, mark: Any = ...) -> tuple[str, Any]:
        row = database.row
        return sql.record_move(step.value, state="moving", move_range=format_range(move.moved), source=move.source,
                               target=move.target, rows_added=rows, next_slice=next_slice,
                               mark=(row.move_mark if row is not None else None) if mark is ... else mark)

    def _copy_rows(self, move: Move, table: str, lo: int, hi: int, since: Any) -> int:
        """Copy ``table``'s rows of ``lo..hi`` (changed since ``since``) from the source into the target, inside
        the target's open transaction; the rows inserted or changed."""
        target = self._target
        assert target is not None
        columns = self._columns(target, table)
        return self._copy_out_in(table, columns, sql.copy_out(table, columns, lo, hi, since), move)

    def _copy_out_in(self, table: str, columns: Columns, out_query: tuple[str, Any], move: Move) -> int:
        """The source's rows ``out_query`` selects merged into the target's ``table``; the rows inserted or
        changed."""
        target, source = self._target, self._databases[move.source]
        assert target is not None
        target.conn.execute(*sql.staging(table))
        target.conn.execute(*sql.truncate_staging(table))
        with source.conn.cursor().copy(*out_query) as out, \
                target.conn.cursor().copy(*sql.copy_in(table, columns)) as into:
            for data in out:
                into.write(data)
        return target.conn.execute(*sql.merge_staged(table, columns)).rowcount

    def _watch(self, source: _Database, move: Move) -> None:
        """The source logs the moved range's deleted and updated rows from now on (see :func:`sql.watch_deletes`):
        triggers on each table and on its partitions holding the range."""
        source.conn.execute(*sql.create_delete_log())
        schema = str(sql.current_schema().one(source.conn))
        leaves = leaves_touching(self._leaves(source), move.moved)
        for table in self._tables(source):
            relations = [table, *(leaf.name for leaf in leaves if leaf.table == table and leaf.name != table)]
            for query in sql.watch_deletes(table, self._columns(source, table).key, *move.moved, relations, schema):
                source.conn.execute(*query)

    def _unwatch(self, source: _Database) -> None:
        """The source's delete triggers and log removed (the move is over or undone). Dropping the triggers locks
        every guarded table in turn, and a session that holds one of them while it asks for another (a
        projection's transaction: its offsets, then the journal) would deadlock with it: so as :meth:`_locking`
        runs it, tried again."""

        def drop() -> None:
            for table in GUARDED_TABLES:
                source.conn.execute(*sql.unwatch_deletes(table))
            source.conn.execute(*sql.drop_delete_log())

        self._locking(source, drop, "the source's delete triggers could not be removed")

    def _since(self, target: _Database) -> Any:
        """The recorded safe mark: every row stamped before it was committed when the copy after it began."""
        return target.row.move_mark if target.row is not None else None

    def _wait_for_target_clock(self, move: Move) -> None:
        """Events written on the target after the switch must sort after those copied (a projection's offset is a
        timestamp): wait while the target's clock is behind the range's newest event, at most 5 s. After the seal
        no writer of the range is left on the source, so its clock now is past every stamp of the range (reading
        the clock costs nothing, the newest stamp a scan of the range)."""
        target, source = self._target, self._databases[move.source]
        assert target is not None
        newest = sql.clock().one(source.conn)
        deadline = time.monotonic() + 5
        while newest is not None and (sql.clock().one(target.conn) or newest) <= newest:
            if time.monotonic() > deadline:
                raise JournalError(f"the target's clock is behind the source's ({newest}), past every event of "
                                   f"{format_range(move.moved)}, by more than 5 s: synchronise the clocks")
            time.sleep(0.01)

    def _columns(self, database: _Database, table: str) -> Columns:
        if table not in database.columns:
            found = sql.columns(table).one(database.conn)
            assert found is not None
            database.columns[table] = Columns(tuple(found[0]), tuple(found[1]))
        return database.columns[table]

    def _tables(self, database: _Database) -> list[str]:
        return sorted({leaf.table for leaf in self._leaves(database)})

    def _leaves(self, database: _Database) -> list[Leaf]:
        return [leaf_of(row) for row in sql.leaves().all(database.conn)]

    def _rows(self) -> int:
        return self._target.row.move_rows if self._target is not None and self._target.row is not None else 0

    def _refresh(self) -> None:
        for database in {id(d): d for d in [*self._databases.values(), self._target] if d is not None}.values():
            database.row = _read_row(database.conn)


def _read_row(conn: psycopg.Connection[Any]) -> MoveRow | None:
    if not shard_layout.layout_table_exists().one(conn):
        return None
    if not sql.has_move_columns().one(conn):
        row = shard_layout.layout_record().one(conn)
        if row is None:
            return None
        return MoveRow(row.version, row.layout, row.database_id, row.state, None, None, None, None, 0, None, None,
                       row.changed_at)
    return sql.move_record().one(conn)
