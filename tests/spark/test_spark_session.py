"""What a Spark session prints on its own: nothing but real errors (no log4j banner, no warnings of Spark's
start), in a fresh process as a user's script starts one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
session.stop()
print("done")
"""


def test_a_session_prints_errors_only(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    lines = [line for line in done.stderr.splitlines()
             # the JVM's own notice that Spark's launcher loads an incubator module: not log4j's to silence
             if not line.startswith("WARNING: Using incubator modules")]
    assert len(lines) == 1 and "ERROR" in lines[0] and "a real error" in lines[0], done.stderr
