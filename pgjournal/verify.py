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
* ``projection offsets``: no stored projection offset names a sequence number the journal does not have.

Every query is read-only and needs only SELECT: the reader role can run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .slices import entity_type_of, slice_for_persistence_id

if TYPE_CHECKING:
    import psycopg

    from .journal import Journal


@dataclass
class CheckResult:
    name: str
    description: str
    problems: int = 0
    examples: list[str] = field(default_factory=list)
    skipped: str | None = None

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


SEQ_AND_TIME = """
SELECT persistence_id, seq_nr, prev_seq, db_timestamp, prev_ts, deleted FROM (
    SELECT persistence_id, seq_nr, db_timestamp, deleted,
           lag(seq_nr) OVER w AS prev_seq, lag(db_timestamp) OVER w AS prev_ts
    FROM event_journal WINDOW w AS (PARTITION BY persistence_id ORDER BY seq_nr)) AS s
WHERE (prev_seq IS NULL AND seq_nr > 1 AND NOT deleted) OR seq_nr > prev_seq + 1 OR db_timestamp < prev_ts
ORDER BY persistence_id, seq_nr"""
IDENTITY = "SELECT DISTINCT persistence_id, slice, entity_type FROM event_journal"
COUNTS = "SELECT count(*), count(DISTINCT persistence_id) FROM event_journal"
TAGS_MISSING = """
SELECT e.persistence_id, e.seq_nr, t.tag FROM event_journal AS e CROSS JOIN LATERAL unnest(e.tags) AS t(tag)
WHERE NOT e.deleted AND NOT EXISTS (
    SELECT 1 FROM tag_views AS v
    WHERE v.tag_name = t.tag AND v.persistence_id = e.persistence_id AND v.sequence_nr = e.seq_nr)
ORDER BY 1, 2, 3"""
# A row whose event is gone is fine when the persistence id was cleaned up (a deleted marker above it).
TAGS_ORPHANED = """
SELECT v.tag_name, v.persistence_id, v.sequence_nr, e.seq_nr IS NOT NULL FROM tag_views AS v
LEFT JOIN event_journal AS e ON e.persistence_id = v.persistence_id AND e.seq_nr = v.sequence_nr
WHERE CASE WHEN e.seq_nr IS NOT NULL THEN NOT (v.tag_name = ANY(COALESCE(e.tags, '{}')))
      ELSE NOT EXISTS (SELECT 1 FROM event_journal AS m
                       WHERE m.persistence_id = v.persistence_id AND m.deleted AND m.seq_nr > v.sequence_nr) END
ORDER BY 1, 2, 3"""
TAG_SEQ_GAPS = """
SELECT tag_name, persistence_id, prev, tag_pid_sequence_nr FROM (
    SELECT tag_name, persistence_id, tag_pid_sequence_nr,
           lag(tag_pid_sequence_nr) OVER (PARTITION BY tag_name, persistence_id ORDER BY tag_pid_sequence_nr) AS prev
    FROM tag_views) AS s
WHERE tag_pid_sequence_nr <> prev + 1
ORDER BY 1, 2, 4"""
TAG_PROGRESS = """
SELECT v.tag_name, v.persistence_id, max(v.tag_pid_sequence_nr), p.tag_pid_sequence_nr
FROM tag_views AS v
LEFT JOIN tag_write_progress AS p ON p.persistence_id = v.persistence_id AND p.tag = v.tag_name
GROUP BY v.tag_name, v.persistence_id, p.tag_pid_sequence_nr
HAVING p.tag_pid_sequence_nr IS NULL OR p.tag_pid_sequence_nr < max(v.tag_pid_sequence_nr)
ORDER BY 1, 2"""
OFFSETS_AHEAD = """
SELECT o.projection_name, o.projection_key, o.slice, o.persistence_id, o.seq_nr, h.highest
FROM projection_timestamp_offset_store AS o
LEFT JOIN LATERAL (SELECT max(e.seq_nr) AS highest FROM event_journal AS e
                   WHERE e.persistence_id = o.persistence_id) AS h ON true
WHERE o.persistence_id <> '' AND (h.highest IS NULL OR o.seq_nr > h.highest)
  -- a Spark load job's ledger (spark/watermarks.py): one row per load (load id, load number), not an offset
  AND NOT (o.projection_name LIKE 'spark-load:%' AND o.projection_name LIKE '%:loads')
ORDER BY 1, 2, 4, 5"""

Check = Callable[["psycopg.Connection", CheckResult, int], None]


def _rows(conn: psycopg.Connection, sql: str) -> Iterable[tuple[Any, ...]]:
    """Stream the rows (a server-side cursor in a transaction): a broken journal may have many."""
    with conn.transaction(), conn.cursor(name="pgjournal_verify") as cur:
        cur.itersize = 2000
        cur.execute(sql)
        yield from cur


def _table_exists(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def check_seq_and_time(conn: psycopg.Connection, gaps: CheckResult, order: CheckResult, limit: int) -> None:
    for pid, seq_nr, prev_seq, ts, prev_ts, _deleted in _rows(conn, SEQ_AND_TIME):
        if prev_seq is None:
            gaps.add(f"{pid!r}: starts at {seq_nr}, missing 1..{seq_nr - 1}", limit)
            continue
        if seq_nr > prev_seq + 1:
            missing = f"{prev_seq + 1}" if seq_nr == prev_seq + 2 else f"{prev_seq + 1}..{seq_nr - 1}"
            gaps.add(f"{pid!r}: missing {missing} (between {prev_seq} and {seq_nr})", limit)
        if prev_ts is not None and ts < prev_ts:
            order.add(f"{pid!r}: seq_nr {seq_nr} at {ts.isoformat()} before seq_nr {prev_seq} at "
                      f"{prev_ts.isoformat()}", limit)


def check_identity(conn: psycopg.Connection, result: CheckResult, limit: int) -> None:
    for pid, slice_, entity_type in _rows(conn, IDENTITY):
        want_slice, want_type = slice_for_persistence_id(pid), entity_type_of(pid)
        if slice_ != want_slice:
            result.add(f"{pid!r}: slice {slice_}, expected {want_slice}", limit)
        if entity_type != want_type:
            result.add(f"{pid!r}: entity type {entity_type!r}, expected {want_type!r}", limit)


def verify(journal: Journal, *, examples: int = 10) -> Report:
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
        row = conn.execute(COUNTS).fetchone()
        report.events, report.persistence_ids = (int(row[0]), int(row[1])) if row else (0, 0)
        check_seq_and_time(conn, gaps, order, examples)
        check_identity(conn, identity, examples)
        if _table_exists(conn, "tag_views") and _table_exists(conn, "tag_write_progress"):
            for pid, seq_nr, tag in _rows(conn, TAGS_MISSING):
                tags_missing.add(f"{pid!r} seq_nr {seq_nr}: no row for tag {tag!r}", examples)
            for tag, pid, seq_nr, stored in _rows(conn, TAGS_ORPHANED):
                where = "is stored without this tag" if stored else "is not in the journal"
                tags_orphaned.add(f"tag {tag!r}: {pid!r} seq_nr {seq_nr} {where}", examples)
            for tag, pid, prev, tag_seq in _rows(conn, TAG_SEQ_GAPS):
                tag_gaps.add(f"tag {tag!r}, {pid!r}: tag_pid_sequence_nr {tag_seq} follows {prev}", examples)
            for tag, pid, highest, stored in _rows(conn, TAG_PROGRESS):
                progress.add(f"tag {tag!r}, {pid!r}: progress at {stored} but tag_views reach {highest}", examples)
        else:
            for check in (tags_missing, tags_orphaned, tag_gaps, progress):
                check.skipped = "no tag tables"
        if _table_exists(conn, "projection_timestamp_offset_store"):
            for name, key, slice_, pid, seq_nr, highest in _rows(conn, OFFSETS_AHEAD):
                where = "not in the journal" if highest is None else f"the journal's highest is {highest}"
                offsets.add(f"{name!r} ({key}) slice {slice_}: {pid!r} seq_nr {seq_nr}, {where}", examples)
        else:
            offsets.skipped = "no projection offset store"
    return report


def render(report: Report) -> Any:
    """The report as a Rich table (one row per check)."""
    from rich.table import Table

    table = Table("check", "result", "examples", title=f"pgjournal verify: {report.events:,} events, "
                  f"{report.persistence_ids:,} persistence ids", show_lines=True)
    for check in report.checks:
        if check.skipped:
            result = f"[dim]skipped ({check.skipped})[/]"
        elif check.problems:
            result = f"[bold red]{check.problems:,} problem{'s' if check.problems > 1 else ''}[/]"
        else:
            result = "[green]ok[/]"
        more = check.problems - len(check.examples)
        shown = "\n".join(check.examples) + (f"\n... and {more:,} more" if more > 0 else "")
        table.add_row(f"{check.name}\n[dim]{check.description}[/]", result, shown)
    return table
