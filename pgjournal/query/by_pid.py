"""Reads by persistence id: its events in sequence order, its highest sequence number, all persistence ids."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.core.journal_core import BlockingCore, JournalCore
from pgjournal.errors import EventNotFound
from pgjournal.model.envelope import EventEnvelope, Source, envelope_from_row
from pgjournal.model.slices import entity_type_of
from pgjournal.runtime.live import LiveQuery
from pgjournal.runtime.steps import Step, drive, first_of, joined, rows_of, run_pooled, statement
from pgjournal.validation import check_name, check_persistence_id, check_positive, check_seq_nr

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry

MAX_SEQ_NR = 2**63 - 1


@dataclass
class _LiveByPid:
    """Where a live query by persistence id stands."""

    pid: str
    next_seq_nr: int
    to: int


def check_range(persistence_id: str, from_seq_nr: int, to_seq_nr: int | None) -> tuple[str, int, int]:
    """A by-persistence-id read's arguments checked: the persistence id, the first and the last number."""
    pid = check_persistence_id(persistence_id)
    check_seq_nr(from_seq_nr, "from_seq_nr")
    to = MAX_SEQ_NR if to_seq_nr is None else check_seq_nr(to_seq_nr, "to_seq_nr")
    return pid, max(from_seq_nr, 1), to


class PidSteps:
    """Reads by persistence id as steps (:mod:`pgjournal.runtime.steps`), for either face to run;
    ``serializers``: decode with these instead of the journal's (see :class:`pgjournal.query.Query`)."""

    def __init__(self, journal: JournalCore, serializers: SerializerRegistry | None = None) -> None:
        self._core = journal
        self._serializers = serializers if serializers is not None else journal.serializers

    def highest_seq_nr_step(self, pid: str) -> Step[int]:
        rows = yield statement(self._core.events.highest_seq_nr(pid))
        return int(rows[0][0]) if rows else 0

    def page_step(self, pid: str, from_seq_nr: int, to_seq_nr: int, source: Source = Source.QUERY
                  ) -> Step[list[EventEnvelope]]:
        """Events ``from_seq_nr..to_seq_nr`` (not deleted), at most ``buffer_size`` of them."""
        limit = self._core.settings.buffer_size
        rows = yield statement(self._core.events.by_persistence_id(pid, from_seq_nr, to_seq_nr, limit))
        return [envelope_from_row(row, self._serializers, source=source) for row in rows]

    def events_step(self, pid: str, from_seq_nr: int, to_seq_nr: int) -> Step[list[EventEnvelope]]:
        """All events ``from_seq_nr..to_seq_nr`` up to the highest written now, page by page on one connection
        (a projection replaying a gap: a few events)."""
        return (yield from joined(self.current_steps(pid, from_seq_nr, to_seq_nr)))

    def current_steps(self, pid: str, start: int, to: int) -> Iterator[Step[list[EventEnvelope]]]:
        """The current query as steps: the highest sequence number, then the pages up to it."""
        highest: list[int] = []
        yield self._into(self.highest_seq_nr_step(pid), highest)
        to = min(to, highest[0])
        while start <= to:
            page = yield self.page_step(pid, start, to)
            if not page:
                return
            start = page[-1].seq_nr + 1

    @staticmethod
    def _firsts(query: tuple[str, Any]) -> Step[list[str]]:
        return [row[0] for row in (yield from rows_of(query))]

    @staticmethod
    def _into(step: Step[int], box: list[int]) -> Step[list[EventEnvelope]]:
        box.append((yield from step))
        return []

    @staticmethod
    def live_state(persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None) -> _LiveByPid:
        """Where a new live query by persistence id starts (its arguments checked)."""
        return _LiveByPid(*check_range(persistence_id, from_seq_nr, to_seq_nr))

    def poll_step(self, state: _LiveByPid, notified: bool, end: Callable[[], None]
                  ) -> Step[tuple[list[EventEnvelope], int]]:
        """One poll of a live query: the next page and its size; ``end()`` is called when the query has ended."""
        to = state.to
        # With a bound, read the highest seq nr *before* the page: if it had reached the bound, a short
        # page holds everything left up to it (the rest was deleted), so the query can end.
        written_to_bound = to < MAX_SEQ_NR and (yield from self.highest_seq_nr_step(state.pid)) >= to
        page = yield from self.page_step(state.pid, state.next_seq_nr, to,
                                         Source.NOTIFIED if notified else Source.QUERY)
        if page:
            state.next_seq_nr = page[-1].seq_nr + 1
        if state.next_seq_nr > to or (written_to_bound and len(page) < self._core.settings.buffer_size):
            end()
        return page, len(page)

    def timestamp_of_step(self, persistence_id: str, seq_nr: int) -> Step[datetime | None]:
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        row = yield from first_of(self._core.events.timestamp_of(pid, seq_nr))
        return row[0] if row else None

    def load_envelope_step(self, persistence_id: str, seq_nr: int) -> Step[EventEnvelope]:
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        row = yield from first_of(self._core.events.one_event(pid, seq_nr))
        if row is None:
            raise EventNotFound(pid, seq_nr)
        return envelope_from_row(row, self._serializers)

    def persistence_ids_steps(self, after: str | None = None, limit: int | None = None, *,
                              entity_type: str | None = None) -> Generator[Step[list[str]], list[str], None]:
        """:meth:`persistence_ids` as steps, a page each (the driver sends each page back)."""
        if after is not None:
            check_persistence_id(after)
        if limit is not None:
            check_positive(limit, "limit")
        if entity_type is not None and entity_type != "":
            check_name(entity_type, "entity type")
        events = self._core.events
        page_size = self._core.settings.buffer_size
        last, left = after or "", limit
        while left is None or left > 0:
            size = page_size if left is None else min(page_size, left)
            query = (events.persistence_ids(last, size) if entity_type is None
                     else events.persistence_ids_of_type(entity_type, last, size))
            page = yield self._firsts(query)
            if len(page) < size:
                return
            last = page[-1]
            left = None if left is None else left - len(page)


class ByPersistenceId(PidSteps):
    """Reads by persistence id on the blocking face: each step run on the journal's pool."""

    def __init__(self, journal: BlockingCore, serializers: SerializerRegistry | None = None) -> None:
        super().__init__(journal, serializers)
        self._journal = journal

    def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest sequence number written (logically deleted events count), 0 when none."""
        pid = check_persistence_id(persistence_id)
        return run_pooled(self.highest_seq_nr_step(pid), self._journal.connection)

    def current(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                ) -> Iterator[EventEnvelope]:
        """Events up to the highest sequence number seen when the query starts, in pages."""
        pid, start, to = check_range(persistence_id, from_seq_nr, to_seq_nr)
        return drive(self.current_steps(pid, start, to), self._journal.connection)

    def live(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
             ) -> LiveQuery[EventEnvelope]:
        """Events from ``from_seq_nr`` on, polling for new ones until ``to_seq_nr`` or ``close()``."""
        state = self.live_state(persistence_id, from_seq_nr, to_seq_nr)
        query: LiveQuery[EventEnvelope]

        def poll(notified: bool) -> tuple[list[EventEnvelope], int]:
            return run_pooled(self.poll_step(state, notified, query.close), self._journal.connection)

        query = self._journal.live_query(poll, entity_types={entity_type_of(state.pid)})
        return query

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of an event, ``None`` when there is none (or it is deleted)."""
        return run_pooled(self.timestamp_of_step(persistence_id, seq_nr), self._journal.connection)

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """One event as an envelope (its offset: its own timestamp, seen at it); :class:`EventNotFound` when
        there is none (or it is deleted)."""
        return run_pooled(self.load_envelope_step(persistence_id, seq_nr), self._journal.connection)

    def persistence_ids(self, after: str | None = None, limit: int | None = None, *,
                        entity_type: str | None = None) -> Iterator[str]:
        """Every persistence id (of ``entity_type`` when given; ``""``: ids without ``|``) once, in order,
        keyset-paged; ``limit`` caps the total."""
        return drive(self.persistence_ids_steps(after, limit, entity_type=entity_type), self._journal.connection)
