"""``pgjournal verify``: a healthy journal passes; each corruption made by SQL is caught by its check, and
the CLI exits 1 with the report."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg
import pytest
from support.tags import tags_written
from typer.testing import CliRunner

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.admin.verify import verify
from pgjournal.cli.commands import app
from pgjournal.tags.reconciliation import Cleanup

A_SLICE = slice_for_persistence_id("Cart|a")


def build(journal: Journal) -> None:
    """A journal using every feature verify looks at: tags, logical deletes, physical cleanup, offsets."""
    journal.append("Cart|a", [f"a{i}" for i in range(5)], expected_seq_nr=0, tags=["t"])
    journal.append("Cart|a", ["a5"], expected_seq_nr=5, tags=["t", "u"])
    journal.append("Cart|b", ["b0", "b1", "b2"], expected_seq_nr=0)
    journal.append("Cart|c", ["c0", "c1", "c2"], expected_seq_nr=0, tags=["u"])
    tags_written(journal)  # the batched tag writer's rows, before the cleanup below
    journal.delete_events("Cart|b", 2)  # logical: rows stay, flagged
    Cleanup(journal, dry_run=False).delete_all_events("Cart|c")  # physical: the last stays as a deleted marker
    journal.append("Cart|c", ["c3"], expected_seq_nr=3)
    journal.append("Order|x", [{"n": 1}], expected_seq_nr=0)
    with journal.connection() as conn:
        conn.execute("INSERT INTO projection_timestamp_offset_store VALUES "
                     "('p', '0-1023', %s, 'Cart|a', 6, now(), now()), ('p', '0-1023', 0, '', 0, now(), now())",
                     (A_SLICE,))
        # A Spark load job's ledger row (load id, load number) is no offset: verify flagged it after make demo.
        conn.execute("INSERT INTO projection_timestamp_offset_store VALUES "
                     "('spark-load:nightly:loads', '*', 0, '000001-1a2b3c4d', 1, now(), now())")


def test_a_healthy_journal_passes(journal: Journal, dsn: str) -> None:
    build(journal)
    report = verify(journal)
    assert report.ok, [(c.name, c.examples) for c in report.checks if c.problems]
    assert (report.events, report.persistence_ids) == (12, 4)
    assert all(c.skipped is None for c in report.checks)
    result = CliRunner().invoke(app, ["verify", "--dsn", dsn])
    assert result.exit_code == 0, result.output
    assert "12 events, 4 persistence ids" in result.output and "problem" not in result.output


CORRUPTIONS = [
    ("hole in the middle", "DELETE FROM event_journal WHERE persistence_id = 'Cart|a' AND seq_nr = 3",
     "seq_nr gaps", "'Cart|a': missing 3 (between 2 and 4)"),
    ("several missing", "DELETE FROM event_journal WHERE persistence_id = 'Cart|a' AND seq_nr IN (2, 3, 4)",
     "seq_nr gaps", "'Cart|a': missing 2..4 (between 1 and 5)"),
    ("start removed without marker", "DELETE FROM event_journal WHERE persistence_id = 'Cart|b' AND seq_nr < 3",
     "seq_nr gaps", "'Cart|b': starts at 3, missing 1..2"),
    ("time goes backwards", "UPDATE event_journal SET db_timestamp = db_timestamp - interval '1 hour' "
     "WHERE persistence_id = 'Cart|a' AND seq_nr = 6", "time order", "'Cart|a': seq_nr 6 at"),
    ("wrong entity type", "UPDATE event_journal SET entity_type = 'Kart' WHERE persistence_id = 'Cart|b'",
     "slice and entity type", "'Cart|b': entity type 'Kart', expected 'Cart'"),
    ("wrong slice", f"UPDATE event_journal SET slice = {(A_SLICE + 1) % 1024} WHERE persistence_id = 'Cart|a'",
     "slice and entity type", f"'Cart|a': slice {(A_SLICE + 1) % 1024}, expected {A_SLICE}"),
    ("tag row lost", "DELETE FROM tag_views WHERE persistence_id = 'Cart|a' AND sequence_nr = 6 AND tag_name = 'u'",
     "tagged events in tag_views", "'Cart|a' seq_nr 6: no row for tag 'u'"),
    ("tag removed from the event", "UPDATE event_journal SET tags = ARRAY['t'] WHERE persistence_id = 'Cart|a' "
     "AND seq_nr = 6", "tag_views rows in the journal", "tag 'u': 'Cart|a' seq_nr 6 is stored without this tag"),
    ("tag row of no event", "UPDATE tag_views SET sequence_nr = 99 WHERE persistence_id = 'Cart|a' AND sequence_nr = 6 "
     "AND tag_name = 'u'", "tag_views rows in the journal", "tag 'u': 'Cart|a' seq_nr 99 is not in the journal"),
    ("tag sequence hole", "DELETE FROM tag_views WHERE persistence_id = 'Cart|a' AND tag_name = 't' "
     "AND tag_pid_sequence_nr = 2", "tag_pid_sequence_nr gaps", "tag 't', 'Cart|a': tag_pid_sequence_nr 3 follows 1"),
    ("progress behind", "UPDATE tag_write_progress SET tag_pid_sequence_nr = 2 WHERE persistence_id = 'Cart|a' "
     "AND tag = 't'", "tag_write_progress", "tag 't', 'Cart|a': progress at 2 but tag_views reach 6"),
    ("offset ahead", "UPDATE projection_timestamp_offset_store SET seq_nr = 9 WHERE persistence_id = 'Cart|a'",
     "projection offsets", "'p' (0-1023) slice"),
    ("offset of an unknown pid", "INSERT INTO projection_timestamp_offset_store VALUES "
     "('q', '0-511', 5, 'Ghost|1', 1, now(), now())", "projection offsets", "'Ghost|1' seq_nr 1, not in the journal"),
]


@pytest.mark.parametrize(("what", "sql", "check", "example"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_is_caught(journal: Journal, dsn: str, what: str, sql: str, check: str,
                                   example: str) -> None:
    build(journal)
    assert verify(journal).ok
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(sql).rowcount >= 1
    report = verify(journal)
    flagged = {c.name for c in report.checks if c.problems}
    assert check in flagged, (what, flagged)
    assert any(example in e for e in report.check(check).examples), report.check(check).examples
    result = CliRunner().invoke(app, ["verify", "--dsn", dsn])
    assert result.exit_code == 1, result.output
    assert "problem" in result.output and "Traceback" not in result.output
    assert example.split()[0] in result.output  # (the table wraps long examples)


def test_tag_rows_the_batched_writer_has_yet_to_write_are_pending_not_missing(dsn: str) -> None:
    """verify runs beside live writers: a tagged event past the batched writers' watermark has no tag row yet, and
    that is no problem; once the writer moves its watermark past the event, a missing row is one."""
    with Journal.open(dsn, tag_flush_interval=60, tag_writer_timeout=600) as journal:
        assert journal.tag_writer is not None
        journal.append("Cart|a", ["a0", "a1"], expected_seq_nr=0, tags=["t", "u"])  # not written for 60 s
        report = verify(journal)
        assert report.ok, [(c.name, c.examples) for c in report.checks if c.problems]
        assert report.check("tagged events in tag_views").pending == 4
        result = CliRunner().invoke(app, ["verify", "--dsn", dsn])
        assert result.exit_code == 0 and "4 still being written" in result.output, result.output
        journal.tag_writer.flush()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM tag_views WHERE sequence_nr = 2 AND tag_name = 'u'")
        report = verify(journal)
        missing = report.check("tagged events in tag_views")
        assert (missing.problems, missing.pending) == (1, 0)
        assert missing.examples == ["'Cart|a' seq_nr 2: no row for tag 'u'"]


def test_many_problems_are_counted_and_examples_capped(journal: Journal, dsn: str) -> None:
    for i in range(30):
        journal.append(f"Cart|{i}", ["x", "y", "z"], expected_seq_nr=0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM event_journal WHERE seq_nr = 2")
    report = verify(journal, examples=3)
    gaps = report.check("seq_nr gaps")
    assert gaps.problems == 30 and len(gaps.examples) == 3
    result = CliRunner().invoke(app, ["verify", "--dsn", dsn, "--examples", "2"])
    assert result.exit_code == 1 and "... and 28 more" in result.output and "30 problem(s) found" in result.output


def test_without_tag_or_projection_tables_those_checks_are_skipped(journal: Journal, dsn: str) -> None:
    journal.append("Cart|a", ["x"], expected_seq_nr=0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE tag_views, projection_timestamp_offset_store")
    report = verify(journal)
    assert report.ok
    assert report.check("tagged events in tag_views").skipped == "no tag tables"
    assert report.check("projection offsets").skipped == "no projection offset store"


def test_verify_is_read_only_and_fast_enough(journal: Journal, dsn: str) -> None:
    """20,000 events in 2,000 persistence ids: verify reads them all, changes nothing. (Timing printed.)"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
                event_ser_manifest, event_payload, writer)
            SELECT 0, 'Bulk', 'Bulk|' || p, s, now() + s * interval '1 ms', 1, '', '\\x7b7d', 'w'
            FROM generate_series(1, 2000) p, generate_series(1, 10) s""")
        conn.execute("UPDATE event_journal SET slice = 0")  # all rows: slices are wrong on purpose below
        before = conn.execute("SELECT md5(string_agg(persistence_id || seq_nr || slice, ',' ORDER BY "
                              "persistence_id, seq_nr)) FROM event_journal").fetchone()
    started = time.perf_counter()
    report = verify(journal, examples=1)
    took = time.perf_counter() - started
    assert report.events == 20_000
    assert report.check("seq_nr gaps").problems == 0
    assert report.check("slice and entity type").problems >= 1900  # slice 0 is right for only a few
    with psycopg.connect(dsn) as conn:
        after = conn.execute("SELECT md5(string_agg(persistence_id || seq_nr || slice, ',' ORDER BY "
                             "persistence_id, seq_nr)) FROM event_journal").fetchone()
    assert before == after
    print(f"\nverify: 20,000 events, 2,000 pids in {took:.2f} s ({datetime.now(UTC):%H:%M} UTC, shared machine)")
