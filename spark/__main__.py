"""Run the Spark jobs with ``python -m pgjournal.spark export|load ...`` or under spark-submit::

    SPARK_DIR=$(python -c 'import pgjournal.spark as s, os; print(os.path.dirname(s.__file__))')
    JARS=/usr/share/java/postgresql.jar,$(python -m pgjournal.spark.scram /usr/share/java/postgresql.jar)
    spark-submit --jars "$JARS" "$SPARK_DIR/__main__.py" load /data/journal --job nightly

The second jar is the driver's SCRAM-only password source (:mod:`spark.scram`). Under spark-submit the session
(master, memory, jars) comes from spark-submit's options, and pgjournal must be
installed in the driver's Python (``pip install 'pgjournal[spark]'``): the file imports ``pgjournal.spark`` as the
installed package.
"""

from __future__ import annotations

from pgjournal.spark.cli import spark_app


def main() -> None:
    spark_app(prog_name="python -m pgjournal.spark")


if __name__ == "__main__":
    main()
