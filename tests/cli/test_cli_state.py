"""``pgjournal state get|put|delete|changes``: the durable state store from the command line."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from pgjournal.cli.commands import app

pytestmark = pytest.mark.mode_independent


def test_put_get_delete_and_changes(dsn: str) -> None:
    runner = CliRunner()
    put = runner.invoke(app, ["state", "put", "Cart|1", '{"items": 1}', "--dsn", dsn])
    assert put.exit_code == 0 and "written" in put.output, put.output
    again = runner.invoke(app, ["state", "put", "Cart|1", '{"items": 2}', "--revision", "2", "--tag", "t",
                                "--dsn", dsn])
    assert again.exit_code == 0, again.output
    got = runner.invoke(app, ["state", "get", "Cart|1", "--dsn", dsn])
    record = json.loads(got.output)
    assert (record["revision"], record["value"], record["tags"], record["deleted"]) == (2, {"items": 2}, ["t"], False)
    stale = runner.invoke(app, ["state", "put", "Cart|1", "3", "--revision", "2", "--dsn", dsn])
    assert stale.exit_code == 1
    assert "expected the current revision to be 1 but it is 2" in " ".join(stale.output.split())
    deleted = runner.invoke(app, ["state", "delete", "Cart|1", "--dsn", dsn])
    assert deleted.exit_code == 0 and "deleted" in deleted.output, deleted.output
    assert json.loads(runner.invoke(app, ["state", "get", "Cart|1", "--dsn", dsn]).output)["deleted"] is True
    runner.invoke(app, ["state", "put", "Cart|2", '"x"', "--dsn", dsn])
    time.sleep(0.2)  # past the read margin
    changes = runner.invoke(app, ["state", "changes", "Cart", "--dsn", dsn])
    lines = [json.loads(line) for line in changes.output.splitlines()]
    assert [(c["pid"], c["revision"], c["deleted"]) for c in lines] == [("Cart|1", 3, True), ("Cart|2", 1, False)]
    resumed = runner.invoke(app, ["state", "changes", "Cart", "--from", lines[0]["offset"], "--dsn", dsn])
    assert [json.loads(line)["pid"] for line in resumed.output.splitlines()] == ["Cart|2"]
    missing = runner.invoke(app, ["state", "get", "Cart|9", "--dsn", dsn])
    assert missing.exit_code == 1 and "has no durable state" in missing.output


def test_help_names_the_revision_rule() -> None:
    result = CliRunner().invoke(app, ["state", "--help"])
    assert result.exit_code == 0 and "current revision + 1" in " ".join(result.output.split())
    for command in ("get", "put", "delete", "changes"):
        assert command in result.output
