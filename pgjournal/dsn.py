"""Connection strings: where the DSN comes from, checking it, and never showing its password."""

from __future__ import annotations

import os
import re

import psycopg.conninfo

from .errors import ConfigurationError

DSN_ENV = "PGJOURNAL_DSN"

_URL_PASSWORD = re.compile(r"(?P<head>postgres(?:ql)?://[^:/@?#\s]*:)(?P<pw>[^@/?#\s]*)(?=@)")
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&#\s]*)", re.IGNORECASE)


def mask_dsn(text: str) -> str:
    """Replace every password in ``text`` (URL, key=value or query-parameter form) with ``***``."""
    for pattern in (_URL_PASSWORD, _KV_PASSWORD, _QUERY_PASSWORD):
        text = pattern.sub(lambda m: m.group("head") + ("***" if m.group("pw") else ""), text)
    return text


def check_dsn(dsn: str) -> str:
    """Return ``dsn`` if libpq can parse it, else raise :class:`ConfigurationError` (password masked)."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError(f"DSN must be a non-empty connection string, got {dsn!r}")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        reason = mask_dsn(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise ConfigurationError(
            f"malformed DSN {mask_dsn(dsn)!r}: {reason}; expected postgresql://user@host:port/db "
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
