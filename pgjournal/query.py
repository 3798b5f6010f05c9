"""``journal.query``: every read, in a *current* form (ends at the tail seen at start) and a *live* form."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .envelope import EventEnvelope
from .polling import LiveQuery

if TYPE_CHECKING:
    from .journal import Journal


class Query:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Iterator[EventEnvelope]:
        return self._journal.by_pid.current(persistence_id, from_seq_nr, to_seq_nr)

    def events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> LiveQuery[EventEnvelope]:
        return self._journal.by_pid.live(persistence_id, from_seq_nr, to_seq_nr)

    def current_persistence_ids(self, after: str | None = None, limit: int | None = 1000) -> Iterator[str]:
        return self._journal.by_pid.persistence_ids(after, limit)
