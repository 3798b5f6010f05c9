"""A sharded journal written once for both faces. Its routing is steps (:mod:`pgjournal.runtime.steps`) that
call each database's journal's own operations (:class:`~pgjournal.runtime.steps.Call`): the blocking face runs
them with :func:`~pgjournal.runtime.steps.run_calls`, the asyncio face with
:func:`~pgjournal.runtime.steps.arun_calls` (which awaits what they return), as ``pgjournal.entity`` runs its
logic over either journal. A face declares each operation once, as ``append = blocking(RoutedJournal.append_step)``
or ``awaited(...)``; a read routed as it is to one database's journal is ``by_pid(Reads.timestamp_of)`` or
``by_range(...)``, with the protocol's signature and documentation (:mod:`pgjournal.faces`). What stays per face
is what truly differs: opening and closing, merging persistence ids, and a live stream's iteration."""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast

from pgjournal.core.journal_core import REPLICA_ENV
from pgjournal.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DatabaseUnavailable,
    SchemaNotMigrated,
    ShardLayoutMismatch,
)
from pgjournal.faces import AsyncDurableStates, DurableStates
from pgjournal.model.envelope import EventEnvelope
from pgjournal.model.offsets import Offset
from pgjournal.runtime.steps import Call, Sleep, Step, arun_calls, run_calls
from pgjournal.server.dsn import mask_dsn
from pgjournal.settings import Settings
from pgjournal.shards.layout import REPLICA, Layout, Record, ShardSettings, format_range
from pgjournal.shards.migrate import migrate_all
from pgjournal.shards.record import read_record_step
from pgjournal.shards.routing import (
    REREAD_INTERVAL,
    Follow,
    Known,
    P,
    Routed,
    Routing,
    StreamFollow,
    after_conflict,
    found_nothing,
    known_databases,
    once,
    opening_routing,
)
from pgjournal.state.durable_state import DurableState
from pgjournal.state.snapshots import SelectedSnapshot

if TYPE_CHECKING:
    from pgjournal.query.by_slices import SliceRows

Shards = ShardSettings | Mapping[str, str] | Sequence[str]
A = ParamSpec("A")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., object])


class Database(Protocol):
    """A database's journal of either face as the routing calls it: each operation returns its result (the
    blocking face) or an awaitable of it (the asyncio face)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def durable_state(self) -> DurableStates | AsyncDurableStates: ...
    def run(self, step: Step[Any]) -> object: ...
    def append(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
               tags: Iterable[str] = (), metadata: Any = None) -> object: ...
    def delete_events(self, persistence_id: str, to_seq_nr: int) -> object: ...
    def highest_seq_nr(self, persistence_id: str) -> object: ...
    def save_snapshot(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                      tags: Iterable[str] = ()) -> object: ...
    def load_snapshot(self, persistence_id: str, *, max_seq_nr: int | None = None,
                      max_timestamp: datetime | None = None) -> object: ...
    def delete_snapshot(self, persistence_id: str) -> object: ...


J = TypeVar("J", bound=Database)


class Closing(Protocol):
    def close(self) -> None: ...


class AsyncClosing(Protocol):
    async def close(self) -> None: ...


def shard_settings(shards: Shards | None, settings: Mapping[str, Any] | None = None) -> ShardSettings:
    """``shards`` as :class:`ShardSettings`; ``None``: from ``PGJOURNAL_SHARDS``. ``settings`` (the journals'):
    a single replica (``replica=``, ``PGJOURNAL_REPLICA_DSN``) is refused, since it would be every database's."""
    if settings is not None and ("replica" in settings or os.environ.get(REPLICA_ENV)):
        raise ConfigurationError(f"a sharded journal takes a hot standby per database, not one for all (replica= or "
                                 f"{REPLICA_ENV}): give each as {REPLICA}RANGE=DSN in the shard settings")
    if shards is None:
        return ShardSettings.from_env()
    return shards if isinstance(shards, ShardSettings) else ShardSettings.of(shards)


# -- a face's operations from the steps --------------------------------------------------------------


def blocking(step: Callable[A, Step[R]]) -> Callable[A, R]:
    """The blocking face's operation: ``step`` run with :func:`~pgjournal.runtime.steps.run_calls`."""

    @functools.wraps(step)
    def operation(*args: A.args, **kwargs: A.kwargs) -> R:
        return run_calls(step(*args, **kwargs))

    return _named(operation)


def awaited(step: Callable[A, Step[R]]) -> Callable[A, Coroutine[Any, Any, R]]:
    """The asyncio face's operation: ``step`` run with :func:`~pgjournal.runtime.steps.arun_calls`."""

    @functools.wraps(step)
    async def operation(*args: A.args, **kwargs: A.kwargs) -> R:
        return await arun_calls(step(*args, **kwargs))

    return _named(operation)


def _named(operation: F) -> F:
    """The operation named as the face names it (``append``, of the step ``append_step``)."""
    operation.__name__ = operation.__name__.removesuffix("_step")
    operation.__qualname__ = operation.__qualname__.removesuffix("_step")
    return operation


def _routed(read: Callable[Concatenate[Any, A], R], part: str, to: Callable[[Any, dict[str, Any]], Any]
            ) -> Callable[Concatenate[Any, A], R]:
    """``read`` (a protocol's method) done by the same read of ``part`` (``query``, ``durable_state``) of the one
    database's journal that ``to(sharded journal, the call's arguments by name)`` names; the protocol's signature
    and documentation kept, awaited where it is."""
    name, signature = read.__name__, inspect.signature(read)

    def target(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        journal = to(self._journal, signature.bind(self, *args, **kwargs).arguments)
        return getattr(getattr(journal, part), name)

    if inspect.iscoroutinefunction(read):
        async def areading(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await target(self, args, kwargs)(*args, **kwargs)
        return cast(Callable[Concatenate[Any, A], R], functools.wraps(read)(areading))

    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        return target(self, args, kwargs)(*args, **kwargs)
    return cast(Callable[Concatenate[Any, A], R], functools.wraps(read)(reading))


def by_pid(read: Callable[Concatenate[Any, A], R], part: str = "query") -> Callable[Concatenate[Any, A], R]:
    """``read`` in the database of its ``persistence_id``."""
    return _routed(read, part, lambda journal, args: journal.journal_for(args["persistence_id"]))


def by_range(read: Callable[Concatenate[Any, A], R], part: str = "query") -> Callable[Concatenate[Any, A], R]:
    """``read`` in the one database of its ``min_slice..max_slice`` (a range across databases is refused)."""
    return _routed(read, part, lambda journal, args: journal.journal_for_slices(args["min_slice"], args["max_slice"]))


# -- the journal -------------------------------------------------------------------------------------


class RoutedJournal(Routed[J]):
    """A sharded journal over ``J`` (a database's journal of one face): its operations as steps."""

    def _records(self) -> Step[list[Record | None]]:
        records: list[Record | None] = []
        for known in self._known:
            records.append((yield Call(known.journal.run, (read_record_step(),))))
        return records

    def _follow(self, seen: Routing[J], refused: ShardLayoutMismatch | None) -> Step[Layout]:
        """Switch from ``seen`` to the layout the records settle on. After a write ``refused`` by a guard, wait
        (re-reading every :data:`REREAD_INTERVAL`, at most ``layout_wait``) while they do not settle yet."""
        follow = Follow(seen, self._known, refused, self.layout_wait)
        while (routing := follow.decide((yield from self._records()))) is None:
            yield Sleep(REREAD_INTERVAL)
        if routing is not seen:
            self._routing = routing
        return routing.layout

    def _write(self, persistence_id: str, write: Callable[[J], object]) -> Step[Any]:
        """``write`` on the journal of ``persistence_id``; refused by a guard (its range moved), once more on the
        journal of the layout followed (a refused write wrote nothing); failing its sequence number check where
        the range is no more, once more where it went (see :func:`~pgjournal.shards.routing.after_conflict`)."""
        routing = self._routing
        try:
            return (yield Call(write, (routing.for_persistence_id(persistence_id),)))
        except ShardLayoutMismatch as refused:
            if self._routing is routing:  # else another caller followed already
                yield from self._follow(routing, refused)
        except ConcurrencyConflict as conflict:
            if self._routing is routing:
                moved = (after_conflict(routing, self._known, (yield from self._records()), persistence_id)
                         if found_nothing(conflict) else None)
                if moved is None:
                    raise conflict from None
                self._routing = moved
        return (yield Call(write, (self._routing.for_persistence_id(persistence_id),)))

    def _read(self, persistence_id: str, read: Callable[[J], object]) -> Step[Any]:
        return (yield Call(read, (self.journal_for(persistence_id),)))

    def check_layout_step(self) -> Step[Layout]:
        """Re-read every known database's record (a long-running process calls it now and then) and return the
        layout routed from now on: a newer layout every one of its databases records, each reached by a DSN of
        this journal (its settings' or a spare's), is followed (docs/sharding.md, section 8); a reader of a
        by-slices stream compares the result with the layout it started under. :class:`ShardLayoutMismatch`
        while the records disagree (not waited for here) or when a database of the newer layout is reached by
        no known DSN (naming its id)."""
        return (yield from self._follow(self._routing, None))

    def migrate_step(self) -> Step[None]:
        """Migrate every database of the layout and record it (:func:`~pgjournal.shards.migrate.migrate_all`)."""
        yield Call(self._in_thread, (migrate_all, self.shards, self.journals[0].settings))

    @staticmethod
    def _in_thread(fn: Callable[..., object], *args: object) -> object:
        """How the face runs blocking work (Alembic): here, at once; the asyncio face, in a thread."""
        return fn(*args)

    def append_step(self, persistence_id: str, events: Iterable[Any], *, expected_seq_nr: int | None = None,
                    tags: Iterable[str] = (), metadata: Any = None) -> Step[list[EventEnvelope]]:
        """:meth:`~pgjournal.faces.JournalFace.append` in the database of ``persistence_id``."""
        batch, labels = once(events), once(tags)  # a retry appends the same events, with the same tags
        envelopes: list[EventEnvelope] = yield from self._write(persistence_id, lambda journal: journal.append(
            persistence_id, batch, expected_seq_nr=expected_seq_nr, tags=labels, metadata=metadata))
        return envelopes

    def delete_events_step(self, persistence_id: str, to_seq_nr: int) -> Step[int]:
        """:meth:`~pgjournal.faces.JournalFace.delete_events` in the database of ``persistence_id``."""
        deleted: int = yield from self._write(persistence_id, lambda journal: journal.delete_events(persistence_id,
                                                                                                 to_seq_nr))
        return deleted

    def highest_seq_nr_step(self, persistence_id: str) -> Step[int]:
        """:meth:`~pgjournal.faces.JournalFace.highest_seq_nr` in the database of ``persistence_id``."""
        highest: int = yield from self._read(persistence_id, lambda journal: journal.highest_seq_nr(persistence_id))
        return highest

    def save_snapshot_step(self, persistence_id: str, seq_nr: int, snapshot: Any, *, metadata: Any = None,
                           tags: Iterable[str] = ()) -> Step[None]:
        """:meth:`~pgjournal.faces.JournalFace.save_snapshot` in the database of ``persistence_id``."""
        yield from self._write(persistence_id, lambda journal: journal.save_snapshot(
            persistence_id, seq_nr, snapshot, metadata=metadata, tags=tags))

    def load_snapshot_step(self, persistence_id: str, *, max_seq_nr: int | None = None,
                           max_timestamp: datetime | None = None) -> Step[SelectedSnapshot | None]:
        """:meth:`~pgjournal.faces.JournalFace.load_snapshot` in the database of ``persistence_id``."""
        selected: SelectedSnapshot | None = yield from self._read(persistence_id, lambda journal: (
            journal.load_snapshot(persistence_id, max_seq_nr=max_seq_nr, max_timestamp=max_timestamp)))
        return selected

    def delete_snapshot_step(self, persistence_id: str) -> Step[None]:
        """:meth:`~pgjournal.faces.JournalFace.delete_snapshot` in the database of ``persistence_id``."""
        yield from self._write(persistence_id, lambda journal: journal.delete_snapshot(persistence_id))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(version {self.layout.version}: "
                + ", ".join(self.shards.where(i) for i in range(self.shards.count)) + ")")


def opening_step(shards: ShardSettings, migrate: bool, settings: dict[str, Any], open_one: Callable[[str], object],
                 in_thread: Callable[..., object], journals: list[J]) -> Step[tuple[list[Known[J]], Routing[J]]]:
    """Open a journal on every database (``open_one(dsn)``, into ``journals``, which the face closes if this
    fails) and check they record the settings' layout (the rules: ``ShardedJournal.open``)."""
    if migrate:
        yield Call(in_thread, (migrate_all, shards, Settings.load(**settings)))
    where = [f"the database of slices {format_range(r)}" for r in shards.ranges]
    for dsn, named in zip((*shards.dsns, *shards.spares), [*where, *(f"the spare database {mask_dsn(spare)}"
                                                                      for spare in shards.spares)], strict=True):
        try:  # spares are opened now, so that following a move to one opens no pool in the pause
            journals.append((yield Call(open_one, (dsn,))))
        except (DatabaseUnavailable, SchemaNotMigrated) as exc:
            raise type(exc)(f"{named}: {exc}") from None
    known = known_databases(shards, journals)
    records: list[Record | None] = []
    for journal in journals:
        records.append((yield Call(journal.run, (read_record_step(),))))
    return known, opening_routing(shards, known, records)


def close_all(journals: Iterable[Closing]) -> None:
    """Close every journal, even when one fails to; the first failure is raised after."""
    failure: BaseException | None = None
    for journal in journals:
        try:
            journal.close()
        except BaseException as exc:  # the others must still close
            failure = failure or exc
    if failure is not None:
        raise failure


async def aclose_all(journals: Iterable[AsyncClosing]) -> None:
    """:func:`close_all` for asyncio."""
    failure: BaseException | None = None
    for journal in journals:
        try:
            await journal.close()
        except BaseException as exc:  # the others must still close
            failure = failure or exc
    if failure is not None:
        raise failure


# -- reads and durable state -------------------------------------------------------------------------


def merged(sources: Sequence[Iterator[str]], limit: int | None) -> Iterator[str]:
    """Every database's persistence ids merged in id order (as Akka's ``persistenceIds`` over its data
    partitions), at most ``limit``."""
    ids = heapq.merge(*sources)
    return ids if limit is None else itertools.islice(ids, limit)


async def amerged(sources: Sequence[AsyncIterator[str]], limit: int | None) -> AsyncIterator[str]:
    """:func:`merged` for asyncio; a source left part-read gives its connection back when this ends."""
    heads: list[tuple[str, int]] = []
    try:
        for index, source in enumerate(sources):
            async for first in source:
                heads.append((first, index))
                break
        heapq.heapify(heads)
        given = 0
        while heads and (limit is None or given < limit):
            pid, index = heapq.heappop(heads)
            yield pid
            given += 1
            async for following in sources[index]:
                heapq.heappush(heads, (following, index))
                break
    finally:
        for source in sources:
            closing = getattr(source, "aclose", None)
            if closing is not None:
                await closing()


class RoutedParts(Generic[J]):
    """What a sharded journal's ``query`` and ``durable_state`` share: the journal they route through."""

    def __init__(self, journal: RoutedJournal[J]) -> None:
        self._journal = journal


class RoutedDurableState(RoutedParts[J]):
    """``journal.durable_state`` of a sharded journal: each persistence id's state in the database of its
    slice; changes by slices from the one database of the range. Its writes follow a move as the journal's do."""

    def upsert_step(self, persistence_id: str, revision: int, value: Any, tag: str | None = None
                    ) -> Step[DurableState]:
        """:meth:`~pgjournal.faces.DurableStates.upsert` in the database of ``persistence_id``."""
        state: DurableState = yield from self._journal._write(
            persistence_id, lambda journal: journal.durable_state.upsert(persistence_id, revision, value, tag))
        return state

    def delete_step(self, persistence_id: str, revision: int) -> Step[DurableState]:
        """:meth:`~pgjournal.faces.DurableStates.delete` in the database of ``persistence_id``."""
        state: DurableState = yield from self._journal._write(
            persistence_id, lambda journal: journal.durable_state.delete(persistence_id, revision))
        return state


class Following(Generic[J, P]):
    """A live by-slices stream of a sharded journal (events, or with ``rows`` another table's, such as durable
    state's changes): the range's database's live query, which follows a move of the range (docs/sharding.md,
    section 6) by itself. Every ``LAYOUT_CHECK_INTERVAL`` it re-reads the layout records before a poll; once the
    range's database changed, it reopens there from the last item handed out (the rule:
    :class:`~pgjournal.shards.routing.StreamFollow`). Records that do not settle for ``layout_wait`` (the new
    database reached by no DSN of this journal: list it as a spare) raise :class:`ShardLayoutMismatch`, as does a
    move that leaves the range across two databases. ``close()`` (or leaving ``with``) stops it. A face adds its
    iteration protocol and how it re-reads the layout."""

    def __init__(self, journal: RoutedJournal[J], entity_type: str, min_slice: int, max_slice: int, offset: Offset,
                 rows: Callable[[J], SliceRows] | None = None, *, tags: Iterable[str] | None = None) -> None:
        self._sharded, self._entity_type, self._rows, self._tags = journal, entity_type, rows, tags
        self._follow = StreamFollow(journal, min_slice, max_slice, offset)
        self._closed = False
        self._live = self._open()

    def _open(self) -> Any:
        journal = self._follow.journal
        by_slices = getattr(journal, "by_slices")  # noqa: B009  (each face's, of its own type)
        query = by_slices.query(self._entity_type, *self._follow.range, self._follow.offset,
                                self._rows(journal) if self._rows else None, tags=self._tags)
        return by_slices.run_live(query, before_poll=self._check)

    def _check_step(self) -> Step[None]:
        """Before a poll, now and then: re-read the layout (:class:`~pgjournal.shards.routing.StreamFollow` says
        what its outcome means: :class:`~pgjournal.shards.routing.Moved` reopens the stream)."""
        if self._follow.due():
            try:
                yield from self._sharded.check_layout_step()
            except Exception as exc:
                self._follow.checked(exc)
            else:
                self._follow.checked(None)

    def _check(self) -> Any:
        raise NotImplementedError

    def _reopened(self) -> bool:
        """The range moved: reopen on its new database (``False``: closed meanwhile, the stream ends)."""
        self._live.close()
        if self._closed:
            return False
        self._live = self._open()
        if self._closed:  # closed from another thread meanwhile
            self._live.close()
        return True

    def _handed(self, item: P) -> P:
        self._follow.offset = item.offset
        return item

    def close(self) -> None:
        """Stop it (from any thread)."""
        self._closed = True
        self._live.close()

    @property
    def closed(self) -> bool:
        return self._closed or bool(self._live.closed)
