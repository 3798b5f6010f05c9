"""Read-your-writes through a projection: wait until a projection has processed a given event (the envelope an
``append`` returned), at most a given time, then go on or raise :class:`~pgjournal.errors.NotSeenInTime`
(Marten's queries for non-stale data, Eventuate's conditional requests).

"Processed" is the offset store's own verdict (:meth:`~projections.offset_store.OffsetStore.validate_step`): the
event is a duplicate for the projection, as its runner would judge it, so the answer is the same one the runner
acts on, in the same window. Each check reads the offsets of the event's slice on a connection borrowed for it;
the waits between checks hold none. One step serves both faces (:mod:`pgjournal.runtime.steps`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pgjournal.errors import InvalidArgument, NotSeenInTime
from pgjournal.model.envelope import EventEnvelope
from pgjournal.query.gate import Verdict
from pgjournal.runtime.steps import Call, Sleep, Step

from .handlers import ProjectionSettings
from .logic import lookback
from .offset_store import OffsetStore

if TYPE_CHECKING:
    from pgjournal.aio import AsyncJournal
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal


def processed_step(journal: JournalCore, projection: str, envelope: EventEnvelope,
                   settings: ProjectionSettings | None = None) -> Step[bool]:
    """Whether ``projection`` has processed ``envelope``'s event (``settings``: the projection's, for its window
    and offset table; the defaults when ``None``)."""
    settings = settings if settings is not None else ProjectionSettings()
    window = max(settings.time_window, 2 * lookback(journal, settings))  # the runner's window (RangeLogic)
    store = OffsetStore(journal, projection, envelope.entity_type, envelope.slice, envelope.slice,  # type: ignore[arg-type]
                        time_window=window, table=settings.offset_table)
    yield from store.load_step()
    if not store.latest:
        return False  # nothing of the slice processed (or marked) yet
    return (yield from store.validate_step(envelope, {})).verdict is Verdict.DUPLICATE


def wait_for_projection_step(journal: JournalCore, projection: str, envelope: EventEnvelope, timeout: float,
                             settings: ProjectionSettings | None = None) -> Step[None]:
    """:func:`wait_for_projection` as a step, for either face."""
    if not isinstance(projection, str) or not projection:
        raise InvalidArgument(f"projection must be a projection's name, got {projection!r}")
    if not isinstance(envelope, EventEnvelope):
        raise InvalidArgument(f"envelope must be the EventEnvelope of the write to wait for, got {envelope!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout < float("inf"):
        raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        if (yield Call(journal.run, (processed_step(journal, projection, envelope, settings),))):  # type: ignore[attr-defined]
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotSeenInTime(
                f"projection {projection!r} had not processed {envelope.persistence_id!r} seq_nr {envelope.seq_nr} "
                f"within {float(timeout)}s", waited_for=(envelope.persistence_id, envelope.seq_nr), seen=None,
                timeout=float(timeout))
        yield Sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def wait_for_projection(journal: Journal, projection: str, envelope: EventEnvelope, *, timeout: float,
                        settings: ProjectionSettings | None = None) -> None:
    """Wait until ``projection`` has processed the event of ``envelope`` (what ``journal.append`` returned), at most
    ``timeout`` seconds, polling its offsets; raise :class:`~pgjournal.errors.NotSeenInTime` otherwise."""
    journal.run(wait_for_projection_step(journal, projection, envelope, timeout, settings))


async def await_for_projection(journal: AsyncJournal, projection: str, envelope: EventEnvelope, *, timeout: float,
                               settings: ProjectionSettings | None = None) -> Any:
    """:func:`wait_for_projection`, awaited."""
    await journal.run(wait_for_projection_step(journal, projection, envelope, timeout, settings))


__all__ = ["await_for_projection", "processed_step", "wait_for_projection", "wait_for_projection_step"]
