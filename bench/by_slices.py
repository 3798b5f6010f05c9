"""by-slices: catch-up read of one entity type by 1, 2 and 4 slice ranges in parallel, beside an ordered
binary scan of the same rows; with the pages each range reads (EXPLAIN (ANALYZE, BUFFERS)) and where a row's
client CPU goes (:func:`cpu_per_row`, in the JSON line's ``extra``)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgjournal import Journal, slice_for_persistence_id, slice_ranges
from pgjournal.codec.akka_formats import read_json
from pgjournal.model.envelope import EVENT_COLUMNS
from pgjournal.query.by_slices import EPOCH
from pgjournal.query.gate import Gate
from pgjournal.runtime.steps import Statement, _SyncFetch, run_pooled
from pgjournal.store.events import PAGE

from .cpu import backend_cpu
from .harness import Context, Scenario

ENTITY_TYPES = ("Cart", "Order", "Payment", "Shipment", "Invoice")
PAYLOAD = json.dumps({"type": "ItemAdded", "item": "sku-000123", "quantity": 2, "note": "x" * 120}).encode()
COLUMNS = ("slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id, event_ser_manifest, "
           "event_payload")
TYPES = ["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "int4", "varchar", "bytea"]
SCAN = f"SELECT {EVENT_COLUMNS} FROM event_journal WHERE entity_type = %s ORDER BY db_timestamp, seq_nr"


def load(dsn: str, events: int, pids: int) -> None:
    """``events`` rows over ``pids`` persistence ids of 5 entity types, in time order, by binary COPY."""
    names = [f"{ENTITY_TYPES[i % 5]}|{i}" for i in range(pids)]
    slices = [slice_for_persistence_id(p) for p in names]
    seq = [0] * pids
    start = datetime.now(UTC) - timedelta(hours=2)
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(f"COPY event_journal ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(TYPES)
            for n in range(events):
                i = n % pids
                seq[i] += 1
                ts = start + timedelta(microseconds=n * 5)
                copy.write_row((slices[i], ENTITY_TYPES[i % 5], names[i], seq[i], ts, "bench", 31, "", PAYLOAD))
        conn.commit()
        conn.execute("ANALYZE event_journal")
        conn.commit()


def _setup(ctx: Context) -> dict[str, Any]:
    events, pids = (100_000, 1_000) if ctx.quick else (1_000_000, 10_000)
    load(ctx.dsn, events, pids)
    journal = Journal.open(ctx.dsn, pool_max_size=8, notify=False)
    state = {"journal": journal, "rows": events // 5}
    _explain(ctx, journal)
    ctx.extra.update(cpu_per_row(ctx.dsn, journal, state["rows"]))
    return state


def cpu_per_row(dsn: str, journal: Journal, expected: int, passes: int = 3) -> dict[str, Any]:
    """Where a row's CPU goes, in µs per row (each figure the best of ``passes``, the rows of all slices read by
    one process; client: ``time.process_time()``, server: the backends' ``/proc`` CPU).

    * ``read``: the whole current query, iterated as a consumer does (nothing instrumented);
    * ``fetch``, ``page_loop``, ``envelopes``: the same query with its steps run by a driver that times them:
      psycopg's execute and fetch (rows built), the steps' own code (the page loop, ``sift_step``, with the gate
      and the cursor), and taking the envelopes (made as they are taken: decoding, offsets, envelopes);
    * ``gate`` and ``decode``: the gate's calls (``Gate.take_next``) and the payloads' decoding (the plain-JSON
      path of ``EventRows.envelopes``), replayed alone over that pass's rows;
    * ``scan_*``: the reference, one ordered binary scan of the same rows.
    """
    pt = time.process_time
    read = server = scan = scan_server = float("inf")
    for _ in range(passes):
        s0, c0 = backend_cpu(dsn), pt()
        rows = sum(1 for _ in journal.query.current_events_by_slices("Cart", 0, 1023))
        c1, s1 = pt(), backend_cpu(dsn)
        assert rows == expected, (rows, expected)
        read, server = min(read, c1 - c0), min(server, _server_seconds(s0, s1))
        with psycopg.connect(dsn) as conn:
            s0, c0 = backend_cpu(dsn), pt()
            with conn.cursor(name="scan", binary=True) as cur:
                cur.itersize = 5000
                cur.execute(SCAN, ("Cart",))
                for _ in cur:
                    pass
            c1, s1 = pt(), backend_cpu(dsn)
        scan, scan_server = min(scan, c1 - c0), min(scan_server, _server_seconds(s0, s1))
    split = min((_timed_pass(journal, expected) for _ in range(passes)), key=lambda parts: sum(parts.values()))
    per_row = {"read": read, **split}
    return {"client_cpu_us_per_row": {k: round(v * 1e6 / expected, 3) for k, v in per_row.items()},
            "server_cpu_us_per_row": round(server * 1e6 / expected, 3),
            "scan_client_cpu_us_per_row": round(scan * 1e6 / expected, 3),
            "scan_server_cpu_us_per_row": round(scan_server * 1e6 / expected, 3)}


def _server_seconds(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU the backends used between two readings, per backend (one that ended in between, such as the previous
    pass's scan connection, would otherwise take its whole CPU off the sum)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _timed_pass(journal: Journal, expected: int) -> dict[str, float]:
    """CPU seconds of one current query's parts (see :func:`cpu_per_row`)."""
    pt = time.process_time
    query = journal.by_slices.query("Cart", 0, 1023)
    run_pooled(query.settle_step(), journal.read_connection)
    fetch = code = envelopes = 0.0
    page_rows: list[tuple[Any, ...]] = []
    taken = 0
    for step in query.current_steps():
        with journal.read_connection() as conn:
            fetcher = _SyncFetch(conn)
            c0 = pt()
            request = next(step)
            code += pt() - c0
            while True:
                assert isinstance(request, Statement), request
                c0 = pt()
                answer = fetcher.answer(request)
                fetch += pt() - c0
                if request.sql is query.page_sql:
                    page_rows.extend(answer)
                c0 = pt()
                try:
                    request = step.send(answer)
                except StopIteration as done:
                    code += pt() - c0
                    items = done.value
                    break
                code += pt() - c0
        c0 = pt()
        for _ in items:
            taken += 1
        envelopes += pt() - c0
    assert taken == expected, (taken, expected)
    gate: Gate[Any] = Gate()
    take_next = gate.take_next
    c0 = pt()
    for row in page_rows:
        take_next(row[2], row[3], row[4])
    gate_cpu = pt() - c0
    c0 = pt()
    for row in page_rows:
        read_json(row[7])
    decode = pt() - c0
    return {"fetch": fetch, "page_loop": code, "envelopes": envelopes, "gate": gate_cpu, "decode": decode}


def _explain(ctx: Context, journal: Journal) -> None:
    """Pages touched by the first page of each of 4 ranges, and by the whole range."""
    sql = PAGE.format(columns=EVENT_COLUMNS, slices="slice BETWEEN %(min_slice)s AND %(max_slice)s", tagged="")
    with journal.connection() as conn:
        for lo, hi in [(0, 1023), *slice_ranges(4)]:
            params = {"entity_type": "Cart", "until": datetime.now(UTC), "limit": 1000, "min_slice": lo,
                      "max_slice": hi, "from_ts": EPOCH, "last_seq": 0, "last_pid": "", "seen_pids": [],
                      "seen_seqs": []}
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params, prepare=False).fetchone()
            top = plan[0][0]
            node = top["Plan"]
            ctx.note(f"page of 1,000 for slices {lo}-{hi}: {top['Execution Time']:.1f} ms, "
                     f"shared buffers hit+read {node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)}, "
                     f"plan {_shape(node)}")


def _shape(node: dict[str, Any]) -> str:
    kids = node.get("Plans", [])
    name = node["Node Type"] + (f" on {node['Relation Name']}" if "Relation Name" in node else "")
    if not kids:
        return name
    inner = _shape(kids[0]) + (f" (+{len(kids) - 1} more)" if len(kids) > 1 else "")
    return f"{name} → {inner}"


def _teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["journal"].close()


def _read_range(dsn: str, lo: int, hi: int, barrier: Any, counts: Any, index: int) -> None:
    with Journal.open(dsn, pool_max_size=2, notify=False) as journal:
        barrier.wait()
        counts[index] = sum(1 for _ in journal.query.current_events_by_slices("Cart", lo, hi))


def catchup_rate(dsn: str, ranges: int, expected: int) -> float:
    """Rows/s of reading ``expected`` Cart events by ``ranges`` slice ranges, each in its own process."""
    mp = multiprocessing.get_context("fork")
    barrier = mp.Barrier(ranges + 1)
    counts = mp.Array("q", ranges)
    procs = [mp.Process(target=_read_range, args=(dsn, lo, hi, barrier, counts, i))
             for i, (lo, hi) in enumerate(slice_ranges(ranges))]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    assert sum(counts) == expected, (list(counts), expected)
    return expected / elapsed


def ours_processes(ranges: int) -> Callable[[Context, Any], float]:
    """Each range read by its own process, as projection workers or Spark executors do."""
    return lambda ctx, state: catchup_rate(ctx.dsn, ranges, state["rows"])


def ours_threads(ranges: int) -> Callable[[Context, Any], float]:
    """All ranges in one process, one thread each (they share the GIL)."""

    def measure(_ctx: Context, state: dict[str, Any]) -> float:
        journal: Journal = state["journal"]
        counts = [0] * ranges

        def read(i: int, lo: int, hi: int) -> None:
            for _ in journal.query.current_events_by_slices("Cart", lo, hi):
                counts[i] += 1

        threads = [threading.Thread(target=read, args=(i, lo, hi)) for i, (lo, hi) in enumerate(slice_ranges(ranges))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        assert sum(counts) == state["rows"], (sum(counts), state["rows"])
        return sum(counts) / elapsed

    return measure


def ordered_scan(ctx: Context, state: dict[str, Any]) -> float:
    """The reference: one ordered binary scan of the same rows, parsed into tuples."""
    rows = 0
    start = time.perf_counter()
    with psycopg.connect(ctx.dsn) as conn, conn.cursor(name="scan", binary=True) as cur:
        cur.itersize = 5000
        cur.execute(SCAN, ("Cart",))
        for _ in cur:
            rows += 1
    elapsed = time.perf_counter() - start
    assert rows == state["rows"]
    return rows / elapsed


SCENARIOS = [
    Scenario(
        name="by-slices", metric="rows_per_s",
        description="catch-up of one entity type by 4, 2, 1 processes or 4 threads "
                    "(a fifth of 1,000,000 events, 10,000 pids; quick: 100,000/1,000)",
        setup=_setup, teardown=_teardown,
        contenders={"ours": ours_processes(4), "ours_2_processes": ours_processes(2),
                    "ours_1_process": ours_processes(1), "ours_4_threads": ours_threads(4),
                    "ordered_binary_scan": ordered_scan},
    ),
]
