"""Reconciliation (tags of a pid, delete, rebuild, all tags, truncate), Cleanup, and their CLI."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.tags import TAGS, tags_written
from typer.testing import CliRunner

from pgjournal import Journal
from pgjournal.cli.commands import app
from pgjournal.errors import TagFlushFailed
from pgjournal.tags.reconciliation import Cleanup, Reconciliation


@pytest.fixture
def tj(dsn: str) -> Iterator[Journal]:
    with Journal.open(dsn, **TAGS) as opened:
        yield opened


def view(journal: Journal, tag: str) -> list[tuple[str, int, int, object]]:
    time.sleep(journal.settings.tag_eventual_consistency_delay + 0.05)
    return [(e.persistence_id, e.seq_nr, e.tag_pid_sequence_nr, e.event)
            for e in journal.query.current_events_by_tag(tag)]


def test_reconciliation_round_trip(tj: Journal) -> None:
    tj.append("Cart|1", [{"n": 1}, {"n": 2}], tags=["x", "y"])
    tj.append("Cart|1", [{"n": 3}], tags=["y"])
    tj.append("Cart|1", [{"n": 4}], tags=["x"])
    tj.append("Cart|2", [{"n": 1}], tags=["x"])
    tj.delete_events("Cart|1", 1)  # logically deleted events keep their tag rows and numbers
    before_x, before_y = view(tj, "x"), view(tj, "y")
    rec = Reconciliation(tj)
    assert rec.tags_of("Cart|1") == ["x", "y"]
    assert rec.delete_tag_view("Cart|1", "x") == 3
    assert [row[0] for row in view(tj, "x")] == ["Cart|2"]
    assert view(tj, "y") == before_y
    assert rec.rebuild("Cart|1") == 3 + 3
    assert sorted(view(tj, "x"), key=str) == sorted(before_x, key=str)
    assert view(tj, "y") == before_y
    with tj.connection() as conn:
        assert conn.execute("SELECT persistence_id, sequence_nr FROM tag_scanning").fetchall() == [("Cart|1", 4)]
    assert rec.rebuild("Cart|1", ["x"]) == 3  # idempotent
    assert sorted(view(tj, "x"), key=str) == sorted(before_x, key=str)
    # New appends continue the rebuilt numbering.
    tj.append("Cart|1", [{"n": 5}], tags=["x"])
    assert view(tj, "x")[-1][:3] == ("Cart|1", 5, 4)
    counts = {c.tag: (c.events, c.persistence_ids) for c in rec.all_tags()}
    assert counts == {"x": (5, 2), "y": (3, 1)}
    rec.truncate()
    assert view(tj, "x") == [] and rec.all_tags() == []


def test_cleanup_is_a_dry_run_by_default(tj: Journal) -> None:
    tj.append("Cart|1", [1, 2, 3], tags=["x"])
    tags_written(tj)
    tj.save_snapshot("Cart|1", 3, {"s": 1})
    dry = Cleanup(tj)
    results = dry.delete_all("Cart|1")
    assert [(r.what, r.rows, r.dry_run) for r in results] == [
        ("tagged events", 3, True), ("events", 2, True), ("snapshots", 1, True)]
    assert "would delete 3 tagged events" in str(results[0])
    assert len(view(tj, "x")) == 3 and tj.load_snapshot("Cart|1") is not None
    done = Cleanup(tj, dry_run=False).delete_all("Cart|1")
    assert [r.rows for r in done] == [3, 2, 1]
    assert view(tj, "x") == [] and tj.load_snapshot("Cart|1") is None
    assert list(tj.query.current_events_by_persistence_id("Cart|1")) == []
    assert tj.highest_seq_nr("Cart|1") == 3  # the pid continues after its highest sequence number
    tj.append("Cart|1", [4], expected_seq_nr=3, tags=["x"])
    tags_written(tj)
    with tj.connection() as conn:  # tag numbers keep counting, so streams that knew the pid stay correct
        rows = conn.execute("SELECT sequence_nr, tag_pid_sequence_nr FROM tag_views").fetchall()
    assert rows == [(4, 4)]


def test_cleanup_waits_for_another_processes_batched_writer_so_no_tag_row_outlives_its_event(
        tj: Journal, dsn: str) -> None:
    """Another process's batched writer still holds the pid's tag rows: deleting the tag view first and the
    events after left the rows it wrote later in the tag view, the deleted events' payloads with them."""
    with Journal.open(dsn, **{**TAGS, "tag_flush_interval": 60.0, "tag_writer_timeout": 600.0}) as other:
        other.append("Cart|1", [1, 2, 3], tags=["x"])  # its rows are written in 60 s, or at its flush
        done: dict[str, object] = {}
        cleaning = threading.Thread(target=lambda: done.setdefault("results", Cleanup(tj, dry_run=False).delete_all(
            "Cart|1")), daemon=True)
        cleaning.start()
        cleaning.join(0.5)
        assert cleaning.is_alive() and "results" not in done  # waiting for the other writer's watermark
        assert other.tag_writer is not None
        other.tag_writer.flush()
        cleaning.join(30)
        results = done["results"]
        assert isinstance(results, list) and [r.rows for r in results] == [3, 2, 0]
        other.tag_writer.flush()
    with tj.connection() as conn:
        assert conn.execute("SELECT count(*) FROM tag_views").fetchone() == (0,)


def test_delete_tag_view_waits_for_another_processes_batched_writer(tj: Journal, dsn: str) -> None:
    """Another process's batched writer still holds the pid's tag rows: a delete that did not wait left the rows
    it wrote afterwards in the view."""
    with Journal.open(dsn, **{**TAGS, "tag_flush_interval": 60.0, "tag_writer_timeout": 600.0}) as other:
        other.append("Cart|1", [1, 2, 3], tags=["x"])  # its rows are written in 60 s, or at its flush
        done: dict[str, int] = {}
        deleting = threading.Thread(target=lambda: done.setdefault(
            "rows", Reconciliation(tj).delete_tag_view("Cart|1", "x")), daemon=True)
        deleting.start()
        deleting.join(0.5)
        assert deleting.is_alive() and "rows" not in done  # waiting for the other writer's watermark
        assert other.tag_writer is not None
        other.tag_writer.flush()
        deleting.join(30)
        assert done["rows"] == 3
        other.tag_writer.flush()
    assert view(tj, "x") == []


def test_a_rebuild_beside_another_processes_batched_writer_leaves_each_event_once(tj: Journal, dsn: str) -> None:
    """The rows a writer still holds when a rebuild runs are the rows the rebuild makes (same tag numbers): written
    afterwards, they add nothing."""
    with Journal.open(dsn, **{**TAGS, "tag_flush_interval": 60.0, "tag_writer_timeout": 600.0}) as other:
        other.append("Cart|1", [1, 2, 3], tags=["x"])
        assert Reconciliation(tj).rebuild("Cart|1") == 3
        assert other.tag_writer is not None
        other.tag_writer.flush()
    assert view(tj, "x") == [("Cart|1", 1, 1, 1), ("Cart|1", 2, 2, 2), ("Cart|1", 3, 3, 3)]


def test_cleanup_does_not_wait_for_its_own_journals_writer(dsn: str) -> None:
    """Its own writer is flushed first, so cleanup waits for no heartbeat of it (60 s here)."""
    with Journal.open(dsn, **{**TAGS, "tag_flush_interval": 60.0, "tag_writer_timeout": 600.0}) as journal:
        journal.append("Cart|1", [1, 2], tags=["x"])
        done: dict[str, object] = {}
        cleaning = threading.Thread(target=lambda: done.setdefault(
            "results", Cleanup(journal, dry_run=False).delete_all("Cart|1")), daemon=True)
        cleaning.start()
        cleaning.join(20)  # well under the writer's next heartbeat
        assert "results" in done
        assert [r.rows for r in done["results"]] == [2, 1, 0]  # type: ignore[attr-defined]


def test_cleanup_gives_up_on_a_writer_that_does_not_write_and_deletes_nothing(dsn: str) -> None:
    with Journal.open(dsn, **{**TAGS, "tag_flush_interval": 60.0, "tag_writer_timeout": 600.0}) as other, \
            Journal.open(dsn, **{**TAGS, "tag_writer_timeout": 1.0}) as impatient:
        other.append("Cart|1", [1, 2], tags=["x"])
        with pytest.raises(TagFlushFailed, match=r"other processes have not written the tag rows.*after 1 s.*"
                                                 r"nothing was deleted"):
            Cleanup(impatient, dry_run=False).delete_all("Cart|1")
        assert impatient.highest_seq_nr("Cart|1") == 2
        assert len(list(impatient.query.current_events_by_persistence_id("Cart|1"))) == 2


def test_cleanup_with_reset_sequence_number(tj: Journal) -> None:
    tj.append("Cart|1", [1, 2], tags=["x"])
    assert Cleanup(tj, dry_run=False).delete_all_events("Cart|1", reset_sequence_number=True).rows == 2
    assert tj.highest_seq_nr("Cart|1") == 0


def test_tags_and_cleanup_cli(tj: Journal) -> None:
    tj.append("Cart|1", [{"n": 1}, {"n": 2}], tags=["x", "y"])
    tags_written(tj)  # `tags all` counts the tag view's rows, which the batched tag writer writes after the append
    # Settings reach the CLI through PGJOURNAL_* variables (a Minute-bucket database needs Minute buckets).
    runner = CliRunner(env={"PGJOURNAL_TAG_BUCKET_SIZE": "Minute", "PGJOURNAL_TAG_EVENTUAL_CONSISTENCY_DELAY": "0.05"})
    dsn = ["--dsn", tj.dsn]

    def run(*args: str) -> str:
        result = runner.invoke(app, [*args, *dsn])
        assert result.exit_code == 0, result.output
        return result.output

    assert "x" in run("tags", "of", "Cart|1") and "y" in run("tags", "of", "Cart|1")
    assert "x" in run("tags", "all")
    time.sleep(0.1)
    out = run("tags", "events", "x")
    assert out.count('"pid": "Cart|1"') == 2 and '"tag_pid_sequence_nr": 2' in out
    assert "2" in run("tags", "delete", "Cart|1", "x")
    assert run("tags", "events", "x").strip() == ""
    assert "rebuilt 4" in run("tags", "rebuild", "Cart|1")
    assert "would delete" in run("cleanup", "all", "Cart|1")
    assert len(view(tj, "x")) == 2
    assert "deleted" in run("cleanup", "tagged", "Cart|1", "--execute")
    assert view(tj, "x") == []
    failed = runner.invoke(app, ["tags", "truncate", *dsn])
    assert failed.exit_code != 0  # needs --yes
    run("tags", "truncate", "--yes")
    bad = runner.invoke(app, ["tags", "events", "x", "--offset", "nonsense", *dsn])
    assert bad.exit_code == 1 and "error" in bad.output
