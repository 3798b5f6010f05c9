"""pgjournal's server-side statement timeout travels in libpq's ``options``, which replaces the ``options`` of
the DSN or of ``PGOPTIONS``: theirs must be kept in front of it on every connection pgjournal makes (pools of
both faces, connections of their own, the key store), or a user's ``-c TimeZone=...`` is silently dropped."""

from __future__ import annotations

import psycopg
import pytest
from support import FAST

from pgjournal import Journal
from pgjournal.aio import AsyncJournal
from pgjournal.server.connections import connect

pytestmark = pytest.mark.mode_independent

SETTINGS = {**FAST, "statement_timeout": 7.0}


def with_options(dsn: str, options: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=options)


def shown(conn: psycopg.Connection) -> tuple[str, str]:
    zone = conn.execute("SHOW TimeZone").fetchone()
    timeout = conn.execute("SHOW statement_timeout").fetchone()
    assert zone is not None and timeout is not None
    return zone[0], timeout[0]


def test_the_dsns_options_are_kept_beside_the_statement_timeout(dsn: str) -> None:
    given = with_options(dsn, "-c TimeZone=Asia/Kolkata")
    with Journal.open(given, **SETTINGS) as journal:
        with journal.connection() as conn:
            assert shown(conn) == ("Asia/Kolkata", "7s")
        own = journal.open_connection()
        try:
            assert shown(own) == ("Asia/Kolkata", "7s")
        finally:
            own.close()
    with connect(given, journal.settings, statement_timeout=True) as conn:
        assert shown(conn) == ("Asia/Kolkata", "7s")


async def test_the_asyncio_pool_keeps_them_too(dsn: str) -> None:
    async with AsyncJournal.open(with_options(dsn, "-c TimeZone=America/Lima"), **SETTINGS) as journal, \
            journal.connection() as conn:
        zone = await (await conn.execute("SHOW TimeZone")).fetchone()
        timeout = await (await conn.execute("SHOW statement_timeout")).fetchone()
        assert (zone, timeout) == (("America/Lima",), ("7s",))


def test_pgoptions_is_kept_when_the_dsn_has_none(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c TimeZone=Pacific/Auckland")
    with Journal.open(dsn, **SETTINGS) as journal, journal.connection() as conn:
        assert shown(conn) == ("Pacific/Auckland", "7s")
