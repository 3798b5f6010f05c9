"""What the Spark pipeline needs from the machine (Java 17+, the PostgreSQL JDBC jar), and installing it.

``make setup`` runs ``python -m pgjournal.spark.system --install``: nothing happens when both are there; otherwise
Debian's ``default-jre-headless`` / ``libpostgresql-jdbc-java`` are installed with apt-get, as root or with
passwordless sudo. Without either, it stops with one message naming the command to run, or the two ways
around it: ``PGJOURNAL_JDBC_JAR=/path/to/postgresql.jar`` (a driver you have) or ``PGJOURNAL_SKIP_SPARK=1``
(no Spark: the demo skips its Spark step, Spark tests skip). Discovery is :mod:`spark.session`'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgjournal.errors import ConfigurationError

from .session import DEBIAN_JAR, JAR_ENV, find_java, find_jdbc_jar, java_version

SKIP_ENV = "PGJOURNAL_SKIP_SPARK"
JRE_PACKAGE = "default-jre-headless"
JDBC_PACKAGE = "libpostgresql-jdbc-java"
MIN_JAVA = 17


def spark_skipped() -> bool:
    """``PGJOURNAL_SKIP_SPARK`` is set to something other than empty or ``0``."""
    return os.environ.get(SKIP_ENV, "").strip() not in ("", "0")


@dataclass(frozen=True)
class Need:
    package: str
    why: str


def missing() -> list[Need]:
    """The Debian packages to install for Java 17+ and the JDBC jar (empty: nothing is missing).

    A bad ``JAVA_HOME`` or ``PGJOURNAL_JDBC_JAR`` is the user's choice and raises instead: a package
    would not fix it.
    """
    needs = []
    try:
        java = find_java()
        version = java_version(java)
        if version < MIN_JAVA:
            if os.environ.get("JAVA_HOME"):
                raise ConfigurationError(f"JAVA_HOME points to Java {version} ({java}); Spark needs Java "
                                         f"{MIN_JAVA} or newer: point it at a newer Java or unset it")
            needs.append(Need(JRE_PACKAGE, f"Java {version} at {java} is older than {MIN_JAVA}"))
    except ConfigurationError:
        if os.environ.get("JAVA_HOME"):
            raise
        needs.append(Need(JRE_PACKAGE, "no java on PATH"))
    if os.environ.get(JAR_ENV):
        find_jdbc_jar(allow_maven=False)  # raises when the configured jar is not a file
    elif not DEBIAN_JAR.is_file():
        needs.append(Need(JDBC_PACKAGE, f"no PostgreSQL JDBC driver at {DEBIAN_JAR}"))
    return needs


def install_command(packages: Sequence[str], *, as_root: bool) -> str:
    prefix = "" if as_root else "sudo "
    return f"{prefix}apt-get update && {prefix}apt-get install -y {' '.join(packages)}"


def how_to_fix(needs: Sequence[Need], *, euid: int | None = None) -> str:
    """The one message shown when Spark's needs cannot be installed here."""
    euid = os.geteuid() if euid is None else euid
    what = "; ".join(n.why for n in needs)
    return (f"Spark needs Java {MIN_JAVA}+ and the PostgreSQL JDBC driver ({what}). Run:\n"
            f"    {install_command([n.package for n in needs], as_root=euid == 0)}\n"
            f"or set {JAR_ENV}=/path/to/postgresql.jar to use a driver you have (Java {MIN_JAVA}+ still needed), "
            f"or {SKIP_ENV}=1 to go without Spark (the demo skips its Spark step, Spark tests skip).")


def privilege(euid: int | None = None, which: Callable[[str], str | None] = shutil.which) -> list[str] | None:
    """The command prefix that runs apt-get as root here (``[]`` as root, ``sudo -n`` when passwordless),
    or ``None`` when it cannot run."""
    euid = os.geteuid() if euid is None else euid
    if which("apt-get") is None:
        return None
    if euid == 0:
        return []
    sudo = which("sudo")
    if sudo is None:
        return None
    ok = subprocess.run([sudo, "-n", "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return [sudo, "-n"] if ok.returncode == 0 else None


def _apt(prefix: list[str], *args: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = [*prefix, "apt-get", *args]
    done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ConfigurationError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{tail}")


def ensure(*, install: bool = True, euid: int | None = None,
           which: Callable[[str], str | None] = shutil.which, say: Callable[[str], None] = print) -> None:
    """Make sure Java and the jar are there, installing them when allowed and possible; else raise
    :class:`ConfigurationError` with :func:`how_to_fix`. ``euid``/``which`` stand in for the machine in tests."""
    if spark_skipped():
        say(f"Spark check skipped ({SKIP_ENV} is set)")
        return
    needs = missing()
    if not needs:
        return
    prefix = privilege(euid, which) if install else None
    if prefix is None:
        raise ConfigurationError(how_to_fix(needs, euid=euid))
    packages = [n.package for n in needs]
    say(f"installing {' '.join(packages)} for Spark ({'; '.join(n.why for n in needs)})")
    _apt(prefix, "update", "-qq")
    _apt(prefix, "install", "-y", "-qq", "--no-install-recommends", *packages)
    still = missing()
    if still:
        raise ConfigurationError(f"installed {' '.join(packages)} but still missing: "
                                 f"{'; '.join(n.why for n in still)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgjournal.spark.system", description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help="install what is missing (root or sudo -n)")
    args = parser.parse_args(argv)
    try:
        ensure(install=args.install)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
