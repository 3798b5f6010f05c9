"""The code blocks of the Markdown documentation, found and checked (``tests/docs/test_docs.py`` runs them).

A fenced block may be preceded (on the line just before its fence) by one HTML comment that says how it runs:

- ``<!-- not run: REASON -->``: not run here (a cluster, Docker, Akka's Scala config, a synopsis of options);
  the reason is required.
- ``<!-- spark -->``: a Python block that needs Java and PySpark; run only in the Spark pass.
- ``<!-- output -->``: a ``text`` block that is the standard output of the Python block just before it.

Every other block runs: ``python`` blocks are executed, ``sh`` and ``console`` blocks run in bash. Any other
language without a marker is an error, so a block can be left out only by saying so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

RUNNABLE = ("python", "sh", "console")
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(not run:\s*(?P<reason>.*?)|spark|output)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str  # "", "not run", "spark" or "output"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order; a malformed marker or an unclosed fence raises."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path.name}:{start + 1}: code block never closed")
        i += 1
        marker, reason = "", ""
        previous = lines[start - 1].strip() if start > 0 else ""
        if previous.startswith("<!--"):
            matched = _MARKER.match(previous)
            if not matched:
                raise ValueError(f"{path.name}:{start}: unknown block marker {previous!r}; expected "
                                 "<!-- not run: REASON -->, <!-- spark --> or <!-- output -->")
            marker = "not run" if matched.group("reason") is not None else matched.group(1)
            reason = (matched.group("reason") or "").strip()
            if marker == "not run" and not reason:
                raise ValueError(f"{path.name}:{start}: <!-- not run: --> needs a reason")
        found.append(Block(path, start + 1, opening.group(1), "\n".join(body) + "\n", marker, reason))
    return found


def problems(path: Path) -> list[str]:
    """Blocks that could neither run nor be checked: an unmarked block of another language, an output block
    that follows no Python block, a Spark marker on a block that is not Python."""
    found = blocks(path)
    out = []
    for n, block in enumerate(found):
        if block.marker == "not run":
            continue
        if block.marker == "output":
            if block.language != "text" or n == 0 or found[n - 1].language != "python" \
                    or found[n - 1].marker == "not run":
                out.append(f"{block.where}: an <!-- output --> block must be ```text right after a Python block "
                           "that runs")
        elif block.marker == "spark" and block.language != "python":
            out.append(f"{block.where}: <!-- spark --> marks Python blocks only")
        elif block.language not in RUNNABLE:
            out.append(f"{block.where}: a ```{block.language or '(no language)'} block runs nowhere: make it "
                       f"{', '.join(RUNNABLE)} or mark it <!-- not run: REASON -->")
    return out


def output_matches(expected: str, actual: str) -> bool:
    """``expected`` lines against ``actual`` lines: ``...`` alone on a line stands for any number of lines,
    ``...`` inside a line for any text (timestamps, offsets); trailing blanks are ignored."""
    want = [line.rstrip() for line in expected.strip("\n").splitlines()]
    got = [line.rstrip() for line in actual.strip("\n").splitlines()]
    return _match(want, got)


def _match(want: list[str], got: list[str]) -> bool:
    if not want:
        return not got
    head, rest = want[0], want[1:]
    if head == "...":
        return any(_match(rest, got[k:]) for k in range(len(got) + 1))
    if not got:
        return False
    pattern = "*".join(_escape(part) for part in head.split("..."))
    return fnmatchcase(got[0], pattern) and _match(rest, got[1:])


def _escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def console_steps(code: str) -> list[tuple[str, str]]:
    """A ``console`` block as (command, expected output) pairs: ``$ `` starts a command, a line ending in
    ``\\`` continues it, and the lines up to the next ``$ `` are its output (checked when there are any)."""
    steps: list[tuple[str, list[str]]] = []
    continuing = False
    for line in code.splitlines():
        if continuing:
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            steps.append((line[2:], []))
            continuing = line.endswith("\\")
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block: output {line!r} before any $ command")
    return [(command, "\n".join(output)) for command, output in steps]
