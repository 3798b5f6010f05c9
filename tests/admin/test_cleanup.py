"""Bulk cleanup: before the snapshot, before a time, a whole entity type, tombstoned persistence ids; tag view
rows follow; dry runs count exactly what a run does; a run stopped between batches continues when rerun; the
projections left behind are named."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support.tags import tags_written
from typer.testing import CliRunner

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.admin.cleanup import CleanupCounts, JournalCleanup
from pgjournal.cli.commands import app


def rows(dsn: str, table: str = "event_journal") -> set[tuple]:
    with psycopg.connect(dsn) as conn:
        if table == "event_journal":
            return set(conn.execute("SELECT persistence_id, seq_nr, deleted FROM event_journal").fetchall())
        if table == "tag_views":
            return set(conn.execute("SELECT tag_name, persistence_id, sequence_nr FROM tag_views").fetchall())
        return set(conn.execute(f"SELECT persistence_id FROM {table}").fetchall())


def seed(journal: Journal) -> None:
    for i in range(3):
        journal.append(f"Cart|{i}", [{"n": k} for k in range(5)], tags=["cart"])
    journal.append("User|1", ["a", "b", "c"], tags=["user"])
    tags_written(journal)  # the batched tag writer's rows, before a cleanup
    journal.save_snapshot("Cart|0", 3, {"upto": 3})
    journal.save_snapshot("Cart|1", 5, {"upto": 5})
    journal.save_snapshot("User|1", 2, {"upto": 2})


def test_events_before_snapshot_dry_run_then_run(journal: Journal, dsn: str) -> None:
    seed(journal)
    before = rows(dsn), rows(dsn, "tag_views"), rows(dsn, "snapshot")
    dry = JournalCleanup(journal, batch_size=2).events_before_snapshot("Cart")
    assert (rows(dsn), rows(dsn, "tag_views"), rows(dsn, "snapshot")) == before  # nothing changed
    assert dry.dry_run and dry.counts.events_deleted == 3 + 4 and dry.counts.events_marked == 1
    assert dry.counts.tag_view_rows == 8 and dry.counts.persistence_ids == 2
    done = JournalCleanup(journal, dry_run=False, batch_size=2).events_before_snapshot("Cart")
    for name in ("events_deleted", "events_marked", "tag_view_rows", "persistence_ids"):
        assert getattr(done.counts, name) == getattr(dry.counts, name), name
    assert rows(dsn) == {("Cart|0", 4, False), ("Cart|0", 5, False), ("Cart|1", 5, True),
                         *{("Cart|2", k, False) for k in range(1, 6)}, *{("User|1", k, False) for k in (1, 2, 3)}}
    assert ("cart", "Cart|0", 3) not in rows(dsn, "tag_views") and ("cart", "Cart|0", 4) in rows(dsn, "tag_views")
    assert not any(pid == "Cart|1" for _, pid, _ in rows(dsn, "tag_views"))
    assert rows(dsn, "snapshot") == before[2]  # snapshots stay
    assert [e.seq_nr for e in journal.query.current_events_by_persistence_id("Cart|0")] == [4, 5]
    assert journal.append("Cart|1", ["next"])[0].seq_nr == 6  # the marker keeps the sequence going
    again = JournalCleanup(journal, dry_run=False).events_before_snapshot("Cart")
    assert again.counts.events_deleted == 1 and again.counts.events_marked == 0  # the marker is not the highest now
    third = JournalCleanup(journal, dry_run=False).events_before_snapshot("Cart")
    assert third.counts.events_deleted == third.counts.events_marked == 0


def test_events_before_a_timestamp_keep_the_highest_as_a_marker(journal: Journal, dsn: str) -> None:
    journal.append("Old|1", ["a", "b"])
    journal.append("Old|2", ["a"])
    time.sleep(0.05)
    with journal.connection() as conn:
        cut = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    time.sleep(0.05)
    journal.append("Old|2", ["b", "c"])
    report = JournalCleanup(journal, dry_run=False).events_before(cut, "Old")
    assert report.counts.events_deleted == 2 and report.counts.events_marked == 1
    assert rows(dsn) == {("Old|1", 2, True), ("Old|2", 2, False), ("Old|2", 3, False)}


def test_all_events_of_an_entity_type_with_a_reset(journal: Journal, dsn: str) -> None:
    seed(journal)
    report = JournalCleanup(journal, dry_run=False, batch_size=4).all_events("Cart", reset_sequence_number=True)
    assert report.counts.events_deleted == 15 and report.counts.snapshots == 2
    assert report.counts.tag_progress_rows == 3
    assert {r[0] for r in rows(dsn)} == {"User|1"} and rows(dsn, "snapshot") == {("User|1",)}
    assert {pid for _, pid, _ in rows(dsn, "tag_views")} == {"User|1"}
    assert rows(dsn, "tag_write_progress") == {("User|1",)}
    written = journal.append("Cart|0", ["again"], tags=["cart"])
    assert written[0].seq_nr == 1


def test_tombstoned_persistence_ids(journal: Journal, dsn: str) -> None:
    seed(journal)
    journal.delete_events("Cart|2", 5)  # every event logically deleted: a tombstone
    journal.delete_events("Cart|0", 2)  # not a tombstone
    journal.save_snapshot("Cart|2", 5, {"gone": True})
    report = JournalCleanup(journal, dry_run=False).tombstoned()
    assert report.counts.persistence_ids == 1 and report.counts.events_deleted == 4
    assert report.counts.events_marked == 0 and report.counts.snapshots == 1
    assert {(p, s) for p, s, _ in rows(dsn) if p == "Cart|2"} == {("Cart|2", 5)}
    assert len([r for r in rows(dsn) if r[0] == "Cart|0"]) == 5
    assert not any(pid == "Cart|2" for _, pid, _ in rows(dsn, "tag_views"))
    assert JournalCleanup(journal, dry_run=False).tombstoned().counts.events_deleted == 0


def test_a_run_stopped_between_batches_continues_when_run_again(journal: Journal, dsn: str) -> None:
    for i in range(6):
        journal.append(f"Big|{i}", [{"n": k} for k in range(7)], tags=["t"])
    for i in range(6):
        journal.save_snapshot(f"Big|{i}", 6, {"s": i})

    class Crash(Exception):
        pass

    def crash_after_three(counts: CleanupCounts) -> None:
        if counts.batches == 3:
            raise Crash

    with pytest.raises(Crash):
        JournalCleanup(journal, dry_run=False, batch_size=4, progress=crash_after_three).events_before_snapshot()
    partial = rows(dsn)
    assert 0 < len(partial) < 42
    JournalCleanup(journal, dry_run=False, batch_size=4).events_before_snapshot()
    assert rows(dsn) == {(f"Big|{i}", 7, False) for i in range(6)}
    assert rows(dsn, "tag_views") == {("t", f"Big|{i}", 7) for i in range(6)}


def test_projections_behind_a_deletion_are_named(journal: Journal, dsn: str) -> None:
    seed(journal)
    slice_ = slice_for_persistence_id("Cart|0")
    old, new = datetime(2020, 1, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, pid, ts in [("behind", "Cart|9", old), ("ahead", "Cart|9", new), ("users", "User|9", old)]:
            conn.execute("INSERT INTO projection_timestamp_offset_store (projection_name, projection_key, slice, "
                         "persistence_id, seq_nr, timestamp_offset, timestamp_consumed) VALUES (%s, '0-1023', %s, "
                         "%s, 1, %s, now())", (name, slice_, pid, ts))
    report = JournalCleanup(journal).events_before_snapshot("Cart", ["Cart|0"])
    assert [w.projection for w in report.warnings] == ["behind"]
    assert report.warnings[0].slices == 1 and "is behind in 1 slice(s)" in str(report.warnings[0])


def test_the_cli_counts_then_deletes(dsn: str) -> None:
    with Journal.open(dsn) as journal:
        seed(journal)
    runner = CliRunner()
    dry = runner.invoke(app, ["cleanup", "before-snapshot", "--entity-type", "Cart", "--dsn", dsn])
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output and "events deleted" in dry.output and "7" in dry.output
    assert len(rows(dsn)) == 18
    done = runner.invoke(app, ["cleanup", "before-snapshot", "--entity-type", "Cart", "--execute", "--batch-size",
                               "3", "--dsn", dsn])
    assert done.exit_code == 0, done.output
    assert len(rows(dsn)) == 18 - 7
    tomb = runner.invoke(app, ["cleanup", "tombstoned", "--dsn", dsn])
    assert tomb.exit_code == 0 and "tombstoned" in tomb.output, tomb.output
    bad = runner.invoke(app, ["cleanup", "before-time", "yesterday", "--dsn", dsn])
    assert bad.exit_code == 1 and "ISO 8601" in bad.output


def test_a_run_first_waits_for_the_tag_rows_other_processes_still_hold(journal: Journal, dsn: str) -> None:
    """A writer statement of another process that read the events before the run deleted them would write their
    tag rows after it: the run starts once every batched writer's watermark is past its start."""
    with Journal.open(dsn, tag_flush_interval=60.0, tag_writer_timeout=600.0) as other:
        other.append("Cart|9", ["a", "b"], tags=["cart"])  # its tag rows are written in 60 s, or at its flush
        done: dict[str, object] = {}
        run = threading.Thread(target=lambda: done.setdefault(
            "report", JournalCleanup(journal, dry_run=False).all_events("Cart")), daemon=True)
        run.start()
        run.join(0.5)
        assert run.is_alive() and rows(dsn) == {("Cart|9", 1, False), ("Cart|9", 2, False)}  # nothing deleted yet
        assert other.tag_writer is not None
        other.tag_writer.flush()
        run.join(30)
        assert "report" in done
    assert rows(dsn) == {("Cart|9", 2, True)} and rows(dsn, "tag_views") == set()
