"""What a Spark session prints on its own: nothing but real errors (no log4j banner, no warnings of Spark's
start), in a fresh process as a user's script starts one; the JVM options it is given."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pgjournal.errors import ConfigurationError
from pgjournal.spark.session import JAVA_OPTIONS_ENV, spark_session
from pgjournal.spark.system import SKIP_ENV, spark_skipped

pytestmark = pytest.mark.spark

if spark_skipped():
    pytest.skip(f"{SKIP_ENV} is set", allow_module_level=True)

SCRIPT = """
from pgjournal.spark.session import spark_session
session = spark_session("pgjournal-quiet")
assert session.range(3).count() == 3
logger = session.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.pgjournal")
logger.warn("a warning of Spark's")
logger.error("a real error")
print(session.sparkContext._jvm.java.lang.System.getProperty("pgjournal.given"))
session.stop()
print("done")
"""


def test_a_session_prints_errors_only(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env[JAVA_OPTIONS_ENV] = "-XX:TieredStopAtLevel=1  -Dpgjournal.given=yes"
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["yes", "done"]  # the JVM got the options of JAVA_OPTIONS_ENV
    lines = [line for line in done.stderr.splitlines()
             # the JVM's own notice that Spark's launcher loads an incubator module: not log4j's to silence
             if not line.startswith("WARNING: Using incubator modules")]
    assert len(lines) == 1 and "ERROR" in lines[0] and "a real error" in lines[0], done.stderr


@pytest.mark.parametrize("given", ["TieredStopAtLevel=1", "-Xmx1g -", "-Dx=1 ;rm"])
def test_java_options_that_are_not_options_are_refused_before_a_jvm_starts(given: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JAVA_OPTIONS_ENV, given)
    with pytest.raises(ConfigurationError, match=f"{JAVA_OPTIONS_ENV} holds .*expected JVM options"):
        spark_session("pgjournal-refused")
