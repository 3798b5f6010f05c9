"""``pgjournal server ...`` and the commands that start the embedded server, as a user sees them: the values a
user copies are printed whole, and no warning of a dependency's about a runtime folder pgjournal never uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pgjournal.cli.commands import app
from pgjournal.server.embedded import HOME_ENV, EmbeddedServer

pytestmark = pytest.mark.mode_independent


def test_server_status_prints_the_dsn_and_the_data_directory_whole_on_a_narrow_terminal(
        private_server: EmbeddedServer) -> None:
    status = private_server.status()
    assert len(status.dsn) > 60  # with the 80 columns below, a table cell would cut it
    result = CliRunner().invoke(app, ["server", "status"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"dsn: {status.dsn}" in lines, result.output
    assert f"data directory: {status.data_dir}" in lines, result.output


def test_no_runtime_dir_warning_without_xdg_runtime_dir(private_server: EmbeddedServer, tmp_path: Path) -> None:
    """platformdirs warns when a program asks for the user's runtime folder and ``XDG_RUNTIME_DIR`` is unset
    (a cron job, a container, ``su``): pgjournal never asks for it, nor imports what does."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "PGJOURNAL_DSN")}
    env[HOME_ENV] = str(private_server.home)
    for args in (["migrate"], ["server", "stop"], ["server", "start"]):
        done = subprocess.run([sys.executable, "-W", "always", "-m", "pgjournal", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert "Warning" not in done.stderr, done.stderr
