"""Bulk cleanup: delete events (and their tag view rows, and snapshots) for many persistence ids, in bounded
batches, resumably, with dry-run counts. Akka's ``EventSourcedCleanup`` over whole entity types.

Operations (each returns a :class:`CleanupReport`; a dry run, the default, counts and changes nothing):

* :meth:`JournalCleanup.events_before_snapshot`: events up to each persistence id's snapshot (the event at
  the snapshot's sequence number included, as Akka does); the snapshot stays.
* :meth:`JournalCleanup.events_before`: events written before a timestamp (retention). Snapshots stay; an
  entity whose snapshot is older than what is deleted can no longer be recovered to its full state.
* :meth:`JournalCleanup.all_events`: every event of an entity type (and its snapshots, unless kept).
* :meth:`JournalCleanup.tombstoned`: persistence ids whose events are all logically deleted, what
  ``journal.delete_events(pid, highest)`` or Akka's ``deleteAll`` leaves behind: their rows physically, and
  their snapshots.

Rules common to all: a persistence id's highest event is never removed unless ``reset_sequence_number``; it
stays as a logically deleted marker, so the persistence id continues after its highest sequence number (Akka's
behaviour). The tag view rows (``tag_views``) of every deleted or marked event go with it; ``tag_write_progress``
and ``tag_scanning`` rows go only with a reset (the persistence id starts again at 1). Each batch is one
statement over at most ``batch_size`` persistence ids and ``batch_size`` events, so one transaction stays
small; every batch does what a rerun would decide too, so a run stopped anywhere (a crash, Ctrl-C) continues
when run again and never leaves a half-deleted batch.

A hold (``hold=``, what the replication's deferred cleanup gives) caps per persistence id the highest sequence
number that may go: the events above it stay, the report lists them (:class:`HeldBack`), and a later run, once the
hold lets go, removes them.

Projections: after (or, in a dry run, instead of) deleting, the offset stores are checked. A projection whose
latest stored offset for a slice is older than the newest event deleted (or marked) there had not processed
everything that is gone: the report lists it (:class:`OffsetWarning`) and the CLI prints it in red.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.printable import printable_logger
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.server.face import Connected
from pgjournal.store import cleanup as sql
from pgjournal.tags.reconciliation import wait_for_tag_writers
from pgjournal.validation import check_name, check_persistence_id

if TYPE_CHECKING:
    from pgjournal.admin.stored_format import StoredFormat


class Cleaned(Connected, Protocol):
    """What a bulk cleanup uses of a blocking journal (:class:`~pgjournal.Journal` meets it): a connection of its
    pool, its batched tag writer, and the stored format (Akka's data partitions refuse a bulk cleanup)."""

    @property
    def stored(self) -> StoredFormat: ...

_log = printable_logger(__name__)


@dataclass
class CleanupCounts:
    """What a cleanup did (or, in a dry run, would do)."""

    persistence_ids: int = 0
    events_deleted: int = 0
    #: Highest events kept as logically deleted markers (the persistence id continues after them).
    events_marked: int = 0
    tag_view_rows: int = 0
    #: ``tag_write_progress`` rows (with a sequence number reset).
    tag_progress_rows: int = 0
    snapshots: int = 0
    batches: int = 0


@dataclass(frozen=True)
class OffsetWarning:
    """A projection that had not processed everything a cleanup removed, in ``slices`` slices."""

    projection: str
    table: str
    slices: int
    #: The oldest of its latest offsets among those slices, and the newest event deleted there.
    oldest_offset: datetime
    deleted_until: datetime

    def __str__(self) -> str:
        return (f"projection {self.projection!r} ({self.table}) is behind in {self.slices} slice(s): its offset "
                f"{self.oldest_offset.isoformat()} is older than events deleted up to {self.deleted_until.isoformat()}")


@dataclass(frozen=True)
class HeldBack:
    """Events of ``persistence_id`` the operation selected but kept: a hold lets go only up to ``released``
    (0: none of them), because of ``holder`` (who still needs the rest)."""

    persistence_id: str
    released: int
    events: int
    holder: str

    def __str__(self) -> str:
        return (f"{self.events} event(s) of {self.persistence_id!r} after seq_nr {self.released} kept: "
                f"{self.holder}")


@dataclass
class CleanupReport:
    operation: str
    dry_run: bool
    counts: CleanupCounts = field(default_factory=CleanupCounts)
    warnings: list[OffsetWarning] = field(default_factory=list)
    #: What a hold kept (the events stay; a later run removes them once the hold lets go).
    held_back: list[HeldBack] = field(default_factory=list)


Progress = Callable[[CleanupCounts], None]
#: A hold: for a page of persistence ids (sorted), those it caps, each with the highest sequence number that may go
#: and who holds the rest (a sentence, for the report).
Hold = Callable[[list[str]], Mapping[str, tuple[int, str]]]


class JournalCleanup:
    """Bulk cleanup over one journal. ``dry_run`` (the default) only counts; ``batch_size`` bounds the
    persistence ids and the events of one transaction; ``progress`` is called after every batch; ``hold``
    caps what may go per persistence id (:data:`Hold`)."""

    def __init__(self, journal: Cleaned, *, dry_run: bool = True, batch_size: int = 1000,
                 progress: Progress | None = None, hold: Hold | None = None) -> None:
        if not isinstance(dry_run, bool):
            raise InvalidArgument(f"dry_run must be True or False, got {dry_run!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
            raise InvalidArgument(f"batch_size must be an integer from 1 to 100,000, got {batch_size!r}")
        if journal.stored.akka_layout and journal.stored.data_partitions > 1:
            raise ConfigurationError("bulk cleanup does not run on Akka's data partitions (event_journal is a view "
                                     "there); use the per persistence id cleanup (`pgjournal cleanup events PID`)")
        self.journal = journal
        self.dry_run = dry_run
        self.batch_size = batch_size
        self.progress = progress
        self.hold = hold

    # -- operations ------------------------------------------------------------------------------------

    def events_before_snapshot(self, entity_type: str | None = None, persistence_ids: Iterable[str] | None = None
                               ) -> CleanupReport:
        """Delete each persistence id's events up to its snapshot's sequence number (the snapshot stays)."""
        pages = self._pages("snapshots", entity_type, persistence_ids)
        return self._run("events before snapshot", pages, by_snapshot=True)

    def events_before(self, timestamp: datetime, entity_type: str | None = None,
                      persistence_ids: Iterable[str] | None = None) -> CleanupReport:
        """Delete the events written before ``timestamp`` (timezone-aware); snapshots stay."""
        if not isinstance(timestamp, datetime) or timestamp.tzinfo is None:
            raise InvalidArgument(f"timestamp must be a timezone-aware datetime, got {timestamp!r}")
        pages = self._pages("events", entity_type, persistence_ids)
        return self._run(f"events before {timestamp.isoformat()}", pages, before=timestamp)

    def all_events(self, entity_type: str, *, reset_sequence_number: bool = False, snapshots: bool = True
                   ) -> CleanupReport:
        """Delete every event of ``entity_type`` (and its snapshots, unless ``snapshots=False``)."""
        if entity_type is None:
            raise InvalidArgument("all_events needs an entity type (it deletes every event of it)")
        pages = self._pages("events", entity_type, None)
        return self._run(f"all events of {entity_type!r}", pages, reset=_flag(reset_sequence_number, "reset"),
                         snapshots=_flag(snapshots, "snapshots"))

    def tombstoned(self, entity_type: str | None = None, *, reset_sequence_number: bool = False,
                   snapshots: bool = True) -> CleanupReport:
        """Remove persistence ids whose events are all logically deleted: their rows (all but the marker,
        unless ``reset_sequence_number``), tag view rows and snapshots (unless ``snapshots=False``)."""
        pages = self._pages("tombstoned", entity_type, None)
        return self._run("tombstoned persistence ids", pages, reset=_flag(reset_sequence_number, "reset"),
                         snapshots=_flag(snapshots, "snapshots"))

    # -- the run ---------------------------------------------------------------------------------------

    def _pages(self, source: str, entity_type: str | None, persistence_ids: Iterable[str] | None
               ) -> Iterator[list[str]]:
        if entity_type is not None and entity_type != "":
            check_name(entity_type, "entity type")
        if persistence_ids is not None:
            if isinstance(persistence_ids, str):
                raise InvalidArgument("persistence_ids must be a list of persistence ids, got a single string")
            pids = sorted({check_persistence_id(p) for p in persistence_ids})
            return iter([pids[i:i + self.batch_size] for i in range(0, len(pids), self.batch_size)])
        return self._pid_pages(source, entity_type)

    def _pid_pages(self, source: str, entity_type: str | None) -> Iterator[list[str]]:
        after = ""
        while True:
            with self.journal.connection() as conn:
                page = [r[0] for r in conn.execute(*sql.pid_page(source, entity_type, after, self.batch_size))]
            if page:
                yield page
            if len(page) < self.batch_size:
                return
            after = page[-1]

    def _run(self, operation: str, pages: Iterator[list[str]], *, by_snapshot: bool = False,
             before: datetime | None = None, reset: bool = False, snapshots: bool = False) -> CleanupReport:
        report = CleanupReport(operation, self.dry_run)
        counts = report.counts
        if not self.dry_run:  # the pending tag rows first (of every process): deleted with their events
            wait_for_tag_writers(self.journal)
        touched: dict[tuple[str, int], datetime] = {}
        execute = not self.dry_run
        for pids in pages:
            counts.persistence_ids += len(pids)
            slices = [slice_for_persistence_id(p) for p in pids]
            caps: list[int] | None = None
            if self.hold is not None:
                limits = self.hold(pids)
                if limits:
                    caps = [limits[p][0] if p in limits else sql.MAX_SEQ_NR for p in pids]
                    with self.journal.connection() as conn:
                        kept = conn.execute(*sql.held(pids, slices, caps, by_snapshot=by_snapshot, before=before,
                                                      reset=reset)).fetchall()
                    report.held_back += [HeldBack(pid, limits[pid][0], int(n), limits[pid][1])
                                         for pid, n in kept if n]
            if snapshots:  # first: a rerun after a crash still finds these persistence ids by their events
                with self.journal.connection() as conn:
                    cur = conn.execute(*sql.snapshots(pids, None, execute=execute))
                    counts.snapshots += cur.rowcount if execute else int(cur.fetchone()[0])  # type: ignore[index]
            after = ("", 0)
            while True:
                with self.journal.connection() as conn:
                    row = conn.execute(*sql.batch(pids, slices, by_snapshot=by_snapshot, before=before, reset=reset,
                                                  after=after, limit=self.batch_size, execute=execute,
                                                  caps=caps)).fetchone()
                assert row is not None
                deleted, marked, tag_rows, progress, selected, _pids, last_pid, last_seq, types, slc, untils = row
                counts.events_deleted += deleted
                counts.events_marked += marked
                counts.tag_view_rows += tag_rows
                counts.tag_progress_rows += progress
                counts.batches += 1
                for key in zip(types or (), slc or (), untils or (), strict=True):
                    if key[:2] not in touched or touched[key[:2]] < key[2]:
                        touched[key[:2]] = key[2]
                if self.progress is not None:
                    self.progress(counts)
                if selected < self.batch_size:
                    break
                after = (last_pid, last_seq)
        report.warnings = self.offsets_behind(touched)
        for warning in report.warnings:
            _log.warning("cleanup (%s): %s", operation, warning)
        if report.held_back:
            _log.warning("cleanup (%s): %d event(s) of %d persistence id(s) held back, the first: %s", operation,
                         sum(h.events for h in report.held_back), len(report.held_back), report.held_back[0])
        return report

    def offsets_behind(self, touched: dict[tuple[str, int], datetime]) -> list[OffsetWarning]:
        """Projections whose latest offset in a slice is older than the newest event deleted there
        (``touched``: (entity type, slice) -> newest deleted event time)."""
        if not touched:
            return []
        found: list[OffsetWarning] = []
        with self.journal.connection() as conn:
            for table in sql.OFFSET_TABLES:
                exists = conn.execute(*sql.table_exists(table)).fetchone()
                if not (exists and exists[0]):
                    continue
                for name, slices, oldest, until in conn.execute(*sql.offsets_behind(table, touched)).fetchall():
                    found.append(OffsetWarning(name, table, int(slices), oldest, until))
        return found


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return value
