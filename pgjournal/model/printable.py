"""Text that a terminal shows as it is: names from the database or the user with their control characters made
visible, so a persistence id holding ``ESC [2J`` cannot clear the screen nor one holding a newline pass for
two names."""

from __future__ import annotations

# Python's idea of printable: not C0, DEL or C1 (Cc), format characters (Cf: bidi embeddings, overrides and
# isolates, zero-width characters, soft hyphen, BOM, tag characters), line and paragraph separators (Zl, Zp),
# spaces other than ' ' (Zs: a no-break space passes for a space), surrogates, private-use and unassigned code
# points (tomorrow's format characters).
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _hidden(char: str) -> bool:
    return not char.isprintable() and char != " "


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object) -> str:
    """``text`` with every character a terminal would act on or hide written as a visible escape (``\\x1b``,
    ``\\n``, ``\\u202e``); other text, backslashes included, stays as it is."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(_escape(c) if _hidden(c) else c for c in text)


def json_printable(encoded: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the characters :func:`printable` escapes written
    as ``\\uXXXX``: the same JSON, safe on a terminal. (JSON escapes C0 itself, not DEL, C1 or format characters;
    outside its strings JSON text holds none of them.)"""
    if encoded.isprintable():
        return encoded
    return "".join("".join(f"\\u{unit:04x}" for unit in _utf16(c)) if _hidden(c) else c for c in encoded)


def _utf16(char: str) -> list[int]:
    data = char.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]
