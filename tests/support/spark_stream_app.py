"""A Spark driver that tests/spark/test_spark_kill.py starts in a subprocess and kills with SIGKILL.

``python spark_stream_app.py DSN OUT``: two streaming queries over ``format("pgjournal")`` (entity type
Cart, 4 slice ranges, at most 40 events per micro-batch, a trigger every 300 ms) until killed. One writes a
checkpointed Parquet sink (``OUT/data``). One applies each micro-batch through ``foreachBatch`` to the
PostgreSQL read model ``spark_read_model`` in one transaction with its batch id
(``spark_read_model_progress``), so the micro-batch Spark runs again after a crash is applied once.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg

from pgjournal.spark.session import spark_session

QUERY = "read-model"


def apply_batch(dsn: str) -> Any:
    def apply(frame: Any, batch_id: int) -> None:
        rows = [(r["persistence_id"], r["seq_nr"]) for r in frame.collect()]
        with psycopg.connect(dsn) as conn:  # one transaction: the rows and the batch id, or neither
            done = conn.execute("SELECT batch_id FROM spark_read_model_progress WHERE query = %s FOR UPDATE",
                                (QUERY,)).fetchone()
            if done is not None and batch_id <= done[0]:
                return  # applied before the crash: Spark runs the last micro-batch again on restart
            conn.execute("INSERT INTO spark_read_model_progress (query, batch_id) VALUES (%s, %s) "
                         "ON CONFLICT (query) DO UPDATE SET batch_id = excluded.batch_id", (QUERY, batch_id))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO spark_read_model (persistence_id, seq_nr) VALUES (%s, %s)", rows)

    return apply


def main(dsn: str, out: str) -> None:
    spark = spark_session("pgjournal-kill-test")
    frame = (spark.readStream.format("pgjournal").option("dsn", dsn).option("entityType", "Cart")
             .option("sliceRanges", 4).option("maxEventsPerTrigger", 40).option("columns", "persistence_id,seq_nr")
             .load())
    trigger = {"processingTime": "300 milliseconds"}
    files = (frame.writeStream.format("parquet").option("path", f"{out}/data")
             .option("checkpointLocation", f"{out}/checkpoint-files").trigger(**trigger).start())
    # The second query starts once the first has run a micro-batch: two queries of one plan starting their first
    # jobs together once failed a task's deserialization in the JVM (java.io.OptionalDataException in a HashMap).
    while files.isActive and files.lastProgress is None:
        time.sleep(0.05)
    model = (frame.writeStream.foreachBatch(apply_batch(dsn)).option("checkpointLocation", f"{out}/checkpoint-model")
             .trigger(**trigger).start())
    print("started", flush=True)
    for query in (files, model):
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
