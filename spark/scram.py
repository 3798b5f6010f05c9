"""PgJDBC's password source that answers SCRAM only (``java/ScramOnly.java``), built once per user.

libpq's ``require_auth=scram-sha-256`` (the embedded server's DSN) keeps the password from whatever holds the
port while the server is down. PgJDBC 42.7 reads the same rule from ``requireAuth``; older drivers, Debian's
``libpostgresql-jdbc-java`` 42.5.5 among them, ignore it and answer a clear-text request with the password.
Every driver since 42.3 asks an ``authenticationPluginClassName`` for the password once the server has said how
it wants it: :data:`PLUGIN_CLASS` gives it for SCRAM and refuses every other way, so what ``requireAuth`` says
holds with those drivers too (SECURITY.md, "Spark's JDBC path").

The class is compiled with ``javac`` against the driver jar Spark is given, when the session is built: the
driver is only known then (``$PGJOURNAL_JDBC_JAR``), and a wheel has no build step of its own. The jar goes to
``<user cache>/pgjournal/jdbc/`` (mode 0700, owned by the user, never a link): a class there runs in Spark's
JVM and reads the password, so no one else may plant it. Its name carries a digest of the source and of the
driver jar, so a changed source or driver gets a fresh build. Without ``javac`` (a JRE only) or with a driver
older than 42.3, :func:`plugin_jar` logs why and returns ``None``: the password then goes to the driver as a
property, as before.

``python -m pgjournal.spark.scram DRIVER_JAR`` builds the jar and prints its path, for ``spark-submit --jars``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from pgjournal.errors import ConfigurationError
from pgjournal.model.printable import printable_logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The ``authenticationPluginClassName`` of a connection that must authenticate by SCRAM only.
PLUGIN_CLASS = "pgjournal.jdbc.ScramOnly"
#: The connection property the plugin reads the libpq password file's path from (ScramOnly.PASSFILE).
PASSFILE_PROPERTY = "pgjournalPassfile"
JAR_PREFIX = "pgjournal-jdbc-scram-only-"
SOURCE = Path(__file__).with_name("java") / "ScramOnly.java"

log = printable_logger(__name__)
_built: dict[str, Path | None] = {}


def cache_folder() -> Path:
    """Where the plugin's jars are built: ``<user cache>/pgjournal/jdbc``."""
    return platformdirs.user_cache_path("pgjournal") / "jdbc"


def find_javac() -> str | None:
    """``$JAVA_HOME/bin/javac``, else ``javac`` on PATH (``None``: a JRE without the compiler)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def plugin_jar(driver_jar: str) -> Path | None:
    """The plugin's jar for the driver at ``driver_jar``, built on first use; ``None`` (and a warning in the
    log) when it cannot be built here. Raises :class:`ConfigurationError` when the cache folder is not private."""
    if driver_jar not in _built:
        _built[driver_jar] = _build(Path(driver_jar))
    return _built[driver_jar]


def in_session(spark: SparkSession) -> bool:
    """Whether ``spark``'s ``spark.jars`` lists the plugin's jar (so its JDBC connections can load the class)."""
    jars = spark.sparkContext.getConf().get("spark.jars", "") or ""
    return any(jar.strip().rsplit("/", 1)[-1].startswith(JAR_PREFIX) for jar in jars.split(","))


def _build(driver: Path) -> Path | None:
    javac = find_javac()
    if javac is None:
        log.warning("no javac (a JDK's compiler) here, so Spark's JDBC driver gets the embedded server's "
                    "password as a property: PgJDBC before 42.7 hands it to whatever asks on the port in clear "
                    "text. Install a JDK (Debian: apt-get install -y openjdk-17-jdk-headless) to build %s",
                    PLUGIN_CLASS)
        return None
    source = SOURCE.read_bytes()
    info = driver.stat()
    digest = hashlib.sha256(b"\0".join([source, str(driver.resolve()).encode(), str(info.st_size).encode(),
                                         str(info.st_mtime_ns).encode()])).hexdigest()[:16]
    folder = cache_folder()
    _private_folder(folder)
    jar = folder / f"{JAR_PREFIX}{digest}.jar"
    if _private_file(jar):
        return jar
    with tempfile.TemporaryDirectory(dir=folder) as work:
        classes = Path(work) / "classes"
        try:
            done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", str(driver), "-d", str(classes),
                                   str(SOURCE)], capture_output=True, text=True, timeout=300,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("could not run %s (%s): Spark's JDBC driver gets the password as a property", javac, exc)
            return None
        if done.returncode != 0:  # a driver before 42.3 has no org.postgresql.plugin.AuthenticationPlugin
            tail = " ".join((done.stdout + done.stderr).split())[:500]
            log.warning("%s does not compile against %s (PgJDBC 42.3 or later is needed): Spark's JDBC driver "
                        "gets the password as a property. javac said: %s", PLUGIN_CLASS, driver, tail)
            return None
        built = Path(work) / "plugin.jar"
        fd = os.open(built, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: pgjournal\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(built, jar)  # a link planted at the jar's name is replaced, never followed
    return jar


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (0700) if missing; refuse it unless a real folder of the running user's that only
    they can write."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigurationError(f"{folder} is not a folder of yours (a link, a file, or another user's): pgjournal "
                                 "builds the JDBC driver's SCRAM-only plugin there and loads it into Spark; "
                                 "remove it")
    if stat.S_IMODE(info.st_mode) != 0o700:  # checked above: the user's own folder, not a link
        os.chmod(folder, 0o700)


def _private_file(path: Path) -> bool:
    """Whether ``path`` is a plain file of the running user's that no one else can write (a link: no)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pgjournal.spark.scram DRIVER_JAR (the PgJDBC jar given to spark-submit --jars)",
              file=sys.stderr)
        return 2
    logging.basicConfig(format="%(levelname)s: %(message)s")
    try:
        jar = plugin_jar(args[0]) if Path(args[0]).is_file() else None
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if jar is None:
        print(f"error: no plugin built for {args[0]}", file=sys.stderr)
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
