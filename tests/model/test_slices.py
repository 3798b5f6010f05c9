"""Slices must agree bit for bit with Akka's sliceForPersistenceId, for every string."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pgjournal import InvalidArgument, entity_type_of, slice_for_persistence_id, slice_ranges
from pgjournal.model.slices import java_string_hash, parse_slice_range

pytestmark = pytest.mark.mode_independent


def reference_hash(text: str) -> int:
    """An independent Java String.hashCode: code points split into surrogate pairs by arithmetic, and
    the sum s[0]*31^(n-1) + ... computed with unbounded integers, wrapped once at the end."""
    units: list[int] = []
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


def reference_slice(text: str) -> int:
    return abs(int(math.fmod(reference_hash(text), 1024)))  # truncated remainder, then abs


def utf16_units(text: str) -> list[int]:
    data = text.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


@given(st.text(max_size=300))
@example("x" * 255)
@example("🛒|cart-😀-𝄞")
@example("polygenelubricants")  # hashCode is Integer.MIN_VALUE
@example("\ud800 lone surrogate")
def test_slice_matches_independent_reference(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)
    assert slice_for_persistence_id(text) == reference_slice(text)
    assert 0 <= slice_for_persistence_id(text) < 1024


def test_well_known_hash_codes() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert slice_for_persistence_id("polygenelubricants") == 0


def test_non_bmp_characters_count_as_two_code_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16.
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00


@pytest.mark.servers
@pytest.mark.skipif(shutil.which("java") is None, reason="no Java to ask")
def test_slice_matches_the_jvm() -> None:
    """The JVM itself is the oracle: String.hashCode and Math.abs(h % 1024) for 3,000 random strings,
    including non-BMP characters and lone surrogates (Python strings may hold them; Java strings too)."""
    rng = random.Random(20261121)
    alphabet = [chr(c) for c in (*range(32, 127), 0xE9, 0x4E2D, 0xD800, 0xDFFF, 0xFFFF)] + ["😀", "𝄞", "🛒"]
    texts = ["", "polygenelubricants", "Cart|1", "x" * 255] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(3000)
    ]
    stdin = "\n".join(" ".join(f"{u:04x}" for u in utf16_units(t)) for t in texts) + "\n"
    source = Path(__file__).parent / "java" / "SliceOracle.java"
    result = subprocess.run(
        ["java", str(source)], input=stdin, capture_output=True, text=True, timeout=120, check=True
    )
    jvm = [tuple(map(int, line.split())) for line in result.stdout.splitlines()]
    ours = [(java_string_hash(t), slice_for_persistence_id(t)) for t in texts]
    assert ours == jvm


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
def test_slice_ranges_cover_everything_once(n: int) -> None:
    ranges = slice_ranges(n)
    assert len(ranges) == n
    assert [s for lo, hi in ranges for s in range(lo, hi + 1)] == list(range(1024))


def test_slice_ranges_of_four_match_akka() -> None:
    assert slice_ranges(4) == [(0, 255), (256, 511), (512, 767), (768, 1023)]


@pytest.mark.parametrize("n", [0, -4, 3, 5, 1000, 2048, 2.0, "4", True, None])
def test_slice_ranges_rejects_non_divisors(n: object) -> None:
    with pytest.raises(InvalidArgument, match="slice ranges"):
        slice_ranges(n)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pid", "entity_type"),
    [("Cart|1", "Cart"), ("Cart|a|b", "Cart"), ("nopipe", ""), ("|x", ""), ("", "")],
)
def test_entity_type_is_text_before_first_pipe(pid: str, entity_type: str) -> None:
    assert entity_type_of(pid) == entity_type


@pytest.mark.parametrize(("text", "expected"), [("0-255", (0, 255)), ("17", (17, 17)), (" 3-3 ", (3, 3))])
def test_parse_slice_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_slice_range(text) == expected


@pytest.mark.parametrize("text", ["255-0", "0-1024", "-1", "a-b", "", "0-"])
def test_parse_slice_range_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_slice_range(text)
