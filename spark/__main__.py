"""Run the Spark jobs with ``python -m spark export|load ...`` or under spark-submit::

    SPARK_DIR=$(python -c 'import spark, os; print(os.path.dirname(spark.__file__))')
    spark-submit --jars /usr/share/java/postgresql.jar "$SPARK_DIR/__main__.py" load /data/journal --job nightly

Under spark-submit the session (master, memory, jars) comes from spark-submit's options.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a file by spark-submit: make ``spark`` importable as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.dirname(os.path.abspath(__file__))]

from spark.cli import spark_app


def main() -> None:
    spark_app(prog_name="python -m spark")


if __name__ == "__main__":
    main()
