"""``python -m pgjournal.spark.system``: what ``make setup`` checks and installs for Spark, and what it says when it
cannot.

The machine's state is real (this machine ran setup); only the user id, the commands found on PATH and the
jar's location are stood in for, to reach the paths a non-root user without sudo takes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pgjournal.errors import ConfigurationError
from pgjournal.spark import system

pytestmark = pytest.mark.servers


def no_sudo(name: str) -> str | None:
    return "/usr/bin/apt-get" if name == "apt-get" else None


def test_a_machine_that_ran_setup_needs_nothing_and_setup_runs_no_apt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(system.SKIP_ENV, raising=False)
    assert system.missing() == []
    said: list[str] = []
    system.ensure(euid=1000, which=no_sudo, say=said.append)  # nothing to do: no privilege needed
    assert said == []


def test_a_non_root_user_without_sudo_gets_one_message_naming_the_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(system.SKIP_ENV, raising=False)
    monkeypatch.delenv(system.JAR_ENV, raising=False)
    monkeypatch.setattr(system, "DEBIAN_JAR", tmp_path / "postgresql.jar")
    with pytest.raises(ConfigurationError) as caught:
        system.ensure(euid=1000, which=no_sudo)
    message = str(caught.value)
    assert "sudo apt-get update && sudo apt-get install -y libpostgresql-jdbc-java" in message
    assert "PGJOURNAL_JDBC_JAR=/path/to/postgresql.jar" in message and "PGJOURNAL_SKIP_SPARK=1" in message
    assert "default-jre-headless" not in message  # Java is there: only what is missing is named


def test_a_jar_the_user_has_is_enough_and_a_bad_one_is_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(system.SKIP_ENV, raising=False)
    monkeypatch.setattr(system, "DEBIAN_JAR", tmp_path / "absent.jar")
    jar = tmp_path / "postgresql-42.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv(system.JAR_ENV, str(jar))
    assert system.missing() == []
    monkeypatch.setenv(system.JAR_ENV, str(tmp_path / "typo.jar"))
    with pytest.raises(ConfigurationError, match=r"typo\.jar"):
        system.ensure(euid=1000, which=no_sudo)


def test_skip_spark_skips_the_check_and_the_module_exits_1_with_the_message(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PGJOURNAL_SKIP_SPARK": "1"}
    done = subprocess.run([sys.executable, "-m", "pgjournal.spark.system", "--install"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "skipped" in done.stdout
    env = {"PATH": "/usr/bin:/bin", "PGJOURNAL_JDBC_JAR": str(tmp_path / "nope.jar")}
    done = subprocess.run([sys.executable, "-m", "pgjournal.spark.system"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "nope.jar" in done.stderr
