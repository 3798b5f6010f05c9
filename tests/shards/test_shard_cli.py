"""``pgjournal shard migrate`` and ``pgjournal shard status``."""

from __future__ import annotations

from collections.abc import Callable

from test_layout_record import down_dsn
from typer.testing import CliRunner

from pgjournal.cli.commands import app
from pgjournal.shards import SHARDS_ENV


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
