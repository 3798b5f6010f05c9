"""Which journal serves which range, and how a sharded journal follows a move without new settings
(docs/sharding.md, section 8): the rule, without I/O, written once for the blocking and asyncio faces.

A journal knows databases by DSN (its settings' ranges and spares); the layout records map ranges to database
*ids*. When a write is refused by a guard (or ``check_layout`` runs), the face reads every known database's
record and asks :func:`next_routing`: a newer layout every one of its databases records, each reached by a known
DSN, becomes the new :class:`Routing`, assigned in one statement so that concurrent callers use the old map or
the new one, never a mix.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from psycopg_pool import PoolClosed

from pgjournal.errors import ConcurrencyConflict, InvalidArgument, JournalClosed, ShardLayoutMismatch
from pgjournal.model.offsets import Offset
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.server.dsn import mask_dsn
from pgjournal.shards.layout import Layout, Record, ShardSettings, SliceRange, agreed_layout, format_range
from pgjournal.validation import check_persistence_id

log = printable_logger(__name__)
J = TypeVar("J")
T = TypeVar("T")

#: How often a journal waiting for the records to agree (mid-switch) re-reads them.
REREAD_INTERVAL = 0.01
#: How often a live by-slices stream of a sharded journal re-reads the records (one row per database), between
#: its polls: the delay after a move's switch before the stream reads the range where it went.
LAYOUT_CHECK_INTERVAL = 1.0


@dataclass(frozen=True)
class Routing(Generic[J]):
    """An immutable routing table: ``journals[i]`` serves ``shards.ranges[i]`` of ``layout``."""

    layout: Layout
    shards: ShardSettings
    journals: tuple[J, ...]

    def for_persistence_id(self, persistence_id: str) -> J:
        return self.journals[self.shards.index_of(slice_for_persistence_id(check_persistence_id(persistence_id)))]

    def for_slices(self, min_slice: int, max_slice: int) -> J:
        return self.journals[self.shards.index_of_range(min_slice, max_slice)]


class Routed(Generic[J]):
    """What both faces of a sharded journal hold: the databases they can reach and the routing table, replaced
    whole, in one assignment, when the journal follows a move; and what they read of it."""

    def __init__(self, known: Sequence[Known[J]], routing: Routing[J], layout_wait: float) -> None:
        #: Every database this journal can reach, by DSN: the settings' ranges', then the spares'.
        self._known = tuple(known)
        self._routing = routing
        #: How long records that do not settle are borne (setting ``layout_wait``, every database's journal's).
        self.layout_wait = layout_wait

    @property
    def shards(self) -> ShardSettings:
        """The settings of the layout routed now: the opened ones, or those of a layout followed since."""
        return self._routing.shards

    @property
    def journals(self) -> tuple[J, ...]:
        """``journals[i]`` is the journal of ``shards.ranges[i]`` (spares not included)."""
        return self._routing.journals

    @property
    def layout(self) -> Layout:
        """The layout routed now: the one every database recorded at open, or a newer one followed since."""
        return self._routing.layout

    def journal_for(self, persistence_id: str) -> J:
        """The journal of the database holding ``persistence_id``'s slice: its transactions, and anything of the
        one-database API, are that database's."""
        return self._routing.for_persistence_id(persistence_id)

    def journal_for_slices(self, min_slice: int, max_slice: int) -> J:
        """The journal of the one database holding ``min_slice..max_slice`` (a range across databases is
        :class:`~pgjournal.errors.InvalidArgument`). A projection of the range runs on it, so its offsets are
        stored beside its slices."""
        return self._routing.for_slices(min_slice, max_slice)

    def ranges_within(self, min_slice: int, max_slice: int) -> list[SliceRange]:
        """``min_slice..max_slice`` cut at the databases' boundaries: one query per sub-range reads it all."""
        return self.shards.ranges_within(min_slice, max_slice)


@dataclass(frozen=True)
class Known(Generic[J]):
    """A database the journal can reach: its DSN (from the settings' ranges or spares) and its journal."""

    dsn: str
    journal: J


def known_databases(shards: ShardSettings, journals: Sequence[J]) -> list[Known[J]]:
    """The databases a journal opened: ``journals`` are those of the settings' ranges, then of its spares."""
    return [Known(dsn, journal) for dsn, journal in zip((*shards.dsns, *shards.spares), journals, strict=True)]


class Wait(Exception):
    """The records do not settle on one layout yet (a switch half done, or a sealed range not switched yet):
    read them again shortly; ``reason`` says what differs (for the error raised when the wait runs out)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def next_routing(current: Routing[J], known: Sequence[Known[J]], records: Sequence[Record | None], *,
                 refused: bool) -> Routing[J] | None:
    """The routing to switch to from ``current``, given ``records[i]``, the record of ``known[i]``; ``None``:
    the records hold ``current.layout`` and nothing is moving (keep it). Raises :class:`Wait` while the records
    disagree, or (``refused``: a guard refused a write) while a move is under way and not switched yet; raises
    :class:`ShardLayoutMismatch` naming the id of a database of the newer layout that no known DSN reaches."""
    present = [(k, r) for k, r in zip(known, records, strict=True) if r is not None]
    newest = max((r.layout for _, r in present), key=lambda layout: layout.version, default=current.layout)
    if newest.version <= current.layout.version:
        stale = [(k, r) for k, r in present if r.database_id in _ids(current.layout) and r.layout != current.layout]
        if stale:
            raise Wait(_disagreement(current.layout, stale[0][0].dsn, stale[0][1].layout))
        if refused and any(r.state != "stable" for _, r in present):
            raise Wait(f"a move is under way (sealed, not switched yet): the databases still record version "
                       f"{current.layout.version}")
        return None
    by_id = {r.database_id: (k, r) for k, r in present}
    journals = []
    for bounds, member in newest.members:
        if member not in by_id:
            raise ShardLayoutMismatch(
                f"the databases record {_ranges(newest)} (version {newest.version}), with slices "
                f"{format_range(bounds)} on database {member}, which no DSN of this journal reaches; list that "
                f"database's DSN as a spare (spare=DSN) or reopen with the settings of the new layout")
        holder, record = by_id[member]
        if record.layout != newest:
            raise Wait(_disagreement(record.layout, holder.dsn, newest))
        journals.append(holder)
    in_layout = {holder.dsn for holder in journals}
    shards = ShardSettings(newest.ranges, tuple(holder.dsn for holder in journals),
                           tuple(k.dsn for k in known if k.dsn not in in_layout), current.shards.replicas)
    return Routing(newest, shards, tuple(holder.journal for holder in journals))


def opening_routing(settings: ShardSettings, known: Sequence[Known[J]], records: Sequence[Record | None]
                    ) -> Routing[J]:
    """The routing a journal opens with, ``known`` being the settings' databases then its spares and
    ``records[i]`` the record of ``known[i]``: the settings' layout as every database of it records it
    (:func:`~pgjournal.shards.layout.agreed_layout`). With spares listed, settings that a move left behind open
    too: a newer layout the records settle on, every database of it reached by a known DSN, is routed (a process
    restarted after a move with its settings of before); otherwise the settings' disagreement is raised."""
    count = settings.count
    try:
        layout = agreed_layout(settings, records[:count])
    except ShardLayoutMismatch as disagreement:
        if not settings.spares:
            raise
        before = Routing(Layout(0, ()), settings, tuple(k.journal for k in known[:count]))
        try:
            routing = next_routing(before, known, records, refused=False)
        except Wait:
            raise disagreement from None
        except ShardLayoutMismatch as missing:
            raise ShardLayoutMismatch(f"{disagreement}; {missing}") from None
        if routing is None:
            raise
        log.warning("%s; routing by the records (the spares reach every database of version %d): update the "
                    "settings to %s", disagreement, routing.layout.version,
                    ", ".join(routing.shards.where(i) for i in range(routing.shards.count)))
        return routing
    return Routing(layout, settings, tuple(k.journal for k in known[:count]))


def found_nothing(conflict: ConcurrencyConflict) -> bool:
    """Whether a write's sequence number (or revision) check found nothing of the persistence id where it went:
    only then can the conflict be a move's (the range's rows deleted there), and the records are read."""
    return not conflict.actual_seq_nr


def after_conflict(current: Routing[J], known: Sequence[Known[J]], records: Sequence[Record | None],
                   persistence_id: str) -> Routing[J] | None:
    """After a write to ``persistence_id`` failed its sequence number check: the routing to retry it on when the
    records show that the persistence id's range moved to another database (a journal behind a move finds no rows
    where the range was: its conflict is the move's); ``None``: the conflict stands (nothing newer, the range did
    not move, or a switch is half done: the caller reloads and the guard speaks on its next write). Raises
    :class:`ShardLayoutMismatch` when the range moved to a database this journal does not reach."""
    slice_ = slice_for_persistence_id(persistence_id)
    newest = max((r.layout for r in records if r is not None), key=lambda layout: layout.version,
                 default=current.layout)
    if newest.version <= current.layout.version or _holder(newest, slice_) == _holder(current.layout, slice_):
        return None
    try:
        return next_routing(current, known, records, refused=False)
    except Wait:
        return None


def _holder(layout: Layout, slice_: int) -> uuid.UUID | None:
    return next((member for (lo, hi), member in layout.members if lo <= slice_ <= hi), None)


def _ids(layout: Layout) -> set[uuid.UUID]:
    return {member for _, member in layout.members}


def _ranges(layout: Layout) -> str:
    return ", ".join(map(format_range, layout.ranges))


def _disagreement(behind: Layout, dsn: str, ahead: Layout) -> str:
    return (f"the databases disagree about the shard layout: {mask_dsn(dsn)} records version {behind.version} "
            f"({_ranges(behind)}), another records version {ahead.version} ({_ranges(ahead)}); a layout change "
            "is half done")


class Follow(Generic[J]):
    """One attempt to follow the records from ``seen`` (a refused write's, or ``check_layout``'s): the faces read
    every known database's record, ask :meth:`decide`, and read again after :data:`REREAD_INTERVAL` while it says
    ``None``. After a write ``refused`` by a guard it waits while the records do not settle, at most
    ``layout_wait`` seconds; ``check_layout`` (``refused`` is ``None``) never waits."""

    def __init__(self, seen: Routing[J], known: Sequence[Known[J]], refused: ShardLayoutMismatch | None,
                 layout_wait: float) -> None:
        self.seen, self.known, self.refused = seen, known, refused
        self.deadline = time.monotonic() + layout_wait
        self.waited = False

    def decide(self, records: Sequence[Record | None]) -> Routing[J] | None:
        """The routing to use from now on (``seen`` itself: keep it), or ``None``: read the records again.
        :class:`ShardLayoutMismatch` when a database is missing or the wait ran out (after a refusal: the
        refusal's message first); a refusal with nothing to follow and nothing waited for is raised again."""
        try:
            routing = next_routing(self.seen, self.known, records, refused=self.refused is not None)
        except Wait as wait:
            if self.refused is None:
                raise ShardLayoutMismatch(wait.reason) from None
            if time.monotonic() < self.deadline:
                self.waited = True
                return None
            raise ShardLayoutMismatch(f"{self.refused}; the layout records did not settle within layout_wait: "
                                      f"{wait.reason}") from None
        except ShardLayoutMismatch as missing:
            if self.refused is None:
                raise
            raise ShardLayoutMismatch(f"{self.refused}; {missing}") from None
        if routing is not None:
            return routing
        if self.refused is not None and not self.waited:
            raise self.refused  # no move: the refusal stands (a stray write)
        return self.seen  # nothing newer; after a wait (a move rolled back) the refused write is tried again


def once(items: Iterable[T]) -> Iterable[T]:
    """``items`` readable twice (a refused write is retried once): an iterator is read into a list."""
    return items if isinstance(items, Collection) else list(items)


class Unsettled:
    """How long a long-running reader (a live by-slices stream, a sharded projection worker) bears layout records
    that disagree or name a database it cannot reach, checking now and then: ``layout_wait`` seconds in a row,
    then it gives up (and its caller raises, so that it is restarted with the settings of the new layout)."""

    def __init__(self, layout_wait: float) -> None:
        self.layout_wait = layout_wait
        self.since: float | None = None

    def gives_up(self) -> bool:
        """A check found them unsettled: whether they have been for ``layout_wait`` now."""
        now = time.monotonic()
        self.since = self.since or now
        return now - self.since >= self.layout_wait

    def settled(self) -> None:
        self.since = None


class Positioned(Protocol):
    """What a by-slices stream hands out (an event's envelope, a durable state's change): it carries its offset."""

    @property
    def offset(self) -> Offset: ...


P = TypeVar("P", bound=Positioned)


class Moved(Exception):
    """The database of a live by-slices stream's range changed: the stream reopens there, from its offset."""


class StreamFollow(Generic[J]):
    """How a live by-slices stream of a sharded journal, on both faces, follows a move of its range: before a
    poll, every :data:`LAYOUT_CHECK_INTERVAL` (:meth:`due`), its face runs ``check_layout()`` and hands the outcome
    to :meth:`checked`, which raises :class:`Moved` when the range's database changed. A poll runs only once the
    previous page was handed out, so ``offset`` (the last item handed out) is exactly where to reopen on the
    new database: the move copied the range's events with their timestamps, and a switched range is complete
    there, so none is lost, repeated or reordered (docs/sharding.md, section 6)."""

    def __init__(self, routed: Routed[J], min_slice: int, max_slice: int, offset: Offset) -> None:
        self.routed, self.range, self.offset = routed, (min_slice, max_slice), offset
        #: The journal of the range's database, read from now on.
        self.journal = routed.journal_for_slices(min_slice, max_slice)
        self.unsettled = Unsettled(routed.layout_wait)
        self.checked_at = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.checked_at < LAYOUT_CHECK_INTERVAL:
            return False
        self.checked_at = now
        return True

    def checked(self, error: Exception | None) -> None:
        """``check_layout()`` returned (``error`` ``None``) or raised ``error``. Raises :class:`Moved` (the new
        journal in :attr:`journal`); a :class:`ShardLayoutMismatch` once the records have not settled for
        ``layout_wait``, or at once when the range now spans databases; a closed journal's error (the stream
        ends). Any other error (a database unreachable) is logged: the stream reads on, and checks again."""
        if isinstance(error, ShardLayoutMismatch):
            if self.unsettled.gives_up():
                raise error
            return
        if isinstance(error, JournalClosed | PoolClosed):
            raise error
        lo, hi = self.range
        if error is not None:
            log.warning("a live by-slices stream of slices %d-%d could not read the shard layout records (%s); it "
                        "reads on and checks again", lo, hi, error)
            return
        self.unsettled.settled()
        try:
            journal = self.routed.journal_for_slices(lo, hi)
        except InvalidArgument as split:
            raise ShardLayoutMismatch(f"a live by-slices stream cannot follow layout version "
                                      f"{self.routed.layout.version}: {split}") from None
        if journal is not self.journal:
            log.info("a live by-slices stream of slices %d-%d follows the shard layout version %d to %s", lo, hi,
                     self.routed.layout.version, self.routed.shards.where(self.routed.shards.index_of(lo)))
            self.journal = journal
            raise Moved
