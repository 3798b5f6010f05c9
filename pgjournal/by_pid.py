"""Reads by persistence id: its events in sequence order, its highest sequence number, all persistence ids."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from .envelope import EventEnvelope, Source, envelope_from_row
from .errors import EventNotFound
from .polling import LiveQuery
from .slices import entity_type_of
from .validation import check_name, check_persistence_id, check_positive, check_seq_nr

if TYPE_CHECKING:
    from .journal import Journal

MAX_SEQ_NR = 2**63 - 1



def _check_range(persistence_id: str, from_seq_nr: int, to_seq_nr: int | None) -> tuple[str, int, int]:
    pid = check_persistence_id(persistence_id)
    check_seq_nr(from_seq_nr, "from_seq_nr")
    to = MAX_SEQ_NR if to_seq_nr is None else check_seq_nr(to_seq_nr, "to_seq_nr")
    return pid, max(from_seq_nr, 1), to


class ByPersistenceId:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest sequence number written (logically deleted events count), 0 when none."""
        pid = check_persistence_id(persistence_id)
        with self._journal.connection() as conn:
            row = conn.execute(*self._journal.events.highest_seq_nr(pid)).fetchone()
        return int(row[0]) if row else 0

    def _page(self, pid: str, from_seq_nr: int, to_seq_nr: int, source: Source) -> list[EventEnvelope]:
        limit = self._journal.settings.buffer_size
        with self._journal.connection() as conn:
            rows = conn.execute(*self._journal.events.by_persistence_id(pid, from_seq_nr, to_seq_nr, limit)).fetchall()
        return [envelope_from_row(row, self._journal.serializers, source=source) for row in rows]

    def current(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
                ) -> Iterator[EventEnvelope]:
        """Events up to the highest sequence number seen when the query starts, in pages."""
        pid, start, to = _check_range(persistence_id, from_seq_nr, to_seq_nr)
        to = min(to, self.highest_seq_nr(pid))
        while start <= to:
            page = self._page(pid, start, to, Source.QUERY)
            if not page:
                return
            yield from page
            start = page[-1].seq_nr + 1

    def live(self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
             ) -> LiveQuery[EventEnvelope]:
        """Events from ``from_seq_nr`` on, polling for new ones until ``to_seq_nr`` or ``close()``."""
        pid, start, to = _check_range(persistence_id, from_seq_nr, to_seq_nr)
        next_seq_nr = start
        query: LiveQuery[EventEnvelope]

        def poll(notified: bool) -> tuple[list[EventEnvelope], int]:
            nonlocal next_seq_nr
            # With a bound, read the highest seq nr *before* the page: if it had reached the bound, a short
            # page holds everything left up to it (the rest was deleted), so the query can end.
            written_to_bound = to < MAX_SEQ_NR and self.highest_seq_nr(pid) >= to
            page = self._page(pid, next_seq_nr, to, Source.NOTIFIED if notified else Source.QUERY)
            if page:
                next_seq_nr = page[-1].seq_nr + 1
            if next_seq_nr > to or (written_to_bound and len(page) < self._journal.settings.buffer_size):
                query.close()
            return page, len(page)

        query = self._journal.live_query(poll, entity_types={entity_type_of(pid)})
        return query

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of an event, ``None`` when there is none (or it is deleted)."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        with self._journal.connection() as conn:
            row = conn.execute(*self._journal.events.timestamp_of(pid, seq_nr)).fetchone()
        return None if row is None else row[0]

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope:
        """One event as an envelope (its offset: its own timestamp, seen at it); :class:`EventNotFound` when
        there is none (or it is deleted)."""
        pid = check_persistence_id(persistence_id)
        check_seq_nr(seq_nr, "seq_nr", minimum=1)
        with self._journal.connection() as conn:
            row = conn.execute(*self._journal.events.one_event(pid, seq_nr)).fetchone()
        if row is None:
            raise EventNotFound(pid, seq_nr)
        return envelope_from_row(row, self._journal.serializers)

    def persistence_ids(self, after: str | None = None, limit: int | None = None, *,
                        entity_type: str | None = None) -> Iterator[str]:
        """Every persistence id (of ``entity_type`` when given; ``""``: ids without ``|``) once, in order,
        keyset-paged; ``limit`` caps the total."""
        if after is not None:
            check_persistence_id(after)
        if limit is not None:
            check_positive(limit, "limit")
        if entity_type is not None and entity_type != "":
            check_name(entity_type, "entity type")
        events = self._journal.events
        page_size = self._journal.settings.buffer_size
        last, left = after or "", limit
        while left is None or left > 0:
            size = page_size if left is None else min(page_size, left)
            with self._journal.connection() as conn:
                query = (events.persistence_ids(last, size) if entity_type is None
                         else events.persistence_ids_of_type(entity_type, last, size))
                page = [row[0] for row in conn.execute(*query).fetchall()]
            yield from page
            if len(page) < size:
                return
            last = page[-1]
            left = None if left is None else left - len(page)
