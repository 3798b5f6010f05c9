"""A real PostgreSQL for every test that touches SQL: ``PGJOURNAL_TEST_DSN`` when set, else the embedded
server. Each test gets a fresh database cloned from a migrated template (``CREATE DATABASE ... TEMPLATE``)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import platformdirs
import psycopg
import psycopg.conninfo
import pytest
from hypothesis import HealthCheck, settings
from support import FAST, PORTABLE, PORTABLE_ENV, SECRET, Roles, database_dsn, make_serializable
from support.database import FreshDatabases, own_embedded_server
from support.faces import KINDS, Face, Kind, open_face
from support.roles import least_privilege_roles

from pgjournal import Journal
from pgjournal.admin.migrate import upgrade
from pgjournal.server.embedded import HOME_ENV, EmbeddedServer

TEST_DSN_ENV = "PGJOURNAL_TEST_DSN"
#: The embedded server the tests use unless ``PGJOURNAL_TEST_DSN`` is set: one of their own (never the user's
#: default server, which holds the demo's and their data), kept between runs in the user's own cache folder (a
#: fixed path in the shared temporary folder could be created first by another user). Set for the whole
#: session, so the CLI and worker processes the tests start find the same server.
TEST_HOME = platformdirs.user_cache_path("pgjournal") / "test-server"
#: Under pytest-xdist (``make test``), each worker process has a server of its own, in the home named above (or
#: in ``PGJOURNAL_HOME``) with the worker's id appended: a test may restart, reconfigure or count the sessions of
#: "the" server, which another worker's tests must not see. The CLI and worker processes a test starts inherit it.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if not os.environ.get(TEST_DSN_ENV):
    _home = os.environ.get(HOME_ENV) or str(TEST_HOME)
    # A pytest a test starts inherits both variables: its home is already the worker's.
    os.environ[HOME_ENV] = f"{_home}-{XDIST_WORKER}" if XDIST_WORKER and not _home.endswith(f"-{XDIST_WORKER}") \
        else _home

#: The tests' Spark JVMs (the session of a worker, the kill test's drivers, the docs' sessions) live seconds to
#: minutes: without the JIT's second tier they used a quarter less CPU (bench/results/suite-cost.md). The name is
#: pgjournal.spark.session.JAVA_OPTIONS_ENV, not imported: that would load PySpark into every test process.
os.environ.setdefault("PGJOURNAL_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

#: Property tests check what a function returns, not how fast: Hypothesis's per-example deadline (200 ms) and its
#: too-slow health check time the machine, and failed a model test with two suites beside it on 2 cores.
settings.register_profile("pgjournal", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pgjournal")


def _no_fsync(dsn: str) -> None:
    """Test databases are thrown away: the server need not wait for the disk (``fsync = off``; a crash of the
    server itself still loses no committed transaction, only one of the machine). With ``FILE_COPY`` below,
    creating and dropping a test database took 22 ms instead of 115 ms (PostgreSQL 15, 10 of each)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SHOW fsync").fetchone() != ("off",):
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """A DSN to a database on the test server whose user may create databases."""
    dsn = os.environ.get(TEST_DSN_ENV)
    if dsn:
        return dsn
    dsn = EmbeddedServer.default().ensure_running().dsn
    _no_fsync(dsn)
    return dsn


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    name = f"pgjournal_tpl_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(database_dsn(server_dsn, name))
    yield name
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def migrated_databases(server_dsn: str, template_db: str) -> Iterator[FreshDatabases]:
    pool = FreshDatabases(server_dsn, template_db, make_serializable if PORTABLE else lambda _dsn: None)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def empty_databases(server_dsn: str) -> Iterator[FreshDatabases]:
    pool = FreshDatabases(server_dsn, "template0", make_serializable if PORTABLE else lambda _dsn: None)
    yield pool
    pool.close()


@pytest.fixture
def dsn(migrated_databases: FreshDatabases) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    with migrated_databases.database() as fresh:
        yield fresh


@pytest.fixture
def empty_dsn(empty_databases: FreshDatabases) -> Iterator[str]:
    """A fresh database with no schema at all."""
    with empty_databases.database() as fresh:
        yield fresh


@pytest.fixture
def shard_databases(migrated_databases: FreshDatabases, empty_databases: FreshDatabases
                    ) -> Iterator[Callable[..., list[str]]]:
    """``shard_databases(n)``: the DSNs of ``n`` fresh databases on the test server (migrated; ``migrated=False``:
    empty), for a sharded journal (tests/shards/); dropped after the test."""
    with contextlib.ExitStack() as stack:
        def make(n: int, *, migrated: bool = True) -> list[str]:
            pool = migrated_databases if migrated else empty_databases
            return [stack.enter_context(pool.database()) for _ in range(n)]

        yield make


@pytest.fixture
def journal(dsn: str) -> Iterator[Journal]:
    """A journal on this test's database; portable with ``PGJOURNAL_TEST_PORTABLE=1``."""
    with Journal.open(dsn, portable=PORTABLE, **FAST) as opened:
        yield opened


#: The fixtures through which a test reaches a database server (the shared one, a private one, or Spark's JVM):
#: a test that uses none of them, and whose file is not marked ``servers`` (it starts servers of its own), is
#: marked ``unit``, the database-free subset ``make test-fast`` runs.
SERVER_FIXTURES = frozenset({"server_dsn", "private_server", "spark"})


#: Under ``--dist loadgroup`` the tests marked ``timing`` (they time the machine as well as the code) are one group,
#: and the Spark tests (a JVM each worker runs them on) are dealt in turn to :data:`SPARK_GROUPS` groups: one worker
#: runs each group's tests one after another, so no two timing tests run side by side, and two JVMs, not one per
#: worker, share the Spark tests, the suite's longest chain (bench/results/suite-cost.md). The tests of a module
#: marked ``one_worker`` (they share a module fixture that is costly to build: a standby, a wheel and its venv) go
#: to one worker together, in the group of the module's first test, so that the fixture is built once, not once per
#: worker that draws one of them.
TIMING_GROUP = "timing"
SPARK_GROUPS = 2


def _group(item: pytest.Item, spark_tests: int) -> str | None:
    if item.get_closest_marker("spark") is not None:
        return f"spark-{spark_tests % SPARK_GROUPS}"
    if item.get_closest_marker("timing") is not None:
        return TIMING_GROUP
    return None


# tryfirst: an xdist worker turns each item's xdist_group marks into its node id's ``@group`` in a hook of its own,
# registered after this conftest and so called before it: without tryfirst no group was ever in effect.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``unit`` on the database-free tests (see :data:`SERVER_FIXTURES`), the xdist groups (see
    :data:`TIMING_GROUP`); in portable mode, tests of a PostgreSQL-only feature skip, naming it
    (``@pytest.mark.postgres_only``)."""
    spark_tests = 0
    module_groups: dict[str, str] = {}
    for item in items:
        if SERVER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())) and item.get_closest_marker("servers") is None:
            item.add_marker(pytest.mark.unit)
        group = _group(item, spark_tests)
        spark_tests += item.get_closest_marker("spark") is not None
        if item.get_closest_marker("one_worker") is not None:
            module = item.nodeid.split("::")[0]
            group = module_groups.setdefault(module, group or f"module-{module}")
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if not PORTABLE:
        return
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            feature = marker.args[0] if marker.args else "a PostgreSQL-only feature"
            item.add_marker(pytest.mark.skip(reason=f"tests {feature}, which portable mode does not use"))


def pytest_report_header(config: pytest.Config) -> str | None:
    if PORTABLE:
        return f"{PORTABLE_ENV}=1: portable journal fixture, SERIALIZABLE test databases"
    return None


@pytest.fixture(params=["default", "portable"])
def mode_journal(request: pytest.FixtureRequest, dsn: str) -> Iterator[Journal]:
    """The same journal in default mode and in portable mode (no PostgreSQL-only features)."""
    with Journal.open(dsn, portable=request.param == "portable", **FAST) as opened:
        yield opened


@pytest.fixture(params=KINDS)
def face_kind(request: pytest.FixtureRequest) -> Kind:
    """``"blocking"`` and ``"asyncio"``: a test taking it (or ``face``) runs once on each face of the journal."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def face(face_kind: Kind, dsn: str) -> Iterator[Face]:
    """The ``journal`` fixture on each face, as one synchronous handle (tests/support/faces.py: the asyncio variant's
    every call goes through ``AsyncJournal``, on a private event loop, never through the blocking face)."""
    with open_face(face_kind, dsn, portable=PORTABLE, **FAST) as opened:
        yield opened


@pytest.fixture(params=["default", "portable"])
def mode_face(request: pytest.FixtureRequest, face_kind: Kind, dsn: str) -> Iterator[Face]:
    """``mode_journal`` on each face."""
    with open_face(face_kind, dsn, portable=request.param == "portable", **FAST) as opened:
        yield opened


@pytest.fixture
def secret_role(dsn: str, server_dsn: str) -> Iterator[str]:
    """A superuser whose password is :data:`SECRET`, for DSNs that carry it."""
    name = f"pgj_secret_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE \"{name}\" LOGIN SUPERUSER PASSWORD '{SECRET}'")
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{name}"')


@pytest.fixture
def roles(dsn: str, server_dsn: str) -> Iterator[Roles]:
    """The least-privilege roles of ``pgjournal.admin.roles`` (unique names) set up on this test's database."""
    with least_privilege_roles(dsn, server_dsn) as names:
        yield names


@pytest.fixture
def private_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedServer]:
    """An embedded server of this test's own, to restart or reconfigure (never the shared one)."""
    with own_embedded_server("pgjournal-private-") as server:
        monkeypatch.setenv(HOME_ENV, str(server.home))
        yield server


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The tests' one local Spark, shared by every Spark test module. Unavailable (no Java, jar or PySpark) it
    fails: `make setup` installs them; ``PGJOURNAL_SKIP_SPARK=1`` skips the Spark tests."""
    from pgjournal.errors import ConfigurationError
    from pgjournal.spark.session import check_spark_available, spark_session
    from pgjournal.spark.system import SKIP_ENV, spark_skipped

    if spark_skipped():
        pytest.skip(f"{SKIP_ENV} is set")
    try:
        check_spark_available()
    except ConfigurationError as exc:
        pytest.fail(f"Spark unavailable: {exc}\n`make setup` installs what Spark needs; {SKIP_ENV}=1 skips the "
                    "Spark tests", pytrace=False)
    session = spark_session("pgjournal-tests")
    yield session
    session.stop()
