"""The machine's calibration, measured once per ``python -m bench`` run and carried by every JSON line.

Two physical references on a scratch database: single-row ``INSERT`` (autocommit, one connection: the commit
flush and the client round trip) and an ordered binary scan (server-side cursor, rows parsed into tuples).
A ratio from another day means something only beside these: a busy neighbour or a slow disk moves them too.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import psycopg

from .harness import scratch_database

TABLE = "calibration_journal"
INSERTS = 1_000
SCAN_ROWS = 100_000
PAYLOAD = json.dumps({"type": "ItemAdded", "item": "sku-000123", "quantity": 2, "note": "x" * 120}).encode()


@dataclass(frozen=True)
class Calibration:
    #: Single-row autocommit INSERTs per second, one connection.
    raw_insert_per_s: float
    #: Rows per second of an ordered binary scan (server-side cursor, 5,000 rows a fetch).
    ordered_scan_rows_per_s: float
    #: 1-minute load average when measured (os.getloadavg), a hint of what else ran.
    load_average: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in asdict(self).items()}


def measure(server_dsn: str) -> Calibration:
    """Both references on a fresh database (~5 s on a quiet machine)."""
    import os

    with scratch_database(server_dsn) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {TABLE} (LIKE event_journal INCLUDING DEFAULTS INCLUDING INDEXES)")
        insert = (f"INSERT INTO {TABLE} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
                  "event_ser_id, event_ser_manifest, event_payload) VALUES (1, 'Cal', 'Cal|1', %s, now(), 'cal', 31, "
                  "'', %s)")
        for seq in range(1, 21):  # warm up (auto-prepare after 5)
            conn.execute(insert, (seq, PAYLOAD))
        start = time.perf_counter()
        for seq in range(21, 21 + INSERTS):
            conn.execute(insert, (seq, PAYLOAD))
        inserts = INSERTS / (time.perf_counter() - start)
        first = datetime.now(UTC) - timedelta(hours=1)
        with conn.cursor().copy(f"COPY {TABLE} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
                                "event_ser_id, event_ser_manifest, event_payload) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "int4", "varchar",
                            "bytea"])
            for n in range(SCAN_ROWS):
                copy.write_row((n % 1024, "Scan", f"Scan|{n % 1000}", n // 1000 + 1,
                                first + timedelta(microseconds=5 * n), "cal", 31, "", PAYLOAD))
        conn.execute(f"ANALYZE {TABLE}")
        with conn.transaction(), conn.cursor(name="calibration", binary=True) as cur:
            cur.itersize = 5000
            start = time.perf_counter()
            cur.execute(f"SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
                        f"event_ser_manifest, event_payload FROM {TABLE} WHERE entity_type = 'Scan' "
                        "ORDER BY db_timestamp, seq_nr")
            rows = sum(1 for _ in cur)
            scan = rows / (time.perf_counter() - start)
    return Calibration(inserts, scan, os.getloadavg()[0])
