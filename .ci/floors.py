"""Print a pip constraints file pinning every dependency of pyproject.toml (and of the extras named on the command
line) to its declared floor: `name>=X` becomes `name==X`. Installing with it is what `uv pip install
--resolution lowest-direct` does (direct dependencies at their floors, the rest resolved as usual), with pip alone.

    python .ci/floors.py spark dev > floors.txt && pip install -c floors.txt -e '.[spark,dev]'
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def floors(pyproject: Path, extras: list[str]) -> dict[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pinned: dict[str, str] = {}
    for requirement in requirements:
        match = REQUIREMENT.match(requirement.split(";")[0])
        if match is None:
            raise SystemExit(f"cannot read the requirement {requirement!r}")
        name, specs = match.group(1).lower().replace("_", "-"), match.group(2)
        lower = [spec.strip()[2:].strip() for spec in specs.split(",") if spec.strip().startswith(">=")]
        if not lower:
            raise SystemExit(f"{requirement!r} declares no floor (>=): every dependency must have one")
        pinned[name] = lower[0]
    return pinned


if __name__ == "__main__":
    for name, version in floors(Path(__file__).resolve().parent.parent / "pyproject.toml", sys.argv[1:]).items():
        print(f"{name}=={version}")
