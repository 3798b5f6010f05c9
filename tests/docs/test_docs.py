"""Every code block of README.md and docs/*.md runs, against a fresh database of the test server.

How the blocks run (markers and the output convention: ``tests/support/doc_blocks.py``):

- One database per Markdown file (the ``dsn`` fixture, given to every block as ``PGJOURNAL_DSN``), and the blocks
  of a file run in order, so a later block may read what an earlier one wrote.
- The ``python`` blocks of a file share one namespace, as a reader who pastes them one after another into one
  interpreter would: a block may use a name an earlier block of the same file defined (say so in the text).
  Journals still open in the namespace are closed at the end.
- ``sh`` blocks run as one bash script each (``set -euo pipefail``); ``console`` blocks run each ``$`` command
  and compare its output with the lines shown under it. Commands run in a temporary folder with the
  interpreter's folder first on ``PATH``, so ``pgjournal`` is this checkout's console script.
- Blocks marked ``<!-- spark -->`` run only in the Spark pass of their file (``pytest.mark.spark``), which runs the
  whole file again with them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import traceback
import types
from pathlib import Path

import pytest
from support.doc_blocks import Block, blocks, console_steps, output_matches, problems

from pgjournal import Journal

pytestmark = pytest.mark.mode_independent

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]
SPARK_DOCS = [path for path in DOCS if any(block.marker == "spark" for block in blocks(path))]
_OLD_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:projections|spark|migrations)\b|python -m (?:spark|projections)\b",
                         re.MULTILINE)


def _ids(paths: list[Path]) -> list[str]:
    return [str(path.relative_to(ROOT)) for path in paths]


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_every_block_runs_or_says_why_not(path: Path) -> None:
    assert problems(path) == []


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_snippets_use_the_one_namespace(path: Path) -> None:
    old = [block.where for block in blocks(path) if _OLD_IMPORT.search(block.code)]
    assert old == [], "use pgjournal.projections / pgjournal.spark, never the top-level names"


@pytest.mark.parametrize("path", [*DOCS, ROOT / "ARCHITECTURE.md", ROOT / "tests" / "README.md"],
                         ids=_ids([*DOCS, ROOT / "ARCHITECTURE.md", ROOT / "tests" / "README.md"]))
def test_relative_links_resolve(path: Path) -> None:
    """A link to a file of the repository names one that exists, and its #anchor a heading there."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert broken == []


def test_every_page_is_in_the_docs_index() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / target.partition("#")[0]).resolve()
              for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", _prose(index))}
    pages = {path.resolve() for path in (ROOT / "docs").glob("*.md") if path != index}
    assert sorted(path.name for path in pages - linked) == []


def _prose(path: Path) -> str:
    """The text outside code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", _prose(path), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_blocks_run(path: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _run_file(path, dsn, tmp_path, monkeypatch, spark=False)
    assert ran == [block.where for block in _runs(blocks(path), spark=False)]


@pytest.mark.spark
@pytest.mark.timeout(400)
@pytest.mark.parametrize("path", SPARK_DOCS, ids=_ids(SPARK_DOCS))
def test_blocks_run_with_spark(path: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgjournal.spark.system import SKIP_ENV, spark_skipped

    if spark_skipped():
        pytest.skip(f"{SKIP_ENV} is set")
    ran = _run_file(path, dsn, tmp_path, monkeypatch, spark=True)
    assert ran == [block.where for block in _runs(blocks(path), spark=True)]


def _runs(found: list[Block], *, spark: bool) -> list[Block]:
    """The blocks a pass runs: unmarked ones, Spark ones in the Spark pass, output blocks with their block."""
    runs: list[Block] = []
    for n, block in enumerate(found):
        if block.marker == "output":
            if n > 0 and runs and runs[-1] is found[n - 1]:
                runs.append(block)
        elif block.marker == "" or (block.marker == "spark" and spark):
            runs.append(block)
    return runs


def _run_file(path: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, spark: bool) -> list[str]:
    monkeypatch.setenv("PGJOURNAL_DSN", dsn)
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("docs_snippets")  # a real module, as dataclasses and pickling expect
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace: dict[str, object] = module.__dict__
    ran: list[str] = []
    last_output = ""
    try:
        for block in _runs(blocks(path), spark=spark):
            if block.marker == "output":
                assert output_matches(block.code, last_output), (
                    f"{block.where}: the output shown is not what the block above printed:\n{last_output}")
            elif block.language == "python":
                last_output = _run_python(block, namespace)
            else:
                _run_shell(block, dsn, tmp_path)
            ran.append(block.where)
    finally:
        for value in namespace.values():
            if isinstance(value, Journal):
                value.close()
    return ran


def _run_python(block: Block, namespace: dict[str, object]) -> str:
    out = io.StringIO()
    code = compile(block.code, f"{block.path.name}:{block.line}", "exec")
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    except Exception:
        pytest.fail(f"{block.where}: the block failed\n{traceback.format_exc()}\nits output:\n{out.getvalue()}",
                    pytrace=False)
    return out.getvalue()


def _env(dsn: str) -> dict[str, str]:
    env = dict(os.environ, PGJOURNAL_DSN=dsn, NO_COLOR="1", TERM="dumb", COLUMNS="200")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run_shell(block: Block, dsn: str, cwd: Path) -> None:
    steps = [(block.code, "")] if block.language == "sh" else console_steps(block.code)
    for command, expected in steps:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=_env(dsn),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (f"{block.where}: {command!r} exited {done.returncode}\n"
                                      f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
        if expected.strip():
            assert output_matches(expected, done.stdout), (
                f"{block.where}: {command!r} printed\n{done.stdout}\nnot what the block shows:\n{expected}")
