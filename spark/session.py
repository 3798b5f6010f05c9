"""A local SparkSession that can talk to PostgreSQL: Java found, JDBC jar found, quiet, sized for a small machine.

The jar comes from ``$PGJOURNAL_JDBC_JAR``, else Debian's ``libpostgresql-jdbc-java``
(``/usr/share/java/postgresql.jar``), else ``spark.jars.packages`` when Maven Central is reachable.
Anything missing raises :class:`~pgjournal.errors.ConfigurationError` that says how to install it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgjournal.errors import ConfigurationError
from pgjournal.model.printable import printable_logger

from . import scram
from .datasource import register

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgjournal.codec.serialization import SerializerRegistry

JAR_ENV = "PGJOURNAL_JDBC_JAR"
DEBIAN_JAR = Path("/usr/share/java/postgresql.jar")
MAVEN_COORDINATE = "org.postgresql:postgresql:42.7.13"  # knows requireAuth (spark/jdbc.py)
MAVEN_HOST = ("repo1.maven.org", 443)
#: More options for the JVMs :func:`spark_session` starts, after its own (``-XX:TieredStopAtLevel=1`` for short jobs:
#: the JIT's second tier costs more CPU than a job of seconds wins back; the tests set it).
JAVA_OPTIONS_ENV = "PGJOURNAL_SPARK_JAVA_OPTIONS"
#: Set by spark-submit when it starts the Python driver.
SUBMITTED_ENV = "PYSPARK_GATEWAY_PORT"

INSTALL_JAVA = "install Java 17 or newer (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME"
INSTALL_JAR = (
    "install the PostgreSQL JDBC driver (Debian/Ubuntu: apt-get install -y libpostgresql-jdbc-java, which provides "
    f"{DEBIAN_JAR}) or set {JAR_ENV} to the path of postgresql-<version>.jar"
)
log = printable_logger(__name__)

INSTALL_PYSPARK = "install PySpark: pip install 'pgjournal[spark]' (pyspark and pyarrow)"

# Only errors from Spark and its libraries (warnings such as NativeCodeLoader's "Unable to load native-hadoop
# library" are not shown). Spark prints its "Setting default log level" banner unless the logger of the class
# that starts it, PySpark's gateway (the Scala shell's Main for spark-shell), has a configuration of its own at
# the root's level.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.gateway.additivity = false
logger.gateway.appenderRef.stderr.ref = console
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.repl.additivity = false
logger.repl.appenderRef.stderr.ref = console
"""


@dataclass(frozen=True)
class JdbcJar:
    """Where the driver comes from: a local ``path`` or a Maven ``package`` coordinate."""

    path: str | None = None
    package: str | None = None

    def describe(self) -> str:
        return self.path or f"{self.package} (from Maven)"


def find_java() -> str:
    """The ``java`` executable Spark will start (``$JAVA_HOME/bin/java``, else ``java`` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
        raise ConfigurationError(f"JAVA_HOME={home!r} has no bin/java: {INSTALL_JAVA}")
    found = shutil.which("java")
    if found is None:
        raise ConfigurationError(f"Spark needs Java, and no java was found on PATH: {INSTALL_JAVA}")
    return found


def java_version(java: str) -> int:
    """The major version of ``java`` (17 for ``openjdk version "17.0.15"``)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(f"could not run {java} -version ({exc}): {INSTALL_JAVA}") from None
    for token in out.split('"')[1::2]:
        head = token.split(".")[0]
        if head.isdigit():
            return int(head) if head != "1" else int(token.split(".")[1])
    raise ConfigurationError(f"could not read the Java version from {out.strip()!r}: {INSTALL_JAVA}")


def _maven_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(MAVEN_HOST, timeout=timeout):
            return True
    except OSError:
        return False


def find_jdbc_jar(*, allow_maven: bool = True) -> JdbcJar:
    """``$PGJOURNAL_JDBC_JAR``, else Debian's jar, else the Maven coordinate (if Maven Central answers)."""
    configured = os.environ.get(JAR_ENV)
    if configured:
        if not Path(configured).is_file():
            raise ConfigurationError(f"{JAR_ENV}={configured!r} is not a file: {INSTALL_JAR}")
        return JdbcJar(path=str(Path(configured).resolve()))
    if DEBIAN_JAR.is_file():
        return JdbcJar(path=str(DEBIAN_JAR))
    if allow_maven and _maven_reachable():
        return JdbcJar(package=MAVEN_COORDINATE)
    raise ConfigurationError(f"no PostgreSQL JDBC driver found and Maven Central is not reachable: {INSTALL_JAR}")


def check_spark_available() -> tuple[str, JdbcJar]:
    """Raise :class:`ConfigurationError` unless PySpark, Java 17+ and a JDBC jar are all there."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigurationError(f"PySpark is not installed: {INSTALL_PYSPARK}") from None
    java = find_java()
    version = java_version(java)
    if version < 17:
        raise ConfigurationError(f"Spark 4 needs Java 17 or newer, found Java {version} at {java}: {INSTALL_JAVA}")
    return java, find_jdbc_jar()


def _log_config() -> str:
    path = Path(tempfile.gettempdir()) / f"pgjournal-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return str(path)


def _more_java_options() -> list[str]:
    """The options of :data:`JAVA_OPTIONS_ENV`, each checked to be one (``-`` then no space)."""
    options = os.environ.get(JAVA_OPTIONS_ENV, "").split()
    for option in options:
        if not option.startswith("-") or len(option) < 2:
            raise ConfigurationError(f"{JAVA_OPTIONS_ENV} holds {option!r}: expected JVM options separated by "
                                     "spaces, each starting with '-' (as -XX:TieredStopAtLevel=1)")
    return options


def spark_session(
    app_name: str = "pgjournal",
    *,
    master: str = "local[2]",
    driver_memory: str = "1g",
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
    serializers: SerializerRegistry | None = None,
) -> SparkSession:
    """Get or create a SparkSession ready for :func:`spark.read.read_events` and ``format("pgjournal")``
    (:mod:`spark.source`, registered here; with ``serializers``, the journal's registry, reads decode with it:
    see :func:`spark.datasource.register`).

    Python workers run on this interpreter; the session time zone is UTC; logs show errors only; the UI is
    off; memory and shuffle partitions suit a 2-core machine. Settings apply only when this call starts
    the JVM: an existing session is returned as it is. Under spark-submit, its options are used instead
    (pass the driver and :mod:`spark.scram`'s plugin with ``--jars /usr/share/java/postgresql.jar,$(python -m
    pgjournal.spark.scram /usr/share/java/postgresql.jar)``).
    """
    from pyspark.sql import SparkSession

    if SUBMITTED_ENV in os.environ:  # under spark-submit: master, memory and --jars are its business
        session = (SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
                   .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        if not scram.in_session(session):
            log.warning("spark-submit was given no %s*.jar (python -m pgjournal.spark.scram DRIVER_JAR prints it): "
                        "Spark's JDBC driver gets the password as a property, which PgJDBC before 42.7 hands to "
                        "whatever asks on the port in clear text", scram.JAR_PREFIX)
        register(session, serializers=serializers)
        return session
    java, jar = check_spark_available()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if "JAVA_HOME" not in os.environ:
        os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)
    # The parallel collector: G1's concurrent threads compete with the two task threads on a small machine,
    # and the export runs faster without them (``python -m bench spark``).
    java_options = " ".join(["-XX:+UseParallelGC", f"-Dlog4j2.configurationFile=file:{_log_config()}",
                             "-Duser.timezone=UTC", *_more_java_options()])
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # A slice-range partition writes a few (entity type, slice range) directories: keep a writer open
        # for each instead of sorting the partition's rows by directory first.
        .config("spark.sql.maxConcurrentOutputFileWriters", "16")
    )
    if jar.path:
        # The plugin beside the driver in spark.jars: PgJDBC loads it by name through the driver's own class
        # loader (spark.driver.extraClassPath would put it where org.postgresql's interfaces are not seen).
        plugin = scram.plugin_jar(jar.path)
        builder = builder.config("spark.jars", f"{jar.path},{plugin}" if plugin else jar.path)
    else:  # Maven's 42.7.13 reads requireAuth itself
        builder = builder.config("spark.jars.packages", jar.package or "")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session, serializers=serializers)
    return session
