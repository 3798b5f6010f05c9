"""The wheel as a user gets it: built from the working tree, installed into a fresh venv outside the repository,
and used from another folder. It installs one namespace (``pgjournal``: the repository's ``projections/``,
``spark/`` and ``migrations/`` inside it), carries its migrations and its version, and appends and reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pgjournal

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(300), pytest.mark.mode_independent, pytest.mark.servers, pytest.mark.one_worker]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def source_copy(target: Path) -> Path:
    """The tracked files of the working tree (links kept as links), so no build/ left by an earlier build leaks
    into the wheel."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src, dst = ROOT / name, target / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = source_copy(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", out, ".",
        cwd=source)
    (built,) = out.glob("pgjournal-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", home, cwd=home)
    run(home / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, cwd=home)
    yield home


def test_the_wheel_holds_one_namespace_with_its_migrations_and_types(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"pgjournal", f"pgjournal-{pgjournal.__version__}.dist-info"}
    for shipped in ("pgjournal/py.typed", "pgjournal/migrations/env.py", "pgjournal/migrations/script.py.mako",
                    "pgjournal/migrations/versions/0001_core.py", "pgjournal/projections/runner.py",
                    "pgjournal/spark/source.py"):
        assert shipped in names
    top_level = zipfile.ZipFile(wheel).read(f"pgjournal-{pgjournal.__version__}.dist-info/top_level.txt")
    assert top_level.decode().split() == ["pgjournal"]


def test_installed_outside_the_repository_it_migrates_appends_and_reads(venv: Path, empty_dsn: str,
                                                                        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGJOURNAL_DSN")}
    python, cli = venv / "bin" / "python", venv / "bin" / "pgjournal"
    assert run(cli, "--version", cwd=tmp_path, env=env).strip() == f"pgjournal {pgjournal.__version__}"
    assert "schema is at revision" in run(cli, "migrate", "--dsn", empty_dsn, cwd=tmp_path, env=env)
    script = """
import importlib.util, json, sys
import pgjournal
from pgjournal import Journal
with Journal.open(sys.argv[1]) as journal:
    journal.append("Cart|42", [{"added": "socks"}], expected_seq_nr=0)
    events = [e.event for e in journal.query.current_events_by_persistence_id("Cart|42")]
print(json.dumps({
    "file": pgjournal.__file__, "version": pgjournal.__version__, "events": events,
    "add_ons": [importlib.util.find_spec(n) is not None for n in ("pgjournal.projections", "pgjournal.spark")],
    "stray": [n for n in ("projections", "spark", "migrations") if importlib.util.find_spec(n) is not None],
}))
"""
    seen = json.loads(run(python, "-c", script, empty_dsn, cwd=tmp_path, env=env))
    assert Path(seen["file"]).is_relative_to(venv)  # the installed copy, not the checkout
    assert seen["version"] == pgjournal.__version__
    assert seen["events"] == [{"added": "socks"}]
    assert seen["add_ons"] == [True, True]
    assert seen["stray"] == []
