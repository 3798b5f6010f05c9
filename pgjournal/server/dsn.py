"""Connection strings: where the DSN comes from, checking it, and never showing its password."""

from __future__ import annotations

import os
import re
import urllib.parse

from pgjournal.errors import ConfigurationError

DSN_ENV = "PGJOURNAL_DSN"
#: Where the databases of a journal sharded by slice range are named (``RANGE=DSN``, one a line).
SHARDS_ENV = "PGJOURNAL_SHARDS"

MASK = "***"
#: The libpq parameters that hold a secret: the password, and the pass phrase of the client's SSL key.
SECRET_KEYS = ("password", "sslpassword")

# Where a secret starts, in the three forms libpq reads (leftmost first; a query parameter before the bare
# keyword it contains): ``?password=`` / ``&password=`` in a URL, ``password =`` in key=value form, and a URL's
# ``user:`` (a user name holds no ':', '/', '@' or '[', so ``postgresql://host:5432`` and ``[::1]:5432`` are
# told from it by what follows).
_SECRET_START = re.compile(
    r"(?P<query>[?&](?:ssl)?password=)"
    r"|(?P<keyword>\b(?:ssl)?password\s*=\s*)"
    r"|(?P<url>postgres(?:ql)?://[^:/@?#\[\]\s]*:)",
    re.IGNORECASE)
_PORT = re.compile(r"\d*(?:[,/?]|$)")
_NEXT_KEYWORD = re.compile(r"\s+\w+\s*=")
_PUNCTUATION = re.compile(r"['\"]?:?$")  # what closes a DSN quoted in a message: 'postgresql://...': reason


def mask_dsn(text: str) -> str:
    """``text`` with every password in it (URL, key=value or query-parameter form) replaced by ``***``.

    ``text`` that is a connection string on its own is masked as libpq reads it, and as its writer meant it:
    a URL's password runs from ``user:`` to the last '@' (an unencoded '@', ':', '/', '?' or space in it is
    masked too), a key=value password to the end of its quoted (escaped quotes included) or unquoted value, a
    query parameter to the next '&'. A message that quotes a connection string is masked word by word: a URL's
    password runs to the last '@' before a space; a quoted key=value or encoded query value as above.
    """
    if not text:
        return text
    params = _parsed(text.strip())
    whole = params is not None or (text.strip().lower().startswith(("postgres://", "postgresql://"))
                                   and not _starts_a_message(text.strip()))
    masked = _mask(text, whole=whole)
    if params is not None and any(params.get(key) for key in SECRET_KEYS):
        after = _parsed(masked.strip())
        if after is None or any(after.get(key) not in (None, "", MASK) for key in SECRET_KEYS):
            # A form the masking above did not foresee: show what libpq parsed instead, secrets masked.
            import psycopg.conninfo

            return psycopg.conninfo.make_conninfo(
                "", **{k: (MASK if k in SECRET_KEYS else v) for k, v in params.items()})
    return masked


def _starts_a_message(text: str) -> bool:
    """``text`` is a message that opens with a connection string libpq reads, then ``:`` and what it says
    (``postgresql://h/db?password=x: connection refused``): masked as a message, so what follows the DSN stays."""
    first, _, rest = text.partition(" ")
    # A URL whose password holds a space: ``user: p w@host/db``, ``user: /x@host``, ``user:@: x@host``.
    at = text.rfind("@")
    spaced = ("@" not in first and "@" in rest.split("/")[0]) or (at > len(first) and _a_url_tail(text[at + 1:]))
    if "://" in first and spaced:
        return False
    return first.endswith(":") and bool(rest.strip()) and _parsed(first[:-1]) is not None


def _a_url_tail(tail: str) -> bool:
    """``tail`` reads as what follows a URL's last '@': hosts, database and parameters libpq reads, with no white
    space (a message's reason has some)."""
    return bool(tail) and not any(c.isspace() for c in tail) and _parsed(f"postgresql://u@{tail}") is not None


def _parsed(dsn: str) -> dict[str, str] | None:
    """What libpq reads in ``dsn``, or ``None`` when it is not a connection string libpq accepts."""
    if not dsn or ("=" not in dsn and "://" not in dsn):  # libpq would take a bare word for a database name
        return None
    import psycopg.conninfo  # here, not above: the command line imports this module on every run

    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    except (psycopg.Error, ValueError, TypeError):
        return None


def _secret_spans(text: str, *, whole: bool) -> list[tuple[int, int]]:
    """Where the secrets of ``text`` are: (start, end) of each, left to right, none overlapping."""
    spans = []
    pos = 0
    while (match := _SECRET_START.search(text, pos)) is not None:
        start = match.end()
        if match.group("query"):
            end = _query_value_end(text, start, whole=whole)
        elif match.group("keyword"):
            end = _keyword_value_end(text, start, whole=whole)
        else:
            end = _url_password_end(text, start, whole=whole)
        if end > start:
            spans.append((start, end))
        pos = max(end, start)
    return spans


def _query_value_end(text: str, start: int, *, whole: bool) -> int:
    if whole:  # libpq: a parameter's value runs to the next '&'
        amp = text.find("&", start)
        return len(text) if amp < 0 else amp
    end = start
    while end < len(text) and text[end] not in "&# \t\r\n":
        end += 1
    return end - len(_PUNCTUATION.search(text[start:end]).group())  # type: ignore[union-attr]


def _keyword_value_end(text: str, start: int, *, whole: bool) -> int:
    """libpq's reading of a key=value value: quoted (ends at an unescaped quote, or the end of the text when
    unterminated) or unquoted (ends at white space); a backslash escapes the next character in both."""
    end = start
    quoted = end < len(text) and text[end] == "'"
    if quoted:
        end += 1
    while end < len(text):
        char = text[end]
        if char == "\\":
            end += 2
            continue
        if quoted and char == "'":
            return end + 1
        if not quoted and char.isspace():
            break
        end += 1
    end = min(end, len(text))
    if not whole and not quoted and text[start:end].endswith(":") and not _NEXT_KEYWORD.match(text, end):
        end -= 1  # 'password=***: reason' in a message; 'password=x: dbname=db' is another value
    return end


def _url_password_end(text: str, start: int, *, whole: bool) -> int:
    """A URL's password: to the last '@' (of the text when it is a DSN on its own, of the word in a message);
    without one, a port (``host:5432/db``) is no password and anything else is masked (to the end of the text,
    or of the word)."""
    if whole:
        at = text.rfind("@", start)
        if at >= 0:
            return at
        return start if _PORT.match(text, start) else len(text.rstrip())
    word_end = start
    while word_end < len(text) and not text[word_end].isspace():
        word_end += 1
    at = text.rfind("@", start, word_end)
    if at >= 0:
        return at
    if _PORT.match(text[start:word_end]):
        return start
    return word_end - len(_PUNCTUATION.search(text[start:word_end]).group())  # type: ignore[union-attr]


def _mask(text: str, *, whole: bool) -> str:
    pieces = []
    pos = 0
    for start, end in _secret_spans(text, whole=whole):
        pieces += [text[pos:start], MASK]
        pos = end
    return "".join(pieces) + text[pos:]


_PIECES = re.compile(r"[@:/?#&=,\s'\\]+")


def _secrets(dsn: str) -> set[str]:
    """Every way ``dsn``'s secrets could be quoted in a message: as written (quoted or percent-encoded), and as
    libpq reads them."""
    found = set()
    for start, end in _secret_spans(dsn, whole=True):
        raw = dsn[start:end]
        unquoted = raw.strip("'")
        found |= {raw, unquoted, re.sub(r"\\(.)", r"\1", unquoted, flags=re.DOTALL), urllib.parse.unquote(raw)}
        # libpq splits an unencoded password at '@', ':', '/' or '?' and may quote a piece as a host, port or
        # database name ("failed to resolve host 'horse'")
        found |= set(_PIECES.split(raw))
    params = _parsed(dsn.strip()) or {}
    found |= {params[key] for key in SECRET_KEYS if params.get(key)}
    return found


def redact(text: str, dsn: str) -> str:
    """``text`` (a message about ``dsn``) with ``dsn``'s secrets gone wherever it quotes them: the DSN itself
    masked, its password quoted on its own (libpq's parse errors do: ``unexpected spaces found in
    "<password>"``) replaced, and :func:`mask_dsn` of the rest."""
    parts = text.split(dsn) if dsn else [text]
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        if len(secret) >= 3:  # shorter ones would garble the message and protect nothing
            parts = [part.replace(secret, MASK) for part in parts]
    return mask_dsn(mask_dsn(dsn).join(parts))


def check_dsn(dsn: str) -> str:
    """Return ``dsn`` if libpq can parse it, else raise :class:`ConfigurationError` (password masked)."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError(f"DSN must be a non-empty connection string, got {dsn!r}")
    import psycopg.conninfo

    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        reason = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, dsn)
        raise ConfigurationError(
            f"malformed DSN {redact(dsn, dsn)!r}: {reason}; expected postgresql://user@host:port/db "
            "or 'host=... dbname=...'"
        ) from None
    return dsn


def configured_dsn(dsn: str | None = None) -> str | None:
    """The DSN given, else ``$PGJOURNAL_DSN``, else ``None`` (meaning: use the embedded server)."""
    chosen = dsn if dsn is not None else os.environ.get(DSN_ENV) or None
    return check_dsn(chosen) if chosen is not None else None


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN to connect to, starting (or finding) the embedded server when none is configured."""
    chosen = configured_dsn(dsn)
    if chosen is not None:
        return chosen
    from pgjournal.server.embedded import EmbeddedServer

    return EmbeddedServer.default().ensure_running().dsn


def _pgpass_fields(line: str) -> list[str]:
    """The five fields of a password-file line (``host:port:db:user:password``; ``\\:`` and ``\\\\`` escaped)."""
    fields: list[str] = []
    current: list[str] = []
    chars = iter(line)
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char == ":" and len(fields) < 4:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    return [*fields, "".join(current)]


def dsn_password(dsn: str) -> str | None:
    """The password libpq would send for ``dsn``: its ``password``, else the matching line of its password file
    (``passfile``, as the embedded server's DSN names, else ``$PGPASSFILE``). For clients that are not libpq
    (Spark's JDBC driver, the benchmark's reference library)."""
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(check_dsn(dsn))
    if params.get("password"):
        return str(params["password"])
    passfile = params.get("passfile") or os.environ.get("PGPASSFILE")
    if not passfile:
        return None
    try:
        with open(str(passfile), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    wanted = [str(params.get("host") or "localhost"), str(params.get("port") or "5432"),
              str(params.get("dbname") or params.get("user") or ""), str(params.get("user") or "")]
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        fields = _pgpass_fields(line)
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields, wanted, strict=False)):
            return fields[4]
    return None
