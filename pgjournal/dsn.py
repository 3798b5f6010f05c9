"""Connection strings: where the DSN comes from, checking it, and never showing its password."""

from __future__ import annotations

import os
import re

import psycopg.conninfo

from .errors import ConfigurationError

DSN_ENV = "PGJOURNAL_DSN"

# libpq reads the password of a URL up to the '@' ('?' and '#' included); an unencoded '/' is masked too.
_URL_PASSWORD = re.compile(r"(?P<head>postgres(?:ql)?://[^:/@?#\s]*:)(?P<pw>[^@\s]*)(?=@)")
# The whole password-ish part of a (possibly malformed) URL DSN: up to its last '@'.
_URL_SECRET = re.compile(r"^\s*postgres(?:ql)?://[^:/@?#\s]*:(?P<pw>.+)@", re.DOTALL)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&#\s]*)", re.IGNORECASE)


def mask_dsn(text: str) -> str:
    """Replace every password in ``text`` (URL, key=value or query-parameter form) with ``***``."""
    for pattern in (_URL_PASSWORD, _KV_PASSWORD, _QUERY_PASSWORD):
        text = pattern.sub(lambda m: m.group("head") + ("***" if m.group("pw") else ""), text)
    return text


def redact(text: str, dsn: str) -> str:
    """:func:`mask_dsn` of ``text``, also removing ``dsn``'s password where ``text`` quotes it on its own
    (libpq's parse errors do: ``unexpected spaces found in "<password>"``)."""
    secrets = [m.group("pw") for m in (_URL_SECRET.match(dsn),) if m]
    secrets += [m.group("pw").strip("'") for pattern in (_KV_PASSWORD, _QUERY_PASSWORD)
                for m in pattern.finditer(dsn)]
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:  # shorter ones would garble the message and protect nothing
            text = text.replace(secret, "***")
    return mask_dsn(text)


def check_dsn(dsn: str) -> str:
    """Return ``dsn`` if libpq can parse it, else raise :class:`ConfigurationError` (password masked)."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError(f"DSN must be a non-empty connection string, got {dsn!r}")
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
    from .embedded import EmbeddedServer

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
