"""Text that a terminal shows as it is: names from the database or the user with their control characters made
visible, so a persistence id holding ``ESC [2J`` cannot clear the screen nor one holding a newline pass for
two names."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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


class _Shown:
    """A log record's argument as ``%s`` shows it: :func:`printable` (``%r`` is the value's own ``repr``, which
    already escapes what is not printable)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return printable(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


class PrintableRecords(logging.Filter):
    """Log records as the CLI prints names: a persistence id, tag, writer id or error message from the database or
    the user, formatted into a record with ``%s``, has its control characters written as visible escapes, so it
    can neither drive the terminal (``ESC ]``, ``ESC [2J``) nor forge a line (a newline). Numbers pass as they
    are (``%d``, ``%.1f`` still format them); a traceback attached to the record is escaped line by line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = printable(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(a if isinstance(a, (int, float)) else _Shown(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: v if isinstance(v, (int, float)) else _Shown(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = _traceback(record.exc_info)
        if record.stack_info:
            record.stack_info = _lines(record.stack_info)
        return True


_FORMATTER = logging.Formatter()
_RECORDS = PrintableRecords()


def _lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.splitlines())


def _traceback(exc_info: Any) -> str:
    """The traceback as logging formats it, each exception's message of the chain on one line (a newline in it
    would start a line of the attacker's), then every line escaped."""
    text = _FORMATTER.formatException(exc_info)
    exc, seen = exc_info[1], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        try:
            message = str(exc)
        except Exception:  # a message that cannot be made: logging shows what it can
            message = ""
        if message and printable(message) != message:
            text = text.replace(message, printable(message))
        exc = exc.__cause__ or exc.__context__
    return _lines(text)


def printable_logger(name: str) -> logging.Logger:
    """The logger of ``name`` with :class:`PrintableRecords`: every pgjournal module logs through one (a filter
    on a logger applies to the records logged on it, not on its children, so each gets its own)."""
    logger = logging.getLogger(name)
    if _RECORDS not in logger.filters:
        logger.addFilter(_RECORDS)
    return logger
