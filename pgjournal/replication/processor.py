"""The event processor: read events by slices from a journal (this database's or another's), write events into
this journal, the source's offsets stored in the same transaction as the writes (Eventuate's event-sourced
processor). Exactly once: what a batch wrote and the offsets past it commit together, so a processor killed at
any moment resumes from the stored offsets and writes nothing twice.

It is a projection whose events come from elsewhere: the projections' runner (:class:`~projections.runner.RangeRunner`
with a ``source``), their per-slice offset store, validation (each persistence id in order, gaps filled from the
source), grouped transactions, leases and workers. Only the reading is the source's; the offsets, the leases and
the transaction are in the target journal.

``process(conn, envelopes)`` is called inside the batch's transaction on the target's connection; it writes with
:func:`append_events` (or any SQL of its own). With ``as_stored=True`` the envelopes carry :class:`Stored` values
instead of decoded events and metadata: the bytes as the source stored them, to be copied without a serializer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgjournal.errors import InvalidArgument
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.projections.aio import AsyncRangeRunner
from pgjournal.projections.handlers import Grouped, Projection, ProjectionSettings
from pgjournal.projections.leases import LeaseManager
from pgjournal.projections.runner import RangeRunner
from pgjournal.projections.workers import Worker
from pgjournal.runtime.steps import Step, run, statement
from pgjournal.store.binary_arrays import bytea_array
from pgjournal.store.events import int_array, text_array
from pgjournal.validation import check_name, check_persistence_id

if TYPE_CHECKING:
    import psycopg

    from pgjournal.aio import AsyncJournal
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal
    from pgjournal.model.envelope import EventEnvelope


@dataclass(frozen=True, slots=True)
class Stored:
    """A payload as stored: serializer id, manifest and bytes (an event's or its metadata's)."""

    ser_id: int
    manifest: str
    payload: bytes = field(repr=False)


class AsStored:
    """A serializer registry for reading only, that decodes nothing: every payload (event or metadata) is read as
    its :class:`Stored` bytes. Delegates everything else to the journal's registry."""

    def __init__(self, inner: SerializerRegistry) -> None:
        self._inner = inner

    def deserialize(self, ser_id: int, manifest: str, payload: bytes, **_where: Any) -> Stored:
        return Stored(ser_id, manifest or "", bytes(payload))

    def plain_json(self, ser_id: int, manifest: str) -> bool:
        return False

    def bulk_reader(self, fallback: Any = None) -> Callable[[int, str, bytes, str, int], Any]:
        return lambda ser_id, manifest, payload, _pid, _seq_nr: Stored(ser_id, manifest or "", bytes(payload))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def as_stored(journal: JournalCore) -> SerializerRegistry:
    """:class:`AsStored` over ``journal``'s registry, typed as a registry for the queries' ``serializers=``."""
    return AsStored(journal.serializers)  # type: ignore[return-value]


def append_events_step(journal: JournalCore, persistence_id: str, events: Sequence[Any], *,
                       expected: int | None = None, metadata: Stored | None = None,
                       tags: Sequence[str] | None = None, writer: str | None = None) -> Step[list[tuple[int, Any]]]:
    """Append ``events`` to ``persistence_id`` of ``journal``, inside the open transaction of the connection the
    step runs on (the processor's): after ``expected`` (``None``: after the latest event; a conflict raises the
    database's ``UniqueViolation``; an ``expected`` that does not exist raises :class:`InvalidArgument`). An event
    that is a :class:`Stored` is written as it is, any other value through ``journal``'s serializers. Returns
    ``(seq_nr, db_timestamp)`` of each; the journal's readers are signalled after the commit by the runner."""
    pid = check_persistence_id(persistence_id)
    out: list[tuple[int, Any]] = []
    slice_ = slice_for_persistence_id(pid)
    for event in events:
        encoded = event if isinstance(event, Stored) else journal.serializers.serialize(event, persistence_id=pid)
        params = {"slice": slice_, "entity_type": entity_type_of(pid), "pid": pid,
                  "writer": writer or journal.writer_id, "tags": list(tags) if tags else None,
                  "expected": expected if expected is not None else 0,
                  "meta_ser_id": metadata.ser_id if metadata else None,
                  "meta_manifest": metadata.manifest if metadata else None,
                  "meta_payload": metadata.payload if metadata else None, "ser_id": encoded.ser_id,
                  "manifest": encoded.manifest, "payload": bytes(encoded.payload)}
        sql = journal.events.append(slice_, single=True, after="latest" if expected is None else "expected")
        rows = yield statement((sql, params))
        if not rows:
            raise InvalidArgument(f"cannot append to {pid!r} after seq_nr {expected}: that event does not exist")
        out.append((rows[0][0], rows[0][1]))
        if expected is not None:
            expected = rows[0][0]
    return out


def append_many_with_metadata_step(journal: JournalCore,
                                   appends: Mapping[str, tuple[int, Sequence[tuple[Stored, Stored]]]], *,
                                   writer: str | None = None) -> Step[dict[str, list[int]]]:
    """Append to each persistence id of ``appends`` its events after its ``expected`` (``pid: (expected, [(event,
    its metadata), ...])``, both as stored), in one statement per table, inside the open transaction of the
    connection the step runs on; each persistence id's sequence numbers, in order (a conflict raises the
    database's ``UniqueViolation``, as :func:`append_events_step`; an ``expected`` that does not exist raises
    :class:`InvalidArgument`). No tags; a journal whose ``meta_payload`` is JSONB takes them one by one with
    :func:`append_events_step`."""
    by_table: dict[str, list[tuple[str, int]]] = {}
    for pid in appends:
        slice_ = slice_for_persistence_id(check_persistence_id(pid))
        by_table.setdefault(journal.events.batch_table(slice_), []).append((pid, slice_))
    numbers: dict[str, list[int]] = {pid: [] for pid in appends}
    for of_table in by_table.values():
        rows = [(n, ord_, event, meta) for n, (pid, _) in enumerate(of_table, 1)
                  for ord_, (event, meta) in enumerate(appends[pid][1], 1)]
        # Packed as the journal's own batch append packs them (pgjournal.store.binary_arrays): psycopg's list
        # dumpers adapt element by element, and a bytea[] in text form is hex-escaped both ways.
        params: dict[str, Any] = {
            "writer": writer or journal.writer_id, "slices": [s for _, s in of_table],
            "entity_types": [entity_type_of(pid) for pid, _ in of_table], "pids": [pid for pid, _ in of_table],
            "expecteds": [appends[pid][0] for pid, _ in of_table],
            "of": int_array([n for n, _, _, _ in rows]), "ords": int_array([o for _, o, _, _ in rows]),
            "ser_ids": int_array([e.ser_id for _, _, e, _ in rows]),
            "manifests": text_array([e.manifest for _, _, e, _ in rows]),
            "payloads": bytea_array([bytes(e.payload) for _, _, e, _ in rows]),
            "meta_ser_ids": int_array([m.ser_id for _, _, _, m in rows]),
            "meta_manifests": text_array([m.manifest for _, _, _, m in rows]),
            "meta_payloads": bytea_array([m.payload for _, _, _, m in rows])}
        for pid, seq_nr in (yield statement((journal.events.append_many_with_metadata(of_table[0][1]), params))):
            numbers[pid].append(seq_nr)
    missing = [pid for pid, (_, events) in appends.items() if events and not numbers[pid]]
    if missing:
        raise InvalidArgument(f"cannot append to {missing[0]!r} after seq_nr {appends[missing[0]][0]}: that event "
                              "does not exist")
    return {pid: sorted(found) for pid, found in numbers.items()}


def append_events(conn: psycopg.Connection, journal: JournalCore, persistence_id: str, events: Sequence[Any], *,
                  expected: int | None = None, metadata: Stored | None = None, tags: Sequence[str] | None = None,
                  writer: str | None = None) -> list[tuple[int, Any]]:
    """:func:`append_events_step` on a blocking connection (``await arun(append_events_step(...), conn)`` on an
    asyncio one)."""
    return run(append_events_step(journal, persistence_id, events, expected=expected, metadata=metadata, tags=tags,
                                  writer=writer), conn)


#: ``process(conn, envelopes)``: a plain function on the blocking face; on the asyncio face a coroutine function
#: (of an ``AsyncConnection``) or a plain one.
ProcessFn = Callable[[Any, "Sequence[EventEnvelope]"], Any]


class ProcessorRunner(RangeRunner):
    """A range runner whose events come from another journal; after each commit the target's readers are
    signalled for the entity types the batch wrote (:attr:`written`, filled by the process function)."""

    def __init__(self, processor: EventProcessor, min_slice: int, max_slice: int, *,
                 guard: LeaseManager | None = None) -> None:
        self.processor = processor
        super().__init__(processor.target, processor.projection, min_slice, max_slice, guard=guard,
                         source=processor.source,
                         serializers=as_stored(processor.source) if processor.stored else None)

    def _handled(self, envelopes: Sequence[EventEnvelope]) -> None:
        super()._handled(envelopes)
        self.processor.signal()


class AsyncProcessorRunner(AsyncRangeRunner):
    """:class:`ProcessorRunner` on the asyncio face (a task; ``process`` may be a coroutine function)."""

    def __init__(self, processor: EventProcessor, min_slice: int, max_slice: int) -> None:
        self.processor = processor
        super().__init__(processor.target, processor.projection, min_slice, max_slice, source=processor.source,
                         serializers=as_stored(processor.source) if processor.stored else None)

    def _handled(self, envelopes: Sequence[EventEnvelope]) -> None:
        super()._handled(envelopes)
        self.processor.signal()


class EventProcessor:
    """Read ``entity_type`` by slices from ``source``, hand each batch to ``process(conn, envelopes)`` in a
    transaction on ``target`` that also stores the offsets (under the projection name ``name``, in ``target``).

    ``source`` may be ``target`` itself (events turned into other events of the same journal) or a journal of
    another database, opened with a role that may only read there. Run it over a slice range
    (:meth:`run_range`) or as a worker sharing the slices with the processor's other workers by lease
    (:meth:`worker`)."""

    def __init__(self, target: Journal | AsyncJournal, source: Journal | AsyncJournal, name: str, entity_type: str,
                 process: ProcessFn, *,
                 as_stored: bool = False, max_count: int = 500, max_wait: float = 0.1,
                 idle_wait: float | None = None, settings: ProjectionSettings | None = None) -> None:
        if settings is not None and settings.on_failure == "dead-letter" and source is not target:
            raise InvalidArgument("on_failure='dead-letter' copies the event from the target journal; a processor "
                                  "reading another database stops or skips")
        #: The journals (both of one face: :class:`~pgjournal.Journal`, or :class:`~pgjournal.aio.AsyncJournal`).
        self.target: Any = target
        self.source: Any = source
        self.name = check_name(name, "processor name")
        self.entity_type = check_name(entity_type, "entity type")
        self.stored = as_stored
        self.projection = Projection(self.name, self.entity_type,
                                     Grouped(process, max_count=max_count, max_wait=max_wait, idle_wait=idle_wait),
                                     settings=settings or ProjectionSettings())
        #: Entity types written since the last commit, signalled to the target's readers after it.
        self.written: set[str] = set()
        self._lock = threading.Lock()

    def wrote(self, entity_type: str) -> None:
        """Called by a process function for each entity type it appends to (signalled after the commit)."""
        with self._lock:
            self.written.add(entity_type)

    def signal(self) -> None:
        with self._lock:
            written, self.written = self.written, set()
        signals = self.target.signals
        if signals is not None:
            for entity_type in written:
                signals.written(0, entity_type)

    def runner(self, min_slice: int, max_slice: int, *, guard: LeaseManager | None = None) -> ProcessorRunner:
        return ProcessorRunner(self, min_slice, max_slice, guard=guard)

    def run_range(self, min_slice: int = 0, max_slice: int = 1023) -> ProcessorRunner:
        """Start a runner over one slice range on a daemon thread (no leases); ``stop()`` and ``join()`` it."""
        runner = self.runner(min_slice, max_slice)
        runner.start()
        return runner

    def arun_range(self, min_slice: int = 0, max_slice: int = 1023) -> AsyncProcessorRunner:
        """The asyncio face (``target`` and ``source`` are :class:`~pgjournal.aio.AsyncJournal`\\ s): a runner over
        one slice range started as a task of the running loop; ``stop()`` and ``await join()`` it."""
        runner = AsyncProcessorRunner(self, min_slice, max_slice)
        runner.start()
        return runner

    def worker(self, *, owner: str | None = None, lease_duration: float = 10.0,
               renew_interval: float | None = None) -> Worker:
        """A :class:`~projections.workers.Worker` (``run(stop)`` blocks) holding leases on a share of the slices
        in the target database, with one runner per contiguous run of them."""
        return Worker(self.target, self.projection, owner=owner, lease_duration=lease_duration,
                      renew_interval=renew_interval,
                      runner=lambda _journal, _projection, lo, hi, guard: self.runner(lo, hi, guard=guard))
