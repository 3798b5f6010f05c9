"""``pgjournal shard migrate`` and ``pgjournal shard status`` (the layout, and each database's range, size and
horizon), ``pgjournal info`` and the projection commands over every database of a sharded journal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.held_writes import insert_in
from test_layout_record import down_dsn
from typer.testing import CliRunner

from pgjournal.cli.commands import app
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.projections import management
from pgjournal.shards import SHARDS_ENV, ShardedJournal, ShardSettings, migrate_all

pytestmark = pytest.mark.mode_independent


def test_shard_migrate_then_status_show_the_agreed_layout(shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(2, migrated=False)
    runner = CliRunner()
    migrated = runner.invoke(app, ["shard", "migrate", "--shard", f"0-511={dsns[0]}", "--shard",
                                   f"512-1023={dsns[1]}"])
    assert migrated.exit_code == 0, migrated.output
    assert "layout version 1" in migrated.output and "512-1023" in migrated.output
    status = runner.invoke(app, ["shard", "status"], env={SHARDS_ENV: f"0-511={dsns[0]}\n512-1023={dsns[1]}"})
    assert status.exit_code == 0, status.output
    assert "agreed: layout version 1" in status.output
    swapped = runner.invoke(app, ["shard", "status"], env={SHARDS_ENV: f"0-511={dsns[1]}\n512-1023={dsns[0]}"})
    assert swapped.exit_code == 1 and "DSNs swapped" in swapped.output


def test_shard_migrate_refuses_a_database_that_is_down(shard_databases: Callable[..., list[str]]) -> None:
    up, down = shard_databases(1, migrated=False)[0], down_dsn()
    result = CliRunner().invoke(app, ["shard", "migrate", "--shard", f"0-511={up}", "--shard", f"512-1023={down}"])
    assert result.exit_code == 1
    assert "512-1023" in result.output and "hunter2secret" not in result.output
    bad = CliRunner().invoke(app, ["shard", "migrate", "--shard", f"0-600={up}", "--shard", f"512-1023={down}"])
    assert bad.exit_code == 1 and "overlap" in bad.output


def test_shard_status_shows_each_databases_range_size_and_horizon(shard_databases: Callable[..., list[str]]) -> None:
    """One row per database: its range, the size of its journal tables, how far its visibility horizon is behind
    its clock and how many journal writers hold it back (here a transaction held open in the second one)."""
    dsns = shard_databases(2)
    shards = [f"0-511={dsns[0]}", f"512-1023={dsns[1]}"]
    pid = next(p for p in (f"Busy|{i}" for i in range(100)) if slice_for_persistence_id(p) >= 512)
    with ShardedJournal.open(dsns, migrate=True) as journal:
        for i in range(50):
            journal.append(f"Bulk|{i}", ["x" * 1000])
    with psycopg.connect(dsns[1]) as held:
        insert_in(held, pid, 0)
        held.execute("SELECT pg_sleep(0.2)")  # the writer's transaction is open 0.2 s at least
        result = CliRunner().invoke(app, ["shard", "status", *(a for s in shards for a in ("--shard", s))],
                                    terminal_width=200)
        held.rollback()
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[1:-1]]
             for line in result.output.splitlines() if line.count("│") > 4 and "-" in line.split("│")[1]}
    assert set(lines) == {"0-511", "512-1023"}, result.output
    for cells in lines.values():
        assert cells[3].endswith(("kB", "MB")), cells  # 50 events of 1 kB, their indexes, snapshots, states
    assert lines["0-511"][5] == "0" and lines["512-1023"][5] == "1", result.output
    assert float(lines["512-1023"][4].removesuffix(" s")) >= 0.2, result.output


def test_projection_run_takes_the_databases_of_a_sharded_journal(shard_databases: Callable[..., list[str]]) -> None:
    """``pgjournal projection run --shard RANGE=DSN ...`` (the workers themselves: test_projections.py) checks the
    shards before any worker starts."""
    first, second = shard_databases(2)
    run = ["projection", "run", "p", "-e", "Cart"]
    bad = CliRunner().invoke(app, [*run, "--shard", f"0-600={first}", "--shard", f"512-1023={second}"])
    assert bad.exit_code == 1 and "shard ranges 0-600 and 512-1023 overlap" in bad.output, bad.output
    both = CliRunner().invoke(app, [*run, "--dsn", first, "--shard", f"0-511={first}", "--shard",
                                    f"512-1023={second}"])
    assert both.exit_code == 1 and "not both" in both.output, both.output


def test_info_of_a_sharded_journal_shows_the_layout_then_each_database(
        shard_databases: Callable[..., list[str]]) -> None:
    dsns = shard_databases(2)
    shards = [a for s in (f"0-511={dsns[0]}", f"512-1023={dsns[1]}") for a in ("--shard", s)]
    low = next(p for p in (f"Cart|{i}" for i in range(1000)) if slice_for_persistence_id(p) < 512)
    with ShardedJournal.open(dsns, migrate=True) as journal:
        journal.append(low, ["a", "b", "c"])
    result = CliRunner().invoke(app, ["info", *shards], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "agreed: layout version 1" in result.output
    first, second = result.output.split("slices 0-511", 1)[1].split("slices 512-1023", 1)
    cart = [line for line in first.splitlines() if "│ Cart " in line]
    assert len(cart) == 1 and cart[0].split("│")[2].strip() == "3", first  # its 3 events, in the first database
    assert "Cart" not in second and second.count("Events per entity type") == 1
    both = CliRunner().invoke(app, ["info", "--dsn", dsns[0], *shards], terminal_width=200)
    assert both.exit_code == 1 and "without --dsn and --watch" in " ".join(both.output.split()), both.output


def test_projection_management_acts_on_every_database_of_a_sharded_journal(
        shard_databases: Callable[..., list[str]]) -> None:
    """A projection's offsets and pause flag live in the database of their slices: ``projection reset|status|
    pause|resume|list --shard ...`` act on each database, ``reset --slices`` on each one's part of the range."""
    dsns = shard_databases(2)
    migrate_all(ShardSettings.of(dsns))
    shards = [a for s in (f"0-511={dsns[0]}", f"512-1023={dsns[1]}") for a in ("--shard", s)]
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, ["projection", *args, *shards], terminal_width=200)
        assert result.exit_code == 0, result.output
        return result.output

    def offset_slices(dsn: str) -> set[int]:
        with psycopg.connect(dsn) as conn:
            return {s for (s,) in conn.execute("SELECT DISTINCT slice FROM projection_timestamp_offset_store "
                                               "WHERE projection_name = 'p'")}

    assert "slices 0-511 start after" in invoke("reset", "p", "--to", "2020-01-01T00:00:00Z")
    assert offset_slices(dsns[0]) == set(range(512)) and offset_slices(dsns[1]) == set(range(512, 1024))
    assert invoke("list").split() == ["p"]
    status = invoke("status", "p", "-e", "Cart")
    assert status.count("p: stopped") == 2 and "│ 0-511 " in status and "│ 512-1023 " in status, status
    assert "paused in 2 databases" in invoke("pause", "p")
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            assert management.is_paused(conn, "p")
    assert invoke("status", "p").count("paused") == 2
    cleared = invoke("reset", "p", "--slices", "500-600")
    assert "cleared 12 offset row(s) of slices 500-511" in cleared and "of slices 512-600" in cleared, cleared
    assert offset_slices(dsns[0]) == set(range(500)) and offset_slices(dsns[1]) == set(range(601, 1024))
    assert "resumed in 2 databases" in invoke("resume", "p")
    both = runner.invoke(app, ["projection", "list", "--dsn", dsns[0], *shards])
    assert both.exit_code == 1 and "not both" in both.output


def database_id(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        return str(conn.execute("SELECT database_id FROM pgjournal_shard_layout").fetchone()[0])[:8]  # type: ignore[index]


def rows_of(output: str) -> dict[str, list[str]]:
    """A table's rows by their first cell (a slice range), each cell as printed (database ids by their first 8
    characters: a narrow terminal cuts them)."""
    return {cells[0]: [c[:8] for c in cells[1:]] for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                              for line in output.splitlines() if line.count("│") >= 3)
            if cells and cells[0][:1].isdigit()}


def test_after_a_move_the_settings_of_before_with_the_target_as_a_spare_work_in_every_shard_command(
        shard_databases: Callable[..., list[str]]) -> None:
    """``shard migrate`` migrates the spares it is given; the move's table shows where each range was and is; and
    the settings of before plus ``spare=`` (which ``ShardedJournal.open`` routes by the records) are taken by
    ``shard status``, ``info``, ``shard migrate`` and a next ``shard move``, each printing the layout routed."""
    a, b = shard_databases(2, migrated=False)
    c, d = shard_databases(2, migrated=False)
    runner = CliRunner()
    before = ["--shard", f"0-511={a}", "--shard", f"512-1023={b}"]

    def invoke(*args: str) -> Any:
        result = runner.invoke(app, list(args), terminal_width=250)
        result.text = " ".join(result.output.split())
        return result

    assert invoke("shard", "migrate", *before).exit_code == 0
    unmigrated = invoke("shard", "move", "--slices", "512-767", "--to", c, *before)
    assert unmigrated.exit_code == 1, unmigrated.output
    assert unmigrated.text.count("run `") == 1 and "`pgjournal migrate`" in unmigrated.text, unmigrated.output  # once
    migrated = invoke("shard", "migrate", *before, "--shard", f"spare={c}", "--shard", f"spare={d}")
    assert migrated.exit_code == 0, migrated.output
    with psycopg.connect(c) as conn:  # the schema, and no layout: a spare is no layout's database yet
        assert conn.execute("SELECT to_regclass('event_journal') IS NOT NULL, "
                            "to_regclass('pgjournal_shard_layout') IS NULL").fetchone() == (True, True)
    with ShardedJournal.open(ShardSettings.of([a, b])) as journal:
        journal.append(next(f"p{i}" for i in range(999) if 512 <= slice_for_persistence_id(f"p{i}") <= 767), ["x"])
    ids = {"a": database_id(a), "b": database_id(b)}
    moved = invoke("shard", "move", "--slices", "512-767", "--to", c, *before)
    assert moved.exit_code == 0, moved.output
    ids["c"] = database_id(c)
    assert "database in layout version 1" in moved.output and "database in layout version 2" in moved.output
    assert rows_of(moved.output) == {"0-511": [ids["a"], ids["a"]], "512-767": [ids["b"], ids["c"]],
                                     "768-1023": [ids["b"], ids["b"]]}, moved.output
    stale = [*before, "--shard", f"spare={c}", "--shard", f"spare={d}"]
    for command in (["shard", "status"], ["info"], ["shard", "migrate"]):
        result = invoke(*command, *stale)
        assert result.exit_code == 0, (command, result.output)
        assert "layout version 2" in result.output, (command, result.output)
        shown = rows_of(result.output)
        assert {k: v[1] for k, v in shown.items() if k in ("0-511", "512-767", "768-1023")} == {
            "0-511": ids["a"], "512-767": ids["c"], "768-1023": ids["b"]}, (command, result.output)
    again = invoke("shard", "move", "--slices", "512-639", "--to", d, *stale)  # the source is known as a spare
    assert again.exit_code == 0, again.output
    assert "512-639" in again.text and "640-767" in again.text and "layout version 3" in again.output
