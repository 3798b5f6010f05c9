"""events_by_slices_starting_from_snapshots (Akka's ``eventsBySlicesStartingFromSnapshots``): for each
persistence id of the range with a snapshot taken after the offset, its snapshot first (as an envelope whose
event is ``transform(snapshot)``), then only its events after the snapshot; other persistence ids' events as
``events_by_slices`` delivers them.

The snapshots are read when the query is created. The by-slice query then starts at the offset (not at the
snapshots: persistence ids without a snapshot need their events from there) with each snapshot's sequence
number marked delivered in its gate, so events up to a snapshot are dropped as duplicates and the event after
it is delivered without a predecessor lookup.

A snapshot envelope carries the query's *start* offset: snapshots come before events that are older than
them, so an offset at the snapshot could skip those. Restarting from it reads the snapshots again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pgjournal.core.journal_core import BlockingCore
from pgjournal.errors import InvalidArgument
from pgjournal.model.envelope import EventEnvelope, Source
from pgjournal.model.offsets import NoOffset, Offset
from pgjournal.query.by_slices import BySlices, SliceQuery
from pgjournal.runtime.live import LiveQuery
from pgjournal.runtime.steps import Step, run_pooled, statement

if TYPE_CHECKING:
    from pgjournal.codec.serialization import SerializerRegistry

Transform = Callable[[Any], Any]


def _prepare(journal: BlockingCore, entity_type: str, min_slice: int, max_slice: int, offset: Offset,
             transform: Transform, serializers: SerializerRegistry | None) -> tuple[SliceQuery, list[EventEnvelope]]:
    """The by-slice query with the snapshots' sequence numbers marked delivered, and the snapshot envelopes."""
    query = SliceQuery(journal, entity_type, min_slice, max_slice, offset, serializers=serializers)
    return query, run_pooled(snapshots_step(query, min_slice, max_slice, transform, serializers), journal.connection)


def check_transform(transform: Any) -> Transform:
    if not callable(transform):
        raise InvalidArgument(f"transform must be a function from a snapshot to an event, got "
                              f"{type(transform).__name__}")
    return transform  # type: ignore[no-any-return]


def snapshots_step(query: SliceQuery, min_slice: int, max_slice: int, transform: Transform,
                   serializers: SerializerRegistry | None = None) -> Step[list[EventEnvelope]]:
    """The snapshot envelopes of the query's range taken after its start, each marked delivered in its gate."""
    check_transform(transform)
    journal, start = query.journal, query.start
    rows = yield statement(journal.snapshot_sql.by_slices(query.entity_type, min_slice, max_slice, start.timestamp))
    serializers = serializers if serializers is not None else journal.serializers
    out: list[EventEnvelope] = []
    for row in rows:
        pid, seq_nr, ts = row.persistence_id, row.seq_nr, row.db_timestamp
        assert ts is not None  # the query keeps only snapshots placed in time
        if start.covers(ts, pid, seq_nr):
            continue  # consumed before this query started
        where = f" of the snapshot of persistence id {pid!r} at seq_nr {seq_nr}"
        snapshot = serializers.deserialize(row.ser_id, row.ser_manifest, row.snapshot, where=where,
                                           persistence_id=pid, seq_nr=seq_nr)
        metadata = None if row.meta_ser_id is None else serializers.deserialize(
            row.meta_ser_id, row.meta_ser_manifest or "", row.meta_payload, where=f" of the metadata{where}",
            persistence_id=pid, seq_nr=seq_nr)
        out.append(EventEnvelope(pid, seq_nr, row.slice, row.entity_type, ts, start, transform(snapshot),
                                 tuple(row.tags or ()), metadata, Source.SNAPSHOT))
        query.gate.deliver(pid, seq_nr, ts)
    return out


def current(journal: BlockingCore, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
            transform: Transform, serializers: SerializerRegistry | None = None) -> Iterator[EventEnvelope]:
    query, snapshots = _prepare(journal, entity_type, min_slice, max_slice, offset, transform, serializers)
    events = BySlices(journal).run_current(query)

    def chained() -> Iterator[EventEnvelope]:
        yield from snapshots
        yield from events

    return chained()


def live(journal: BlockingCore, entity_type: str, min_slice: int, max_slice: int, offset: Offset = NoOffset, *,
         transform: Transform, serializers: SerializerRegistry | None = None) -> SnapshotsThenLive:
    query, snapshots = _prepare(journal, entity_type, min_slice, max_slice, offset, transform, serializers)
    return SnapshotsThenLive(snapshots, BySlices(journal).run_live(query))


class SnapshotsThenLive:
    """A live query (iterate, ``close()``, ``with``) that delivers the snapshot envelopes first."""

    def __init__(self, snapshots: list[EventEnvelope], live: LiveQuery[EventEnvelope]) -> None:
        self._snapshots = deque(snapshots)
        self._live = live

    def __iter__(self) -> Iterator[EventEnvelope]:
        return self

    def __next__(self) -> EventEnvelope:
        if self._snapshots and not self._live.closed:
            return self._snapshots.popleft()
        return next(self._live)

    def close(self) -> None:
        self._live.close()

    @property
    def closed(self) -> bool:
        return self._live.closed

    def __enter__(self) -> SnapshotsThenLive:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
