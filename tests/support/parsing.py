"""Python source parsed in a child interpreter that does nothing else.

CPython 3.11 keeps the AST constructor's recursion count per interpreter, not per thread: when another thread builds
a tree at the same moment (3.11's traceback formatting parses a failing line to place its carets), the check at the
end fails with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). A long test run has
such threads, and a thread of the test's own did not help (CI saw it again); a child process has no other thread."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

_CHILD = ("import ast, pickle, sys\n"
          "pickle.dump([ast.parse(s) for s in pickle.load(sys.stdin.buffer)], sys.stdout.buffer)\n")

_files: dict[Path, ast.Module] = {}


def parse_all(sources: Iterable[str]) -> list[ast.Module]:
    """The module tree of each source, parsed in one child process."""
    done = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps(list(sources)), capture_output=True,
                          check=True, timeout=120)
    trees: list[ast.Module] = pickle.loads(done.stdout)
    return trees


def parse(source: str) -> ast.Module:
    return parse_all([source])[0]


def parse_file(path: Path) -> ast.Module:
    """The tree of one file (parsed once per run; ``parse_files`` first to parse many in one child)."""
    return parse_files([path])[path]


def parse_files(paths: Iterable[Path]) -> dict[Path, ast.Module]:
    wanted = list(paths)
    new = [path for path in dict.fromkeys(wanted) if path not in _files]
    if new:
        _files.update(zip(new, parse_all(path.read_text() for path in new), strict=True))
    return {path: _files[path] for path in wanted}
