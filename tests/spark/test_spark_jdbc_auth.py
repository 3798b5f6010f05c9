"""Spark's JDBC reads of the embedded server hand its password to a SCRAM exchange only (SECURITY.md, "Spark's
JDBC path"), with the driver this machine has: Debian's PgJDBC 42.5.5 ignores ``requireAuth``, and the session's
SCRAM-only plugin (spark/scram.py) answers for it. Another local user holding the port while the server is down
(a restart) gets neither the password nor its MD5 hash nor a statement; the real server is read as before."""

from __future__ import annotations

import logging
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg.conninfo
import pytest
from support.impostor import MODES, Impostor

from pgjournal import Journal
from pgjournal.errors import ConfigurationError
from pgjournal.server.embedded import EmbeddedServer
from pgjournal.spark.read import read_events
from pgjournal.spark.system import SKIP_ENV, spark_skipped

pytestmark = [pytest.mark.spark, pytest.mark.servers, pytest.mark.mode_independent]

if spark_skipped():
    pytest.skip(f"{SKIP_ENV} is set", allow_module_level=True)

STATEMENTS = {b"Q", b"P", b"B", b"E", b"F"}


def rows(spark: Any, dsn: str) -> list[tuple[str, int]]:
    frame = read_events(spark, dsn=dsn, decode=False)
    return sorted((r["persistence_id"], r["seq_nr"]) for r in frame.select("persistence_id", "seq_nr").collect())


def test_an_impostor_on_the_port_during_a_restart_gets_no_password_from_a_spark_read(
        spark: Any, private_server: EmbeddedServer) -> None:
    server = private_server
    dsn, port, password = server.dsn, server.status().port, server._password()
    assert port is not None and password
    assert psycopg.conninfo.conninfo_to_dict(dsn)["require_auth"] == "scram-sha-256"
    with Journal.open(dsn, migrate=True) as journal:
        journal.append("Cart|1", [{"added": "socks"}, {"added": "mug"}], expected_seq_nr=0)
    assert rows(spark, dsn) == [("Cart|1", 1), ("Cart|1", 2)]

    server.stop()
    for mode in MODES:
        with Impostor(port, mode) as impostor:
            with pytest.raises(ConfigurationError) as caught:
                rows(spark, dsn)
            reached = impostor.connections
        sent = impostor.everything_sent()
        assert reached >= 1, f"{mode}: the read reached the impostor"
        assert password.encode() not in sent, f"{mode}: the password was sent"
        assert not impostor.kinds_sent() & STATEMENTS, f"{mode}: a statement reached the impostor"
        assert password not in str(caught.value)
        if mode in ("cleartext", "md5"):
            assert impostor.kinds_sent() == set(), f"{mode}: an answer to a password request"
            assert "only SCRAM-SHA-256 may have it" in str(caught.value), str(caught.value)
        else:  # a nonce and a proof bound to the impostor's salt: useless against the real server
            assert impostor.kinds_sent() <= {b"p", b"X"}, mode

    server.ensure_running()
    assert rows(spark, dsn) == [("Cart|1", 1), ("Cart|1", 2)]


def test_the_embedded_dsn_goes_to_jdbc_without_its_password_when_the_plugin_is_there(
        spark: Any, private_server: EmbeddedServer) -> None:
    from pgjournal.spark import scram
    from pgjournal.spark.jdbc import jdbc_target

    assert scram.in_session(spark)  # the tests' session is built by spark_session: the plugin is in spark.jars
    dsn, password = private_server.dsn, private_server._password()
    assert password
    guarded = jdbc_target(dsn, scram_plugin=True)
    # In the URL: Spark lower-cases the property names of a read by predicates, PgJDBC's are case-sensitive.
    _, _, query = guarded.url.partition("?")
    assert dict(urllib.parse.parse_qsl(query)) == {
        "requireAuth": "scram-sha-256",  # newer drivers refuse on their own as well
        "authenticationPluginClassName": scram.PLUGIN_CLASS,
        scram.PASSFILE_PROPERTY: str(private_server.passfile)}
    assert "password" not in guarded.properties and password not in repr(guarded) + guarded.url
    # Without the plugin (a session without its jar), or without require_auth: the password as a property.
    assert jdbc_target(dsn).properties["password"] == password
    assert jdbc_target(dsn).url.endswith("?requireAuth=scram-sha-256")
    plain = dsn.replace("require_auth=scram-sha-256&", "")
    assert "?" not in jdbc_target(plain, scram_plugin=True).url


def test_without_javac_the_session_goes_without_the_plugin_and_says_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pgjournal.spark import scram
    from pgjournal.spark.session import find_jdbc_jar

    driver = find_jdbc_jar(allow_maven=False).path
    assert driver
    monkeypatch.setattr(scram, "_built", {})
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # a JRE: no bin/javac
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=scram.__name__):
        assert scram.plugin_jar(driver) is None
    assert "no javac" in caplog.text and "password as a property" in caplog.text
