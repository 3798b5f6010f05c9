"""docs/settings.md documents every field of ``Settings`` with its default, and nothing that is not one."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from pgjournal.settings import Settings

pytestmark = pytest.mark.mode_independent

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
_ROW = re.compile(r"^\|\s*`(?P<name>[a-z_]+)`\s*\|\s*(?P<default>[^|]*?)\s*\|")


def default_text(value: object) -> str:
    """How the reference writes a default: ``true``/``false``, numbers as Python prints them (``10.0`` as ``10``),
    strings quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def documented() -> dict[str, str]:
    rows = {}
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        matched = _ROW.match(line)
        if matched:
            assert matched["name"] not in rows, f"{matched['name']} is documented twice"
            rows[matched["name"]] = matched["default"].strip("`")
    return rows


def test_every_setting_is_documented_with_its_default() -> None:
    expected = {f.name: default_text(f.default) for f in fields(Settings) if f.default is not MISSING}
    assert len(expected) == len(fields(Settings))
    rows = documented()
    missing = sorted(set(expected) - set(rows))
    assert missing == [], "add rows: " + "; ".join(f"| `{n}` | `{expected[n]}` | ... |" for n in missing)
    unknown = sorted(set(rows) - set(expected))
    assert unknown == [], f"documented but not in Settings: {unknown}"
    wrong = {name: (rows[name], expected[name]) for name in expected if rows[name] != expected[name]}
    assert wrong == {}, "(documented, actual) defaults differ"


def test_default_text() -> None:
    assert [default_text(v) for v in (True, 10.0, 0.002, 1000, "Hour", "")] == \
        ["true", "10", "0.002", "1000", '"Hour"', '""']
