"""Recovery: the latest usable snapshot, then the later events in pages of ``buffer_size`` (bounded memory).

A snapshot records the entity type and the entity's ``snapshot_version`` in its metadata. One of another
type or version, one that cannot be decoded, or one :meth:`Entity.from_snapshot` rejects is ignored with a
warning, and the entity replays from its first event: a stale snapshot costs time, never correctness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pgjournal.entity.model import Entity, Recovered
from pgjournal.errors import SerializationError
from pgjournal.model.printable import printable_logger
from pgjournal.query.by_pid import PidSteps
from pgjournal.runtime.steps import Call, Step

if TYPE_CHECKING:
    from pgjournal.aio.journal import AsyncJournal
    from pgjournal.journal import Journal

S = TypeVar("S")
_log = printable_logger("pgjournal.entity")


def snapshot_metadata(entity: Entity[Any]) -> dict[str, Any]:
    return {"entity": entity.name, "version": entity.snapshot_version}


def _from_snapshot_step(journal: Journal | AsyncJournal, entity: Entity[S], pid: str) -> Step[tuple[S, int] | None]:
    try:
        selected = yield Call(journal.load_snapshot, (pid,))
    except SerializationError as exc:
        _log.warning("ignoring the snapshot of %r: %s; replaying all events", pid, exc)
        return None
    if selected is None:
        return None
    wanted = snapshot_metadata(entity)
    if selected.metadata != wanted:
        _log.warning("ignoring the snapshot of %r at seq_nr %d: it is %r, this entity reads %r; replaying all "
                     "events", pid, selected.seq_nr, selected.metadata, wanted)
        return None
    try:
        return entity.from_snapshot(selected.snapshot), selected.seq_nr
    except Exception as exc:
        _log.warning("ignoring the snapshot of %r at seq_nr %d: from_snapshot failed (%s: %s); replaying all "
                     "events", pid, selected.seq_nr, exc.__class__.__name__, exc)
        return None


def recover(journal: Journal, entity: Entity[S], pid: str) -> Recovered[S]:
    """The current state of ``pid`` as stored: snapshot (if usable) plus the events after it."""
    return journal.run(recover_step(journal, entity, pid))


def recover_step(journal: Journal | AsyncJournal, entity: Entity[S], pid: str) -> Step[Recovered[S]]:
    """:func:`recover` as a step (:mod:`pgjournal.runtime.steps`) of the journal's own calls (blocking or asyncio),
    each on a connection of its own, replaying page by page (bounded memory)."""
    snapshot = yield from _from_snapshot_step(journal, entity, pid)
    state, seq_nr = snapshot if snapshot is not None else (entity.new_state(), 0)
    # Read the highest sequence number first and replay up to it: every event up to it is committed, so the
    # state is exactly that of the stream at ``highest`` even while others append. Events the replay does
    # not return there were deleted (delete_events); their numbers stay taken.
    reader = PidSteps(journal)
    highest = yield Call(journal.highest_seq_nr, (pid,))
    replayed = 0
    start = seq_nr + 1
    while start <= highest:
        page = yield Call(journal.run, (reader.page_step(pid, start, highest),))
        if not page:
            break
        for envelope in page:
            state = entity.apply(state, envelope.event)
        replayed += len(page)
        start = page[-1].seq_nr + 1
    return Recovered(state, max(seq_nr, highest), snapshot[1] if snapshot is not None else None, replayed)
