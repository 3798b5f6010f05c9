"""``pgjournal verify``: read-only integrity checks of a journal, each reporting a count and examples.

Checks (a check whose tables do not exist is skipped, not failed):

* ``seq_nr gaps``: per persistence id, sequence numbers must be contiguous. Logically deleted events are
  rows like any other, so they are not gaps; rows physically removed by ``pgjournal cleanup events`` leave
  the highest one as a deleted marker, so a persistence id may start above 1 only at a deleted row.
* ``time order``: per persistence id, ``db_timestamp`` must not go down as ``seq_nr`` goes up (the write
  path guarantees it; the events of one batch share their timestamp; live queries rely on it).
* ``slice and entity type``: the stored ``slice`` and ``entity_type`` must be what the persistence id
  hashes and parses to, or slice queries miss the events.
* ``tagged events in tag_views`` / ``tag_views rows in the journal``: each tag of each live event has its
  row in ``tag_views`` and each row there belongs to a stored event carrying that tag (or to an event that
  ``pgjournal cleanup events`` removed: below the persistence id's deleted marker).
* ``tag_pid_sequence_nr gaps`` and ``tag_write_progress``: per (tag, pid) the tag sequence numbers are
  contiguous and the progress row is not behind them (events_by_tag would wait for the missing number
  and then fail with MissingEventsError).
  A tag row the batched tag writers have yet to write (its event is past their watermark, ``complete_before``)
  is not missing: it is counted as still being written, and ``verify`` can run beside live writers.
* ``projection offsets``: no stored projection offset names a sequence number the journal does not have.

Every query is read-only and needs only SELECT: the reader role can run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.store import integrity as sql
from pgjournal.store import stats
from pgjournal.store.catalog import table_exists
from pgjournal.store.timestamp_offsets import OFFSET_TABLE

if TYPE_CHECKING:
    import psycopg

    from pgjournal.server.face import Connected


@dataclass
class CheckResult:
    name: str
    description: str
    problems: int = 0
    examples: list[str] = field(default_factory=list)
    skipped: str | None = None
    #: Rows not checked yet: still to be written by a running writer (not a problem).
    pending: int = 0

    def add(self, example: str, limit: int) -> None:
        self.problems += 1
        if len(self.examples) < limit:
            self.examples.append(example)


@dataclass
class Report:
    checks: list[CheckResult]
    events: int = 0
    persistence_ids: int = 0

    @property
    def ok(self) -> bool:
        return all(check.problems == 0 for check in self.checks)

    @property
    def problems(self) -> int:
        return sum(check.problems for check in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)


#: Rows are streamed through a server-side cursor of this name: a broken journal may have many.
CURSOR = "pgjournal_verify"


def check_seq_and_time(conn: psycopg.Connection, gaps: CheckResult, order: CheckResult, limit: int) -> None:
    for row in sql.seq_and_time().stream(conn, CURSOR):
        pid, seq_nr, prev_seq = row.persistence_id, row.seq_nr, row.prev_seq_nr
        if prev_seq is None:
            gaps.add(f"{pid!r}: starts at {seq_nr}, missing 1..{seq_nr - 1}", limit)
            continue
        if seq_nr > prev_seq + 1:
            missing = f"{prev_seq + 1}" if seq_nr == prev_seq + 2 else f"{prev_seq + 1}..{seq_nr - 1}"
            gaps.add(f"{pid!r}: missing {missing} (between {prev_seq} and {seq_nr})", limit)
        if row.prev_timestamp is not None and row.db_timestamp < row.prev_timestamp:
            order.add(f"{pid!r}: seq_nr {seq_nr} at {row.db_timestamp.isoformat()} before seq_nr {prev_seq} at "
                      f"{row.prev_timestamp.isoformat()}", limit)


def check_identity(conn: psycopg.Connection, result: CheckResult, limit: int) -> None:
    for row in sql.identities().stream(conn, CURSOR):
        pid = row.persistence_id
        want_slice, want_type = slice_for_persistence_id(pid), entity_type_of(pid)
        if row.slice != want_slice:
            result.add(f"{pid!r}: slice {row.slice}, expected {want_slice}", limit)
        if row.entity_type != want_type:
            result.add(f"{pid!r}: entity type {row.entity_type!r}, expected {want_type!r}", limit)


def verify(journal: Connected, *, examples: int = 10) -> Report:
    """Run every check on ``journal``'s database (read-only) and return what each found."""
    gaps = CheckResult("seq_nr gaps", "per persistence id, sequence numbers are contiguous")
    order = CheckResult("time order", "per persistence id, db_timestamp never goes down as seq_nr goes up")
    identity = CheckResult("slice and entity type", "stored slice and entity type match the persistence id")
    tags_missing = CheckResult("tagged events in tag_views", "every tag of every live event has its tag_views row")
    tags_orphaned = CheckResult("tag_views rows in the journal", "every tag_views row is a stored event with the tag")
    tag_gaps = CheckResult("tag_pid_sequence_nr gaps", "per (tag, pid), tag sequence numbers are contiguous")
    progress = CheckResult("tag_write_progress", "per (tag, pid), progress is not behind tag_views")
    offsets = CheckResult("projection offsets", "no projection offset is ahead of the journal")
    report = Report([gaps, order, identity, tags_missing, tags_orphaned, tag_gaps, progress, offsets])
    with journal.connection() as conn:
        counts = stats.totals().one(conn)
        report.events, report.persistence_ids = (counts.events, counts.persistence_ids) if counts else (0, 0)
        check_seq_and_time(conn, gaps, order, examples)
        check_identity(conn, identity, examples)
        if all(table_exists(table).one(conn) for table in sql.TAG_TABLES):
            for m in sql.tags_missing().stream(conn, CURSOR):
                if m.pending:
                    tags_missing.pending += 1
                    continue
                tags_missing.add(f"{m.persistence_id!r} seq_nr {m.seq_nr}: no row for tag {m.tag!r}", examples)
            for o in sql.tags_orphaned().stream(conn, CURSOR):
                where = "is stored without this tag" if o.stored else "is not in the journal"
                tags_orphaned.add(f"tag {o.tag!r}: {o.persistence_id!r} seq_nr {o.seq_nr} {where}", examples)
            for g in sql.tag_seq_gaps().stream(conn, CURSOR):
                tag_gaps.add(f"tag {g.tag!r}, {g.persistence_id!r}: tag_pid_sequence_nr {g.tag_pid_sequence_nr} "
                             f"follows {g.prev}", examples)
            for p in sql.tag_progress().stream(conn, CURSOR):
                progress.add(f"tag {p.tag!r}, {p.persistence_id!r}: progress at {p.progress} but tag_views reach "
                             f"{p.highest}", examples)
        else:
            for check in (tags_missing, tags_orphaned, tag_gaps, progress):
                check.skipped = "no tag tables"
        if table_exists(OFFSET_TABLE).one(conn):
            for a in sql.offsets_ahead().stream(conn, CURSOR):
                where = "not in the journal" if a.highest is None else f"the journal's highest is {a.highest}"
                offsets.add(f"{a.projection_name!r} ({a.projection_key}) slice {a.slice}: {a.persistence_id!r} "
                            f"seq_nr {a.seq_nr}, {where}", examples)
        else:
            offsets.skipped = "no projection offset store"
    return report


def render(report: Report) -> Any:
    """The report as a Rich table (one row per check)."""
    from rich.markup import escape
    from rich.table import Table

    from pgjournal.model.printable import printable

    table = Table("check", "result", "examples", title=f"pgjournal verify: {report.events:,} events, "
                  f"{report.persistence_ids:,} persistence ids", show_lines=True)
    for check in report.checks:
        if check.skipped:
            result = f"[dim]skipped ({check.skipped})[/]"
        elif check.problems:
            result = f"[bold red]{check.problems:,} problem{'s' if check.problems > 1 else ''}[/]"
        else:
            result = "[green]ok[/]"
        if check.pending:
            result += f"\n[dim]{check.pending:,} still being written[/]"
        more = check.problems - len(check.examples)
        shown = "\n".join(escape(printable(example)) for example in check.examples)
        shown += f"\n... and {more:,} more" if more > 0 else ""
        table.add_row(f"{check.name}\n[dim]{check.description}[/]", result, shown)
    return table
