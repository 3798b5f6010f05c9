"""tags-filter: catch-up of one entity type where 1 % of the events carry the tag, by ``current_events_by_slices(...,
tags=["hot"])`` (filtered by the database) beside the same catch-up unfiltered, filtered in the client. The rate is
journal events covered per second (the journal's size over the catch-up's time), so the two compare directly;
the rows each read from the journal's tables (``pg_stat_user_tables``: index fetches plus sequential reads) and
the plan of a filtered page (``EXPLAIN (ANALYZE, BUFFERS)``) are reported beside them."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgjournal import Journal, slice_for_persistence_id
from pgjournal.query.by_slices import EPOCH
from pgjournal.store.events import PAGE, TAGGED

from .by_slices import _shape
from .harness import Context, Scenario

TAG = "hot"
#: One event in this many carries the tag.
EVERY = 100
PAYLOAD = json.dumps({"type": "ItemAdded", "item": "sku-000123", "quantity": 2, "note": "x" * 120}).encode()
COLUMNS = "slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id, event_ser_manifest, " \
          "event_payload, tags"
TYPES = ["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "int4", "varchar", "bytea", "text[]"]
ROWS_READ = ("SELECT COALESCE(sum(COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0)), 0)::bigint "
             "FROM pg_stat_user_tables WHERE relname LIKE 'event_journal%'")


def load(dsn: str, events: int, pids: int) -> int:
    """``events`` Cart events over ``pids`` persistence ids in time order (binary COPY), one in :data:`EVERY`
    tagged; returns how many are tagged."""
    names = [f"Cart|{i}" for i in range(pids)]
    slices = [slice_for_persistence_id(p) for p in names]
    seq = [0] * pids
    start = datetime.now(UTC) - timedelta(hours=2)
    tagged = 0
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(f"COPY event_journal ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(TYPES)
            for n in range(events):
                i = n % pids
                seq[i] += 1
                tags = [TAG] if n % EVERY == 0 else None
                tagged += tags is not None
                copy.write_row((slices[i], "Cart", names[i], seq[i], start + timedelta(microseconds=n * 5), "bench",
                                31, "", PAYLOAD, tags))
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE event_journal")
    return tagged


def _setup(ctx: Context) -> dict[str, Any]:
    events, pids = (100_000, 1_000) if ctx.quick else (1_000_000, 10_000)
    tagged = load(ctx.dsn, events, pids)
    ctx.extra.update({"journal_events": events, "tagged_events": tagged, "rows_read": {}})
    _explain(ctx)
    return {"events": events, "tagged": tagged}


def _explain(ctx: Context) -> None:
    sql = PAGE.format(columns="*", slices="slice BETWEEN %(min_slice)s AND %(max_slice)s", tagged=TAGGED)
    params = {"entity_type": "Cart", "until": datetime.now(UTC), "limit": 1000, "min_slice": 0, "max_slice": 1023,
              "from_ts": EPOCH, "last_seq": 0, "last_pid": "", "seen_pids": [], "seen_seqs": [], "tags": [TAG]}
    with psycopg.connect(ctx.dsn) as conn:
        top = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params, prepare=False).fetchone()[0][0]
    node = top["Plan"]
    buffers = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    indexes = sorted(set(_index_names(node)))
    ctx.note(f"filtered page of 1,000: {top['Execution Time']:.1f} ms, shared buffers {buffers}, plan {_shape(node)}, "
             f"indexes {', '.join(indexes)}")
    ctx.extra["filtered_page_plan"] = {"shape": _shape(node), "indexes": indexes, "buffers": buffers,
                                       "ms": round(top["Execution Time"], 2)}


def _index_names(node: dict[str, Any]) -> list[str]:
    own = [node["Index Name"]] if "Index Name" in node else []
    return own + [name for kid in node.get("Plans", []) for name in _index_names(kid)]


def _rows_read(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(conn.execute(ROWS_READ).fetchone()[0])


def _settled_rows_read(dsn: str, before: int) -> int:
    """The counter once the reader's backend (closed) has flushed its statistics."""
    last, deadline = -1, time.monotonic() + 5
    while time.monotonic() < deadline:
        now = _rows_read(dsn)
        if now == last and now > before:
            return now
        last = now
        time.sleep(0.2)
    return last


def catchup(filtered: bool) -> Any:
    def measure(ctx: Context, state: dict[str, Any]) -> float:
        before = _rows_read(ctx.dsn)
        with Journal.open(ctx.dsn, pool_max_size=2, notify=False) as journal:
            start = time.perf_counter()
            if filtered:
                got = sum(1 for _ in journal.query.current_events_by_slices("Cart", 0, 1023, tags=[TAG]))
            else:
                got = sum(1 for e in journal.query.current_events_by_slices("Cart", 0, 1023) if TAG in e.tags)
            elapsed = time.perf_counter() - start
        assert got == state["tagged"], (got, state["tagged"])
        name = "filtered_in_database" if filtered else "client_filter"
        ctx.extra["rows_read"][name] = _settled_rows_read(ctx.dsn, before) - before
        return float(state["events"] / elapsed)

    return measure


SCENARIOS = [
    Scenario(
        name="tags-filter", metric="journal_events_per_s",
        description="catch-up of 1,000,000 Cart events, 10,000 pids, 1 % tagged (quick: 100,000/1,000): "
                    "events_by_slices(tags=...) vs reading all and filtering in the client; rows read in extra",
        setup=_setup,
        contenders={"ours": catchup(True), "client_filter": catchup(False)},
    ),
]
