"""What a command imports before it runs: ``pgjournal --version`` and ``import pgjournal`` load no driver, no
SQLAlchemy, no Rich and no add-on; a projection worker process loads no migration tool, no other add-on and
no highlighter; ``--help`` lists every group without importing the core's; a broken add-on breaks only its
own commands. Each case runs in a fresh interpreter and reads its ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.mode_independent

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("psycopg", "sqlalchemy", "alembic", "mako", "pygments", "rich", "pyspark", "pgjournal.projections",
         "pgjournal.spark", "pgjournal.journal", "pgjournal.cli.tags", "pgjournal.cli.shard")


def loaded_after(code: str, *args: str) -> tuple[set[str], str]:
    """The top packages and pgjournal modules a fresh interpreter holds after ``code``, and what it printed."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print("MODULES=" + json.dumps(sorted(sys.modules)))
    """)
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES="))), done.stdout


def heavy(modules: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(name for name in HEAVY if name in modules and name not in allowed)


def test_import_pgjournal_loads_none_of_its_parts() -> None:
    modules, _ = loaded_after("import pgjournal; assert pgjournal.__version__")
    assert heavy(modules) == []
    assert not any(m.startswith("pgjournal.") for m in modules), sorted(m for m in modules if "pgjournal." in m)


def test_a_public_name_is_imported_on_first_use() -> None:
    modules, out = loaded_after("""
        import pgjournal
        from pgjournal import slice_ranges
        print(slice_ranges(2), pgjournal.LeaseLost.__module__)
    """)
    assert "[(0, 511), (512, 1023)] pgjournal.errors" in out
    assert "pgjournal.journal" not in modules


def test_version_imports_no_command_group() -> None:
    modules, out = loaded_after("""
        import sys
        from pgjournal.cli.commands import main
        sys.argv = ["pgjournal", "--version"]
        try:
            main()
        except SystemExit:
            pass
    """)
    assert "pgjournal 0." in out
    assert heavy(modules) == []
    assert "importlib.metadata" not in modules  # not even the add-ons' entry points are read


def test_help_lists_every_group_without_importing_the_cores() -> None:
    modules, out = loaded_after("""
        from typer.testing import CliRunner
        from pgjournal.cli.commands import app
        print(CliRunner().invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"}).output)
    """)
    for name, line in (("tags", "The Cassandra-compatible tag view"), ("shard", "A journal sharded by slice range"),
                       ("state", "The durable state store"), ("cleanup", "Delete events, tag view rows"),
                       ("projection", "Projections by slice range"), ("spark", "Spark jobs over the journal"),
                       ("tail", "Print the events of a slice range")):
        assert any(f" {name} " in row and line in row for row in out.splitlines()), (name, out)
    # Typer's help renderer brings Rich and pygments; the add-ons are imported to read their help lines
    assert heavy(modules, allowed=("rich", "pygments", "pgjournal.projections", "pgjournal.spark", "psycopg",
                                   "pgjournal.journal")) == []


def test_a_projection_worker_loads_only_what_it_runs() -> None:
    # the imports of `pgjournal projection run ...` up to its first lease cycle, in a fresh interpreter
    modules, _ = loaded_after("""
        from pgjournal.cli.commands import app
        from pgjournal.cli.lazy import LazyGroup
        import typer.main
        group = typer.main.get_command(app)
        ctx = group.context_class(group)
        run = group.get_command(ctx, "projection").get_command(ctx, "run")
        assert run is not None
        import pgjournal.projections.workers, pgjournal.projections.examples
        from pgjournal.journal import Journal
    """)
    assert heavy(modules, allowed=("psycopg", "rich", "pgjournal.projections", "pgjournal.journal")) == []


def test_a_group_that_cannot_be_imported_fails_alone() -> None:
    _, out = loaded_after("""
        from typer.testing import CliRunner
        from pgjournal.cli import lazy
        from pgjournal.cli.commands import app
        lazy._add_ons()["broken"] = lazy.Lazy("pgjournal.no_such_module:app")
        runner = CliRunner()
        broken = runner.invoke(app, ["broken"])
        print("BROKEN", broken.exit_code, broken.output.replace("\\n", " "))
        fine = runner.invoke(app, ["slices", "2"])
        print("FINE", fine.exit_code)
        listed = runner.invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"})
        print("LISTED", listed.exit_code, "broken" in listed.output)
    """)
    assert "BROKEN 1" in out and "could not be loaded" in out and "no_such_module" in out, out
    assert "FINE 0" in out and "LISTED 0 True" in out, out


@pytest.mark.parametrize("argv", [["--version"], ["slices", "--help"]])
def test_the_installed_command_answers(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pgjournal", *argv], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
