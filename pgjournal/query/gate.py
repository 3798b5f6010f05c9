"""The ordering/dedup gate: per persistence id, each event once and in sequence order; gaps filled or reported.

Written once, used by ``events_by_slices`` (and durable state's changes), ``events_by_tag``, the projection
offset store and the firehose's consumers (between their catch-up and the shared query); both faces run the
same query steps, so the asyncio face goes through it too. Per persistence id the gate remembers the highest
number delivered (a sequence number; on the tag path a tag sequence number) with a *stamp* the caller chooses
(by-slice and firehose: the event's ``db_timestamp``; projections: its slice and ``db_timestamp``) by which it
forgets old entries. A number that arrives is

* :attr:`Verdict.DUPLICATE` at or below the highest delivered: drop it;
* :attr:`Verdict.NEXT` one above it: deliver it (and :meth:`Gate.deliver` it);
* :attr:`Verdict.GAP` higher: the numbers between are missing. How a gap is *filled* or *reported* is the
  caller's: by-slice loads them by persistence id from the journal and delivers them first, the tag path
  searches the tag view and fails with ``MissingTaggedEventsError`` after ``tag_gap_timeout``, a projection
  rejects the envelope and replays the missing events first.

A persistence id the gate does not know (never met, or forgotten) is resolved by the caller's *policy*
(:data:`Unknown`), which says what counts as delivered before it: a sequence number (everything up to it),
``None`` (not known: the gap reaches back to the caller's floor, e.g. the query's start) or
:attr:`Verdict.DUPLICATE` (the event itself counts as delivered, e.g. older than a projection's window).

A catch-up meets the common case on nearly every row (the next number of a known persistence id, or 1):
:meth:`Gate.take_next` (per row: by-slice's page loop) and :meth:`Gate.take_leading` (per page or streamed
chunk: the tag stream) deliver it in one call and leave everything else to :meth:`Gate.judge`.

The gate runs no SQL: a policy that needs the database is resolved by the caller first (by-slice loads the
predecessors of a page's unknown persistence ids in one statement; the offset store looks one up), so the
same gate serves the blocking and the asyncio faces.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from pgjournal.model.timeuuid import EPOCH

S = TypeVar("S")


class Verdict(enum.Enum):
    DUPLICATE = "duplicate"
    NEXT = "next"
    GAP = "gap"
    # Akka Projection's words for the same verdicts (the projection offset store speaks them).
    ACCEPTED = "next"
    REJECTED = "gap"


DUPLICATE, NEXT, GAP = Verdict.DUPLICATE, Verdict.NEXT, Verdict.GAP

#: What counts as delivered before an event of a persistence id the gate does not know: a sequence number,
#: ``None`` (not known) or :attr:`Verdict.DUPLICATE`. Called with the persistence id and the event's number.
Unknown = Callable[[str, int], "int | Verdict | None"]


def judge(after: int | Verdict | None, seq_nr: int) -> Verdict:
    """The verdict for event ``seq_nr`` when everything up to ``after`` was delivered (see :data:`Unknown`)."""
    if after is None:
        return GAP
    if after is DUPLICATE:
        return DUPLICATE
    if seq_nr <= after:  # type: ignore[operator]
        return DUPLICATE
    return NEXT if seq_nr == after + 1 else GAP  # type: ignore[operator]


class Gate(Generic[S]):
    """Per persistence id: the highest number delivered and its stamp; what was forgotten, since when.

    Not thread-safe: one query (or one projection range) owns it.
    """

    __slots__ = ("_log", "delivered", "forgotten_before")

    def __init__(self) -> None:
        #: The changes since :meth:`begin` (``None``: not recording), for :meth:`undo`.
        self._log: list[Any] | None = None
        #: ``pid -> (highest number delivered, stamp)``.
        self.delivered: dict[str, tuple[int, S]] = {}
        #: Entries stamped before this were forgotten (see :meth:`forget`): a persistence id met again after
        #: them is unknown, and its policy must count what was delivered before this time.
        self.forgotten_before: datetime = EPOCH

    def last(self, pid: str) -> int | None:
        """The highest number delivered for ``pid``, ``None`` when it is not known."""
        known = self.delivered.get(pid)
        return None if known is None else known[0]

    def judge(self, pid: str, seq_nr: int, unknown: Unknown) -> tuple[Verdict, int | Verdict | None]:
        """The verdict for event ``seq_nr`` of ``pid``, and what counted as delivered before it (for a gap:
        the missing numbers are ``after + 1 .. seq_nr - 1``, all of those above the caller's floor when
        ``after`` is ``None``)."""
        known = self.delivered.get(pid)
        if known is not None:  # the common case, inline (a catch-up judges every row)
            last = known[0]
            return (DUPLICATE if seq_nr <= last else NEXT if seq_nr == last + 1 else GAP), last
        after = unknown(pid, seq_nr)
        return judge(after, seq_nr), after

    def take_next(self, pid: str, seq_nr: int, stamp: S) -> bool:
        """The common case in one call (a catch-up meets it on nearly every row): when ``seq_nr`` is
        :attr:`Verdict.NEXT` for ``pid`` (for a ``pid`` not known: when it is 1, which every caller's policy
        takes as next), deliver it and return ``True``; otherwise change nothing and return ``False`` (then
        :meth:`judge` it)."""
        known = self.delivered.get(pid)
        if seq_nr == 1 if known is None else seq_nr == known[0] + 1:
            self.delivered[pid] = (seq_nr, stamp)
            return True
        return False

    def take_leading(self, rows: Sequence[Sequence[Any]], stamp: S, pid_at: int = 2, seq_at: int = 3) -> int:
        """:meth:`take_next` for the rows of a page from the first on, while it holds, in one call: how many
        were delivered (a row holds its persistence id at ``pid_at`` and its number at ``seq_at``)."""
        delivered, log = self.delivered, self._log
        if log is not None:
            return self._take_leading_logged(rows, stamp, pid_at, seq_at, log)
        for taken, row in enumerate(rows):
            pid, seq_nr = row[pid_at], row[seq_at]
            known = delivered.get(pid)
            if not (seq_nr == 1 if known is None else seq_nr == known[0] + 1):
                return taken
            delivered[pid] = (seq_nr, stamp)
        return len(rows)

    def _take_leading_logged(self, rows: Sequence[Sequence[Any]], stamp: S, pid_at: int, seq_at: int,
                             log: list[Any]) -> int:
        """:meth:`take_leading` while recording (:meth:`begin`): each taken row's previous entry is kept, in
        one log entry for the run of rows (the same loop, apart so the common case pays nothing for it)."""
        delivered = self.delivered
        before: list[tuple[int, S] | None] = []
        keep = before.append
        taken = len(rows)
        for at, row in enumerate(rows):
            pid, seq_nr = row[pid_at], row[seq_at]
            known = delivered.get(pid)
            if not (seq_nr == 1 if known is None else seq_nr == known[0] + 1):
                taken = at
                break
            keep(known)
            delivered[pid] = (seq_nr, stamp)
        if taken:
            log.append((rows, pid_at, before))
        return taken

    def deliver(self, pid: str, seq_nr: int, stamp: S) -> None:
        """Record event ``seq_nr`` of ``pid`` delivered (call it in sequence order)."""
        if self._log is not None:
            self._log.append((pid, self.delivered.get(pid)))
        self.delivered[pid] = (seq_nr, stamp)

    def assume(self, pid: str, seq_nr: int, stamp: S) -> None:
        """Count everything of ``pid`` up to ``seq_nr`` as delivered, unless ``pid`` is known already (what a
        caller learnt lies before its start)."""
        if self._log is not None:
            self._log.append((pid, self.delivered.get(pid)))
        self.delivered.setdefault(pid, (seq_nr, stamp))

    def drop(self, pid: str) -> None:
        """Forget ``pid`` (what its caller knows cannot come again)."""
        if self._log is not None:
            self._log.append((pid, self.delivered.get(pid)))
        self.delivered.pop(pid, None)

    def forget(self, before: datetime, when: Callable[[S], datetime] | None = None) -> None:
        """Forget the persistence ids last delivered before ``before`` (``when``: a stamp's time; default
        the stamp itself). The bound only moves forward."""
        if before <= self.forgotten_before:
            return
        if self._log is not None:
            self._log.append((self.delivered, self.forgotten_before))
        if when is None:
            self.delivered = {pid: v for pid, v in self.delivered.items() if v[1] >= before}  # type: ignore[operator]
        else:
            self.delivered = {pid: v for pid, v in self.delivered.items() if when(v[1]) >= before}
        self.forgotten_before = before

    def forget_where(self, stale: Callable[[S], bool]) -> None:
        """Forget the persistence ids whose stamp is ``stale`` (a bound per entry, e.g. per slice)."""
        if self._log is not None:
            self._log.append((self.delivered, self.forgotten_before))
        self.delivered = {pid: v for pid, v in self.delivered.items() if not stale(v[1])}

    # -- failure atomicity ---------------------------------------------------------------------------

    def checkpoint(self) -> tuple[Any, ...]:
        """The whole state, for :meth:`restore` (a copy of the map: what :meth:`begin` avoids)."""
        return dict(self.delivered), self.forgotten_before

    def begin(self) -> None:
        """Record every change from now on, so :meth:`undo` can take them back: the cost of what changes, not
        of a copy of the whole map (a tag stream's poll touches a page's persistence ids; the map holds every
        persistence id the stream has met)."""
        self._log = []

    def commit(self) -> None:
        """Keep the changes since :meth:`begin`; stop recording."""
        self._log = None

    def undo(self) -> None:
        """Take back the changes since :meth:`begin`, newest first; stop recording."""
        log, self._log = self._log, None
        assert log is not None, "undo without begin"
        delivered = self.delivered
        for entry in reversed(log):
            if entry[0].__class__ is dict:  # forget: the map before it
                delivered, self.forgotten_before = entry
                self.delivered = delivered
            elif len(entry) == 3:  # a run of take_leading: each row's previous entry
                rows, pid_at, before = entry
                for row, known in zip(reversed(rows[:len(before)]), reversed(before), strict=True):
                    if known is None:
                        delivered.pop(row[pid_at], None)
                    else:
                        delivered[row[pid_at]] = known
            else:
                pid, known = entry
                if known is None:
                    delivered.pop(pid, None)
                else:
                    delivered[pid] = known

    def restore(self, saved: tuple[Any, ...]) -> None:
        delivered, self.forgotten_before = saved
        self.delivered = dict(delivered)
