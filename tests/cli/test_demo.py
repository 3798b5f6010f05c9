"""The commands ``make demo`` ends with work as printed: run in a shell with no ``PGJOURNAL_DSN``, each looks at
the database the demo wrote (not the default one, which has no schema), and none carries a password."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import psycopg.conninfo
import pytest
from rich.console import Console

from pgjournal import Journal
from pgjournal.cli.demo import command_line, look_commands, print_commands

pytestmark = pytest.mark.mode_independent

ROOT = Path(__file__).resolve().parents[2]


def test_the_printed_commands_work_as_printed(dsn: str) -> None:
    with Journal.open(dsn) as journal:
        journal.append("cart|7", [{"item": "apple"}, {"item": "pear"}])
    out = io.StringIO()
    # a narrow terminal: a printed command still fits on one line, to copy as it is
    print_commands(Console(file=out, width=40), "look with", look_commands(dsn, "cart", "cart|7"))
    lines = [line.strip() for line in out.getvalue().splitlines()[1:]]
    assert [line.split()[1] for line in lines] == ["info", "events", "tail", "verify"]
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOURNAL_DSN", "PGJOURNAL_SHARDS")}
    outputs = {}
    for line in lines:
        # as a shell runs it: the line's words, `pgjournal` being this interpreter's
        done = subprocess.run(f"{sys.executable} -m {line}", shell=True, capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300, check=False)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        outputs[line.split()[1]] = done.stdout
    assert "cart" in outputs["info"] and "2" in outputs["info"]
    assert '"item": "pear"' in outputs["events"] and '"item": "apple"' in outputs["tail"]


def test_a_printed_command_carries_no_password() -> None:
    line = command_line("postgresql://demo:s3cr3t@db.example:5433/pgjournal_demo?sslpassword=k3y", "info")
    assert "s3cr3t" not in line and "k3y" not in line
    dsn = line.split("--dsn ", 1)[1].strip("'")
    assert psycopg.conninfo.conninfo_to_dict(dsn) == {"user": "demo", "host": "db.example", "port": "5433",
                                                      "dbname": "pgjournal_demo"}
