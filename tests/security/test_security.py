"""Security: parameterised statements (SQL-injection strings stored verbatim, tables intact), passwords
never in logs, errors or CLI output, and least-privilege roles applied to a real database."""

from __future__ import annotations

import ast
import logging
import pathlib
import re
import threading
import uuid

import psycopg
import psycopg.conninfo
import pytest
from support import FAST, SECRET, Roles, create_login_role, role_dsn
from support.eventually import eventually
from support.faultproxy import fault_proxy
from support.parsing import parse, parse_files
from support.tags import tags_written
from typer.testing import CliRunner

from pgjournal import ConfigurationError, DatabaseUnavailable, Journal, JournalError
from pgjournal.admin.roles import apply_roles, check_role_name, role_script
from pgjournal.admin.verify import verify
from pgjournal.cli.commands import app
from pgjournal.projections import management
from pgjournal.projections.examples import counter_writer, ensure_counter_table
from pgjournal.projections.handlers import Projection
from pgjournal.projections.offset_store import OffsetStore

HOSTILE = [
    "'; DROP TABLE event_journal; --",
    "Robert'); DROP TABLE snapshot;--",
    '" OR 1=1 --',
    "$$; DROP TABLE event_journal; $$",
    "%s %(pid)s {table} {0}",
    "\\'; SELECT pg_sleep(10); --",
    "' UNION SELECT usename, passwd FROM pg_shadow --",
    "x' OR 'a'='a",
    "1; TRUNCATE event_journal",
    "\\x00\\\\ E'\\047'",
    "pg_catalog.pg_class",
    "ñ'ö\"ü;--∂",
]


def table_names(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}


# -- every statement parameterised ----------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE)
def test_injection_strings_are_stored_and_read_back_verbatim(journal: Journal, dsn: str, hostile: str) -> None:
    before = table_names(dsn)
    pid = f"{hostile}|{hostile}"
    written = journal.append(pid, [{"text": hostile}], expected_seq_nr=0, tags=[hostile, "plain"],
                             metadata=hostile)
    journal.append(pid, [hostile], expected_seq_nr=1)
    journal.save_snapshot(pid, 2, {"s": hostile})
    assert written[0].entity_type == hostile
    # Read back through every query that takes these strings, and directly.
    assert [e.event for e in journal.query.current_events_by_persistence_id(pid)] == [{"text": hostile}, hostile]
    # current_events_by_slices ends at the safe bound, a few ms behind the clock
    eventually(lambda: [e.persistence_id for e in journal.query.current_events_by_slices(hostile, 0, 1023)]
               == [pid, pid], "both events read by slice")
    assert pid in list(journal.query.current_persistence_ids(after=hostile[:1] if hostile else None, limit=1000))
    assert journal.highest_seq_nr(pid) == 2
    assert journal.load_snapshot(pid).snapshot == {"s": hostile}  # type: ignore[union-attr]
    tags_written(journal)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT persistence_id, entity_type, tags FROM event_journal WHERE seq_nr = 1").fetchone()
        tag_rows = conn.execute("SELECT tag_name FROM tag_views ORDER BY tag_name").fetchall()
    assert row == (pid, hostile, [hostile, "plain"])
    assert sorted([hostile, "plain"]) == [r[0] for r in tag_rows]
    assert journal.delete_events(pid, 1) == 1
    assert table_names(dsn) == before
    assert verify(journal).ok


@pytest.mark.parametrize("hostile", HOSTILE[:6])
def test_injection_strings_as_projection_names_are_stored_verbatim(journal: Journal, dsn: str, hostile: str) -> None:
    before = table_names(dsn)
    ensure_counter_table(journal)
    projection = Projection(hostile, hostile, counter_writer(hostile))
    management.pause(journal, projection.name)
    assert management.list_projections(journal) == [hostile]
    store = OffsetStore(journal, hostile, hostile, 0, 1023, time_window=60)
    with journal.connection() as conn:
        assert store.load(conn) is None
    management.resume(journal, hostile)
    assert management.clear_offset(journal, hostile) == 0
    with psycopg.connect(dsn) as conn:
        names = conn.execute("SELECT projection_name FROM projection_management").fetchall()
    assert names == [(hostile,)]
    assert table_names(dsn) - {"projection_counter"} == before


def test_injection_strings_through_the_cli_are_stored_verbatim(dsn: str) -> None:
    runner = CliRunner()
    before = table_names(dsn)
    for n, hostile in enumerate(HOSTILE):
        pid = f"{hostile}|cli{n}"
        result = runner.invoke(app, ["append", pid, '"e"', "--tag", hostile, "--dsn", dsn])
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["events", pid, "--dsn", dsn])
        assert result.exit_code == 0 and '"seq_nr": 1' in result.output, result.output
    with psycopg.connect(dsn) as conn:
        stored = {r[0] for r in conn.execute("SELECT persistence_id FROM event_journal").fetchall()}
    assert stored == {f"{h}|cli{n}" for n, h in enumerate(HOSTILE)}
    assert table_names(dsn) == before


# -- passwords never shown -------------------------------------------------------------------------



def with_password(dsn: str, role: str) -> list[str]:
    """``dsn`` as ``role`` with its password, in key=value form and as a URL."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    from urllib.parse import quote

    url = f"postgresql://{role}:{quote(SECRET, safe='')}@{params['host']}:{params['port']}/{params['dbname']}"
    return [role_dsn(dsn, role, SECRET), url]


def _assert_no_secret(text: str) -> None:
    from urllib.parse import quote

    for form in (SECRET, quote(SECRET, safe=""), quote(SECRET), "s3cr3t"):
        assert form not in text, f"password leaked: ...{text[max(0, text.find(form) - 80):text.find(form) + 40]}..."


@pytest.mark.parametrize("form", [0, 1], ids=["key-value", "url"])
def test_passwords_never_reach_logs_errors_or_cli_output(dsn: str, form: int, secret_role: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    secret_dsn = with_password(dsn, secret_role)[form]
    runner = CliRunner()
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG):
        # A working session through a proxy that cuts connections: pool and polling log their troubles.
        with fault_proxy(secret_dsn) as (proxy, via), Journal.open(via, connect_timeout=1, **FAST) as journal:
            seen.append(repr(journal))
            journal.append("Cart|1", ["a"], expected_seq_nr=0)
            query = journal.query.events_by_slices("Cart", 0, 1023)
            got: list[object] = []
            thread = threading.Thread(target=lambda: [got.append(e) for e in query], daemon=True)
            thread.start()
            eventually(lambda: got, "the live query delivered the first event")
            proxy.refuse(True)
            proxy.cut()
            for call in (lambda: journal.append("Cart|1", ["b"], expected_seq_nr=1),
                         lambda: journal.highest_seq_nr("Cart|1")):
                with pytest.raises(JournalError) as failed:
                    call()
                seen.append(str(failed.value))
            eventually(lambda: "live query poll failed" in caplog.text, "the live query met the fault", timeout=10)
            proxy.refuse(False)
            query.close()
            thread.join(5)
        # Errors with the password in the DSN.
        bad_port = psycopg.conninfo.make_conninfo(secret_dsn, port="1")
        for bad in (bad_port, secret_dsn.replace("dbname=", "dbname=nosuchdb_") if form == 0 else
                    secret_dsn.rsplit("/", 1)[0] + "/nosuchdb", secret_dsn + " unknown_keyword=1"):
            with pytest.raises(JournalError) as failed:
                Journal.open(bad, connect_timeout=1)
            seen.append(str(failed.value))
        # The CLI, with it on the command line and in the environment.
        for args in (["info"], ["verify"], ["append", "Cart|2", '"x"'], ["append", "Cart|2", "not json"],
                     ["events", ""], ["persistence-ids"], ["migrate"], ["roles"], ["tail", "Cart", "--current"]):
            for how in ("option", "env"):
                target = bad_port if args == ["roles"] else secret_dsn
                if how == "option":
                    result = runner.invoke(app, [*args, "--dsn", target])
                else:
                    result = runner.invoke(app, args, env={"PGJOURNAL_DSN": target})
                seen.append(result.output)
                assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        result = runner.invoke(app, ["info", "--dsn", bad_port])
        assert result.exit_code == 1
        seen.append(result.output)
    seen.append(caplog.text)
    assert "live query poll failed" in caplog.text  # the logs did cover the failures
    for text in seen:
        _assert_no_secret(text)


# -- least-privilege roles ------------------------------------------------------------------------


WRITER_FORBIDDEN = [
    "CREATE TABLE intruder (id int)",
    "CREATE TEMP TABLE intruder (id int)",
    "CREATE SCHEMA intruder",
    "CREATE INDEX intruder ON event_journal (writer)",
    "CREATE FUNCTION intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE VIEW intruder AS SELECT 1",
    "ALTER TABLE event_journal ADD COLUMN intruder int",
    "ALTER TABLE snapshot DROP COLUMN snapshot",
    "ALTER TABLE event_journal_s0000_0127 DISABLE TRIGGER ALL",
    "DROP TABLE snapshot",
    "DROP TABLE event_journal CASCADE",
    "TRUNCATE event_journal",
    "TRUNCATE tag_views",
    "DELETE FROM event_journal",
    "DELETE FROM event_journal_s0000_0127",
    "UPDATE event_journal SET event_payload = '\\x00'",
    "UPDATE event_journal_s0000_0127 SET seq_nr = seq_nr + 1",
    "UPDATE pgjournal_version SET version_num = '0000'",
    "DELETE FROM pgjournal_version",
    "UPDATE event_journal SET event_ser_id = 31 WHERE event_ser_id = 33",  # why revision 0004 records a marker
    "INSERT INTO pgjournal_format (name, value) VALUES ('legacy_json_ser_id', '33')",
    "DELETE FROM pgjournal_format",
    "CREATE ROLE intruder",
    "CREATE DATABASE intruder",
]
READER_FORBIDDEN = [
    "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
    "event_ser_manifest, event_payload, writer) VALUES (1, 'x', 'x', 1, now(), 1, '', '', 'r')",
    "INSERT INTO snapshot (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
    "ser_manifest, snapshot) VALUES (1, 'x', 'x', 1, now(), 0, 1, '', '')",
    "UPDATE event_journal SET deleted = true",
    "UPDATE event_journal_s0000_0127 SET deleted = true",
    "DELETE FROM event_journal",
    "DELETE FROM snapshot",
    "DELETE FROM projection_timestamp_offset_store",
    "UPDATE projection_management SET paused = true",
    "INSERT INTO tag_views SELECT * FROM tag_views",
    "DELETE FROM tag_write_progress",
    "DELETE FROM pgjournal_format",
    "TRUNCATE event_journal",
    "CREATE TABLE intruder (id int)",
    "CREATE TEMP TABLE intruder (id int)",
    "DROP TABLE snapshot",
    "ALTER TABLE event_journal ADD COLUMN intruder int",
]


def _denied(dsn: str, statements: list[str]) -> list[str]:
    """The statements that were NOT refused (each in its own transaction, rolled back)."""
    allowed = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                continue
            except psycopg.Error as exc:
                allowed.append(f"{statement} -> {type(exc).__name__}: {exc}")
                continue
            allowed.append(statement)
    return allowed


def _seed(dsn: str) -> None:
    with Journal.open(dsn) as journal:
        journal.append("Cart|seed", ["a", "b"], expected_seq_nr=0, tags=["t"])


def test_the_writer_writes_but_cannot_change_the_schema_or_rewrite_history(dsn: str, roles: Roles) -> None:
    _seed(dsn)
    before = table_names(dsn)
    writer_dsn = roles.dsn(dsn, roles.writer)
    with Journal.open(writer_dsn, **FAST) as journal:
        assert not journal.capabilities.sees_all_sessions  # pg_read_all_stats is opt-in
        assert journal.capabilities.writer_horizon  # other roles' writers are waited out instead
        journal.append("Cart|w", ["x", "y"], expected_seq_nr=0, tags=["t", "u"])
        journal.append("Cart|seed", ["c"], expected_seq_nr=2, tags=["t"])
        journal.save_snapshot("Cart|w", 2, {"n": 2})
        journal.save_snapshot("Cart|w", 2, {"n": 3})  # the upsert
        assert journal.delete_events("Cart|w", 1) == 1  # logical delete: the one UPDATE allowed
        ensure_dsn_projection = Projection("w-proj", "Cart", counter_writer("w-proj"))
        management.pause(journal, ensure_dsn_projection.name)
        management.resume(journal, ensure_dsn_projection.name)
        # the current query ends a few ms behind the clock
        eventually(lambda: [e.event for e in journal.query.current_events_by_slices("Cart", 0, 1023)]
                   == ["a", "b", "y", "c"], "the events read by slice")
        tags_written(journal)  # the batched tag writer writes as the writer role too
        report = verify(journal)
        assert report.ok, report
    assert _denied(writer_dsn, WRITER_FORBIDDEN) == []
    with psycopg.connect(writer_dsn, autocommit=True) as conn:  # not the owner: a warning, and nothing granted
        conn.execute(f'GRANT INSERT, DELETE ON event_journal, snapshot TO PUBLIC, "{roles.reader}"')
    assert _denied(roles.dsn(dsn, roles.reader), READER_FORBIDDEN) == []
    assert table_names(dsn) == before


def test_the_reader_reads_and_cannot_write(dsn: str, roles: Roles) -> None:
    _seed(dsn)
    reader_dsn = roles.dsn(dsn, roles.reader)
    with Journal.open(reader_dsn, **FAST) as journal:
        assert [e.event for e in journal.query.current_events_by_persistence_id("Cart|seed")] == ["a", "b"]
        # the current query ends a few ms behind the clock
        eventually(lambda: [e.seq_nr for e in journal.query.current_events_by_slices("Cart", 0, 1023)] == [1, 2],
                   "the events read by slice")
        report = verify(journal)
        assert report.ok, [(c.name, c.examples) for c in report.checks if c.problems]
        with pytest.raises(ConfigurationError, match=r"refused by the database: SQLSTATE 42501.*nothing was written"):
            journal.append("Cart|seed", ["c"], expected_seq_nr=2)
    assert _denied(reader_dsn, READER_FORBIDDEN) == []
    result = CliRunner().invoke(app, ["verify", "--dsn", reader_dsn])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["append", "Cart|seed", '"c"', "--dsn", reader_dsn])
    assert result.exit_code == 1 and "42501" in result.output and "Traceback" not in result.output
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM event_journal").fetchone() == (2,)


def test_the_owner_migrates_and_others_cannot_connect(dsn: str, server_dsn: str, roles: Roles) -> None:
    owner_dsn = roles.dsn(dsn, roles.owner)
    result = CliRunner().invoke(app, ["migrate", "--dsn", owner_dsn])
    assert result.exit_code == 0, result.output
    with psycopg.connect(owner_dsn, autocommit=True) as conn:  # the owner may create (a later migration)
        conn.execute("CREATE TABLE owner_made (id int)")
        conn.execute("ALTER TABLE snapshot ADD COLUMN owner_extra int")
        conn.execute("ALTER TABLE snapshot DROP COLUMN owner_extra")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE ROLE intruder")
    # A table a later migration makes gets the default grants: the reader can read it, not write it.
    reader_dsn = roles.dsn(dsn, roles.reader)
    with psycopg.connect(reader_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM owner_made").fetchone() == (0,)
    assert _denied(reader_dsn, ["INSERT INTO owner_made VALUES (1)"]) == []
    # A login role that was not granted anything cannot even connect.
    stranger = f"pgj_stranger_{uuid.uuid4().hex[:8]}"
    create_login_role(server_dsn, stranger)
    try:
        with pytest.raises(DatabaseUnavailable, match="permission denied for database"):
            Journal.open(roles.dsn(dsn, stranger))
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{stranger}"')


def test_the_script_is_idempotent_and_the_visibility_horizon_is_opt_in(dsn: str, roles: Roles) -> None:
    apply_roles(dsn, role_script(owner=roles.owner, writer=roles.writer, reader=roles.reader, loader=roles.loader))
    apply_roles(dsn, role_script(owner=roles.owner, writer=roles.writer, reader=roles.reader, loader=roles.loader,
                                 visibility_horizon=True))
    with Journal.open(roles.dsn(dsn, roles.writer)) as journal:
        assert journal.capabilities.sees_all_sessions
    assert _denied(roles.dsn(dsn, roles.writer), WRITER_FORBIDDEN) == []


@pytest.mark.parametrize("name", ['x"; DROP ROLE postgres; --', "Owner", "pg_monitor", "9lives", "", "a" * 64,
                                  "a b", "ro'le"])
def test_role_names_that_could_inject_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="role name must be"):
        role_script(writer=name)
    with pytest.raises(ConfigurationError):
        check_role_name(name, "writer")
    result = CliRunner().invoke(app, ["roles", "--sql", "--reader", name])
    assert result.exit_code == 1 and "role name must be" in result.output and "Traceback" not in result.output


def test_roles_sql_prints_the_script() -> None:
    result = CliRunner().invoke(app, ["roles", "--sql", "--writer", "app_rw"])
    assert result.exit_code == 0
    assert 'GRANT INSERT, UPDATE (deleted) ON "public".%I TO "app_rw"' in result.output
    assert "PASSWORD" not in result.output.replace("ALTER ROLE ... PASSWORD", "")


# -- a static guard: SQL text is built only from constants and table names -----------------------------

ROOT = pathlib.Path(__file__).resolve().parents[2]

ALLOWED_IN_SQL_TEXT = re.compile(
    r"^(table|DEMO_DB|DATABASE|VERSION_TABLE|CHANNEL)$")


def test_statements_interpolate_only_table_names_never_values() -> None:
    """Every ``execute`` whose SQL text is built in place (f-string, ``.format``, ``+``) may interpolate only
    a table or channel name chosen by pgjournal; values always go as parameters. A new f-string with a value
    in it fails here."""
    found: list[str] = []
    sources = [*ROOT.glob("pgjournal/**/*.py"), *ROOT.glob("projections/**/*.py"), *ROOT.glob("spark/**/*.py")]
    for path, tree in parse_files(sorted(sources)).items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany") and node.args):
                continue
            sql = node.args[0]
            if isinstance(sql, ast.JoinedStr):
                parts = [ast.unparse(v.value) for v in sql.values if isinstance(v, ast.FormattedValue)]
            elif isinstance(sql, ast.Call) and isinstance(sql.func, ast.Attribute) and sql.func.attr == "format":
                parts = [ast.unparse(k.value) for k in sql.keywords] + [ast.unparse(a) for a in sql.args]
            elif isinstance(sql, ast.BinOp):
                parts = [ast.unparse(sql)]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {p}" for p in parts if not ALLOWED_IN_SQL_TEXT.match(p)]
    assert found == []


# -- a static guard: SQL over pgjournal's tables lives in the stores -----------------------------------
#: Besides pgjournal/store/: schema management, which generates DDL and reads Alembic's version table (the
#: table model, the dialects' DDL, migrations, roles and grants, the adoption of Akka's tables).
SCHEMA_MANAGEMENT = ("pgjournal/store/schema.py", "pgjournal/dialects/", "pgjournal/admin/migrate.py",
                     "pgjournal/admin/roles.py",
                     "pgjournal/admin/adopt.py")


def pgjournal_tables() -> list[str]:
    from pgjournal.store.schema import metadata
    from pgjournal.store.timestamp_offsets import OFFSET_TABLES

    return sorted({*metadata.tables, *OFFSET_TABLES}, key=len, reverse=True)


def sql_over_tables(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, SQL fragment) of each string or f-string (docstrings aside) that names one of pgjournal's tables,
    or a formatted-in name, where SQL puts a table: after FROM, INTO, UPDATE, JOIN, TRUNCATE or TABLE."""
    names = "|".join(pgjournal_tables())
    pattern = re.compile(rf"\b(?:FROM|INTO|UPDATE|JOIN|TRUNCATE|TABLE)\s+(?:ONLY\s+)?(?:{names}|event_journal_\d+"
                         rf"|\{{[^}}]*\}})(?!\w)|to_regclass\('(?:{names})")
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(value) for value in node.values)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        else:
            continue
        found += [(node.lineno, match.group(0)) for match in pattern.finditer(text)]
    return found


def test_the_guard_finds_sql_over_pgjournal_tables() -> None:
    source = '''
"""Docstrings may say: SELECT seq_nr FROM event_journal."""
A = "SELECT * FROM event_journal WHERE persistence_id = %s"
B = f"DELETE FROM {table} WHERE projection_name = %s"
C = "INSERT INTO akka_projection_timestamp_offset_store VALUES (%s)"
D = """UPDATE projection_lease SET owner = NULL"""
E = "SELECT 1 FROM event_journal_3"
F = "select * from my_read_model; the table snapshot is fine in prose"
'''
    assert [line for line, _ in sql_over_tables(parse(source))] == [3, 4, 5, 6, 7]


def test_sql_over_pgjournal_tables_is_only_in_stores_and_schema_management() -> None:
    """Statements over pgjournal's tables (their text, table names and row shapes) belong to pgjournal/store/
    (see ARCHITECTURE.md); a query written in place elsewhere fails here."""
    found = []
    sources = [*ROOT.glob("pgjournal/**/*.py"), *ROOT.glob("projections/**/*.py"), *ROOT.glob("spark/**/*.py")]
    for path, tree in parse_files(sorted(sources)).items():
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(("pgjournal/store/", *SCHEMA_MANAGEMENT)):
            continue
        found += [f"{name}:{line}: {text}" for line, text in sql_over_tables(tree)]
    assert found == [], "SQL over pgjournal's tables outside pgjournal/store/"
