"""Tools for the tag view (the Cassandra plugin's Reconciliation) and per-persistence-id Cleanup.

Reconciliation: the tags of a persistence id, delete its tag view for a tag, rebuild its tag view from the
journal (``event_journal.tags``), all tags, truncate the tag view. Run a rebuild while the persistence id is
not being written (as with Cassandra): appends compute their tag sequence numbers from
``tag_write_progress``, which the rebuild replaces.

Cleanup deletes a persistence id's events, tagged events and snapshots; every method is a dry run (counts
only) unless the :class:`Cleanup` was made with ``dry_run=False``.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from pgjournal.errors import TagFlushFailed
from pgjournal.model.timeuuid import lsb_key, make_uuid, ms_of_ticks
from pgjournal.store import tags as sql
from pgjournal.store.tags import TagCount as TagCount  # the row shape, part of this module's API
from pgjournal.tags.statement_writer import bucket_size
from pgjournal.validation import check_name, check_persistence_id, check_tags

if TYPE_CHECKING:
    from pgjournal.server.face import Connected
    from pgjournal.store import Query

_UNIX_EPOCH_TICKS = 0x01B21DD213814000
#: How often a cleanup waiting for other processes' batched tag writers reads their watermark again.
SETTLE_INTERVAL = 0.05


def _random_lsb_bytes() -> int:
    """Low bytes for rebuilt TimeUUIDs: RFC 4122 variant, random clock sequence and multicast node."""
    return (0x80 << 56) | (secrets.randbits(62) & 0x3FFFFFFFFFFFFFFF) | (1 << 40)


def wait_for_tag_writers(journal: Connected) -> None:
    """Before a cleanup or :meth:`Reconciliation.delete_tag_view` deletes tag rows: wait, at most
    ``tag_writer_timeout``, until the batched tag writers of every process have written the tag rows of every
    event appended before now (their watermark past this moment; this journal's own writer is flushed), since a
    row a writer still holds, written after the delete, would outlive the delete. Raises
    :class:`TagFlushFailed`, before anything is deleted, when they have not."""
    own = None
    if journal.tag_writer is not None:  # written now: only the others are waited for
        journal.tag_writer.flush()
        own = journal.tag_writer.batch.key
    timeout = journal.settings.tag_writer_timeout
    deadline = time.monotonic() + timeout
    with journal.connection() as conn:
        now = sql.clock().one(conn)
        assert now is not None
        while not sql.writers_past(now, own).one(conn):
            if time.monotonic() >= deadline:
                raise TagFlushFailed(
                    f"the batched tag writers of other processes have not written the tag rows of the events "
                    f"appended before this delete after {timeout:g} s (tag_writer_timeout); nothing was deleted: run "
                    "it again, or `pgjournal tags recover` if a writer died")
            time.sleep(SETTLE_INTERVAL)  # other processes' writers: nothing to be notified by


class Reconciliation:
    def __init__(self, journal: Connected) -> None:
        self._journal = journal

    def tags_of(self, persistence_id: str) -> list[str]:
        """Tags the persistence id's events carry in the journal, sorted."""
        pid = check_persistence_id(persistence_id)
        with self._journal.connection() as conn:
            rows = conn.execute(*self._journal.events.tags_of(pid)).fetchall()
        return sorted(r[0] for r in rows)

    def delete_tag_view(self, persistence_id: str, tag: str) -> int:
        """Delete the persistence id's rows in the tag view of ``tag`` and its progress; returns rows deleted.
        First waits for the batched tag writers (:func:`wait_for_tag_writers`): a row one still held would be
        written after the delete."""
        pid = check_persistence_id(persistence_id)
        check_name(tag, "tag")
        wait_for_tag_writers(self._journal)
        with self._journal.connection() as conn, conn.transaction():
            return self._delete(conn, pid, [tag])

    @staticmethod
    def _delete(conn: psycopg.Connection, pid: str, tags: list[str]) -> int:
        views, progress = sql.delete_view_of(pid, tags)
        deleted = conn.execute(*views).rowcount
        conn.execute(*progress)
        return deleted

    def rebuild(self, persistence_id: str, tags: list[str] | None = None) -> int:
        """Rebuild the persistence id's tag view (for ``tags``, default: every tag its events carry) from the
        journal, in one transaction: its rows for those tags are replaced, tag sequence numbers count from 1
        in event order (logically deleted events included, as they were written), TimeUUIDs are made from
        ``db_timestamp`` (strictly increasing per persistence id), and the progress is set. Idempotent. A row
        another process's batched writer still holds is the same row (same tag numbers), written after the
        rebuild or not at all: no wait is needed here."""
        pid = check_persistence_id(persistence_id)
        wanted = list(check_tags(tags)) if tags is not None else self.tags_of(pid)
        if not wanted:
            return 0
        size = bucket_size(self._journal)
        writer = self._journal.writer_id
        with self._journal.connection() as conn, conn.transaction():
            self._delete(conn, pid, wanted)
            events = conn.execute(*self._journal.events.tagged(pid, wanted)).fetchall()
            lsb_bytes = _random_lsb_bytes()
            lsb = lsb_key(lsb_bytes)
            counters = dict.fromkeys(wanted, 0)
            last_ticks = 0
            rows = []
            progress: dict[str, tuple[int, int, object, int]] = {}
            for seq_nr, ts, event_tags, ser_id, manifest, payload, meta_id, meta_manifest, meta in events:
                micros = int(ts.timestamp()) * 1_000_000 + ts.microsecond
                ticks = max(micros * 10 + _UNIX_EPOCH_TICKS, last_ticks + 1)
                last_ticks = ticks
                stamp = make_uuid(ticks, lsb_bytes)
                bucket = size.bucket_of(ms_of_ticks(ticks))
                for tag in event_tags:
                    if tag not in counters:
                        continue
                    counters[tag] += 1
                    rows.append((tag, bucket, ticks, lsb, stamp, pid, counters[tag], seq_nr, writer, ser_id, manifest,
                                 payload, meta_id, meta_manifest, meta))
                    progress[tag] = (seq_nr, counters[tag], stamp, ticks)
            with conn.cursor() as cur:
                cur.executemany(sql.REBUILT_ROW, rows)
                cur.executemany(sql.REBUILT_PROGRESS, [(pid, tag, *p) for tag, p in progress.items()])
            if events:  # as in Cassandra: how far the journal of this pid was scanned for tags
                conn.execute(*sql.record_scanned(pid, events[-1][0]))
        return len(rows)

    def all_tags(self) -> list[TagCount]:
        """Every tag in the tag view with its event and persistence id counts."""
        with self._journal.connection() as conn:
            return sql.tag_counts().all(conn)

    def truncate(self) -> None:
        """Empty the whole tag view and its progress (the recorded bucket size stays)."""
        with self._journal.connection() as conn, conn.transaction():
            conn.execute(*sql.truncate_views())


@dataclass(frozen=True)
class CleanupResult:
    persistence_id: str
    what: str
    rows: int
    dry_run: bool

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return f"{self.persistence_id}: {verb} {self.rows} {self.what}"


class Cleanup:
    """Delete a persistence id's data. ``dry_run`` (the default) only counts what would go."""

    def __init__(self, journal: Connected, *, dry_run: bool = True) -> None:
        self._journal = journal
        self.dry_run = dry_run

    def _run(self, pid: str, what: str, count: Query, delete: Query) -> CleanupResult:
        if self._journal.tag_writer is not None:  # this journal's pending tag rows first: deleted with their events
            self._journal.tag_writer.flush()
        with self._journal.connection() as conn:
            if self.dry_run:
                row = conn.execute(*count).fetchone()
                rows = int(row[0]) if row else 0
            else:
                rows = conn.execute(*delete).rowcount
        return CleanupResult(pid, what, rows, self.dry_run)

    def delete_all_events(self, persistence_id: str, *, reset_sequence_number: bool = False) -> CleanupResult:
        """Physically delete the events. Unless ``reset_sequence_number``, the last one stays as a deleted
        marker so the persistence id continues after its highest sequence number."""
        pid = check_persistence_id(persistence_id)
        events, keep_last = self._journal.events, not reset_sequence_number
        result = self._run(pid, "events", events.count_or_delete(pid, keep_last=keep_last, count=True),
                           events.count_or_delete(pid, keep_last=keep_last, count=False))
        if keep_last and not self.dry_run:
            with self._journal.connection() as conn:
                conn.execute(*events.mark_all_deleted(pid))
        return result

    def delete_all_tagged_events(self, persistence_id: str) -> CleanupResult:
        """Delete the persistence id's rows from every tag view (its tag sequence numbers keep counting), once the
        batched tag writers have written them (:func:`wait_for_tag_writers`)."""
        pid = check_persistence_id(persistence_id)
        if not self.dry_run:
            wait_for_tag_writers(self._journal)
        return self._run(pid, "tagged events", sql.count_or_delete_tagged(pid, count=True),
                         sql.count_or_delete_tagged(pid, count=False))

    def delete_all_snapshots(self, persistence_id: str) -> CleanupResult:
        pid = check_persistence_id(persistence_id)
        snapshots = self._journal.snapshot_sql
        return self._run(pid, "snapshots", snapshots.count(pid), snapshots.delete(pid))

    def delete_all(self, persistence_id: str, *, reset_sequence_number: bool = False) -> list[CleanupResult]:
        """Tagged events, then events, then snapshots."""
        return [self.delete_all_tagged_events(persistence_id),
                self.delete_all_events(persistence_id, reset_sequence_number=reset_sequence_number),
                self.delete_all_snapshots(persistence_id)]
